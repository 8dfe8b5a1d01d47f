"""collectives.topology without MPI: the graphs, their weights, the checks and the spectral gap.

Every builder of the catalogue at every rank count 1..9, 12 and 16 against plain definitions
(neighbor sets written out, Metropolis-Hastings by its formula in a loop), the consensus rate
against NumPy's eigenvalues and against repeated mixing, and every check's error message.
"""

import math

import numpy as np
import pytest

from collectives.decentralized import topology as T

SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16]


def _offsets(p, offsets):
    """Plain definition of a circulant graph: in-neighbors of i are i - o for each offset."""
    return [sorted({(i - o) % p for o in offsets} - {i}) for i in range(p)]


def _expected_in_neighbors(name, p):
    if name == "ring":
        return _offsets(p, [1, -1])
    if name == "exponential":
        return _offsets(p, [2 ** k for k in range(math.ceil(math.log2(p)))] if p > 1 else [])
    if name == "full":
        return [sorted(set(range(p)) - {i}) for i in range(p)]
    if name == "torus":
        rows = max(r for r in range(1, int(math.isqrt(p)) + 1) if p % r == 0)
        cols = p // rows
        out = []
        for i in range(p):
            r, c = divmod(i, cols)
            out.append(sorted({((r + dr) % rows) * cols + (c + dc) % cols
                               for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))} - {i}))
        return out
    raise AssertionError(name)


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("name", list(T.GRAPHS))
def test_catalogue_is_doubly_stochastic_connected_and_consistent(name, p):
    t = T.build(name, p)
    assert t.size == p and t.stochastic == "doubly"
    t.check("doubly")
    for step in range(t.period):
        w = t.weights(step)
        assert not w.flags.writeable
        assert np.allclose(w.sum(axis=0), 1) and np.allclose(w.sum(axis=1), 1) and (w >= 0).all()
        for i in range(p):
            ins = t.in_neighbors(i, step)
            assert list(ins) == sorted(j for j in range(p) if j != i and w[i, j] > 0)
            for j in ins:  # j sends to i exactly when i receives from j
                assert i in t.out_neighbors(j, step)
            sw, ws = t.recv_weights(i, step)
            assert math.isclose(sw + sum(ws.values()), 1.0)
    if name != "one_peer_exponential":
        assert t.period == 1
        assert [list(t.in_neighbors(i)) for i in range(p)] == _expected_in_neighbors(name, p)
    assert 0.0 <= t.spectral_gap <= 1.0 + 1e-12
    if p > 1:
        assert t.spectral_gap > 0  # connected: consensus converges


@pytest.mark.parametrize("p", SIZES)
def test_one_peer_exponential_sends_one_message_per_round(p):
    t = T.one_peer_exponential(p)
    m = math.ceil(math.log2(p)) if p > 1 else 1
    assert t.period == m and t.dynamic == (m > 1)
    for step in range(2 * m):
        k = step % m
        for i in range(p):
            expected = [] if p == 1 else [(i + 2 ** k) % p]
            assert list(t.out_neighbors(i, step)) == expected
            assert list(t.in_neighbors(i, step)) == ([] if p == 1 else [(i - 2 ** k) % p])
        assert t.messages(step) == (0 if p == 1 else 1)
    # a power of two averages exactly over one period (gap 1); other sizes do not
    prod = np.eye(p)
    for step in range(m):
        prod = t.weights(step) @ prod
    exact = np.allclose(prod, 1.0 / p)
    assert exact == (p & (p - 1) == 0)
    assert (t.spectral_gap > 1 - 1e-9) == exact


@pytest.mark.parametrize("p", [3, 5, 8, 12])
def test_ring_gap_matches_its_closed_form_and_eigenvalues(p):
    """Uniform ring: W = (I + S + S^-1) / 3, eigenvalues (1 + 2 cos(2 pi k / p)) / 3."""
    t = T.ring(p)
    lam = sorted(abs((1 + 2 * math.cos(2 * math.pi * k / p)) / 3) for k in range(1, p))
    assert math.isclose(t.rho, lam[-1], rel_tol=1e-9, abs_tol=1e-12)
    slem = np.sort(np.abs(np.linalg.eigvals(t.weights())))[-2]  # symmetric W: rho = SLEM
    assert math.isclose(t.rho, slem, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("name", ["ring", "torus", "exponential", "one_peer_exponential"])
@pytest.mark.parametrize("p", [5, 7, 8])
def test_consensus_rate_is_bounded_by_rho(name, p):
    """Repeated mixing in NumPy: ||x_k - xbar|| <= rho^k ||x_0 - xbar|| at whole periods, and
    the bound is not loose by orders of magnitude (the error after the rounds stays above
    rho^k / 100 unless it reached rounding)."""
    t = T.build(name, p)
    rng = np.random.default_rng(p)
    x = rng.standard_normal((p, 3))
    xbar = x.mean(axis=0)
    e0 = np.linalg.norm(x - xbar)
    for k in range(1, 4 * t.period + 1):
        x = t.weights(k - 1) @ x
        if k % t.period == 0:
            err = np.linalg.norm(x - xbar)
            assert err <= t.rho ** k * e0 * (1 + 1e-9) + 1e-12, (k, err, t.rho ** k * e0)
    assert err >= min(t.rho ** k * e0 / 100, 1e-13) or err < 1e-12


def _metropolis_loop(adj):
    p = len(adj)
    deg = [sum(1 for j in range(p) if j != i and adj[i][j]) for i in range(p)]
    w = np.zeros((p, p))
    for i in range(p):
        for j in range(p):
            if i != j and adj[i][j]:
                w[i, j] = 1.0 / (1 + max(deg[i], deg[j]))
        w[i, i] = 1.0 - w[i].sum()
    return w


def test_metropolis_and_uniform_on_an_irregular_graph():
    """A star with a tail (irregular): Metropolis-Hastings is doubly stochastic and matches the
    formula; uniform is only row-stochastic, and the D-PSGD check says so."""
    adj = np.zeros((6, 6), dtype=int)
    for j in range(1, 5):
        adj[0, j] = adj[j, 0] = 1
    adj[4, 5] = adj[5, 4] = 1
    mh = T.from_adjacency(adj, weights="metropolis")
    assert np.allclose(mh.weights(), _metropolis_loop(adj))
    assert mh.stochastic == "doubly" and np.allclose(mh.weights(), mh.weights().T)
    uni = T.from_adjacency(adj, weights="uniform")
    assert uni.stochastic == "row"
    assert np.allclose(uni.weights()[0, [0, 1, 2, 3, 4]], 0.2)
    with pytest.raises(ValueError, match="D-PSGD needs a doubly stochastic weight matrix, but "
                       "column 0"):
        uni.check("doubly", "D-PSGD")
    uni.check("row")


@pytest.mark.parametrize("ids", [[0, 0, 0, 0], [0, 0, 2, 2], [0, 0, 2, 2, 2, 5, 5],
                                 [0, 1, 2], [3, 3, 3, 7], [0, 0, 0, 3, 3, 3, 6, 6, 6]])
@pytest.mark.parametrize("inter", ["ring", "full"])
def test_hierarchical_is_symmetric_doubly_stochastic_and_node_uniform(ids, inter):
    """Nodes of different sizes still give a doubly stochastic W; ranks of one node have the
    same row (they are one vertex); equal nodes give kron(node graph, J_s)."""
    t = T.hierarchical(ids, inter)
    w = t.weights()
    assert t.stochastic == "doubly" and np.allclose(w, w.T)
    labels = list(dict.fromkeys(ids))
    for a in labels:
        rows = [i for i, v in enumerate(ids) if v == a]
        assert all(np.array_equal(w[rows[0]], w[r]) for r in rows)
    sizes = [ids.count(a) for a in labels]
    if len(set(sizes)) == 1:
        nodes = T.build(inter, len(labels), "metropolis").weights()
        s = sizes[0]
        assert np.allclose(w, np.kron(nodes, np.full((s, s), 1.0 / s)))
    if len(labels) > 1 and len(ids) > len(labels):
        assert t.spectral_gap > 0


def test_user_weights_and_time_varying_list():
    w = np.array([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.5, 0.0, 0.5]])
    t = T.from_weights(w, name="mine")
    assert t.name == "mine(3)" and t.stochastic == "doubly"
    assert t.in_neighbors(0) == (1,) and t.out_neighbors(0) == (2,)
    t2 = T.from_weights([w, w.T])
    assert t2.period == 2 and np.array_equal(t2.weights(3), w.T)
    assert t.fingerprint != t2.fingerprint and T.from_weights(w).fingerprint == t.fingerprint


@pytest.mark.parametrize("spec,name,period", [
    ("ring", "ring(6)", 1), ("ring:metropolis", "ring(6)", 1),
    ("one_peer_exponential", "one_peer_exponential(6)", 3), ("torus", "torus(2x3)", 1)])
def test_parse(spec, name, period):
    t = T.parse(spec, 6)
    assert t.name == name and t.period == period


BAD = [
    (lambda: T.ring(0), "rank count must be a positive integer"),
    (lambda: T.build("star", 4), "unknown graph 'star'; valid choices: ring, torus"),
    (lambda: T.ring(4, weights="max"), "unknown weights 'max'; valid choices: uniform, metropolis"),
    (lambda: T.torus(6, shape=(4, 2)), "does not hold 6 ranks"),
    (lambda: T.exponential(5, weights="metropolis"), "needs an undirected graph, but rank"),
    (lambda: T.from_weights(np.ones((2, 3)) / 3), "must be square"),
    (lambda: T.from_weights([1.0, 2.0]), "p x p matrix or a list"),
    (lambda: T.from_weights([[0.5, 0.6], [0.5, 0.5]]), "row 0 (the weights rank 0 gives itself "
                                                      "and its in-neighbors) sums to 1.1"),
    (lambda: T.from_weights([[1.5, -0.5], [0.5, 0.5]]), "negative weight W[0, 1] = -0.5"),
    (lambda: T.from_weights([[np.nan, 1], [0.5, 0.5]]), "not finite"),
    (lambda: T.from_weights(np.eye(3)), "not connected: ranks 1, 2 cannot reach"),
    (lambda: T.from_weights([[0.5, 0.5], [0.0, 1.0]]), "not connected: rank 1"),
    (lambda: T.from_weights([np.eye(2), np.eye(3)]), "shape"),
    (lambda: T.one_peer_exponential(4).weights(), "changes every step (period 2): pass step="),
    (lambda: T.one_peer_exponential(4).in_neighbors(0, -1), "non-negative integer"),
    (lambda: T.ring(4).check_size(5), "neighbor_allreduce: topology ring(4) is for 4 ranks, "
                                      "the communicator has 5"),
    (lambda: T.ring(4).check("both"), "unknown requirement 'both'"),
    (lambda: T.hierarchical([0, 0, 1, 1], "exponential"), "unknown node graph 'exponential'"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_graphs_raise_clear_errors(case):
    make, text = BAD[case]
    with pytest.raises(ValueError) as info:
        make()
    assert text in str(info.value), str(info.value)
