#!/usr/bin/env bash
# Set up the venv (first run) and train the MNIST example data-parallel on 2 MPI processes.
# Usage: bash scripts/demo.sh [--numpy2] [train_mnist.py args...]   (--numpy2: in .venv-np2)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv=.venv
flags=()
if [ "${1:-}" = --numpy2 ]; then
  venv=.venv-np2
  flags=(--numpy2)
  shift
fi
bash "$root/scripts/bootstrap.sh" "${flags[@]}"
cd "$root"
exec "$venv/bin/mpiexec" -n "${NP:-2}" "$venv/bin/python" examples/mnist/train_mnist.py "$@"
