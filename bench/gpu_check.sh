#!/usr/bin/env bash
# GPU check, for a machine with one GPU (about 5 minutes): the CuPy cases of the multi-rank tests
# with 2 ranks sharing the GPU, the OSU allreduce sweep with -d cuda for every algorithm (staged
# and, if the MPI library is CUDA-aware, direct), and the codec throughput table. Everything it
# prints goes to one folder (first argument, default gpu_check_out).
#
#   python3 -m venv .venv && .venv/bin/pip install -e '.[test,gpu]'   # cupy-cuda12x or 13x as fits
#   bash bench/gpu_check.sh OUT
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check_out}
mkdir -p "$out"
py=${PYTHON:-python}
mpiexec=${MPIEXEC:-mpiexec}
export PYTHONUNBUFFERED=1 COLLECTIVES_TUNING_FILE=off
{
  nvidia-smi -L || true
  $py -c "import cupy, collectives._device as d; print('cupy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount(), 'cuda-aware MPI:', d.cuda_aware())"
} > "$out/env.txt" 2>&1
# 1. the CuPy cases (the same test bodies as NumPy's), 2 ranks on one GPU, staged then direct
timeout 240 $mpiexec -n 2 $py tests/mpi/runner.py "$out/tests_staged" -rs -k "cupy" \
  > /dev/null 2>&1; echo "tests (staged): exit $?" >> "$out/summary.txt"
COLLECTIVES_CUDA_AWARE=1 timeout 240 $mpiexec -n 2 $py tests/mpi/runner.py "$out/tests_direct" \
  -rs -k "cupy" > /dev/null 2>&1; echo "tests (forced CUDA-aware): exit $?" >> "$out/summary.txt"
# 2. OSU allreduce with device buffers, every algorithm in one interleaved run
timeout 240 $mpiexec -n 2 $py bench/osu_allreduce.py -d cuda -T mpi_float -m 8:16M \
  --algorithm all --busbw -c --iterations-large 20 --json "$out/osu_allreduce_cuda.json" \
  > "$out/osu_allreduce_cuda.txt" 2>&1; echo "osu -d cuda: exit $?" >> "$out/summary.txt"
# 3. codec throughput (host kernels: the codecs have no device kernels yet)
timeout 240 $py bench/codec_throughput.py --n 16777216 --repeats 5 \
  --json "$out/codec_throughput.json" > "$out/codec_throughput.txt" 2>&1
echo "codec table: exit $?" >> "$out/summary.txt"
cat "$out/summary.txt"
