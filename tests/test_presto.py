"""PRESTO: lam = 0 is DDTree; best-first is the exact top-B under S; beam width respected; the n-gram model is a
proper distribution; both PRESTO methods are lossless at temperature 0."""
import itertools
import warnings

import numpy as np
import pytest

from core.builders import build_ddtree
from core.config import DecodeConfig
from core.engine import output_ids, run
from core.ngram import NgramModel, NgramTable, load_model
from core.presto import build_presto, build_presto_beam

from tests.test_builders import marginals, prefixes
from tests.test_lossless import hf_greedy
from tests.conftest import tiny_pair


class HashNgram:
    """A deterministic stand-in: log p depends on the previous token and the candidate."""
    order = 2

    def logprobs(self, context, cands):
        prev = context[-1] if context else -1
        return np.array([-((prev * 31 + int(c) * 17) % 97) / 20.0 for c in cands])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [1, 5, 30, 200])
def test_lambda_zero_is_ddtree(seed, budget):
    logq, tokens = marginals(seed, n_pos=6, k=6)
    assert build_presto(logq, tokens, budget, 3, [1, 2], HashNgram(), lam=0.0) == build_ddtree(logq, tokens, budget, 3)
    beam = build_presto_beam(logq, tokens, budget, 3, [1, 2], HashNgram(), lam=0.0, beam_width=budget)
    assert beam == build_ddtree(logq, tokens, budget, 3)     # a beam as wide as the budget loses nothing


def brute_force_presto(logq, tokens, budget, context, ngram, lam):
    items = []
    for d in range(1, logq.shape[0] + 1):
        for ranks in itertools.product(range(logq.shape[1]), repeat=d):
            s, path = 0.0, []
            for i, r in enumerate(ranks):
                lp = ngram.logprobs((context + path)[-1:], tokens[i, [r]])[0]
                s += float(logq[i, r]) + lam * lp
                path.append(int(tokens[i, r]))
            items.append((-s, tuple(path)))
    items.sort()
    return items[:budget]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [3, 17, 60])
def test_best_first_is_exact_top_b_under_s(seed, budget):
    logq, tokens = marginals(seed, n_pos=3, k=4)
    tree = build_presto(logq, tokens, budget, 5, [7, 8], HashNgram(), lam=0.4)
    expected = brute_force_presto(logq, tokens, budget, [7, 8], HashNgram(), 0.4)
    assert set(prefixes(tree)) == {p for _, p in expected}
    assert all(a >= b - 1e-12 for a, b in zip(tree.score[1:], tree.score[2:]))       # best first
    assert all(tree.score[i] <= tree.score[tree.parents[i]] for i in range(1, len(tree.tokens)))


@pytest.mark.parametrize("width", [1, 2, 5])
def test_beam_keeps_at_most_width_per_depth(width):
    logq, tokens = marginals(1, n_pos=5, k=6)
    tree = build_presto_beam(logq, tokens, 40, 0, [3], HashNgram(), lam=0.3, beam_width=width)
    for d in range(1, 5):
        parents = {tree.parents[i] for i in range(len(tree.tokens)) if tree.depths[i] == d + 1}
        assert len(parents) <= width                      # only beam nodes were expanded
    pre = set(prefixes(tree))
    assert tree.size == min(40, 6 + width * 6 * 4)            # the pool: K at depth 1, W * K deeper
    assert all(len(p) == 1 or p[:-1] in pre for p in pre)     # a valid tree


def test_ngram_distribution_sums_to_one(tmp_path):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 50, size=200) for _ in range(20)]
    table = NgramTable.build(seqs, order=3, vocab=50)
    table.save(tmp_path / "t.npz")
    model = NgramModel(50, 3, NgramTable.load(tmp_path / "t.npz"))
    model.observe([1, 2, 3, 1, 2, 4])
    for ctx in ([], [5], [1, 2], [49, 48], [int(seqs[0][10]), int(seqs[0][11])]):
        lp = model.logprobs(ctx, np.arange(50))
        assert np.isfinite(lp).all() and abs(np.exp(lp).sum() - 1) < 1e-9
    assert model.logprobs([1, 2], np.array([3]))[0] > model.logprobs([1, 2], np.array([7]))[0]   # online counts


def reference_logprob(seqs, ctx, token, order, vocab):
    """Interpolated p_ng counted directly from the sequences (no table, no cache)."""
    from core.ngram import DEFAULT_WEIGHTS, FLOOR
    mix, total_w = 0.0, FLOOR
    for level, j in enumerate(range(order, 0, -1)):
        if len(ctx) < j - 1:
            continue
        c = tuple(ctx[len(ctx) - (j - 1):]) if j > 1 else ()
        nexts = [s[i + j - 1] for s in seqs for i in range(len(s) - j + 1) if tuple(s[i:i + j - 1]) == c]
        if nexts:
            mix += DEFAULT_WEIGHTS[order][level] * nexts.count(token) / len(nexts)
            total_w += DEFAULT_WEIGHTS[order][level]
    return np.log((mix + FLOOR / vocab) / total_w)


def test_online_counts_follow_the_request(tmp_path):
    """Lookups between observes (cached rows) agree with counting the table's data plus the history so far."""
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 12, size=60).tolist() for _ in range(6)]
    model = NgramModel(12, 3, NgramTable.build(seqs, order=3, vocab=12))
    history = rng.integers(0, 12, size=40).tolist()
    for end in (5, 6, 17, 40):
        model.observe(history[:end])
        for ctx in ([], history[end - 1:end], history[end - 2:end], [3, 3]):
            got = model.logprobs(ctx, np.arange(12))
            want = [reference_logprob(seqs + [history[:end]], ctx, t, 3, 12) for t in range(12)]
            np.testing.assert_allclose(got, want, rtol=1e-12)


def test_missing_table_falls_back_and_corrupt_table_is_an_error(tmp_path):
    with pytest.warns(UserWarning, match="not found") as caught:
        model = load_model(tmp_path / "none.npz", vocab=50)
    assert f"build_ngram --data runs/data --out {tmp_path / 'none.npz'} --order 3 --vocab 50" in str(caught[0].message)
    with pytest.warns(UserWarning, match="no n-gram table") as caught:
        load_model(None, vocab=50)
    assert "None" not in str(caught[0].message) and "--vocab 50" in str(caught[0].message)
    assert model.table is None and np.isfinite(model.logprobs([1, 2], np.arange(5))).all()
    (tmp_path / "bad.npz").write_bytes(b"not a table")
    with pytest.raises(ValueError, match="rebuild"):
        load_model(tmp_path / "bad.npz", vocab=50)
    with pytest.raises(ValueError, match="order"):
        NgramModel(50, 0)


@pytest.mark.parametrize("method", ["presto", "presto-beam"])
@pytest.mark.parametrize("arch,seed", [("llama", 0), ("qwen3", 1)])
@pytest.mark.parametrize("budget", [4, 32])
def test_presto_lossless_at_temperature_zero(method, arch, seed, budget):
    pair = tiny_pair(arch, seed)
    prompt = [0] + list(np.random.default_rng(seed).integers(2, 90, size=10))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # no n-gram table for the tiny vocabulary: online counts only
        records = run(pair, prompt, DecodeConfig(method=method, budget=budget, max_new_tokens=40, lam=0.5))
    assert output_ids(records) == hf_greedy(pair, prompt, 40)
    assert all(r.tree.size == min(budget, 7 * min(budget, 96)) for r in records[1:] if r.tree.max_depth == 7)


def test_entropy_adaptive_lambda(monkeypatch):
    """entropy_lam scales λ per depth by H(q_d) / log K: it changes the tree where the drafter is sure, the engine
    hands the drafter's entropies to the builder only then, and decoding stays lossless."""
    logq, tokens = marginals(2, n_pos=4, k=5)
    sure = np.array([0.1, 0.2, 1.0, 5.0])                     # nats; log K = 1.61
    assert build_presto(logq, tokens, 12, 3, [1, 2], HashNgram(), lam=1.0, entropy=np.full(4, 9.0)) == \
        build_presto(logq, tokens, 12, 3, [1, 2], HashNgram(), lam=1.0)        # unsure everywhere: λ unchanged
    assert build_presto(logq, tokens, 12, 3, [1, 2], HashNgram(), lam=1.0, entropy=sure) != \
        build_presto(logq, tokens, 12, 3, [1, 2], HashNgram(), lam=1.0)

    import core.presto

    seen, real = [], core.presto.build_presto
    monkeypatch.setattr(core.presto, "build_presto", lambda *a, **kw: (
        seen.append(a[7] if len(a) > 7 else kw.get("entropy")), real(*a, **kw))[1])
    pair = tiny_pair("llama", 0)
    prompt = [0] + list(np.random.default_rng(4).integers(2, 90, size=10))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for adaptive in (False, True):
            seen.clear()
            records = run(pair, prompt, DecodeConfig(method="presto", budget=32, max_new_tokens=30, lam=2.0,
                                                     entropy_lam=adaptive))
            assert output_ids(records) == hf_greedy(pair, prompt, 30)
            assert seen and all((h is not None) == adaptive for h in seen)
            if adaptive:
                assert all(h.ndim == 1 and 1 <= len(h) <= 7 and (h > 0).all() for h in seen)
