"""Serial tests of the pieces the algorithms are built from (no mpiexec needed)."""

import os

import numpy as np
import pytest
from hypothesis import given, strategies as st
from mpi4py import MPI

import collectives
from collectives._runtime.arrays import check_input, check_out, flat
from collectives._runtime.ranks import nsegments, partition, split
from collectives.algorithms import ALGORITHMS, FLAT
from collectives._runtime.ranks import pof2_of, real_rank
from collectives.algorithms.pof2 import doubling, fold, halving
from collectives.algorithms.auto import algorithm_for
from collectives.blocks.binomial import tree
from collectives.ops import get_op
from collectives.options import ENV, Options, raw_values


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_partition_is_array_split(count, parts):
    offsets = partition(count, parts)
    expected = np.cumsum([0] + [len(a) for a in np.array_split(np.empty(count), parts)])
    assert offsets == expected.tolist()


@given(st.integers(0, 500), st.integers(0, 500), st.integers(1, 40))
def test_split_covers_range_in_order(lo, length, parts):
    slices = split(lo, lo + length, parts)
    assert len(slices) == parts
    assert slices[0].start == lo and slices[-1].stop == lo + length
    assert all(a.stop == b.start for a, b in zip(slices, slices[1:]))


@given(st.integers(0, 10**7), st.sampled_from([1, 2, 4, 8]), st.integers(1, 1 << 22))
def test_nsegments_respects_segment_size(longest, itemsize, segment_bytes):
    n = nsegments(longest, itemsize, segment_bytes)
    assert n >= 1
    per = max(1, segment_bytes // itemsize)
    assert -(-longest // n) <= per


@given(st.integers(1, 300))
def test_binomial_tree_is_a_spanning_tree(p):
    parents = {}
    for v in range(p):
        parent, children = tree(v, p)
        assert (parent is None) == (v == 0)
        for c in children:
            assert c < p and c not in parents
            parents[c] = v
            assert tree(c, p)[0] == v
    assert sorted(parents) == list(range(1, p))


@given(st.integers(1, 1000))
def test_fold_maps_onto_power_of_two(p):
    pof2 = pof2_of(p)
    assert pof2 <= p < 2 * pof2
    rem = p - pof2
    players = sorted(real_rank(n, rem) for n in range(pof2))
    assert len(set(players)) == pof2 and all(0 <= r < p for r in players)
    assert all(r % 2 == 1 for r in players if r < 2 * rem)  # odd ranks play; evens sit out


@pytest.mark.parametrize("p", range(1, 34))
def test_pof2_schedule_pairs_every_rank_consistently(p):
    """The one schedule: the fold pairs each sitting-out rank with an absorbing one, the group has
    new ranks 0..pof2-1 (real_rank maps them back), and at every doubling or halving step each
    rank's partner has it as partner."""
    folds = [fold(r, p) for r in range(p)]
    pof2 = pof2_of(p)
    for r, f in enumerate(folds):
        assert f.pof2 == pof2 and f.rem == p - pof2
        if f.sits_out:
            assert f.partner == r + 1 and folds[r + 1].absorbs and folds[r + 1].partner == r
        else:
            assert real_rank(f.newrank, f.rem) == r
    group = sorted(f.newrank for f in folds if not f.sits_out)
    assert group == list(range(pof2))
    for steps in (doubling, halving):
        plans = {n: steps(n, pof2, p - pof2) for n in range(pof2)}
        assert all(len(plan) == pof2.bit_length() - 1 for plan in plans.values())
        for n, plan in plans.items():
            for s, step in enumerate(plan):
                partner, peer = step[-2], step[-1]
                assert plans[partner][s][-2] == n and peer == real_rank(partner, p - pof2)


def test_compression_state_checks_its_parts():
    import compress
    from collectives import CompressionState

    topk, fp16 = compress.get("topk"), compress.get("fp16")
    state = CompressionState.of(topk, error_feedback=None)  # topk needs error feedback
    assert state.memory.codec is topk and state.server.codec is topk and state.step == 0
    assert CompressionState.of(fp16, error_feedback=None).memory is None
    assert CompressionState.of(fp16).server is None  # fp16 needs no error feedback
    ef = compress.ErrorFeedback(topk)
    assert CompressionState.of(ef).memory is ef and CompressionState.of(state) is state
    with pytest.raises(TypeError, match="compress codec"):
        CompressionState("topk")
    with pytest.raises(ValueError, match="around this state's codec"):
        CompressionState(fp16, memory=ef)
    with pytest.raises(ValueError, match="step"):
        CompressionState(fp16, step=-1)
    assert sorted(state.state_dict()) == ["step"]


def test_tables_name_every_algorithm():
    assert set(ALGORITHMS) == {"ring", "tree", "recursive_doubling", "rabenseifner",
                               "hierarchical", "shm", "native", "auto"}
    assert set(FLAT) <= set(ALGORITHMS)
    assert collectives.ALGORITHMS is ALGORITHMS


@pytest.mark.parametrize("p", [2, 3, 4, 8, 64])
def test_auto_chooses_a_flat_algorithm(p):
    for nbytes in [0, 8, 1 << 16, (1 << 16) + 8, 1 << 20, 1 << 26]:
        assert algorithm_for(nbytes, nbytes // 4, p) in FLAT
    assert algorithm_for(4, 1, p) == "native"
    assert algorithm_for((1 << 16) + 8, (1 << 16) // 2, p) == "rabenseifner"  # int16: more bytes
    assert algorithm_for(1 << 20, 1 << 18, p) == "rabenseifner"


def test_ops_resolve_names_and_mpi_objects():
    f32 = np.dtype(np.float32)
    assert get_op("sum", f32).ufunc is np.add
    assert get_op(MPI.MAX, f32).name == "max"
    assert get_op("avg", f32).average
    with pytest.raises(TypeError, match="floating"):
        get_op("avg", np.dtype(np.int8))
    with pytest.raises(ValueError, match="valid ops"):
        get_op("mean", f32)


@pytest.mark.parametrize("name", ["sum", "prod", "min", "max", "avg"])
def test_float16_combine_gives_numpys_bits(name):
    """get_op on float16 gives an op whose combine (a compiled loop from HALF_KERNEL_ELEMENTS
    elements, NumPy below) has NumPy's float16 ufunc's bits: every pair of special values
    (signed zeros, NaNs with payloads and signalling ones, infinities, the largest and
    subnormal values) and random ones that overflow, into a new array and in place into
    either operand; it is still the elementwise op the shared-memory kernels run."""
    from collectives.ops import HALF_KERNEL_ELEMENTS, elementwise

    op = get_op(name, np.dtype(np.float16))
    assert op.ufunc is get_op(name, np.dtype(np.float32)).ufunc and elementwise(op)
    words = np.array([0x0000, 0x8000, 0x7E00, 0xFE00, 0x7E01, 0xFD00, 0x7C01, 0x7C00, 0xFC00,
                      0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x3C00, 0xBC00, 0x00A8], np.uint16)
    a0, b0 = np.repeat(words, words.size), np.tile(words, words.size)
    rng = np.random.default_rng(1)
    for n in (HALF_KERNEL_ELEMENTS - a0.size - 1, 3 * HALF_KERNEL_ELEMENTS + 5):  # both sides
        a = np.concatenate([a0.view(np.float16),
                            (rng.standard_normal(n) * 300).astype(np.float16)])
        b = np.concatenate([b0.view(np.float16),
                            (rng.standard_normal(n) * 300).astype(np.float16)])
        with np.errstate(all="ignore"):
            want = op.ufunc(a, b).view(np.uint16)
        out = np.empty_like(a)
        with np.errstate(all="ignore"):  # NumPy's loop below the threshold warns of overflow
            op.combine(a, b, out)
        assert np.array_equal(out.view(np.uint16), want), (n, np.flatnonzero(
            out.view(np.uint16) != want)[:5])
        for into in (0, 1):
            pair = [a.copy(), b.copy()]
            with np.errstate(all="ignore"):
                op.combine(pair[0], pair[1], pair[into])
            assert np.array_equal(pair[into].view(np.uint16), want), (n, into)


def test_array_checks():
    x = np.zeros((3, 4))
    assert check_input(x) is x
    assert check_out(x, x) is x  # in place
    with pytest.raises(ValueError, match="contiguous"):
        check_input(x[:, ::2])
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros((3, 4))
        ro.flags.writeable = False
        check_out(ro, x)
    f = np.asfortranarray(x)
    assert np.shares_memory(flat(f), f) and flat(f).shape == (12,)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "0"])
def test_shm_cma_bytes_checks_itself(bad):
    assert Options(shm_cma_bytes=0).shm_cma_bytes == 0 and Options().shm_cma_bytes is None
    with pytest.raises(ValueError, match="shm_cma_bytes must be a non-negative integer"):
        Options(shm_cma_bytes=bad)


def test_options_from_environment(monkeypatch):
    monkeypatch.setenv(ENV["segment_bytes"], "64")
    monkeypatch.setenv(ENV["node_size"], "2")
    monkeypatch.setenv(ENV["inter_algorithm"], "tree")
    monkeypatch.setenv(ENV["validate"], "yes")
    assert Options.from_env() == Options(segment_bytes=64, node_size=2, inter_algorithm="tree",
                                         validate=True)
    monkeypatch.setenv(ENV["segment_bytes"], "lots")
    with pytest.raises(ValueError, match="not an integer"):
        Options.from_env()


def test_options_see_every_change_of_the_environment(monkeypatch):
    """Options.from_env reads the variables at every call (the C environment on POSIX): each
    way of changing it from Python shows at the next call, and what it reads is what
    os.environb holds."""
    name = ENV["segment_bytes"]
    monkeypatch.setenv(name, "64")  # register the variable for restoring
    changes = [
        (lambda: os.environ.__setitem__(name, "65"), 65),
        (lambda: os.environb.__setitem__(os.fsencode(name), b"66"), 66),
        (lambda: os.environ.update({name: "67"}), 67),
        (lambda: os.environ.pop(name), Options.segment_bytes),
        (lambda: os.environ.setdefault(name, "68"), 68),
        (lambda: os.environ.__delitem__(name), Options.segment_bytes),
        (lambda: os.environ.__setitem__(name, ""), Options.segment_bytes),
        (lambda: os.putenv(name, "69"), 69),  # the C environment only
        (lambda: os.unsetenv(name), Options.segment_bytes),
    ]
    for change, expected in changes:
        change()
        assert Options.from_env().segment_bytes == expected
        assert Options.from_env().segment_bytes == expected  # and again, from the cache
        if not {"putenv", "unsetenv"} & set(change.__code__.co_names):  # C only
            assert raw_values() == tuple(map(os.environb.get, map(os.fsencode, ENV.values())))


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_single_process_is_a_copy(algorithm):
    """In this (singleton MPI) process every algorithm returns the input, on COMM_SELF too."""
    x = np.arange(10, dtype=np.float16)
    for comm in (None, MPI.COMM_SELF):
        y = collectives.allreduce(x, algorithm=algorithm, op="avg", comm=comm)
        assert y is not x and np.array_equal(y, x)


def test_timeout_options_from_environment(monkeypatch):
    monkeypatch.setenv(ENV["timeout"], "2.5")
    monkeypatch.setenv(ENV["stall_warning"], "off")
    opts = Options.from_env()
    assert opts.timeout == 2.5 and opts.stall_warning is None
    monkeypatch.delenv(ENV["timeout"])
    monkeypatch.delenv(ENV["stall_warning"])
    assert Options.from_env().timeout is None and Options.from_env().stall_warning == 60.0
    monkeypatch.setenv(ENV["timeout"], "soon")
    with pytest.raises(ValueError, match="COLLECTIVES_TIMEOUT='soon' is not a number of seconds"):
        Options.from_env()
    for bad in (0, -1, "3", True):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            Options(timeout=bad)


def test_scratch_reuses_its_view_and_forget_hands_out_new_memory():
    from collectives._runtime.workspace import forget, scratch

    like = np.zeros(3, np.float32)
    a = scratch("unit.scratch", 5, like)
    assert a.dtype == np.float32 and a.shape == (5,)
    assert scratch("unit.scratch", 5, like) is a  # a repeated request: the same view
    b = scratch("unit.scratch", 2, np.zeros(1, np.float64))
    assert np.shares_memory(a, b)  # one buffer per name, as before the views were kept
    big = scratch("unit.scratch", 1 << 16, like)  # grows: the smaller buffer's views are dropped
    again = scratch("unit.scratch", 5, like)
    assert again is not a and np.shares_memory(again, big)
    forget("unit.scratch", again)  # an operation MPI has not finished still owns it
    after = scratch("unit.scratch", 5, like)
    assert not np.shares_memory(after, again) and not np.shares_memory(after, big)
    assert scratch("unit.other", 5, like) is not after  # names never share
    from collectives._runtime import workspace

    views = [scratch("unit.sizes", n, like) for n in range(3 * workspace.MAX_ENTRIES, 0, -1)]
    assert len(workspace._LOCAL.pool) <= workspace.MAX_ENTRIES + 2  # ever new sizes: bounded
    assert all(np.shares_memory(v, views[0]) for v in views)  # one buffer, the first's


def test_copy_into_copies_and_keeps_copyto_casting_rules():
    from collectives._runtime.arrays import copy_into

    src, dst = np.arange(7, dtype=np.float32), np.zeros(7, np.float32)
    copy_into(src, dst)
    assert np.array_equal(src, dst)
    copy_into(dst, dst)  # the same buffer: nothing to do
    wide = np.zeros(7, np.float64)
    copy_into(src, wide)  # another dtype goes through np.copyto ...
    assert np.array_equal(wide, src)
    with pytest.raises(TypeError):  # ... whose same-kind rule a plain assignment would not keep
        copy_into(np.full(7, 1.5), np.zeros(7, np.int32))


@pytest.mark.parametrize("local, cores, expected", [("2", 2, 16), ("3", 2, 0), ("", 4, 16)])
def test_waits_test_before_yielding_only_with_a_core_per_rank(monkeypatch, local, cores,
                                                               expected):
    from collectives._runtime import guard

    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    monkeypatch.setenv("MPI_LOCALNRANKS", local)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert guard.EAGER_TESTS == 16
    assert guard.eager_tests() == expected  # "": unknown, the world's size (1 here) counts


def test_staged_passes_numpy_arrays_and_keywords_through():
    from collectives._runtime.device import staged

    seen = []
    fn = staged(0, 1)(lambda a, b, c=None: seen.append((a, b, c)) or "done")
    x = np.ones(2)
    assert fn(x, x) == "done" and fn(x, None, c=3) == "done" and fn(x, x, c=4) == "done"
    assert [c for _, _, c in seen] == [None, 3, 4] and seen[1][1] is None
    assert staged(0, 1, 2)(lambda a, b, c: "three")(x, x, x) == "three"


def test_only_the_mpi_libraries_segments_are_removed(tmp_path, monkeypatch):
    """``mpi_shm_files.unlink_mapped`` (before MPI_Abort) reads the process's mappings and removes
    the MPI libraries' files in /dev/shm only, each once, a name already gone skipped; another
    program's file there (PyTorch's, a user's) is never touched."""
    from collectives._runtime import mpi_shm_files

    shm = tmp_path / "dev" / "shm"  # stands for /dev/shm: the paths are rewritten below
    shm.mkdir(parents=True)
    names = ["mpich_shm_1a2b_0", "sm_segment.vm.0.7.1", "torch_42_1", "mpich_shm_gone_0"]
    for name in names[:3]:
        (shm / name).write_text("")
    maps = tmp_path / "maps"
    maps.write_text("".join(
        f"7f00{i:04x}000-7f00{i:04x}fff rw-s 00000000 00:1a {100 + i}  /dev/shm/{name}{tail}\n"
        for i, (name, tail) in enumerate([(names[0], ""), (names[0], ""), (names[1], " (deleted)"),
                                          (names[2], ""), (names[3], "")]))
        + "7f0100000000-7f0100001000 r-xp 00000000 00:1a 7  /usr/lib/libmpi.so.12\n"
        + "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0  [stack]\n"
        + "7ffd00100000-7ffd00101000 r--p 00000000 00:00 0\n")
    assert mpi_shm_files.mapped(str(maps)) == [f"/dev/shm/{n}" for n in (names[0], names[1], names[3])]
    real = os.unlink
    monkeypatch.setattr(os, "unlink", lambda path: real(shm / os.path.basename(path)))
    gone = mpi_shm_files.unlink_mapped(str(maps))  # removes inside tmp_path only
    monkeypatch.undo()
    assert gone == [f"/dev/shm/{names[0]}", f"/dev/shm/{names[1]}"]
    assert sorted(p.name for p in shm.iterdir()) == ["torch_42_1"]
    assert mpi_shm_files.mapped(str(tmp_path / "no-such-file")) == []


def test_native_signatures_are_one_object_each_and_bounded(monkeypatch):
    """_runtime/agree.key: equal signatures are one object (a repeat compares by identity), and
    a workload of ever new counts does not keep every signature: past the bound the table starts
    again, and an equal signature made anew is a new object (checked once more, never wrong)."""
    from collectives._runtime import agree

    monkeypatch.setattr(agree, "_MAX_KEYS", 8)
    monkeypatch.setattr(agree, "_KEYS", {})
    monkeypatch.setattr(agree, "_HASHES", {})
    f32 = np.dtype(np.float32)
    first = agree.key("allreduce", 10, f32, "sum")
    assert agree.key("allreduce", 10, f32, "sum") is first
    assert agree._hash(first) == agree._hash(("allreduce", 10, f32, "sum", None, None))
    for n in range(100):
        agree.key("allreduce", 1000 + n, f32, "sum")
        assert len(agree._KEYS) <= 8 and len(agree._HASHES) <= 8
    again = agree.key("allreduce", 10, f32, "sum")
    assert again == first and again is not first
