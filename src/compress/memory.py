"""Compensation memories: error feedback and DGC's momentum correction.

:class:`ErrorFeedback` keeps, per tensor key, the residual ``e`` that the codec dropped and adds it to
the next input (Seide et al. 2014; Stich et al. 2018; Karimireddy et al. 2019)::

    c = x + e;   payload = encode(c);   e = c - decode(payload)

:class:`DGCMemory` implements Deep Gradient Compression's momentum correction and momentum factor
masking (Lin et al., ICLR 2018): the momentum is accumulated *before* compression, and both the
momentum and the accumulated velocity are cleared where elements were sent::

    u = m u + g;   v = v + u;   payload = encode(v);   sent = decode(payload) != 0
    v[sent] = 0;   u[sent] = 0

With DGCMemory the optimizer must use plain SGD (momentum already applied). The rest of DGC as
published is two more options of DGCMemory: ``warmup`` (a :class:`compress.SparsityWarmup`: the
density rises to the codec's own over the first epochs) and ``clip`` (local gradient clipping:
each rank scales its gradient to an L2 norm of at most ``clip`` before folding it in; the paper
takes the global threshold times ``N ** -0.5`` for N ranks).

Non-finite input (an overflowed gradient in mixed-precision training): the payload carries the
``inf`` or NaN on (every codec propagates it, see ``docs/compression.md``), so a loss scaler skips
the step; the memory then keeps its state as it was before that step, as the optimizer does. A
residual, momentum or velocity that would not be finite is never stored: one overflow would
otherwise poison every later step.

The fused path: for host arrays and a codec that speaks :class:`compress.protocols.FusedFeedback`
(top-k, DGC, threshold, random-k), the codec's selecting pass computes ``c`` (or ``u`` and ``v``)
into buffers the memory keeps per key, and the memory then writes the sent elements' new state
(zero, or ``c - decoded``) at the sent indices only: one pass over the tensor instead of a
compensation, an encode, a decode and a finiteness check, and no allocation after the second step.
The state is double-buffered (the buffer written this step becomes the state; the state before
becomes the next step's buffer), so a skipped step still has the state it had. A key's first
step computes ``x + zeros`` into its zeros (one new buffer); the second step makes the other
one. Both paths give the same bits (``tests/compress/test_fused.py``); ``fused=False`` takes the
generic one. Device arrays take the generic one.

A narrower residual: ``ErrorFeedback(codec, residual_dtype="float16" | "bfloat16")`` keeps each
residual in two bytes per element instead of the tensor's four (:mod:`compress.residual`: the
formats, what each costs in rounding). The compensated values are computed in the tensor's dtype
in scratch buffers the memory shares between its keys (the largest tensor's size, two of them),
and only the rounded residual stays per key: no spare per key either, so a float32 tensor's
error feedback holds a quarter of the bytes of the default's residual and spare.

Both keep state in small dataclasses, check their arguments, and are
:class:`compress.protocols.Memory` (which gives them ``decode``, the codec's, and ``reset``):
``state_dict()`` gives every key's state as named host arrays (keys as ``str(key)``),
``load_state_dict()`` puts it back, so a checkpoint can carry it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._backends import HOST, backend_of, count_nonfinite
from ._util import quiet
from .base import Codec
from .arrays import as_array, host_copy, is_device, like, namespace
from .protocols import FusedFeedback, Memory, SparsePayload
from .residual import ResidualFormat, residual_format
from .schedule import SparsityWarmup

__all__ = ["ErrorFeedback", "DGCMemory", "Residual", "MomentumState"]


def _check_codec(codec) -> None:
    if not isinstance(codec, Codec):
        raise ValueError(f"codec must be a compress.Codec instance, got {type(codec).__name__}")


def _check_like(name: str, state: np.ndarray, x: np.ndarray, key) -> None:
    if state.shape != x.shape or state.dtype != x.dtype:
        raise ValueError(
            f"key {key!r}: {name} has shape {state.shape} and dtype {state.dtype}, but the new tensor "
            f"has shape {x.shape} and dtype {x.dtype}; use a distinct key per tensor or call reset()"
        )


@dataclass
class Residual:
    """Error-feedback state of one tensor: the residual and how many encodes built it.

    ``spare`` is the buffer the next fused encode writes the new residual into (the residual
    before this one, reused): not state, never saved."""

    error: np.ndarray
    steps: int = 0
    spare: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if not (isinstance(self.error, np.ndarray) or is_device(self.error)):
            raise ValueError("error must be a numpy (or cupy) array")


def _by_key(state: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The entries ``prefix/<key>`` of a state dict, by key."""
    head = prefix + "/"
    return {name[len(head):]: value for name, value in state.items() if name.startswith(head)}


@dataclass
class ErrorFeedback(Memory):
    """Error feedback around any codec.

    Parameters
    ----------
    codec : Codec
        The compressor whose error is fed back.
    fused : bool
        For a codec that speaks :class:`compress.protocols.FusedFeedback` and host input, compute
        ``x + e`` in the codec's selecting pass into a buffer kept per key, which becomes the
        residual (the default); False: compute, encode, decode as for any codec. Both give the
        same bits (``tests/compress/test_fused.py``); the switch is for comparing them.
    residual_dtype : {None, "float32", "float16", "bfloat16"}
        The dtype each residual is kept in (:mod:`compress.residual`); None: the tensor's own.
        A narrower one is rounded to nearest even after every step (``residual()`` gives its
        values in the tensor's dtype; ``state_dict()`` the stored array: float16, or bfloat16's
        uint16 words).
    """

    codec: Codec
    state: dict = field(default_factory=dict, repr=False)
    fused: bool = True
    residual_dtype: str | None = None
    _scratch: list = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self):
        _check_codec(self.codec)
        self._format: ResidualFormat | None = residual_format(self.residual_dtype)
        if self._format is not None:
            self.residual_dtype = self._format.name

    def _narrow(self, x) -> ResidualFormat | None:
        """The format a residual of ``x`` is narrowed to, or None (kept in ``x``'s dtype)."""
        fmt = self._format
        return None if fmt is None or not fmt.narrows(x.dtype) else fmt

    def _work(self, i: int, x) -> np.ndarray:
        """Scratch buffer ``i`` (0: the widened residual, 1: the compensated values) in ``x``'s
        shape and dtype, shared by every key (grown to the largest tensor)."""
        while len(self._scratch) <= i:
            self._scratch.append(None)
        buf = self._scratch[i]
        if buf is None or buf.size < x.size or buf.dtype != x.dtype or type(buf) is not type(x):
            buf = self._scratch[i] = namespace(x).empty(x.size, dtype=x.dtype)
        return buf[:x.size].reshape(x.shape)

    def held_nbytes(self) -> int:
        """Bytes this memory holds: every key's residual and spare, and the shared scratch."""
        held = sum(int(st.error.nbytes) + (0 if st.spare is None else int(st.spare.nbytes))
                   for st in self.state.values())
        return held + sum(int(b.nbytes) for b in self._scratch if b is not None)

    def encode(self, x, *, key=None, step: int = 0, out=None) -> np.ndarray:
        """Encode ``x`` plus the residual of ``key`` (into ``out``, see ``Codec.encode``), and
        update the residual."""
        a = as_array(x)
        if self.fused and isinstance(self.codec, FusedFeedback) and type(a) is np.ndarray:
            fused = self._encode_fused if self._narrow(a) is None else self._encode_fused_narrow
            payload = fused(a, key, step, None if out is None else as_array(out))
            return like(x, payload) if out is None else out
        corrected = self.compensate(a, key=key)
        payload = self.codec.encode(corrected, key=key, step=step,
                                    out=None if out is None else as_array(out))
        if isinstance(self.codec, SparsePayload):
            # decode() is zero but at the sent indices: the residual is ``corrected`` (a fresh
            # array) minus the sent values there. O(k) instead of a dense decode and subtraction.
            idx, vals = self.codec.sparse_parts(payload, count=corrected.size)
            flat = corrected.reshape(-1)
            with quiet():
                flat[idx] -= vals
            self._store(key, corrected)
        else:
            self.remember(corrected, self.codec.decode(payload, count=corrected.size), key=key)
        return like(x, payload) if out is None else out

    def _encode_fused(self, x: np.ndarray, key, step: int, out) -> np.ndarray:
        """The fused path (host input, a codec that speaks ``FusedFeedback``): the codec's
        selecting pass computes ``x + e`` into the key's spare buffer; where nothing overflowed,
        the sent elements there become ``c - decoded`` and the buffer becomes the residual (the
        old residual the next spare). The same bits as the generic path, one pass over memory
        fewer, no allocation after the second step (the first computes into its zeros, the
        second makes the spare)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        x = self.codec._prepare(x, HOST)
        # the first step of a key computes x + zeros into the zeros themselves: one new buffer,
        # not a residual of zeros and a spare (a memory with its own addend, two-phase's
        # server, makes its first step itself)
        first = key not in self.state and type(self).addend is ErrorFeedback.addend
        if first:
            addend = spare = np.zeros_like(x)
        else:
            addend = self.addend(x, key=key)
            st = self.state[key]
            spare = st.spare
            if spare is None or spare.shape != x.shape or spare.dtype != x.dtype:
                spare = st.spare = np.empty_like(x)
        src = HOST.compensated(x, addend, spare)
        payload, idx, sent = self.codec._encode_source(src, key, int(step), out)
        if src.nonfinite or (not self.codec.sends_values
                             and HOST.subtract_at(src.values, idx, sent)):
            # c holds inf or NaN, or a decoded value overflowed (n/k): the residual stays
            if first:  # (zeros, as addend() makes them)
                self.state[key] = Residual(np.zeros_like(x))
            return payload
        if self.codec.sends_values:  # c - c at the sent indices: +0.0
            HOST.zero_at(spare, idx)
        if first:  # the next step makes its spare
            self.state[key] = Residual(spare, steps=1)
            return payload
        st.spare, st.error = st.error, spare
        st.steps += 1
        return payload

    def _encode_fused_narrow(self, x: np.ndarray, key, step: int, out) -> np.ndarray:
        """The fused path with a narrower residual: the residual widened into scratch 0, ``x +
        e`` computed by the codec's selecting pass into scratch 1, the sent elements there
        becoming ``c - decoded``, and the result rounded into the key's stored residual (left
        as it was where something overflowed)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        x = self.codec._prepare(x, HOST)
        addend = self.addend(x, key=key)
        spare = self._work(1, x)
        src = HOST.compensated(x, addend, spare)
        payload, idx, sent = self.codec._encode_source(src, key, int(step), out)
        if src.nonfinite or (not self.codec.sends_values
                             and HOST.subtract_at(src.values, idx, sent)):
            return payload
        if self.codec.sends_values:  # c - c at the sent indices: +0.0
            HOST.zero_at(spare, idx)
        st = self.state[key]
        self._format.narrow(spare, st.error)
        st.steps += 1
        return payload

    def addend(self, x, *, key=None):
        """The residual of ``key`` that :meth:`compensate` adds to ``x`` (zeros the first time,
        made now), checked against ``x``, in ``x``'s dtype (a narrower residual widened into a
        shared scratch buffer); None: ``x`` is compressed as it is."""
        xp = namespace(x)
        fmt = self._narrow(x)
        st = self.state.get(key)
        if st is None:
            st = self.state[key] = Residual(xp.zeros_like(x) if fmt is None
                                            else fmt.zeros(x.shape, x))
        if fmt is None:
            _check_like("the residual", st.error, x, key)
            return st.error
        if st.error.shape != x.shape or st.error.dtype != fmt.storage:
            raise ValueError(f"key {key!r}: the residual has shape {st.error.shape} and dtype "
                             f"{st.error.dtype}, but the new tensor has shape {x.shape} (a "
                             f"{fmt.name} residual); use a distinct key per tensor or call "
                             "reset()")
        return fmt.widen(st.error, self._work(0, x))

    def compensate(self, x, *, key=None) -> np.ndarray:
        """``x`` plus the residual of ``key`` (zeros the first time): what to compress now.

        With :meth:`remember`, this lets a collective that compresses in its own way (a summable
        allreduce, PowerSGD's two rounds) keep the same error feedback as :meth:`encode`.
        """
        xp = namespace(x)
        x = xp.asarray(x)
        addend = self.addend(x, key=key)
        if addend is None:
            return xp.array(x, copy=True)  # a new array: encode() updates it in place
        with quiet():
            return x + addend

    def remember(self, corrected, estimate, *, key=None, overwrite=False) -> None:
        """Store ``corrected - estimate`` as the new residual of ``key`` (after :meth:`compensate`),
        unless it is not finite: then the residual stays as it was (the step is skipped).

        ``overwrite=True`` computes the difference in ``corrected`` itself and keeps that array
        as the residual (no new array): for a caller that owns ``corrected`` (what
        :meth:`compensate` returned) and reads it no more."""
        xp = namespace(corrected)
        estimate = xp.asarray(estimate).reshape(corrected.shape).astype(corrected.dtype,
                                                                        copy=False)
        with quiet():
            if overwrite:
                self._store(key, xp.subtract(corrected, estimate, out=corrected))
            else:
                self._store(key, corrected - estimate)

    def _store(self, key, error) -> None:
        """The new residual of ``key``, if finite: an overflowed step leaves the old one."""
        if count_nonfinite(error):
            return
        st = self.state[key]
        fmt = self._narrow(error)
        if fmt is None:
            st.error = error
        else:
            fmt.narrow(error, st.error)
        st.steps += 1

    def flush(self, x, *, key=None):
        """What a dense step sends for ``x`` instead of a payload: ``x`` plus the residual of
        ``key`` (``x`` itself when there is none), after which ``key`` has no residual (the next
        encode starts from zero), so what was sent over all steps plus the residual is still the
        sum of the inputs. A sum that is not finite is returned but the residual stays (a skipped
        step, as :meth:`encode`)."""
        st = self.state.get(key)
        if st is None:
            return x
        x = namespace(x).asarray(x)
        with quiet():
            c = x + self.addend(x, key=key)
        if not count_nonfinite(c):
            del self.state[key]
        return c

    def residual(self, key=None) -> np.ndarray | None:
        """A copy of the current residual of ``key`` (None before its first encode), in the
        dtype it is kept in (a bfloat16 one's words widened to float32, exactly); the live
        array's memory is reused by a later fused encode."""
        st = self.state.get(key)
        if st is None:
            return None
        if self._format is not None and self._format.name == "bfloat16":
            return self._format.widen(st.error, namespace(st.error).empty(st.error.shape,
                                                                          dtype=np.float32))
        return backend_of(st.error).copy(st.error)

    def state_dict(self) -> dict[str, np.ndarray]:
        """``error/<key>`` (the residual as stored, on the host: a narrower one in its own
        dtype, bfloat16 as uint16 words) and ``steps/<key>`` of every key."""
        out: dict[str, np.ndarray] = {}
        for key, st in self.state.items():
            out[f"error/{key}"] = host_copy(st.error)
            out[f"steps/{key}"] = np.array(st.steps)
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Replace every residual by those of :meth:`state_dict` (keys come back as str)."""
        steps = _by_key(state, "steps")
        errors = _by_key(state, "error")
        fmt = self._format
        if fmt is not None and fmt.name == "bfloat16":
            for key, error in errors.items():
                if np.asarray(error).dtype != fmt.storage:
                    raise ValueError(f"key {key!r}: a bfloat16 residual is kept as uint16 words, "
                                     f"the state holds {np.asarray(error).dtype}")
        self.state = {key: Residual(np.array(error, copy=True), int(steps.get(key, 0)))
                      for key, error in errors.items()}


@dataclass
class MomentumState:
    """DGC state of one tensor: momentum ``u`` and accumulated velocity ``v``.

    ``u_spare`` and ``v_spare`` are the buffers the next fused encode writes the new ones into
    (the ones before, reused): not state, never saved."""

    u: np.ndarray
    v: np.ndarray
    u_spare: np.ndarray | None = field(default=None, repr=False, compare=False)
    v_spare: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.u.shape != self.v.shape:
            raise ValueError(f"u and v must have the same shape, got {self.u.shape} and {self.v.shape}")


#: the field that holds the density of each codec a warm-up can drive
_DENSITY = {"dgc": "density", "topk": "ratio"}


def _clipped(grad, clip: float):
    """``grad`` scaled to L2 norm ``clip`` if its norm is larger (a new array), else ``grad``;
    a non-finite norm leaves it as it is (the overflow travels, by the module's rule)."""
    xp = namespace(grad)
    with quiet():
        norm = float(xp.sqrt(xp.sum(xp.square(grad.astype(xp.float64)))))
    if not norm > clip or norm == float("inf"):
        return grad
    return (grad * (clip / norm)).astype(grad.dtype, copy=False)


@dataclass
class DGCMemory(Memory):
    """DGC momentum correction with momentum factor masking.

    Parameters
    ----------
    codec : Codec
        Usually ``compress.get("dgc")`` or ``compress.get("topk")``.
    momentum : float
        Momentum coefficient, in [0, 1).
    fused : bool
        As for :class:`ErrorFeedback`: the codec's selecting pass computes momentum and velocity
        (default), or they are computed, encoded and decoded as for any codec.
    warmup : compress.SparsityWarmup, optional
        DGC's sparsity warm-up: at each step the codec (DGC or top-k) sends the schedule's
        density, and its own once the warm-up is over.
    clip : float, optional
        Local gradient clipping: the L2 norm a gradient is scaled down to before it is folded
        into the momentum (DGC: the global clipping threshold times ``N ** -0.5``).
    """

    codec: Codec
    momentum: float = 0.9
    state: dict = field(default_factory=dict, repr=False)
    fused: bool = True
    warmup: SparsityWarmup | None = None
    clip: float | None = None
    _final: float = field(init=False, repr=False, compare=False, default=0.0)

    def __post_init__(self):
        _check_codec(self.codec)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.warmup is not None:
            if not isinstance(self.warmup, SparsityWarmup):
                raise TypeError(f"warmup must be a compress.SparsityWarmup, got "
                                f"{type(self.warmup).__name__}")
            if self.codec.name not in _DENSITY:
                raise ValueError(f"warmup needs a codec with a density "
                                 f"({', '.join(_DENSITY)}), got {self.codec.name!r}")
            self._final = getattr(self.codec, _DENSITY[self.codec.name])
        if self.clip is not None and not (isinstance(self.clip, (int, float))
                                          and 0.0 < self.clip < float("inf")):
            raise ValueError(f"clip must be a positive finite L2 norm, got {self.clip!r}")

    def density(self, step: int) -> float | None:
        """The codec's density at ``step`` under ``warmup`` (None without one)."""
        return None if self.warmup is None else self.warmup.density(step, self._final)

    def encode(self, grad, *, key=None, step: int = 0) -> np.ndarray:
        """Fold ``grad`` into momentum and velocity, encode the velocity, clear what was sent.

        With ``warmup``, the codec sends this step's density; with ``clip``, ``grad`` is first
        scaled to that L2 norm if its norm is larger (a copy: the caller's array stays). A
        velocity that is not finite (an overflowed ``grad``) is encoded, so the payload carries
        the overflow, but momentum and velocity stay as they were before this step."""
        original, grad = grad, as_array(grad)
        if self.warmup is not None:
            setattr(self.codec, _DENSITY[self.codec.name], self.density(step))
        if self.clip is not None:
            grad = _clipped(grad, self.clip)
        if self.fused and isinstance(self.codec, FusedFeedback) and type(grad) is np.ndarray:
            return like(original, self._encode_fused(grad, key, step))
        xp = namespace(grad)
        grad = xp.asarray(grad)
        st = self._state(grad, key)
        with quiet():
            u = st.u * self.momentum
            u += grad
            v = st.v + u
        payload = self.codec.encode(v, key=key, step=step)
        if count_nonfinite(v):
            return like(original, payload)
        sent = self.codec.decode(payload, count=v.size) != 0
        v[sent] = 0
        u[sent] = 0
        st.u, st.v = u, v
        return like(original, payload)

    def flush(self, grad, *, key=None):
        """What a dense step sends for ``grad`` instead of a payload: the velocity after folding
        ``grad`` in (``u = m u + g``, ``v = v + u``, ``grad`` clipped first with ``clip``); every
        element is sent, so momentum factor masking clears all of ``key``'s state. A velocity
        that is not finite is returned but the state stays (a skipped step, as :meth:`encode`)."""
        grad = as_array(grad)
        if self.clip is not None:
            grad = _clipped(grad, self.clip)
        st = self.state.get(key)
        if st is None:
            return grad
        _check_like("the momentum", st.u, grad, key)
        with quiet():
            u = st.u * self.momentum
            u += grad
            v = st.v + u
        if not count_nonfinite(v):
            del self.state[key]
        return v

    def _encode_fused(self, grad: np.ndarray, key, step: int) -> np.ndarray:
        """The fused path: the codec's selecting pass computes the new momentum and velocity into
        the key's spare buffers; where the velocity is finite, they are cleared where the payload
        sends a nonzero value and become the state (the old state the next spares)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        grad = self.codec._prepare(grad, HOST)
        st = self._state(grad, key)
        if st.u_spare is None or st.u_spare.shape != grad.shape or st.u_spare.dtype != grad.dtype:
            st.u_spare, st.v_spare = np.empty_like(grad), np.empty_like(grad)
        u, v = st.u_spare, st.v_spare
        src = HOST.momentum(grad, st.u, st.v, u, v, self.momentum)
        payload, idx, sent = self.codec._encode_source(src, key, int(step), None)
        if not src.nonfinite:
            hit = idx[sent != 0]  # what decode(payload) != 0 marks
            HOST.zero_at(v, hit)
            HOST.zero_at(u, hit)
            st.u_spare, st.v_spare, st.u, st.v = st.u, st.v, u, v
        return payload

    def _state(self, grad, key) -> MomentumState:
        """The state of ``key`` (zeros the first time, made now), checked against ``grad``."""
        xp = namespace(grad)
        st = self.state.get(key)
        if st is None:
            st = self.state[key] = MomentumState(xp.zeros_like(grad), xp.zeros_like(grad))
        _check_like("the momentum", st.u, grad, key)
        return st

    def state_dict(self) -> dict[str, np.ndarray]:
        """``u/<key>`` (momentum) and ``v/<key>`` (velocity) of every key, on the host."""
        out: dict[str, np.ndarray] = {}
        for key, st in self.state.items():
            out[f"u/{key}"] = host_copy(st.u)
            out[f"v/{key}"] = host_copy(st.v)
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Replace all state by that of :meth:`state_dict` (keys come back as str)."""
        v = _by_key(state, "v")
        self.state = {key: MomentumState(np.array(u, copy=True), np.array(v[key], copy=True))
                      for key, u in _by_key(state, "u").items()}
