"""The exact acceptance-against-budget curve (`core.replay`): the judge's replay of a finished greedy run's reply at
each budget, equal in fp32 to what real runs at those budgets achieve, where the run's own trees cut to b (the
counterfactual) are not; and the judge's --curves command that sets the two side by side."""
import json
import os
import random
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from core.config import DecodeConfig
from core.engine import output_ids, run
from core.eval import judge
from core.replay import curve_budgets, exact_budget_curve, exact_budget_points
from tests.conftest import tiny_pair


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 90) for _ in range(10)]


def _tau(records) -> float:
    return statistics.mean(r.tau for r in records[1:])


@pytest.mark.parametrize("method", ["ddtree", "hybrid"])
def test_exact_curve_is_the_judges_replay_of_the_runs_reply(method):
    pair, prompt = tiny_pair(seed=1), _prompt(1)
    cfg = DecodeConfig(method=method, budget=16, max_new_tokens=32)
    reply = output_ids(run(pair, prompt, cfg))
    assert reply == judge.reference_reply(pair, prompt, 32)            # lossless: the target's greedy reply
    curve = exact_budget_curve(pair, prompt, reply, cfg)
    assert list(curve) == [1, 2, 4, 8, 16]
    for b, tau in curve.items():
        assert tau == judge.prompt_tau(judge.replay(pair, prompt, reply, replace(cfg, budget=b))), b


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_exact_curve_in_fp32_is_what_real_runs_achieve_and_the_counterfactual_is_not(arch):
    """Real greedy runs at three budgets achieve exactly the exact curve's τ there; the counterfactual (the budget-32
    run's trees cut to b) misses it somewhere, because a run at b drafts from other positions."""
    misses = 0
    for seed in range(3):
        pair, prompt = tiny_pair(arch, seed=seed), _prompt(seed)
        cfg = DecodeConfig(method="ddtree", budget=32, max_new_tokens=40)
        records = run(pair, prompt, cfg)
        curve = exact_budget_curve(pair, prompt, output_ids(records), cfg, [4, 8, 32])
        for b, tau in curve.items():
            assert tau == _tau(run(pair, prompt, replace(cfg, budget=b))), (seed, b)
            misses += statistics.mean(r.tau_at(b) for r in records[1:]) != tau
        assert curve[32] == _tau(records)
    assert misses > 0


def test_exact_curve_needs_a_greedy_run_of_a_fixed_budget():
    pair, prompt = tiny_pair(), _prompt(0)
    with pytest.raises(ValueError, match="temperature 0"):
        list(exact_budget_points(pair, prompt, [5, 6], DecodeConfig(temperature=0.7), [4]))
    with pytest.raises(ValueError, match="fixed budget"):
        list(exact_budget_points(pair, prompt, [5, 6], DecodeConfig(method="ddtree-auto"), [4]))


def test_curve_budgets_are_the_powers_of_two_below_the_top_then_the_top():
    assert curve_budgets(1) == [1] and curve_budgets(16) == [1, 2, 4, 8, 16]
    assert curve_budgets(15) == [1, 2, 4, 8, 15] and curve_budgets(100) == [1, 2, 4, 8, 16, 32, 64, 100]


def test_a_pause_before_every_step_can_stop_the_replay():
    pair, prompt = tiny_pair(), _prompt(0)
    cfg = DecodeConfig(method="ddtree", budget=8, max_new_tokens=16)
    reply, calls = output_ids(run(pair, prompt, cfg)), []

    def pause():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    points = exact_budget_points(pair, prompt, reply, cfg, [1, 8], pause=pause)
    with pytest.raises(KeyboardInterrupt):
        list(points)
    assert len(calls) == 3                      # once before the shared target forward, then before each step


def test_judge_curves_command_sets_the_counterfactual_beside_the_exact_curve(tmp_path, capsys):
    pair = tiny_pair(seed=1)
    prompts = tmp_path / "toy.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["0 5 6 7", "9 8 7 6 5"]))
    args = ["--drafters", "a", "--datasets", str(prompts), "--n", "2", "--methods", "ddtree", "--budgets", "4,16",
            "--max-new-tokens", "16", "--curves", "--out", str(tmp_path / "out")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = judge.main(args, pair=pair, drafters={"a": pair.drafter})
    assert len(rows) == 2 * (3 + 5) and len((tmp_path / "out" / "curves.jsonl").read_text().splitlines()) == 16
    own = [r for r in rows if r["budget"] == r["run_budget"]]
    assert all(r["exact"] == r["achieved"] == r["counterfactual"] for r in own)   # at B all three are the run's τ
    first = judge.conversations(str(prompts), 2)[0][0]
    prompt = judge.encode_messages(pair.tokenizer, [{"role": "user", "content": first}])
    mine = next(r for r in rows if (r["prompt"], r["run_budget"], r["budget"]) == (0, 16, 4))
    assert mine["exact"] == _tau(run(pair, prompt, DecodeConfig(method="ddtree", budget=4, max_new_tokens=16)))
    table = capsys.readouterr().out
    assert f"| {prompts} | ddtree | 16 | 4 | 2 |" in table and "equals the run's τ in 4 of 4 runs" in table
    assert judge.main(args, pair=pair, drafters={"a": pair.drafter}) == rows   # a rerun reads its rows back


def test_judge_curves_refuses_a_method_that_is_not_nested(capsys):
    with pytest.raises(SystemExit):
        judge.main(["--drafters", "a", "--methods", "presto-beam", "--curves"], pair=tiny_pair(), drafters={"a": None})
    assert "takes nested methods" in capsys.readouterr().err


def _wait(job, seconds: float = 60.0) -> None:
    deadline = time.time() + seconds
    while not job.done and time.time() < deadline:
        time.sleep(0.02)
    assert job.done and job.error is None, job.error


def test_the_app_replays_curves_only_while_no_run_decodes_and_a_newer_run_supersedes():
    from core.costs import BackgroundCurves
    from studio.exact import ExactCurves

    pair, prompt, gate = tiny_pair(), _prompt(0), BackgroundCurves()
    cfg = DecodeConfig(method="ddtree", budget=8, max_new_tokens=16)
    reply, curves = output_ids(run(pair, prompt, cfg)), ExactCurves(gate.idle)
    with gate.decoding():                                   # a run decodes: the replay waits
        job = curves.start("a", pair, prompt, reply, cfg, [1, 4, 8])
        time.sleep(0.5)
        assert job.points == {} and not job.done
    _wait(job)
    assert job.points == exact_budget_curve(pair, prompt, reply, cfg, [1, 4, 8])
    with gate.decoding():
        old = curves.start("a", pair, prompt, reply, cfg, [1, 4, 8])
        other = curves.start("b", pair, prompt, reply, cfg, [2])
        new = curves.start("a", pair, prompt, reply, cfg, [8])  # session a's newer run
    assert old.cancelled and old.id not in curves.jobs and curves.latest == {"a": new.id, "b": other.id}
    _wait(new)
    _wait(other)
    assert old.points == {} and new.points == {8: job.points[8]}
    curves.cancel("b")                                      # a closed tab
    assert other.id not in curves.jobs and "b" not in curves.latest


def test_background_workers_stop_at_exit_even_while_a_run_holds_the_gate(tmp_path, monkeypatch):
    """A daemon thread still inside a torch operator when the interpreter finalises aborts the process
    ("terminate called without an active exception"), so the app stops and joins both workers at exit
    (`studio.state`), in this order."""
    from core.costs import BackgroundCurves
    from studio.exact import ExactCurves

    monkeypatch.setenv("DRAFT_TREE_CACHE", str(tmp_path))     # no cached curve: the gate measures one
    pair, prompt, gate = tiny_pair(), _prompt(0), BackgroundCurves()
    cfg = DecodeConfig(method="ddtree", budget=8, max_new_tokens=16)
    reply, curves = output_ids(run(pair, prompt, cfg)), ExactCurves(gate.idle)
    with gate.decoding():                        # a suspended run holds the gate: the workers wait on it
        job = curves.start("a", pair, prompt, reply, cfg, [1, 4, 8])
        gate.start("tiny", pair.target)           # measured in a thread, which waits for the gate
        time.sleep(0.3)
        t0 = time.perf_counter()
        gate.shutdown(timeout=10)
        curves.shutdown(timeout=10)
        assert time.perf_counter() - t0 < 10
    assert not curves._worker.is_alive() and not any(t.is_alive() for t in gate._threads)
    assert job.cancelled
    assert gate.status("tiny") == "failed"       # stopped between timings; nothing half-measured is cached


EXITING_APP = """
import time
from core.config import DecodeConfig
from core.engine import output_ids, run
from studio.state import COSTS, EXACT
from tests.conftest import tiny_pair

pair, prompt = tiny_pair(), list(range(2, 12))
cfg = DecodeConfig(method="ddtree", budget=64, max_new_tokens=200)
reply = output_ids(run(pair, prompt, cfg))
EXACT.start("a", pair, prompt, reply, cfg, [1, 2, 4, 8, 16, 32, 64] * 4)    # seconds of replays
COSTS.start("tiny", pair.target)
time.sleep(0.3)
print("exiting", flush=True)
"""


def test_the_app_process_exits_cleanly_while_its_workers_are_busy(tmp_path):
    """Without the exit hook this process aborts ("terminate called without an active exception", status 134)."""
    env = dict(os.environ, DRAFT_TREE_CACHE=str(tmp_path), HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False")
    done = subprocess.run([sys.executable, "-c", EXITING_APP], cwd=Path(__file__).parents[1], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "exiting" in done.stdout, done.stderr[-2000:]
    assert "terminate called" not in done.stderr
