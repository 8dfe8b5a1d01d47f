"""The driver's sync modes (``--sync``): what crosses the network each step, one class per mode.

:data:`MODES` names the whole catalogue, ``--sync`` word to class; each class (a subclass of
:class:`base.SyncMode`) parses its own ``--sync`` value, says which flags it does not take and
why, and runs its exchange through the hooks the training loop calls (:mod:`.base`):

- ``sync``: :class:`Synchronous`, gradients averaged every step (``--codec``, ``--overlap``);
- ``local``: :class:`Local`, local SGD, parameters averaged every H steps;
- ``gossip``: :class:`Gossip`, D-PSGD (CHOCO-SGD with ``--codec``; between nodes);
- ``sgp``: :class:`PushSum`, stochastic gradient push through a one-sided window;
- ``adpsgd``: :class:`PairwiseGossip`, AD-PSGD, atomic pairwise averages, no global step;
- ``ssp``: :class:`StaleSynchronous`, a parameter server with a staleness bound;
- ``async``: :class:`Asynchronous`, the parameter server without a bound.

``--shard N`` (ZeRO stage N) picks :class:`Sharded` in place of ``sync``: synchronous SGD with the
optimizer state, gradients and parameters sharded over the ranks (:mod:`.sharded`); it is no
``--sync`` word, as it composes with no other mode.

The command line (:mod:`collectives.sgd.cli`) reads the modes from here: :func:`parse` turns
``--sync`` into a class and its value, :func:`refusals` lists the flags the mode does not take
with its messages, and :func:`build` makes the run's exchange from the checked settings.
Shared machinery stays outside the classes: fusion buffers (:mod:`..fusion`), codec states
(:meth:`collectives.CompressionState.from_spec`), the clock (:mod:`..timing`) and the statistics (:class:`base.Stats`).
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from ...compressed import CompressionState
from ..fusion import FusionBuffer
from ..timing import Clock
from .adpsgd import PairwiseGossip
from .base import FLAGS, BadSyntax, Flag, Refusal, Stats, SyncMode, ring_bytes
from .dense import LAYERWISE, Buckets, Synchronous
from .gossip import Gossip
from .local import Local
from .pushsum import PushSum
from .server import Asynchronous, StaleSynchronous
from .sharded import Sharded

__all__ = ["MODES", "SyncMode", "Synchronous", "Local", "Gossip", "PushSum", "PairwiseGossip",
           "StaleSynchronous", "Asynchronous", "Sharded", "Buckets", "Stats", "Refusal", "Flag", "FLAGS",
           "LAYERWISE", "parse", "refusals", "build", "help_text", "ring_bytes"]

#: every ``--sync`` mode, by the word before its first ``:``
MODES: dict[str, type[SyncMode]] = {cls.name: cls for cls in (
    Synchronous, Local, Gossip, PushSum, PairwiseGossip, StaleSynchronous, Asynchronous)}


def _either(items: list[str]) -> str:
    """``"a, b or c"``."""
    return f"{', '.join(items[:-1])} or {items[-1]}"


def _syntax(text: str) -> str:
    return f"--sync must be {_either([cls.forms for cls in MODES.values()])}, got {text!r}"


def help_text() -> str:
    """``--sync``'s help: every mode's forms and what they do."""
    return _either([cls.help for cls in MODES.values()])


def parse(text: str, world: int, comm: MPI.Comm | None = None) -> tuple[type[SyncMode], Any]:
    """``--sync`` -> (the mode's class, its value: :meth:`SyncMode.parse`). Raises ValueError:
    for a form no mode has, the message lists every mode's; for a value the mode cannot use,
    ``--sync TEXT: why``. ``comm``: as :meth:`SyncMode.parse`."""
    name, colon, arg = text.partition(":")
    cls = MODES.get(name)
    try:
        if cls is None:
            raise BadSyntax(text)
        return cls, cls.parse(arg if colon else None, world, comm)
    except BadSyntax:
        raise ValueError(_syntax(text)) from None
    except ValueError as e:
        raise ValueError(f"--sync {text}: {e}") from None


def _own_params_only() -> Refusal:
    """``--eval-model average``: only where every rank keeps its own parameters."""
    own = [cls.label for cls in MODES.values() if cls.own_params]
    return Refusal(("--eval-model average",), "--eval-model average applies where every rank "
                   f"keeps its own parameters: --sync {_either(own)}")


def refusals(cls: type[SyncMode], value: Any, mixing_codec: str | None) -> tuple[Refusal, ...]:
    """The flags mode ``cls`` does not take with ``value``, with their messages, in the order
    they are checked."""
    own = () if cls.own_params else (_own_params_only(),)
    return own + cls.refusals(value, mixing_codec)


def build(cfg: Any, grads: FusionBuffer, params: FusionBuffer,
          state: CompressionState | None, comm: MPI.Comm, clock: Clock) -> SyncMode:
    """Collective: the exchange of the run ``cfg`` (:class:`collectives.sgd.cli.Config`) on
    ``comm`` (:meth:`SyncMode.from_config`); with ``--shard N``, :class:`Sharded` at stage N."""
    if getattr(cfg.args, "shard", None):
        return Sharded.from_config(cfg, cfg.args.shard, grads, params, state, comm, clock)
    cls, value = parse(cfg.args.sync, comm.size, comm)
    return cls.from_config(cfg, value, grads, params, state, comm, clock)
