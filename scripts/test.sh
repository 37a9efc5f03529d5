#!/usr/bin/env bash
# Set up the venv (first run) and run the whole test suite; extra arguments go to pytest.
# Usage: bash scripts/test.sh [--numpy2] [pytest args...]
#   (default)  .venv, the README set-up (NumPy 1.26)
#   --numpy2   .venv-np2, the newest NumPy 2 and setuptools the index serves (scripts/bootstrap.sh)
#   --py314    .venv-py314, the same stack on Python 3.14 (run by scripts/py314.sh in a chroot)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" "$@"
if [ "${1:-}" = --numpy2 ] || [ "${1:-}" = --py314 ]; then
  shift
fi
exec "$venv/bin/python" -m pytest -ra "$@"
