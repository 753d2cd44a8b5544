"""Adaptive budget: the rule is the argmax of expected tokens per second, the cost-curve cache round-trips and is
keyed by device and dtype, and `ddtree-auto` / `presto-auto` stay lossless while choosing a budget per step."""
import json
import time
import warnings

import numpy as np
import pytest
import torch

from core import costs
from core.adaptive import MAX_PAUSE, AdaptiveBudget, LineFit, choose_budget, interpolate_cost
from core.config import DecodeConfig
from core.engine import output_ids, run
from core.hardware import NATIVE_BF16_FLAGS, cpu_info
from tests.conftest import tiny_pair
from tests.test_lossless import hf_greedy, informed_builder


@pytest.mark.parametrize("seed", range(20))
def test_choice_is_argmax_of_expected_tokens_per_second(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    node_q = np.sort(rng.random(n) ** 3)[::-1]                     # q of nested nodes, non-increasing
    curve = {s: 30 + float(rng.random()) * 0.3 * s for s in (1, 2, 4, 8, 16, 32, 64, 128, 256)}
    verify = interpolate_cost(curve, np.arange(1, n + 2))
    overhead, alpha = float(rng.random() * 10), float(rng.uniform(0.3, 1.2))
    rates = [(1 + alpha * node_q[:b].sum()) / (overhead + verify[b]) for b in range(n + 1)]
    assert choose_budget(node_q, verify, overhead, alpha) == int(np.argmax(rates))


def test_choice_follows_cost():
    node_q = np.full(100, 0.5)
    assert choose_budget(node_q, np.full(101, 40.0), 5.0) == 100          # free nodes: take them all
    assert choose_budget(node_q, 40.0 + 100.0 * np.arange(101), 5.0) == 0  # each node costs more than it brings
    steep = 40.0 + np.where(np.arange(101) > 16, 5.0 * (np.arange(101) - 16), 0.0)
    assert choose_budget(node_q, steep, 5.0) == 16                         # flat up to 17 tokens, then steep


def test_interpolation_is_exact_at_measured_sizes_and_extrapolates_linearly():
    curve = {1: 10.0, 4: 16.0, 8: 40.0}
    got = interpolate_cost(curve, np.array([1, 2, 4, 6, 8, 12]))
    assert np.allclose(got, [10, 12, 16, 28, 40, 64])


def test_cost_cache_round_trips_and_is_keyed_by_device_and_dtype(tmp_path, monkeypatch):
    target = tiny_target_small()
    calls = []
    monkeypatch.setattr(costs, "measure", lambda t, **_: calls.append(costs.cost_key(t)) or {1: 1.0, 2: 2.0})
    assert costs.cost_curve(target, tmp_path) == {1: 1.0, 2: 2.0}
    assert costs.cost_curve(target, tmp_path) == {1: 1.0, 2: 2.0} and len(calls) == 1    # read back, not measured
    saved = json.loads((tmp_path / f"{costs.cost_key(target)}.json").read_text())
    assert saved["key"] == costs.cost_key(target) and "cpu" in saved["key"] and "float32" in saved["key"]
    costs.cost_curve(target.to(torch.bfloat16), tmp_path)                 # another dtype: another curve
    assert len(calls) == 2 and "bfloat16" in calls[1]
    (tmp_path / f"{calls[1]}.json").write_text("{not json")               # a damaged file is re-measured
    costs.cost_curve(target, tmp_path)
    costs.cost_curve(target.to(torch.bfloat16), tmp_path)
    assert len(calls) == 3
    # one model name, another generation: "AMD EPYC" with AVX2 only and with AVX512-BF16 get their own curves
    import core.hardware as hardware
    for module in (hardware, costs):
        monkeypatch.setattr(module, "cpu_info", lambda: ("AMD EPYC", frozenset({"avx2"})))
    avx2 = costs.cost_key(target)
    monkeypatch.setattr(hardware, "cpu_info", lambda: ("AMD EPYC", frozenset({"avx2", "avx512f", "avx512_bf16"})))
    assert "-cpu-AMD_EPYC-avx2-" in avx2
    assert "-cpu-AMD_EPYC-avx2-avx512-avx512bf16-" in costs.cost_key(target)


def test_a_cost_timing_that_a_run_overlapped_is_taken_again(monkeypatch):
    """The app's background measurement is cached for good: a forward timed while a visitor's run started must
    not enter it (without the retake, max() of the timings here is the 200 ms overlap)."""
    target, calls, started, real = tiny_target_small(), [], [0], costs.forward

    def forward(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:          # the prefill is call 1, the warm-up call 2: the first timed repeat overlaps
            started[0] += 1          # a run starts meanwhile
            time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(costs, "forward", forward)
    curve = costs.measure(target, sizes=[1], repeats=2, statistic=max, idle=lambda: started[0])
    assert len(calls) == 5 and curve[1] < 150      # prefill, warm-up, overlapped repeat, its retake, one more


def test_background_work_waits_for_a_quiet_spell_after_a_run():
    """`idle()` returns at once while nothing has run, waits while a run decodes, and after a run waits `quiet`
    seconds more, so a background forward does not land on the start of a run that follows at once."""
    curves = costs.BackgroundCurves(quiet=0.3)

    def waited() -> float:
        t0 = time.monotonic()
        curves.idle()
        return time.monotonic() - t0

    assert waited() < 0.1
    with curves.decoding():
        pass
    assert 0.25 <= waited() < 2.0
    assert waited() < 0.1                        # the spell has passed
    with curves.decoding():
        pass
    curves.shutdown()
    assert waited() < 0.1                        # an exiting process never waits


def tiny_target_small():
    return tiny_pair("llama", 0).target


@pytest.mark.parametrize("arch,seed", [("llama", 0), ("qwen3", 2)])
def test_auto_budget_is_lossless_and_records_its_choices(arch, seed):
    pair = tiny_pair(arch, seed)
    prompt = [0] + list(np.random.default_rng(seed).integers(2, 90, size=12))
    ref = hf_greedy(pair, prompt, 40)
    curve = {1: 10.0, 8: 11.0, 16: 14.0, 32: 30.0, 64: 70.0}    # cheap up to ~16 tokens, then steep
    auto = AdaptiveBudget(informed_builder("ddtree", prompt + ref, seed), curve, cap=48)
    records = run(pair, prompt, DecodeConfig(method="ddtree-auto", budget=48, max_new_tokens=40), builder=auto)
    assert output_ids(records) == ref
    drafted = [r for r in records[1:] if r.draft_tokens is not None]
    used = [r.budget_used for r in drafted]
    assert used == [r.tree.size for r in drafted] == auto.choices
    assert max(used) <= 48 and len(set(used)) > 1             # it chose, step by step
    assert 0 < auto.alpha and auto.overhead_ms > 0


@pytest.mark.parametrize("method", ["ddtree-auto", "presto-auto"])
def test_auto_methods_run_through_the_engine_without_measuring(method, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFT_TREE_CACHE", str(tmp_path))
    monkeypatch.setattr(costs, "measure", lambda *a, **k: pytest.fail("a run must not wait for the cost curve"))
    pair = tiny_pair("llama", 1)
    prompt = [0, 5, 9, 13, 22, 31]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # presto: no n-gram table for the tiny vocabulary
        records = run(pair, prompt, DecodeConfig(method=method, budget=32, max_new_tokens=24))
    assert output_ids(records) == hf_greedy(pair, prompt, 24)
    assert all(0 <= r.budget_used <= 32 for r in records[1:])


def test_line_fit_learns_the_real_costs_from_steps():
    prior = np.asarray([30.0 * (1 + 0.5 * (n - 1)) for n in range(1, 66)])    # an estimate 6x too steep
    fit = LineFit(prior)
    rng = np.random.default_rng(0)
    for n in rng.integers(1, 40, size=40):
        fit.add(int(n), 50.0 + 2.0 * n)                                      # the truth: 50 + 2 n ms
    got = fit()
    assert abs(got[0] - 52.0) < 4 and abs(got[63] - 178.0) < 12             # n = 1 and n = 64
    one = LineFit(prior)
    for _ in range(30):
        one.add(9, 70.0)                                                     # every step verifies 9 tokens
    assert abs(one()[8] - 70.0) < 3 and np.all(np.diff(one()) >= 0)         # its level, the prior's slope


def test_estimated_curve_follows_how_the_device_computes_the_dtype():
    fp32 = costs.estimated_curve(tiny_target_small())
    bf16 = costs.estimated_curve(tiny_target_small().to(torch.bfloat16))
    assert fp32[1] == bf16[1] and fp32[64] / fp32[1] == pytest.approx(1 + 63 * costs.SLOPE["fp32"])
    kind = "native-bf16" if any(f in cpu_info()[1] for f in NATIVE_BF16_FLAGS) else "emulated-bf16"
    assert bf16[64] / bf16[1] == pytest.approx(1 + 63 * costs.SLOPE[kind])


def test_cost_curve_is_made_monotone():
    from core.costs import monotone

    measured = {1: 31.1, 2: 29.0, 4: 26.9, 8: 30.2, 16: 38.9, 32: 52.6}    # a noisy dip at small trees
    fitted = monotone(measured)
    assert list(fitted) == list(measured)
    assert all(a <= b for a, b in zip(fitted.values(), list(fitted.values())[1:]))
    assert fitted[1] == fitted[2] == fitted[4] == (31.1 + 29.0 + 26.9) / 3 and fitted[8] == 30.2
    assert monotone({1: 1.0, 2: 2.0}) == {1: 1.0, 2: 2.0}                     # already monotone: unchanged


def _pausing_auto():
    """An auto budget over a 4 x 8 draft (plain steps 50 ms) and `step(drafted, tau, ms)`, which feeds it a step."""
    from types import SimpleNamespace

    from core.builders import build_ddtree

    auto = AdaptiveBudget(lambda draft, budget, bonus, history: build_ddtree(draft[0], draft[1], budget, bonus),
                          {1: 50.0, 16: 100.0}, cap=8)
    logq = np.log(np.full((4, 8), 0.9 / 8))
    draft = (logq, np.arange(32).reshape(4, 8) + 2)

    def step(drafted: bool, tau: int, ms: float):
        tree = auto(draft, 8, 1, []) if drafted else None
        auto.observe(SimpleNamespace(draft_tokens=np.zeros((4, 8)) if drafted else None, tau=tau,
                                     seconds={"verify": ms / 1000}, total_seconds=ms / 1000,
                                     tree=tree or SimpleNamespace(size=0), accepted_drafts=tau - 1,
                                     expected_accepted=0.5))

    return auto, step


def test_drafting_pauses_while_plain_steps_are_faster_and_resumes_when_it_pays():
    """Steps that draft but commit little are slower than plain steps (no drafter forward): the auto budget then
    skips drafts, probing after 1, 4, 16 ... plain steps, and drafts every step again once drafting pays."""
    auto, step = _pausing_auto()
    step(False, 1, 50.0)                                  # plain: 20 tokens/s
    pattern = []
    for _ in range(30):                                   # drafted steps commit 1.5 tokens in 120 ms: 12.5/s
        drafted = auto.should_draft()
        pattern.append(drafted)
        step(drafted, 1 + (drafted and pattern.count(True) % 2), 120.0 if drafted else 50.0)
    assert pattern[:3] == [True, False, True] and pattern.count(True) <= 5      # probes at growing intervals
    pattern = []
    for _ in range(80):                                   # now drafts commit 4 tokens in 120 ms: 33/s
        drafted = auto.should_draft()
        pattern.append(drafted)
        step(drafted, 4 if drafted else 1, 120.0 if drafted else 50.0)
    assert all(pattern[-20:])                              # the next probe found it pays: drafting every step


def test_a_lone_lucky_probe_does_not_restart_the_probing():
    """Where drafting does not pay, one probe that happens to pay shortens the next pause (by 4x) and the
    probing goes on from there, instead of drafting again after 1, 4, 16 ... plain steps."""
    auto, step = _pausing_auto()
    step(False, 1, 50.0)
    while auto.backoff < MAX_PAUSE:                       # drafts commit 1 token in 120 ms: the pauses grow
        drafted = auto.should_draft()
        step(drafted, 1, 120.0 if drafted else 50.0)
    while auto.pause:
        assert not auto.should_draft()
        step(False, 1, 50.0)
    assert auto.should_draft()
    step(True, 8, 120.0)                                  # lucky: 8 tokens in 120 ms beats plain steps
    assert auto.backoff == MAX_PAUSE // 4 and auto.pause == 0
    drafted = 0
    while not auto.pause:                                 # back to 1 token: drafting stops as the luck fades
        assert auto.should_draft()
        step(True, 1, 120.0)
        drafted += 1
    assert drafted <= 5 and auto.pause == MAX_PAUSE       # and the pause is the longest at once, not 1 step


def test_runs_back_to_back_never_starve_the_cost_measurement(monkeypatch):
    """Every timing overlapped (a run started meanwhile, every time): each is retaken RETAKES times, then kept."""
    target, calls, started, real = tiny_target_small(), [], [0], costs.forward

    def forward(*args, **kwargs):
        calls.append(1)
        started[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(costs, "forward", forward)
    curve = costs.measure(target, sizes=[1, 2], repeats=2, idle=lambda: started[0])
    assert set(curve) == {1, 2} and len(calls) == 1 + 3 * 2 * (costs.RETAKES + 1)
