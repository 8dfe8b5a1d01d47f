"""Command-line options shared by every benchmark, in the OSU Micro-Benchmarks 7.x spelling.

The OSU options (``-m [MIN:]MAX``, ``-i``, ``-x``, ``-f``, ``-c``, ``-T``, ``-d``) keep their
meaning and their defaults: 1000 timed iterations and 100 warm-up ones up to
:data:`LARGE_MESSAGE_SIZE` (8 KiB), 100 and 10 above. ``-i``/``-x`` set both unless
``--iterations-large``/``--warmup-large`` say otherwise. Sizes take K, M and G suffixes (powers
of 1024: ``-m 8:64M``). Beyond OSU: ``--algorithm NAME|all``, ``--sizes`` (an explicit list instead
of the powers of two of ``-m``), ``--busbw``, ``--memcpy``, ``--json FILE`` and ``--csv FILE``
(rewritten after every size, so an interrupted sweep keeps what it measured) and
``--no-progress`` (no progress bar on rank 0's stderr).

The parser is :class:`collectives._runtime.cli.Parser`: help and errors are printed once, by rank 0.
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..._runtime.cli import Parser

__all__ = ["DATATYPES", "Datatype", "LARGE_MESSAGE_SIZE", "Iterations", "make_parser",
           "parse_bytes", "parse_range", "parse_sizes", "message_sizes", "iterations_for", "device_error",
           "to_accelerator", "to_host"]

#: Above this many bytes the "large" iteration counts apply (OSU's ``LARGE_MESSAGE_SIZE``).
LARGE_MESSAGE_SIZE = 8192


@dataclass(frozen=True)
class Datatype:
    """A ``-T`` choice: the NumPy dtype we send and the MPI name OSU prints for it."""

    dtype: np.dtype
    mpi_name: str


#: ``-T`` choices by name (OSU's lower-case spelling; float16 has no MPI-standard name).
DATATYPES: dict[str, Datatype] = {
    "mpi_char": Datatype(np.dtype(np.int8), "MPI_CHAR"),
    "mpi_int": Datatype(np.dtype(np.int32), "MPI_INT"),
    "mpi_float": Datatype(np.dtype(np.float32), "MPI_FLOAT"),
    "mpi_double": Datatype(np.dtype(np.float64), "MPI_DOUBLE"),
    "float16": Datatype(np.dtype(np.float16), "MPIX_C_FLOAT16"),
}


@dataclass(frozen=True)
class Iterations:
    """Timed and warm-up iterations for small (<= 8 KiB) and large messages."""

    small: int = 1000
    warmup_small: int = 100
    large: int = 100
    warmup_large: int = 10


#: size suffixes (powers of 1024, as OSU users mean them); "KiB", "KB" and "k" read the same
_SCALE = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    """A byte count: ``64``, ``64K``, ``8M``, ``1G`` (also ``8MB``, ``8MiB``, lower case).

    Raises
    ------
    ValueError
        If ``text`` is not a non-negative integer with an optional K/M/G suffix.
    """
    item = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = _SCALE.get(item[-1:], 1)
    digits = item[:-1] if mult > 1 else item
    if not digits.isdigit():
        raise ValueError(f"not a byte count: {text!r}")
    return int(digits) * mult


def parse_range(text: str) -> tuple[int, int]:
    """``-m`` argument: ``MAX`` or ``MIN:MAX`` (either side may be empty; K/M/G suffixes allowed,
    ``8:64M``) -> (min, max) bytes, max -1 when left open."""
    lo_text, sep, hi_text = text.partition(":")
    if not sep:
        lo_text, hi_text = "", lo_text
    try:
        lo = parse_bytes(lo_text) if lo_text else 0
        hi = parse_bytes(hi_text) if hi_text else None
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"-m takes [MIN:]MAX in bytes, K/M/G allowed (e.g. 8:1024 or 8:64M), got {text!r}"
        ) from None
    if hi is not None and hi < lo:
        raise argparse.ArgumentTypeError(f"-m needs MIN <= MAX, got {text!r}")
    return lo, (-1 if hi is None else hi)


def parse_sizes(text: str) -> list[int]:
    """``--sizes`` argument: comma-separated byte counts, suffixes K/M/G allowed (8,64K,1M)."""
    try:
        return [parse_bytes(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes takes byte counts like 8,64K,1M; "
                                         f"got {text!r}") from None


def count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (iterations >= 1, warm-up >= 0)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def make_parser(prog: str, description: str, *, default_max: int,
                default_min: int = 1, collective: bool = True,
                algorithm: str = "auto", algorithms: Sequence[str] = (),
                compressed: bool = False, pairs: bool = False, apis: Sequence[str] = (),
                rank: int | None = None) -> argparse.ArgumentParser:
    """The argument parser of one benchmark (collective ones get ``--algorithm`` and friends;
    ``algorithms``: the names ``--help`` lists; ``apis``: the point-to-point benchmarks' choices
    of ``--algorithm``, whose messages they time, the first the default).

    ``rank``: this process's rank (default its ``COMM_WORLD`` rank); only rank 0 prints help.
    Errors raise :class:`collectives._runtime.cli.UsageError`.
    """
    p = Parser(prog=prog, description=description, rank=rank)
    p.set_defaults(default_range=(default_min, default_max))
    p.add_argument("-m", "--message-size", type=parse_range, metavar="[MIN:]MAX",
                   help=f"message sizes in bytes, powers of two from MIN to MAX, K/M/G "
                        f"allowed, e.g. 8:64M (default {default_min}:{default_max})")
    p.add_argument("--sizes", type=parse_sizes, metavar="LIST",
                   help="explicit comma-separated sizes in bytes instead of -m (e.g. 8,64K,1M)")
    p.add_argument("-i", "--iterations", type=count(1), metavar="N",
                   help="timed iterations (default 1000, 100 above 8 KiB)")
    p.add_argument("-x", "--warmup", type=count(0), metavar="N",
                   help="warm-up iterations (default 100, 10 above 8 KiB)")
    p.add_argument("--iterations-large", type=count(1), metavar="N",
                   help="timed iterations above 8 KiB (default: -i if given, else 100)")
    p.add_argument("--warmup-large", type=count(0), metavar="N",
                   help="warm-up iterations above 8 KiB (default: -x if given, else 10)")
    p.add_argument("-T", "--type", dest="datatype", default="mpi_char", choices=list(DATATYPES),
                   help="element type (default mpi_char)")
    p.add_argument("-d", "--accelerator", default="cpu", choices=["cpu", "cuda"],
                   help="where the buffers live: cpu (NumPy) or cuda (CuPy)")
    p.add_argument("-c", "--validation", action="store_true",
                   help="check every result; adds a Validation column (Pass/Fail)")
    p.add_argument("--json", metavar="FILE", help="also write every measurement as JSON "
                   "(rewritten after each size)")
    p.add_argument("--csv", metavar="FILE", help="also write every measurement as CSV "
                   "(rewritten after each size)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar (rank 0, on stderr)")
    if collective:
        p.add_argument("-f", "--full", action="store_true",
                       help="also print min and max latency across ranks and the iterations")
        p.add_argument("--algorithm", default=algorithm, metavar="NAME|all",
                       help="algorithm to time"
                            + (f" ({', '.join(algorithms)})" if algorithms else "")
                            + ", 'mpi' (the MPI library's own call from mpi4py, outside this "
                            "library: the baseline), or 'all' (one column each, interleaved in "
                            f"one loop, after 'mpi'); default {algorithm}")
        p.add_argument("--busbw", action="store_true",
                       help="add bus bandwidth columns (nccl-tests definition, GB/s)")
        p.add_argument("--memcpy", action="store_true",
                       help="with --algorithm all: add a column timing a local copy of the "
                            "same bytes (np.copyto), the memory-bandwidth yardstick")
    if apis:
        p.add_argument("--algorithm", default=apis[0], metavar="NAME|all",
                       help=f"whose messages to time: {apis[0]} (mpi4py's Send/Recv, the "
                            "baseline), " + ", ".join(apis[1:]) + " (this library's send/recv), "
                            f"or all (a column each); default {apis[0]}")
    if pairs:
        p.add_argument("--matrix", action="store_true",
                       help="measure every ordered pair of ranks in turn and print a matrix per "
                            "size (row: from, column: to); default size 1 MiB")
    if compressed:
        import compress
        from ...compressed import STRATEGIES

        p.add_argument("--codec", action="append", metavar="NAME[:k=v,...]",
                       help="also time collectives.compressed_allreduce with this codec ("
                            + ", ".join(compress.CODECS) + "; repeatable; error feedback where "
                            "the codec needs it), with a bytes-sent-per-rank column; needs a "
                            "float -T")
        p.add_argument("--strategy", default="auto",
                       help="compressed-allreduce strategy for --codec (auto, "
                            + ", ".join(STRATEGIES) + "; default auto)")
    return p


def message_sizes(args: argparse.Namespace) -> list[int]:
    """The message sizes in bytes a run covers: ``--sizes``, else powers of two over ``-m``."""
    if args.sizes is not None:
        return list(args.sizes)
    lo, hi = args.message_size or args.default_range
    hi = args.default_range[1] if hi < 0 else hi
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size)
        size = size * 2 if size else 1
    return sizes


def iterations_for(nbytes: int, args: argparse.Namespace,
                   defaults: Iterations = Iterations()) -> tuple[int, int]:
    """(timed, warm-up) iterations for a message of ``nbytes`` under the options ``args``."""
    if nbytes <= LARGE_MESSAGE_SIZE:
        iters = args.iterations if args.iterations is not None else defaults.small
        warm = args.warmup if args.warmup is not None else defaults.warmup_small
        return iters, warm
    iters = next(v for v in (args.iterations_large, args.iterations, defaults.large)
                 if v is not None)
    warm = next(v for v in (args.warmup_large, args.warmup, defaults.warmup_large)
                if v is not None)
    return iters, warm


def device_error(accelerator: str) -> str | None:
    """Why ``-d accelerator`` cannot run here, or None when it can."""
    if accelerator == "cpu":
        return None
    if importlib.util.find_spec("cupy") is None:
        return ("-d cuda: CuPy is not installed (pip install '.[gpu]' on a machine with a GPU). "
                "Run with -d cpu (the default).")
    return None


def to_accelerator(accelerator: str, *arrays):
    """The benchmark's buffers where ``-d`` puts them: NumPy as they are, or CuPy copies."""
    if accelerator == "cpu":
        return arrays
    import cupy

    return tuple(cupy.asarray(a) for a in arrays)


def to_host(a):
    """A NumPy view or copy of a benchmark buffer (for validation)."""
    return a if isinstance(a, np.ndarray) else a.get()
