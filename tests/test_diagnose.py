"""The per-anchor drafting diagnosis: its counts by hand, its drafts against the judge's replay of the loop, and
its command."""
import json

import numpy as np
import pytest
import torch
from dataclasses import replace

from core.config import DecodeConfig
from core.eval.diagnose import anchor_drafts, main, summarize
from core.eval.judge import reference_reply, replay
from tests.conftest import fitted_drafter, tiny_pair


def test_counts_by_hand():
    reference = [10, 11, 12, 13, 14, 15]
    drafted = np.array([[11, 12], [12, 12], [14, 13], [14, 15], [15, 99]])      # anchors t = 0..4, depths 1, 2
    stats = summarize(drafted, np.array([0.1, 0.95, 0.995, 1.0, 0.6]), reference)
    assert stats["n"] == [5, 4] and stats["right"] == [4, 2] and stats["chain"] == [4, 2]
    assert stats["offset"] == {"-2": [0, 0], "-1": [0, 2], "+1": [1, 0], "+2": [0, 0]}
    assert stats["buckets"] == [[1, 1], [0, 0], [1, 1], [0, 0], [1, 1], [2, 1]]


def test_drafts_from_every_anchor_are_the_ones_the_loop_verifies():
    """At the anchors the loop steps through, the chain's accepted length is the leading run of right depths
    here; p is the target's probability of each reply token."""
    pair = tiny_pair(vocab=96, block_size=8)
    prompts = [[3, 4, 5, 6], [9, 8, 7, 6, 5, 11]]
    replies = [reference_reply(pair, p, 40) for p in prompts]
    pair = replace(pair, drafter=fitted_drafter(pair, prompts, replies, steps=30))     # partly fitted: runs vary
    leading_runs = set()
    for prompt, reply in zip(prompts, replies):
        drafted, p = anchor_drafts(pair, prompt, reply, depth=7)
        assert drafted.shape == (len(reply) - 1, 7)
        right = drafted == np.array([reply[t + 1: t + 8] + [-1] * max(0, t + 8 - len(reply))
                                     for t in range(len(reply) - 1)])
        committed = replay(pair, prompt, reply, DecodeConfig(method="chain", max_new_tokens=40))
        t = 0
        for c in committed:
            if t + 8 <= len(reply) - 1:               # a whole block of reply ahead: no cap at the reply's end
                run = int(np.cumprod(right[t]).sum())
                assert c == run + 1
                leading_runs.add(run)
            t += c
        with torch.no_grad():
            probs = pair.target(torch.tensor([prompt + reply[:-1]])).logits[0, len(prompt):].softmax(-1)
        assert np.allclose(p, probs[torch.arange(len(reply) - 1), torch.tensor(reply[1:])].numpy(), atol=1e-5)
    assert {0, 7} < leading_runs and len(leading_runs) >= 4    # misses at once, whole blocks, and runs between


def test_command_prints_both_tables_writes_counts_and_refuses_bad_depths(tmp_path, capsys):
    prompts = tmp_path / "toy.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["0 5 6 7", "9 8 7 6 5"]))
    out = tmp_path / "d.json"
    result = main(["--datasets", str(prompts), "--n", "2", "--max-new-tokens", "12", "--out", str(out)],
                  pair=tiny_pair())
    assert json.loads(out.read_text()) == result and result[str(prompts)]["n"][0] == 2 * 11
    text = capsys.readouterr().out
    assert f"{prompts}, 2 prompts" in text and "| 4 | 16 |" in text and "| [0.99, 1.00] |" in text
    for depth, message in [("8", "--depth is at most 7"), ("0", "--depth must be at least 1")]:
        with pytest.raises(SystemExit):
            main(["--depth", depth], pair=tiny_pair())
        assert message in capsys.readouterr().err
    assert main(["--datasets", str(prompts), "--n", "1", "--max-new-tokens", "1"], pair=tiny_pair()) == {}
    assert "nothing to diagnose" in capsys.readouterr().out


def test_counts_reach_out_as_each_prompt_finishes(tmp_path, monkeypatch):
    """An interrupted run leaves the counts of the prompts it finished, and says how many."""
    import core.eval.diagnose as diagnose

    prompts = tmp_path / "toy.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["0 5 6 7", "9 8 7 6 5"]))
    out, drafts, calls = tmp_path / "d.json", diagnose.anchor_drafts, []

    def stop_at_second(*a, **k):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return drafts(*a, **k)

    monkeypatch.setattr(diagnose, "anchor_drafts", stop_at_second)
    with pytest.raises(KeyboardInterrupt):
        main(["--datasets", str(prompts), "--n", "2", "--max-new-tokens", "12", "--out", str(out)], pair=tiny_pair())
    partial = json.loads(out.read_text())[str(prompts)]
    assert partial["prompts"] == 1 and partial["n"][0] == 11
