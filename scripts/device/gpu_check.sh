#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): GPU tests or GPU benchmarks, logs into $OUT.
# The image has Python 3.12, NumPy 2, CuPy 14 and NCCL but no Chainer and no MPI, and cannot
# download.  scripts/device/fetch_wheels.sh puts in .whl/ what it lacks: Chainer 7.8.1, the MPICH
# wheel, mpi4py and our six wheels.  They are installed with --no-deps into the image's own
# Python environment (a nested venv would not see CuPy), exactly as `pip install chainermn`
# would: the meta-package's chainermn_precedence.pth then makes `import chainer` work on that
# stack and `import chainermn` ours.  No shim, no PYTHONPATH.
# Usage: bash scripts/device/gpu_check.sh [tests [pytest args...] | bench]
#   tests (default): every test marked gpu (or the given pytest args), at most ~9 minutes
#   bench: bench_gpu (pure_nccl, flat) and bench/overlap_gpu.py at one rank, at most ~8 minutes
# Each part fits one device call (10 minutes); run them as two calls.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${OUT:-$root/gpu-out}"; mkdir -p "$out"
py3="${GPU_PYTHON:-python3}"
part="${1:-tests}"; [ $# -gt 0 ] && shift
case "$part" in tests|bench) ;; *) echo "gpu_check.sh: unknown part '$part' (tests or bench)" >&2; exit 2;; esac
log="$out/gpu_check_$part.log"
{
  echo "== machine"; nvidia-smi -L 2>&1 || true; "$py3" --version
  if ! "$py3" -c 'import chainermn_comm, mpi4py' 2>/dev/null; then
    "$py3" -m pip install -q --no-index --no-deps --no-compile --no-warn-script-location \
      "$root"/.whl/*.whl || exit 4
  fi
  pfx="$("$py3" -c 'import sys; print(sys.prefix)')"
  export PATH="$("$py3" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
  export LD_LIBRARY_PATH="$pfx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONUNBUFFERED=1
  cd "$root"
  "$py3" - <<'PY'
import chainer, chainermn, mpi4py, numpy, _chainermn_compat
from mpi4py import MPI
from chainermn_comm import _gpu_support
print('chainer', chainer.__version__, 'cuda available', chainer.backends.cuda.available)
print('chainermn from', chainermn.__file__)
try:
    import cupy
    print('cupy', cupy.__version__)
except Exception as e:
    print('cupy missing:', e)
print('numpy', numpy.__version__, 'mpi4py', mpi4py.__version__)
print('chainer compat', _chainermn_compat.status(), _chainermn_compat.applied())
print('MPI', MPI.Get_library_version().splitlines()[0])
print('gpu support', _gpu_support.cupy_status())
PY
  if [ "$part" = tests ]; then
    echo "== GPU tests"
    if [ $# -eq 0 ]; then
      set -- -m gpu packages/chainermn-comm/tests packages/chainermn-train/tests packages/chainermn-links/tests
    fi
    timeout 540 "$py3" -m pytest -p no:cacheprovider -ra -q --timeout 300 "$@"
    echo "pytest exit status $?"
  else
    for c in pure_nccl flat; do
      echo "== bench_gpu --comm $c (1 rank, ResNet-50-sized gradients)"
      timeout 150 mpiexec -n 1 "$py3" bench/bench_gpu.py --comm "$c" --json \
        > "$out/bench_gpu_$c.json"
      echo "exit status $?"; cat "$out/bench_gpu_$c.json"
    done
    echo "== overlap_gpu (1 rank, side-stream path forced)"
    CHAINERMN_OVERLAP_MODE=stream timeout 180 mpiexec -n 1 "$py3" bench/overlap_gpu.py \
      --out "$out/overlap_gpu.json"
    echo "exit status $?"
    echo "== hooks_gpu (1 rank: PowerSGD rank 4 compression and decompression, ResNet-50 set)"
    timeout 120 mpiexec -n 1 "$py3" bench/hooks_gpu.py --json > "$out/hooks_gpu.json"
    echo "exit status $?"; cat "$out/hooks_gpu.json"
  fi
} 2>&1 | tee "$log"
