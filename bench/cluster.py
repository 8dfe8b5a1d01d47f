"""An emulated multi-host cluster on one machine: hosts, links, a switch, and MPI jobs across them.

Usage (as root, Linux)::

    python bench/cluster.py run --hosts 2 --ranks-per-host 2 --rate 1gbit -- osu_allreduce --algorithm all
    python bench/cluster.py up --name c1 --hosts 4 --ranks-per-host 1 --rate 10gbit
    python bench/cluster.py run --name c1 -- python -m collectives.sgd --model wide
    python bench/cluster.py exec --name c1 node1 -- hostname
    python bench/cluster.py show --name c1          # hosts, addresses, the mpiexec line
    python bench/cluster.py down --name c1
    python bench/cluster.py check                    # can this machine build one?

What it builds (nothing outside the namespaces it creates is touched, and no address outside them
is ever used):

- a *switch*: a network namespace ``NAME-sw`` holding a Linux bridge ``br0`` and no address;
- a *host* per ``--hosts``: a network namespace ``NAME-node<i>`` with its own hostname ``node<i>``
  (a UTS namespace kept in ``/run/collectives-cluster/NAME/node<i>.uts``), a loopback, and an
  ``eth0`` with address ``<subnet>.<i+1>`` (``--subnet``, default 10.199.16.0/24, private, no
  gateway, no default route: packets can only reach the other hosts). ``eth0`` is one end of a
  veth pair whose other end (``p<i>``) is a port of the bridge;
- the link of each host is shaped in both directions by a token bucket (``tc tbf``, ``--rate``):
  on ``eth0`` (what the host sends) and on its switch port ``p<i>`` (what it receives). Links are
  per host, so two hosts talk at the full rate in both directions at once, as through a switch.
  ``--latency`` adds a one-way delay with ``netem`` on ``eth0`` where the kernel has netem
  (``check`` says; without it, ``--latency`` is refused before anything is built);
- ``--slow HOST:FACTOR`` (repeatable) makes a host a straggler: its processes run in a CPU
  cgroup of their own (``/sys/fs/cgroup/cpu/collectives-NAME-node<i>``, cgroup v1, or
  ``/sys/fs/cgroup/collectives-NAME-node<i>`` with ``cpu.max``, v2) whose quota is the host's
  ranks' cores divided by FACTOR (``node1:2``: each rank of node1 gets at most half a core, so it
  computes at most half as fast; the links stay as they are). ``run`` moves the host's processes
  into it (every 0.1 s, those ``ip netns pids`` lists) and ``exec`` starts its command there;
- ``/etc/netns/NAME-node<i>/hosts``: the hosts file ``ip netns exec`` shows inside host ``i``,
  naming every host (``node0 ... node<N-1>``), so MPI resolves them as on a real cluster;
- ``/run/collectives-cluster/NAME/``: ``cluster.json`` (what was built), ``enter`` (the
  launcher: ``enter HOST COMMAND...`` runs COMMAND on HOST as ``ssh HOST COMMAND`` would: in the
  host's network and UTS namespaces, its arguments joined and read by ``sh``) and ``hostfile``.

``run`` starts ``mpiexec`` on ``node0`` (as a user would log into the first node of a cluster)
with one rank per slot, host by host (``mpiexec -hosts node0:2,node1:2`` places ranks 0, 1 on
node0 and 2, 3 on node1), and MPI starts the other hosts' processes through ``enter`` instead of
ssh: MPICH's Hydra ``-launcher ssh -launcher-exec enter -hosts node0:2,...``; Open MPI
``--hostfile hostfile --mca plm_rsh_agent enter``. Inside a host ranks share memory (MPI's
shared-memory transport); between hosts MPI uses TCP over ``eth0`` (MPICH:
``MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=eth0``; Open MPI: the ``tcp`` BTL and
out-of-band channel on ``eth0``). ``osu_bw --matrix`` shows it: intra-host pairs at
shared-memory speed, inter-host pairs at the link rate.

``up`` is idempotent (a cluster already up with the same shape is left as it is; leftovers of an
interrupted one are removed first); ``run`` uses the cluster ``--name`` if it is up and otherwise
builds one for the run and tears it down afterwards, also when the command fails, on Ctrl-C, on
SIGTERM and SIGHUP; ``down`` removes whatever is left of one (ending the processes still running
inside its namespaces). ``--dry-run`` prints the commands instead.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["ClusterError", "Cluster", "check", "is_up", "up", "down", "mpiexec_line",
           "network_env", "run_argv", "exec_argv", "main"]

STATE_ROOT = Path("/run/collectives-cluster")
CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
#: the CFS period of a throttled host's cgroup (the kernel's default)
CFS_PERIOD_US = 100_000
NETNS_ETC = Path("/etc/netns")
DEFAULT_SUBNET = "10.199.16.0/24"
#: tc's rate units (``tc(8)``: bit, kbit ... are bits per second; bps, kbps ... bytes per second)
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
#: one token bucket's queueing limit: how long a packet may wait for tokens before it is dropped
TBF_LATENCY = "10ms"
#: The token bucket holds 1 ms of traffic, at least 128 KiB. Smaller buckets fail in two ways
#: (measured, 2 hosts x 2 ranks): below a 64 kB GSO packet (32 and 64 KiB) tbf splits every
#: packet, and allreduce took 2x as long with 2x the kernel time; 64 KiB at 10 Gbit/s held
#: osu_bw to 510 MB/s (1190 with 312 kB). Larger ones let the first bytes after a pause pass at
#: memory speed: with 250 kB (2 ms) at 1 Gbit/s a 1 MiB ping-pong took 6.9 ms one way, less than
#: the wire's 8.4 ms.
BURST_S = 1e-3
MIN_BURST = 128 << 10
#: the processes' own environment variables that choose the network, by MPI family
MPICH_NET_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0"}
#: (Open MPI also yields the core when idle: the hosts share this machine's cores, and ranks that
#: busy-poll starve the ones at work; without it an 8-byte ping-pong between hosts took 4-16 ms)
OPEN_MPI_NET_ENV = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,sm,tcp",
                    "OMPI_MCA_btl_tcp_if_include": "eth0", "OMPI_MCA_oob_tcp_if_include": "eth0",
                    "PRTE_MCA_oob_tcp_if_include": "eth0", "OMPI_MCA_mpi_yield_when_idle": "1"}


class ClusterError(RuntimeError):
    """Something about the cluster cannot be done; the message says what and why."""


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate (``1gbit``, ``100mbit``, ``125mbps``)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]+)", rate.strip().lower())
    if not m or m.group(2) not in _RATE_UNITS:
        raise ClusterError(f"--rate takes a tc rate such as 1gbit, 10gbit or 100mbit, got "
                           f"{rate!r} (units: {', '.join(_RATE_UNITS)})")
    bits = float(m.group(1)) * _RATE_UNITS[m.group(2)]
    if bits < 8e3:
        raise ClusterError(f"--rate {rate} is below 8 kbit/s")
    return bits


def seconds(text: str, what: str) -> float:
    """Seconds of a tc time (``50us``, ``1ms``)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]+)", text.strip().lower())
    if not m or m.group(2) not in _TIME_UNITS:
        raise ClusterError(f"{what} takes a time such as 50us or 1ms, got {text!r}")
    return float(m.group(1)) * _TIME_UNITS[m.group(2)]


@dataclass(frozen=True)
class Cluster:
    """The shape of one emulated cluster (validated on construction; raises ClusterError)."""

    name: str
    ranks: tuple[int, ...]  # ranks per host, host by host
    rate: str = "1gbit"
    latency: str | None = None
    burst: str | None = None  # tbf bucket; None: BURST_S of traffic, at least MIN_BURST bytes
    subnet: str = DEFAULT_SUBNET
    mtu: int = 1500
    slow: tuple[tuple[int, float], ...] = ()  # (host index, factor): CPU-throttled hosts
    _net: ipaddress.IPv4Network = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ClusterError(f"--name must be 1-32 lower-case letters, digits or '-', starting "
                               f"with a letter, got {self.name!r}")
        if not self.ranks or any(not isinstance(r, int) or r < 1 for r in self.ranks):
            raise ClusterError(f"every host needs at least one rank, got {list(self.ranks)}")
        rate_bits(self.rate)
        if self.latency is not None:
            seconds(self.latency, "--latency")
        if self.burst is not None and not re.fullmatch(r"\d+(b|kb|k|mb|m)?", self.burst.lower()):
            raise ClusterError(f"--burst takes a size such as 256kb, got {self.burst!r}")
        try:
            net = ipaddress.IPv4Network(self.subnet)
        except ValueError as exc:
            raise ClusterError(f"--subnet: {exc}") from None
        if not net.is_private or net.num_addresses - 2 < len(self.ranks):
            raise ClusterError(f"--subnet must be a private IPv4 network with room for "
                               f"{len(self.ranks)} hosts, got {self.subnet}")
        if not 576 <= self.mtu <= 65535:
            raise ClusterError(f"--mtu must be 576 ... 65535, got {self.mtu}")
        for host, factor in self.slow:
            if not 0 <= host < len(self.ranks) or not factor >= 1:
                raise ClusterError(f"--slow takes HOST:FACTOR with a host node0 ... "
                                   f"node{len(self.ranks) - 1} and a factor >= 1, got "
                                   f"node{host}:{factor}")
        object.__setattr__(self, "_net", net)

    @property
    def hosts(self) -> list[str]:
        return [f"node{i}" for i in range(len(self.ranks))]

    @property
    def size(self) -> int:
        return sum(self.ranks)

    @property
    def switch(self) -> str:
        return f"{self.name}-sw"

    def netns(self, i: int) -> str:
        return f"{self.name}-node{i}"

    def address(self, i: int) -> str:
        return str(self._net.network_address + i + 1)

    @property
    def state(self) -> Path:
        return STATE_ROOT / self.name

    def uts(self, i: int) -> Path:
        return self.state / f"node{i}.uts"

    @property
    def enter(self) -> Path:
        return self.state / "enter"

    @property
    def hostfile(self) -> Path:
        return self.state / "hostfile"

    def burst_bytes(self) -> str:
        if self.burst is not None:
            return self.burst
        return f"{max(MIN_BURST, int(rate_bits(self.rate) / 8 * BURST_S))}b"

    def cgroup(self, i: int) -> Path | None:
        """The CPU cgroup of host ``i`` if ``--slow`` throttles it, else None."""
        if i not in dict(self.slow):
            return None
        return (CGROUP_V2 if (CGROUP_V2 / "cgroup.controllers").exists() else CGROUP_V1) / \
            f"collectives-{self.netns(i)}"

    def describe(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        d["ranks"] = list(self.ranks)
        d["slow"] = [list(x) for x in self.slow]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Cluster":
        return cls(**{**d, "ranks": tuple(d["ranks"]),
                      "slow": tuple(tuple(x) for x in d.get("slow", ()))})


# ------------------------------------------------------------------ what can this machine do
def _probe(script: str) -> subprocess.CompletedProcess:
    """Run ``script`` in fresh, anonymous network and UTS namespaces (gone when it ends)."""
    return subprocess.run(["unshare", "--net", "--uts", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60)


def check(latency: bool = False) -> str | None:
    """Why no cluster can be built here, or None when one can (``latency``: netem too)."""
    if sys.platform != "linux":
        return "the emulated cluster needs Linux network namespaces"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "the emulated cluster needs root (network namespaces, veth, tc)"
    missing = [t for t in ("ip", "tc", "unshare", "nsenter") if shutil.which(t) is None]
    if missing:
        return f"missing tools: {', '.join(missing)} (iproute2, util-linux)"
    try:
        probe = _probe("ip link add b0 type bridge && ip link add v0 type veth peer name v1 && "
                       "tc qdisc add dev v0 root tbf rate 1gbit burst 64kb latency 10ms")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace: {exc}"
    if probe.returncode != 0:
        return ("this machine does not allow network namespaces with a bridge, veth pairs and "
                f"tbf: {(probe.stderr or probe.stdout).strip()}")
    if latency:
        probe = _probe("ip link add v0 type veth peer name v1 && "
                       "tc qdisc add dev v0 root netem delay 50us")
        if probe.returncode != 0:
            return ("--latency needs the netem qdisc (sch_netem), which this kernel does not "
                    f"have ({probe.stderr.strip()}); leave --latency out (tbf shapes the rate)")
    return None


# ------------------------------------------------------------------ building and removing
def _ip(*args: str) -> list[str]:
    return ["ip", *args]


def _shape(ns: str, dev: str, c: Cluster, delay: str | None) -> list[list[str]]:
    tbf = ["tbf", "rate", c.rate, "burst", c.burst_bytes(), "latency", TBF_LATENCY]
    if delay is None:
        return [["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *tbf]]
    # netem delays, its child tbf shapes (the tc-netem(8) recipe for delay with a rate)
    return [["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "netem",
             "delay", delay],
            ["tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf]]


def setup_commands(c: Cluster) -> list[list[str]]:
    """The commands that build the switch, the hosts and their shaped links (in order)."""
    sw = c.switch
    cmds = [_ip("netns", "add", sw),
            _ip("-n", sw, "link", "set", "lo", "up"),
            _ip("-n", sw, "link", "add", "br0", "type", "bridge"),
            _ip("-n", sw, "link", "set", "br0", "mtu", str(c.mtu), "up")]
    prefix = c._net.prefixlen
    for i in range(len(c.ranks)):
        ns, port = c.netns(i), f"p{i}"
        cmds += [_ip("netns", "add", ns),
                 # no IPv6 (no link-local chatter on the bridge), before any link comes up
                 ["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                  "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
                 _ip("-n", sw, "link", "add", port, "mtu", str(c.mtu), "type", "veth", "peer",
                     "name", "eth0", "mtu", str(c.mtu), "netns", ns),
                 _ip("-n", sw, "link", "set", port, "master", "br0", "up"),
                 _ip("-n", ns, "link", "set", "lo", "up"),
                 _ip("-n", ns, "addr", "add", f"{c.address(i)}/{prefix}", "dev", "eth0"),
                 _ip("-n", ns, "link", "set", "eth0", "up"),
                 *_shape(ns, "eth0", c, c.latency),
                 *_shape(sw, port, c, None),
                 ["unshare", f"--uts={c.uts(i)}", "hostname", c.hosts[i]]]
    return cmds


def enter_script(c: Cluster) -> str:
    """The launcher MPI calls instead of ssh: ``enter [ssh options] HOST COMMAND...``."""
    cases = "\n".join(f"  {h}) ns={c.netns(i)} uts={c.uts(i)};;" for i, h in enumerate(c.hosts))
    return f"""#!/bin/sh
# enter [ssh options] HOST COMMAND...: run COMMAND on HOST of the emulated cluster {c.name}, as
# "ssh HOST COMMAND" would (the arguments joined by spaces and read by sh), in HOST's network and
# UTS namespaces. MPICH's hydra (-launcher ssh -launcher-exec) and Open MPI (plm_rsh_agent) call
# it in place of ssh. Written by bench/cluster.py; removed by "bench/cluster.py down".
while [ $# -gt 0 ]; do
  case $1 in
    -[bcDEeFIiJLlmOoPpQRSWw]) shift 2;;
    -*) shift;;
    *) break;;
  esac
done
case $1 in
{cases}
  *) echo "enter: no host '$1' in the emulated cluster {c.name} (hosts: {' '.join(c.hosts)})" >&2
     exit 255;;
esac
shift
exec ip netns exec "$ns" nsenter --uts="$uts" -- sh -c "$*"
"""


def _procs(c: Cluster, i: int) -> str:
    """The file a process writes its pid to, to join host ``i``'s cgroup ('' if none). Only from
    outside the hosts: ``ip netns exec`` mounts a sysfs of its own over ``/sys`` (no cgroups under
    it) for everything started inside one, so :func:`_throttler` moves those processes."""
    cg = c.cgroup(i)
    return "" if cg is None else str(cg / "cgroup.procs")


def _throttler(c: Cluster, stop: "threading.Event", period_s: float = 0.1) -> None:
    """Until ``stop``: every ``period_s`` move the processes of every ``--slow`` host (``ip netns
    pids``) into its cgroup (the ranks that MPI starts there through ``enter``)."""
    while not stop.wait(period_s):
        for i, _ in c.slow:
            pids = subprocess.run(["ip", "netns", "pids", c.netns(i)], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    with open(_procs(c, i), "w") as fh:
                        fh.write(pid)
                except OSError:  # it ended meanwhile
                    pass


def throttle(c: Cluster) -> None:
    """Make the CPU cgroups of the ``--slow`` hosts: the host's ranks' cores divided by the
    factor."""
    for i, factor in c.slow:
        cg = c.cgroup(i)
        cg.mkdir(exist_ok=True)
        quota = max(1000, int(c.ranks[i] * CFS_PERIOD_US / factor))
        if cg.parent == CGROUP_V2:
            (cg / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}\n")
        else:
            (cg / "cpu.cfs_period_us").write_text(f"{CFS_PERIOD_US}\n")
            (cg / "cpu.cfs_quota_us").write_text(f"{quota}\n")


def _hosts_file(c: Cluster) -> str:
    lines = ["127.0.0.1 localhost"] + [f"{c.address(i)} {h}" for i, h in enumerate(c.hosts)]
    return "\n".join(lines) + "\n"


def _write_files(c: Cluster, complete: bool) -> None:
    c.state.mkdir(parents=True, exist_ok=True)
    (c.state / "cluster.json").write_text(json.dumps({**c.describe(), "complete": complete},
                                                     indent=1) + "\n")
    if complete:
        return
    c.enter.write_text(enter_script(c))
    c.enter.chmod(0o755)
    c.hostfile.write_text("".join(f"{h} slots={r}\n" for h, r in zip(c.hosts, c.ranks)))
    for i in range(len(c.ranks)):
        c.uts(i).touch()
        etc = NETNS_ETC / c.netns(i)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(_hosts_file(c))


def _existing_netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def read_state(name: str) -> tuple[Cluster | None, bool]:
    """(the cluster ``name`` as recorded, whether it was completely built)."""
    path = STATE_ROOT / name / "cluster.json"
    try:
        data = json.loads(path.read_text())
        complete = bool(data.pop("complete", False))
        return Cluster.from_dict(data), complete
    except (OSError, ValueError, TypeError, ClusterError):
        return None, False


def is_up(name: str) -> Cluster | None:
    """The cluster ``name`` if it is completely built and all its namespaces exist."""
    c, complete = read_state(name)
    if c is None or not complete:
        return None
    wanted = {c.switch, *(c.netns(i) for i in range(len(c.ranks)))}
    return c if wanted <= _existing_netns() else None


def _end_processes(namespaces: list[str], existing: set[str]) -> None:
    """End the processes still running in our namespaces (SIGTERM, then SIGKILL)."""
    import time

    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
        pids = set()
        for ns in namespaces:
            if ns in existing:
                out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                     text=True).stdout
                pids |= {int(p) for p in out.split() if p.isdigit()}
        pids.discard(os.getpid())
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def down(name: str, quiet: bool = False) -> bool:
    """Remove everything of cluster ``name`` that exists; True if there was anything."""
    c, _ = read_state(name)
    existing = _existing_netns()
    pattern = re.compile(rf"^{re.escape(name)}-(sw|node\d+)$")
    namespaces = sorted(ns for ns in existing if pattern.match(ns))
    if c is not None:
        namespaces = sorted(set(namespaces) | ({c.switch} | {c.netns(i) for i in
                                                               range(len(c.ranks))}) & existing)
    state = STATE_ROOT / name
    found = bool(namespaces) or state.exists()
    _end_processes(namespaces, existing)
    for uts in sorted(state.glob("node*.uts")) if state.exists() else []:
        subprocess.run(["umount", str(uts)], capture_output=True)
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
    if c is not None:
        for i in range(len(c.ranks)):
            shutil.rmtree(NETNS_ETC / c.netns(i), ignore_errors=True)
            cg = c.cgroup(i)
            if cg is not None and cg.exists():
                try:
                    cg.rmdir()  # empty now: its processes ended above
                except OSError:
                    pass
    shutil.rmtree(state, ignore_errors=True)
    if found and not quiet:
        print(f"cluster: {name} is down", file=sys.stderr)
    return found


def up(c: Cluster, quiet: bool = False) -> bool:
    """Build ``c`` unless it is up already (then check it has the same shape); True if built.

    Leftovers of an interrupted build or teardown of the same name are removed first. A failed
    build is taken down again before the error is raised.
    """
    standing = is_up(c.name)
    if standing is not None:
        if standing != c:
            raise ClusterError(f"cluster {c.name} is up with another shape ({standing.describe()});"
                               f" take it down first: bench/cluster.py down --name {c.name}")
        return False
    problem = check(latency=c.latency is not None)
    if problem:
        raise ClusterError(problem)
    down(c.name, quiet=True)
    try:
        _write_files(c, complete=False)
        for cmd in setup_commands(c):
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise ClusterError(f"{shlex.join(cmd)} failed (exit {done.returncode}): "
                                   f"{(done.stderr or done.stdout).strip()}")
        throttle(c)
        _write_files(c, complete=True)
    except BaseException:
        down(c.name, quiet=True)
        raise
    if not quiet:
        print(f"cluster: {c.name} is up: {len(c.ranks)} hosts "
              f"({', '.join(f'{h}:{r}' for h, r in zip(c.hosts, c.ranks))}), links {c.rate}"
              + (f" + {c.latency} delay" if c.latency else "")
              + "".join(f", node{i} slowed {f:g}x (CPU)" for i, f in c.slow), file=sys.stderr)
    return True


# ------------------------------------------------------------------ running on it
def _mpiexec(path: str | None) -> tuple[str, str]:
    """(mpiexec path, vendor): ``path`` or collectives' choice (COLLECTIVES_MPIEXEC, the venv's)."""
    from collectives.tools.launch import find_mpiexec, mpiexec_vendor

    try:
        found = path or find_mpiexec()
    except FileNotFoundError as exc:
        raise ClusterError(str(exc)) from None
    vendor = mpiexec_vendor(found)
    if vendor == "unknown":
        raise ClusterError(f"{found} is neither MPICH's (Hydra) nor Open MPI's mpiexec; "
                           "give one with --mpiexec")
    return found, vendor


def mpiexec_line(c: Cluster, mpiexec: str, vendor: str) -> list[str]:
    """The mpiexec command that places ``c.size`` ranks host by host over ``c``'s hosts."""
    if vendor == "Open MPI":
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        return [mpiexec, *root, "--hostfile", str(c.hostfile), "--mca", "plm_rsh_agent",
                str(c.enter), "--map-by", "slot", "-n", str(c.size)]
    hosts = ",".join(f"{h}:{r}" for h, r in zip(c.hosts, c.ranks))
    return [mpiexec, "-launcher", "ssh", "-launcher-exec", str(c.enter), "-hosts", hosts,
            "-n", str(c.size)]


def network_env(vendor: str) -> dict[str, str]:
    """Environment that sends MPI's inter-host traffic over TCP on ``eth0`` (shared memory
    stays inside a host)."""
    return dict(OPEN_MPI_NET_ENV if vendor == "Open MPI" else MPICH_NET_ENV)


def exec_argv(c: Cluster, i: int, command: list[str], env: dict[str, str] | None = None) -> list[str]:
    """``command`` on host ``i`` of ``c`` (its network and UTS namespaces, its hosts file)."""
    pairs = [f"{k}={v}" for k, v in (env or {}).items()]
    join = [] if c.cgroup(i) is None else \
        ["sh", "-c", f'echo $$ > {_procs(c, i)} && exec "$@"', "sh"]  # a --slow host
    return [*join, "ip", "netns", "exec", c.netns(i), "nsenter", f"--uts={c.uts(i)}", "--",
            *(["env", *pairs] if pairs else []), *command]


def run_argv(c: Cluster, command: list[str], mpiexec: str, vendor: str) -> list[str]:
    """The whole job: ``mpiexec ... command`` started on node0 with the network environment.

    The directory of the running Python goes first on PATH, so console scripts of this
    environment (``osu_allreduce``) are found on every host.
    """
    env = {**network_env(vendor), "COLLECTIVES_CLUSTER": c.name,
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return exec_argv(c, 0, [*mpiexec_line(c, mpiexec, vendor), *command], env)


def _terminate(signum, frame):
    raise KeyboardInterrupt


def _stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def run(c: Cluster, command: list[str], mpiexec: str | None = None) -> int:
    """Run ``command`` as one MPI job on ``c`` (built for the run unless it is up); exit status."""
    path, vendor = _mpiexec(mpiexec)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    built = False
    child = None
    stop = threading.Event()
    try:
        built = up(c)
        if c.slow:
            threading.Thread(target=_throttler, args=(c, stop), daemon=True).start()
        child = subprocess.Popen(run_argv(c, command, path, vendor))
        return child.wait()
    except KeyboardInterrupt:
        if child is not None:
            _stop(child)
        return 130
    finally:
        stop.set()
        if built:
            down(c.name)


# ------------------------------------------------------------------ command line
def _ranks(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes N or N,N,... (ranks on each host), got {text!r}")
    return values


def _slow(text: str) -> tuple[int, float]:
    host, _, factor = text.partition(":")
    try:
        return int(host[4:] if host.startswith("node") else host), float(factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes HOST:FACTOR (node1:2), got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench/cluster.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="action", required=True)
    shape = argparse.ArgumentParser(add_help=False)
    shape.add_argument("--hosts", type=int, help="number of hosts (default 2)")
    shape.add_argument("--ranks-per-host", type=_ranks, metavar="N|N,N,...",
                       help="ranks on each host, or a list for unequal hosts (3,1); default 2")
    shape.add_argument("--rate", help="link rate of every host, tc syntax (default 1gbit)")
    shape.add_argument("--latency", help="one-way delay per link, e.g. 50us (needs netem)")
    shape.add_argument("--burst", help="token bucket size (default 1 ms of traffic, >= 128 KiB)")
    shape.add_argument("--subnet", help=f"private IPv4 network of the hosts ({DEFAULT_SUBNET})")
    shape.add_argument("--mtu", type=int, help="MTU of every link (default 1500)")
    shape.add_argument("--slow", action="append", type=_slow, metavar="HOST:FACTOR",
                       help="a straggler: HOST's ranks get 1/FACTOR of a core each (a CPU "
                            "cgroup), e.g. node1:2; repeatable")
    name = argparse.ArgumentParser(add_help=False)
    name.add_argument("--name", help="cluster name (up/down/show default: collectives; run: a "
                                     "private one unless given)")
    dry = argparse.ArgumentParser(add_help=False)
    dry.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    mpi = argparse.ArgumentParser(add_help=False)
    mpi.add_argument("--mpiexec", help="mpiexec to use (default: the one collectives launches "
                                       "with: $COLLECTIVES_MPIEXEC, this Python's, PATH's)")
    cmd = argparse.ArgumentParser(add_help=False)
    cmd.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    sub.add_parser("run", parents=[name, shape, mpi, dry, cmd],
                   help="run COMMAND as one MPI job across the cluster")
    sub.add_parser("up", parents=[name, shape, dry], help="build a cluster and leave it up")
    sub.add_parser("down", parents=[name], help="take a cluster down")
    sub.add_parser("show", parents=[name, mpi], help="hosts, addresses and the mpiexec line")
    ex = sub.add_parser("exec", parents=[name], help="run COMMAND on one host (like ssh)")
    ex.add_argument("host", help="node0, node1, ...")
    ex.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    ck = sub.add_parser("check", help="say whether this machine can build a cluster")
    ck.add_argument("--latency", action="store_true", help="also check for netem")
    return ap


def _shape_of(args: argparse.Namespace, name: str) -> Cluster:
    hosts = args.hosts
    per = args.ranks_per_host
    if per is not None and len(per) > 1:
        if hosts is not None and hosts != len(per):
            raise ClusterError(f"--hosts {hosts} but --ranks-per-host lists {len(per)} hosts")
        ranks = tuple(per)
    else:
        if hosts is not None and hosts < 1:
            raise ClusterError(f"--hosts must be at least 1, got {hosts}")
        ranks = ((per or [2])[0],) * (2 if hosts is None else hosts)
    given = {k: getattr(args, k) for k in ("rate", "latency", "burst", "subnet", "mtu")
             if getattr(args, k) is not None}
    return Cluster(name=name, ranks=ranks, slow=tuple(args.slow or ()), **given)


def _given_shape(args: argparse.Namespace) -> bool:
    return any(getattr(args, k) is not None for k in
               ("hosts", "ranks_per_host", "rate", "latency", "burst", "subnet", "mtu", "slow"))


def _command(args: argparse.Namespace, ap: argparse.ArgumentParser) -> list[str]:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error(f"{args.action}: give the command to run after --")
    return command


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        return _main(args, ap)
    except ClusterError as exc:
        print(f"cluster: error: {exc}", file=sys.stderr)
        return 1


def _main(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    if args.action == "check":
        problem = check(latency=args.latency)
        print(problem or "ok: this machine can build an emulated cluster"
              + (" (with netem delay)" if args.latency else ""))
        return 1 if problem else 0
    if args.action == "down":
        if not down(args.name or "collectives"):
            print(f"cluster: no cluster named {args.name or 'collectives'}", file=sys.stderr)
        return 0
    if args.action in ("show", "exec"):
        name = args.name or "collectives"
        c = is_up(name)
        if c is None:
            raise ClusterError(f"cluster {name} is not up (bench/cluster.py up --name {name})")
        if args.action == "exec":
            if args.host not in c.hosts:
                raise ClusterError(f"no host {args.host!r} in {name}; hosts: {', '.join(c.hosts)}")
            return subprocess.run(exec_argv(c, c.hosts.index(args.host),
                                            _command(args, ap))).returncode
        path, vendor = _mpiexec(args.mpiexec)
        print(json.dumps(c.describe()))
        for i, h in enumerate(c.hosts):
            print(f"{h}: {c.address(i)}, {c.ranks[i]} ranks, netns {c.netns(i)}")
        print("run a job: " + shlex.join(run_argv(c, ["COMMAND"], path, vendor)))
        return 0
    if args.action == "up":
        c = _shape_of(args, args.name or "collectives")
        if args.dry_run:
            for cmd in setup_commands(c):
                print(shlex.join(cmd))
            return 0
        up(c)
        return 0
    # run
    command = _command(args, ap)
    if args.name and not _given_shape(args) and is_up(args.name):
        c = is_up(args.name)
    else:
        c = _shape_of(args, args.name or f"ccl{os.getpid()}")
    if args.dry_run:
        path, vendor = _mpiexec(args.mpiexec)
        for cmd in [*([] if is_up(c.name) else setup_commands(c)),
                    run_argv(c, command, path, vendor)]:
            print(shlex.join(cmd))
        return 0
    return run(c, command, args.mpiexec)


if __name__ == "__main__":
    sys.exit(main())
