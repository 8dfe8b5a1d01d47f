"""Encode/decode throughput of every codec, against a NumPy reference and a memory copy.

Throughput is input bytes (fp32) per second: ``n * 4 / median(time)``. For each codec it times
``encode`` and ``decode`` of the fast (Numba) path and ``decode(encode)`` of the plain-NumPy reference in
``tests/compress/naive.py`` where one exists, and, as yardsticks, ``np.copyto`` of the same array and
an ``np.argpartition`` top-k. Prints a table; ``--json FILE`` also writes the numbers.

``--device cuda`` times the codecs' device kernels on a GPU array instead (CuPy; without CuPy, Numba
device arrays, which also run on Numba's simulator, for checking the script, not for speed). The
yardsticks are then the device copy and ``cupy.argpartition``, times are taken after a device
synchronisation, and there are no NumPy references.

    python bench/codec_throughput.py --n 16777216 --repeats 5 --json bench.json
    python bench/codec_throughput.py --device cuda --n 16777216 --repeats 20 --json gpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import compress

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "compress"))
import naive  # noqa: E402

CONFIGS = {
    "none": {},
    "fp16": {},
    "bf16": {},
    "topk": {"ratio": 0.001},
    "randomk": {"ratio": 0.001},
    "threshold": {"tau": 3.0},
    "dgc": {"density": 0.001, "seed": 0},
    "qsgd": {"levels": 127, "bucket": 512, "seed": 0},
    "terngrad": {"seed": 0},
    "signsgd": {},
    "efsignsgd": {},
    "onebit": {},
    "eightbit": {},
    "natural": {"seed": 0},
    "powersgd": {"rank": 4},
}


def reference(name, codec, x, payload):
    """A plain-NumPy round trip for ``name`` or None."""
    simple = {
        "none": naive.ref_none, "fp16": naive.ref_fp16, "bf16": naive.ref_bf16, "topk": naive.ref_topk,
        "threshold": naive.ref_threshold, "signsgd": naive.ref_signsgd, "natural": naive.ref_natural,
        "randomk": naive.ref_randomk, "efsignsgd": naive.ref_efsignsgd, "onebit": naive.ref_onebit,
    }
    params = compress.header.read_header(payload, codec.codec_id, codec.PARAMS).params
    if name in simple:
        return lambda: simple[name](x, params)
    if name in ("qsgd", "eightbit", "terngrad"):
        s, bucket = params["levels"], params["bucket"]
        use_max = name != "qsgd"
        return lambda: naive.ref_levels(x, naive.ref_scales(x, bucket, use_max), s, bucket,
                                        name != "eightbit", params["stream"])
    return None


class Host:
    """Arrays in host memory."""

    name = "cpu"
    array = staticmethod(lambda x: x)
    sync = staticmethod(lambda: None)
    copyto = staticmethod(np.copyto)

    @staticmethod
    def argpartition_topk(x, k):
        return np.argpartition(np.abs(x), x.size - k)[x.size - k:]


class Cuda:
    """Arrays on the GPU: CuPy if it is there, else Numba device arrays (simulator included)."""

    name = "cuda"

    def __init__(self):
        try:
            import cupy
        except ImportError:
            cupy = None
        from numba import cuda

        self.cupy = cupy
        self.array = cupy.asarray if cupy else cuda.to_device
        self.sync = cupy.cuda.Device().synchronize if cupy else cuda.synchronize
        self.library = f"cupy {cupy.__version__}" if cupy else "numba device arrays"

    def copyto(self, out, x):
        if self.cupy:
            self.cupy.copyto(out, x)
        else:
            out.copy_to_device(x)

    def argpartition_topk(self, x, k):
        if self.cupy:
            return self.cupy.argpartition(self.cupy.abs(x), x.size - k)[x.size - k:]
        return None


def timed(fn, repeats, sync=lambda: None):
    fn()  # warm-up (and JIT)
    sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24, help="fp32 elements (default 16M)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported")
    ap.add_argument("--codecs", default=",".join(CONFIGS), help="comma-separated codec names")
    ap.add_argument("--no-reference", action="store_true", help="skip the (slow) NumPy references")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the input array lives and the codecs run (default cpu)")
    args = ap.parse_args(argv)
    where = Host() if args.device == "cpu" else Cuda()

    host_x = np.random.default_rng(0).standard_normal(args.n).astype(np.float32)
    x = where.array(host_x)
    gb = host_x.nbytes / 1e9
    out = where.array(np.empty_like(host_x))
    copy_s = timed(lambda: where.copyto(out, x), args.repeats, where.sync)
    k = max(1, args.n // 1000)
    argpart = where.argpartition_topk(x, k) is not None
    argpart_s = timed(lambda: where.argpartition_topk(x, k), args.repeats, where.sync) if argpart else None
    results = {"n": args.n, "repeats": args.repeats, "device": args.device,
               "machine": platform.processor() or platform.machine(),
               "copy_gbps": gb / copy_s, "argpartition_topk_0.1pct_gbps": gb / argpart_s if argpart else None,
               "codecs": {}}
    if args.device == "cuda":
        results["library"] = where.library
    print(f"n = {args.n} fp32 ({gb * 1e3:.0f} MB) on {args.device}, median of {args.repeats}")
    argpart_txt = f"{gb / argpart_s:.2f} GB/s" if argpart else "-"
    print(f"copy: {gb / copy_s:.2f} GB/s   argpartition top-0.1%: {argpart_txt}\n")
    print(f"{'codec':<10} {'params':<28} {'ratio':>8} {'encode':>8} {'enc out=':>8} {'decode':>8} "
          f"{'numpy ref':>9} {'enc/copy':>8}")
    for name in args.codecs.split(","):
        codec = compress.get(name, **CONFIGS[name])
        xin = x.reshape(math.gcd(args.n, 4096), -1) if name == "powersgd" else x
        try:
            payload = codec.encode(xin, key="w")
        except TypeError as exc:  # powersgd on Numba device arrays
            print(f"{name:<10} skipped: {exc}")
            continue
        enc = timed(lambda: codec.encode(xin, key="w"), args.repeats, where.sync)
        # steady state of a training loop: the payload buffer is reused (fixed-size codecs)
        fixed = name not in ("threshold", "dgc")
        enc_out = timed(lambda: codec.encode(xin, key="w", out=payload), args.repeats, where.sync) \
            if fixed else enc
        dec = timed(lambda: codec.decode(payload), args.repeats, where.sync)
        ref_fn = None if args.no_reference or args.device != "cpu" else reference(name, codec, x, payload)
        ref = timed(ref_fn, max(1, args.repeats // 2)) if ref_fn else None
        row = {"params": CONFIGS[name], "compression": host_x.nbytes / payload.size, "encode_gbps": gb / enc,
               "encode_into_out_gbps": gb / enc_out if fixed else None, "decode_gbps": gb / dec, "numpy_ref_roundtrip_gbps": gb / ref if ref else None}
        results["codecs"][name] = row
        ref_txt = f"{gb / ref:9.2f}" if ref else f"{'-':>9}"
        params = ",".join(f"{k}={v}" for k, v in CONFIGS[name].items() if k != "seed")
        out_txt = f"{gb / enc_out:8.2f}" if fixed else f"{'-':>8}"
        print(f"{name:<10} {params:<28} {row['compression']:>7.1f}x {gb / enc:8.2f} {out_txt} "
              f"{gb / dec:8.2f} {ref_txt} {copy_s / min(enc, enc_out):8.2f}")
    print("\nGB/s of fp32 input; ratio = input bytes / payload bytes; 'enc out=' encodes into a reused "
          "payload buffer\n(encode(x, out=buf), a training loop's steady state; the copy also writes "
          "into an existing array);\nenc/copy = the faster encode vs the copy's speed")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    import sys

    from collectives.tools import program

    sys.exit(program("codec_throughput", main)())
