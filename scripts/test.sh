#!/usr/bin/env bash
# Set up .venv (first run) and run the whole test suite; extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
exec .venv/bin/python -m pytest -ra "$@"
