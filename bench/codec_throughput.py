"""Encode/decode throughput of every codec, against a NumPy reference and a memory copy.

Throughput is input bytes (fp32) per second: ``n * 4 / median(time)``. For each codec it times
``encode`` and ``decode`` of the fast (Numba) path and ``decode(encode)`` of the plain-NumPy reference in
``tests/compress/naive.py`` where one exists, and, as yardsticks, ``np.copyto`` of the same array and
an ``np.argpartition`` top-k. Prints a table; ``--json FILE`` also writes the numbers.

    python bench/codec_throughput.py --n 16777216 --repeats 5 --json bench.json
"""

from __future__ import annotations

import argparse
import json
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
    from compress._header import read_header

    params = read_header(payload, codec.codec_id, codec.PARAMS).params
    if name in simple:
        return lambda: simple[name](x, params)
    if name in ("qsgd", "eightbit", "terngrad"):
        s, bucket = params["levels"], params["bucket"]
        use_max = name != "qsgd"
        return lambda: naive.ref_levels(x, naive.ref_scales(x, bucket, use_max), s, bucket,
                                        name != "eightbit", params["stream"])
    return None


def timed(fn, repeats):
    fn()  # warm-up (and JIT)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24, help="fp32 elements (default 16M)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported")
    ap.add_argument("--codecs", default=",".join(CONFIGS), help="comma-separated codec names")
    ap.add_argument("--no-reference", action="store_true", help="skip the (slow) NumPy references")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)

    x = np.random.default_rng(0).standard_normal(args.n).astype(np.float32)
    gb = x.nbytes / 1e9
    out = np.empty_like(x)
    copy_s = timed(lambda: np.copyto(out, x), args.repeats)
    k = max(1, args.n // 1000)
    argpart_s = timed(lambda: np.argpartition(np.abs(x), x.size - k)[x.size - k:], args.repeats)
    results = {"n": args.n, "repeats": args.repeats, "machine": platform.processor() or platform.machine(),
               "copy_gbps": gb / copy_s, "argpartition_topk_0.1pct_gbps": gb / argpart_s, "codecs": {}}
    print(f"n = {args.n} fp32 ({gb * 1e3:.0f} MB), median of {args.repeats}")
    print(f"np.copyto: {gb / copy_s:.2f} GB/s   np.argpartition top-0.1%: {gb / argpart_s:.2f} GB/s\n")
    print(f"{'codec':<10} {'params':<28} {'ratio':>8} {'encode':>8} {'enc out=':>8} {'decode':>8} "
          f"{'numpy ref':>9} {'enc/copy':>8}")
    for name in args.codecs.split(","):
        codec = compress.get(name, **CONFIGS[name])
        xin = x.reshape(4096, -1) if name == "powersgd" else x
        payload = codec.encode(xin, key="w")
        enc = timed(lambda: codec.encode(xin, key="w"), args.repeats)
        # steady state of a training loop: the payload buffer is reused (fixed-size codecs)
        fixed = name not in ("threshold", "dgc")
        enc_out = timed(lambda: codec.encode(xin, key="w", out=payload), args.repeats) if fixed \
            else enc
        dec = timed(lambda: codec.decode(payload), args.repeats)
        ref_fn = None if args.no_reference else reference(name, codec, x, payload)
        ref = timed(ref_fn, max(1, args.repeats // 2)) if ref_fn else None
        row = {"params": CONFIGS[name], "compression": x.nbytes / payload.size, "encode_gbps": gb / enc,
               "encode_into_out_gbps": gb / enc_out if fixed else None, "decode_gbps": gb / dec, "numpy_ref_roundtrip_gbps": gb / ref if ref else None}
        results["codecs"][name] = row
        ref_txt = f"{gb / ref:9.2f}" if ref else f"{'-':>9}"
        params = ",".join(f"{k}={v}" for k, v in CONFIGS[name].items() if k != "seed")
        out_txt = f"{gb / enc_out:8.2f}" if fixed else f"{'-':>8}"
        print(f"{name:<10} {params:<28} {row['compression']:>7.1f}x {gb / enc:8.2f} {out_txt} "
              f"{gb / dec:8.2f} {ref_txt} {copy_s / min(enc, enc_out):8.2f}")
    print("\nGB/s of fp32 input; ratio = input bytes / payload bytes; 'enc out=' encodes into a reused "
          "payload buffer\n(encode(x, out=buf), a training loop's steady state; np.copyto also writes "
          "into an existing array);\nenc/copy = the faster encode vs np.copyto speed")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
