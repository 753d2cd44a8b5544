"""Benchmark rows, baselines, the summary table and figures, end to end on a tiny model."""
import json

import numpy as np
import pytest
import torch

from core.eval.baselines import dflash_official, hf_generate
from core.eval.benchmark import main, row_for, table
from core.config import DecodeConfig
from core.engine import output_ids, run
from tests.conftest import tiny_pair


def test_rows_and_table_on_a_tiny_model():
    pair = tiny_pair()
    rows = []
    for i, prompt in enumerate([[0, 5, 6, 7], [0, 9, 3]]):
        ar = row_for("toy", i, DecodeConfig(method="ar", max_new_tokens=20), run(pair, prompt, DecodeConfig(
            method="ar", max_new_tokens=20)), None)
        rows.append(ar)
        for budget in (4, 16):
            cfg = DecodeConfig(method="ddtree", budget=budget, max_new_tokens=20)
            rows.append(row_for("toy", i, cfg, run(pair, prompt, cfg), ar["tpot"]))
    assert all(r["speedup"] > 0 for r in rows if r["method"] != "ar")
    text = table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + 3 and lines[2].startswith("| toy | 0 | ar |")
    assert all(line.endswith("| 2/2 |") for line in lines[2:])       # lossless: every output equals plain


@pytest.mark.parametrize("arch,seed", [("llama", 0), ("qwen3", 2)])
def test_baselines_match_the_engine_at_temperature_zero(arch, seed):
    pair = tiny_pair(arch, seed)
    prompt = [0] + list(np.random.default_rng(seed).integers(2, 90, size=12))
    cfg = DecodeConfig(method="chain", max_new_tokens=30)
    chain = run(pair, prompt, cfg)
    ours = output_ids(chain)
    plain = hf_generate(pair, prompt, cfg)
    assert plain.output == ours and plain.forwards == len(ours) - 1 and plain.tau == 1.0
    lookup = hf_generate(pair, prompt, cfg, prompt_lookup=4)
    assert lookup.output == ours and lookup.decode_s > 0 and lookup.prefill_s > 0
    official = dflash_official(pair, prompt, cfg)                     # z-lab's loop, same drafter weights
    assert official.output == ours
    assert official.forwards == len(chain) - 1 and official.tau == pytest.approx(
        sum(r.tau for r in chain[1:]) / (len(chain) - 1))


def test_benchmark_cli_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFT_TREE_CACHE", str(tmp_path / "cache"))      # ddtree-auto measures its cost curve
    prompts = tmp_path / "toy.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["0 5 6 7", "0 9 3 4 4"]))
    args = ["--datasets", str(prompts), "--n", "2", "--methods", "chain,ddtree,ddtree-auto,hf-generate,"
            "hf-prompt-lookup,dflash-official", "--budgets", "4,16", "--temperatures", "0,1", "--max-new-tokens", "12",
            "--out", str(tmp_path / "out")]
    rows = main(args, pair=tiny_pair())
    methods = {(r["method"], r["budget"], r["temperature"]) for r in rows}
    assert len(rows) == 2 * 2 * (1 + 1 + 2 + 1 + 3) and ("ddtree-auto", 16, 1.0) in methods   # auto: one cap
    text = (tmp_path / "out" / "table.md").read_text()
    assert "hf-prompt-lookup" in text and "dflash-official" in text and "auto ≤16" in text and "auto ≤4" not in text
    greedy = [line for line in text.splitlines() if "| 0 |" in line]
    assert greedy and all(line.endswith("| 2/2 |") for line in greedy)     # every method lossless at T=0
    figures = sorted(p.name for p in (tmp_path / "out" / "figures").iterdir())
    assert {"tau-vs-budget-toy-T0.png", "speedup-vs-budget-toy-T1.html", "histogram-toy-T0.png",
            "time-split-toy-T1.png"} <= set(figures)
    again = main(args, pair=tiny_pair())                                  # resumed: nothing re-run
    assert len(again) == len(rows)


def test_mt_bench_has_two_turns_and_the_second_continues_plain_decoding():
    from core.eval.benchmark import _messages, conversations

    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return "reply " + " ".join(map(str, ids))

    items = conversations("mt-bench", 3)
    assert len(items) == 3 and all(len(turns) == 2 for turns in items)
    rows = [{"dataset": "mt-bench", "prompt": 0, "method": "ar", "temperature": 0.0, "output": [4, 2]}]
    chat = _messages("mt-bench", 0, items[0], 0.0, rows, Tok())
    assert [m["role"] for m in chat] == ["user", "assistant", "user"]
    assert chat[1]["content"] == "reply 4 2" and chat[2]["content"] == items[0][1]
    assert conversations("mt-bench-first", 3) == [turns[:1] for turns in items]    # same questions, first turn only


def test_lambda_sweep_rows_are_labelled(tmp_path):
    import warnings

    prompts = tmp_path / "toy.jsonl"
    prompts.write_text(json.dumps({"prompt": "0 5 6 7"}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                     # no n-gram table for the tiny vocabulary
        rows = main(["--datasets", str(prompts), "--methods", "ddtree,presto", "--budgets", "8", "--lams", "0,0.4",
                     "--max-new-tokens", "10", "--out", str(tmp_path / "out")], pair=tiny_pair())
    labels = {r["method"] for r in rows}
    assert labels == {"ar", "ddtree", "presto λ=0", "presto λ=0.4"}
    by = {r["method"]: r for r in rows}
    assert by["presto λ=0"]["tau"] == by["ddtree"]["tau"] and by["presto λ=0"]["output"] == by["ar"]["output"]
    assert "oracle τ" in (tmp_path / "out" / "table.md").read_text()


def test_readout_comparison_rows_are_labelled(tmp_path):
    pair = tiny_pair()
    pair.drafter.set_draft_vocab(list(range(0, 96, 2)))
    prompts = tmp_path / "toy.jsonl"
    prompts.write_text(json.dumps({"prompt": "0 5 6 7"}))
    rows = main(["--datasets", str(prompts), "--methods", "chain,ddtree", "--budgets", "8", "--readouts",
                 "draft,full", "--max-new-tokens", "10", "--out", str(tmp_path / "out")], pair=pair)
    by = {r["method"]: r for r in rows}
    assert set(by) == {"ar", "chain", "chain full-head", "ddtree", "ddtree full-head"}
    assert all(r["output"] == by["ar"]["output"] for r in rows)                 # lossless with either readout
    with pytest.raises(SystemExit):
        main(["--datasets", str(prompts), "--readouts", "half", "--out", str(tmp_path / "bad")], pair=pair)


def test_breadth_sets_load_in_the_papers_formats():
    from core.eval.datasets import MATH_SUFFIX, evaluation_texts, load_prompts

    math, science = load_prompts("compmath"), load_prompts("science")
    assert len(math) == len(science) == 32 and len(set(math + science)) == 64
    assert all(p.endswith(MATH_SUFFIX) and MATH_SUFFIX not in p[:-len(MATH_SUFFIX)] for p in math)
    assert not any(p.endswith(MATH_SUFFIX) for p in science)
    assert {p.removesuffix(MATH_SUFFIX) for p in math} | set(science) <= evaluation_texts()   # never trained on
    assert load_prompts("science", 5) == load_prompts("science", 5) != science[:5]           # a seeded subset


def test_unknown_and_offline_hub_datasets_are_clear_errors(monkeypatch):
    from core.eval.datasets import load_prompts

    with pytest.raises(ValueError, match="unknown dataset"):
        load_prompts("gsm9k")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE"):
        load_prompts("hub:openai/gsm8k/main:test:question")


def test_benchmark_drafter_option_replaces_the_pairs_drafter(tmp_path):
    """--drafter benchmarks a training export against the same target: its drafts, not the pair's drafter's."""
    from tests.conftest import tiny_pair as make

    prompts = tmp_path / "toy.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["0 5 6 7", "0 9 3 4 4"]))
    own, other = make(seed=0), make(seed=0)
    other.drafter.layers[0].mlp.up_proj.weight.data.mul_(-3.0)          # a different drafter for the same target
    other.drafter.save(tmp_path / "export", dtype=torch.float32)
    base = ["--datasets", str(prompts), "--n", "2", "--methods", "chain", "--max-new-tokens", "16", "--dtype", "fp32"]
    mine = main(base + ["--out", str(tmp_path / "a")], pair=own)
    theirs = main(base + ["--out", str(tmp_path / "b"), "--drafter", str(tmp_path / "export")], pair=make(seed=0))
    again = main(base + ["--out", str(tmp_path / "c")], pair=other)
    taus = [[r["expected_tau"] for r in rows if r["method"] == "chain"] for rows in (mine, theirs, again)]
    assert taus[1] == taus[2] and taus[1] != taus[0]
