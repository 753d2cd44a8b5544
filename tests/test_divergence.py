"""Lossless on screen: where a greedy run first leaves plain decoding, named with the step, the two tokens and the
target's logit gaps, and judged: a near-tie flipped by rounding, or a bug."""
import copy
from dataclasses import replace

import torch

from core.config import DecodeConfig
from core.divergence import NEAR_TIE, first_divergence
from core.engine import output_ids, run
from core.records import StepRecord
from core.tree import root_only
from tests.conftest import tiny_pair
from viz import text as words

PROMPT = [0, 5, 9, 13, 22, 31]


def _record(step, tokens, runner_up):
    return StepRecord(step, root_only(tokens[-1]), [0], tokens[-1], tokens, "", {}, [1.0] * len(tokens),
                      runner_up=runner_up)


def test_the_first_difference_is_named_and_judged():
    plain = [_record(0, [5], [(6, 2.0)]), _record(1, [7], [(8, 0.03)]), _record(2, [9], [(1, 1.0)])]
    tied = [_record(0, [5], [(6, 2.0)]), _record(1, [8, 4], [(7, 0.02), (3, 1.0)])]
    div = first_divergence(plain, tied)
    assert (div.position, div.step, div.plain, div.chosen) == (1, 1, 7, 8) and div.near_tie
    note = words.divergence_note(div, "DDTree", {7: " seven", 8: " eight"}, "bf16")
    assert "token 1 (step 1)" in note and "␣seven" in note and "␣eight" in note and "near-tie" in note
    assert "fp32" in note and "bug" not in note
    three = [_record(0, [5], [(6, 2.0)]), _record(1, [8], [(3, 0.0)])]     # 3, 7 and 8 tied exactly in the run
    div = first_divergence(plain, three)
    assert div.near_tie and not div.swapped
    assert "more than two" in words.divergence_note(div, "DDTree", {}, "bf16")
    wide = [_record(0, [5], [(6, 2.0)]), _record(1, [8], [(7, NEAR_TIE + 2.0)])]
    assert not first_divergence(plain, wide).near_tie
    assert "bug" in words.divergence_note(first_divergence(plain, wide), "DDTree", {}, "bf16")
    assert first_divergence(plain, plain) is None and first_divergence(plain, plain[:2]) is None


def _tie(pair, position: int, winner_gap: float):
    """A copy of the target whose logits at `position` of plain decoding's reply put the runner-up `b` at
    top-1's logit minus `winner_gap` (negative: b wins), changing only b's row of the LM head."""
    ids = output_ids(run(pair, PROMPT, DecodeConfig(method="ar", max_new_tokens=12)))
    target = copy.deepcopy(pair.target)
    with torch.no_grad():
        hidden = target.model(torch.tensor([PROMPT + ids[:position]])).last_hidden_state[0, -1]
        head = target.lm_head.weight
        logits = head @ hidden
        a, b = logits.topk(2).indices.tolist()
        head[b] += (logits[a] - logits[b] - winner_gap) * hidden / hidden.dot(hidden)
    return target, a, b


def test_a_near_tie_flipped_at_one_position_is_explained():
    """Two targets that differ only by a rounding-sized nudge at one position stand in for a one-token and a
    wide bf16 forward: plain decoding on one, DDTree on the other, must be explained as that near-tie."""
    base = tiny_pair("llama", 3)
    delta = 0.004                                           # a bf16 rounding step of a logit near 1
    one, a, b = _tie(base, 4, delta)
    wide, a2, b2 = _tie(base, 4, -delta)
    assert (a, b) == (a2, b2)
    plain = run(replace(base, target=one), PROMPT, DecodeConfig(method="ar", max_new_tokens=12))
    tree = run(replace(base, target=wide), PROMPT, DecodeConfig(method="ddtree", budget=8, max_new_tokens=12))
    div = first_divergence(plain, tree)
    assert div is not None and div.position == 4 and (div.plain, div.chosen) == (a, b)
    assert div.near_tie and abs(div.plain_gap - delta) < 1e-3 and abs(div.gap - delta) < 1e-3
    note = words.divergence_note(div, "DDTree", {a: f"<{a}>", b: f"<{b}>"}, "bf16")
    assert "token 4" in note and f"&lt;{a}&gt;" in note and f"&lt;{b}&gt;" in note and "near-tie" in note


def test_fp32_runs_record_their_gaps_and_do_not_differ():
    pair = tiny_pair("qwen3", 2)
    plain = run(pair, PROMPT, DecodeConfig(method="ar", max_new_tokens=16))
    tree = run(pair, PROMPT, DecodeConfig(method="ddtree", budget=16, max_new_tokens=16))
    assert first_divergence(plain, tree) is None
    for records in (plain, tree):
        assert all(len(r.runner_up) == len(r.committed) for r in records)
        assert all(gap >= 0 and second != t for r in records for t, (second, gap) in zip(r.committed, r.runner_up))
    sampled = run(pair, PROMPT, DecodeConfig(method="ddtree", budget=16, max_new_tokens=8, temperature=1.0))
    assert all(not r.runner_up for r in sampled[1:])       # only greedy runs have a runner-up to record


def test_benchmark_counts_near_ties_among_differing_outputs():
    from core.eval.benchmark import _same_output

    plain = {"output": [5, 7, 9], "runner_up": [[6, 2.0], [8, 0.03], [1, 1.0]], "temperature": 0.0}
    tie = {"output": [5, 8, 4], "runner_up": [[6, 2.0], [7, 0.02], [3, 1.0]], "temperature": 0.0}
    bug = {"output": [5, 8], "runner_up": [[6, 2.0], [7, 3.0]], "temperature": 0.0}
    assert _same_output([(plain, plain), (plain, tie), (plain, bug)]) == (1, " (1 near-tie, 1 NOT a near-tie)")
    assert _same_output([(plain, plain)]) == (1, "")


def test_clicking_a_differing_compare_row_shows_that_step(monkeypatch):
    from types import SimpleNamespace

    from studio import handlers, state as session

    base = tiny_pair("llama", 3)
    one, _, _ = _tie(base, 4, 0.004)
    wide, _, _ = _tie(base, 4, -0.004)
    plain = run(replace(base, target=one), PROMPT, DecodeConfig(method="ar", max_new_tokens=12))
    tree = run(replace(base, target=wide), PROMPT, DecodeConfig(method="ddtree", budget=8, max_new_tokens=12))
    div = first_divergence(plain, tree)
    monkeypatch.setitem(session.PAIRS, "tiny", base)
    state = {"records": [], "texts": {}, "ar": {}, "compare_ids": PROMPT,
             "compared": {handlers.COMPARED[0]: (plain, None, "ar"), "DDTree": (tree, div, "ddtree")}}
    out = handlers.show_difference(SimpleNamespace(index=[handlers.COMPARED.index("DDTree"), 0]), "tiny", state)
    text, tree_fig, slider = out[:3]
    assert text.count(" diff\"") == 1 and out[-1]["records"] is tree
    assert tree.index(next(r for r in tree if r.step == div.step)) == slider.value
    assert "first differs from plain decoding" in tree_fig.layout.title.subtitle.text
    verdict = handlers._verdict(base, [{"identical": "no"}] * len(handlers.COMPARED), state["compared"], 0.0, state)
    assert "token 4" in verdict and "near-tie" in verdict
    # both differing tokens are named, plain decoding's too (it is in no step of the compared run)
    assert f"plain decoding chose <code>␣{div.plain}</code>" in verdict
    assert f"DDTree chose <code>␣{div.chosen}</code>" in verdict


def test_a_run_that_differs_from_plain_decoding_says_where_in_its_metrics(monkeypatch):
    from studio import handlers, state
    from studio.handlers import Form

    base = tiny_pair("llama", 3)
    one, _, _ = _tie(base, 4, 0.004)
    wide, _, _ = _tie(base, 4, -0.004)
    plain = run(replace(base, target=one), PROMPT, DecodeConfig(method="ar", max_new_tokens=12))
    monkeypatch.setitem(state.PAIRS, "tiny", replace(base, target=wide))
    monkeypatch.setattr(handlers, "_plain", lambda *a, **k: (10.0, plain))  # plain decoding on the other rounding
    *_, last = handlers.run(Form(" ".join(map(str, PROMPT)), "DDTree", 8, 0.0, 1.0, 0, 12, 0, "tiny"), None)
    assert "DDTree** first differs at token 4" in last[3] and "near-tie" in last[3]
