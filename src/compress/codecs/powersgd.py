"""PowerSGD: rank-r approximation by one step of subspace (power) iteration, with warm start.

How it works: a tensor of two or more dimensions is viewed as an ``rows x cols`` matrix ``M``
(``rows = shape[0]``). With ``Q`` from the previous step for the same key (warm start; initially
Gaussian drawn from ``(seed, key)``, so equal on every rank)::

    P = M Q            (rows x r)    -- linear in M: summable
    P_hat = orth(P)                  -- QR; done after summing P over ranks
    Q = M^T P_hat      (cols x r)    -- linear in M: summable
    M ~ P_hat Q^T

A compressed allreduce therefore runs, per tensor and step::

    p = codec.compute_p(x, key=k)               # local
    p = allreduce_sum(p)                        # summable factor 1
    p_hat = codec.orthogonalize(p)
    q = codec.compute_q(x, p_hat)               # local
    q = allreduce_sum(q) / world_size           # summable factor 2 (mean gradient)
    y = codec.reconstruct(p_hat, q, key=k)      # stores q for the warm start, returns P_hat Q^T

``encode``/``decode`` do the same on one process (payload = ``P_hat`` and ``Q``; ``encode`` keeps ``Q``
for the warm start without forming the full-size ``P_hat Q^T``). The approximation is biased; use
:class:`compress.ErrorFeedback`. Factor products are BLAS matrix products (NumPy), not Numba kernels.
Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", NeurIPS 2019.

Tensors that would not gain are sent uncompressed, as the paper, PyTorch's ``powerSGD_hook`` and
GRACE do: 0-d and 1-d tensors (biases), and matrices whose factors take more than
``1 / min_compression_rate`` of the tensor's bytes (PyTorch's ``min_compression_rate``, default 2,
compared here in bytes of this wire format). :meth:`PowerSGD.compresses` says which; such a payload has
``r = 0`` and holds the raw values, and a compressed allreduce sums them with a plain dense allreduce.

Wire size: ``header + (rows + cols) * r * S`` bytes with ``r = min(rank, rows, cols)``, ``S = 8`` for
float64 input and 4 otherwise, when compressed; ``header + n * itemsize`` when not;
``header = 16 + 8 * ndim + 24`` (rows, cols, r).

Non-finite input (an overflowed gradient): the factors of a matrix holding ``inf`` or NaN are NaN, so
the result is NaN (every element, in practice); an uncompressed tensor keeps its values. A ``Q`` that
is not finite is not kept for the warm start: the next step starts from the last finite ``Q`` (or a
fresh one), as a loss scaler skips the step.

Properties: summable (the factors, through the protocol above), biased, needs error feedback,
aggregation "mean". ``encode`` updates the per-key warm-start state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._layout import Section
from .._seeding import shared_stream
from .._util import quiet, require
from ..base import Codec
from ..arrays import host_copy, namespace
from ..protocols import LowRankSummable

__all__ = ["PowerSGD"]


def _work_dtype(dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _matrix_shape(shape) -> tuple[int, int]:
    n = int(np.prod(shape, dtype=np.int64))
    if len(shape) < 2:
        return n, 1
    return int(shape[0]), (n // shape[0] if shape[0] else 0)


@dataclass(eq=False)
class PowerSGD(LowRankSummable, Codec):
    """Rank-``rank`` PowerSGD with warm start.

    Parameters
    ----------
    rank : int
        Target rank r >= 1.
    seed : int
        Seed of the initial Q; must be equal on every rank.
    warm_start : bool
        Reuse the previous Q of each key (the paper's default); otherwise draw a fresh Q each step.
    min_compression_rate : float
        Compress a matrix only if its factors take less than ``1 / min_compression_rate`` of its
        bytes (PyTorch's ``PowerSGDState.min_compression_rate``); others, and every tensor of fewer
        than two dimensions, are sent uncompressed. ``0`` compresses every non-empty matrix.
    """

    rank: int = 1
    seed: int = 0
    warm_start: bool = True
    min_compression_rate: float = 2.0
    _q: dict = field(init=False, repr=False, default_factory=dict)

    name = "powersgd"
    codec_id = 15
    randomness = "shared"
    needs_error_feedback = True
    dtypes = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))
    PARAMS = (("rows", "Q"), ("cols", "Q"), ("rank", "Q"))

    def __post_init__(self):
        require(int(self.rank) >= 1, f"rank must be >= 1, got {self.rank}")
        require(isinstance(self.seed, (int, np.integer)), "seed must be an int shared by every rank")
        require(self.min_compression_rate >= 0,
                f"min_compression_rate must be >= 0, got {self.min_compression_rate!r}")

    def compresses(self, shape, dtype=np.float32) -> bool:
        """Whether a tensor of ``shape`` and ``dtype`` is sent as factors: it has two or more
        dimensions and ``(rows + cols) * r * S * min_compression_rate < rows * cols * itemsize``
        (bytes on the wire). Other tensors are sent uncompressed."""
        shape = tuple(int(s) for s in shape)
        if len(shape) < 2:
            return False
        rows, cols = _matrix_shape(shape)
        factors = (rows + cols) * min(self.rank, rows, cols) * _work_dtype(dtype).itemsize
        return factors * self.min_compression_rate < rows * cols * np.dtype(dtype).itemsize

    def body_nbytes(self, n, dtype, tensor_shape=None):
        shape = (n,) if tensor_shape is None else tensor_shape
        if not self.compresses(shape, dtype):
            return n * np.dtype(dtype).itemsize
        rows, cols = _matrix_shape(shape)
        return (rows + cols) * min(self.rank, rows, cols) * _work_dtype(dtype).itemsize

    def payload_nbytes(self, shape, dtype=np.float32, **data):
        shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
        return super().payload_nbytes(shape, dtype, tensor_shape=shape)

    # ------------------------------------------------------------------ LowRankSummable protocol
    def compute_p(self, x, *, key=None) -> np.ndarray:
        """``P = M Q`` for this rank's tensor ``x`` (rows x r); sum it over ranks.

        Host (NumPy) or CuPy arrays; the results live where ``x`` does."""
        return self._p_of(self._matrix(self._prepare_any(x)), key)

    @staticmethod
    def orthogonalize(p: np.ndarray) -> np.ndarray:
        """Orthonormal basis of the columns of the summed ``P`` (reduced QR)."""
        if p.size == 0:
            return p.copy()
        return namespace(p).linalg.qr(p)[0].astype(p.dtype, copy=False)

    def compute_q(self, x, p_hat: np.ndarray) -> np.ndarray:
        """``Q = M^T P_hat`` (cols x r); sum (or average) it over ranks."""
        with quiet():
            return self._matrix(self._prepare_any(x)).T @ p_hat

    def reconstruct(self, p_hat, q, *, key=None, shape=None, dtype=None, out=None) -> np.ndarray:
        """``P_hat Q^T`` reshaped to ``shape``; remembers ``q`` as the warm start of ``key``.

        ``out`` (contiguous, ``rows * cols`` elements): the product is written there, without a
        temporary, when its dtype is that of the factors (float32 or float64); else it is
        ignored."""
        self._keep_q(key, q)
        rows, cols = p_hat.shape[0], q.shape[0]
        into = out is not None and out.dtype == p_hat.dtype == q.dtype \
            and out.size == rows * cols and out.flags.c_contiguous
        with quiet():
            y = namespace(p_hat).matmul(p_hat, q.T, out=out.reshape(rows, cols)) if into \
                else p_hat @ q.T
        return y.reshape(shape if shape is not None else y.shape).astype(dtype or y.dtype, copy=False)

    def state_dict(self) -> dict:
        """The warm-start state (each key's last ``Q``, copied), equal on every rank: what a
        checkpoint saves so that a resumed run continues bit for bit."""
        return {k: v.copy() for k, v in self._q.items()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (replacing all current warm-start state)."""
        self._q = {k: np.array(v, copy=True) for k, v in state.items()}

    def reset(self, key=None) -> None:
        """Forget warm-start state (of one key, or of all when ``key`` is None)."""
        if key is None:
            self._q.clear()
        else:
            self._q.pop(key, None)

    # ------------------------------------------------------------------ codec interface
    def _sections(self, n, dtype, params):
        r = params["rank"]
        if r == 0:
            return [Section("raw", dtype, n)]
        w = _work_dtype(dtype)
        return [Section("p", w, params["rows"] * r), Section("q", w, params["cols"] * r)]

    def _check_params(self, hdr):
        rows, cols, r = hdr.params["rows"], hdr.params["cols"], hdr.params["rank"]
        require(rows * cols == hdr.count, f"matrix {rows} x {cols} does not hold {hdr.count} elements")
        require(r <= min(rows, cols), f"rank {r} exceeds min(rows, cols) = {min(rows, cols)}")

    def _encode(self, x, ops, key, step, out):
        """The steps of the protocol on one process, with NumPy or (device input) CuPy: cuBLAS
        products, cuSOLVER QR; CuPy arrays only on the device. A tensor that would not gain is
        copied as it is (``r = 0``)."""
        namespace(x)  # TypeError for device arrays without arithmetic (Numba's)
        rows, cols = _matrix_shape(x.shape)
        if not self.compresses(x.shape, x.dtype):
            buf, body = self._new_payload(x, out, {"rows": rows, "cols": cols, "rank": 0}, ops)
            ops.copy_into(body["raw"], x.reshape(-1))
            return buf
        m = self._matrix(x)  # once: compute_p and compute_q would each convert x again
        p_hat = self.orthogonalize(self._p_of(m, key))
        with quiet():
            q = m.T @ p_hat
        self._keep_q(key, q)  # the warm start needs Q only, not the full-size P_hat Q^T
        buf, body = self._new_payload(x, out, {"rows": rows, "cols": cols, "rank": p_hat.shape[1]}, ops)
        body["p"][:] = p_hat.reshape(-1)
        body["q"][:] = q.reshape(-1)
        return buf

    def _decode(self, hdr, body, ops):
        if hdr.params["rank"] == 0:  # sent uncompressed
            return ops.copy(body["raw"])
        namespace(body["p"])  # TypeError for device arrays without arithmetic (Numba's)
        rows, cols, r = hdr.params["rows"], hdr.params["cols"], hdr.params["rank"]
        with quiet():  # factors that overflow give inf/nan
            y = body["p"].reshape(rows, r) @ body["q"].reshape(cols, r).T
        return y.reshape(-1).astype(hdr.dtype, copy=False)

    # ------------------------------------------------------------------ helpers
    def _keep_q(self, key, q) -> None:
        """Keep ``q`` as the warm start of ``key`` (on the host: it is small, and state_dict() is
        then the same wherever the tensor lives), unless it is not finite: a step whose input
        overflowed leaves the warm start as it was (a loss scaler skips that step)."""
        if self.warm_start and bool(namespace(q).isfinite(q).all()):
            self._q[key] = host_copy(q)

    def _p_of(self, m, key):
        """``M Q`` with the current ``Q`` of ``key``, on the device of ``m``."""
        with quiet():
            return m @ namespace(m).asarray(self._current_q(key, m.shape, m.dtype))

    def _matrix(self, x):
        rows, cols = _matrix_shape(x.shape)
        return x.reshape(rows, cols).astype(_work_dtype(x.dtype), copy=False)

    def _current_q(self, key, matrix_shape, dtype):
        rows, cols = matrix_shape
        r = min(self.rank, rows, cols)
        q = self._q.get(key) if self.warm_start else None
        if q is None or q.shape != (cols, r):
            rng = np.random.default_rng(shared_stream(self.seed, key, 0))
            q = rng.standard_normal((cols, r))
        return q.astype(dtype, copy=False)
