"""The app's words: each step says what it did with its numbers, step 0 is the prefill, a finished run rests on a
typical step (not the truncated last one), and the budget note quotes the cost curve when a tree cannot pay."""
from dataclasses import replace

import numpy as np

from core.config import DecodeConfig
from core.engine import run
from core.tree import root_only
from viz import text as words


def _records(pair, method="ddtree", budget=16, n=40):
    return run(pair, [0, 5, 9, 13, 22, 31], DecodeConfig(method=method, budget=budget, max_new_tokens=n))


def test_captions_name_the_prefill_and_the_real_numbers(pair):
    records = _records(pair)
    texts = {t: f" {t}" for r in records for t in r.tree.tokens + r.committed}
    first = words.step_caption(records[0], texts, block_size=8, prompt_tokens=6)
    assert "prefill" in first and "6 tokens" in first
    r = records[1]
    caption = words.step_caption(r, texts, block_size=8)
    assert f"drafted a {r.draft_tokens.shape[0]}-position block (block size 8" in caption
    assert f"kept **{r.tree.size} nodes** reaching depth {r.tree.max_depth}" in caption
    assert f"verified {r.tree.size + 1} tokens" in caption and f"τ = {r.tau}" in caption
    long = words.step_explanation(r, texts, "ddtree", 8)
    assert f"{r.tree.expected_accepted:.2f}" in long and "Proposition 1" in long


def test_whitespace_and_markup_in_tokens_stay_visible_and_inert(pair):
    records = _records(pair)
    r = records[1]
    texts = {t: "\n<b>" for t in r.tree.tokens + r.committed}
    caption = words.step_caption(r, texts, 8)
    assert "⏎&lt;b&gt;" in caption and "<b>" not in caption


def test_representative_step_skips_the_truncated_last_step(pair):
    records = _records(pair, n=30)
    k, rule = words.representative_step(records)
    taus = [r.tau for r in records[1:-1] if r.tree.size > 0]
    assert 0 < k < len(records) - 1 and "median" in rule and f"step {records[-1].step}" in rule
    assert abs(records[k].tau - np.median(taus)) == min(abs(t - np.median(taus)) for t in taus)
    assert words.representative_step(records[:1]) == (0, "the last step")      # the prefill alone
    assert "the run's median" in rule
    plain = records[:2] + [replace(r, tree=root_only(r.bonus)) for r in records[2:6]] + records[6:]
    assert "the drafting steps' median" in words.representative_step(plain)[1]  # an auto budget's plain steps


def test_budget_note_says_when_a_tree_cannot_pay():
    curve = {1: 30.0, 16: 69.0, 64: 177.0}           # fp32 on an AVX2 CPU: 65 tokens cost about 6 forwards
    assert words.verify_ratio(curve, 1) == 1.0 and abs(words.verify_ratio(curve, 16) - 2.3) < 1e-9
    note = words.budget_note("ddtree", 64, 16, curve, "fp32 on this CPU")
    assert note.startswith("⚠") and "65 tokens costs 6.0" in note and "τ exceeds 6.0" in note
    assert "cheap" in words.budget_note("ddtree", 2, 16, {1: 30.0, 4: 31.0}, "fp32")
    assert "16 tokens costs 2.3" in words.budget_note("chain", 64, 16, curve, "fp32")
    assert "b ≤ 64" in words.budget_note("ddtree-auto", 64, 16, curve, "fp32")
    assert "Measuring" in words.budget_note("ddtree", 64, 16, None, "fp32")
