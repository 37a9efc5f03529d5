#!/usr/bin/env bash
# Create a venv in the repo root and install everything the project needs (idempotent).
# Usage: bash scripts/bootstrap.sh            .venv: the README set-up (NumPy 1.26, setuptools<74)
#        bash scripts/bootstrap.sh --numpy2   .venv-np2: today's stack (newest NumPy 2 and newest
#                                             setuptools, which has no pkg_resources)
#        bash scripts/bootstrap.sh --py314    .venv-py314: today's stack on Python 3.14 (what
#                                             scripts/py314.sh runs in its chroot)
# PYTHON=... picks the interpreter that creates the venv (default python3.11; python3.14 for --py314).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
flavour=np1
case "${1:-}" in
  '') ;;
  --numpy2) flavour=np2 ;;
  --py314) flavour=py314 ;;
  *) echo "bootstrap.sh: unknown option '$1' (only --numpy2 or --py314)" >&2; exit 2 ;;
esac
venv="$root/.venv"
PY="${PYTHON:-python3.11}"
case "$flavour" in
  np2) venv="$root/.venv-np2" ;;
  py314) venv="$root/.venv-py314"; PY="${PYTHON:-python3.14}" ;;
esac
if ! command -v "$PY" >/dev/null 2>&1; then
  if [ "$flavour" = py314 ]; then
    echo "bootstrap.sh: --py314 needs $PY (scripts/py314.sh runs it in a Debian testing chroot)" >&2
    exit 1
  fi
  PY=python3
fi
stamp="$venv/.chainermn-bootstrap"
want="$( (echo "$flavour"; cat scripts/bootstrap.sh scripts/requirements-dev.txt packages/*/pyproject.toml packages/chainermn/*.pth 2>/dev/null || true) | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip
# Chainer 7.8.1 ships only an sdist whose setup.py imports pkg_resources, so it builds only with
# setuptools<81 (pip caches the built wheel: this happens once per machine).
if [ "$flavour" = np1 ]; then
  "${pip[@]}" "setuptools<74" "numpy>=1.26,<2" wheel
  "${pip[@]}" --no-build-isolation "chainer==7.8.1"
else
  # Today's stack (np2, py314): the newest NumPy 2 and setuptools the index serves.  Chainer then imports only
  # through chainermn's compat hook (packages/chainermn/src/_chainermn_compat.py).
  echo 'setuptools<81' > "$venv/build-constraint.txt"
  "${pip[@]}" --upgrade "numpy>=2,<3" setuptools wheel
  "${pip[@]}" --build-constraint "$venv/build-constraint.txt" "chainer==7.8.1"
fi
"${pip[@]}" -r scripts/requirements-dev.txt
# Our packages, editable, in dependency order; --no-deps keeps the pins above untouched.
for p in chainermn-comm chainermn-data chainermn-links chainermn-train chainermn-tools chainermn; do
  [ -f "packages/$p/pyproject.toml" ] && "${pip[@]}" --no-deps -e "packages/$p"
done
# Dev-setup step, not build code: an editable wheel carries no included files, so copy the
# meta-package's import-precedence hook next to the editable path file (packages/chainermn/README.md,
# "Import precedence"); it makes `import chainermn` ours, not the copy Chainer 7.8.1 installs.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cp packages/chainermn/chainermn_precedence.pth "$site/chainermn_precedence.pth"
echo "$want" > "$stamp"
