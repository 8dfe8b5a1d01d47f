"""What this process has sent through the library's own point-to-point messages.

Every message of the hand-written collectives (dense and compressed) is counted here, so training
loops and benchmarks can report the bytes each rank put on the wire
(``collectives.TRAFFIC.bytes_sent``; ``collectives.TRAFFIC.reset()`` starts again from zero).
Calls into the MPI library's own collectives ("native") are not counted: what they send is the
library's business.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["Traffic", "TRAFFIC"]


@dataclass
class Traffic:
    """Counters of this process: bytes and messages sent."""

    bytes_sent: int = 0
    messages: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, nbytes: int) -> None:
        with self._lock:  # the progress engine's threads count here too
            self.bytes_sent += nbytes
            self.messages += 1

    def reset(self) -> "Traffic":
        """Zero the counters; return what they held."""
        with self._lock:
            before = Traffic(self.bytes_sent, self.messages)
            self.bytes_sent = self.messages = 0
        return before


#: The process-wide counters.
TRAFFIC = Traffic()
