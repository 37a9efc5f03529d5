#!/usr/bin/env bash
# Create .venv in the repo root and install everything the project needs (idempotent).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
venv="$root/.venv"
stamp="$venv/.chainermn-bootstrap"
want="$( (cat scripts/bootstrap.sh scripts/requirements-dev.txt packages/*/pyproject.toml 2>/dev/null || true) | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
# Chainer 7.8.1 needs pkg_resources and numpy.distutils at build and import time.
"${pip[@]}" --upgrade pip
"${pip[@]}" "setuptools<74" "numpy>=1.26,<2" wheel
"${pip[@]}" --no-build-isolation "chainer==7.8.1"
"${pip[@]}" -r scripts/requirements-dev.txt
# Our packages, editable, in dependency order; --no-deps keeps the pins above untouched.
for p in chainermn-comm chainermn-data chainermn-links chainermn-train chainermn; do
  [ -f "packages/$p/pyproject.toml" ] && "${pip[@]}" --no-deps -e "packages/$p"
done
echo "$want" > "$stamp"
