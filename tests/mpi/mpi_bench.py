"""The benchmarks and auto's tuning file, run in-process on every world size (tiny sizes only)."""

import io
import json
import math
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import collectives
import compress
from collectives import selection
from collectives._runtime.context import context
from collectives.algorithms import auto
from collectives.tools.osu import (allgather, allreduce, alltoall, alltoallv, barrier, bcast, bw,
                                   gather, latency, reduce_scatter, scatter)

# The benchmark commands and auto's tuning file: plumbing over collectives that run at every size
# elsewhere; one rank, two and an odd number (docs/testing.md)
pytestmark = pytest.mark.world_sizes(1, 2, 3)

TINY = ["--sizes", "8,1024", "-i", "2", "-x", "1", "-T", "mpi_float"]


def _rows(text):
    return [line.split() for line in text.splitlines() if line and not line.startswith("#")]


def _run(module, *args):
    out = io.StringIO()
    records = module.main([*TINY, *args], comm=MPI.COMM_WORLD, out=out)
    return records, out.getvalue()


@pytest.mark.parametrize("module, sizes", [(allreduce, (8, 1024)), (reduce_scatter, (1024,)),
                                           (allgather, (1024,)), (bcast, (1024,)),
                                           (alltoall, (8, 1024)), (alltoallv, (8, 1024)),
                                           (gather, (8,)), (scatter, (8,))])
def test_all_algorithms_validate(module, sizes):
    records, text = _run(module, "--algorithm", "all", "-c", "--busbw",
                         "--sizes", ",".join(map(str, sizes)))
    # first the bare mpi4py call (the baseline, outside the library), then the library's own
    names = ["mpi", "native"] + [a for a in module.SPEC.algorithms if a != "native"]
    assert [(r.size, r.algorithm) for r in records] == [(s, a) for s in sizes for a in names]
    assert all(r.valid for r in records)
    if MPI.COMM_WORLD.rank == 0:
        rows = _rows(text)
        assert [row[0] for row in rows] == [str(s) for s in sizes]
        assert all(len(row) == 1 + 2 * len(names) + 1 and row[-1] == "Pass" for row in rows)
    else:
        assert text == ""


def test_barrier_rows_have_no_size():
    """``osu_barrier`` prints, as OSU's does, one row without a size column: a latency for each
    column of ``--algorithm all`` (after mpi4py's own ``comm.Barrier``), then the validation;
    the single-column header opens with ``#`` (every OSU parser skips it)."""
    records, text = _run(barrier, "--algorithm", "all", "-c")
    names = ["mpi", "native"] + [a for a in barrier.SPEC.algorithms if a != "native"]
    assert [(r.size, r.algorithm) for r in records] == [(0, a) for a in names]
    assert all(r.valid and r.avg_us > 0 for r in records)
    records, text1 = _run(barrier, "-f")
    assert [r.algorithm for r in records] == ["auto"] and records[0].iterations == 2
    if MPI.COMM_WORLD.rank == 0:
        rows = _rows(text)
        assert len(rows) == 1 and len(rows[0]) == len(names) + 1 and rows[0][-1] == "Pass"
        float(rows[0][0])
        header = [l for l in text1.splitlines() if "Avg Latency(us)" in l][0]
        row, = _rows(text1)
        assert header.startswith("#") and "Size" not in header
        assert len(row) == 4 and len(_rows(text1)[0][0]) and row[3] == "2"
    else:
        assert text == text1 == ""


def test_allreduce_full_row_layout():
    records, text = _run(allreduce, "--algorithm", "ring", "-f", "-c", "--busbw")
    if MPI.COMM_WORLD.rank == 0:
        line = [l for l in text.splitlines() if l.startswith("1024")][0]
        assert len(line) == 10 + 3 * 20 + 12 + 20 + 20
        assert line[10 + 60:10 + 60 + 12].strip() == "2" and line.endswith("Pass")
    r = records[-1]
    assert r.min_us <= r.avg_us <= r.max_us and r.iterations == 2
    assert math.isclose(r.busbw_gbs, r.algbw_gbs * 2 * (r.ranks - 1) / r.ranks)


@pytest.mark.parametrize("module", [latency, bw])
def test_point_to_point(module):
    if MPI.COMM_WORLD.size < 2:
        with pytest.raises(SystemExit):
            module.main(TINY, comm=MPI.COMM_WORLD, out=io.StringIO())
        return
    records, text = _run(module, "-c")
    assert [r.size for r in records] == [8, 1024] and all(r.valid for r in records)
    assert all(r.avg_us > 0 for r in records) and {r.algorithm for r in records} == {"mpi"}
    if MPI.COMM_WORLD.rank == 0:  # OSU 7.x's point-to-point order: title, columns, datatype
        lines = text.splitlines()
        title = "Latency" if module is latency else "Bandwidth"
        assert lines[0] == f"# OSU MPI {title} Test v7.2"
        assert lines[1].startswith("# Size") and lines[2] == "# Datatype: MPI_FLOAT."
    # this library's send/recv (isend/irecv) beside mpi4py's, a column each
    records, text = _run(module, "-c", "--algorithm", "all")
    assert [(r.size, r.algorithm) for r in records] == [(s, a) for s in (8, 1024)
                                                         for a in ("mpi", "collectives")]
    assert all(r.valid and r.avg_us > 0 for r in records)
    if MPI.COMM_WORLD.rank == 0:
        unit = "(us)" if module is latency else "(MB/s)"
        assert text.splitlines()[1].split() == ["#", "Size", f"mpi{unit}", f"collectives{unit}",
                                                "Validation"]
        rows = _rows(text)
        assert [row[0] for row in rows] == ["8", "1024"]
        assert all(len(row) == 4 and row[-1] == "Pass" and float(row[2]) > 0 for row in rows)


def _shared_tmpdir(comm):
    return Path(comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0))


def _write(comm, content):
    path = _shared_tmpdir(comm) / "tuning.json"
    if comm.rank == 0:
        path.write_text(content)
    comm.Barrier()
    return path


def test_auto_follows_tuning_file(monkeypatch):
    comm = MPI.COMM_WORLD
    rules = [{"max_bytes": 16, "algorithm": "ring"}, {"max_bytes": None, "algorithm": "tree"}]
    path = _write(comm, json.dumps({"format": selection.FORMAT, "version": selection.VERSION,
                                    "world_sizes": {str(comm.size): {"rules": rules}}}))
    monkeypatch.setenv(selection.ENV, str(path))
    selection.clear_cache()
    ran = []
    for name in ("ring", "tree"):
        real = auto._ALL[name]
        monkeypatch.setitem(auto._ALL, name, lambda *a, _n=name, _f=real: (ran.append(_n), _f(*a)))
    dup = comm.Dup()
    try:
        assert auto.comm_rules(context(dup)) == [(16, "ring"), (math.inf, "tree")]
        for count in (2, 256):
            x = np.arange(count, dtype=np.float32) + comm.rank
            y = collectives.allreduce(x, algorithm="auto", comm=dup)
            expected = np.arange(count, dtype=np.float32) * comm.size + sum(range(comm.size))
            assert np.array_equal(y, expected)
    finally:
        dup.Free()
        selection.clear_cache()
    assert ran == ([] if comm.size == 1 else ["ring", "tree"])


@pytest.mark.parametrize("codec", ["fp16", "none"])
def test_dense_and_compressed_summable_auto_follow_one_tuning_file(monkeypatch, codec):
    """A tuning file that names one algorithm for every size: a dense allreduce and a compressed
    summable one (its representation summed by a dense allreduce) both run it. The compressed
    path once picked by the built-in rule alone, ignoring the file ("native" at these sizes)."""
    comm = MPI.COMM_WORLD
    rules = [{"max_bytes": None, "algorithm": "tree"}]
    path = _write(comm, json.dumps({"format": selection.FORMAT, "version": selection.VERSION,
                                    "world_sizes": {str(comm.size): {"rules": rules}}}))
    monkeypatch.setenv(selection.ENV, str(path))
    selection.clear_cache()
    ran = []
    real = auto._ALL["tree"]
    monkeypatch.setitem(auto._ALL, "tree", lambda *a: (ran.append("tree"), real(*a)))
    dup = comm.Dup()
    try:
        x = np.arange(1001, dtype=np.float32) + comm.rank
        dense = collectives.allreduce(x, algorithm="auto", comm=dup)
        assert ran == ([] if comm.size == 1 else ["tree"])
        y = collectives.compressed_allreduce(x, compress.get(codec), op="sum", strategy="summable",
                                             algorithm="auto", comm=dup)
        assert ran == ([] if comm.size == 1 else ["tree", "tree"])
        np.testing.assert_allclose(y, dense, rtol=1e-3)
    finally:
        dup.Free()
        selection.clear_cache()


def _tuning(world_sizes):
    return json.dumps({"format": selection.FORMAT, "version": selection.VERSION,
                       "world_sizes": world_sizes})


_RULE = {"rules": [{"max_bytes": None, "algorithm": "ring"}]}
#: files that are not tuning files; the hostile ones used to raise on rank 0 only (hang)
MALFORMED = {
    "not json": ("{not json", "not readable as JSON"),
    "not a dict": ("[1, 2, 3]", "not a tuning file"),
    "superscript key": (_tuning({"\u00b2": _RULE}), "positive integers"),
    "5000-digit key": (_tuning({"9" * 5000: _RULE}), "positive integers"),
    "5000-digit number": (_tuning({"2": {"rules": [{"max_bytes": None, "algorithm": "ring"}],
                                         "x": 0}}).replace('"x": 0', '"x": ' + "9" * 5000),
                          "not readable as JSON"),
    "nested 100000 deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "unhashable algorithm": (_tuning({"2": {"rules": [{"max_bytes": None, "algorithm": []}]}}),
                             "unknown algorithm"),
    "huge file": (_tuning({"2": _RULE}) + " " * 2000, "larger than 1000 bytes"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_auto_malformed_file_falls_back(monkeypatch, case):
    """Rank 0 reads the file and broadcasts the verdict: every rank takes the built-in rule, and
    rank 0 alone warns, naming the problem."""
    comm = MPI.COMM_WORLD
    content, problem = MALFORMED[case]
    monkeypatch.setenv(selection.ENV, str(_write(comm, content)))
    if case == "huge file":  # not 16 MiB of test file
        monkeypatch.setattr(selection.tuning_file, "MAX_FILE_BYTES", 1000)
    selection.clear_cache()
    dup = comm.Dup()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert auto.comm_rules(context(dup)) is None
        assert len(caught) == (1 if comm.rank == 0 else 0)
        assert all(problem in str(w.message) and len(str(w.message)) < 400 for w in caught)
        x = np.ones(1000, np.float32)
        assert np.array_equal(collectives.allreduce(x, comm=dup), x * comm.size)
    finally:
        dup.Free()
        selection.clear_cache()


def test_auto_across_nodes(monkeypatch):
    """Emulated nodes of 2: auto follows rules tuned on this layout, ignores rules tuned on
    another, and otherwise asks the two-level model (which may pick hierarchical)."""
    comm = MPI.COMM_WORLD
    p = comm.size
    nodes = [2] * (p // 2) + [1] * (p % 2)
    opts = collectives.Options(node_size=2)
    rules = [{"max_bytes": None, "algorithm": "tree"}]
    ran = []
    for name in list(auto._ALL):
        real = auto._ALL[name]
        monkeypatch.setitem(auto._ALL, name, lambda *a, _n=name, _f=real: (ran.append(_n), _f(*a)))
    x = np.arange(100_003, dtype=np.float32) + comm.rank  # 400 kB: above auto's small sizes
    expected = np.arange(100_003, dtype=np.float32) * p + sum(range(p))
    for layout, follows in ((nodes, True), ([p], p == len(nodes) * 2 and p <= 2)):
        entry = {"rules": rules, "nodes": layout}
        monkeypatch.setenv(selection.ENV, str(_write(comm, json.dumps(
            {"format": selection.FORMAT, "version": selection.VERSION,
             "world_sizes": {str(p): entry}}))))
        selection.clear_cache()
        dup = comm.Dup()
        try:
            sel = auto.selector(context(dup), 2)
            assert sel.nodes == nodes
            assert (sel.rules is not None) == (follows or len(nodes) == 1)
            assert (sel.model is not None) == (sel.rules is None and len(nodes) > 1)
            ran.clear()
            y = collectives.allreduce(x, algorithm="auto", comm=dup, options=opts)
            assert np.allclose(y, expected)
            want = "tree" if sel.rules else sel.pick(x.nbytes, x.size)
            assert ran == ([] if p == 1 else [want])
            if sel.model is not None:
                assert sel.pick(64 << 20, 16 << 20) in auto.MODEL_CHOICES
        finally:
            dup.Free()
            selection.clear_cache()
        comm.Barrier()


def test_allreduce_codec_columns_report_bytes_on_the_wire(capsys):
    """--codec adds a compressed column and bytes sent per rank; allgather's count is exact."""
    import compress

    records, text = _run(allreduce, "--algorithm", "ring", "--codec", "topk:ratio=0.25",
                         "--strategy", "allgather", "-c", "--sizes", "1024")
    by_name = {r.algorithm: r for r in records}
    assert set(by_name) == {"ring", "topk:ratio=0.25"} and all(r.valid for r in records)
    p = MPI.COMM_WORLD.size
    n = 1024 // 4
    payload = compress.get("topk", ratio=0.25).payload_nbytes(n)
    # ring allgather of the 8-byte sizes, then of the payloads
    assert by_name["topk:ratio=0.25"].bytes_per_rank == (8 + payload) * (p - 1)
    ring = 2 * (p - 1) * (-(-n // p)) * 4  # upper bound: p-1 steps of at most ceil(n/p) each way
    assert by_name["ring"].bytes_per_rank <= ring
    if MPI.COMM_WORLD.rank == 0:  # only rank 0 prints
        header = [line for line in text.splitlines() if line.startswith("# Size")][0]
        assert "ring(kB)" in header and "Validation" in header
    with pytest.raises(SystemExit) as info:
        _run(allreduce, "--codec", "fp16", "-T", "mpi_int")
    assert info.value.code == 2
    err = capsys.readouterr().err
    if MPI.COMM_WORLD.rank == 0:  # said once, by rank 0, in one line, without a usage block
        assert err.count("osu_allreduce: error: --codec needs a float type") == 1
        assert "usage:" not in err
    else:
        assert "error:" not in err


def test_osu_iallreduce_blocks_and_overlap():
    """osu_iallreduce: one OSU non-blocking block per algorithm (MPI_Iallreduce included),
    validated results, and OSU's overlap formula applied to the measured times."""
    from collectives.tools.osu import iallreduce

    comm = MPI.COMM_WORLD
    args = ["--sizes", "8,4096", "-i", "2", "-x", "1", "-T", "mpi_float", "-c", "-f",
            "--compute", "sleep", "-t", "2", "--algorithm", "mpi,native,ring"]
    if comm.size == 1:
        with pytest.raises(SystemExit, match="at least two processes"):
            iallreduce.main(args, comm=comm, out=io.StringIO())
        return
    out = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "nbc.json") if comm.rank == 0 else None
        records = iallreduce.main(args + (["--json", path] if path else []), comm=comm, out=out)
        if path:
            saved = json.loads(Path(path).read_text())
            assert len(saved["records"]) == 6 and saved["compute"] == "sleep"
    assert [(r.algorithm, r.size) for r in records] == \
        [(a, s) for s in (8, 4096) for a in ("mpi", "native", "ring")]
    for r in records:
        assert r.valid and r.iterations == 2 and r.pure_us > 0
        assert r.overlap_pct == iallreduce.overlap_percent(r.overall_us, r.compute_us,
                                                           r.test_us, r.pure_us)
        assert 0 <= r.overlap_pct <= 100
    if comm.rank == 0:
        text = out.getvalue()
        assert text.count("# OSU MPI Non-blocking Allreduce Latency Test v7.2") == 3
        assert "# Overall = Coll. Init + Compute + MPI_Test + MPI_Wait" in text
        header = [l for l in text.splitlines() if l.startswith("# Size")][0]
        assert header.split("  ")[0] == "# Size" and "Overlap(%)" in header and \
            "Pure Comm.(us)" in header and header.endswith("Validation")
        row = [l for l in text.splitlines() if l.startswith("4096")][0]
        assert len(row) == 10 + 7 * 20 + 20 and row.endswith("Pass")
    assert iallreduce.overlap_percent(10.0, 8.0, 0.0, 4.0) == 50.0  # OSU's example arithmetic
    assert iallreduce.overlap_percent(10.0, 2.0, 0.0, 4.0) == 0.0   # clipped at zero


def test_the_baseline_is_the_bare_mpi_call_where_mpi_has_the_type():
    """float16 has no MPI type: no "mpi" column then (the library's own still run); the ratio
    table takes "mpi" as its reference where a run has it."""
    from collectives.tools.osu.plot import ratio_table

    records, _ = _run(allreduce, "--algorithm", "all", "--sizes", "8", "-T", "float16")
    assert "mpi" not in {r.algorithm for r in records} and "native" in {r.algorithm for r in records}
    records, _ = _run(allreduce, "--algorithm", "all", "--sizes", "8")
    assert ratio_table(records).startswith("Median us per call over the iterations (ratio to mpi)")


@pytest.mark.parametrize("module", [allreduce, reduce_scatter, allgather, bcast, alltoall,
                                    alltoallv, gather, scatter, barrier])
def test_the_mpi_column_calls_no_library_code(module, monkeypatch):
    """``--algorithm mpi`` (and the ``mpi`` column of ``all``) times mpi4py's own call: with every
    public collective of the library and both of its call runners made to raise, it still runs,
    and its results validate."""
    from collectives import api
    from collectives._runtime import abort_mode, guard

    def refuse(*args, **kwargs):
        raise AssertionError("the mpi column called the library")

    for name in ("allreduce", "reduce_scatter", "allgather", "bcast", "reduce", "alltoall",
                 "gather", "scatter", "barrier"):
        monkeypatch.setattr(api, name, refuse)
        monkeypatch.setattr(collectives, name, refuse)
    monkeypatch.setattr(guard.Guard, "run", refuse)
    monkeypatch.setattr(abort_mode.Runner, "run", refuse)
    records, text = _run(module, "--algorithm", "mpi", "-c")
    assert records and {r.algorithm for r in records} == {"mpi"}
    if MPI.COMM_WORLD.rank == 0:
        assert "Pass" in text and "Fail" not in text, text
    with pytest.raises(AssertionError, match="called the library"):
        _run(module, "--algorithm", module.SPEC.default_algorithm)


def test_the_sweeps_mpi_column_calls_no_library_code(monkeypatch, capsys):
    """bench/allreduce_sweep.py's ``mpi`` column is mpi4py's own call: with the library's
    allreduce and both call runners made to raise it still runs; a column of ours then fails."""
    import importlib.util
    import sys

    from collectives import api
    from collectives._runtime import abort_mode, guard

    path = Path(__file__).resolve().parents[2] / "bench" / "allreduce_sweep.py"
    spec = importlib.util.spec_from_file_location("allreduce_sweep", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)

    def refuse(*args, **kwargs):
        raise AssertionError("the mpi column called the library")

    monkeypatch.setattr(api, "allreduce", refuse)
    monkeypatch.setattr(collectives, "allreduce", refuse)
    monkeypatch.setattr(guard.Guard, "run", refuse)
    monkeypatch.setattr(abort_mode.Runner, "run", refuse)
    args = ["allreduce_sweep.py", "--sizes", "8,4096", "--iterations", "3",
            "--iterations-large", "1"]
    monkeypatch.setattr(sys, "argv", [*args, "--algorithms", "mpi"])
    sweep.main()
    if MPI.COMM_WORLD.rank == 0:
        rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
        assert [r[0] for r in rows] == ["8", "4096"] and all(r[2] == "(" for r in rows), rows
    monkeypatch.setattr(sys, "argv", [*args, "--algorithms", "mpi,auto"])
    with pytest.raises(AssertionError, match="called the library"):
        sweep.main()
