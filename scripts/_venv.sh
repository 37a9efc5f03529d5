# Sourced by demo.sh and test.sh with their arguments: a leading --numpy2 selects .venv-np2.
# Bootstraps the chosen venv, sets $root and $venv and cds to the repo root; the caller shifts
# --numpy2 off its own arguments.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv=.venv
flags=()
if [ "${1:-}" = --numpy2 ]; then
  venv=.venv-np2
  flags=(--numpy2)
fi
bash "$root/scripts/bootstrap.sh" "${flags[@]}"
cd "$root"
