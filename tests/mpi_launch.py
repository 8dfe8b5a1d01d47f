"""The multi-rank tests as ordinary pytest items, one per test and world size (a pytest plugin).

A multi-rank test is any test that uses the ``mpi_world_size`` fixture (``tests/mpi/conftest.py``
gives it to every test of ``tests/mpi/mpi_*.py``, automatically); each such test also gets
pytest-mpi's ``mpi`` marker. It runs in one of two ways:

Inside the ranks, under ``mpiexec`` with pytest-mpi's ``--with-mpi``
    (``mpiexec -n 4 python -m pytest --with-mpi tests/mpi``): the tests run as usual on every rank,
    parametrized with the one world size there is (ids end in ``np4``). A failure is printed at once
    and aborts the job (``MPI_Abort``), so no rank waits forever for one that failed;
    ``COLLECTIVES_TEST_NO_ABORT=1`` lets the ranks go on instead. ``--mpi-log-dir DIR`` records
    each rank's progress (``DIR/rank<k>.progress``) and outcomes (``rank<k>.results``, JSON lines);
    ``tests/mpi/runner.py DIR`` also sends each rank's output to ``rank<k>.log``;
    ``--mpi-select FILE`` runs only the node ids listed.

Under ``mpiexec`` without ``--with-mpi``
    pytest-mpi skips them ("need --with-mpi option to run"); no rank ever starts jobs of its own.

From a plain ``python -m pytest`` (no ``--with-mpi``, not under ``mpiexec``)
    every multi-rank test becomes one item per world size in ``--mpi-world-sizes`` (default
    1,2,3,4,5,7,8; or ``$COLLECTIVES_TEST_WORLD_SIZES``), e.g.
    ``tests/mpi/mpi_allreduce.py::test_allreduce_sweep[world-numpy-ring-np4]``, so ``-k``,
    ``-m``, ``--lf``, ``-x`` and an IDE's "run this test" select them like any test. The selected
    items of one world size run together in one ``mpiexec`` job (the items are ordered by world
    size, so the jobs run one after another; starting a job per test would cost hundreds of
    launches), and each item reports what its ranks reported: passed, skipped, or failed with each
    failing rank's traceback. A job that aborts after a failure, or crashes, is started again for
    the tests it did not reach. ``--durations=0`` gives each item's time (the first item of a
    job includes the job's start). A test during which no rank finishes anything for
    ``--mpi-timeout`` seconds (default 300) fails as a hang, naming the test each rank was in, and
    the job is killed. Logs of a failing job stay in the directory its failure message names.

Which world sizes a test runs at
    ``@pytest.mark.world_sizes(1, 2, 4)`` on a test, or as a module's ``pytestmark``, restricts it
    to those of ``--mpi-world-sizes`` (the closest mark wins: a test's own over its module's;
    ``world_sizes()`` with no sizes: every size); pytest-mpi's ``@pytest.mark.mpi(min_size=2)``
    leaves out the sizes below. A test that no size of the run allows is deselected. Inside the
    ranks a test that is not allowed at this world size is deselected too, so
    ``mpiexec -n 3 python -m pytest --with-mpi tests/mpi`` runs what the outer run runs at 3 ranks.
    ``--mpi-every-size`` (or ``COLLECTIVES_TEST_EVERY_SIZE=1``) ignores the ``world_sizes`` marks
    (not ``min_size``): every multi-rank test at every size of ``--mpi-world-sizes``. Which
    properties need which sizes: docs/testing.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import backtrace

FIXTURE = "mpi_world_size"
RUNNER = Path(__file__).resolve().parent / "mpi" / "runner.py"
WORLD_SIZES = (1, 2, 3, 4, 5, 7, 8)
TIMEOUT_S = 300.0
POLL_S = 0.02
#: the skip pytest-mpi puts on `mpi` tests without --with-mpi (an outer item runs them itself)
_PYTEST_MPI_SKIP = "need --with-mpi option to run"


def _sizes(text: str) -> list[int]:
    return [int(s) for s in text.replace(" ", "").split(",") if s]


def pytest_addoption(parser):
    group = parser.getgroup("mpi", "multi-rank tests (tests/mpi_launch.py)")
    group.addoption("--mpi-world-sizes", type=_sizes, metavar="N,N,...",
                    default=_sizes(os.environ.get("COLLECTIVES_TEST_WORLD_SIZES", "")) or
                    list(WORLD_SIZES),
                    help="world sizes to run each multi-rank test at (default 1,2,3,4,5,7,8)")
    group.addoption("--mpi-timeout", type=float, metavar="S",
                    default=float(os.environ.get("COLLECTIVES_TEST_TIMEOUT", TIMEOUT_S)),
                    help="fail a multi-rank test as a hang when no rank finishes anything for "
                         "S seconds (default 300)")
    group.addoption("--mpi-every-size", action="store_true",
                    default=bool(os.environ.get("COLLECTIVES_TEST_EVERY_SIZE")),
                    help="run every multi-rank test at every size of --mpi-world-sizes, "
                         "ignoring the tests' world_sizes marks")
    group.addoption("--mpi-log-dir", metavar="DIR",
                    help="inside the ranks: write each rank's progress and outcomes in DIR")
    group.addoption("--mpi-select", metavar="FILE",
                    help="inside the ranks: run only the node ids listed in FILE")


#: set in every rank by the launchers (MPICH's Hydra, Intel MPI, Open MPI/PRRTE, PMIx, Slurm)
_LAUNCHER_ENV = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


def _inside(config) -> bool:
    """Whether this pytest runs the multi-rank tests itself (pytest-mpi's --with-mpi)."""
    return bool(config.getoption("with_mpi", False) or config.getoption("only_mpi", False))


def _under_mpiexec() -> bool:
    """Whether this process is a rank of an MPI job (then it must never start jobs itself)."""
    return any(v in os.environ for v in _LAUNCHER_ENV)


# ------------------------------------------------------------------ both sides
@pytest.hookimpl(trylast=True)  # last, so that the world size ends every id: [...-np4]
def pytest_generate_tests(metafunc):
    if FIXTURE not in metafunc.fixturenames:
        return
    if _inside(metafunc.config) or _under_mpiexec():
        from mpi4py import MPI

        sizes = [MPI.COMM_WORLD.size]
    else:
        sizes = [n for n in metafunc.config.getoption("mpi_world_sizes")
                 if _allowed(metafunc.definition, n)]
        if not sizes:  # no size of --mpi-world-sizes allowed: deselected (collection_modifyitems)
            metafunc.parametrize(FIXTURE, [None], ids=["no-size"])
            return
    metafunc.parametrize(FIXTURE, sizes, ids=[f"np{n}" for n in sizes])


def _allowed(node, size: int) -> bool:
    """Whether the test runs at ``size`` ranks: at least pytest-mpi's ``mpi(min_size=...)``, and
    one of its closest ``world_sizes`` mark's sizes (none named: every size) unless
    ``--mpi-every-size``."""
    least = next((m.kwargs["min_size"] for m in node.iter_markers("mpi")
                  if m.kwargs.get("min_size")), 1)
    if size < least:
        return False
    mark = node.get_closest_marker("world_sizes")
    return (mark is None or not mark.args or size in mark.args
            or node.config.getoption("mpi_every_size"))


def pytest_itemcollected(item):
    if FIXTURE in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.mpi)


class _Known:
    """The outer run's multi-rank node ids per world size, before any deselection."""

    def __init__(self, runner: "_Runner") -> None:
        self.runner = runner

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items):
        for item in items:
            size = getattr(getattr(item, "callspec", None), "params", {}).get(FIXTURE)
            if size is not None:
                self.runner.known.setdefault(size, set()).add(item.nodeid)


def pytest_configure(config):
    config.addinivalue_line("markers", "mpi: a multi-rank test (pytest-mpi's marker)")
    config.addinivalue_line("markers", "world_sizes(*sizes): run this multi-rank test (or "
                            "module, as pytestmark) only at these of --mpi-world-sizes")
    config.addinivalue_line("markers", "after_mpi: a serial test run after the multi-rank jobs "
                            "(its own ranks then find the Numba kernels those jobs compiled)")
    if _inside(config):
        if config.getoption("mpi_log_dir"):
            config.pluginmanager.register(_RankRecorder(Path(config.getoption("mpi_log_dir"))),
                                          "mpi-rank-recorder")
        config.pluginmanager.register(_AbortOnFailure(), "mpi-abort-on-failure")
    elif not _under_mpiexec():  # ranks without --with-mpi: pytest-mpi skips the mpi tests
        config._mpi_runner = _Runner(config)
        config.pluginmanager.register(_Known(config._mpi_runner), "mpi-known-tests")


def pytest_unconfigure(config):
    runner = getattr(config, "_mpi_runner", None)
    if runner is not None:
        runner.close()


def pytest_sessionfinish(session):
    runner = getattr(session.config, "_mpi_runner", None)
    if runner is None:
        return
    for size in list(runner.jobs):  # stopped early (-x, Ctrl-C): end the jobs still running
        runner._retire(size, wait=False)
    if runner.only_inside and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    runner = getattr(config, "_mpi_runner", None)
    if runner is not None and runner.only_inside:
        terminalreporter.section("multi-rank tests that exist only inside the ranks (NOT run)",
                                 red=True)
        terminalreporter.line("Their parameters depend on MPI state (the world size is 1 where "
                              "pytest collects them); parametrize with values or fixtures, or "
                              "loop inside the test:")
        for nodeid in sorted(runner.only_inside):
            terminalreporter.line(f"  {nodeid}")


@pytest.hookimpl(trylast=True)  # after -k/-m deselection, --lf, and pytest-mpi's own hook
def pytest_collection_modifyitems(session, config, items):
    if _inside(config):
        size = _world().size
        other = [i for i in items if FIXTURE in getattr(i, "fixturenames", ())
                 and not _allowed(i, size)]
        if other:  # what the outer run would not run at this world size (world_sizes marks)
            config.hook.pytest_deselected(items=other)
            items[:] = [i for i in items if i not in other]
        select = config.getoption("mpi_select")
        if select:
            wanted = {line for line in Path(select).read_text().split("\n") if line}
            _compare_with_outer(Path(select), wanted, items)
            keep = [i for i in items if i.nodeid in wanted]
            config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in wanted])
            items[:] = keep
        return
    if _under_mpiexec():
        return
    serial, multi, unsized = [], [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        size = params.get(FIXTURE)
        if FIXTURE in params and size is None:
            unsized.append(item)  # no world size of this run is one its mark allows
        elif size is None:
            serial.append(item)
        else:
            multi.append(MpiItem.from_parent(item.parent, name=item.name, function=item,
                                             world_size=size,
                                             nodeid=getattr(item, "id", item.nodeid)))
    multi.sort(key=lambda i: i.world_size)  # stable: each size's tests in collection order
    if unsized:
        config.hook.pytest_deselected(items=unsized)
    # a serial test that launches ranks of its own (an emulated cluster) goes last, where its
    # ranks find the kernels the jobs compiled instead of compiling them all at once
    late = [bool(i.get_closest_marker("after_mpi")) for i in serial]
    items[:] = ([i for i, x in zip(serial, late) if not x] + multi
                + [i for i, x in zip(serial, late) if x])


def _compare_with_outer(select: Path, wanted: set[str], items) -> None:
    """Rank 0 notes the tests that exist only here, or only outside (``mismatch.json``): their
    parameters depend on something that differs inside the ranks, such as the world size."""
    known_file = select.with_name("known.txt")
    if _world().rank or not known_file.exists():
        return
    known = set(known_file.read_text().split("\n"))
    here = {i.nodeid for i in items}
    select.with_name("mismatch.json").write_text(json.dumps(
        {"only_inside": sorted(here - known), "only_outside": sorted(wanted - here)}))


def pytest_collection_finish(session):
    runner = getattr(session.config, "_mpi_runner", None)
    if runner is not None:  # the final selection (after --lf and every other hook's filter)
        runner.plan([i for i in session.items if isinstance(i, MpiItem)])


# ------------------------------------------------------------------ inside the ranks
def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


class _RankRecorder:
    """``--mpi-log-dir``: this rank's progress and outcomes in ``rank<k>.progress`` and
    ``rank<k>.results`` (``tests/mpi/runner.py`` also sends its output to ``rank<k>.log``)."""

    def __init__(self, logdir: Path) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        rank = _world().rank
        self.progress = open(logdir / f"rank{rank}.progress", "w", buffering=1)
        self.results = open(logdir / f"rank{rank}.results", "w", buffering=1)
        self.outcome: dict[str, dict] = {}

    def _event(self, **record) -> None:
        self.results.write(json.dumps(record) + "\n")
        self.results.flush()

    def pytest_runtest_logstart(self, nodeid, location):
        self.progress.write(f"in {nodeid}\n")
        self._event(event="start", nodeid=nodeid, t=time.time())

    @pytest.hookimpl(tryfirst=True)  # before _AbortOnFailure ends the job
    def pytest_runtest_logreport(self, report):
        done = self.outcome.setdefault(report.nodeid, {})
        if done.get("final"):
            return
        if report.failed:
            done.update(final=True)
            crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
            self._event(event="end", nodeid=report.nodeid, outcome="failed", when=report.when,
                        text=report.longreprtext, message=crash or f"failed ({report.when})")
        elif report.skipped:
            xfail = getattr(report, "wasxfail", None)
            text = xfail if xfail is not None else (
                report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr))
            text = text.removeprefix("Skipped: ")
            done.update(final=True)
            self._event(event="end", nodeid=report.nodeid,
                        outcome="xfailed" if xfail is not None else "skipped", text=text)
        elif report.when == "teardown":
            self._event(event="end", nodeid=report.nodeid, outcome="passed")

    def pytest_unconfigure(self, config):
        self.progress.write("done\n")
        self._event(event="done")


class _AbortOnFailure:
    """A failure on one rank: print it now and abort the job, so no rank hangs waiting for it."""

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report):
        if not report.failed:
            return
        world = _world()
        sys.stdout.write(f"\nFAILED {report.nodeid} ({report.when}) on rank {world.rank} of "
                         f"{world.size}:\n{report.longreprtext}\n")
        sys.stdout.flush()
        if world.size > 1 and not os.environ.get("COLLECTIVES_TEST_NO_ABORT"):
            from collectives._runtime.cli import abort_world

            abort_world(1, delay=0)  # MPI_Abort, leaving no MPI file in /dev/shm


# ------------------------------------------------------------------ the outer run
class MpiFailure(Exception):
    """What a multi-rank test's ranks reported (the text is the whole report)."""


class MpiItem(pytest.Item):
    """One multi-rank test at one world size, run by :class:`_Runner` in an ``mpiexec`` job."""

    def __init__(self, *, function: pytest.Function, world_size: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.world_size = world_size
        self._location = function.reportinfo()
        self.fixturenames = list(function.fixturenames)
        for mark in function.own_markers:
            if not (mark.name == "skip" and mark.kwargs.get("reason") == _PYTEST_MPI_SKIP):
                self.own_markers.append(mark)
                self.keywords[mark.name] = mark
        self.extra_keyword_matches.update(function.extra_keyword_matches)

    def reportinfo(self):
        return self._location

    def runtest(self) -> None:
        self.config._mpi_runner.run(self)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, MpiFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


def _skip(reason: str):
    try:
        return pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:  # older pytest
        return pytest.skip.Exception(reason)


class _Job:
    """One ``mpiexec -n P python -m pytest --with-mpi`` run of some tests, and what it reported."""

    def __init__(self, config, size: int, nodeids: list[str], files: list[str], logdir: Path,
                 known: set[str]):
        from collectives.tools.launch import mpiexec_command

        self.size, self.nodeids, self.logdir = size, nodeids, logdir
        self.cwd, self.began = config.rootpath, time.time()  # where and since when a core
        logdir.mkdir(parents=True)
        (logdir / "selected.txt").write_text("\n".join(nodeids) + "\n")
        (logdir / "known.txt").write_text("\n".join(sorted(known)) + "\n")
        cmd = [*mpiexec_command(), "-n", str(size), sys.executable, str(RUNNER), str(logdir),
               "-o", "addopts=", "--rootdir", str(config.rootpath),
               f"--tb={config.option.tbstyle or 'auto'}",
               "--mpi-select", str(logdir / "selected.txt")]
        if config.getoption("mpi_every_size"):
            cmd.append("--mpi-every-size")
        if config.inipath:
            cmd += ["-c", str(config.inipath)]
        if config.option.showlocals:
            cmd.append("-l")
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        self.out = open(logdir / "mpiexec.log", "w")
        self.proc = subprocess.Popen([*cmd, *files], stdout=self.out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, cwd=config.rootpath,
                                     start_new_session=True)
        self.offsets = [0] * size
        self.partial = [""] * size
        self.current: list[str | None] = [None] * size  # the test each rank is in
        self.started: dict[str, set[int]] = {}
        self.ended: dict[str, dict[int, dict]] = {}
        self.last_event = time.monotonic()
        self.any_started = False

    def poll(self) -> None:
        """Read what the ranks wrote since the last call."""
        for rank in range(self.size):
            path = self.logdir / f"rank{rank}.results"
            try:
                with open(path) as fh:
                    fh.seek(self.offsets[rank])
                    chunk = fh.read()
                    self.offsets[rank] = fh.tell()
            except FileNotFoundError:
                continue
            if not chunk:
                continue
            lines = (self.partial[rank] + chunk).split("\n")
            self.partial[rank] = lines.pop()
            for line in lines:
                self._record(rank, json.loads(line))
            self.last_event = time.monotonic()

    def _record(self, rank: int, ev: dict) -> None:
        if ev["event"] == "start":
            self.started.setdefault(ev["nodeid"], set()).add(rank)
            self.current[rank] = ev["nodeid"]
            self.any_started = True
        elif ev["event"] == "end":
            self.ended.setdefault(ev["nodeid"], {})[rank] = ev
            self.current[rank] = None
        elif ev["event"] == "done":
            self.current[rank] = "(finished)"

    def mismatch(self) -> dict[str, list[str]]:
        """Tests only inside the ranks / only outside (rank 0's ``mismatch.json``)."""
        try:
            return json.loads((self.logdir / "mismatch.json").read_text())
        except (OSError, ValueError):
            return {}

    def failed_any(self) -> bool:
        return any(e["outcome"] == "failed" for by in self.ended.values() for e in by.values())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.out.close()

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.logdir / name
        if not path.exists():
            return "(no output)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _c_backtrace(job: _Job) -> str:
    """The crashed rank's C frames, where it left a core (``tests/backtrace.py``)."""
    core = backtrace.find_core(job.cwd, job.began) if backtrace.enabled() else None
    if core is None:
        return ""
    text = backtrace.backtrace(core, sys.executable, job.logdir / "backtrace.txt")
    frames = backtrace.crashed_thread(text or "")
    return (f"\n--- C backtrace of the crashed thread (gdb; every thread's in "
            f"{job.logdir / 'backtrace.txt'}) ---\n{frames or '(gdb could not read the core)'}")


class _Runner:
    """Runs the outer run's multi-rank items: one job per world size, started again as needed."""

    def __init__(self, config) -> None:
        self.config = config
        self.timeout = config.getoption("mpi_timeout")
        self.todo: dict[int, list[str]] = {}  # world size -> node ids not yet reported, in order
        self.files: dict[int, list[str]] = {}
        self.jobs: dict[int, _Job] = {}
        self.broken: dict[int, str] = {}  # world size -> why no job can run there
        self.root: Path | None = None
        self.failed_logs = False
        self.count = 0
        self.known: dict[int, set[str]] = {}  # world size -> every multi-rank node id collected
        self.only_inside: set[str] = set()

    def plan(self, items: list[MpiItem]) -> None:
        for item in items:
            self.todo.setdefault(item.world_size, []).append(item.nodeid)
            files = self.files.setdefault(item.world_size, [])
            if str(item.path) not in files:
                files.append(str(item.path))

    def _start(self, size: int) -> _Job:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="collectives-mpi-tests-"))
        self.count += 1
        job = _Job(self.config, size, list(self.todo[size]), self.files[size],
                   self.root / f"np{size}-{self.count}", self.known.get(size, set()))
        self.jobs[size] = job
        return job

    def run(self, item: MpiItem) -> None:
        size, nodeid = item.world_size, item.nodeid
        try:
            self._run(size, nodeid)
        finally:
            if nodeid in self.todo.get(size, []):
                self.todo[size].remove(nodeid)
            if not self.todo.get(size) and size in self.jobs:
                self._retire(size)

    def _retire(self, size: int, wait: bool = True) -> None:
        job = self.jobs.pop(size)
        self.only_inside.update(job.mismatch().get("only_inside", []))
        deadline = time.monotonic() + (30 if wait else 0)
        while job.alive() and time.monotonic() < deadline:  # let the ranks finalize
            time.sleep(POLL_S)
        job.kill()

    def _run(self, size: int, nodeid: str) -> None:
        if size in self.broken:
            raise MpiFailure(self.broken[size])
        job = self.jobs.get(size)
        if job is None or (not job.alive() and nodeid not in job.ended
                           and nodeid not in job.started):
            if job is not None:
                self._retire(size)
            job = self._start(size)
        while True:
            job.poll()
            ended = job.ended.get(nodeid, {})
            if any(e["outcome"] == "failed" for e in ended.values()):
                self.failed_logs = True
                raise MpiFailure(self._failure(job, nodeid, ended))
            if len(ended) == size:
                return self._outcome(ended)
            if not job.alive():
                job.poll()
                if len(job.ended.get(nodeid, {})) == size or any(
                        e["outcome"] == "failed" for e in job.ended.get(nodeid, {}).values()):
                    continue
                self.failed_logs = True
                if nodeid in job.mismatch().get("only_outside", []):
                    raise MpiFailure(
                        f"this test was not collected inside the {size} ranks: its parameters "
                        f"differ there. Parametrize multi-rank tests with values or fixtures "
                        f"that do not depend on MPI state (the world size is 1 where pytest "
                        f"collects them), or loop inside the test.")
                if nodeid in job.started and not job.failed_any():
                    raise MpiFailure(self._died(job, nodeid))
                if not job.any_started:
                    self.broken[size] = (f"the {size}-rank job ended (exit code "
                                         f"{job.proc.returncode}) before running any test; "
                                         f"logs in {job.logdir}\n--- mpiexec ---\n"
                                         f"{job.tail('mpiexec.log')}\n--- rank 0 ---\n"
                                         f"{job.tail('rank0.log')}")
                    raise MpiFailure(self.broken[size])
                self._retire(size)  # it ended for another test's failure: start again from here
                job = self._start(size)
                continue
            if time.monotonic() - job.last_event > self.timeout:
                self.failed_logs = True
                where = "\n".join(f"  rank {k}: {job.current[k] or '(between tests)'}"
                                  for k in range(size))
                job.kill()
                raise MpiFailure(f"{size} ranks: no rank finished anything for "
                                 f"{self.timeout:.0f} s (a hang?); the job was killed. Each "
                                 f"rank's current test:\n{where}\nlogs in {job.logdir}\n"
                                 f"--- rank 0 ---\n{job.tail('rank0.log')}")
            time.sleep(POLL_S)

    @staticmethod
    def _outcome(ended: dict[int, dict]) -> None:
        outcomes = {e["outcome"] for e in ended.values()}
        if outcomes == {"skipped"}:
            raise _skip(ended[min(ended)]["text"])
        if outcomes == {"xfailed"}:
            pytest.xfail(ended[min(ended)]["text"])

    @staticmethod
    def _failure(job: _Job, nodeid: str, ended: dict[int, dict]) -> str:
        by_text: dict[str, list[int]] = {}
        for rank in sorted(ended):
            if ended[rank]["outcome"] == "failed":
                by_text.setdefault(ended[rank]["text"], []).append(rank)
        first = ended[min(r for r in ended if ended[r]["outcome"] == "failed")]
        failed = sorted(r for ranks in by_text.values() for r in ranks)
        head = (f"failed on rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} "
                f"of {job.size}: {first.get('message', '')}")
        parts = [f"--- rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))} of {job.size} "
                 f"---\n{text}" for text, r in by_text.items()]
        return "\n".join([head, *parts, f"(logs in {job.logdir})"])

    @staticmethod
    def _died(job: _Job, nodeid: str) -> str:
        ranks = sorted(set(range(job.size)) - set(job.ended.get(nodeid, {})))
        logs = "\n".join(f"--- rank {k} ---\n{job.tail(f'rank{k}.log', 20)}" for k in ranks[:3])
        return (f"{job.size} ranks: the job ended (exit code {job.proc.returncode}) while ranks "
                f"{', '.join(map(str, ranks))} were in this test (a crash?); logs in "
                f"{job.logdir}\n{logs}\n--- mpiexec ---\n{job.tail('mpiexec.log', 20)}"
                + _c_backtrace(job))

    def close(self) -> None:
        for size in list(self.jobs):
            self._retire(size, wait=False)
        if self.root is not None and not self.failed_logs:
            shutil.rmtree(self.root, ignore_errors=True)
