#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): GPU tests and GPU benchmarks, logs into $OUT.
# The image has CuPy, NCCL and NumPy 2 but no Chainer and no MPI.  Its python3 is itself a venv,
# so a nested venv would not see CuPy: the carried wheels go to a --prefix instead, put on
# PYTHONPATH/PATH/LD_LIBRARY_PATH; our packages run from source (PYTHONPATH, ahead of the copy of
# chainermn that Chainer bundles); scripts/device/sitecustomize.py lets Chainer import.
# Usage: bash scripts/device/gpu_check.sh [pytest args...]   (default: every test marked gpu)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${OUT:-$root/gpu-out}"; mkdir -p "$out"
pfx="${GPU_PREFIX:-/tmp/chainermn-gpu}"
py3="${GPU_PYTHON:-python3}"
log="$out/gpu_check.log"
{
  echo "== machine"; nvidia-smi -L 2>&1 || true; "$py3" --version
  if [ ! -x "$pfx/bin/mpiexec" ]; then
    "$py3" -m pip install -q --no-index --no-deps --no-compile --no-warn-script-location \
      --prefix "$pfx" "$root"/.whl/*.whl || exit 4
  fi
  site="$("$py3" -c 'import sys; print("lib/python{}.{}/site-packages".format(*sys.version_info[:2]))')"
  export PYTHONPATH="$root/scripts/device$(for p in comm data links train; do printf ':%s' "$root/packages/chainermn-$p/src"; done):$root/packages/chainermn/src:$pfx/$site${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$pfx/bin:$PATH" LD_LIBRARY_PATH="$pfx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONUNBUFFERED=1
  cd "$root"
  "$py3" - <<'PY'
import chainer, chainermn, mpi4py, numpy
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
print('MPI', MPI.Get_library_version().splitlines()[0])
print('gpu support', _gpu_support.cupy_status())
PY
  echo "== GPU tests"
  if [ $# -eq 0 ]; then set -- -m gpu packages/chainermn-comm/tests packages/chainermn-train/tests packages/chainermn-links/tests; fi
  timeout 480 "$py3" -m pytest -p no:cacheprovider -ra -q --timeout 300 "$@"
  echo "pytest exit status $?"
  if "$py3" -c 'import cupy; cupy.cuda.runtime.getDeviceCount()' 2>/dev/null; then
    echo "== GPU benchmark (1 rank, ResNet-50-sized gradients)"
    for c in pure_nccl flat; do
      timeout 300 mpiexec -n 1 "$py3" -m chainermn_comm.gpu.bench_gpu --comm "$c" --json \
        > "$out/bench_gpu_$c.json"
      echo "bench_gpu --comm $c exit status $?"; cat "$out/bench_gpu_$c.json"
    done
    echo "== GPU overlap benchmark (1 rank, side-stream path forced)"
    CHAINERMN_OVERLAP_MODE=stream timeout 300 mpiexec -n 1 "$py3" bench/overlap_gpu.py \
      --out "$out/overlap_gpu.json"
    echo "overlap_gpu exit status $?"
  fi
} 2>&1 | tee "$log"
