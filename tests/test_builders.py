"""Tree builders: DDTree is the exact top-B prefixes (brute force), nested, prefix-closed; chain is the argmax path."""
import itertools

import numpy as np
import pytest

from core.builders import build_chain, build_ddtree
from core.tree import DraftTree, ancestor_mask, child_maps, path_to, position_ids, truncate


def marginals(seed: int, n_pos: int, k: int, ties: bool = False):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n_pos, 40)) * 2
    if ties:
        logits = np.round(logits)          # many equal probabilities
    logq = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    order = np.argsort(-logq, axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(logq, order, -1).astype(np.float32), order.astype(np.int64)


def brute_force_top(logq, tokens, budget):
    """Every prefix of the K-ary lattice, scored by the same float sums, sorted by (-score, rank tuple)."""
    n_pos, k = logq.shape
    lq = logq.astype(np.float64).tolist()
    items = []
    for d in range(1, n_pos + 1):
        for ranks in itertools.product(range(k), repeat=d):
            s = 0.0
            for i, r in enumerate(ranks):
                s = s + lq[i][r]
            items.append((-s, ranks))
    items.sort()
    return [tuple(int(tokens[i][r]) for i, r in enumerate(ranks)) for _, ranks in items[:budget]]


def prefixes(tree: DraftTree):
    return [tuple(tree.tokens[j] for j in path_to(tree, i)[1:]) for i in range(1, len(tree.tokens))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [1, 3, 10, 40, 120])
@pytest.mark.parametrize("ties", [False, True])
def test_ddtree_is_exact_top_b(seed, budget, ties):
    logq, tokens = marginals(seed, n_pos=4, k=3, ties=ties)
    tree = build_ddtree(logq, tokens, budget, bonus=7)
    assert prefixes(tree) == brute_force_top(logq, tokens, budget)


@pytest.mark.parametrize("seed", range(4))
def test_ddtree_valid_nested_and_bounded(seed):
    logq, tokens = marginals(seed, n_pos=6, k=5)
    big = build_ddtree(logq, tokens, 200, bonus=3)
    assert big.size == 200 and big.tokens[0] == 3 and big.max_depth <= 6
    assert all(big.depths[i] == big.depths[big.parents[i]] + 1 for i in range(1, 201))
    scores = big.prefix_logq[1:]
    assert all(a >= b for a, b in zip(scores, scores[1:]))          # pops come out in non-increasing q(u)
    pre = set(prefixes(big))
    assert all(p[:-1] in pre or len(p) == 1 for p in pre)            # prefix-closed
    for b in (1, 7, 50, 199):
        small = build_ddtree(logq, tokens, b, bonus=3)
        assert small == truncate(big, b)                              # nested property


def test_ddtree_budget_larger_than_lattice_and_edge_cases():
    logq, tokens = marginals(1, n_pos=2, k=2)
    tree = build_ddtree(logq, tokens, 100, bonus=0)
    assert tree.size == 2 + 4                                          # the whole 2-ary lattice of depth 2
    assert build_ddtree(logq, tokens, 0, bonus=0).size == 0
    assert build_ddtree(logq[:0], tokens[:0], 10, bonus=0).size == 0


@pytest.mark.parametrize("budget", [1, 3, 8, 50])
def test_chain_is_argmax_path(budget):
    logq, tokens = marginals(0, n_pos=8, k=4)
    chain = build_chain(logq, tokens, budget, bonus=9)
    depth = min(budget, 8)
    assert chain.tokens == [9] + tokens[:depth, 0].tolist()
    assert chain.parents == list(range(-1, depth))
    assert chain == truncate(build_chain(logq, tokens, 50, bonus=9), budget)
    # a chain is the DDTree of K = 1
    assert chain == build_ddtree(logq[:, :1], tokens[:, :1], budget, bonus=9)


def test_expected_accepted_is_sum_of_prefix_probabilities():
    logq, tokens = marginals(2, n_pos=3, k=3)
    tree = build_ddtree(logq, tokens, 12, bonus=0)
    total = 0.0
    for i in range(1, len(tree.tokens)):
        total += np.prod([np.exp(logq[tree.depths[j] - 1, tree.ranks[j]]) for j in path_to(tree, i)[1:]])
    assert tree.expected_accepted == pytest.approx(total, rel=1e-6)


def test_mask_positions_and_child_maps():
    logq, tokens = marginals(3, n_pos=4, k=3)
    tree = build_ddtree(logq, tokens, 20, bonus=5)
    mask = ancestor_mask(tree)
    n = len(tree.tokens)
    assert mask.shape == (n, n) and mask.diagonal().all()
    for i in range(n):
        assert set(np.flatnonzero(mask[i])) == set(path_to(tree, i))   # exactly the ancestors and itself
    assert (position_ids(tree, 100) == 100 + mask.sum(1) - 1).all()     # position = past_len + depth
    maps = child_maps(tree)
    for i in range(1, n):
        assert maps[tree.parents[i]][tree.tokens[i]] == i
