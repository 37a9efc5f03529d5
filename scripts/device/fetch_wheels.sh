#!/usr/bin/env bash
# Put in .whl/ the wheels the GPU machine lacks (it cannot download): Chainer 7.8.1 (built here,
# pure Python), the MPICH wheel and mpi4py for that machine's Python, and our six packages.
# Usage: bash scripts/device/fetch_wheels.sh [PYTHON_VERSION]   (default 3.12, the GPU image's)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
pyver="${1:-3.12}"
py="$root/.venv/bin/python"
[ -x "$py" ] || { echo "fetch_wheels.sh: run scripts/bootstrap.sh first (needs .venv with setuptools<81)" >&2; exit 2; }
dest="$root/.whl"
mkdir -p "$dest"
rm -f "$dest"/*.whl
# Chainer ships only an sdist whose setup.py needs pkg_resources: build it with the venv's setuptools.
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$dest" 'chainer==7.8.1'
# Our six, as they will be published (poetry-core: version ranges, no paths).
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$dest" \
  "$root"/packages/chainermn-comm "$root"/packages/chainermn-data "$root"/packages/chainermn-links \
  "$root"/packages/chainermn-train "$root"/packages/chainermn-tools "$root"/packages/chainermn
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  "${plat[@]}" -d "$dest" 'mpich' 'mpi4py>=4'
ls -la "$dest"
du -sh "$dest"
