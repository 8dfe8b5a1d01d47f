"""Output in the OSU Micro-Benchmarks 7.x layout, so existing OSU parsers read it.

Layout (printed by rank 0 only) of the collectives: a blank line, ``# OSU MPI <Name> Test v7.2``,
``# Datatype: MPI_CHAR.``, then the column header and one row per message size; the
point-to-point benchmarks print, as OSU's do, the title line, the column header, then the datatype
line (no blank line). The size column is
left-aligned in :data:`SIZE_WIDTH` (10) characters; every value is right-aligned in
:data:`FIELD_WIDTH` (20) characters with :data:`PRECISION` (2) decimals, the iteration count in
:data:`ITER_WIDTH` (12); a validation cell reads ``Pass`` or ``Fail``. Lines we add beyond OSU
start with ``#`` (which every OSU parser skips) and come after the datatype line.

Bus bandwidth follows nccl-tests: ``algbw = S / t`` and ``busbw = algbw * BUSBW_FACTOR(p)``,
which makes the number comparable with the link bandwidth whatever the algorithm.
"""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["OSU_VERSION", "SIZE_WIDTH", "FIELD_WIDTH", "ITER_WIDTH", "PRECISION", "BUSBW_FACTOR",
           "title_line", "datatype_line", "preamble", "column_header", "row", "widths",
           "value_cell", "validation_cell", "algbw_gbs", "busbw_gbs"]

OSU_VERSION = "7.2"
SIZE_WIDTH = 10
FIELD_WIDTH = 20
ITER_WIDTH = 12
PRECISION = 2

#: nccl-tests bus-bandwidth factor by collective, as a function of the number of ranks.
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda p: 2 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "allgather": lambda p: (p - 1) / p,
    "bcast": lambda p: 1.0,
    "alltoall": lambda p: (p - 1) / p,
    "gather": lambda p: (p - 1) / p,
    "scatter": lambda p: (p - 1) / p,
    "barrier": lambda p: 1.0,
    "memcpy": lambda p: 1.0,
}


def title_line(title: str) -> str:
    """``# OSU MPI <title> v7.2``."""
    return f"# OSU MPI {title} v{OSU_VERSION}"


def datatype_line(mpi_type: str) -> str:
    """``# Datatype: <mpi_type>.``"""
    return f"# Datatype: {mpi_type}."


def preamble(title: str, mpi_type: str, extra: Sequence[str] = ()) -> list[str]:
    """A collective's lines before its column header: blank, title, datatype, extras."""
    return ["", title_line(title), datatype_line(mpi_type), *(f"# {line}" for line in extra)]


def widths(titles: Sequence[str]) -> list[int]:
    """Each column's width: :data:`FIELD_WIDTH`, or wider for a title that would not fit (an
    algorithm's name is never cut: ``recursive_doubling(GB/s)``)."""
    return [max(FIELD_WIDTH, len(title) + 1) for title in titles]


def column_header(columns: Sequence[str], *, iterations: bool = False,
                  validation: bool = False, size: bool = True) -> str:
    """``# Size`` then each column title, whole (:func:`widths`); ``Iterations`` after the first
    three when asked. Without ``size`` (``osu_barrier``) the line opens with the first title,
    its ``#`` in the first column."""
    cells = [f"{'# Size':<{SIZE_WIDTH}}"] if size else []
    for k, (title, width) in enumerate(zip(columns, widths(columns))):
        cells.append(f"{title:>{width}}" if cells else "# " + f"{title:>{width - 2}}")
        if iterations and k == 2:
            cells.append(f"{'Iterations':>{ITER_WIDTH}}")
    if validation:
        cells.append(f"{'Validation':>{FIELD_WIDTH}}")
    return "".join(cells)


def value_cell(value: float) -> str:
    return f"{value:>{FIELD_WIDTH}.{PRECISION}f}"


def validation_cell(ok: bool) -> str:
    return f"{'Pass' if ok else 'Fail':>{FIELD_WIDTH}}"


def row(size: int | None, values: Sequence[float], *, iterations: int | None = None,
        valid: bool | None = None, titles: Sequence[str] | None = None) -> str:
    """One data row: the size (None: no size column, ``osu_barrier``), the values, the
    iterations after the third, the validation; ``titles``: the columns' titles, when some are
    wider than :data:`FIELD_WIDTH`."""
    cells = [] if size is None else [f"{size:<{SIZE_WIDTH}d}"]
    sized = widths(titles) if titles is not None else [FIELD_WIDTH] * len(values)
    for k, (value, width) in enumerate(zip(values, sized)):
        cells.append(f"{value:>{width}.{PRECISION}f}")
        if iterations is not None and k == 2:
            cells.append(f"{iterations:>{ITER_WIDTH}d}")
    if valid is not None:
        cells.append(validation_cell(valid))
    return "".join(cells)


def algbw_gbs(nbytes: int, seconds: float) -> float:
    """nccl-tests algorithm bandwidth ``S / t`` in GB/s (1e9 bytes); NaN for a zero time."""
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")


def busbw_gbs(collective: str, nbytes: int, seconds: float, p: int) -> float:
    """nccl-tests bus bandwidth in GB/s: :func:`algbw_gbs` times the collective's factor."""
    return algbw_gbs(nbytes, seconds) * BUSBW_FACTOR[collective](p)
