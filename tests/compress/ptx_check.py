"""Compile every device kernel to PTX for a real GPU (sm_90), without a GPU.

The simulator runs the kernels as Python, so it cannot catch what only the CUDA compiler rejects (a
typing rule, an unsupported call). This script compiles each kernel with the argument types the
codecs launch it with. It needs ``numba-cuda`` and NVVM/NVRTC (``pip install 'numba-cuda[cu12]'``)
and no driver; run it with ``NUMBA_ENABLE_CUDASIM`` unset. Prints one line per kernel, exits 1 on any
failure.
"""

import sys

from numba import cuda, types as t

from compress._kernels.cuda import bits, elementwise as ew, quant, reduce, select

U = (t.uint16, t.uint32, t.uint64)
F = (t.float32, t.float64)


def a(dtype, ndim=1):
    return t.Array(dtype, ndim, "C")


i64, u64, u8, u16, u32, f64 = t.int64, t.uint64, t.uint8, t.uint16, t.uint32, t.float64

SIGNATURES = {
    ew.fill: [(a(d), d) for d in (u8, u16, u32, u64, t.int64, t.float16, t.float32, t.float64)],
    ew.to_f16: [(a(w), i64, i64, a(u16)) for w in (u32, u64)],
    ew.to_bf16: [(a(u32), a(u16))],
    ew.bf16_to_f32: [(a(u16), a(u32))],
    ew.f16_to_f32: [(a(u16), a(u32))],
    ew.gather: [(a(w), a(i64), a(w)) for w in U + (i64,)],
    ew.gather_all: [(a(i64), a(u32)), (a(u32), a(i64))],
    ew.scatter: [(a(w), a(u32), a(w)) for w in U],
    ew.scatter_scaled: [(a(f), a(i64), f, a(f)) for f in F],
    ew.natural_encode: [(a(u32), i64, i64, a(u8))],
    ew.natural_decode: [(a(u8), a(u8), a(u32))],
    ew.unpack_two_values: [(a(u8), w, w, a(w)) for w in U],
    ew.threshold_words: [(a(i64), a(w), w, a(u32)) for w in U],
    ew.threshold_decode: [(a(u32), w, w, a(w)) for w in U],
    ew.threshold_parts: [(a(u32), w, w, a(i64), a(w)) for w in U],
    bits.pack_sign_bits: [(a(w), w, a(u8)) for w in U],
    bits.pack_negative_bits: [(a(w), w, w, w, a(u8), a(i64)) for w in U],
    bits.pack_codes: [(a(u16), i64, a(u8))],
    reduce.signed_sums: [(a(f), a(f64, 2)) for f in F],
    reduce.bucket_scales: [(a(f), i64, t.boolean, a(f)) for f in F],
    reduce.first_bad_index: [(a(u32), u32, i64, a(i64))],
    reduce.count_bad_scales: [(a(f), a(i64)) for f in F],
    reduce.nan_where_nonfinite: [(a(w), w, w, w) for w in (u32, u64)],
    select.radix_histogram: [(a(w), u64, u64, u64, u64, a(i64)) for w in U],
    select.tile_counts: [(a(w), u64, u64, a(i64, 2)) for w in U],
    select.tile_write: [(a(w), u64, u64, i64, a(i64, 2), a(i64)) for w in U],
    select.gather_keys: [(a(w), w, a(i64), a(w)) for w in U],
    select.sample_keys: [(a(w), w, u64, a(w)) for w in U],
    quant.level_codes: [(a(f), i64, i64, t.boolean, i64, i64, a(f), a(c)) for f in F for c in (u8, u16)],
    quant.dequantize_levels: [(a(u8), i64, i64, i64, a(f), a(f), a(i64)) for f in F],
}


class _H200:
    """Stands in for the current device when device functions are compiled (no driver here)."""

    compute_capability = (9, 0)


def main() -> int:
    import numba.cuda.dispatcher

    numba.cuda.dispatcher.get_current_device = _H200  # device functions ask for the device's CC
    failed = 0
    for kernel, sigs in SIGNATURES.items():
        name = f"{kernel.py_func.__module__.rsplit('.', 1)[-1]}.{kernel.py_func.__name__}"
        for sig in sigs:
            try:
                cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
            except Exception as exc:  # report every failure, not just the first
                failed += 1
                print(f"FAIL {name}{sig}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        print(f"done {name} ({len(sigs)} signatures)")
    print(f"{failed} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
