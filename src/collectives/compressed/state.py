"""The state of a compressed allreduce, in one object.

A compressed allreduce keeps state per tensor key, in four roles:

``codec``
    The ``compress`` codec; its own state (PowerSGD's warm-start Q, the generator of codecs with
    private randomness) is ``codec.state_dict()``.
``memory``
    The client-side compensation memory around the codec (``compress.ErrorFeedback``, or
    ``compress.DGCMemory``), or None: every rank's own residuals.
``server``
    The server-side error feedback of the "two_phase" strategy (a ``compress.ErrorFeedback`` of its
    own around the codec, kept per tensor chunk on the rank that serves it; by default a
    :class:`ServerFeedback`); made when the codec needs error feedback.
``step``
    The training step a call uses when it is not given one (``compressed_allreduce(..., step=)``);
    shared-randomness codecs draw from ``(seed, key, step)``. The caller advances it.

``auto`` (a setting, not state) is an :class:`~collectives.compressed.auto.AutoCompression`:
each call then compresses only where the cost model predicts it pays, and otherwise sends dense
(``codec="auto:<spec>"`` makes one; :mod:`collectives.compressed.auto`).

``start_step`` (a setting, not state) makes the calls of the first steps dense, as the
``start_powerSGD_iter`` of PyTorch's PowerSGD hook: a call whose step is below it is a plain
allreduce of the tensor (sum or average) and leaves the memory and the codec's state alone, so
compression starts from the gradients of a model past its first, fastest-changing steps.

``state_dict()`` gives all of it as named host arrays and ``load_state_dict()`` takes it back, so a
checkpoint that saves ``state.state_dict()`` on every rank resumes bit for bit (PyTorch's
``PowerSGDState`` plays this role for its communication hook).

``compressed_allreduce`` takes a state, or a bare codec or memory: then it makes a state around it
and keeps that object's server-side residuals on the communicator (:func:`state_of`), so they
persist across calls.

From a spec. :meth:`CompressionState.from_spec` is the one builder from a codec spec
(``"topk:ratio=0.01"``, ``"auto:<spec>"``) to a state: ``compressed_allreduce`` given a spec, the
PyTorch integration, the SGD driver and the benchmark tools all call it. Its codec is seeded by
what the codec declares (``randomness``, :func:`seeded_codec`):

- *private* randomness (QSGD, TernGrad, natural compression, DGC's sampling) must draw
  independent noise on every rank: the codec gets its own ``numpy.random.Generator`` from
  ``SeedSequence((seed, rank))``, kept in its ``state_dict()``;
- *shared* randomness (random-k's indices, PowerSGD's initial Q) must agree across ranks: the
  codec gets the integer ``seed``, the same on every rank (and draws from ``(seed, key, step)``);
- a ``seed=`` in the spec replaces the ``seed`` argument as the base seed.

So the same spec, seed and rank give the same state, bit for bit, whoever builds it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import compress
from compress import Codec, ErrorFeedback
from compress.arrays import namespace
from compress.memory import Residual
from compress.protocols import Memory

from .._runtime.context import Context
from .auto import AutoCompression, split_spec

__all__ = ["CompressionState", "ServerFeedback", "base_codec", "seeded_codec", "state_of"]


def seeded_codec(spec: str, *, seed: int = 0, rank: int = 0) -> Codec:
    """The codec of ``spec`` (no ``"auto:"``) for ``rank``, seeded as the module docstring says
    (also CHOCO-SGD's codec); ValueError/TypeError on a bad name or parameter."""
    name, params = compress.parse_spec(spec)
    if name not in compress.CODECS:
        raise ValueError(f"unknown codec {name!r}; valid names: {', '.join(compress.CODECS)}")
    base_seed = params.pop("seed", seed)
    if not isinstance(base_seed, (int, np.integer)) or isinstance(base_seed, bool):
        raise ValueError(f"seed must be an integer, got {base_seed!r}")
    randomness = compress.CODECS[name].randomness
    if randomness == "private":
        params["seed"] = np.random.default_rng(np.random.SeedSequence((int(base_seed), rank)))
    elif randomness == "shared":
        params["seed"] = int(base_seed)
    return compress.get(name, **params)


def base_codec(obj: object) -> object:
    """The codec inside a memory (``.codec``, through any number of memories) or a state."""
    if isinstance(obj, CompressionState):
        return obj.codec
    while isinstance(obj, Memory):
        obj = obj.codec
    return obj


def _prefixed(prefix: str, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"{prefix}/{name}": value for name, value in state.items()}


def _part(state: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    head = prefix + "/"
    return {name[len(head):]: value for name, value in state.items() if name.startswith(head)}


class ServerFeedback(ErrorFeedback):
    """Error feedback for the server side of two-phase: ``compress.ErrorFeedback`` whose first
    step for a key compresses the aggregate as it is, as DeepSpeed's server does (adding a zero
    residual would turn a -0.0 of the aggregate into +0.0, which a codec that keeps values, fp16
    say, sends differently)."""

    def addend(self, x, *, key=None):
        if key in self.state:
            return super().addend(x, key=key)
        self.state[key] = Residual(namespace(x).zeros_like(x))
        return None  # the aggregate as it is


@dataclass(eq=False)
class CompressionState:
    """Everything a compressed allreduce keeps between calls; see the module docstring.

    Parameters
    ----------
    codec : compress.Codec
        The codec, the same on every rank (private seeds aside).
    memory : compress.protocols.Memory, optional
        A memory around ``codec`` (``compress.ErrorFeedback(codec)``); None: no compensation.
    server : compress.ErrorFeedback, optional
        Server-side error feedback around ``codec``; by default one is made when
        ``codec.needs_error_feedback``.
    step : int
        The step a call without ``step=`` uses.
    start_step : int
        Calls at a step below it are dense allreduces (PyTorch's ``start_powerSGD_iter``).
    auto : AutoCompression, optional
        Decide per call between the codec and a dense allreduce from the cost model.

    Notes
    -----
    One state serves the tensors of one communicator (keys tell the tensors apart; the server-side
    residuals are those of the chunks this rank serves there).
    """

    codec: Codec
    memory: Memory | None = None
    server: ErrorFeedback | None = None
    step: int = 0
    start_step: int = 0
    auto: AutoCompression | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.codec, Codec):
            raise TypeError(f"codec must be a compress codec, got {type(self.codec).__name__}")
        if self.memory is not None and (not isinstance(self.memory, Memory)
                                        or base_codec(self.memory) is not self.codec):
            raise ValueError("memory must be a compress memory (ErrorFeedback, DGCMemory) around "
                             "this state's codec")
        if self.server is None and self.codec.needs_error_feedback:
            self.server = ServerFeedback(self.codec)
        if self.server is not None and (not isinstance(self.server, ErrorFeedback)
                                        or self.server.codec is not self.codec):
            raise ValueError("server must be a compress.ErrorFeedback around this state's codec")
        if self.auto is not None:
            if not isinstance(self.auto, AutoCompression):
                raise TypeError(f"auto must be a collectives.compressed.auto.AutoCompression, "
                                f"got {type(self.auto).__name__}")
            if self.memory is not None and type(self.memory).flush is Memory.flush:
                raise ValueError(f"auto needs a memory that a dense step can flush "
                                 f"(ErrorFeedback, DGCMemory), got {type(self.memory).__name__}")
        for name, value in (("step", self.step), ("start_step", self.start_step)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")

    @classmethod
    def of(cls, codec_or_memory: object, *,
           error_feedback: bool | None = False) -> "CompressionState":
        """A state around a codec, or around a memory wrapping one (which becomes ``memory``).

        ``error_feedback``: wrap a bare codec in ``compress.ErrorFeedback`` (True), or do so when
        the codec declares ``needs_error_feedback`` (None); False keeps it bare.
        """
        if isinstance(codec_or_memory, CompressionState):
            return codec_or_memory
        codec = base_codec(codec_or_memory)
        if not isinstance(codec, Codec):
            raise TypeError(f"codec must be a compress codec or a memory around one, "
                            f"got {type(codec_or_memory).__name__}")
        memory = codec_or_memory if codec_or_memory is not codec else None
        wanted = codec.needs_error_feedback if error_feedback is None else error_feedback
        if memory is None and wanted:
            memory = ErrorFeedback(codec)
        return cls(codec, memory)

    @classmethod
    def from_spec(cls, spec: str, *, seed: int = 0, rank: int = 0,
                  error_feedback: bool | None = False, momentum_correction: dict | None = None,
                  start_step: int = 0, residual_dtype: str | None = None) -> "CompressionState":
        """The state of a codec spec for ``rank``: the one builder from a spec to a state.

        Parameters
        ----------
        spec : str
            ``"name:k=v,..."`` (``compress.parse_spec``), or ``"auto:<spec>"``: the same state
            with an :class:`~collectives.compressed.auto.AutoCompression`.
        seed, rank : int
            The codec's seeding (the module docstring): private randomness from
            ``(seed, rank)``, shared randomness from ``seed``, the same on every rank.
        error_feedback : bool or None
            Wrap the codec in ``compress.ErrorFeedback`` (True), keep it bare (False), or do so
            where the codec declares ``needs_error_feedback`` (None).
        momentum_correction : dict, optional
            The keyword arguments of a ``compress.DGCMemory`` around the codec (DGC's momentum
            correction, warm-up and clipping), in place of error feedback.
        start_step : int
            Calls at a step below it are dense.
        residual_dtype : {None, "float32", "float16", "bfloat16"}
            The dtype error feedback keeps its residuals in (``compress.ErrorFeedback``'s
            ``residual_dtype``; :mod:`compress.residual`); None: the tensor's own. Only with
            error feedback.

        Raises
        ------
        ValueError, TypeError
            For a bad spec (an auto one's message lists the valid forms), seed or setting.
        """
        if not isinstance(spec, str):
            raise TypeError(f"spec must be a codec spec (\"topk:ratio=0.01\"), "
                            f"got {type(spec).__name__}")
        inner = split_spec(spec)
        codec = seeded_codec(spec if inner is None else inner, seed=seed, rank=rank)
        if momentum_correction is not None:
            memory: Memory | None = compress.DGCMemory(codec, **momentum_correction)
        else:
            wanted = codec.needs_error_feedback if error_feedback is None else error_feedback
            memory = ErrorFeedback(codec, residual_dtype=residual_dtype) if wanted else None
        if residual_dtype is not None and not isinstance(memory, ErrorFeedback):
            raise ValueError(f"residual_dtype={residual_dtype!r} sets error feedback's residual: "
                             f"{spec!r} has no error feedback here")
        return cls(codec, memory, start_step=start_step,
                   auto=None if inner is None else AutoCompression())

    @property
    def encoder(self):
        """What encodes this rank's contribution: the memory, else the codec."""
        return self.codec if self.memory is None else self.memory

    @property
    def error_feedback(self) -> ErrorFeedback | None:
        """The client-side memory if it is error feedback (the summable strategy needs that)."""
        return self.memory if isinstance(self.memory, ErrorFeedback) else None

    @property
    def generator(self) -> np.random.Generator | None:
        """The codec's private generator (codecs with ``randomness == "private"``), else None."""
        return self.codec.generator

    def held_nbytes(self) -> int:
        """Bytes the state holds: the codec's and the server's arrays, and the memory's (with
        the spare and scratch buffers of ``compress.ErrorFeedback.held_nbytes`` where it has
        them), without copying the residuals as :meth:`state_dict` does."""
        parts = [self.codec.state_dict()]
        if self.server is not None:
            parts.append(self.server.state_dict())
        held = 0
        if isinstance(self.memory, ErrorFeedback):
            held = self.memory.held_nbytes()
        elif self.memory is not None:
            parts.append(self.memory.state_dict())
        return held + sum(int(v.nbytes) for part in parts for v in part.values())

    def state_dict(self) -> dict[str, np.ndarray]:
        """All of the state as named host arrays: ``step``, ``codec/...`` (the codec's own),
        ``memory/...`` and ``server/...`` (residuals by tensor key)."""
        out = {"step": np.array(self.step)}
        out.update(_prefixed("codec", self.codec.state_dict()))
        if self.memory is not None:
            out.update(_prefixed("memory", self.memory.state_dict()))
        if self.server is not None:
            out.update(_prefixed("server", self.server.state_dict()))
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` returned (the same configuration: codec, memory)."""
        self.step = int(state["step"]) if "step" in state else 0
        self.codec.load_state_dict(_part(state, "codec"))
        if self.memory is not None:
            self.memory.load_state_dict(_part(state, "memory"))
        if self.server is not None:
            self.server.load_state_dict(_part(state, "server"))


_SERVER_KEY = "compressed.server_residuals"


def state_of(obj: object, ctx: Context) -> CompressionState:
    """The state a call with ``obj`` uses: ``obj`` itself if it is one; for a bare codec or memory,
    a state around it whose server-side residuals are kept for that object on the communicator of
    ``ctx`` (from its first call until the object is gone: the cache holds no reference to it,
    only to the residuals)."""
    if isinstance(obj, CompressionState):
        return obj
    state = CompressionState.of(obj)
    if state.server is not None:
        kept = ctx.cached(_SERVER_KEY, lambda comm: {})
        entry = kept.get(id(obj))
        if entry is None or entry[0]() is not obj:
            entry = (weakref.ref(obj, lambda _, k=id(obj): kept.pop(k, None)), state.codec.name, {})
            kept[id(obj)] = entry
        state.server.state = entry[2]
    return state
