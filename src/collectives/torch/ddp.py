"""A DDP communication hook running collectives' algorithms and codecs, and the gloo group setup.

``model.register_comm_hook(CommHookState(codec="powersgd:rank=2"), comm_hook)``: DDP hands each
gradient bucket (a flat tensor) to :func:`comm_hook`, which starts its in-place allreduce on the
progress engine (dense with the chosen algorithm, or compressed with the codec, its error
feedback and strategy) and returns a ``torch.futures.Future``. A completion callback on each
request (``Request.add_done_callback``) counts them down, and the last one completes the future,
on the communicator's engine thread (on one process the requests complete during the call, and
the future with them, on the caller's thread); callbacks chained to the future with ``then()``
run there too, so they must be short. The requests get a wait's stall warning and
``Options.timeout`` from the library's watchdog thread, which fails the future with the
``TimeoutError`` when the timeout passes. DDP reduces buckets in the same order on every rank, so
requests are not named. With a low-rank codec (PowerSGD) every tensor of the bucket is
compressed alone, in its shape (``GradBucket.gradients()`` are views of the bucket), with warm
start and error feedback per tensor, as PyTorch's PowerSGD hook.

State keys (residuals, PowerSGD's Q) are ``ddp.b<bucket index>.<crc32 of the tensor shapes>
[.t<tensor>]``: DDP rebuilds its buckets after the first iteration, and a rebuilt bucket starts
with fresh state.

:func:`init_process_group` sets up ``torch.distributed`` (gloo) from the MPI job: rank 0 binds a
free TCP port on 127.0.0.1 (every rank on one host) or on its host's address, and broadcasts the
address with MPI; no ``MASTER_ADDR``/``MASTER_PORT``, no other launcher than ``mpiexec``.
"""

import socket
import threading
import zlib
from typing import Any, Sequence

import torch
import torch.distributed as dist
from mpi4py import MPI

from ..engine.requests import watch
from ._common import load_state_tensors, low_rank, make_state, start, state_tensors
from .basics import default_comm

__all__ = ["CommHookState", "comm_hook", "init_process_group"]


class CommHookState:
    """What :func:`comm_hook` needs and keeps: the communicator, the reduction, the codec state.

    Parameters
    ----------
    comm
        MPI communicator with the ranks of DDP's process group, in the same order (default
        ``MPI.COMM_WORLD``, matching :func:`init_process_group`).
    op, algorithm, codec, error_feedback, strategy
        As for :func:`collectives.torch.DistributedOptimizer`.
    start_step
        Iterations before it allreduce the buckets dense (PyTorch's ``start_powerSGD_iter``;
        default: the codec state's own, 0 for a new one).
    """

    def __init__(self, comm: Any = None, *, op: str = "avg", algorithm: str = "auto",
                 codec: Any = None, error_feedback: bool | None = None,
                 strategy: str = "auto", start_step: int | None = None) -> None:
        if op not in ("avg", "sum"):
            raise ValueError(f"op must be 'avg' or 'sum', got {op!r}")
        self.comm = default_comm() if comm is None else comm
        self.op, self.algorithm, self.strategy = op, algorithm, strategy
        self.codec_state = make_state(codec, error_feedback, start_step, rank=self.comm.rank)
        self.iteration = 0

    def state_dict(self) -> dict:
        """The codec state (residuals, PowerSGD matrices) as tensors, for ``torch.save``."""
        return {"iteration": self.iteration, "codec": state_tensors(self.codec_state)}

    def load_state_dict(self, state: dict) -> None:
        self.iteration = int(state["iteration"])
        load_state_tensors(self.codec_state, state["codec"])


def _future_of(requests: Sequence[Any], value: torch.Tensor) -> torch.futures.Future:
    """A future completed with ``value`` (or the first failed request's exception, in list
    order) by the thread that completes the last of ``requests``: the engine's. The requests
    are watched as a wait would watch them (:func:`collectives.engine.requests.watch`): a stall
    warning, and past ``Options.timeout`` the future fails with the ``TimeoutError``."""
    fut: torch.futures.Future = torch.futures.Future()
    left = [len(requests)]
    settled = [False]
    lock = threading.Lock()

    def settle(set_: Any, outcome: Any) -> None:  # once: the last completion or the timeout
        with lock:
            if settled[0]:
                return
            settled[0] = True
        set_(outcome)

    def done(_request: Any) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        try:
            for request in requests:
                request.wait()  # done: returns, or raises the operation's exception, at once
        except BaseException as exc:  # noqa: BLE001 - handed to DDP through the future
            settle(fut.set_exception, exc)
        else:
            settle(fut.set_result, value)

    for request in requests:
        request.add_done_callback(done)
    watch(requests, lambda exc: settle(fut.set_exception, exc))
    return fut


# real annotations (no ``from __future__ import annotations``): DDP checks them at registration
def comm_hook(state: CommHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: allreduce ``bucket`` (averaged) with collectives, in place."""
    buf = bucket.buffer()
    grads = bucket.gradients()
    shapes = ",".join("x".join(map(str, g.shape)) for g in grads)
    base = f"ddp.b{bucket.index()}.{zlib.crc32(shapes.encode()):08x}"
    kw = dict(op=state.op, algorithm=state.algorithm, strategy=state.strategy, comm=state.comm,
              step=state.iteration, name=None)
    if low_rank(state.codec_state):
        requests = [start(g, state.codec_state, key=f"{base}.t{i}", **kw)
                    for i, g in enumerate(grads)]
    else:
        requests = [start(buf, state.codec_state, key=base, **kw)]
    if bucket.is_last():
        state.iteration += 1
    return _future_of(requests, buf)


def _address(comm: MPI.Comm) -> str:
    hosts = comm.allgather(MPI.Get_processor_name())
    if len(set(hosts)) == 1:
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


def init_process_group(comm: Any = None, *, backend: str = "gloo", timeout: Any = None) -> None:
    """``torch.distributed.init_process_group`` for the ranks of ``comm`` (default
    :func:`collectives.torch.init`'s, else ``MPI.COMM_WORLD``): same ranks, same size,
    rendezvous through MPI."""
    comm = default_comm() if comm is None else comm
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised")
    address = _address(comm)
    port = 0
    if comm.rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
            port = s.getsockname()[1]
    address, port = comm.bcast((address, port), root=0)
    kwargs = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=comm.rank,
                            world_size=comm.size, **kwargs)
