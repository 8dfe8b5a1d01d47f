"""Call objects and joins on a communicator's named stream (:mod:`.named`).

:func:`submit` hands any *call object* (``signature()`` and ``run(ctx)``, as the library's
checked calls have; ``agreed(signatures)`` if it needs every rank's signature before it runs) to
the named stream of the communicator's engine under a name, and returns its request at once;
:func:`join` submits this rank's join. ``collectives.torch`` runs Horovod's operations and
``hvd.join`` this way; :mod:`.named` explains the negotiation, the agreement rules
(a call's ``agree``) and what a joined rank does.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from mpi4py import MPI

from .._runtime.validate import setup
from .lifecycle import engine_of
from .named import JOIN, JoinCall
from .requests import Request

__all__ = ["submit", "join"]


def submit(kind: str, call: Any, comm: Any, name: str | None, options: Any = None,
           error: Exception | None = None) -> Request:
    """Run ``call`` as the named operation ``name`` of ``comm`` (see the module): a request,
    returned at once. Without a name it gets the stream's next automatic one
    (:meth:`~.named.NamedStream.automatic`: unnamed calls match in submission order). ``error``: this rank's argument error (``call`` None), raised from every
    rank's ``wait()``. On one process the call runs now. Raises ``ValueError`` if ``name`` is
    pending on this rank already."""
    comm, opts, _ = setup(comm, options, False)
    request = Request(kind, call, None, False, opts, error, name)
    if comm.size == 1:
        if error is not None:
            raise error
        request.started = time.perf_counter()
        try:
            agreed = getattr(call, "agreed", None)
            if agreed is not None:
                agreed([call.signature()])
            call.run(None)
        except Exception as exc:  # noqa: BLE001 - reported by wait(), like any failure
            request.complete(exc)
        else:
            request.complete()
        request.finished = time.perf_counter()
        return request
    engine = request.engine = engine_of(comm, opts.timeout)
    if name is None:
        request.name = engine.named.automatic()
    return engine.submit(request)


def join(comm: Any, stand_in: Callable[[str, Any], Any] | None = None, kinds: tuple = (),
         options: Any = None) -> Request:
    """This rank has joined the named operations of ``comm`` (see the module); the request's
    ``wait()`` returns the rank that joined last once every rank has joined."""
    call = JoinCall(stand_in, kinds)
    if (MPI.COMM_WORLD if comm is None else comm).size == 1:
        call.result = 0
    return submit(JOIN, call, comm, JOIN, options)
