"""What every sync mode shares: the exchange's interface, its statistics, the flags it may refuse.

A sync mode is one class (a subclass of :class:`SyncMode`) that knows its own ``--sync`` syntax
(:meth:`SyncMode.parse`), which flags it does not take and why (:meth:`SyncMode.refusals`, as
:class:`Refusal` rows over the flags of :data:`FLAGS`), and runs its own exchange through the
hooks the training loop calls each step, in this order::

    pull(step)            before forward: read parameters kept elsewhere (server, window)
    forward_hooks()       keyword arguments of forward-only passes (evaluation)
    start_mix(step)       before forward: start a round that travels during the compute
    backward_hooks(step)  keyword arguments of the backward pass (buckets started during it)
    __call__(step)        after backward, before the update: the gradient exchange
    finish_mix(step)      ... the round started before forward, waited for
    average_params(step)  after the update: the parameter exchange

Every hook does nothing by default. The optimizer updates :attr:`SyncMode.update_params` with
:attr:`SyncMode.update_grads` (the whole buffers, or a sharded mode's owned slices) after
``__call__``, unless the mode :attr:`SyncMode.applies_update` itself (sharded stages 2-3 update
each slice of the shard as its average lands, with the optimizer and schedule handed to
:meth:`SyncMode.attach_optimizer`), and every
mode files the arrays it holds in :attr:`SyncMode.ledger` (peak memory per category,
:class:`collectives.parallel.MemoryLedger`). The statistics of the report (:class:`Stats`) are kept here:
seconds spent in the exchange, the bytes this rank sent (``collectives.TRAFFIC``, the library's
own messages, or analytic counts where the messages are MPI's own or one-sided), and what dense
fp32 ring allreduce would have sent (:func:`ring_bytes`).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np
from mpi4py import MPI

import collectives

from ...parallel import MemoryLedger
from ..checkpoint_check import Member
from ..fusion import FusionBuffer
from ..timing import Clock

__all__ = ["SyncMode", "Stats", "Refusal", "Flag", "FLAGS", "BadSyntax", "ring_bytes",
           "dense_average", "GOSSIP_DTYPE", "CHECK_REPLICAS"]


class BadSyntax(ValueError):
    """A ``--sync`` value that none of the modes' forms reads (the message lists them all)."""


def ring_bytes(n_bytes: int, world: int) -> int:
    """Bytes one rank sends in a ring allreduce of ``n_bytes``: 2 n (p-1)/p (0 for one rank)."""
    return 2 * n_bytes * (world - 1) // world if world > 1 else 0


def dense_average(x: np.ndarray, algorithm: str, comm: MPI.Comm) -> None:
    """``x`` becomes the average of every rank's ``x`` (one allreduce, in place)."""
    collectives.allreduce(x, out=x, op="avg", algorithm=algorithm, comm=comm)


@dataclass(frozen=True)
class Flag:
    """A command-line flag a mode may refuse: whether ``args`` give it (``codec``: the
    gradient codec's name, or None), and an argument list that gives it (tests)."""

    given: Callable[[argparse.Namespace, str | None], bool]
    example: tuple[str, ...]


#: the flags that some mode does not take, by name
FLAGS: dict[str, Flag] = {
    "--codec": Flag(lambda a, codec: bool(codec), ("--codec", "topk:ratio=0.1")),
    "--overlap": Flag(lambda a, codec: a.overlap, ("--overlap",)),
    "--check-replicas": Flag(lambda a, codec: a.check_replicas, ("--check-replicas",)),
    "--gossip-dtype": Flag(lambda a, codec: a.gossip_dtype != "float32",
                           ("--gossip-dtype", "float16")),
    "--eval-model average": Flag(lambda a, codec: a.eval_model == "average",
                                 ("--eval-model", "average")),
}


@dataclass(frozen=True)
class Refusal:
    """Flags a mode does not take, and the message that says why (``{sync}``: the ``--sync``
    value)."""

    flags: tuple[str, ...]
    message: str

    def check(self, a: argparse.Namespace, codec: str | None) -> str | None:
        """The message if ``a`` gives one of the flags, else None."""
        if any(FLAGS[f].given(a, codec) for f in self.flags):
            return self.message.format(sync=a.sync)
        return None


#: ``--gossip-dtype``: only plain gossip rounds take it
GOSSIP_DTYPE = Refusal(("--gossip-dtype",), "--gossip-dtype sends the parameters of a plain "
                       "gossip round in another dtype: only with --sync gossip:GRAPH, not with "
                       "--codec (CHOCO-SGD) or gossip:nodes")
#: modes whose replicas differ: parameters are exchanged, not gradients
CHECK_REPLICAS = ("--codec", "--overlap", "--check-replicas")


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


class SyncMode:
    """One sync mode: what crosses the network each step (the hooks of the module docstring).

    Class attributes say what the mode is: ``name`` (the ``--sync`` word), ``forms`` (its
    syntax, for the message that lists every mode), ``label`` (how the other modes' messages
    name it), ``help`` (its forms and what they do, for ``--help``), ``own_params`` (every rank
    keeps its own parameters: the replicas differ), ``own_momentum`` (every rank's momentum is
    its own) and ``refuses`` (the flags it does not take). Instances hold the model's fusion
    buffers ``grads`` and ``params``, the communicator, the clock and :attr:`stats`."""

    name: ClassVar[str]
    forms: ClassVar[str]
    label: ClassVar[str]
    help: ClassVar[str]
    own_params: ClassVar[bool] = False
    own_momentum: ClassVar[bool] = False
    #: every rank keeps a slice of the parameters and momentum, and checkpoints its own
    sharded: ClassVar[bool] = False
    refuses: ClassVar[tuple[Refusal, ...]] = ()
    #: whether the bytes sent are computed rather than counted by ``collectives.TRAFFIC``
    analytic: bool = False
    #: --sync gossip:GRAPH --overlap: the round of x_t travels during forward and backward
    mix_ahead: bool = False
    #: --gossip-dtype: the dtype the parameters travel in (None: their own)
    wire: np.dtype | None = None
    #: the mode applies the optimizer's update itself, during the exchange (the training loop
    #: then calls no ``opt.step``; :meth:`attach_optimizer` hands it the optimizer)
    applies_update: bool = False
    #: the parameters this step's gradient is computed at, where :meth:`pull` reads or keeps
    #: them (the update is what the step moves them by); None: the model's own
    pulled: np.ndarray | None = None

    def __init__(self, grads: FusionBuffer, params: FusionBuffer, comm: MPI.Comm,
                 clock: Clock | None = None) -> None:
        self.grads, self.params, self.comm = grads, params, comm
        self.clock = Clock() if clock is None else clock
        self.stats = Stats()
        self.ledger = MemoryLedger()
        #: the parameters the optimizer updates (and whose momentum it keeps), and the gradient
        #: it updates them with: the whole buffers here, a sharded mode's owned slices there
        self.update_params, self.update_grads = params.flat, grads.flat
        for category, buf in (("parameters", params), ("gradients", grads)):
            if buf.flat is not None:
                self.ledger.track(category, buf.flat)

    # ------------------------------------------------------------------ the command line
    @classmethod
    def parse(cls, arg: str | None, world: int, comm: MPI.Comm | None = None) -> Any:
        """The mode's value from what follows ``name:`` in ``--sync`` (None: nothing follows);
        raises :class:`BadSyntax` for a form the mode does not have, ValueError for a value
        it cannot use. ``comm``: the communicator the run uses (collective where the value
        depends on it), or None to check the value only. Default: no argument."""
        if arg is not None:
            raise BadSyntax(arg)
        return None

    @classmethod
    def refusals(cls, value: Any, mixing_codec: str | None) -> tuple[Refusal, ...]:
        """The flags this mode does not take with ``value`` (``mixing_codec``: the codec spec
        the mode compresses its own rounds with, :meth:`mixing_codec`)."""
        return cls.refuses

    @classmethod
    def holds(cls, cfg: Any) -> tuple[str, ...]:
        """The model's fusion buffers this mode needs whole (``MLP(hold=)``) for the run
        ``cfg``. Default: both."""
        return ("params", "grads")

    @classmethod
    def mixing_codec(cls, a: argparse.Namespace, value: Any, inner: str | None) -> str | None:
        """The codec spec a given ``--codec`` is for the mode's own parameter rounds (CHOCO-SGD),
        or None where it compresses gradients; raises ``UsageError``.
        ``inner``: the spec inside ``auto:``, or None."""
        return None

    @classmethod
    def check(cls, a: argparse.Namespace, value: Any) -> str | None:
        """A message for settings the mode cannot run with beyond its refused flags, or None."""
        return None

    @classmethod
    def every(cls, value: Any) -> int:
        """Steps between parameter exchanges that checkpoints must fall on (0: any step)."""
        return 0

    @classmethod
    def from_config(cls, cfg: Any, value: Any, grads: FusionBuffer, params: FusionBuffer,
                    state: Any, comm: MPI.Comm, clock: Clock) -> "SyncMode":
        """Collective: the mode's exchange for the checked settings ``cfg``
        (:class:`collectives.sgd.cli.Config`) and the mode's ``value`` (:meth:`parse` with
        ``comm``); ``state``: the run's compression state, or None."""
        return cls(grads, params, comm, clock)

    def attach_optimizer(self, opt: Any, schedule: Callable[[int], float]) -> None:
        """The run's optimizer (over :attr:`update_params`) and learning rate per step, for a
        mode that :attr:`applies_update`. Default: not needed."""

    # ------------------------------------------------------------------ each step
    def forward_hooks(self) -> dict:
        """Keyword arguments for ``MLP.evaluate``."""
        return {}

    def exchanges_at(self, step: int) -> bool:
        """Whether step ``step`` (0-based) ends with the replicas agreeing, where they do."""
        return True

    def backward_hooks(self, step: int) -> dict:
        """Keyword arguments for ``MLP.loss_and_grad`` of ``step``."""
        return {}

    def pull(self, step: int) -> None:
        """Before the gradient of ``step``."""

    def start_mix(self, step: int) -> None:
        """Before forward of ``step``."""

    def __call__(self, step: int) -> None:
        """After the local gradient of ``step`` is in ``grads`` (before the update)."""

    def finish_mix(self, step: int) -> None:
        """After backward of ``step``, before the update."""

    def average_params(self, step: int) -> None:
        """After the update of ``step``."""

    def close(self) -> None:
        """Collective: release what the mode holds (windows)."""

    # ------------------------------------------------------------------ checkpoints
    def saved_params(self) -> np.ndarray:
        """Collective: the parameters a checkpoint holds (every rank's own where
        :attr:`own_params`, else one copy)."""
        return self.params.flat

    def full_params(self) -> np.ndarray | None:
        """Collective: the parameters ``--save-params`` writes, on rank 0 (rank 0's own)."""
        return self.params.flat

    def load_owned(self, values: np.ndarray) -> None:
        """Collective, sharded modes: the owned slice of the parameters becomes ``values``."""
        raise NotImplementedError(f"{type(self).__name__} keeps no shards")

    def restore(self, step: int) -> None:
        """Collective: after a checkpoint's parameters were loaded into ``params``."""

    def state_dict(self) -> dict[str, np.ndarray]:
        """The mode's own state a checkpoint holds (beyond parameters and momentum)."""
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict`."""

    def state_layout(self, rank: int) -> dict[str, Member]:
        """What each entry of ``rank``'s :meth:`state_dict` is (checkpoints check it)."""
        return {}

    # ------------------------------------------------------------------ statistics
    def _mark(self) -> int:
        """What :meth:`_sent` counts from, taken before an exchange."""
        return collectives.TRAFFIC.bytes_sent

    def _sent(self, buf: FusionBuffer, mark: int) -> int:
        """Bytes this rank sent in the exchange of ``buf`` that began at ``mark``."""
        if self.analytic:
            return ring_bytes(buf.flat.nbytes, self.comm.size)
        return collectives.TRAFFIC.bytes_sent - mark

    def _timed(self, buf: FusionBuffer, step: int, fn: Callable[[FusionBuffer, int], None]) -> None:
        """Run ``fn(buf, step)``, one exchange of ``buf``, counting its seconds and bytes."""
        mark = self._mark()
        t0 = time.perf_counter()
        fn(buf, step)
        self.stats.seconds += time.perf_counter() - t0
        self.stats.calls += 1
        self.stats.dense_bytes += ring_bytes(buf.flat.nbytes, self.comm.size)
        self.stats.bytes_sent += self._sent(buf, mark)

    def _timed_pull(self, read: Callable[[], np.ndarray]) -> np.ndarray:
        """``params`` become ``read()``'s parameters; the read counts as exchange time. Returns
        what was read."""
        t0 = time.perf_counter()
        pulled = read()
        self.params.flat[...] = pulled
        self.stats.seconds += time.perf_counter() - t0
        return pulled
