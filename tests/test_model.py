"""Serial tests of the cost model, its fit, and the projection command."""

import io
import math

import numpy as np
import pytest

from collectives.tuning.cost_model import COSTS, Network, best, predict, predict_all
from collectives.tuning.fit import fit_line, fit_network
from collectives.tuning.projection import main as project_main
from collectives.tuning.projection import project

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
    inter = Network(alpha=10 * A, beta=10 * B, gamma=G, segment_bytes=1 << 40)
    expected = predict("ring", n, 4, NET) + predict("ring", n / 4, 2, inter)
    assert math.isclose(predict("hierarchical", n, 8, slow), expected)
    extras = Network(alpha=A, beta=B, gamma=G, segment_bytes=1 << 40, node_size=4)
    assert predict("hierarchical", n, 7, extras) > predict("hierarchical", n, 6, extras)


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
    assert lines[0].startswith("# alpha")
    assert len(lines) == 1 + 2 + 4 and "hierarchical / best" in lines[1]
