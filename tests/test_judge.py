"""The fixed-trajectory judge replays the decode loop exactly: same τ step for step where the loop emits the
reference (fp32, temperature 0), for every builder; and its command compares drafters on shared references."""
import json
import random
import warnings

import pytest

from core.dflash import random_drafter_for
from tests.conftest import tiny_pair
from core.config import DecodeConfig
from core.engine import output_ids, run
from core.eval.judge import main, reference_reply, replay


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_replay_matches_the_real_loop_step_for_step(arch):
    pair = tiny_pair(arch)
    for seed in range(3):
        rng = random.Random(seed)
        prompt = [rng.randrange(2, 90) for _ in range(10)]
        reference = reference_reply(pair, prompt, 40)
        for method, budget in [("chain", 64), ("ddtree", 4), ("ddtree", 32), ("presto", 16)]:
            cfg = DecodeConfig(method=method, budget=budget, max_new_tokens=40)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")             # no n-gram table for the tiny vocabulary
                records = run(pair, prompt, cfg)
                replayed = replay(pair, prompt, reference, cfg)
            assert output_ids(records) == reference         # lossless, so the loop walked the reference
            assert replayed == [r.tau for r in records if r.step > 0], (method, budget, seed)


def test_replay_stops_at_the_reply_end_like_the_loop():
    pair = tiny_pair()
    prompt = [3, 4, 5, 6]
    reference = reference_reply(pair, prompt, 9)
    steps = replay(pair, prompt, reference, DecodeConfig(method="ddtree", budget=32, max_new_tokens=9))
    assert sum(steps) == len(reference) - 1 and all(1 <= s <= 8 for s in steps)


def test_command_compares_drafters_on_shared_references(tmp_path, capsys):
    pair = tiny_pair()
    other = random_drafter_for(pair.target, seed=7, n_layers=1, n_taps=2, block_size=8,
                               mask_token_id=95).float().eval().requires_grad_(False)
    prompts = tmp_path / "toy.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["0 5 6 7", "9 8 7 6 5"]))
    rows = main(["--drafters", "a,b", "--datasets", str(prompts), "--n", "2", "--methods", "chain,ddtree",
                 "--budgets", "4,16", "--max-new-tokens", "12", "--out", str(tmp_path / "out")],
                pair=pair, drafters={"a": pair.drafter, "b": other})
    assert len(rows) == 2 * 2 * 3 and len((tmp_path / "out" / "rows.jsonl").read_text().splitlines()) == 12
    ar = run(pair, [0, 5, 6, 7], DecodeConfig(method="ddtree", budget=16, max_new_tokens=12))
    mine = next(r for r in rows if (r["prompt"], r["drafter"], r["method"], r["budget"]) == (0, "a", "ddtree", 16))
    assert mine["committed"] == [r.tau for r in ar if r.step > 0]
    table = capsys.readouterr().out
    assert f"| {prompts} | ddtree | 16 | a | 2 |" in table and "higher / lower" in table


def test_an_interrupted_command_resumes_to_the_uninterrupted_table(tmp_path, capsys, monkeypatch):
    """Rows reach --out prompt by prompt; a rerun reuses them, decodes only the prompts without rows, and prints
    the table and returns the rows an uninterrupted run does."""
    import core.eval.judge as judge

    pair = tiny_pair()
    prompts = tmp_path / "toy.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["0 5 6 7", "9 8 7 6 5", "3 4 5", "7 7 2 9"]))
    args = ["--drafters", "a", "--datasets", str(prompts), "--n", "4", "--methods", "chain,ddtree", "--budgets",
            "4,16", "--max-new-tokens", "12"]
    whole = main(args + ["--out", str(tmp_path / "whole")], pair=pair, drafters={"a": pair.drafter})
    expected = capsys.readouterr().out

    judged, decoded = judge.judge_prompt, judge.reference_reply
    calls = []

    def stop_at_third(*a, **k):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return judged(*a, **k)

    monkeypatch.setattr(judge, "judge_prompt", stop_at_third)
    with pytest.raises(KeyboardInterrupt):
        main(args + ["--out", str(tmp_path / "cut")], pair=pair, drafters={"a": pair.drafter})
    rows_path = tmp_path / "cut" / "rows.jsonl"
    assert [json.loads(line)["prompt"] for line in rows_path.read_text().splitlines()] == [0] * 3 + [1] * 3
    monkeypatch.setattr(judge, "judge_prompt", judged)
    monkeypatch.setattr(judge, "reference_reply", lambda *a: calls.append("decode") or decoded(*a))
    capsys.readouterr()
    resumed = main(args + ["--out", str(tmp_path / "cut")], pair=pair, drafters={"a": pair.drafter})
    assert calls.count("decode") == 2 and resumed == whole and capsys.readouterr().out == expected
    assert sorted(map(json.loads, rows_path.read_text().splitlines()), key=lambda r: r["prompt"]) == whole


@pytest.mark.parametrize("args, message", [
    (["--datasets", "mt-bench"], "mt-bench has two turns"), (["--methods", "ar,chain"], "ar drafts nothing"),
    (["--n", "0"], "must be at least 1"), (["--methods", "ddtree-auto"], "calibrates its budget"),
    (["--methods", "ddtre"], "ddtre is not a method; choose from chain, ddtree"),
    (["--budgets", "16,x"], "--budgets takes whole numbers")])
def test_command_refuses_what_it_cannot_judge(args, message, capsys):
    with pytest.raises(SystemExit):
        main(["--drafters", "a"] + args, pair=tiny_pair(), drafters={"a": None})
    assert message in capsys.readouterr().err


def test_trainer_held_out_tau_on_fixed_replies_equals_the_real_decode_in_fp32():
    """`--eval judge` (the default) replays every checkpoint on replies fixed at the start; in fp32 the loop emits
    those replies, so its τ is the real decode's, and a later checkpoint is judged on the same tokens."""
    from core.training.train import evaluate_tau, fixed_references

    pair = tiny_pair()
    prompts = [[3, 4, 5, 6], [9, 8, 7, 6, 5, 11], [0, 5, 6, 7]]
    references = fixed_references(pair.target, pair.tokenizer, prompts, 24)
    assert [r[1] for r in references] == [reference_reply(pair, p, 24) for p in prompts]
    decoded = evaluate_tau(pair.drafter, pair.target, pair.tokenizer, prompts, 24)
    judged = evaluate_tau(pair.drafter, pair.target, pair.tokenizer, prompts, 24, references)
    assert judged == decoded and judged["ddtree"] > 1.0
