#!/usr/bin/env bash
# Set up the venv (first run) and train the MNIST example data-parallel on 2 MPI processes.
# Usage: bash scripts/demo.sh [--numpy2|--py314] [train_mnist.py args...]   (--numpy2: in .venv-np2)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" "$@"
if [ "${1:-}" = --numpy2 ] || [ "${1:-}" = --py314 ]; then
  shift
fi
exec "$venv/bin/mpiexec" -n "${NP:-2}" "$venv/bin/python" examples/mnist/train_mnist.py "$@"
