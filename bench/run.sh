#!/usr/bin/env bash
# Gradient all-reduce benchmark: ours vs MPI floors vs Chainer 7.8.1's bundled chainermn.
# Usage: bash bench/run.sh [-n N] [--size tiny|full] [--out FILE.json] [--rounds R]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
n=2; size=full; out="$root/bench/results.json"; rounds=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n="$2"; shift 2;;
    --size) size="$2"; shift 2;;
    --out) out="$2"; shift 2;;
    --rounds) rounds=(--rounds "$2"); shift 2;;
    -h|--help) sed -n 2,3p "$0"; exit 0;;
    *) echo "run.sh: unknown argument $1 (see -h)" >&2; exit 2;;
  esac
done
py="${PYTHON:-$root/.venv/bin/python}"
mpiexec="$(dirname "$py")/mpiexec"
[ -x "$mpiexec" ] || mpiexec="$(command -v mpiexec)"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
export PYTHONUNBUFFERED=1
echo "[bench] ours: $mpiexec -n $n $py bench/allreduce_bench.py --size $size" >&2
"$mpiexec" -n "$n" "$py" "$root/bench/allreduce_bench.py" --size "$size" "${rounds[@]}" --out "$tmp/ours.json"
echo "[bench] peer (Chainer 7.8.1 bundled chainermn, python -S): separate job" >&2
"$mpiexec" -n "$n" "$py" -S "$root/bench/allreduce_bench.py" --peer --size "$size" "${rounds[@]}" --out "$tmp/peer.json"
"$py" "$root/bench/report.py" "$tmp/ours.json" "$tmp/peer.json" "$out"
echo "[bench] wrote $out" >&2
