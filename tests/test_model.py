"""Serial tests of the cost model, its fit, and the projection command."""

import io
import json
import math

import numpy as np
import pytest

from collectives.selection.cost_model import COSTS, Network, best, predict, predict_all
from collectives.tools.tuning.fit import fit_alpha_beta, fit_line, fit_network
from collectives.tools.tuning.projection import main as project_main
from collectives.tools.tuning.projection import project

A, B, G = 2e-6, 1e-9, 5e-10
NET = Network(alpha=A, beta=B, gamma=G, segment_bytes=1 << 40)  # one segment: textbook forms


@pytest.mark.parametrize("p", [2, 4, 8, 64])
@pytest.mark.parametrize("n", [8.0, 1e6])
def test_textbook_formulas_for_powers_of_two(p, n):
    lg = math.log2(p)
    share = n * (p - 1) / p
    assert math.isclose(predict("recursive_doubling", n, p, NET), lg * (A + n * B + n * G))
    assert math.isclose(predict("rabenseifner", n, p, NET), 2 * lg * A + 2 * share * B + share * G)
    assert math.isclose(predict("ring", n, p, NET), 2 * (p - 1) * A + 2 * share * B + share * G)
    assert math.isclose(predict("tree", n, p, NET), 2 * lg * A + 2 * n * lg * B + n * lg * G)


@pytest.mark.parametrize("p", [3, 5, 6, 7])
def test_fold_adds_two_messages_and_a_reduction(p):
    n = 4096.0
    pof2 = 1 << (p.bit_length() - 1)
    fold = 2 * A + 2 * n * B + n * G
    for name in ("recursive_doubling", "rabenseifner"):
        assert math.isclose(predict(name, n, p, NET), predict(name, n, pof2, NET) + fold)


def test_segments():
    net = Network(alpha=A, beta=B, gamma=G, segment_bytes=1000)
    n, p = 16000.0, 4  # blocks of 4000 bytes: 4 segments each
    assert math.isclose(predict("ring", n, p, net) - predict("ring", n, p, NET), 2 * 3 * 3 * A)
    s = 16  # tree: 16 segments of 1000 bytes through 2 levels, pipelined
    assert math.isclose(predict("tree", n, p, net), (2 + s - 1) * (2 * A + 2000 * B + 1000 * G))


def test_hierarchical():
    n = 1e6
    assert math.isclose(predict("hierarchical", n, 8, NET), predict("ring", n, 8, NET))
    slow = Network(alpha=A, beta=B, gamma=G, segment_bytes=1 << 40, node_size=4,
                   alpha_inter=10 * A, beta_inter=10 * B)
    # the 4 position holders of a node run their rings across at once: 4 flows share its link
    shared = Network(alpha=10 * A, beta=4 * 10 * B, gamma=G, segment_bytes=1 << 40)
    expected = predict("ring", n, 4, NET) + predict("ring", n / 4, 2, shared)
    assert math.isclose(predict("hierarchical", n, 8, slow), expected)
    extras = Network(alpha=A, beta=B, gamma=G, segment_bytes=1 << 40, node_size=4)
    assert predict("hierarchical", n, 7, extras) > predict("hierarchical", n, 6, extras)
    # emulated nodes on one machine (no inter parameters): one level, no link sharing
    one = Network(alpha=A, beta=B, gamma=G, segment_bytes=1 << 40)
    assert math.isclose(predict("hierarchical", n, 8, extras),
                        predict("ring", n, 4, NET) + predict("ring", n / 4, 2, one))


TWO = Network(alpha=A, beta=B, gamma=G, segment_bytes=1 << 40, node_size=2,
              alpha_inter=50 * A, beta_inter=20 * B)
FLATS = ["ring", "tree", "recursive_doubling", "rabenseifner", "native"]


@pytest.mark.parametrize("name", FLATS + ["hierarchical"])
@pytest.mark.parametrize("p", [2, 3, 4, 7, 8])
def test_two_levels_reduce_to_one(name, p):
    """One node holding every rank: the intra parameters only; one rank per node: inter only
    (but for the tree, whose root's link receives from all its children at once, which one
    level, with no links to share, cannot see)."""
    n = 3e5
    one_node = Network(**{**TWO.__dict__, "node_size": p})
    assert math.isclose(predict(name, n, p, one_node), predict(name, n, p, NET))
    if name not in ("hierarchical", "tree"):
        own = Network(**{**TWO.__dict__, "node_size": 1})
        inter = Network(alpha=50 * A, beta=20 * B, gamma=G, segment_bytes=1 << 40)
        assert math.isclose(predict(name, n, p, own), predict(name, n, p, inter))


def test_two_level_steps_follow_the_partners():
    """2 nodes x 2 ranks: which steps cross, and how many of a node's ranks share its link."""
    n, ai, bi = 1e6, 50 * A, 20 * B
    share = n / 4
    # ring: every step has one pair crossing per node (and one inside): the slow link decides
    assert math.isclose(predict("ring", n, 4, TWO), 6 * (ai + share * bi) + 3 * share * G)
    # Rabenseifner: halving mask 2 crosses with both ranks of a node at once, mask 1 stays inside
    rab = 2 * (ai + 2 * (n / 2) * bi) + 2 * (A + (n / 4) * B) + (n / 2 + n / 4) * G
    assert math.isclose(predict("rabenseifner", n, 4, TWO), rab)
    # recursive doubling: mask 1 inside, mask 2 across with both ranks of a node
    rd = (A + n * B) + (ai + 2 * n * bi) + 2 * n * G
    assert math.isclose(predict("recursive_doubling", n, 4, TWO), rd)
    # hierarchical with ring across: a node's link carries 2 n (N-1)/N, the least possible
    no_intra = Network(**{**TWO.__dict__, "alpha": 0.0, "beta": 0.0, "gamma": 0.0,
                          "alpha_inter": 0.0})
    assert math.isclose(predict("hierarchical", n, 4, no_intra), n * bi)
    assert math.isclose(predict("ring", n, 4, no_intra), 1.5 * n * bi)


@pytest.mark.parametrize("p,m", [(8, 2), (12, 4), (7, 3), (16, 1), (6, 6)])
def test_tree_pattern_matches_the_binomial_tree(p, m):
    from collectives.blocks.binomial import tree as binomial
    from collectives.selection.cost_model import _tree_pattern

    out, into, intra = {}, {}, False
    for v in range(1, p):
        parent = binomial(v, p)[0]
        if parent // m == v // m:
            intra = True
        else:
            out[v // m] = out.get(v // m, 0) + 1
            into[parent // m] = into.get(parent // m, 0) + 1
    assert _tree_pattern(p, m) == (max([*out.values(), *into.values(), 0]), intra)
    if m == 1:  # every edge crosses: the root receives from all its lg p children at once
        assert _tree_pattern(p, m)[0] == (p - 1).bit_length()


def test_native_is_mpich_rule_with_its_own_alpha():
    net = Network(alpha=A, beta=B, gamma=G, alpha_native=A / 10)
    small = Network(alpha=A / 10, beta=B, gamma=G)
    assert math.isclose(predict("native", 64, 4, net), predict("recursive_doubling", 64, 4, small))
    assert math.isclose(predict("native", 1e6, 4, net), predict("rabenseifner", 1e6, 4, small))


def test_best_and_errors():
    assert best(8, 64, NET, ["ring", "recursive_doubling"]) == "recursive_doubling"
    assert best(1e8, 64, NET, ["tree", "recursive_doubling", "rabenseifner"]) == "rabenseifner"
    assert set(predict_all(8, 4, NET)) == set(COSTS)
    with pytest.raises(ValueError, match="valid choices"):
        predict("bogus", 8, 4, NET)
    with pytest.raises(ValueError):
        Network(alpha=-1, beta=0, gamma=0)


def test_fit_recovers_alpha_beta_from_noisy_pingpong():
    rng = np.random.default_rng(0)
    sizes = np.array([8, 64, 1024, 8192, 65536, 1 << 20, 8 << 20], float)
    times = (3e-6 + sizes * 2.5e-10) * rng.uniform(0.97, 1.03, sizes.size)
    alpha, beta = fit_line(sizes, times)
    assert alpha == pytest.approx(3e-6, rel=0.05) and beta == pytest.approx(2.5e-10, rel=0.05)


def test_fit_network():
    sizes = [8, 1024, 1 << 20]
    net = fit_network({s: A + s * B for s in sizes}, {s: 1e-7 + s * G for s in sizes},
                      native_small=(3e-6, 8), segment_bytes=4096)
    assert net.alpha == pytest.approx(A) and net.beta == pytest.approx(B)
    assert net.gamma == pytest.approx(G) and net.alpha_native == pytest.approx(1e-6)
    assert net.segment_bytes == 4096
    with pytest.raises(ValueError):
        fit_line([1], [1])


def test_projection_winners():
    net = Network(alpha=5e-6, beta=8e-10, gamma=1e-10)
    table = project([16, 4096], [8, 256 << 20], net)
    winner = {k: min(v, key=v.__getitem__) for k, v in table.items()}
    assert winner[(4096, 8)] == "recursive_doubling"
    assert winner[(16, 256 << 20)] in ("ring", "rabenseifner")
    intra = Network(alpha=1e-6, beta=1e-10, gamma=1e-10, node_size=8)
    assert "hierarchical" in project([64], [1 << 20], net, intra)[(64, 1 << 20)]


def test_projection_command_prints_a_table():
    out = io.StringIO()
    project_main(["--ranks", "16,4096", "--sizes", "8,1M", "--node-size", "8"], out=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("# across nodes alpha 5e-06 s") and "nodes of 8" in lines[0]
    assert len(lines) == 1 + 2 + 4 and "hierarchical / best" in lines[1]
    out = io.StringIO()
    project_main(["--ranks", "16", "--sizes", "8"], out=out)
    assert out.getvalue().startswith("# alpha 5e-06 s") and "hierarchical" not in out.getvalue()


def test_projection_from_a_tuning_file(tmp_path):
    path = tmp_path / "t.json"
    model = {"alpha": 1e-6, "beta": 1e-10, "gamma": 1e-10, "alpha_inter": 1e-4,
             "beta_inter": 8e-9, "node_size": 2}
    rules = [{"max_bytes": None, "algorithm": "ring"}]
    path.write_text(json.dumps({"format": "collectives-tuning", "version": 1, "world_sizes": {
        "2": {"rules": rules, "model": {"alpha": 1e-6, "beta": 1e-10, "gamma": 1e-10}},
        "4": {"rules": rules, "model": model}}}))
    out = io.StringIO()
    project_main(["--model", str(path), "--ranks", "64", "--sizes", "64M", "--node-size", "8"],
                 out=out)
    text = out.getvalue()
    assert "alpha 0.0001 s" in text and "nodes of 8" in text
    assert "| 64 | 64 MiB | hierarchical |" in text  # a slow network, 8-rank nodes: it wins
    with pytest.raises(SystemExit):
        project_main(["--model", str(path), "--world-size", "8"], out=io.StringIO())


def test_fit_alpha_beta_ignores_a_token_bucket_burst():
    """A shaped link lets its first 250 kB through at once: small and medium messages look fast.
    beta comes from the large messages' slope; alpha from the small ones."""
    rate, burst, alpha = 125e6, 250e3, 20e-6
    times = {n: alpha + max(n - burst, 0) / rate for n in (8, 1024, 64 << 10, 1 << 20, 4 << 20,
                                                           8 << 20)}
    a, b = fit_alpha_beta(times)
    assert b == pytest.approx(1 / rate, rel=1e-6) and a == pytest.approx(alpha, rel=1e-2)
    _, b_all = fit_line(list(times), list(times.values()))
    assert b_all < 0.8 / rate  # what a fit over every size made of it
    assert fit_alpha_beta({8: 1e-6, 1 << 20: 1e-3}) == fit_line([8, 1 << 20], [1e-6, 1e-3])
