"""``--sync gossip:GRAPH[:WEIGHTS]`` and ``gossip:nodes[:INTER]``: decentralized SGD.

D-PSGD (Lian et al. 2017) skips the gradient exchange; after every step's local update each rank
mixes its parameters with its neighbors' in the graph (``collectives.neighbor_allreduce`` over a
doubly stochastic :mod:`collectives.topology`, with the step for the time-varying ones). The
replicas then differ; momentum stays local.

- With ``--codec`` it is CHOCO-SGD (Koloskova et al. 2019): the mixing is a
  :class:`collectives.ChocoGossip` round with that codec and ``--gamma``.
- With ``--overlap`` it is D-PSGD as Lian et al. 2017 state it: the round mixes the parameters
  ``x_t`` the gradient is computed at, started before forward and waited for after backward
  (``ineighbor_allreduce``, through the progress engine), and the update is applied to the mixed
  parameters: ``x_{t+1} = W x_t - lr m_t``, so the message travels during the compute.
- ``--gossip-dtype float16`` sends the parameters in half precision (half the bytes): each rank
  keeps its own in float32, sends them through the fp16 codec (``ineighbor_allgather`` of the
  payloads), and mixes in float32: its self weight times its own parameters plus each neighbor's
  weight times the neighbor's decoded ones (the float32 round's terms, the neighbors' values
  rounded to float16).
- ``gossip:nodes[:INTER]`` gossips between nodes instead of ranks: the ranks of a node (the
  shared-memory nodes, or emulated ones of ``COLLECTIVES_NODE_SIZE``) are one vertex, the nodes
  joined by ``INTER`` (ring, torus or full; :func:`collectives.topology.hierarchical_for`), and
  each round is the hierarchical one (``neighbor_allreduce(..., hierarchical=True)``: the node's
  mean through shared memory, one message per neighbor node and position); every rank of a node
  keeps the same parameters.

Bytes sent are those ``collectives.TRAFFIC`` counts.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import collectives
import compress

from ..._runtime.cli import UsageError
from ...compressed.state import seeded_codec
from ...options import Options
from ...decentralized.topology import GRAPHS, WEIGHTS, Topology, hierarchical, hierarchical_for
from ...decentralized.topology import parse as parse_topology
from ..checkpoint_check import Member
from ..fusion import FusionBuffer
from ..timing import Clock
from .base import GOSSIP_DTYPE, BadSyntax, SyncMode, Refusal, ring_bytes

__all__ = ["Gossip", "NODES"]

#: ``--sync gossip:nodes[:INTER]``: gossip between nodes (the module docstring)
NODES = "nodes"
#: the prefix of the topologies ``gossip:nodes`` builds
_HIERARCHICAL = "hierarchical("


class Gossip(SyncMode):
    """D-PSGD, CHOCO-SGD and their variants (the module docstring).

    Parameters
    ----------
    topology
        The doubly stochastic graph (:meth:`parse`).
    choco
        ``(codec spec, gamma)`` of ``--codec SPEC``: the parameters are mixed by CHOCO-GOSSIP
        rounds; else None.
    seed
        Seed of CHOCO-SGD's codec.
    mix_ahead
        ``--overlap``: the round of ``x_t`` travels during forward and backward.
    wire
        ``--gossip-dtype``: the dtype the parameters travel in.
    """

    name = "gossip"
    forms = "'gossip:GRAPH'"
    label = "gossip:GRAPH"
    help = ("'gossip:GRAPH[:WEIGHTS]' (D-PSGD: parameters mixed with the neighbors' every "
            "step; graphs: " + ", ".join(GRAPHS) + "; weights: " + ", ".join(WEIGHTS) + "), "
            "'gossip:nodes[:INTER]' (gossip between nodes, joined by ring, torus or full: a "
            "node's mean through shared memory, one message per neighbor node; "
            "COLLECTIVES_NODE_SIZE emulates nodes)")
    own_params = own_momentum = True

    def __init__(self, grads: FusionBuffer, params: FusionBuffer, comm: MPI.Comm,
                 clock: Clock | None = None, *, topology: Topology,
                 choco: tuple[str, float] | None = None, seed: int = 0, mix_ahead: bool = False,
                 wire: str = "float32") -> None:
        super().__init__(grads, params, comm, clock)
        self.topology = topology
        #: gossip:nodes: each round is the hierarchical one (neighbor_hierarchical.py)
        self.by_nodes = topology.name.startswith(_HIERARCHICAL)
        #: --codec SPEC: CHOCO-SGD's public copies
        self.choco = None if choco is None else collectives.ChocoGossip(
            params.flat, topology, seeded_codec(choco[0], seed=seed, rank=comm.rank), choco[1],
            comm=comm)
        #: --overlap: the round of x_t under way, and where it lands
        self.mix_ahead = mix_ahead
        self._mixing = None
        self._mixed = np.empty_like(params.flat) if mix_ahead else None
        #: --gossip-dtype: float16 through the fp16 codec: this rank's payload, and the
        #: neighbors' payloads by their number (ascending source rank)
        self.wire = None if np.dtype(wire) == params.flat.dtype else np.dtype(wire)
        self._half = None if self.wire is None else compress.from_spec("fp16")
        self._payload = None if self.wire is None else self._half.encode(params.flat)
        self._received: dict[int, np.ndarray] = {}
        self._got: np.ndarray | None = None  # where the round under way lands
        self._sent0 = 0

    @classmethod
    def from_config(cls, cfg, value, grads, params, state, comm, clock) -> "Gossip":
        a = cfg.args
        return cls(grads, params, comm, clock, topology=value, seed=a.seed, mix_ahead=a.overlap,
                   choco=None if cfg.choco is None else (cfg.choco, a.gamma),
                   wire=a.gossip_dtype)

    # ------------------------------------------------------------------ the command line
    @classmethod
    def parse(cls, arg: str | None, world: int, comm: MPI.Comm | None = None) -> Topology:
        """``"GRAPH[:WEIGHTS]"`` -> the doubly stochastic topology over ``world`` ranks (D-PSGD
        needs one); ``"nodes[:INTER]"`` -> the nodes of ``comm`` joined by ``INTER`` (ring by
        default; collective), or, without ``comm``, every rank a node (to check the spec).
        Raises ValueError naming the valid graphs and weights."""
        if arg is None:
            raise BadSyntax(arg)
        name, _, inter = arg.partition(":")
        if name == NODES:
            topology = hierarchical(range(world), inter or "ring") if comm is None else \
                hierarchical_for(comm, inter or "ring", Options.from_env().node_size)
        else:
            topology = parse_topology(arg, world)
        topology.check("doubly", f"--sync gossip:{arg} (D-PSGD)")
        return topology

    @classmethod
    def mixing_codec(cls, a: argparse.Namespace, value: Topology, inner: str | None) -> str | None:
        """``--codec`` (given) compresses the gossip (CHOCO-SGD): a codec whose payload size the
        shape fixes, without the gradient codec's options."""
        if inner is not None or a.error_feedback or a.strategy != "auto" \
                or a.momentum_correction or a.dense_steps:
            raise UsageError("--sync gossip with --codec is CHOCO-SGD (compressed gossip of the "
                             "parameters): auto:, --error-feedback, --strategy, "
                             "--momentum-correction and --dense-steps do not apply")
        if not 0 < a.gamma <= 1:
            raise UsageError(f"--gamma must be in (0, 1], got {a.gamma}")
        try:
            compress.from_spec(a.codec).payload_nbytes((8,))
        except TypeError:
            raise UsageError(f"--codec {a.codec}: CHOCO-SGD needs a codec whose payload size "
                             "the shape fixes (topk, randomk, qsgd, fp16, ...)") from None
        return a.codec

    @classmethod
    def refusals(cls, value: Topology, mixing_codec: str | None) -> tuple[Refusal, ...]:
        """Every variant: no ``--check-replicas``; CHOCO-SGD and ``gossip:nodes``: no
        ``--overlap`` and no ``--gossip-dtype`` (their rounds are not the plain one)."""
        refusals = (Refusal(("--check-replicas",), "--sync gossip exchanges parameters, not "
                            "gradients, and its replicas differ: --check-replicas does not "
                            "apply"),)
        if mixing_codec is None and not value.name.startswith(_HIERARCHICAL):
            return refusals
        return refusals + (
            Refusal(("--overlap",), "--sync gossip:GRAPH --overlap mixes the parameters during "
                    "forward and backward with a plain gossip round: not with --codec "
                    "(CHOCO-SGD) or gossip:nodes"),
            GOSSIP_DTYPE)

    # ------------------------------------------------------------------ each step
    def start_mix(self, step: int) -> None:
        """--overlap: start the gossip round of the parameters of ``step`` (before forward;
        they are not written until :meth:`finish_mix`)."""
        if self.mix_ahead:
            self._sent0 = collectives.TRAFFIC.bytes_sent
            if self.wire is not None:
                self._mixing = self._start_low(step)
                return
            self._mixing = collectives.ineighbor_allreduce(
                self.params.flat, self.topology, out=self._mixed, step=step, comm=self.comm,
                name="gossip")

    def finish_mix(self, step: int) -> None:
        """... wait for it (after backward): the parameters become the mixed ones, which the
        update of ``step`` then moves. Counts the wait as communication, and the round's bytes."""
        if self._mixing is None:
            return
        t0 = time.perf_counter()
        self._mixing.wait()
        self._mixing = None
        if self.wire is not None:
            self._finish_low(self.params.flat, step)
        else:
            self.params.flat[...] = self._mixed
        st = self.stats
        st.seconds += time.perf_counter() - t0
        st.calls += 1
        st.dense_bytes += ring_bytes(self.params.flat.nbytes, self.comm.size)
        st.bytes_sent += collectives.TRAFFIC.bytes_sent - self._sent0

    def average_params(self, step: int) -> None:
        """Mix the parameters with the neighbors' after every update (with ``mix_ahead``,
        before it: :meth:`finish_mix`)."""
        if not self.mix_ahead:
            self._timed(self.params, step, self._mix)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, np.ndarray]:
        """CHOCO-SGD: the public copies and the codec's state (``ChocoGossip.state_dict()``)."""
        return {} if self.choco is None else self.choco.state_dict()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        if self.choco is not None:
            self.choco.load_state_dict(state)

    def state_layout(self, rank: int) -> dict[str, Member]:
        """CHOCO-SGD: one public copy per in-neighbor of ``rank`` and its own, and the codec's
        state (the same names on every rank)."""
        choco = self.choco
        if choco is None:
            return {}
        hats = (1 + len(choco.topology.in_neighbors(rank)), choco.size)
        return {"hats": Member(choco.hats.dtype.str, hats),
                **{f"codec.{k}": Member.like(v) for k, v in choco.codec.state_dict().items()}}

    # ------------------------------------------------------------------ internals
    def _mix(self, buf: FusionBuffer, step: int) -> None:
        if self.choco is not None:  # CHOCO-SGD: a compressed gossip round
            self.choco.step(buf.flat, step)
            return
        if self.wire is not None:
            self._start_low(step).wait()
            self._finish_low(buf.flat, step)
            return
        collectives.neighbor_allreduce(buf.flat, self.topology, out=buf.flat, step=step,
                                       comm=self.comm, hierarchical=self.by_nodes)

    def _start_low(self, step: int):
        """--gossip-dtype: start the round of step ``step`` on this rank's parameters in the wire
        dtype (the fp16 codec's payload): each neighbor's payload arrives whole
        (``ineighbor_allgather``)."""
        self._half.encode(self.params.flat, out=self._payload)
        d = len(self.topology.in_neighbors(self.comm.rank, step))
        got = self._received.get(d)
        if got is None:
            got = self._received[d] = np.empty((d, self._payload.size), np.uint8)
        self._got = got
        return collectives.ineighbor_allgather(self._payload, self.topology, out=got, step=step,
                                               comm=self.comm, name="gossip")

    def _finish_low(self, x: np.ndarray, step: int) -> None:
        """``x`` (this rank's own parameters, in full precision) becomes its self weight times
        itself plus each neighbor's weight times its decoded parameters (in float32; the codec
        checks each payload before reading it)."""
        mine, weights = self.topology.recv_weights(self.comm.rank, step)
        if not weights:
            return
        np.multiply(x, mine, out=x)
        for q, row in zip(sorted(weights), self._got):  # the rows come in ascending source rank
            theirs = self._half.decode(row, max_elements=x.size)
            if theirs.shape != x.shape:
                raise ValueError(f"gossip: rank {q} sent {theirs.size} parameters, this rank has "
                                 f"{x.size}")
            theirs *= weights[q]
            x += theirs
