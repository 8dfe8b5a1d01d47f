"""Gradient and parameter exchange: what crosses the network each step.

Synchronous mode (``--sync sync``, the default) averages the fused gradient every step:

- without a codec, one ``collectives.allreduce(grads, out=grads, op="avg", algorithm=...)``;
- with a codec, ``collectives.compressed_allreduce(grads, state, op="avg", key="grads",
  strategy=..., algorithm=...)`` on the whole fusion buffer, with the step in ``state.step``
  (``state`` is the run's :class:`collectives.CompressionState`). Codecs in
  :data:`LAYERWISE` compress matrices (PowerSGD factors ``M = P Q^T``), which a flat buffer is not,
  so for them every layer's gradient is reduced alone, as a view of the buffer, with key
  ``"grads.<i>"``.

With ``--overlap`` the gradient is averaged in buckets started *during* backward, through the
progress engine (``collectives.iallreduce``, or ``collectives.icompressed_allreduce`` with a
codec, key ``"grads.<layer>.<block>"``): each layer's gradient, its weight cut into blocks of rows
of at most ``--bucket-mb`` (PyTorch DDP's ``bucket_cap_mb``, 25 by default), is started as soon
as backward has written it, and the step waits for all of them before the update. A bucket's
encode and decode then run on the engine thread, not on the critical path of backward. For the
codecs of :data:`LAYERWISE` a bucket is its block of weight rows as a matrix, and the last block's
bias travels as a bucket of its own (key ``"... .bias"``). The report then says how much of the
communication was hidden behind backward: for each bucket, the part of its time on the engine
that passed before the step began to wait.

Local SGD (``--sync local:H``; Lin et al. 2020, *Don't Use Large Mini-Batches, Use Local SGD*)
skips the gradient exchange; every ``H`` steps the parameters are averaged with
``collectives.allreduce``. Momentum buffers stay local.

Gossip (``--sync gossip:GRAPH``; D-PSGD, Lian et al. 2017) skips the gradient exchange too; after
every step's local update each rank mixes its parameters with its neighbors' in the graph
(``collectives.neighbor_allreduce`` over a doubly stochastic :mod:`collectives.topology`, with
the step for the time-varying ones). The replicas then differ; momentum stays local. With
``--codec`` it is CHOCO-SGD (Koloskova et al. 2019): the mixing is a
:class:`collectives.ChocoGossip` round with that codec and ``--gamma``. ``--sync
gossip:GRAPH --overlap`` is D-PSGD as Lian et al. 2017 state it: the round mixes the
parameters ``x_t`` the gradient is computed at, started before forward and waited for after
backward (``ineighbor_allreduce``, through the progress engine), and the update is applied to the
mixed parameters: ``x_{t+1} = W x_t - lr m_t``, so the message travels during the compute.
``--gossip-dtype float16`` sends the parameters in half precision (half the bytes): each rank
keeps its own in float32, sends them through the fp16 codec (``ineighbor_allgather`` of the
payloads), and mixes in float32: its self weight times its own parameters plus each neighbor's
weight times the neighbor's decoded ones (the float32 round's terms, the neighbors' values
rounded to float16). ``--sync
gossip:nodes[:INTER]`` gossips between nodes instead of ranks: the ranks of a node (the
shared-memory nodes, or emulated ones of ``COLLECTIVES_NODE_SIZE``) are one vertex, the nodes
joined by ``INTER`` (ring, torus or full; :func:`collectives.topology.hierarchical_for`), and
each round is the hierarchical one (``neighbor_allreduce(..., hierarchical=True)``: the node's
mean through shared memory, one message per neighbor node and position); every rank of a node
keeps the same parameters.

AD-PSGD (``--sync adpsgd[:GRAPH]``, ring by default; Lian et al. 2018) has no global step
either: every rank's parameters live in a :class:`collectives.PairwiseAveraging` window; each
step reads them (``pull``), computes the gradient and the momentum update on that copy, then
atomically replaces its own and one random neighbor's parameters by their mean and adds its
update to its own (``average_params``). Peers change a rank's parameters between its steps.

:class:`Exchange` also keeps the statistics of the report: seconds spent in the exchange, of which
encode/decode, and the bytes this rank sent, counted by ``collectives.TRAFFIC`` (the library's own
messages) or, for ``algorithm="native"`` without a codec, computed as ``2 n (p-1)/p`` bytes per
call (what ring and Rabenseifner allreduce send, the bandwidth lower bound).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

import collectives
import compress

from ..compressed import CompressionState
from ..compressed.state import seeded_codec
from ..options import Options
from ..topology import Topology, hierarchical, hierarchical_for, one_peer_exponential
from ..topology import parse as parse_topology
from .fusion import FusionBuffer
from .timing import Clock, time_methods

__all__ = ["LAYERWISE", "Exchange", "Buckets", "parse_sync", "parse_gossip", "parse_server",
           "parse_sgp", "parse_adpsgd", "ring_bytes"]

#: codecs reduced layer by layer (they need each layer's matrix shape)
LAYERWISE = frozenset({"powersgd", "efsignsgd"})


def parse_sync(text: str) -> int:
    """``"sync"``, ``"gossip:..."``, ``"ssp:S"`` and ``"async"`` -> 0 (every step);
    ``"local:H"`` -> H >= 1 (parameters every H steps)."""
    if text == "sync" or text.startswith("gossip:") or parse_server(text) is not None \
            or parse_sgp(text) is not None or text == "adpsgd" or text.startswith("adpsgd:"):
        return 0
    kind, _, h = text.partition(":")
    if kind != "local" or not h.isdigit() or int(h) < 1:
        raise ValueError(f"--sync must be 'sync', 'local:H' with an integer H >= 1, "
                         f"'gossip:GRAPH', 'sgp', 'sgp:overlap', 'adpsgd[:GRAPH]', "
                         f"'ssp:S' with an integer S >= 0 or 'async', "
                         f"got {text!r}")
    return int(h)


def parse_sgp(text: str) -> bool | None:
    """``"sgp"`` -> False, ``"sgp:overlap"`` -> True (push-sum rounds that do not wait for the
    round's messages); anything else -> None."""
    return {"sgp": False, "sgp:overlap": True}.get(text)


def parse_server(text: str) -> tuple[int | None] | None:
    """``"ssp:S"`` -> ``(S,)``, ``"async"`` -> ``(None,)`` (a parameter server's staleness
    bound, :class:`collectives.ParameterServer`); anything else -> None."""
    if text == "async":
        return (None,)
    kind, _, s = text.partition(":")
    if kind == "ssp" and s.isdigit():
        return (int(s),)
    return None


#: ``--sync gossip:nodes[:INTER]``: gossip between nodes (the module docstring)
NODES = "nodes"


def parse_gossip(text: str, world: int, comm: MPI.Comm | None = None) -> Topology | None:
    """``"gossip:GRAPH[:WEIGHTS]"`` -> the doubly stochastic topology over ``world`` ranks (D-PSGD
    needs one); ``"gossip:nodes[:INTER]"`` -> the nodes of ``comm`` joined by ``INTER`` (ring by
    default; collective), or, without ``comm``, every rank a node (to check the spec); anything
    else -> None. Raises ValueError naming the valid graphs and weights."""
    if not text.startswith("gossip:"):
        return None
    spec = text[len("gossip:"):]
    name, _, inter = spec.partition(":")
    if name == NODES:
        topology = hierarchical(range(world), inter or "ring") if comm is None else \
            hierarchical_for(comm, inter or "ring", Options.from_env().node_size)
    else:
        topology = parse_topology(spec, world)
    topology.check("doubly", f"--sync gossip:{spec} (D-PSGD)")
    return topology


def parse_adpsgd(text: str, world: int) -> Topology | None:
    """``"adpsgd"`` -> the ring over ``world`` ranks, ``"adpsgd:GRAPH[:WEIGHTS]"`` -> that static
    graph (its edges are the pairs that may average; the weights play no part); anything else ->
    None. Raises ValueError naming the valid graphs, or for a graph that changes every step."""
    if text == "adpsgd":
        return parse_topology("ring", world)
    if not text.startswith("adpsgd:"):
        return None
    topology = parse_topology(text[len("adpsgd:"):], world)
    if topology.dynamic:
        raise ValueError(f"{topology.name} changes every step; AD-PSGD averages over the edges "
                         f"of a static graph (ring, torus, exponential, full)")
    return topology


def ring_bytes(n_bytes: int, world: int) -> int:
    """Bytes one rank sends in a ring allreduce of ``n_bytes``: 2 n (p-1)/p (0 for one rank)."""
    return 2 * n_bytes * (world - 1) // world if world > 1 else 0


@dataclass
class Stats:
    """What the exchanges of this rank cost so far."""

    calls: int = 0
    seconds: float = 0.0
    bytes_sent: int = 0
    dense_bytes: int = 0      # what dense fp32 ring allreduce would have sent
    busy: float = 0.0         # --overlap: seconds the buckets spent on the engine
    hidden: float = 0.0       # ... of which before the step started waiting

    def as_array(self) -> np.ndarray:
        """The statistics as one float64 array (checkpoints)."""
        return np.array([self.calls, self.seconds, self.bytes_sent, self.dense_bytes,
                         self.busy, self.hidden])

    def load(self, values: np.ndarray) -> None:
        """Restore from :meth:`as_array`; a 4-value array, without the ``--overlap`` statistics,
        leaves ``busy`` and ``hidden`` at 0."""
        v = [float(a) for a in values] + [0.0] * (6 - len(values))
        self.calls, self.bytes_sent, self.dense_bytes = int(v[0]), int(v[2]), int(v[3])
        self.seconds, self.busy, self.hidden = v[1], v[4], v[5]


class Buckets:
    """The gradient's overlap buckets: for each layer, blocks of weight rows (the last one
    followed by the bias), each a contiguous view of the fusion buffer, in backward order.
    ``parts[i][k]``: the (key, array) pairs block ``k`` of layer ``i`` is reduced as: the view
    itself, or (``matrices``) its weight rows as a matrix and, for the last block, the bias."""

    def __init__(self, grads: FusionBuffer, bucket_bytes: int, matrices: bool = False) -> None:
        self.rows: list[list[slice]] = []
        self.views: list[list[np.ndarray]] = []
        self.parts: list[list[list[tuple[str, np.ndarray]]]] = []
        offsets = grads.offsets
        for i in range(len(grads.shapes) // 2):
            fan_in, fan_out = grads.shapes[2 * i]
            per = max(1, bucket_bytes // (fan_out * grads.flat.itemsize))
            rows = [slice(a, min(a + per, fan_in)) for a in range(0, fan_in, per)]
            base = offsets[2 * i]
            views = [grads.flat[base + r.start * fan_out:base + r.stop * fan_out] for r in rows]
            weights = views[-1]
            views[-1] = grads.flat[base + rows[-1].start * fan_out:offsets[2 * i + 2]]  # + bias
            keys = [f"grads.{i}.{k}" for k in range(len(rows))]
            if matrices:
                parts = [[(key, v.reshape(-1, fan_out))] for key, v in zip(keys, views)]
                parts[-1] = [(keys[-1], weights.reshape(-1, fan_out)),
                             (keys[-1] + ".bias", grads.flat[offsets[2 * i + 1]:offsets[2 * i + 2]])]
            else:
                parts = [[(key, v)] for key, v in zip(keys, views)]
            self.rows.append(rows)
            self.views.append(views)
            self.parts.append(parts)

    def row_blocks(self, layer: int) -> list[slice]:
        return self.rows[layer]


class Exchange:
    """Averages gradients (or parameters) across ``comm`` as configured.

    Parameters
    ----------
    grads, params
        The model's fusion buffers.
    state
        The compression state for this rank (codec, memories), or None for dense allreduce.
    algorithm, strategy
        Dense allreduce algorithm; compressed strategy ("auto" or a name in
        ``collectives.STRATEGIES``).
    local_every
        0 for synchronous SGD, else H of local SGD.
    gossip
        The graph of ``--sync gossip:GRAPH`` (parameters mixed every step), else None.
    server
        ``(S,)`` of ``--sync ssp:S`` or ``(None,)`` of ``--sync async``: the parameters live in a
        :class:`collectives.ParameterServer` with that staleness bound; else None.
    sgp
        ``--sync sgp`` (False) or ``sgp:overlap`` (True): push-sum over the one-peer exponential
        graph through a :class:`collectives.Window`; else None.
    adpsgd
        The graph of ``--sync adpsgd[:GRAPH]``: parameters in a
        :class:`collectives.PairwiseAveraging`, averaged with a random neighbor every step.
    seed
        Seed of AD-PSGD's choice of neighbors.
    choco
        ``(codec spec, gamma)`` of ``--sync gossip:GRAPH --codec SPEC``: the parameters are mixed
        by CHOCO-GOSSIP rounds; else None.
    """

    def __init__(self, grads: FusionBuffer, params: FusionBuffer, state: CompressionState | None,
                 algorithm: str, strategy: str, local_every: int, comm: MPI.Comm,
                 clock: Clock, bucket_bytes: int | None = None,
                 gossip: Topology | None = None, server: tuple | None = None,
                 sgp: bool | None = None, adpsgd: Topology | None = None,
                 seed: int = 0, choco: tuple[str, float] | None = None,
                 mix_ahead: bool = False, wire: str = "float32") -> None:
        self.grads, self.params, self.state = grads, params, state
        self.algorithm, self.strategy, self.local_every = algorithm, strategy, local_every
        self.gossip = gossip
        #: --sync gossip:nodes: each round is the hierarchical one (neighbor_hierarchical.py)
        self.by_nodes = gossip is not None and gossip.name.startswith("hierarchical(")
        self.comm, self.clock = comm, clock
        self.stats = Stats()
        self.analytic = (algorithm == "native" and state is None and gossip is None) or \
            server is not None or sgp is not None or adpsgd is not None  # one-sided: not in TRAFFIC
        #: --sync sgp[:overlap]: the push-sum window (value z, weight w; parameters z / w)
        self.sgp = sgp
        self.window = None if sgp is None else collectives.Window(params.flat, comm=comm)
        self.graph = None if sgp is None else one_peer_exponential(comm.size)
        #: --sync ssp:S / async: the parameter server, and the parameters this step pulled
        self.server = None if server is None else collectives.ParameterServer(
            params.flat, staleness=server[0], lr=1.0, comm=comm)
        self._pulled = None
        #: --sync gossip:GRAPH --codec SPEC: CHOCO-SGD's public copies
        self.choco = None if choco is None else collectives.ChocoGossip(
            params.flat, gossip, seeded_codec(choco[0], seed=seed, rank=comm.rank), choco[1],
            comm=comm)
        #: --sync adpsgd: every rank's parameters, in a window
        self.pairwise = None if adpsgd is None else collectives.PairwiseAveraging(
            params.flat, adpsgd, comm=comm, seed=seed)
        if state is not None:
            for part in (state.codec, state.memory, state.server):
                if part is not None:
                    time_methods(part, clock, "codec")
        self.layerwise = state is not None and state.codec.name in LAYERWISE
        self.bucket_bytes = bucket_bytes
        self.buckets = None if bucket_bytes is None else \
            Buckets(grads, bucket_bytes, matrices=self.layerwise)
        self._requests: list = []
        self._sent0 = 0
        self._step = 0
        #: --sync gossip:GRAPH --overlap: the round of x_t under way, and where it lands
        self.mix_ahead = mix_ahead
        self._mixing = None
        self._mixed = np.empty_like(params.flat) if mix_ahead else None
        #: --gossip-dtype: the dtype the parameters travel in during a gossip round (None: the
        #: parameters' own); float16 through the fp16 codec: this rank's payload, and the
        #: neighbors' payloads by their number (ascending source rank)
        self.wire = None if gossip is None or np.dtype(wire) == params.flat.dtype else \
            np.dtype(wire)
        self._half = None if self.wire is None else compress.from_spec("fp16")
        self._payload = None if self.wire is None else self._half.encode(params.flat)
        self._received: dict[int, np.ndarray] = {}
        self._got: np.ndarray | None = None  # where the round under way lands

    def exchanges_at(self, step: int) -> bool:
        """Whether step ``step`` (0-based) ends with an exchange."""
        return not self.local_every or (step + 1) % self.local_every == 0

    def backward_hooks(self, step: int) -> dict:
        """Keyword arguments for ``MLP.loss_and_grad`` of ``step``: with ``--overlap``, the hooks
        that start each bucket's allreduce as backward finishes it; otherwise none."""
        if self.buckets is None:
            return {}
        self._sent0 = collectives.TRAFFIC.bytes_sent
        self._step = step
        return {"on_ready": self._start_bucket, "row_blocks": self.buckets.row_blocks}

    def _start_bucket(self, layer: int, block: int) -> None:
        if self.state is None:
            view = self.buckets.views[layer][block]
            self._requests.append(collectives.iallreduce(view, out=view, op="avg",
                                                         algorithm=self.algorithm, comm=self.comm))
            return
        for key, x in self.buckets.parts[layer][block]:
            self._requests.append(collectives.icompressed_allreduce(
                x, self.state, out=x, op="avg", strategy=self.strategy, comm=self.comm, key=key,
                step=self._step, algorithm=self.algorithm))

    def close(self) -> None:
        """Collective: release the parameter server's windows, if any."""
        if self.server is not None:
            self.server.free()
        if self.window is not None:
            self.window.free()
        if self.pairwise is not None:
            self.pairwise.free()

    def pull(self, step: int) -> None:
        """--sync ssp:S / async: before the gradient of ``step``, read the parameters from the
        server (waiting for the staleness bound) into ``params``; --sync sgp: keep what they are
        before the update (the update is added to the push-sum numerator); --sync adpsgd: read
        this rank's parameters from its window (peers' averages since the last step included)."""
        if self.pairwise is not None:
            t0 = time.perf_counter()
            self._pulled = self.pairwise.value
            self.params.flat[...] = self._pulled
            self.stats.seconds += time.perf_counter() - t0
            return
        if self.window is not None:
            self._pulled = self.params.flat.copy()
            return
        if self.server is None:
            return
        t0 = time.perf_counter()
        self._pulled = self.server.pull()
        self.params.flat[...] = self._pulled
        self.stats.seconds += time.perf_counter() - t0

    def __call__(self, step: int) -> None:
        """Exchange after the local gradient of ``step`` is in ``grads`` (before the update)."""
        if self.local_every or self.gossip is not None or self.server is not None \
                or self.window is not None or self.pairwise is not None:
            return
        if self.buckets is not None:
            self._wait_buckets()
            return
        self._timed(self.grads, step, self._reduce_grads)

    def _wait_buckets(self) -> None:
        """--overlap: wait for this step's buckets; count what was hidden behind backward."""
        requests, self._requests = self._requests, []
        t0 = time.perf_counter()
        collectives.waitall(requests)
        st = self.stats
        st.seconds += time.perf_counter() - t0
        st.busy += sum(r.finished - r.started for r in requests)
        st.hidden += sum(max(0.0, min(r.finished, t0) - r.started) for r in requests)
        dense = ring_bytes(self.grads.flat.nbytes, self.comm.size)
        st.calls += 1
        st.dense_bytes += dense
        st.bytes_sent += dense if self.analytic else collectives.TRAFFIC.bytes_sent - self._sent0

    def start_mix(self, step: int) -> None:
        """--sync gossip:GRAPH --overlap: start the gossip round of the parameters of ``step``
        (before forward; they are not written until :meth:`finish_mix`)."""
        if self.mix_ahead:
            self._sent0 = collectives.TRAFFIC.bytes_sent
            if self.wire is not None:
                self._mixing = self._start_low(step)
                return
            self._mixing = collectives.ineighbor_allreduce(
                self.params.flat, self.gossip, out=self._mixed, step=step, comm=self.comm,
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
        """Local SGD: average the parameters after the update of ``step``, when due; gossip:
        mix them with the neighbors' after every update (with ``mix_ahead``, before it:
        :meth:`finish_mix`)."""
        if self.mix_ahead:
            return
        if self.gossip is not None:
            self._timed(self.params, step, self._mix)
        elif self.server is not None:
            self._timed(self.params, step, self._push)
        elif self.window is not None:
            self._timed(self.params, step, self._push_sum)
        elif self.pairwise is not None:
            self._timed(self.params, step, self._pairwise)
        elif self.local_every and self.exchanges_at(step):
            self._timed(self.params, step, self._dense)

    # ------------------------------------------------------------------ internals
    def _timed(self, buf: FusionBuffer, step: int, fn) -> None:
        sent0 = collectives.TRAFFIC.bytes_sent
        moved0 = 0 if self.pairwise is None else self.pairwise.elements_moved
        t0 = time.perf_counter()
        fn(buf, step)
        self.stats.seconds += time.perf_counter() - t0
        nbytes = buf.flat.nbytes
        dense = ring_bytes(nbytes, self.comm.size)
        self.stats.calls += 1
        self.stats.dense_bytes += dense
        if self.server is not None:  # a push: the other ranks' shards, n (p-1)/p bytes
            self.stats.bytes_sent += dense // 2
        elif self.window is not None:  # one message of the parameters (and the weight)
            self.stats.bytes_sent += nbytes + buf.flat.itemsize if self.comm.size > 1 else 0
        elif self.pairwise is not None:  # the get and the put of the peer's parameters
            self.stats.bytes_sent += (self.pairwise.elements_moved - moved0) * buf.flat.itemsize
        else:
            self.stats.bytes_sent += dense if self.analytic else \
                collectives.TRAFFIC.bytes_sent - sent0

    def _dense(self, buf: FusionBuffer, step: int) -> None:
        collectives.allreduce(buf.flat, out=buf.flat, op="avg", algorithm=self.algorithm,
                              comm=self.comm)

    def _push(self, buf: FusionBuffer, step: int) -> None:
        """--sync ssp:S / async: add this rank's update, averaged over the ranks, to the
        server's parameters: ``(pulled - updated) / p`` with the server's lr of 1 (under
        ``ssp:0`` the sum of the p pushes is synchronous SGD's averaged update)."""
        self.server.push((self._pulled - buf.flat) / self.comm.size)

    def _push_sum(self, buf: FusionBuffer, step: int) -> None:
        """--sync sgp[:overlap] (SGP, Assran et al. 2019): add this step's update to the
        numerator ``z``, send half of ``(z, w)`` to this step's peer of the one-peer exponential
        graph and keep half; the parameters become ``z / w``. ``sgp`` waits for the round's
        messages (a barrier) before combining; ``sgp:overlap`` combines what has arrived (every
        message still arrives, and counts, at a later round)."""
        win = self.window
        win.assign(win.value + (buf.flat - self._pulled))
        peer = (self.graph.out_neighbors(self.comm.rank, step) or (self.comm.rank,))[0]
        win.accumulate(win.estimate, peer, weight=0.5 * win.weight)
        if not self.sgp:
            self.comm.Barrier()  # every message of this round has landed
        win.update(self_weight=0.5)
        if not self.sgp:
            self.comm.Barrier()  # ... and none of the next round's yet: W_t exactly
        buf.flat[...] = win.estimate

    def _pairwise(self, buf: FusionBuffer, step: int) -> None:
        """--sync adpsgd (Lian et al. 2018): this rank's and a random neighbor's parameters
        become their mean, atomically, and this step's update (``updated - pulled``) is added to
        this rank's; the parameters are the result."""
        pw = self.pairwise
        buf.flat[...] = pw.average(pw.peer(step), buf.flat - self._pulled)

    def _mix(self, buf: FusionBuffer, step: int) -> None:
        if self.choco is not None:  # CHOCO-SGD: a compressed gossip round
            self.choco.step(buf.flat, step)
            return
        if self.wire is not None:
            self._start_low(step).wait()
            self._finish_low(buf.flat, step)
            return
        collectives.neighbor_allreduce(buf.flat, self.gossip, out=buf.flat, step=step,
                                       comm=self.comm, hierarchical=self.by_nodes)

    def _start_low(self, step: int):
        """--gossip-dtype: start the round of step ``step`` on this rank's parameters in the wire
        dtype (the fp16 codec's payload): each neighbor's payload arrives whole
        (``ineighbor_allgather``)."""
        self._half.encode(self.params.flat, out=self._payload)
        d = len(self.gossip.in_neighbors(self.comm.rank, step))
        got = self._received.get(d)
        if got is None:
            got = self._received[d] = np.empty((d, self._payload.size), np.uint8)
        self._got = got
        return collectives.ineighbor_allgather(self._payload, self.gossip, out=got, step=step,
                                               comm=self.comm, name="gossip")

    def _finish_low(self, x: np.ndarray, step: int) -> None:
        """``x`` (this rank's own parameters, in full precision) becomes its self weight times
        itself plus each neighbor's weight times its decoded parameters (in float32; the codec
        checks each payload before reading it)."""
        mine, weights = self.gossip.recv_weights(self.comm.rank, step)
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

    def _reduce_grads(self, buf: FusionBuffer, step: int) -> None:
        if self.state is None:
            self._dense(buf, step)
            return
        self.state.step = step
        parts = (list(enumerate(buf.views)) if self.layerwise else [(None, buf.flat)])
        for i, x in parts:
            collectives.compressed_allreduce(
                x, self.state, out=x, op="avg", strategy=self.strategy, comm=self.comm,
                key="grads" if i is None else f"grads.{i}", algorithm=self.algorithm)
