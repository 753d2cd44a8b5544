"""Hybrid trees: the drafter's prefixes and retrieved continuations in one budgeted tree, still lossless."""
import math

import numpy as np
import pytest

from core.builders import build_ddtree
from core.config import DecodeConfig
from core.engine import output_ids, run
from core.hybrid import HybridBuilder, build_hybrid
from core.retrieval import Calibration, SuffixIndex
from core.tree import DRAFTER, RETRIEVED, truncate
from tests.conftest import tiny_pair
from tests.test_lossless import hf_greedy


def candidates(seed, n_pos=5, k=6, vocab=50):
    rng = np.random.default_rng(seed)
    logq = np.sort(np.log(rng.dirichlet(np.ones(vocab)))[None].repeat(n_pos, 0), axis=1)[:, ::-1][:, :k]
    logq = np.sort(logq + rng.normal(0, 0.3, logq.shape), axis=1)[:, ::-1].copy()    # distinct, descending
    tokens = np.stack([rng.permutation(vocab)[:k] for _ in range(n_pos)])
    return np.minimum(logq, 0).astype(np.float32), tokens


def hybrid(logq, tokens, budget, history, logc=Calibration().logp):
    index = SuffixIndex()
    index.sync(history)
    return build_hybrid(logq, tokens, budget, history[-1], history, index, logc)


def test_without_matches_it_is_ddtree():
    logq, tokens = candidates(0)
    history = [100, 101, 102]                    # nothing ever repeats: retrieval finds nothing
    tree, lengths = hybrid(logq, tokens, 40, history)
    ref = build_ddtree(logq, tokens, 40, 102)
    assert (tree.tokens, tree.parents) == (ref.tokens, ref.parents)
    assert np.allclose(tree.prefix_logq, ref.prefix_logq)
    assert set(tree.origin[1:]) == {DRAFTER} and set(lengths) == {0}


def test_a_retrieved_chain_is_grafted_at_the_root_with_calibrated_scores():
    logq, tokens = candidates(1)
    history = [100, 7, 8, 9, 10, 11, 12, 100]   # the suffix [100] was followed by 7, 8, 9 ...
    logc = lambda m: math.log(0.9)                                          # noqa: E731
    tree, lengths = hybrid(logq, tokens, 12, history, logc)
    chain = [i for i in range(1, len(tree.tokens)) if tree.origin[i] & RETRIEVED]
    assert [tree.tokens[i] for i in chain] == [7, 8, 9, 10, 11]            # capped at L = 5 levels
    assert [tree.depths[i] for i in chain] == [1, 2, 3, 4, 5]
    assert [lengths[i] for i in chain] == [1, 2, 3, 4, 5]                  # the match grows as the copy goes on
    assert np.allclose([tree.prefix_logq[i] for i in chain], np.log(0.9) * np.arange(1, 6))


def test_a_token_proposed_twice_is_one_node_with_both_origins():
    logq, tokens = candidates(2)
    top = int(tokens[0, 0])
    history = [100, top, 3, 100]
    tree, _ = hybrid(logq, tokens, 20, history)
    at_root = [tree.tokens[i] for i in range(1, len(tree.tokens)) if tree.parents[i] == 0]
    assert len(at_root) == len(set(at_root))                                 # siblings are distinct tokens
    node = tree.tokens.index(top)
    assert tree.origin[node] == DRAFTER | RETRIEVED and tree.ranks[node] == 0


def test_retrieval_continues_a_drafter_path():
    logq, tokens = candidates(3)
    top = int(tokens[0, 0])
    history = [100, top, 42, 43, 5, 100]     # after the drafter's first token, the context once went on 42, 43
    tree, lengths = hybrid(logq, tokens, 30, history, lambda m: math.log(0.8))
    first = tree.tokens.index(top)
    below = [i for i in range(len(tree.tokens)) if tree.parents[i] == first and tree.origin[i] & RETRIEVED]
    assert [tree.tokens[i] for i in below] == [42] and lengths[below[0]] == 2   # matched [100, top]


@pytest.mark.parametrize("seed", range(5))
def test_nested_valid_and_within_budget(seed):
    logq, tokens = candidates(seed)
    rng = np.random.default_rng(seed)
    history = [int(t) for t in rng.integers(0, 50, size=80)]
    big, _ = hybrid(logq, tokens, 64, history)
    assert big.size <= 64 and big.max_depth <= logq.shape[0]
    assert all(s <= big.score[p] + 1e-9 for s, p in zip(big.score[1:], big.parents[1:]))  # scores never grow
    for b in (1, 5, 17, 40):
        small, _ = hybrid(logq, tokens, b, history)
        cut = truncate(big, b)
        assert (small.tokens, small.parents, small.origin) == (cut.tokens, cut.parents, cut.origin)


@pytest.mark.parametrize("arch,seed", [("llama", 0), ("qwen3", 3)])
def test_greedy_equals_generate_on_tiny_models(arch, seed):
    pair = tiny_pair(arch, seed)
    prompt = [0] + [int(t) for t in np.random.default_rng(seed).integers(2, 12, size=24)]
    ref = hf_greedy(pair, prompt, 96)        # random tiny targets fall into loops: retrieval finds them
    retrieved = 0
    for method, budget in [("hybrid", 4), ("hybrid", 32), ("hybrid-auto", 64)]:
        records = run(pair, prompt, DecodeConfig(method=method, budget=budget, max_new_tokens=96))
        assert output_ids(records) == ref, (method, budget)
        retrieved += sum(bool(r.tree.origin[i] & RETRIEVED) for r in records[1:] for i in r.accepted[1:])
    assert retrieved > 0                     # retrieved nodes were really verified and accepted


def test_the_builder_calibrates_on_what_was_accepted():
    pair = tiny_pair("llama", 1)
    prompt = [0] + [int(t) for t in np.random.default_rng(1).integers(2, 12, size=24)]
    builder = HybridBuilder()
    trials_before = builder.calibration.trials.sum()
    run(pair, prompt, DecodeConfig(method="hybrid", budget=16, max_new_tokens=32), builder=builder)
    assert builder.calibration.trials.sum() > trials_before


def test_views_mark_retrieved_nodes_and_count_proposers():
    from core.records import summarize
    from core.tree import accepted_by
    from viz import text
    from viz.tree_graph import tree_figure

    pair = tiny_pair("qwen3", 3)
    prompt = [0] + [int(t) for t in np.random.default_rng(3).integers(2, 12, size=24)]
    records = run(pair, prompt, DecodeConfig(method="hybrid", budget=32, max_new_tokens=96))
    record = max(records[1:], key=lambda r: sum(accepted_by(r.tree, r.accepted)[1:]))   # most retrieved accepted
    found = [i for i, o in enumerate(record.tree.origin) if o & RETRIEVED]
    fig = tree_figure(record, {})
    rings = [t for t in fig.data if t.name and t.name.startswith("found by retrieval")]
    assert len(rings) == 1 and len(rings[0].x) == len(found)
    hovers = [row[9] for row in fig.data[1].customdata]
    assert sum("found by retrieval" in h for h in hovers) == len(found)
    caption = text.step_caption(record, {}, 8, method="hybrid")
    drafter, retrieval, both = accepted_by(record.tree, record.accepted)
    assert f"Retrieval found {len(found)} of the {record.tree.size} nodes" in caption
    assert f"{drafter} from the drafter, {retrieval} from retrieval, {both} from both" in caption
    assert retrieval + both > 0
    totals = tuple(map(sum, zip(*(accepted_by(r.tree, r.accepted) for r in records))))
    assert "Accepted drafts by proposer: {} from the drafter, {} from retrieval, {} from both".format(*totals) \
        in text.metrics(summarize([records]), None, sources=totals)
    plain = run(pair, prompt, DecodeConfig(method="ddtree", budget=32, max_new_tokens=8))[1]
    assert "Retrieval" not in text.step_caption(plain, {}, 8) and len(tree_figure(plain, {}).data) == 4


@pytest.mark.parametrize("arch,seed", [("llama", 0), ("qwen3", 3)])
def test_prompt_lookup_on_the_fixed_reply_equals_transformers_run(arch, seed):
    """The judge compares hybrid with prompt lookup on one fixed reply; its prompt-lookup τ is transformers' own."""
    from core.eval.baselines import PROMPT_LOOKUP_TOKENS, hf_generate, prompt_lookup_steps

    pair = tiny_pair(arch, seed)
    prompt = [0] + [int(t) for t in np.random.default_rng(seed).integers(2, 12, size=24)]
    cfg = DecodeConfig(method="ar", max_new_tokens=96)
    reference = output_ids(run(pair, prompt, cfg))
    lookup = hf_generate(pair, prompt, cfg, prompt_lookup=PROMPT_LOOKUP_TOKENS)
    steps = prompt_lookup_steps(pair, prompt, reference, 96)
    assert lookup.output == reference and len(steps) == lookup.forwards and sum(steps) == len(reference) - 1
    assert max(steps) > 1                     # it did copy: the comparison is not between two plain decoders


@pytest.mark.parametrize("arch,seed", [("llama", 0), ("qwen3", 3)])
def test_the_judge_replays_hybrid_step_for_step(arch, seed):
    """The builder learns as it goes (its calibration), so the replay must feed it exactly what the loop does."""
    from core.eval.judge import replay

    pair = tiny_pair(arch, seed)
    prompt = [0] + [int(t) for t in np.random.default_rng(seed).integers(2, 12, size=24)]
    cfg = DecodeConfig(method="hybrid", budget=16, max_new_tokens=64)
    records = run(pair, prompt, cfg)
    assert replay(pair, prompt, output_ids(records), cfg) == [r.tau for r in records[1:]]


def test_the_judge_sets_prompt_lookup_beside_the_trees(tmp_path, capsys):
    import json

    from core.eval.baselines import prompt_lookup_steps
    from core.eval.judge import main, reference_replies

    pair = tiny_pair("qwen3", 3)
    prompts = tmp_path / "toy.jsonl"
    prompts.write_text(json.dumps({"prompt": " ".join(str(t) for t in range(2, 12))}))
    rows = main(["--drafters", "a", "--datasets", str(prompts), "--n", "1", "--methods", "hybrid,hf-prompt-lookup",
                 "--budgets", "8", "--max-new-tokens", "48"], pair=pair, drafters={"a": pair.drafter})
    assert [(r["method"], r["budget"]) for r in rows] == [("hybrid", 8), ("hf-prompt-lookup", None)]
    [(_, prompt_ids, reference)] = list(reference_replies(pair, str(prompts), 1, 48))
    assert rows[1]["committed"] == prompt_lookup_steps(pair, prompt_ids, reference, 48)
    assert f"| {prompts} | hf-prompt-lookup | – | a | 1 |" in capsys.readouterr().out


def test_the_icicle_fits_children_that_hold_more_than_their_parent():
    from viz.charts import icicle_widths

    parents = [-1, 0, 0, 1, 1]
    widths = icicle_widths(parents, np.log([1.0, 0.7, 0.6, 0.5, 0.4]).tolist())   # 0.7 + 0.6 > 1; 0.5 + 0.4 > 0.7
    assert math.isclose(widths[1] + widths[2], 1.0) and widths[3] + widths[4] <= widths[1] + 1e-12
    assert np.allclose(icicle_widths(parents, np.log([1.0, 0.5, 0.3, 0.2, 0.1]).tolist()), [1.0, 0.5, 0.3, 0.2, 0.1])
