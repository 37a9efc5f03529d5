#!/usr/bin/env bash
# Set up .venv (first run) and train the MNIST example data-parallel on 2 MPI processes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
exec .venv/bin/mpiexec -n "${NP:-2}" .venv/bin/python examples/mnist/train_mnist.py "$@"
