"""Compressed gossip: CHOCO-GOSSIP, the averaging step of CHOCO-SGD (Koloskova, Stich & Jaggi
2019, "Decentralized Stochastic Optimization and Gossip Algorithms with Compressed
Communication", ICML, Algorithm 1).

Every rank ``i`` keeps *public copies* ``x_hat``: its own (``hat_self``) and one of each
in-neighbor ``j`` of the graph (``hat[k]``, ascending rank); all start at 0. What a rank knows of
``x_hat_j`` is exactly what ``j`` knows of itself, because both add the same decoded messages. A
round (:meth:`ChocoGossip.step`) on the model ``x``:

1. **compress the difference**: ``payload = Q(x - hat_self)`` with any codec of
   :mod:`compress` whose payload has a size fixed by the shape (top-k, random-k, QSGD, fp16, ...,
   ``"none"`` for the identity); the codec's step is the round's number;
2. **exchange**: one :func:`collectives.neighbor_allgather` of the payloads (each rank sends its
   payload to its out-neighbors, receives its in-neighbors');
3. **update the copies**: ``hat_self += decode(payload)``, ``hat[k] += decode(payload_k)``;
4. **move towards the copies**: ``x += gamma * sum_j W[i, j] (hat_j - hat_self)``.

Properties. With the identity codec and ``gamma = 1`` a round is plain neighbor averaging
(every ``hat_j`` becomes the ``x_j`` the round found, so
``x_i <- x_i + sum_j W[i, j] (x_j - x_i) = sum_j W[i, j] x_j``, to rounding). With a doubly stochastic ``W``
(columns summing to 1) the mean over ranks of ``x`` is invariant whatever the codec, since
``sum_i sum_j W[i, j] (hat_j - hat_i) = 0``; CHOCO converges to that mean for any contractive
compressor and a small enough ``gamma`` (the paper's rate depends on ``delta``, the spectral gap,
and ``omega``, the compressor's quality; top-k with ratio ``r`` has ``omega = r``). The
difference ``x - hat_self`` is what has not been communicated yet, so CHOCO needs no separate
error feedback.

Cost of a round with ``d`` in- and out-neighbors: one neighbor round of the *compressed* payload
(``d`` messages of ``payload_nbytes`` each way, e.g. about ``8 r n`` bytes for top-k instead of
``4 n``), ``d + 1`` decodes and one encode, and ``(d + 1) n`` elements of memory for the copies.

Checks (before any message, every rank raising the same error): ``x`` is a contiguous 1-D
float32 or float64 array of the same size and dtype everywhere; the topology is a static
:class:`~collectives.topology.Topology` for the communicator's size (the copies follow fixed
neighbors); the codec is a :class:`compress.Codec` (or a spec string) with a fixed payload size;
``0 < gamma <= 1``.
"""

from __future__ import annotations

import re
from typing import Any

import compress
import numpy as np
from mpi4py import MPI

from .._runtime.blocking import construct
from ..options import Options
from .neighbor import neighbor_allgather
from .topology import Topology

__all__ = ["ChocoGossip"]

_ADDRESS = re.compile(r" at 0x[0-9A-Fa-f]+")  # a private generator's: differs between ranks
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class ChocoGossip:
    """CHOCO-GOSSIP state of one rank: the public copies of itself and its in-neighbors.

    Parameters
    ----------
    x
        A model like the ones :meth:`step` will mix (its size and dtype; its values are not
        used: the copies start at 0). Contiguous 1-D float32 or float64. Collective.
    topology
        Static :class:`collectives.topology.Topology` over ``comm``'s ranks; doubly stochastic
        for the mean to be kept.
    codec
        A :class:`compress.Codec` or a spec such as ``"topk:ratio=0.01"``; ``"none"`` sends the
        difference uncompressed.
    gamma
        The consensus step size, ``0 < gamma <= 1``.
    comm
        Intracommunicator (default ``MPI.COMM_WORLD``).
    options
        As for :func:`collectives.allreduce` (default: from the environment); every round's
        neighbor exchange runs under them.
    """

    def __init__(self, x: np.ndarray, topology: Topology, codec: Any = "none",
                 gamma: float = 1.0, *, comm: MPI.Comm | None = None,
                 options: Options | None = None) -> None:
        size = (MPI.COMM_WORLD if comm is None else comm).size
        made: list[compress.Codec] = []

        def check() -> tuple[None, dict[str, Any]]:
            if not isinstance(x, np.ndarray) or x.ndim != 1 or not x.flags.c_contiguous \
                    or x.dtype not in _DTYPES:
                raise TypeError("ChocoGossip: x must be a contiguous 1-D float32 or float64 "
                                f"NumPy array, got {getattr(x, 'dtype', type(x).__name__)}"
                                f"{'' if not isinstance(x, np.ndarray) else f' {x.shape}'}")
            if not isinstance(topology, Topology):
                raise TypeError("ChocoGossip: topology must be a collectives.topology.Topology, "
                                f"got {type(topology).__name__}")
            topology.check_size(size, "ChocoGossip")
            if topology.dynamic:
                raise ValueError(f"ChocoGossip: {topology.name} changes every step; the public "
                                 "copies follow the in-neighbors of a static graph")
            c = compress.from_spec(codec) if isinstance(codec, str) else codec
            if not isinstance(c, compress.Codec):
                raise TypeError(f"ChocoGossip: codec must be a compress.Codec or a spec string, "
                                f"got {type(codec).__name__}")
            try:
                c.payload_nbytes((x.size,), x.dtype)
            except TypeError:
                raise ValueError(f"ChocoGossip: the payload size of codec {c.name!r} depends on "
                                 "the data; use one whose size the shape fixes (topk, randomk, "
                                 "qsgd, fp16, ...)") from None
            if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) \
                    or not 0 < gamma <= 1:
                raise ValueError(f"ChocoGossip: gamma must be in (0, 1], got {gamma!r}")
            made.append(c)
            return None, {"size": x.size, "dtype": str(x.dtype), "codec": _ADDRESS.sub("", repr(c)),
                          "gamma": float(gamma), "topology": topology.fingerprint}

        ctx, self.options = construct("ChocoGossip", comm, options, check)  # same error, together
        self.comm = ctx.comm
        self.topology, self.codec, self.gamma = topology, made[0], float(gamma)
        me = self.comm.rank
        self.sources = topology.in_neighbors(me)
        _, row = topology.recv_weights(me)
        self.weights = np.array([row[j] for j in self.sources], dtype=np.float64)
        self.dtype, self.size = x.dtype, x.size
        #: the public copies: row 0 this rank's, row 1 + k in-neighbor ``sources[k]``'s
        self.hats = np.zeros((1 + len(self.sources), x.size), x.dtype)
        self._payload = np.empty(self.codec.payload_nbytes((x.size,), x.dtype), np.uint8)

    def step(self, x: np.ndarray, step: int = 0) -> np.ndarray:
        """One CHOCO-GOSSIP round on this rank's model ``x``, in place (collective); returns
        ``x``. ``step`` (the same on every rank) is the codec's step (fresh random indices or
        rounding per round)."""
        if not isinstance(x, np.ndarray) or x.shape != (self.size,) or x.dtype != self.dtype:
            raise ValueError(f"ChocoGossip.step: x must be a {self.dtype} array of shape "
                             f"({self.size},), got {getattr(x, 'dtype', type(x).__name__)} "
                             f"{getattr(x, 'shape', '')}")
        hats, codec = self.hats, self.codec
        # 1. compress what the neighbors do not know yet
        payload = codec.encode(x - hats[0], key="choco", step=step, out=self._payload)
        # 2. one neighbor round of the payloads
        got = neighbor_allgather(payload, self.topology, comm=self.comm, step=step,
                                 options=self.options)
        # 3. every copy moves by the decoded message its owner sent
        hats[0] += codec.decode(payload)
        for k in range(len(self.sources)):
            hats[1 + k] += codec.decode(got[k])
        # 4. x += gamma * sum_j W[i, j] (hat_j - hat_i)
        if self.sources:
            pull = self.weights.astype(self.dtype) @ (hats[1:] - hats[0])
            x += self.dtype.type(self.gamma) * pull
        return x

    def state_dict(self) -> dict[str, np.ndarray]:
        """The public copies (``"hats"``) and the codec's own state (``"codec.<name>"``: the
        private generator of QSGD, TernGrad, ...), for a checkpoint."""
        return {"hats": self.hats.copy(),
                **{f"codec.{k}": v for k, v in self.codec.state_dict().items()}}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` returned (ValueError if the copies' shape differs)."""
        hats = np.asarray(state["hats"])
        if hats.shape != self.hats.shape:
            raise ValueError(f"ChocoGossip: saved copies have shape {hats.shape}, this rank "
                             f"keeps {self.hats.shape}")
        self.hats[...] = hats
        self.codec.load_state_dict({k[len("codec."):]: v for k, v in state.items()
                                    if k.startswith("codec.")})
