"""``DistributedOptimizer``: Horovod's data-parallel optimizer wrapper, over collectives.

How it works. The wrapped optimizer's parameters are split into fusion *buckets*: in reverse
order of registration (roughly the order backward produces their gradients), by dtype, each up to
``bucket_bytes`` (a parameter larger than that is a bucket alone; with a low-rank codec such as
PowerSGD every parameter is a bucket alone, in its matrix shape). A post-accumulate-grad hook on
every parameter counts backward passes; once a parameter has had ``backward_passes_per_step``
of them it is ready, and when every parameter of a bucket is ready the hook copies their
gradients into the bucket's buffer and starts the bucket's allreduce (dense, or compressed with
the codec and its error feedback) as a non-blocking request on the communicator's progress
engine, so communication overlaps with the rest of backward. ``step()`` calls
:meth:`synchronize`: buckets no hook completed (parameters unused in this backward, on this rank)
are started with zeros for the missing gradients, every request is waited for, and the averaged
gradients are copied back into ``p.grad``; then the wrapped optimizer steps.

Requests are *named* (``name=`` of :mod:`collectives.engine.nonblocking`), so ranks whose backward
produces buckets in different orders (data-dependent graphs, parameters unused on some ranks)
still pair the same buckets. As Horovod's, a bucket is named after its parameters: the name of
its first parameter (``named_parameters``, e.g. ``model.named_parameters()``; without them, its
place in ``param_groups``: ``group0.param3``), and how many more it holds, after
:data:`PREFIX`: ``collectives.torch.grad.fc.weight+3``. The name is also the bucket's key for
codec state (error-feedback residuals). Names depend on nothing but the parameters, so they
agree across ranks whatever order optimizers are built or stepped in, and a checkpoint's codec
state finds its buckets again in a new optimizer. Two optimizers on one communicator must name
their parameters differently (prefix the names of each).

Cost per step: one allreduce per bucket (for ring: 2 (p-1) alpha + 2 (p-1)/p n beta per bucket
of n bytes, or the codec's wire size), two copies of every gradient (into the bucket and back),
and the hooks' Python work (~microseconds per parameter).
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections import Counter
from typing import Any, Iterable

import torch
from mpi4py import MPI

from ._common import codec_of, load_state_tensors, low_rank, make_state, start, state_tensors
from .basics import default_comm
from .process_sets import comm_of, resolve

__all__ = ["DistributedOptimizer", "PREFIX"]

MiB = 1 << 20
#: What every bucket's request name and codec-state key starts with.
PREFIX = "collectives.torch.grad."
_STATE_KEY = "collectives"


class _Bucket:
    __slots__ = ("name", "params", "slices", "buffer", "ready", "request")

    def __init__(self, params: list[torch.nn.Parameter], names: dict[int, str],
                 matrix: bool) -> None:
        first = PREFIX + names[id(params[0])]
        self.name = first if len(params) == 1 else f"{first}+{len(params) - 1}"
        self.params = params
        offsets = list(itertools.accumulate((p.numel() for p in params), initial=0))
        self.slices = [slice(lo, hi) for lo, hi in zip(offsets, offsets[1:])]
        p0 = params[0]
        flat = torch.zeros(offsets[-1], dtype=p0.dtype, device=p0.device)
        self.buffer = flat.view(p0.shape[0], -1) if matrix and p0.dim() >= 2 else flat
        self.ready = 0
        self.request = None

    def pack(self) -> None:
        flat = self.buffer.view(-1)
        for p, s in zip(self.params, self.slices):
            if p.grad is None:
                flat[s].zero_()
            elif p.grad.is_sparse:  # sent dense (Horovod's sparse_as_dense), written back sparse
                flat[s].copy_(p.grad.detach().to_dense().reshape(-1))
            else:
                flat[s].copy_(p.grad.detach().reshape(-1))

    def unpack(self) -> None:
        flat = self.buffer.view(-1)
        for p, s in zip(self.params, self.slices):
            if p.grad is None:
                p.grad = flat[s].view_as(p).clone()
            elif p.grad.is_sparse:
                p.grad = flat[s].view_as(p).to_sparse_coo().coalesce()
            else:
                p.grad.copy_(flat[s].view_as(p))


def _buckets(params: list[torch.nn.Parameter], names: dict[int, str], bucket_bytes: int,
             matrices: bool) -> list[_Bucket]:
    out: list[_Bucket] = []
    open_: dict[tuple, list] = {}
    for p in reversed(params):
        where = (p.dtype, p.device)
        if matrices:
            out.append(_Bucket([p], names, True))
            continue
        group = open_.setdefault(where, [])
        if group and sum(q.numel() * q.element_size() for q in group) + \
                p.numel() * p.element_size() > bucket_bytes:
            out.append(_Bucket(group, names, False))
            group = open_[where] = []
        group.append(p)
    out += [_Bucket(g, names, False) for g in open_.values() if g]
    return out


def _names(param_groups: list[dict], named_parameters: Iterable | None,
           own: list[torch.nn.Parameter]) -> dict[int, str]:
    """``id(p)`` -> the name of ``p``: from ``named_parameters``, checked (pairs, unique names,
    every parameter of ``own`` named), or else ``group<i>.param<j>``, its place in
    ``param_groups``."""
    if named_parameters is None:
        return {id(p): f"group{i}.param{j}"
                for i, group in enumerate(param_groups) for j, p in enumerate(group["params"])}
    named = list(named_parameters)
    if not all(isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], str)
               and isinstance(e[1], torch.Tensor) for e in named):
        raise ValueError("named_parameters must be (name, parameter) pairs, as "
                         "model.named_parameters() gives")
    duplicates = sorted(n for n, k in Counter(n for n, _ in named).items() if k > 1)
    if duplicates:
        raise ValueError(f"named_parameters has duplicate names: {', '.join(duplicates)} (each "
                         "names its parameter's requests and codec state, so they must be unique)")
    names: dict[int, str] = {}
    for name, p in named:
        names.setdefault(id(p), name)  # a parameter listed twice: its first name
    missing = [p for p in own if id(p) not in names]
    if missing:
        raise ValueError(f"named_parameters lacks {len(missing)} of the optimizer's parameters "
                         f"(shapes {', '.join(str(tuple(p.shape)) for p in missing[:4])}"
                         f"{' ...' if len(missing) > 4 else ''})")
    return names


class _DistributedOptimizer:
    """The methods a :func:`DistributedOptimizer` adds to (or overrides in) the wrapped class."""

    def __init__(self, params: Any, named_parameters: Iterable | None, op: str, algorithm: str,
                 codec: Any, error_feedback: bool | None, strategy: str, bucket_bytes: int,
                 backward_passes_per_step: int, comm: Any) -> None:
        super(self.__class__, self).__init__(params)  # the wrapped optimizer's class
        if op not in ("avg", "sum"):
            raise ValueError(f"op must be 'avg' or 'sum', got {op!r}")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be a positive integer, got "
                             f"{backward_passes_per_step!r}")
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be a positive integer, got {bucket_bytes!r}")
        own = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        names = _names(self.param_groups, named_parameters, own)
        self._op, self._algorithm, self._strategy = op, algorithm, strategy
        self._comm = default_comm() if comm is None else comm
        self._codec_state = make_state(codec, error_feedback, rank=self._comm.rank)
        self._passes = backward_passes_per_step
        self._buckets = _buckets(own, names, bucket_bytes, low_rank(self._codec_state))
        self._bucket_of = {id(p): b for b in self._buckets for p in b.params}
        self._counts = {id(p): 0 for p in own}
        self._step_count = 0
        self._should_synchronize = True
        self._synchronized = False
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in own]

    @property
    def codec_state(self) -> Any:
        """The buckets' :class:`collectives.CompressionState` (None without a codec); with
        ``codec="auto:..."``, ``codec_state.auto.report()`` says what each bucket sent."""
        return self._codec_state

    # ------------------------------------------------------------------ backward
    def _hook(self, p: torch.Tensor) -> None:
        count = self._counts[id(p)] = self._counts[id(p)] + 1
        if count > self._passes:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call "
                "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
        if count < self._passes:
            return
        bucket = self._bucket_of[id(p)]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._launch(bucket)

    def _launch(self, bucket: _Bucket) -> None:
        bucket.pack()
        bucket.request = start(bucket.buffer, self._codec_state, op=self._op,
                               algorithm=self._algorithm, strategy=self._strategy,
                               comm=self._comm, key=bucket.name, step=self._step_count,
                               name=bucket.name)

    # ------------------------------------------------------------------ Horovod's interface
    def synchronize(self) -> None:
        """Finish every bucket's allreduce and write the averaged gradients into ``p.grad``.

        Buckets whose parameters got no gradient in this backward (on this rank) are started
        now, with zeros for the missing gradients, so unused parameters never hang the job.
        """
        for bucket in self._buckets:
            if bucket.request is None:
                self._launch(bucket)
        try:
            for bucket in self._buckets:
                bucket.request.wait()
                bucket.unpack()
        finally:
            for bucket in self._buckets:
                bucket.request, bucket.ready = None, 0
            for key in self._counts:
                self._counts[key] = 0
        self._step_count += 1
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """``step()`` inside this context does not synchronize (after an explicit
        :meth:`synchronize`, e.g. to clip the averaged gradients), as in Horovod."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(); this can cause training "
                              "slowdown (the gradients are averaged again).", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if any(b.request is not None for b in self._buckets):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(); this is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(set_to_none)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The wrapped optimizer's state dict, plus the codec state (error-feedback residuals,
        PowerSGD matrices) under the key ``"collectives"``."""
        out = super(self.__class__, self).state_dict()
        out[_STATE_KEY] = {"steps": self._step_count, "codec": state_tensors(self._codec_state)}
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        ours = state_dict.pop(_STATE_KEY, None)
        super(self.__class__, self).load_state_dict(state_dict)
        if ours is not None:
            self._step_count = int(ours["steps"])
            load_state_tensors(self._codec_state, ours["codec"])

    def remove_hooks(self) -> None:
        """Remove the gradient hooks (the optimizer then no longer averages anything)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Iterable | None = None,
                         *, op: str = "avg", algorithm: str = "auto", codec: Any = None,
                         error_feedback: bool | None = None, strategy: str = "auto",
                         bucket_bytes: int = 25 * MiB, backward_passes_per_step: int = 1,
                         compression: Any = None, comm: Any = None, process_set: Any = None,
                         sparse_as_dense: bool = False,
                         gradient_predivide_factor: float = 1.0) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged over all ranks (Horovod's).

    Parameters
    ----------
    optimizer
        A ``torch.optim`` optimizer; the result is an instance of a subclass of its class (so
        learning-rate schedulers accept it), with the same parameter groups and state.
    named_parameters
        ``model.named_parameters()``, or any (name, parameter) pairs covering the optimizer's
        parameters, with unique names (a ``ValueError`` says otherwise). They name each bucket's
        request and codec state (see the module docstring); without them, a parameter's name is
        its place in ``param_groups`` (``group0.param3``). Give two optimizers on one
        communicator different names (``[("gen." + n, p) for n, p in gen.named_parameters()]``).
    op
        "avg" (default) or "sum" over the ranks.
    algorithm
        Dense allreduce algorithm (a name in ``collectives.ALGORITHMS``); with a codec, the one
        its strategy uses for dense parts.
    codec, error_feedback, strategy
        Compress every bucket: a codec spec (``"topk:ratio=0.01"``; ``"auto:topk:ratio=0.01"``
        compresses a bucket only where the cost model predicts it pays, else sends it dense:
        ``collectives.compressed.auto``), a ``compress`` codec, a memory around one, or a
        ``collectives.CompressionState``; ``error_feedback=True`` wraps
        the codec in ``compress.ErrorFeedback`` (None: where the codec needs it); ``strategy`` as
        in ``collectives.compressed_allreduce``.
    bucket_bytes
        Fusion bucket size (default 25 MiB, DDP's and Horovod's).
    backward_passes_per_step
        Backward passes accumulated locally before the gradients are averaged.
    compression
        Horovod's spelling: ``collectives.torch.Compression.fp16`` is ``codec="fp16"``,
        ``Compression.none`` no codec (give ``codec=`` or ``compression=``, not both).
    comm, process_set
        The communicator (default: :func:`collectives.torch.init`'s, else ``MPI.COMM_WORLD``),
        or Horovod's process set (:func:`collectives.torch.add_process_set`) whose ranks
        average their gradients.
    sparse_as_dense
        Horovod's: sparse gradients (``nn.Embedding(sparse=True)``) are always sent dense here
        (there is no sparse allreduce) and written back sparse; True or False changes nothing.
    gradient_predivide_factor
        Horovod's: only 1.0 (Horovod splits the average into a division before and after the
        sum; here the average is one division after it).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {k: v for k, v in _DistributedOptimizer.__dict__.items()
                if k not in ("__dict__", "__weakref__")})
    if gradient_predivide_factor != 1.0:
        raise ValueError("gradient_predivide_factor other than 1.0 is not offered (the average "
                         "is one division after the sum)")
    if process_set is not None:  # ranks outside the set step on their own gradients
        ps = resolve(process_set, comm)
        comm = comm_of(ps) if ps.included() else MPI.COMM_SELF
    if op == "adasum":  # Horovod's Adasum
        raise RuntimeError("op=Adasum is not offered by collectives.torch; use Average or Sum")
    codec = codec_of(codec, compression)
    wrapped = cls(optimizer.param_groups, named_parameters, op, algorithm, codec, error_feedback,
                  strategy, bucket_bytes, backward_passes_per_step, comm)
    wrapped.load_state_dict(optimizer.state_dict())
    return wrapped
