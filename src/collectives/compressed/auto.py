"""``codec="auto:<spec>"``: per tensor, the codec or a dense allreduce, whichever is predicted faster.

How it decides. For a tensor of ``n`` bytes on ``p`` ranks, with the call's dense algorithm ``A``
(``algorithm=``; for "auto", the one auto runs for ``n`` bytes), the codec's payload of ``b``
bytes (``payload_nbytes``; DGC's at its density; threshold's, which depends on the data, taken
as every element) and the strategy the call runs::

    dense      = T_A(n)
    compressed = encode + exchange + decode
      encode   = e n                       (with the error feedback, where there is one)
      exchange = T_allgather(b)            allgather and sparse strategies
                 T_A(b)                    summable: the representation is allreduced
      decode   = d n + q p b               the p payloads added into the result (summable: d n)

and the call compresses when ``compressed < (1 - margin) dense`` (``margin`` 0.1 by default: in
a close call dense wins, which holds nothing back). ``T`` is
:mod:`collectives.selection.cost_model` with the parameters that auto's choice of algorithm reads
(:func:`collectives.selection.network.network_for`): the tuning file's fitted model for this world
size (two levels on a cluster, fitted there by ``collectives-tune``), else the built-in one
(10 Gbit/s between nodes). ``e``, ``d``, ``q`` (seconds per byte) come from the tuning file's
``"codecs"`` section, which ``collectives-tune`` measures (every rank at once, the slowest kept):
the entry of the same spec, else one of the same codec, else :data:`DEFAULT_SPEEDS`, set at
about twice what ``bench/codec_pipeline.py`` measured for the fused codecs on an idle 2-core
machine (docs/benchmarks/codecs.md), so that without a measurement auto leans to dense.

Every rank decides the same. At the first auto call on a communicator rank 0 reads the tuning
file and broadcasts what it found (and the ranks find the node layout together); an
:class:`AutoCompression` given its own ``network`` or ``speed`` broadcasts rank 0's once per
communicator. The decision is then a function of these and of what every rank's call shares
(count, dtype, shape, the codec's parameters, strategy, algorithm); no clock is read.

The decision is made at every call, without hysteresis and not fixed after the first step: its
inputs are a model, not the times of the last steps, so it changes only when what it is made from
changes (a DGC warm-up's density: dense while the codec would send 75 % of the elements, the codec
later).

Switching keeps error feedback right: a dense step sends ``x + e`` (``Memory.flush``) and the
residual is gone, so what was sent over all steps plus the residual stays the sum of the inputs
(``DGCMemory`` sends its velocity and clears its state: DGC at density 1). A tensor with no
residual sends ``x`` itself, so where the model always says dense the bits are dense's.

:meth:`AutoCompression.report` says, per tensor key, what was chosen and the predicted times.
"""

from __future__ import annotations

import functools
import math
import weakref
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

import compress

from .. import selection
from .._runtime.context import Context
from .._runtime.nodes import node_sizes
from ..algorithms.auto import selector
from ..selection.network import network_for
from ..selection.cost_model import COSTS, Network, allgather, predict

__all__ = ["AutoCompression", "CodecSpeed", "Decision", "DEFAULT_SPEEDS", "AUTO_FORMS",
           "split_spec"]

#: What a codec string that asks for auto looks like (error messages list these).
AUTO_FORMS = ('"auto:<codec spec>", e.g. "auto:topk:ratio=0.01", "auto:dgc:density=0.001", '
              '"auto:fp16", "auto:powersgd:rank=4"')


def split_spec(spec: str) -> str | None:
    """The codec spec inside ``"auto:<codec spec>"``, checked; None when ``spec`` does not ask
    for auto (its first word is not "auto").

    Raises
    ------
    ValueError
        For "auto" without a codec, auto of auto or of "none", an unknown codec or a parameter
        the codec does not take; the message lists the valid forms.
    """
    head, sep, rest = spec.partition(":")
    if head.strip().lower() != "auto":
        return None
    inner = rest.strip()
    name = inner.partition(":")[0].strip()
    if not sep or not inner:
        problem = "auto needs the codec it may use"
    elif name.lower() == "auto":
        problem = "auto takes one codec, not another auto"
    elif name == "none":
        problem = "auto chooses between dense and a codec; 'none' is dense already"
    elif name not in compress.CODECS:
        problem = f"unknown codec {name!r} (codecs: {', '.join(c for c in compress.CODECS if c != 'none')})"
    else:
        try:
            codec_name, params = compress.parse_spec(inner)
            compress.registry.check_params(codec_name, params)
        except ValueError as exc:
            problem = str(exc)
        else:
            return inner
    raise ValueError(f"codec {spec!r}: {problem}; valid forms: {AUTO_FORMS}")


@dataclass(frozen=True)
class CodecSpeed:
    """The codec pipeline's speed, seconds per byte: ``encode`` per input byte (error feedback
    included), ``decode`` per byte of the dense result, ``payload`` per payload byte added in."""

    encode: float
    decode: float
    payload: float
    source: str = "given"

    def __post_init__(self) -> None:
        for name, value in (("encode", self.encode), ("decode", self.decode),
                            ("payload", self.payload)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"CodecSpeed.{name} must be a finite number of seconds per "
                                 f"byte >= 0, got {value!r}")


#: Built-in speeds (s/B) by codec name, for specs the tuning file has not measured: about twice
#: bench/codec_pipeline.py's idle 2-core numbers for the fused codecs (top-k 1 % + error
#: feedback 0.40 ns/B, the sum of 4 payloads 0.27 ns/B of the result; docs/benchmarks/codecs.md),
#: more for the others; ``"*"`` for any codec not named.
DEFAULT_SPEEDS: dict[str, CodecSpeed] = {
    "topk": CodecSpeed(1.0e-9, 0.4e-9, 2.0e-9, "built-in"),
    "dgc": CodecSpeed(1.2e-9, 0.4e-9, 2.0e-9, "built-in"),
    "randomk": CodecSpeed(1.5e-9, 0.4e-9, 2.0e-9, "built-in"),
    "threshold": CodecSpeed(3.0e-9, 0.4e-9, 2.0e-9, "built-in"),
    "fp16": CodecSpeed(0.6e-9, 0.6e-9, 1.0e-9, "built-in"),
    "bf16": CodecSpeed(0.6e-9, 0.6e-9, 1.0e-9, "built-in"),
    "*": CodecSpeed(4.0e-9, 1.0e-9, 4.0e-9, "built-in"),
}


@functools.lru_cache(maxsize=None)
def _parameter_names(name: str) -> tuple[str, ...]:
    return tuple(k for k in compress.registry.parameters(name) if k != "seed")


def _params_of(codec: compress.Codec) -> dict[str, Any]:
    """The codec's parameters as set now (a warm-up changes a density), seeds left out."""
    own = vars(codec)
    return {k: own[k] for k in _parameter_names(codec.name) if k in own}


def _speed_for(codec: compress.Codec, table: dict[str, dict[str, float]]) -> CodecSpeed:
    """The measured entry of ``table`` for this codec (its spec, else its name), else built-in."""
    mine = _params_of(codec)
    same_name = []
    for spec, entry in table.items():
        try:
            name, params = compress.parse_spec(spec)
        except ValueError:
            continue
        if name != codec.name:
            continue
        same_name.append(entry)
        if all(mine.get(k) == v for k, v in params.items() if k != "seed"):
            return CodecSpeed(**entry, source=f"measured ({spec})")
    if same_name:
        return CodecSpeed(**same_name[0], source=f"measured ({codec.name}, other parameters)")
    return DEFAULT_SPEEDS.get(codec.name, DEFAULT_SPEEDS["*"])


def _payload_nbytes(codec: compress.Codec, shape: tuple[int, ...], dtype: np.dtype) -> int:
    try:
        return int(codec.payload_nbytes(shape, dtype))
    except TypeError:  # the size depends on the data: DGC's density, else every element
        n = int(np.prod(shape))
        density = vars(codec).get("density")
        nnz = n if density is None else min(n, math.ceil(density * n))
        return int(codec.payload_nbytes(shape, dtype, nnz=nnz))


def _dense_time(name: str, nbytes: float, p: int, net: Network) -> float:
    """The cost of dense algorithm ``name``; one without a model ("shm", the blocks' own) is
    costed as the fastest modelled one."""
    if name in COSTS:
        return predict(name, nbytes, p, net)
    return min(fn(nbytes, p, net) for fn in COSTS.values())


@dataclass
class Decision:
    """What auto chose for one tensor key at its latest call, and the predicted seconds."""

    key: Any
    count: int
    nbytes: int
    payload_nbytes: int
    dense_algorithm: str
    strategy: str
    dense_s: float
    encode_s: float
    exchange_s: float
    decode_s: float
    compress: bool
    speed_source: str
    calls_dense: int = 0
    calls_codec: int = 0

    @property
    def compressed_s(self) -> float:
        return self.encode_s + self.exchange_s + self.decode_s


@dataclass(frozen=True)
class _Inputs:
    """What the decision reads, agreed on every rank of one communicator."""

    network: Network
    speeds: dict            # the tuning file's "codecs" section (or one given speed, as "*")
    nodes: tuple[int, ...]
    network_source: str


def _file_inputs(comm: MPI.Comm, node_size: int | None) -> _Inputs:
    """Rank 0's tuning file (its entry for this world size and its codec speeds), broadcast,
    with the node layout found together: the same on every rank."""
    found: tuple = (None, {}, None)
    if comm.rank == 0:
        try:
            found = (selection.entry_for(comm.size), selection.codec_speeds(), None)
        except selection.TuningFileError as exc:
            found = (None, {}, str(exc))
    entry, speeds, problem = comm.bcast(found, root=0)
    if problem and comm.rank == 0:
        warnings.warn(f"ignoring the tuning file: {problem}; codec='auto:...' uses built-in "
                      "parameters", RuntimeWarning, stacklevel=4)
    nodes = node_sizes(comm, node_size)
    fitted = entry is not None and entry.model is not None and (
        len(nodes) == 1 or entry.model.get("alpha_inter") is not None)
    return _Inputs(network_for(entry, nodes), speeds, tuple(nodes),
                   "fitted (tuning file)" if fitted else "built-in")


@dataclass(eq=False)
class AutoCompression:
    """Compress a tensor only where the cost model predicts it pays (the module docstring).

    Set as ``CompressionState(..., auto=AutoCompression())``; ``codec="auto:<spec>"`` makes one.

    Parameters
    ----------
    margin : float
        Compress when the predicted compressed time is below ``(1 - margin)`` times dense's.
    network : collectives.selection.cost_model.Network, optional
        The cost model's parameters, in place of the tuning file's (rank 0's are used).
    speed : CodecSpeed, optional
        The codec pipeline's speed, in place of the tuning file's (rank 0's is used).
    """

    margin: float = 0.1
    network: Network | None = None
    speed: CodecSpeed | None = None
    decisions: dict = field(default_factory=dict, repr=False)
    _agreed: Any = field(default_factory=weakref.WeakKeyDictionary, repr=False)
    _memo: dict = field(default_factory=dict, repr=False)
    #: where the cost model's parameters came from, and the nodes (for the report)
    model_source: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.margin, (int, float)) or not 0 <= self.margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {self.margin!r}")
        if self.network is not None and not isinstance(self.network, Network):
            raise TypeError(f"network must be a cost_model.Network, got "
                            f"{type(self.network).__name__}")
        if self.speed is not None and not isinstance(self.speed, CodecSpeed):
            raise TypeError(f"speed must be a CodecSpeed, got {type(self.speed).__name__}")

    # ------------------------------------------------------------------ deciding
    def _inputs(self, ctx: Context, node_size: int | None) -> _Inputs:
        base = ctx.cached(("compressed-auto", node_size),
                          lambda comm: _file_inputs(comm, node_size))
        if self.network is None and self.speed is None:
            return base
        agreed = self._agreed.get(ctx)
        if agreed is None:  # rank 0's own settings, once per communicator
            net, speed = ctx.comm.bcast((self.network, self.speed), root=0)
            agreed = self._agreed[ctx] = _Inputs(
                net or base.network, {"*": speed} if speed else base.speeds, base.nodes,
                "given" if net else base.network_source)
        return agreed

    def decide(self, codec: compress.Codec, key: Any, shape: tuple[int, ...], dtype: np.dtype,
               strategy: str, algorithm: str, ctx: Context, node_size: int | None) -> Decision:
        """The decision for one call (collective at the first call on a communicator): whether
        to compress a tensor of ``shape`` and ``dtype`` with ``codec``, recorded by ``key``."""
        inputs = self._inputs(ctx, node_size)
        p = ctx.comm.size
        self.model_source = (f"{inputs.network_source} model, "
                             f"{len(inputs.nodes)} node{'s' if len(inputs.nodes) > 1 else ''} "
                             f"of {'+'.join(map(str, inputs.nodes))} ranks")
        sel = selector(ctx, node_size) if algorithm == "auto" else None
        memo_key = (id(inputs), tuple(shape), np.dtype(dtype).str, strategy, algorithm,
                    codec.name, tuple(sorted(_params_of(codec).items())))
        made = self._memo.get(memo_key)
        if made is None:
            made = self._memo[memo_key] = self._predict(codec, shape, np.dtype(dtype), strategy,
                                                        algorithm, p, inputs, sel)
        old = self.decisions.get(key)
        new = Decision(key, *made,
                       calls_dense=0 if old is None else old.calls_dense,
                       calls_codec=0 if old is None else old.calls_codec)
        if new.compress:
            new.calls_codec += 1
        else:
            new.calls_dense += 1
        self.decisions[key] = new
        return new

    def _predict(self, codec, shape, dtype, strategy, algorithm, p, inputs, sel) -> tuple:
        count = int(np.prod(shape))
        n = count * dtype.itemsize
        b = _payload_nbytes(codec, tuple(shape), dtype)
        net = inputs.network

        def dense_name(nbytes: int) -> str:
            if sel is None:
                return algorithm
            return sel.pick(nbytes, max(1, nbytes // dtype.itemsize))

        name = dense_name(n)
        dense = _dense_time(name, n, p, net)
        speed = inputs.speeds["*"] if "*" in inputs.speeds else _speed_for(codec, inputs.speeds)
        encode = speed.encode * n
        if strategy == "summable":
            exchange = _dense_time(dense_name(b), b, p, net)
            decode = speed.decode * n
        else:
            exchange = allgather(b, p, net)
            decode = speed.decode * n + speed.payload * p * b
        chosen = p > 1 and encode + exchange + decode < (1 - self.margin) * dense
        return (count, n, b, name, strategy, dense, encode, exchange, decode, chosen,
                speed.source)

    # ------------------------------------------------------------------ the report
    def report(self) -> str:
        """One line per tensor key: its size, what was chosen at its latest call, the predicted
        dense time (and algorithm) against the codec's (encode + exchange + decode), the source
        of the codec's speed, and how many calls went each way."""
        if not self.decisions:
            return "auto: no compressed allreduce yet"
        lines = [f"auto: compress when encode + exchange + decode < {1 - self.margin:.2f} x "
                 f"dense (predicted ms; {self.model_source})",
                 f"{'key':<18} {'MB':>8} {'chosen':>7} {'dense ms':>9} {'algorithm':<14} "
                 f"{'codec ms':>9} = {'encode':>7} + {'exch':>7} + {'decode':>7}  "
                 f"{'calls dense/codec':>17}  speed"]
        for d in self.decisions.values():
            lines.append(
                f"{str(d.key):<18} {d.nbytes / 1e6:>8.2f} {'codec' if d.compress else 'dense':>7} "
                f"{d.dense_s * 1e3:>9.2f} {d.dense_algorithm:<14} {d.compressed_s * 1e3:>9.2f} = "
                f"{d.encode_s * 1e3:>7.2f} + {d.exchange_s * 1e3:>7.2f} + "
                f"{d.decode_s * 1e3:>7.2f}  {d.calls_dense:>8}/{d.calls_codec:<8}  "
                f"{d.speed_source}")
        return "\n".join(lines)

    def summary(self) -> dict[str, Any]:
        """The decisions as plain data (for logs): key -> fields of :class:`Decision`."""
        out = {}
        for d in self.decisions.values():
            row = {k: v for k, v in asdict(d).items() if k != "key"}
            row["compressed_s"] = d.compressed_s
            out[str(d.key)] = row
        return out

