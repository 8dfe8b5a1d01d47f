"""The progress engine behind the non-blocking collectives (see ``engine.py`` for the design).

``comm`` (communicators whose waits poll), ``control`` (status queries and the stall report),
``requests`` (requests and waiting), ``engine`` (one thread per communicator), ``named`` (named
operations, negotiated in rounds), ``calls`` (call objects and joins on the named stream:
Horovod's operations), ``lifecycle`` (creation, thread level, shutdown). The public
functions are in :mod:`collectives.engine.nonblocking`.
"""

from .engine import Engine
from .lifecycle import engine_of, live_engines, require_threads, shutdown
from .requests import EngineError, Request, StallWarning, testall, waitall, waitany

__all__ = ["Engine", "engine_of", "live_engines", "require_threads", "shutdown", "Request",
           "StallWarning", "EngineError", "waitall", "waitany", "testall"]
