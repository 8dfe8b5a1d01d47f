#!/usr/bin/env bash
# GPU check, for a machine with one GPU (about 5 minutes, at most 9): the device codec tests (Numba
# and CuPy arrays against the host codecs, plus the PTX compile check), the CuPy cases of the
# multi-rank tests with 2 ranks sharing the GPU, the OSU allreduce sweep with -d cuda for every
# algorithm, and the codec throughput table on the device (large and small tensors) and on the host.
# Everything it prints goes to one folder (first argument, default gpu_check_out); summary.txt has
# one line per step with its exit status and duration.
#
#   python3 -m venv .venv && .venv/bin/pip install -e '.[mpich,test,gpu]'
#   PATH=$PWD/.venv/bin:$PATH bash bench/gpu_check.sh OUT
#
# The forced CUDA-aware run of the multi-rank tests (COLLECTIVES_CUDA_AWARE=1) runs only where the
# MPI library says it is CUDA-aware: with an MPI that is not (the MPICH wheel from PyPI is built
# without CUDA), handing it device pointers can only crash. GPU_CHECK_N sets the large tensor size.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check_out}
mkdir -p "$out"
py=${PYTHON:-python}
mpiexec=${MPIEXEC:-mpiexec}
n=${GPU_CHECK_N:-16777216}
# NUMBA_ENABLE_CUDASIM=0: the tests must not fall back to the simulator on a GPU machine
export PYTHONUNBUFFERED=1 COLLECTIVES_TUNING_FILE=off NUMBA_ENABLE_CUDASIM=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log its exit status and duration
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout -k 5 "$limit" "$@"
  local code=$?
  echo "$name: exit $code ($((SECONDS - start)) s)" | tee -a "$out/summary.txt"
}
: > "$out/summary.txt"
{
  nvidia-smi -L || true
  ls /dev/nvidia* || true
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
  $py -c "import sys, numpy, numba; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'numba', numba.__version__)"
  $py -c "import cupy; print('cupy', cupy.__version__, 'CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(), 'devices', cupy.cuda.runtime.getDeviceCount())"
  $py -c "import numba_cuda; print('numba-cuda', numba_cuda.__version__)"
  $py -c "from mpi4py import MPI; import mpi4py; print('mpi4py', mpi4py.__version__, '|', MPI.Get_library_version().splitlines()[0])"
  $py -c "import collectives._runtime.device as d; print('MPI library CUDA-aware:', d.cuda_aware())"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
# 1. device codecs against the host codecs (Numba and CuPy arrays); the PTX compile check is left
#    out, since every kernel is compiled for the real GPU here anyway
step "codec tests" 170 $py -m pytest -q -rs -p no:cacheprovider --durations=10 -k "not real_gpu" \
  tests/compress/test_device.py \
  > "$out/codec_tests.txt" 2>&1
# 2. the CuPy cases of the multi-rank tests (same bodies as NumPy's), 2 ranks on one GPU, staged;
#    the ranks go on past a failure so that one run lists them all
COLLECTIVES_TEST_NO_ABORT=1 step "mpi tests (staged)" 120 $mpiexec -n 2 $py tests/mpi/runner.py "$out/tests_staged" -rs -k cupy \
  > /dev/null 2>&1
# 3. OSU allreduce with device buffers, every algorithm in one interleaved run
step "osu -d cuda" 80 $mpiexec -n 2 $py -m collectives.tools.osu.allreduce -d cuda -T mpi_float -m 8:16777216 \
  --algorithm all --busbw -c --iterations-large 20 --json "$out/osu_allreduce_cuda.json" \
  > "$out/osu_allreduce_cuda.txt" 2>&1
# 4. codec throughput: device kernels on a large and a small tensor (launch overhead), then the host
step "codecs on device" 80 $py bench/codec_throughput.py --device cuda --n "$n" --repeats 20 \
  --json "$out/codec_throughput_cuda.json" > "$out/codec_throughput_cuda.txt" 2>&1
step "codecs on device, small" 40 $py bench/codec_throughput.py --device cuda --n 65536 --repeats 50 \
  --json "$out/codec_throughput_cuda_small.json" > "$out/codec_throughput_cuda_small.txt" 2>&1
step "codecs on host" 45 $py bench/codec_throughput.py --n "$n" --repeats 5 --no-reference \
  --json "$out/codec_throughput_cpu.json" > "$out/codec_throughput_cpu.txt" 2>&1
# 5. device buffers handed to MPI directly, only where the library is CUDA-aware
if $py -c "import sys, collectives._runtime.device as d; sys.exit(0 if d._library_says() else 1)" 2>/dev/null; then
  COLLECTIVES_CUDA_AWARE=1 step "mpi tests (CUDA-aware)" 120 \
    $mpiexec -n 2 $py tests/mpi/runner.py "$out/tests_direct" -rs -k cupy > /dev/null 2>&1
else
  echo "mpi tests (CUDA-aware): not run, the MPI library is not CUDA-aware" | tee -a "$out/summary.txt"
fi
