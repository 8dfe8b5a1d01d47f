"""Run a command on an emulated cluster network: a network namespace with a shaped loopback.

Usage (as root)::

    python bench/netem.py --rate 1gbit -- mpiexec -n 2 osu_bw
    python bench/netem.py --rate 10gbit -- mpiexec -n 4 osu_allreduce --algorithm all

Steps: create the namespace ``NAME`` (``ip netns add``), bring its loopback up, shape it with a
token bucket (``tc qdisc add dev lo root tbf rate RATE burst BURST latency LATENCY``; netem is not
available on every kernel, tbf is), then run the command inside it with MPICH forced onto TCP
(``MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp``), so every message crosses the
shaped loopback as it would cross a cluster's network instead of shared memory. The namespace is
deleted afterwards, also when the command fails, on Ctrl-C and on SIGTERM. Only the namespace's
own loopback is touched. Both directions of an exchange share the one shaped device, so a
bidirectional exchange sees half the rate each way.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys

__all__ = ["MPI_TCP_ENV", "setup_commands", "run_command", "teardown_command", "main"]

#: MPICH settings that send every message through the TCP network module.
MPI_TCP_ENV = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}


def setup_commands(name: str, rate: str, burst: str, latency: str) -> list[list[str]]:
    """Commands that create the namespace and shape its loopback."""
    inside = ["ip", "netns", "exec", name]
    return [["ip", "netns", "add", name],
            [*inside, "ip", "link", "set", "lo", "up"],
            [*inside, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate,
             "burst", burst, "latency", latency]]


def run_command(name: str, command: list[str], mpi_tcp: bool = True) -> list[str]:
    """The user's command inside the namespace, with MPICH forced to TCP unless told not to."""
    env = [f"{k}={v}" for k, v in MPI_TCP_ENV.items()] if mpi_tcp else []
    return ["ip", "netns", "exec", name, "env", *env, *command]


def teardown_command(name: str) -> list[str]:
    return ["ip", "netns", "del", name]


def _terminate(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="1gbit", help="link rate for tc tbf (default 1gbit)")
    ap.add_argument("--burst", default="256kb", help="token bucket size (default 256kb)")
    ap.add_argument("--latency", default="10ms", help="tbf queueing limit (default 10ms)")
    ap.add_argument("--name", default=f"collectives-netem-{os.getpid()}", help="namespace name")
    ap.add_argument("--no-mpi-tcp", action="store_true", help="do not force MPICH onto TCP")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to run after --")
    setup = setup_commands(args.name, args.rate, args.burst, args.latency)
    run = run_command(args.name, command, not args.no_mpi_tcp)
    if args.dry_run:
        for cmd in [*setup, run, teardown_command(args.name)]:
            print(shlex.join(cmd))
        return 0
    signal.signal(signal.SIGTERM, _terminate)
    child = None
    created = False
    try:
        subprocess.run(setup[0], check=True)
        created = True
        for cmd in setup[1:]:
            subprocess.run(cmd, check=True)
        child = subprocess.Popen(run)
        return child.wait()
    except KeyboardInterrupt:
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        return 130
    except subprocess.CalledProcessError as exc:
        print(f"netem: {shlex.join(exc.cmd)} failed (exit {exc.returncode}); are you root?",
              file=sys.stderr)
        return 1
    finally:
        if created:
            subprocess.run(teardown_command(args.name), check=False)


if __name__ == "__main__":
    sys.exit(main())
