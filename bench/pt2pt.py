"""Point-to-point cost against mpi4py's buffer methods, side by side (p = 2).

``mpiexec -n 2 python bench/pt2pt.py [--sizes 8,64K,1M] [--rounds 7] [--timeout] [--compare TREE]``

A ping-pong between ranks 0 and 1: rank 0 sends ``size`` bytes (float32) and receives them back,
rank 1 the reverse; the time of one message is half a round trip. In every round each variant
makes its ping-pongs back to back, timed as a whole, and the variants take turns within the
round, in a new random order every round (the same on both ranks), so that load on a shared
machine hits them alike and no variant always follows the same one. Reported: rank 0's median over rounds
(microseconds per message) and its ratio to the median of mpi4py's form of the same exchange
(``comm.Send/Recv`` or ``comm.Sendrecv``).

- ``comm.Send/Recv``: mpi4py's ``comm.Send(x, peer)`` / ``comm.Recv(y, peer)``;
- ``send/recv``: ``collectives.send(x, peer)`` / ``collectives.recv(y, peer)`` (the dtype in the
  tag, the count checked: src/collectives/pt2pt/messages.py);
- ``send/recv(options=)``: the same with ``options=`` given, so that the calls do not read the
  ``COLLECTIVES_*`` environment variables (``Options.from_env``) each time;
- ``send/recv(timeout)`` (``--timeout``): the same with ``Options(timeout=60)``, whose sends
  wait under the deadline too (``Isend`` and tests instead of ``MPI_Send``);
- ``send_init/recv_init``: persistent forms (``collectives.send_init``, ``recv_init``),
  checked once per size, then ``plan()`` per message;
- ``sendrecv``, ``comm.Sendrecv``: both directions at once, one call per rank;
- ``send/recv (TREE)`` (``--compare TREE``): ``send``/``recv`` of another source tree's
  ``src/collectives/pt2pt/messages.py`` (a worktree of an earlier commit), loaded beside this
  one's, so that before and after take turns in one loop. Only that module is the other
  tree's: what it imports (``_runtime``, the observers) is this tree's.

``--parts`` takes the library's work apart instead, against ``comm.Send/Recv``: ``tag+probe``
(the scheme alone, below), ``send_init/recv_init, no recorder`` (the persistent forms with
the observers of ``pt2pt`` unregistered while the variant runs: no cache lookup, no flight
record, the run path alone), ``send/recv, no recorder`` (the cache lookup added),
``send_init/recv_init`` (the flight records added to the first) and ``send/recv`` (all of it),
with ``--compare``'s column if given.

Each variant has arrays of its own: a repeated ``send``/``recv`` is remembered by its arrays
(``_runtime/repeats.py``), and two modules must not run each other's remembered calls.

``--schemes`` times the ways a receiver can check count and dtype, written with bare mpi4py
calls (no argument checks, no options), against plain ``Send``/``Recv``:

- ``tag+probe`` (the library's): the dtype's code in the tag, the payload alone; the receiver
  ``Improbe``s, compares the size, then ``Mrecv``s into its array;
- ``header``: a 16-byte header (count, dtype) packed in front of payloads up to 8 KiB (one
  message and a copy on each side), sent ahead of larger ones (two messages); the receiver posts
  the header's receive, checks it, then receives the payload;
- ``header, posted together``: the same, with the payload's receive posted together with the
  header's (larger payloads; a longer message is then MPI's truncation error);
- ``exchange, probed`` and ``exchange, posted`` (against ``comm.Sendrecv``): both ranks send and
  receive at once, the receive probed (``Isend``, ``Improbe``, ``Mrecv``) or posted before the
  send (``Irecv``, ``Isend``, ``Waitall``): why ``sendrecv`` and ``irecv`` post large receives.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import collectives
from collectives import observe


def _sizes(text: str) -> list[int]:
    units = {"K": 1 << 10, "M": 1 << 20}
    return [int(t[:-1]) * units[t[-1]] if t[-1] in units else int(t) for t in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_sizes, default=_sizes("8,64K,1M"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--timeout", action="store_true")
    parser.add_argument("--schemes", action="store_true")
    parser.add_argument("--compare", type=Path, default=None, metavar="TREE")
    parser.add_argument("--parts", action="store_true")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        raise SystemExit("run with mpiexec -n 2")
    r = comm.rank
    peer = 1 - r
    timed = collectives.Options(timeout=60.0)

    def bare(x, y):
        if r == 0:
            comm.Send(x, peer)
            comm.Recv(y, peer)
        else:
            comm.Recv(y, peer)
            comm.Send(x, peer)

    def ours(x, y, options=None, module=collectives):
        if r == 0:
            module.send(x, peer, options=options)
            module.recv(y, peer, options=options)
        else:
            module.recv(y, peer, options=options)
            module.send(x, peer, options=options)

    given = collectives.Options.from_env()
    variants = {"comm.Send/Recv": bare, "send/recv": ours,
                "send/recv(options=)": lambda x, y: ours(x, y, given)}
    if args.timeout:
        variants["send/recv(timeout)"] = lambda x, y: ours(x, y, timed)
    plans: dict = {}

    def persistent(x, y):
        if plans.get("key") is not x:  # a new size: the plans of its arrays, made once
            plans.update(key=x, send=collectives.send_init(x, peer, options=given),
                         recv=collectives.recv_init(y, peer, options=given))
        if r == 0:
            plans["send"]()
            plans["recv"]()
        else:
            plans["recv"]()
            plans["send"]()

    variants["send_init/recv_init"] = persistent
    if args.compare is not None:
        other = _messages_of(args.compare)
        variants[f"send/recv ({args.compare.name})"] = \
            lambda x, y: ours(x, y, module=other)
    variants["comm.Sendrecv"] = lambda x, y: comm.Sendrecv(x, peer, recvbuf=y, source=peer)
    variants["sendrecv"] = lambda x, y: collectives.sendrecv(x, peer, y, peer)
    quiet: set[str] = set()  # variants run with the pt2pt observers unregistered
    if args.schemes:
        variants = {"comm.Send/Recv": bare, **_schemes(comm, peer),
                    "comm.Sendrecv": variants["comm.Sendrecv"]}
        variants.update(_exchanges(comm, peer))
    elif args.parts:
        quiet = {"send_init/recv_init, no recorder", "send/recv, no recorder"}
        compared = [n for n in variants if n.startswith("send/recv (")]
        variants = {"comm.Send/Recv": bare, "tag+probe": _schemes(comm, peer)["tag+probe"],
                    "send_init/recv_init, no recorder": persistent,
                    "send/recv, no recorder": ours,
                    "send_init/recv_init": persistent, "send/recv": ours,
                    **{n: variants[n] for n in compared}}
    if r == 0:
        print("| bytes | " + " | ".join(variants) + " |")
        print("|---" * (len(variants) + 1) + "|")
    for size in args.sizes:
        arrays = {name: (np.ones(max(size // 4, 1), np.float32),
                         np.empty(max(size // 4, 1), np.float32)) for name in variants}
        reps = 2000 if size <= 4096 else 500 if size <= 1 << 17 else 100
        times: dict[str, list[float]] = {name: [] for name in variants}
        for rnd in range(args.rounds):
            # a new order of the variants every round, the same on both ranks: a fixed order
            # gives the variant that follows the bare call that call's leftovers every time
            for name in np.random.default_rng(rnd).permutation(list(variants)):
                fn = variants[name]
                x, y = arrays[name]
                muted = _mute() if name in quiet else ()
                for _ in range(10):
                    fn(x, y)
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn(x, y)
                times[name].append((time.perf_counter() - t0) / reps / 2 * 1e6)
                for observer in muted:
                    observe.register("pt2pt", observer)
        if r == 0:
            med = {name: statistics.median(v) for name, v in times.items()}
            base = {n: med["comm.Sendrecv" if "endrecv" in n or "exchange" in n
                               else "comm.Send/Recv"] for n in variants}  # against bare forms
            cells = [f"{med[n]:.2f} ({med[n] / base[n]:.2f})" for n in variants]
            print(f"| {x.nbytes} | " + " | ".join(cells) + " |", flush=True)


def _mute() -> tuple:
    """Unregister the observers of ``pt2pt`` (the flight recorder's, and any other); returns
    them, to be registered again."""
    observers = observe.OBSERVERS.pt2pt
    for observer in observers:
        observe.unregister("pt2pt", observer)
    return observers


def _messages_of(tree: Path):
    """``tree``'s ``pt2pt/messages.py`` as a module of this tree's package (its relative
    imports resolve here), under a name of its own."""
    path = tree / "src" / "collectives" / "pt2pt" / "messages.py"
    if not path.is_file():
        raise SystemExit(f"--compare: no {path}")
    spec = importlib.util.spec_from_file_location("collectives.pt2pt._compared", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _schemes(comm: MPI.Comm, peer: int) -> dict:
    """The ping-pongs of ``--schemes`` (module docstring), bare mpi4py."""
    head, small = 16, 8192
    box = np.empty(head + small, np.uint8)
    status = MPI.Status()

    def pingpong(send, recv):
        def run(x, y):
            if comm.rank == 0:
                send(x)
                recv(y)
            else:
                recv(y)
                send(x)
        return run

    def tag_send(x):
        comm.Send([x, MPI.BYTE], peer, 5 * 16 + 1)

    def tag_recv(y):
        while (msg := comm.Improbe(peer, 5 * 16 + 1, status)) is None:
            pass
        assert status.Get_count(MPI.BYTE) == y.nbytes
        msg.Recv([y, MPI.BYTE])

    def header_send(x):
        n = x.nbytes
        if n <= small:
            packed = np.empty(head + n, np.uint8)
            packed[:head].view(np.int64)[:] = (n, 1)
            packed[head:] = x.view(np.uint8)
            comm.Send([packed, MPI.BYTE], peer, 5)
        else:
            MPI.Request.Waitall([comm.Isend([np.array([n, 1], np.int64), MPI.BYTE], peer, 5),
                                 comm.Isend([x, MPI.BYTE], peer, 5)])

    def header_recv(y, together=False):
        if together and y.nbytes > small:
            reqs = [comm.Irecv([box, MPI.BYTE], peer, 5), comm.Irecv([y, MPI.BYTE], peer, 5)]
            MPI.Request.Waitall(reqs)
            assert box[:head].view(np.int64)[0] == y.nbytes
            return
        comm.Recv([box, MPI.BYTE], peer, 5, status)
        assert box[:head].view(np.int64)[0] == y.nbytes
        got = status.Get_count(MPI.BYTE)
        if got > head:
            y.view(np.uint8)[:] = box[head:got]
        else:
            comm.Recv([y, MPI.BYTE], peer, 5)

    return {"tag+probe": pingpong(tag_send, tag_recv),
            "header": pingpong(header_send, header_recv),
            "header, posted together": pingpong(header_send,
                                                lambda y: header_recv(y, together=True))}


def _exchanges(comm: MPI.Comm, peer: int) -> dict:
    """Both directions at once, the receive probed or posted (module docstring)."""
    status = MPI.Status()

    def probed(x, y):
        req = comm.Isend([x, MPI.BYTE], peer, 6)
        while (msg := comm.Improbe(peer, 6, status)) is None:
            req.Test()
        msg.Recv([y, MPI.BYTE])
        req.Wait()

    def posted(x, y):
        MPI.Request.Waitall([comm.Irecv([y, MPI.BYTE], peer, 6), comm.Isend([x, MPI.BYTE], peer, 6)])

    return {"exchange, probed": probed, "exchange, posted": posted}


if __name__ == "__main__":
    main()
