#!/usr/bin/env bash
# The GPU check on this workplace's lent GPU machine, whose image has CuPy, numba-cuda, pytest and the
# project's other dependencies but no MPI library and no network. MPICH and mpi4py travel as wheels in
# .whl/ (docs/gpu.md says how to download them); they are installed under a prefix, not with
# --target, because pip's --target drops the wheel's lib/ folder and with it libmpi.so. The output
# folder comes back as one file. A numpy wheel may travel too: the image's numba-cuda 0.30.4 fails to
# import with its numpy 2.5 (numba-cuda calls np.row_stack, which numpy 2.5 removed). The output
# folder comes back as one file, $OUT/gpu_check.tgz, and summary.txt beside it.
#
#   device run, carry [".whl"]:  bash bench/gpu_lent.sh
set -uo pipefail
cd "$(dirname "$0")/.."
prefix=/tmp/mpi
py=${PYTHON:-python3}
$py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --prefix "$prefix" .whl/*.whl || exit 1
site=$($py -c "import sys; print(f'$prefix/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages')")
export PATH=$prefix/bin:$PATH LD_LIBRARY_PATH=$prefix/lib:${LD_LIBRARY_PATH:-} \
  PYTHONPATH=$site:$PWD/src PYTHON=$py MPIEXEC=$prefix/bin/mpiexec
work=/tmp/gpu_check
bash bench/gpu_check.sh "$work"
out=${OUT:-/tmp}
tar czf "$out/gpu_check.tgz" -C /tmp gpu_check
cp "$work/summary.txt" "$work/env.txt" "$out/" 2>/dev/null
cat "$work/summary.txt"
