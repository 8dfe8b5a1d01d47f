"""Serial tests of the benchmarks' pieces: OSU layout, options, result files, netem commands."""

import argparse
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from collectives._runtime.cli import UsageError
from collectives.tools.osu import report
from collectives.tools.osu.collective import column_label
from collectives.tools.osu.options import (DATATYPES, LARGE_MESSAGE_SIZE, device_error,
                                       iterations_for, make_parser, message_sizes, parse_range,
                                       parse_sizes)
from collectives.tools.osu.plot import ratio_table
from collectives.tools.osu.results import Record, read_records, write_csv, write_json
from collectives.tools.launch import mpiexec_command

ROOT = Path(__file__).resolve().parents[1]


def _args(*argv, **kw):
    return make_parser("osu_allreduce", "test", default_max=1 << 20, **kw).parse_args(argv)


def test_preamble_matches_osu():
    lines = report.preamble("Allreduce Latency Test", "MPI_CHAR")
    assert lines == ["", "# OSU MPI Allreduce Latency Test v7.2", "# Datatype: MPI_CHAR."]


def test_header_and_row_widths():
    head = report.column_header(["Avg Latency(us)"])
    assert head == "# Size         Avg Latency(us)"
    assert len(head) == 10 + 20
    full = report.column_header(["Avg Latency(us)", "Min Latency(us)", "Max Latency(us)"],
                                iterations=True, validation=True)
    assert full.split() == ["#", "Size", "Avg", "Latency(us)", "Min", "Latency(us)", "Max",
                            "Latency(us)", "Iterations", "Validation"]
    assert len(full) == 10 + 3 * 20 + 12 + 20
    row = report.row(1024, [12.345, 1.0, 99.999], iterations=1000, valid=True)
    assert row == f"{'1024':<10}{'12.35':>20}{'1.00':>20}{'100.00':>20}{'1000':>12}{'Pass':>20}"
    assert report.row(8, [0.5], valid=False).endswith("Fail")
    assert report.row(8, [0.5]) == "8" + " " * 9 + f"{'0.50':>20}"


def test_bus_bandwidth_definitions():
    assert math.isclose(report.busbw_gbs("allreduce", 10**9, 1.0, 4), 1.5)
    assert math.isclose(report.busbw_gbs("allgather", 10**9, 1.0, 4), 0.75)
    assert math.isclose(report.algbw_gbs(10**9, 2.0), 0.5)
    assert math.isnan(report.algbw_gbs(8, 0.0))


def test_column_labels_name_the_algorithm_whole():
    import collectives
    for name in collectives.ALGORITHMS:
        assert column_label(name) == f"{name}(us)"
    assert report.widths(["ring(us)", "recursive_doubling(GB/s)"]) == [report.FIELD_WIDTH, 25]


@pytest.mark.parametrize("text, expected", [("8:1024", (8, 1024)), ("1024", (0, 1024)),
                                            (":64", (0, 64)), ("16:", (16, -1)),
                                            ("8:64M", (8, 64 << 20)), ("1K:2k", (1024, 2048)),
                                            ("4MiB", (0, 4 << 20)), ("0:1G", (0, 1 << 30))])
def test_parse_range(text, expected):
    assert parse_range(text) == expected


@pytest.mark.parametrize("text", ["a:b", "8:4", "-1:4", "1.5", "8:64Q", "M", "1M:1K"])
def test_parse_range_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_range(text)


def test_parse_sizes():
    assert parse_sizes("8,64K,1M,2MiB,1G") == [8, 64 << 10, 1 << 20, 2 << 20, 1 << 30]
    with pytest.raises(argparse.ArgumentTypeError):
        parse_sizes("8,x")


def test_message_sizes():
    assert message_sizes(_args("-m", "8:1024")) == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert message_sizes(_args())[0] == 1 and message_sizes(_args())[-1] == 1 << 20
    assert message_sizes(_args("-m", "0:4")) == [0, 1, 2, 4]
    assert message_sizes(_args("-m", "512:"))[-1] == 1 << 20
    assert message_sizes(_args("--sizes", "8,1M")) == [8, 1 << 20]


def test_iterations_follow_osu_defaults_and_overrides():
    assert iterations_for(LARGE_MESSAGE_SIZE, _args()) == (1000, 100)
    assert iterations_for(LARGE_MESSAGE_SIZE + 1, _args()) == (100, 10)
    assert iterations_for(1 << 20, _args("-i", "7", "-x", "2")) == (7, 2)
    assert iterations_for(1 << 20, _args("-i", "7", "--iterations-large", "3")) == (3, 10)
    assert iterations_for(8, _args("-i", "7", "--iterations-large", "3")) == (7, 100)


def test_options_and_defaults():
    args = _args("-f", "-c", "-T", "mpi_double", "--algorithm", "all", "--json", "x.json")
    assert args.full and args.validation and args.algorithm == "all" and args.json == "x.json"
    assert DATATYPES[args.datatype].mpi_name == "MPI_DOUBLE"
    assert _args().algorithm == "auto" and _args().datatype == "mpi_char"
    with pytest.raises(UsageError, match="invalid choice: 'mpi_quad'"):
        _args("-T", "mpi_quad")


def test_cuda_is_reported_clearly():
    import importlib.util

    assert device_error("cpu") is None
    message = device_error("cuda")
    if importlib.util.find_spec("cupy") is None:
        assert "CuPy is not installed" in message and "-d cpu" in message
    else:
        assert message is None


def _records():
    return [Record("osu_allreduce", a, s, 4, "mpi_float", t, t * 0.9, t * 1.1, t, 10,
                   s / t / 1e3, s / t / 1e3 * 1.5, True)
            for s in (8, 1024) for a, t in (("native", 10.0), ("ring", 25.0))]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_results_round_trip(tmp_path, suffix):
    path = tmp_path / f"r{suffix}"
    (write_json if suffix == ".json" else write_csv)(path, _records())
    assert read_records(path) == _records()


def test_ratio_table():
    table = ratio_table(_records()).splitlines()
    assert table[0].startswith("Median us per call") and "averages" in table[0]  # says which
    assert table[2] == "| bytes | native | ring |"
    assert table[4] == "| 8 | 10.0 (1.00) | 25.0 (2.50) |"


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    from collectives.tools.osu.plot import plot
    from collectives.selection.cost_model import Network
    out = plot(_records(), tmp_path / "f.png", Network(1e-5, 1e-9, 1e-10))
    assert out.stat().st_size > 1000


def test_error_table_compares_model_and_measurement():
    from collectives.tools.osu.plot import error_table
    from collectives.selection.cost_model import Network, predict

    net = Network(1e-6, 1e-9, 1e-10)
    text = error_table(_records(), net)
    lines = text.splitlines()
    assert lines[0] == "| bytes | native meas / pred (us) | ring meas / pred (us) |"
    ring_8 = predict("ring", 8, 4, net) * 1e6
    assert f"25 / {ring_8:.0f} ({ring_8 / 25.0:.2f})" in lines[2]
    assert lines[-2].startswith("| typical error | ")
    assert lines[-1].startswith("| typical error from 1048576 B | ")


def test_compressed_bench_strategies_per_codec():
    import compress

    spec = importlib.util.spec_from_file_location("compressed_bench",
                                                  ROOT / "bench" / "compressed_allreduce.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from collectives import CompressionState

    def ef(codec):
        return CompressionState.of(codec, error_feedback=True)

    assert bench.strategies_for(ef(compress.get("topk", ratio=0.01))) == [
        "allgather", "sparse", "sparse_recursive_doubling", "sparse_split", "two_phase"]
    assert bench.strategies_for(ef(compress.get("efsignsgd"))) == ["allgather", "two_phase"]
    assert bench.strategies_for(ef(compress.get("powersgd", rank=4))) == ["summable", "allgather"]
    assert bench.strategies_for(CompressionState.of(compress.get("fp16"))) == [
        "summable", "allgather"]
    # under auto compression "two_phase" does not apply (its own rule says so)
    auto = CompressionState.from_spec("auto:efsignsgd", error_feedback=True)
    assert bench.strategies_for(auto) == ["allgather"]


def test_netem_commands():
    spec = importlib.util.spec_from_file_location("netem", ROOT / "bench" / "netem.py")
    netem = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(netem)
    setup = netem.setup_commands("ns1", "1gbit", "256kb", "10ms")
    assert setup[0] == ["ip", "netns", "add", "ns1"]
    assert setup[-1][-8:] == ["root", "tbf", "rate", "1gbit", "burst", "256kb", "latency", "10ms"]
    run = netem.run_command("ns1", ["mpiexec", "-n", "2", "osu_bw"])
    assert run[:4] == ["ip", "netns", "exec", "ns1"]
    assert "MPIR_CVAR_NOLOCAL=1" in run and "FI_PROVIDER=tcp" in run and run[-1] == "osu_bw"
    assert netem.teardown_command("ns1") == ["ip", "netns", "del", "ns1"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_codec_throughput_runs(device, tmp_path):
    """bench/codec_throughput.py end to end on a tiny input (cuda: the GPU, or the CUDA simulator
    that tests/conftest.py turns on without one), with its JSON."""
    import json
    import subprocess
    import sys

    out = tmp_path / "codecs.json"
    n = 4096 if device == "cpu" else 1024  # the CUDA simulator runs every GPU thread in Python
    # the CUDA simulator starts a Python thread per GPU thread at every kernel launch, and top-k's
    # radix select launches most (three quarters of the run): its device kernels are
    # tests/compress/test_device.py's, and the script runs each codec alike
    codecs = ["topk", "signsgd", "qsgd", "powersgd"] if device == "cpu" else \
        ["signsgd", "qsgd", "powersgd"]
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "codec_throughput.py"), "--device", device,
                          "--n", str(n), "--repeats", "1", "--no-reference", "--codecs",
                          ",".join(codecs), "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())["codecs"]
    assert set(codecs) - {"powersgd"} <= set(rows)  # (powersgd: skipped on Numba device arrays)
    assert rows["signsgd"]["compression"] == pytest.approx(n * 4 / (n / 8 + 32))  # header: 16 + 8 + scale
    assert all(r["encode_gbps"] > 0 and r["decode_gbps"] > 0 for r in rows.values())


def _bench_json(tmp_path, script, *args, ranks=None):
    """Run ``bench/<script>`` with ``args`` and ``--json`` (under ``mpiexec -n ranks`` if given);
    the JSON it wrote."""
    out = tmp_path / "out.json"
    launch = [*mpiexec_command(), "-n", str(ranks)] if ranks else []
    run = subprocess.run([*launch, sys.executable, str(ROOT / "bench" / script), *args, "--json",
                          str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return json.loads(out.read_text())


def test_codec_pipeline_runs(tmp_path):
    """bench/codec_pipeline.py end to end on tiny inputs, with its JSON: every phase of every
    codec timed against the copy."""
    sizes = _bench_json(tmp_path, "codec_pipeline.py", "--sizes", "1K,5000", "--repeats", "1",
                        "--ranks", "3")["sizes"]
    assert [row["n"] for row in sizes] == [1000, 5000]
    dgc = sizes[1]["codecs"]["dgc:density=0.001,seed=0"]
    assert {"encode", "decode", "ef", "ef unfused", "dgc memory", "aggregate", "agg dense"} <= set(dgc)
    assert all(p["ms"] > 0 and p["x_copy"] > 0 for row in sizes for c in row["codecs"].values()
               for p in c.values())


def test_powersgd_speed_runs(tmp_path):
    """bench/powersgd_speed.py on small layers: every shape and rank timed, ratios positive."""
    rows = _bench_json(tmp_path, "powersgd_speed.py", "--shapes", "64x48,30x200", "--ranks",
                       "1,3", "--repeats", "1")["rows"]
    assert [(r["rows"], r["cols"], r["rank"]) for r in rows] == \
        [(64, 48, 1), (64, 48, 3), (30, 200, 1), (30, 200, 3)]
    assert all(r["matmuls_s"] > 0 and r["encode_x"] > 0 and r["step_x"] > 0 for r in rows)


def _sweep(tmp_path, *args, fail_at=None, monkeypatch=None):
    """osu_allreduce on COMM_SELF into tmp_path/r.json and r.csv; optionally stopped at a size."""
    import io

    from mpi4py import MPI

    from collectives.tools.osu import allreduce, collective

    if fail_at is not None:
        real, calls = collective.time_interleaved, []

        def interrupted(*a, **k):
            calls.append(1)
            if len(calls) == fail_at:
                raise KeyboardInterrupt
            return real(*a, **k)

        monkeypatch.setattr(collective, "time_interleaved", interrupted)
    out = io.StringIO()
    allreduce.main(["--sizes", "8,64,1K", "-i", "2", "-x", "1", "--json", str(tmp_path / "r.json"),
                    "--csv", str(tmp_path / "r.csv"), *args], comm=MPI.COMM_SELF, out=out)
    return out.getvalue()


def test_sweep_keeps_what_it_measured_when_interrupted(tmp_path, monkeypatch):
    with pytest.raises(KeyboardInterrupt):
        _sweep(tmp_path, "--algorithm", "all", fail_at=3, monkeypatch=monkeypatch)
    import json

    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["complete"] is False and {r["size"] for r in saved["records"]} == {8, 64}
    assert {r.size for r in read_records(tmp_path / "r.csv")} == {8, 64}
    assert not list(tmp_path.glob("*.tmp*"))


def test_sweep_shows_progress_on_stderr(tmp_path, capsys):
    text = _sweep(tmp_path, "--algorithm", "all")
    err = capsys.readouterr().err
    assert "osu_allreduce" in err and "3/3" in err  # tqdm's bar, one step per size
    assert [line.split()[0] for line in text.splitlines() if line[:1].isdigit()] == \
        ["8", "64", "1024"]
    import json

    saved = json.loads((tmp_path / "r.json").read_text())
    import collectives

    assert saved["complete"] is True and saved["mpi_library"] == str(collectives.mpi_library())
    _sweep(tmp_path, "--no-progress")
    assert "osu_allreduce" not in capsys.readouterr().err


def test_bench_errors_are_one_line(capsys):
    from mpi4py import MPI

    from collectives.tools.osu import allreduce

    with pytest.raises(SystemExit) as info:
        allreduce.main(["-m", "8:64Q"], comm=MPI.COMM_SELF)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == ("osu_allreduce: error: argument -m/--message-size: -m takes [MIN:]MAX "
                           "in bytes, K/M/G allowed (e.g. 8:1024 or 8:64M), got '8:64Q'")


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    import importlib.util as util

    from collectives.tools.osu import plot

    path = tmp_path / "r.json"
    write_json(path, _records())
    real = util.find_spec
    monkeypatch.setattr(util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(SystemExit) as info:
        plot.main([str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1
    assert "needs matplotlib" in err[0] and "pip install 'mpi-collectives[plot]'" in err[0]


def test_hierarchical_phases_runs_and_checks_its_sums(tmp_path):
    """bench/hierarchical_phases.py on 2 emulated nodes of 2: every rank's three phases."""
    data = _bench_json(tmp_path, "hierarchical_phases.py", "--node-size", "2", "--sizes", "4,4K",
                       "--iterations", "1", ranks=4)
    assert data["nodes"] == [2, 2] and data["ranks"] == 4
    assert [(r["bytes"], r["rank"]) for r in data["records"]] == [
        (b, r) for b in (4, 4096) for r in range(4)]
    assert all(r[k] >= 0 for r in data["records"] for k in
               ("intra reduce-scatter", "across nodes", "intra allgather"))


def _bench_job(ranks, script, *args, out, timeout=300):
    """Run bench/``script`` under mpiexec at ``ranks`` ranks with ``--json out``; its stdout."""
    cmd = [*mpiexec_command(), "-n", str(ranks), sys.executable, str(ROOT / "bench" / script),
           *args, "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_tensor_repeat_times_both_kinds(tmp_path):
    """bench/tensor_repeat.py at 2 ranks: tensors and NumPy arrays each timed at every size
    (their results checked by the script), the ratio theirs."""
    pytest.importorskip("torch")
    out = tmp_path / "tensor.json"
    stdout = _bench_job(2, "tensor_repeat.py", "--sizes", "8,4K", "--calls", "20", "--rounds",
                        "2", out=out, timeout=180)
    rows = json.loads(out.read_text())["rows"]
    assert [r["bytes"] for r in rows] == [8, 4096]
    for r in rows:
        assert r["numpy_us"] > 0 and r["torch_us"] > 0
        assert r["ratio"] == pytest.approx(r["torch_us"] / r["numpy_us"])
    assert stdout.count("x\n") == 2, stdout


def test_neighbor_allreduce_bench_checks_and_times_every_variant(tmp_path):
    """bench/neighbor_allreduce.py at 3 ranks (the one-peer graph changes every round): every
    variant checked against W @ X (the allreduces against the sum) and timed; the table's
    ratios are to comm.Allreduce."""
    out = tmp_path / "neighbor.json"
    stdout = _bench_job(3, "neighbor_allreduce.py", "--sizes", "4,4K", "--iterations", "2",
                        "--warmup", "1", out=out, timeout=120)
    data = json.loads(out.read_text())
    assert data["ranks"] == 3 and [r["bytes"] for r in data["rows"]] == [4, 4096]
    names = ["ring p2p", "ring mpi", "one_peer_exponential p2p", "one_peer_exponential mpi",
             "comm.Allreduce", "allreduce ring"]
    assert all(set(r) == {"bytes", *names} and min(r[n] for n in names) > 0 for r in data["rows"])
    header = next(line for line in stdout.splitlines() if line.lstrip().startswith("bytes"))
    order = sorted(names, key=header.index)  # the columns, as the header names them
    column = order.index("comm.Allreduce")
    rows = [line for line in stdout.splitlines() if "x)" in line]
    ratios = [re.findall(r"\(\s*([0-9.]+)x\)", line) for line in rows]
    assert len(rows) == 2 and all(len(r) == len(names) for r in ratios), stdout
    assert [r[column] for r in ratios] == ["1.00", "1.00"], stdout  # against itself, each size


def test_shm_vs_native_runs_and_prints_one_table(tmp_path):
    """bench/shm_vs_native.py end to end at 2 ranks on two sizes, one of them long enough for
    cross-memory attach: every column measured (the bare comm.Allreduce too), the results
    checked, one table of ratios to the bare call."""
    out = tmp_path / "shm.json"
    cmd = [sys.executable, str(ROOT / "bench/shm_vs_native.py"), "--ranks", "2",
           "--sizes", "8,4M", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (result,) = json.loads(out.read_text())
    assert result["p"] == 2 and [r["bytes"] for r in result["rows"]] == [8, 4 << 20]
    assert all(r[k] > 0 for r in result["rows"] for k in
               ("mpi", "native", "shm", "shm_slots", "shm_empty", "memcpy"))
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| mpich | 2 |")]
    assert len(rows) == 2 and rows[1].count("|") == 14
    cells = rows[1].split(" | ")  # the ratios are to the bare call's column
    row = result["rows"][1]
    assert cells[5:7] == [f"{row['shm'] / row['mpi']:.2f}", f"{row['native'] / row['mpi']:.2f}"]


def test_shm_thresholds_times_both_transfers(tmp_path):
    """bench/shm_thresholds.py at 2 ranks: the bare call, cross-memory attach and the slots are
    timed at every size, in place too."""
    for extra in ([], ["--in-place"]):
        out = tmp_path / "thresholds.json"
        stdout = _bench_job(2, "shm_thresholds.py", "--sizes", "64K,300001", "--rounds", "2",
                            *extra, out=out, timeout=120)
        data = json.loads(out.read_text())
        assert data["ranks"] == 2 and data["in_place"] == bool(extra)
        assert [r["bytes"] for r in data["rows"]] == [65536, 300001]
        assert all(r[k] > 0 for r in data["rows"] for k in ("mpi", "cma", "slots"))
        rows = [line.split() for line in stdout.splitlines()[2:]]
        assert ("in place" in stdout) == bool(extra) and [r[0] for r in rows] == ["65536", "300001"]


def test_time_to_accuracy_table_and_plot(tmp_path):
    """bench/time_to_accuracy.py on hand-made logs of both formats: the target is the
    reference's final accuracy, reached at the first epoch that meets it; ratios of times and
    median steps; a run that never reaches it says so; the plot is written."""
    def log(name, accs, walls, summary):
        epochs = [{"epoch": i + 1, "loss": 1.0 / (i + 1), "test_acc": a, "wall_s": w}
                  for i, (a, w) in enumerate(zip(accs, walls))]
        summary = {"test_acc": accs[-1], "steps": 100, "bytes_mean": 4e8, **summary}
        (tmp_path / f"{name}.json").write_text(json.dumps({"summary": summary, "epochs": epochs}))
        return str(tmp_path / f"{name}.json")

    driver = {"step_median_s": 0.8, "seconds": {"compute": 20.0, "comm": 60.0}}
    ref = log("dense", [0.9, 0.95, 0.94, 0.95], [10.0, 20.0, 30.0, 40.0], driver)
    fast = log("topk", [0.93, 0.951, 0.96], [3.0, 6.0, 9.0],
               {"step_median_s": 0.2, "seconds": {"compute": 15.0, "codec": 3.0, "encode": 2.0,
                                                  "decode": 1.0, "comm": 2.0}})
    slow = log("torch", [0.5, 0.9], [5.0, 10.0],
               {"step_ms_median": 400.0, "exchange": "overlap",
                "seconds": {"compute": 10.0, "update": 2.0, "comm": 30.0, "eval": 1.0}})
    png = tmp_path / "tta.png"
    has_plot = importlib.util.find_spec("matplotlib") is not None  # the [plot] extra
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "time_to_accuracy.py"),
                          "--reference", ref, fast, slow, *(["--plot", str(png)] if has_plot
                                                            else [])],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in run.stdout.splitlines()[2:]}
    assert "reached 95.00 % at epoch" in run.stdout
    assert "| 2 (20.0) | 1 (reference) | 800.0 ms (1.000x) | 4.00 | 200 / 0 / 0 / 600 |" \
        in rows["dense"]
    assert "| 96.00 % (+1.00) | 2 (6.0) | **0.30x** | 200.0 ms (0.250x) |" in rows["topk"]
    assert rows["topk"].endswith("| 150 / 20 / 10 / 20 |")
    assert "| not in 2 epochs | - | 400.0 ms (0.500x) |" in rows["torch"]
    assert rows["torch"].endswith("| 120 / - / - / 300 |")
    if has_plot:
        assert png.stat().st_size > 10_000
    else:  # --plot without matplotlib: one line saying how to get it, before reading anything
        run = subprocess.run([sys.executable, str(ROOT / "bench" / "time_to_accuracy.py"),
                              "--reference", ref, "--plot", str(png)],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and "--plot needs matplotlib" in run.stderr
        assert "pip install 'mpi-collectives[plot]'" in run.stderr and not png.exists()


def test_time_to_accuracy_without_evaluation(tmp_path):
    """Logs whose epochs say how long their evaluations took (``eval_s``, the driver's) get a
    column of the time to the target without it, with its ratio to the reference's."""
    def log(name, accs, walls, evals):
        epochs = [{"epoch": i + 1, "test_acc": a, "wall_s": w, "eval_s": e}
                  for i, (a, w, e) in enumerate(zip(accs, walls, evals))]
        summary = {"test_acc": accs[-1], "steps": 10, "bytes_mean": 1e6, "step_median_s": 0.5,
                   "seconds": {"compute": 1.0, "comm": 2.0}}
        (tmp_path / f"{name}.json").write_text(json.dumps({"summary": summary, "epochs": epochs}))
        return str(tmp_path / f"{name}.json")

    ref = log("sync", [0.8, 0.9], [10.0, 20.0], [0.5, 1.0])
    gossip = log("gossip", [0.7, 0.85, 0.95], [8.0, 16.0, 24.0], [3.0, 6.0, 9.0])
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "time_to_accuracy.py"),
                          "--reference", ref, gossip], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "| time ratio | without evaluation: s (ratio) |" in lines[0]
    assert lines[1].count("---|") == 8
    assert "| 2 (20.0) | 1 (reference) | 19.0 (1.00x) |" in lines[2]
    assert "| 3 (24.0) | **1.20x** | 15.0 (0.79x) |" in lines[3]
    within = subprocess.run([sys.executable, str(ROOT / "bench" / "time_to_accuracy.py"),
                             "--reference", ref, gossip, "--within", "5"],
                            capture_output=True, text=True, timeout=120)
    lines = within.stdout.splitlines()  # the target 85 %: epoch 2 of both
    assert "reached 85.00 % at epoch" in lines[0]
    assert "| 90.00 % (+0.00) | 2 (20.0) | 1 (reference) | 19.0 (1.00x) |" in lines[2]
    assert "| 95.00 % (+5.00) | 2 (16.0) | **0.80x** | 10.0 (0.53x) |" in lines[3]
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "time_to_accuracy.py"),
                          "--reference", ref, "--within", "-1"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "--within takes percentage points" in bad.stderr


def test_allreduce_sweep_modes(tmp_path):
    """bench/allreduce_sweep.py's evicting and back-to-back modes: the header and the JSON's run
    say which mode the figures come from; every column is timed in each; the evicting mode's
    default buffer is larger than the largest cache /sys reports."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sweep", ROOT / "bench" / "allreduce_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    assert sweep.llc_bytes() >= 1 << 20
    for mode, extra in (("evicting", ["--evict-bytes", str(3 << 20)]),
                        ("back-to-back", ["--chunk", "3"])):
        out = tmp_path / f"{mode}.json"
        stdout = _bench_job(2, "allreduce_sweep.py", "--algorithms", "mpi,auto,ring",
                            "--sizes", "8,65536", "--iterations", "6", "--iterations-large", "6",
                            "--mode", mode, *extra, out=out)
        assert stdout.startswith(f"# p=2, mode {mode} ("), stdout
        assert "3 MiB written before each" in stdout if mode == "evicting" else \
            "3 calls in a row" in stdout
        data = json.loads(out.read_text())
        assert [r["mode"] for r in data["runs"]] == [mode]
        assert {(r["algorithm"], r["size"]) for r in data["records"]} == \
            {(a, n) for a in ("mpi", "auto", "ring") for n in (8, 65536)}
        assert all(0 < r["min_us"] <= r["median_us"] <= r["max_us"] for r in data["records"])


def test_allreduce_sweep_columns_with_options(tmp_path):
    """bench/allreduce_sweep.py's ``NAME:KEY=VALUE`` columns: the keys of its table set those
    options (``shm:cma=0`` cross-memory attach at every size, ``never`` above any call); an
    unknown key is refused naming the known ones; such columns run side by side with the
    default one and are recorded under their own names."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sweep", ROOT / "bench" / "allreduce_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    assert sweep.column("shm") == ("shm", {}, None)
    assert sweep.column("shm:cma=4M:seg=never") == \
        ("shm", {"shm_cma_bytes": 4 << 20, "shm_segment_bytes": sweep.NEVER}, None)
    assert sweep.column("shm:cma=never:mem=in") == ("shm", {"shm_cma_bytes": sweep.NEVER}, "in")
    for bad in ("shm:cmb=0", "shm:cma", "shm:cma=lots", "shm:mem=elsewhere"):
        with pytest.raises(ValueError, match="cma, seg|byte count"):
            sweep.column(bad)
    out = tmp_path / "columns.json"
    names = ("mpi", "shm", "shm:cma=0", "shm:cma=never", "shm:cma=never:mem=in",
             "shm:cma=never:mem=out", "shm:mem=both")
    _bench_job(2, "allreduce_sweep.py", "--algorithms", ",".join(names),
               "--sizes", "8,65536", "--iterations", "4", "--iterations-large", "4", out=out)
    records = json.loads(out.read_text())["records"]
    assert {(r["algorithm"], r["size"]) for r in records} == \
        {(a, n) for a in names for n in (8, 65536)}
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "allreduce_sweep.py"),
                          "--algorithms", "mpi,shm:cmb=0"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "KEY one of cma, seg" in bad.stderr


def test_core_to_core(tmp_path):
    """bench/core_to_core.py: the round trip and every copy timed at each size (it checks that
    each read of the other process's writes got them), in the table and the JSON file."""
    out = tmp_path / "cores.json"
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "core_to_core.py"), "--sizes",
                          "4K,64K", "--calls", "3", "--json", str(out)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["round_trip_ns"] > 0 and list(result["sizes"]) == ["4096", "65536"]
    kinds = {"read theirs", "read local", "write theirs", "write local"}
    assert all(set(row) == kinds and min(row.values()) > 0 for row in result["sizes"].values())
    lines = run.stdout.splitlines()
    assert lines[0].startswith("# one cache line core to core and back: ")
    assert [line.split()[0] for line in lines[2:]] == ["4096", "65536"]


def test_cma_copy_rate(tmp_path):
    """bench/cma_copy_rate.py: a row per size with both copies timed (it checks that
    process_vm_readv copied the child's bytes); skipped where the call is not permitted."""
    out = tmp_path / "cma.json"
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "cma_copy_rate.py"), "--sizes",
                          "4K,64K", "--calls", "3", "--json", str(out)], capture_output=True,
                         text=True, timeout=120)
    if run.returncode != 0 and "Operation not permitted" in run.stderr:
        pytest.skip("process_vm_readv is not permitted here (ptrace rules or seccomp)")
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["bytes"] for r in rows] == [4096, 65536]
    assert all(r["cma_us"] > 0 and r["memcpy_us"] > 0 for r in rows)


def test_busy_cores_reports_and_passes_the_exit_status():
    """bench/busy_cores.py runs the command, passes its exit status on, and prints one line with
    the other processes' and the command's own cores."""
    script = str(ROOT / "bench" / "busy_cores.py")
    run = subprocess.run([sys.executable, script, sys.executable, "-c", "print('hi')"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.startswith("hi\n## others used "), run.stdout
    assert " cores on average over " in run.stdout and "(this run " in run.stdout
    failed = subprocess.run([sys.executable, script, sys.executable, "-c", "raise SystemExit(3)"],
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode == 3


def test_allreduce_sweep_and_the_headline_table(tmp_path):
    """bench/allreduce_sweep.py at 2 ranks on two sizes, then bench/mpi_headline.py on its JSON:
    one row per size, the default call's and the best hand-written algorithm's time over the
    bare comm.Allreduce of the same run (native, MPI's algorithm through our wrapper, and auto
    are not candidates for "best"), and the figure."""
    out = tmp_path / "sweep.json"
    _bench_job(2, "allreduce_sweep.py", "--algorithms", "mpi,auto,native,ring,shm", "--sizes",
               "8,65536", "--iterations", "20", "--iterations-large", "5", out=out)
    records = json.loads(out.read_text())["records"]
    assert {(r["algorithm"], r["size"]) for r in records} == \
        {(a, n) for a in ("mpi", "auto", "native", "ring", "shm") for n in (8, 65536)}
    med = {(r["algorithm"], r["size"]): r["median_us"] for r in records}
    png = tmp_path / "headline.png"
    has_plot = importlib.util.find_spec("matplotlib") is not None  # the [plot] extra
    run = subprocess.run([sys.executable, str(ROOT / "bench/mpi_headline.py"), f"MPICH={out}",
                          *(["--figure", str(png)] if has_plot else [])],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "| size | MPICH p = 2 |" and len(lines) == 4
    for line, n in zip(lines[2:], (8, 65536)):
        best = min(("ring", "shm"), key=lambda a: med[a, n])
        assert line.startswith(f"| {'8 B' if n == 8 else '64 KiB'} | "
                               f"**{med['auto', n] / med['mpi', n]:.2f}x**; best "
                               f"{med[best, n] / med['mpi', n]:.2f}x ({best}); mpi "), line
    assert not has_plot or png.stat().st_size > 0
    # three runs of one label (the first, and copies with auto 1.5x and 2x as slow): the median
    # of the runs' ratios, with the default call's range; the bare call's median time
    data = json.loads(out.read_text())
    files = [str(out)]
    for k, scale in enumerate((2.0, 1.5)):
        copy = json.loads(json.dumps(data))
        for r in copy["records"]:
            if r["algorithm"] == "auto":
                r["median_us"] *= scale
        files.append(str(tmp_path / f"run{k}.json"))
        Path(files[-1]).write_text(json.dumps(copy))
    run = subprocess.run([sys.executable, str(ROOT / "bench/mpi_headline.py"),
                          "MPICH=" + ",".join(files)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    for line, n in zip(run.stdout.splitlines()[2:], (8, 65536)):
        ratio = med["auto", n] / med["mpi", n]
        assert line.startswith(f"| {'8 B' if n == 8 else '64 KiB'} | **{1.5 * ratio:.2f}x** "
                               f"({ratio:.2f}-{2 * ratio:.2f}); best "), line
        assert line.endswith(f"mpi {med['mpi', n]:,.1f} us |"), line


def test_call_overhead_runs_every_variant(tmp_path):
    """bench/call_overhead.py at 2 ranks: every variant asked for is timed (the floor's Python
    wrappers, abort mode, iallreduce), the bare call is the ratio's base."""
    out = tmp_path / "overhead.json"
    stdout = _bench_job(2, "call_overhead.py", "--calls", "50", "--rounds", "2", "--floor",
                        "--abort", "--split", "--lane", out=out)
    result = json.loads(out.read_text())
    assert result["bytes"] == 8 and result["ranks"] == 2
    assert list(result["median_us"]) == [
        "bare", "plan()", "allreduce", "allreduce(options=)", "python wrapper",
        "python wrapper+checks", "mpi Iallreduce+Wait", "lane, unguarded", "allreduce(abort)",
        "plan(abort)", "iallreduce+wait", "iallreduce (split)", "iallreduce() half",
        ".wait() half"]
    rounds = result["rounds"]
    assert all(len(r) == 2 and min(r) > 0 for r in rounds.values())
    # the halves are timed inside the split variant's turn: together, less than the turn
    for k in range(2):
        assert rounds["iallreduce() half"][k] + rounds[".wait() half"][k] \
            < rounds["iallreduce (split)"][k]
    rows = {line.split()[0]: line for line in stdout.splitlines()[2:]}
    assert rows["bare"].split()[-1] == "1.00"


def test_call_lines_counts_the_work_around_the_algorithm(tmp_path):
    """bench/call_lines.py at 2 ranks: each variant's traced call went through the failure guard
    once and counted none of its algorithm (left out of the trace), and the counts order the
    paths as they are built: a plan's run inside a remembered allreduce's, inside a small
    iallreduce's."""
    out = tmp_path / "lines.json"
    stdout = _bench_job(2, "call_lines.py", "--detail", out=out, timeout=120)
    counts = json.loads(out.read_text())["counts"]
    assert list(counts) == ["plan()", "allreduce", "iallreduce+wait"]
    for where in counts.values():
        assert where["guard.py:run"] == [1, where["guard.py:run"][1]]
        assert not any(k.startswith(("shm.py", "team.py", "lanes.py")) for k in where), where
    lines = {name: sum(n for _, n in where.values()) for name, where in counts.items()}
    assert 0 < lines["plan()"] < lines["allreduce"] < lines["iallreduce+wait"], lines
    assert "engine.py:run_deferred" in counts["iallreduce+wait"]  # run by its wait(), inline
    rows = {r.split()[0]: r.split()[1:] for r in stdout.splitlines()[2:] if not r[0].isspace()}
    assert rows == {name: [str(sum(c for c, _ in where.values())), str(lines[name])]
                    for name, where in counts.items()}


def test_numba_dispatch_times_both_calls():
    """bench/numba_dispatch.py times a kernel of the round driver's arguments through Numba's
    dispatcher and through its compiled entry (what shm's lane calls)."""
    spec = importlib.util.spec_from_file_location("numba_dispatch",
                                                  ROOT / "bench" / "numba_dispatch.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = bench.main(["--calls", "200", "--repeats", "2"])
    assert set(results) == {"dispatcher, 10 arguments", "dispatcher, 1 array",
                            "entry, 10 arguments", "entry, 1 array"}
    assert all(v > 0 for v in results.values())


def test_repeat_lookup_runs_the_remembered_path():
    """bench/repeat_lookup.py at 2 ranks drives collectives.allreduce on the remembered entry
    that the public diagnostics probe gives (it stops if the call is no longer taken as a
    repeat), in place and not."""
    for extra in ([], ["--in-place"]):
        proc = subprocess.run([*mpiexec_command(), "-n", "2", sys.executable,
                               str(ROOT / "bench" / "repeat_lookup.py"), "--calls", "50", *extra],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "ns per repeat" in proc.stdout
        assert ("(in place" in proc.stdout) == bool(extra), proc.stdout




def test_first_compressed_times_the_first_compressed_call():
    """bench/first_compressed.py at 2 ranks (with the cache the suite has: the point here is
    that it runs and reports the slowest rank, not the compile)."""
    proc = subprocess.run([*mpiexec_command(), "-n", "2", sys.executable,
                           str(ROOT / "bench" / "first_compressed.py"), "1024",
                           "--allreduce-first"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "first compressed call" in proc.stdout and "slowest rank" in proc.stdout


def test_alltoall_sweep_times_every_variant_and_the_barrier(tmp_path):
    """bench/alltoall_sweep.py at 2 ranks on two tiny sizes: the bare comm.Alltoall, the
    default call and every algorithm timed (their results checked by the script), ratios to
    the bare call; --barrier times comm.Barrier, auto and native."""
    out = tmp_path / "a2a.json"
    stdout = _bench_job(2, "alltoall_sweep.py", "--sizes", "8,4K", "--rounds", "2",
                        "--target-ms", "0.5", "--min-calls", "2", out=out, timeout=120)
    data = json.loads(out.read_text())
    names = ["comm.Alltoall", "default", "shm", "pairwise", "bruck", "hierarchical", "native"]
    assert data["ranks"] == 2 and [r["bytes"] for r in data["rows"]] == [8, 4096]
    assert all(set(r) == {"bytes", "calls", *names} and min(r[n] for n in names) > 0
               for r in data["rows"])
    rows = [line for line in stdout.splitlines() if "x)" in line]
    assert len(rows) == 2 and all(line.count("x)") == len(names) for line in rows), stdout
    assert all(re.search(r"\(\s*1\.00x\)", line) for line in rows), stdout  # bare against itself
    stdout = _bench_job(2, "alltoall_sweep.py", "--barrier", "--rounds", "2", "--target-ms",
                        "0.5", "--min-calls", "2", out=out, timeout=120)
    row = json.loads(out.read_text())["barrier"]
    assert set(row) == {"calls", "comm.Barrier", "auto", "native"} and min(row.values()) > 0
    assert stdout.count("x)") == 3, stdout


def test_alltoall_sweep_times_the_v_form(tmp_path):
    """bench/alltoall_sweep.py --v at 2 ranks on one tiny size: comm.Alltoallv, the default v
    form and every algorithm with one (Bruck has none), results checked by the script."""
    out = tmp_path / "a2av.json"
    stdout = _bench_job(2, "alltoall_sweep.py", "--v", "--sizes", "64", "--rounds", "2",
                        "--target-ms", "0.5", "--min-calls", "2", out=out, timeout=120)
    names = ["comm.Alltoallv", "default", "shm", "pairwise", "hierarchical", "native"]
    rows = json.loads(out.read_text())["rows"]
    assert [r["bytes"] for r in rows] == [64] and set(rows[0]) == {"bytes", "calls", *names}
    assert min(rows[0][n] for n in names) > 0 and stdout.count("x)") == len(names), stdout


def test_shared_core_timing_prints_both_timings_per_kernel():
    """bench/shared_core_timing.py with 2 processes on a small shape: a line per kernel, each
    with every process's single-call median and rate, and their ratio; bad input is a usage
    error."""
    cmd = [sys.executable, str(ROOT / "bench/shared_core_timing.py"), "--processes", "2",
           "--shape", "16,64,64", "--repetitions", "3", "--window", "0.005"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["forward", "backward"]
    for line in lines:
        single, rate = re.search(r"call \(median of 3\) (.*) ms; rate over 5 ms (.*) ms;",
                                 line).groups()
        assert len(single.split(", ")) == len(rate.split(", ")) == 2
        assert all(float(x) > 0 for x in (*single.split(", "), *rate.split(", ")))
    bad = subprocess.run([*cmd[:2], "--shape", "8,32"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "--shape takes three positive integers" in bad.stderr
