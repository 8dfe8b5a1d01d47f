"""What happened in a job: the timeline, the flight recorder and the doctor.

- :mod:`.timeline`: every call, message, codec phase and user span of every rank on one clock,
  written as a Chrome/Perfetto trace (``collectives.timeline``; docs/timeline.md).
- :mod:`.flight_recorder`: each communicator's last calls, dumped on a crash, a timeout or
  ``SIGUSR1`` (``collectives.flight_recorder``; docs/debugging.md).
- :mod:`.doctor`: the dumps of every rank, explained (``python -m collectives doctor DIR``).
- :mod:`.probe`: a communicator's private context, for the benchmarks that measure the library
  itself (``bench/call_overhead.py``, ``bench/timeline_overhead.py``); not for programs.
"""
