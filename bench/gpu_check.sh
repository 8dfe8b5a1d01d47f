#!/usr/bin/env bash
# GPU check, for a machine with one GPU (about 5 minutes): the device codec tests (Numba and CuPy
# arrays against the host codecs, plus the PTX compile check), the CuPy cases of the multi-rank tests
# with 2 ranks sharing the GPU (staged, then forced CUDA-aware), the OSU allreduce sweep with -d cuda
# for every algorithm, and the codec throughput table on the device and on the host. Everything it
# prints goes to one folder (first argument, default gpu_check_out); summary.txt has one line per step.
#
#   python3 -m venv .venv && .venv/bin/pip install -e '.[test,gpu]'
#   PATH=$PWD/.venv/bin:$PATH bash bench/gpu_check.sh OUT
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check_out}
mkdir -p "$out"
py=${PYTHON:-python}
mpiexec=${MPIEXEC:-mpiexec}
export PYTHONUNBUFFERED=1 COLLECTIVES_TUNING_FILE=off
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log its exit status and duration
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@"
  echo "$name: exit $? ($((SECONDS - start)) s)" >> "$out/summary.txt"
}
: > "$out/summary.txt"
{
  nvidia-smi -L || true
  $py -c "import cupy, numba, collectives._device as d; print('cupy', cupy.__version__, 'numba', numba.__version__, 'devices', cupy.cuda.runtime.getDeviceCount(), 'cuda-aware MPI:', d.cuda_aware())"
  $py -c "import numba_cuda; print('numba-cuda', numba_cuda.__version__)"
} > "$out/env.txt" 2>&1
# 1. device codecs against the host codecs (Numba and CuPy arrays) and the PTX compile check
step "codec tests" 150 $py -m pytest -q -rs tests/compress/test_device.py > "$out/codec_tests.txt" 2>&1
# 2. the CuPy cases of the multi-rank tests (same bodies as NumPy's), 2 ranks on one GPU
step "mpi tests (staged)" 150 $mpiexec -n 2 $py tests/mpi/runner.py "$out/tests_staged" -rs -k cupy > /dev/null 2>&1
COLLECTIVES_CUDA_AWARE=1 step "mpi tests (forced CUDA-aware)" 150 \
  $mpiexec -n 2 $py tests/mpi/runner.py "$out/tests_direct" -rs -k cupy > /dev/null 2>&1
# 3. OSU allreduce with device buffers, every algorithm in one interleaved run
step "osu -d cuda" 120 $mpiexec -n 2 $py bench/osu_allreduce.py -d cuda -T mpi_float -m 8:16777216 \
  --algorithm all --busbw -c --iterations-large 20 --json "$out/osu_allreduce_cuda.json" \
  > "$out/osu_allreduce_cuda.txt" 2>&1
# 4. codec throughput: device kernels, then the host kernels of the same machine
step "codecs on device" 120 $py bench/codec_throughput.py --device cuda --n 16777216 --repeats 20 \
  --json "$out/codec_throughput_cuda.json" > "$out/codec_throughput_cuda.txt" 2>&1
step "codecs on host" 120 $py bench/codec_throughput.py --n 16777216 --repeats 5 --no-reference \
  --json "$out/codec_throughput_cpu.json" > "$out/codec_throughput_cpu.txt" 2>&1
cat "$out/summary.txt"
