# Sourced by demo.sh and test.sh with their arguments: a leading --numpy2 selects .venv-np2,
# --py314 selects .venv-py314 (Python 3.14; see scripts/py314.sh).  Bootstraps the chosen venv,
# sets $root and $venv and cds to the repo root; the caller shifts the flag off its own arguments.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv=.venv
flags=()
if [ "${1:-}" = --numpy2 ]; then
  venv=.venv-np2
  flags=(--numpy2)
elif [ "${1:-}" = --py314 ]; then
  venv=.venv-py314
  flags=(--py314)
fi
bash "$root/scripts/bootstrap.sh" "${flags[@]}"
cd "$root"
