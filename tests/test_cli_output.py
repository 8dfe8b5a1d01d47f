"""What the programs print: whole names in headers, checked counts, lists in --help, plain words
in the summaries (issue 26, item 7)."""

import io

import compress
import pytest
from mpi4py import MPI

import collectives
from collectives._runtime.cli import UsageError
from collectives.tools.osu import allreduce
from collectives.tools.osu.options import make_parser
from collectives.sgd.report import final_report


@pytest.mark.parametrize("flag, value", [("-x", "-1"), ("-i", "0"), ("-i", "-5"),
                                         ("--warmup-large", "-2"), ("-i", "many")])
def test_negative_or_zero_counts_are_refused(flag, value):
    parser = make_parser("osu_allreduce", "x", default_max=8, rank=0)
    with pytest.raises(UsageError, match=rf"{flag.lstrip('-')}.*(must be >=|not an integer)"):
        parser.parse_args([flag, value])


def test_help_lists_the_algorithms_strategies_and_codecs():
    text = make_parser("osu_allreduce", "x", default_max=8, compressed=True,
                       algorithms=list(collectives.ALGORITHMS), rank=0).format_help()
    flat = " ".join(text.split())
    for name in [*collectives.ALGORITHMS, *compress.CODECS, *collectives.STRATEGIES]:
        assert name in flat, name


def test_every_header_names_each_algorithm_whole_and_stays_aligned():
    out = io.StringIO()
    allreduce.main(["--algorithm", "all", "--busbw", "-m", "8:16", "-i", "1", "-x", "0",
                    "--no-progress"], comm=MPI.COMM_SELF, out=out)
    lines = [line for line in out.getvalue().splitlines() if line and not line.startswith("# ")]
    header = next(line for line in out.getvalue().splitlines() if line.startswith("# Size"))
    for name in collectives.ALGORITHMS:
        assert f" {name}(us)" in header and f" {name}(GB/s)" in header, header
    assert lines and all(len(line) == len(header) for line in lines), (header, lines)
    ends = [i for i, c in enumerate(header) if c == ")"]  # every title ends where its value does
    for line in lines:
        assert all(line[e].isdigit() or line[e] in "na" for e in ends), (header, line)


def _summary(**changes):
    s = {"world": 2, "params": 10, "steps": 5, "codec": "none", "algorithm": "ring",
         "sync": "sync", "loss": 1.0, "train_acc": 0.5, "test_acc": 0.5,
         "seconds": {"compute": 1.0}, "wall_s": 2.0, "analytic": False, "exchanges": 5,
         "bytes_mean": 100.0, "bytes_max": 100, "dense_bytes": 100, "overlap": False}
    s.update(changes)
    return final_report(s)


def test_the_sgd_summary_reads_as_words():
    assert "algorithm ring, synchronous SGD" in _summary() and "sync sync" not in _summary()
    assert "local SGD (parameters averaged every 8 steps)" in _summary(sync="local:8")
    assert _summary().endswith("per rank: the same")
    assert _summary(bytes_mean=1.0).endswith("per rank: 100.0x as much")
    assert _summary(bytes_mean=0.0).endswith("nothing sent")
    assert "epoch end wait" not in _summary()  # synchronous runs: no such wait is measured
    waited = _summary(sync="gossip:ring", seconds={"compute": 1.0, "epoch_wait": 0.5})
    assert "  epoch end wait     0.50 s   25.0%  (the ranks' epochs end apart)" in waited


def test_the_trainer_says_when_nothing_was_counted():
    pytest.importorskip("torch")
    from collectives.torch.train import report as torch_report

    s = {"world": 2, "params": 10, "steps": 5, "exchange": "optimizer", "codec": "none",
         "algorithm": "auto", "train_acc": 0.5, "test_acc": 0.5, "identical": True,
         "seconds": {"compute": 1.0, "comm": 0.5, "update": 0.1, "eval": 0.1}, "wall_s": 2.0,
         "step_ms_median": 1.0, "bytes_mean": 0.0, "bytes_max": 0}
    assert "not counted" in torch_report(s) and "0.00 MB" not in torch_report(s)
    assert "mean 1.00 MB" in torch_report({**s, "bytes_mean": 1e6, "bytes_max": 10 ** 6})


def _after_last_return(text):
    """What is left on the terminal's current line: the text after the last carriage return."""
    return text.split("\r")[-1].split("\n")[-1]


def _stderr_when_it_leaves(capsys, fn, *args, **kwargs):
    """stderr as the exception leaves ``fn``, where sys.excepthook would print it (the traceback
    still holds the frames: a bar nobody closed is still on the line)."""
    try:
        fn(*args, **kwargs)
    except RuntimeError as exc:
        assert str(exc) == "injected"
        return capsys.readouterr().err
    raise AssertionError("the injected error did not arrive")


def test_an_error_during_training_starts_on_a_line_of_its_own(monkeypatch, capsys):
    from collectives.sgd import driver

    steps = []

    def failing_step(self, order):
        steps.append(1)
        if len(steps) == 3:
            raise RuntimeError("injected")
        self.step += 1

    monkeypatch.setattr(driver.Trainer, "one_step", failing_step)
    err = _stderr_when_it_leaves(capsys, driver.main, ["--epochs", "1", "--subset", "512"],
                                 comm=MPI.COMM_SELF)
    assert "step" in err and _after_last_return(err).strip() == "", repr(err[-300:])


def test_an_error_during_a_sweep_starts_on_a_line_of_its_own(monkeypatch, capsys):
    from collectives.tools.osu import collective

    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected")
        return original(*args, **kwargs)

    original = collective.time_interleaved
    monkeypatch.setattr(collective, "time_interleaved", failing)
    err = _stderr_when_it_leaves(capsys, allreduce.main, ["-m", "8:64", "-i", "1", "-x", "0"],
                                 comm=MPI.COMM_SELF, out=io.StringIO())
    assert "size" in err and _after_last_return(err).strip() == "", repr(err[-300:])


def test_the_report_module_runs_without_runpys_warning():
    """``python -m collectives.sgd.report`` (the docs' figure command) starts without runpy's
    RuntimeWarning about a module imported before it ran (the package imports its driver, which
    imports the report, on first use only)."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m",
                          "collectives.sgd.report"], capture_output=True, text=True, timeout=120)
    # no arguments: its usage line and status 2 (the warning, an error here, would give 1)
    assert run.returncode == 2 and "RuntimeWarning" not in run.stderr, run.stderr
    assert "python -m collectives.sgd.report OUT.png" in run.stdout + run.stderr


def test_demo_divides_by_the_bare_mpi_call_and_checks_every_algorithm():
    """``python -m collectives demo``: its ratio column is against a bare ``comm.Allreduce``
    timed in the same loop (the README's promise), not against our own ``native``; every
    algorithm is checked against MPI's result."""
    import subprocess
    import sys

    from collectives.tools.demo import BARE
    from collectives.tools.launch import mpiexec_command

    proc = subprocess.run([*mpiexec_command(), "-n", "2", sys.executable, "-m", "collectives",
                           "demo", "--bytes", "64", "--iterations", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split()[-3:] == ["x", "bare", "MPI"], lines[1]
    rows = {line[:20].strip(): line[20:].split() for line in lines[2:]}
    assert rows[BARE][0] == "-" and rows[BARE][-1] == "1.00"
    assert set(rows) == {BARE, *collectives.ALGORITHMS}
    assert all(rows[name][0] == "yes" for name in collectives.ALGORITHMS), rows
