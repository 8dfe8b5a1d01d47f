"""The emulated multi-host cluster (bench/cluster.py): its pieces, and real jobs across it.

The first tests need nothing special: they check the cluster's shape, the commands it would run
and the mpiexec lines it writes. The others build real clusters (network namespaces, a bridge,
veth pairs shaped with tbf) and need root on Linux; where this machine does not allow that they
skip, saying why (``bench/cluster.py check``). CI runs as root, so they run there: a 2-host
cluster of 2 ranks each runs every allreduce algorithm's sweep across the hosts and checks that
"hierarchical" finds the 2 hosts as its nodes (tests/mpi/cluster_checks.py); a 3 + 1 cluster
checks unequal nodes; and set-up, idempotence and teardown are checked on every exit path.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "cluster.py"
spec = importlib.util.spec_from_file_location("bench_cluster", SCRIPT)
cluster = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = cluster  # dataclasses look their module up there
spec.loader.exec_module(cluster)

JOB_TIMEOUT_S = 600  # a hang guard: the 2x2 sweep took 55 s quiet, 214-300 s under heavy load


# ------------------------------------------------------------------ no root needed
def test_shape_is_validated():
    c = cluster.Cluster("t1", (2, 2))
    assert c.hosts == ["node0", "node1"] and c.size == 4
    assert [c.address(i) for i in range(2)] == ["10.199.16.1", "10.199.16.2"]
    for bad, text in [(dict(name="Bad_Name", ranks=(2,)), "--name"),
                      (dict(name="t", ranks=()), "at least one rank"),
                      (dict(name="t", ranks=(2, 0)), "at least one rank"),
                      (dict(name="t", ranks=(2,), rate="fast"), "--rate"),
                      (dict(name="t", ranks=(2,), latency="soon"), "--latency"),
                      (dict(name="t", ranks=(2,), subnet="8.8.8.0/24"), "private"),
                      (dict(name="t", ranks=(2,) * 3, subnet="10.0.0.0/31"), "room"),
                      (dict(name="t", ranks=(2,), mtu=100), "--mtu"),
                      (dict(name="t", ranks=(2, 2), slow=((2, 2.0),)), "--slow"),
                      (dict(name="t", ranks=(2, 2), slow=((1, 0.5),)), "--slow")]:
        with pytest.raises(cluster.ClusterError, match=text):
            cluster.Cluster(**bad)


def test_rate_and_time_units():
    assert cluster.rate_bits("1gbit") == 1e9
    assert cluster.rate_bits("125mbps") == 1e9
    assert cluster.seconds("50us", "--latency") == pytest.approx(50e-6)
    assert cluster.Cluster("t", (1,), rate="10gbit").burst_bytes() == "1250000b"  # 1 ms
    assert cluster.Cluster("t", (1,), rate="1gbit").burst_bytes() == f"{128 << 10}b"


def test_setup_shapes_both_ends_of_every_link_inside_our_namespaces():
    c = cluster.Cluster("t2", (3, 1), rate="1gbit", latency="50us")
    cmds = cluster.setup_commands(c)
    ours = {c.switch, c.netns(0), c.netns(1)}
    for cmd in cmds:
        if cmd[:2] == ["ip", "netns"]:
            assert cmd[3] in ours, cmd          # add / exec: only our namespaces
        elif cmd[0] in ("ip", "tc"):
            assert cmd[1] == "-n" and cmd[2] in ours, cmd  # every link and qdisc inside them
    tbf = [(cmd[2], cmd[cmd.index("dev") + 1]) for cmd in cmds if cmd[0] == "tc" and "tbf" in cmd]
    assert sorted(tbf) == sorted([(c.netns(0), "eth0"), (c.switch, "p0"),
                                  (c.netns(1), "eth0"), (c.switch, "p1")])
    netem = [cmd for cmd in cmds if "netem" in cmd]
    assert len(netem) == 2 and all(cmd[2] != c.switch for cmd in netem)  # delay once per path
    assert not any("default" in cmd or "route" in cmd for cmd in cmds)


def test_mpiexec_lines_place_ranks_host_by_host():
    c = cluster.Cluster("t3", (3, 1))
    hydra = cluster.mpiexec_line(c, "mpiexec", "MPICH")
    assert hydra[hydra.index("-hosts") + 1] == "node0:3,node1:1"
    assert hydra[hydra.index("-launcher-exec") + 1] == str(c.enter)
    assert hydra[-2:] == ["-n", "4"]
    ompi = cluster.mpiexec_line(c, "mpiexec", "Open MPI")
    assert ompi[ompi.index("plm_rsh_agent") + 1] == str(c.enter)
    assert ompi[ompi.index("--hostfile") + 1] == str(c.hostfile)
    argv = cluster.run_argv(c, ["osu_bw"], "mpiexec", "MPICH")
    assert argv[:4] == ["ip", "netns", "exec", c.netns(0)]  # mpiexec starts on node0
    assert "FI_PROVIDER=tcp" in argv and "MPIR_CVAR_CH4_NETMOD=ofi" in argv
    assert argv[-1] == "osu_bw"


def test_enter_script_names_every_host():
    c = cluster.Cluster("t4", (1, 1, 1))
    text = cluster.enter_script(c)
    for i in range(3):
        assert f"node{i}) ns={c.netns(i)} uts={c.uts(i)};;" in text


def test_dry_run_prints_commands(capsys):
    assert cluster.main(["up", "--name", "t5", "--hosts", "2", "--rate", "10gbit",
                         "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "ip netns add t5-sw" in out and "tbf rate 10gbit" in out


def test_bad_command_lines_fail_clearly(capsys):
    assert cluster.main(["up", "--name", "t6", "--hosts", "3", "--ranks-per-host", "2,2",
                         "--dry-run"]) == 1
    assert "--hosts 3 but --ranks-per-host lists 2 hosts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cluster.main(["run", "--name", "t6", "--dry-run"])  # no command


# ------------------------------------------------------------------ real clusters (root)
PROBLEM = cluster.check()
needs_namespaces = pytest.mark.skipif(PROBLEM is not None, reason=f"no emulated cluster here: "
                                                                  f"{PROBLEM}")
# the clusters run after the multi-rank jobs (after_mpi), whose ranks fill the Numba cache
# that these clusters' ranks read (docs/testing.md, "Where the time goes")


def _cli(*args):
    """bench/cluster.py ARGS; on a timeout it gets SIGTERM (so it takes its cluster down)."""
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"bench/cluster.py {' '.join(args)} took over {JOB_TIMEOUT_S} s:\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _ours(name):
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [line.split()[0] for line in netns.splitlines() if line.startswith(f"{name}-")]
    files = [p for p in (cluster.STATE_ROOT / name, *cluster.NETNS_ETC.glob(f"{name}-*"))
             if p.exists()]
    return left + [str(p) for p in files]


def _root_links():
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def _results(logdir, size):
    """Each rank's final outcome per test (tests/mpi/runner.py's results files)."""
    outcomes = []
    for rank in range(size):
        lines = (logdir / f"rank{rank}.results").read_text().splitlines()
        ends = {e["nodeid"]: e for e in map(json.loads, lines) if e.get("event") == "end"}
        outcomes.append(ends)
    return outcomes


def _run_checks(tmp_path, name, per_host, *pytest_args):
    logdir = tmp_path / "logs"
    job = _cli("run", "--name", name, "--ranks-per-host", per_host, "--rate", "10gbit", "--",
               sys.executable, str(ROOT / "tests" / "mpi" / "runner.py"), str(logdir),
               str(ROOT / "tests" / "mpi" / "cluster_checks.py"), *pytest_args)
    size = sum(int(r) for r in per_host.split(","))
    logs = "\n".join((logdir / f"rank{r}.log").read_text()[-3000:] for r in range(size)
                     if (logdir / f"rank{r}.log").exists())
    # MPI_Finalize too: over OFI/TCP it failed ("OFI call fabricclose failed: Device or resource
    # busy") while COMM_WORLD's context kept its shared windows open (_runtime/context.py frees
    # them)
    assert job.returncode == 0, f"{job.stderr}\n{logs}"
    outcomes = _results(logdir, size)
    for rank, ends in enumerate(outcomes):
        bad = {k: e["outcome"] for k, e in ends.items() if e["outcome"] != "passed"}
        assert ends and not bad, f"rank {rank}: {bad}\n{logs}"
    assert _ours(name) == [], "the cluster was not taken down"
    return outcomes[0]


@needs_namespaces
@pytest.mark.after_mpi
def test_two_hosts_of_two_ranks_every_algorithm(tmp_path):
    """2 hosts x 2 ranks: hierarchical finds the 2 hosts; every algorithm's sweep across them."""
    before = _root_links()
    passed = _run_checks(tmp_path, f"ct{os.getpid()}a", "2,2")
    names = " ".join(passed)
    assert "test_hierarchical_finds_the_hosts" in names
    import collectives

    for algorithm in collectives.ALGORITHMS:
        assert f"test_allreduce_sweep_across_hosts[{algorithm}-np4]" in names
    assert _root_links() == before  # nothing changed outside the cluster's namespaces


@needs_namespaces
@pytest.mark.after_mpi
def test_unequal_hosts_three_and_one(tmp_path):
    passed = _run_checks(tmp_path, f"ct{os.getpid()}b", "3,1", "-k",
                         "finds_the_hosts or placed or hierarchical")
    assert any("hierarchical_large_odd" in k for k in passed)


@needs_namespaces
def test_a_slow_host_computes_slower(tmp_path):
    """--slow node1:8: node1's rank gets an eighth of a core (a CPU cgroup), node0's is left
    alone; the cgroup is gone after the run. (An eighth, not a quarter: on a machine loaded by
    other jobs node0's rank too may get a quarter of a core, and its ratio must stay below.)"""
    name = f"ct{os.getpid()}s"
    spin = tmp_path / "spin.py"
    # the slow host's rank starts timing once `run` has moved it into its cgroup (it looks every
    # 0.1 s: under load a short spin could end before that)
    spin.write_text("import time\nfrom mpi4py import MPI\n"
                    "end = time.monotonic() + 30\n"
                    "while MPI.COMM_WORLD.rank == 1 and time.monotonic() < end and "
                    "'collectives-' not in open('/proc/self/cgroup').read():\n"
                    "    time.sleep(0.01)\n"
                    "w, c = time.perf_counter(), time.process_time()\n"
                    "x = sum(range(20_000_000))\n"
                    "print('rank', MPI.COMM_WORLD.rank, (time.perf_counter() - w) /"
                    " (time.process_time() - c), flush=True)\n")
    job = _cli("run", "--name", name, "--hosts", "2", "--ranks-per-host", "1", "--slow",
               "node1:8", "--", sys.executable, str(spin))
    assert job.returncode == 0, job.stderr
    ratio = {int(line.split()[1]): float(line.split()[2]) for line in job.stdout.splitlines()
             if line.startswith("rank ")}
    assert ratio[1] > 5 and ratio[1] > 1.5 * ratio[0], ratio  # wall / CPU time
    assert not cluster.Cluster(name, (1, 1), slow=((1, 8.0),)).cgroup(1).exists()
    assert _ours(name) == []


@needs_namespaces
def test_up_is_idempotent_and_down_removes_everything():
    name = f"ct{os.getpid()}c"
    try:
        first = _cli("up", "--name", name, "--hosts", "2", "--ranks-per-host", "1")
        assert first.returncode == 0, first.stderr
        again = _cli("up", "--name", name, "--hosts", "2", "--ranks-per-host", "1")
        assert again.returncode == 0 and "is up" not in again.stderr  # left as it was
        other = _cli("up", "--name", name, "--hosts", "3")
        assert other.returncode == 1 and "another shape" in other.stderr
        c = cluster.is_up(name)
        # the launcher MPI calls instead of ssh: ssh options skipped, the host's namespaces
        out = subprocess.run([str(c.enter), "-x", "node1", "hostname;", "ip", "route"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == "node1"
        assert [s.strip() for s in lines[1:]] == [f"{c._net} dev eth0 proto kernel scope link src {c.address(1)}"]
        unknown = subprocess.run([str(c.enter), "node7", "true"], capture_output=True, text=True)
        assert unknown.returncode == 255 and "no host 'node7'" in unknown.stderr
        hosts = _cli("exec", "--name", name, "node0", "--", "getent", "hosts", "node1")
        assert hosts.stdout.split() == [c.address(1), "node1"]
    finally:
        down = _cli("down", "--name", name)
    assert down.returncode == 0
    assert _ours(name) == []
    assert "no cluster" in _cli("down", "--name", name).stderr  # idempotent


@needs_namespaces
def test_run_tears_down_after_failure_and_on_sigterm():
    name = f"ct{os.getpid()}d"
    failed = _cli("run", "--name", name, "--hosts", "2", "--ranks-per-host", "1", "--",
                  sys.executable, "-c", "import sys; sys.exit(3)")
    assert failed.returncode != 0
    assert _ours(name) == []
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "run", "--name", name, "--hosts", "2",
                             "--ranks-per-host", "1", "--", "sleep", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and cluster.is_up(name) is None:
            time.sleep(0.1)
        assert cluster.is_up(name) is not None
        time.sleep(1.0)  # let mpiexec start the sleeps on both hosts
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            _cli("down", "--name", name)
    assert proc.returncode == 130
    assert _ours(name) == []
