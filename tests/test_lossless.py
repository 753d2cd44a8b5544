"""Losslessness at temperature 0 (fp32): every method emits exactly the target's greedy tokens.

A random drafter is almost never right, which would leave deep acceptance, sibling acceptance and compaction
untested; so besides the plain builders, an "informed" builder plants the target's true continuation among the
drafter's candidates (at random ranks, with random gaps), giving long accepted paths through branching trees.
"""
import numpy as np
import pytest
import torch

from core.builders import build_chain, build_ddtree
from core.config import DecodeConfig
from core.drafter import BlockDraft
from core.engine import output_ids, run
from tests.conftest import tiny_pair


def hf_greedy(pair, prompt, n):
    out = pair.target.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                               attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def informed_builder(method, reference, seed=0, hit=0.85):
    rng = np.random.default_rng(seed)
    fn = build_chain if method == "chain" else build_ddtree

    def build(draft: BlockDraft, budget, bonus, history):
        tokens = draft.tokens.copy()
        truth = reference[len(history): len(history) + tokens.shape[0]]
        for i, y in enumerate(truth):
            if rng.random() > hit:
                continue
            r = 0 if method == "chain" else int(rng.integers(0, min(3, tokens.shape[1])))
            row = tokens[i].tolist()
            if y in row:
                j = row.index(y)
                tokens[i, j], tokens[i, r] = tokens[i, r], y
            else:
                tokens[i, r] = y
        # steep synthetic marginals so that trees grow deep, not only wide
        logq = np.tile(-(0.05 + 1.5 * np.arange(tokens.shape[1])), (tokens.shape[0], 1)).astype(np.float32)
        return fn(logq, tokens, budget, bonus)
    return build


CASES = [("chain", 16)] + [("ddtree", b) for b in (1, 4, 32, 128)]


@pytest.mark.parametrize("arch,seed", [("llama", 0), ("llama", 1), ("qwen3", 2), ("qwen3", 3)])
@pytest.mark.parametrize("method,budget", CASES)
def test_tiny_models_greedy_equals_generate(arch, seed, method, budget):
    pair = tiny_pair(arch, seed)
    prompt = [0] + list(np.random.default_rng(seed).integers(2, 90, size=12))
    ref = hf_greedy(pair, prompt, 40)
    cfg = DecodeConfig(method=method, budget=budget, max_new_tokens=40)
    assert output_ids(run(pair, prompt, cfg)) == ref
    records = run(pair, prompt, cfg, builder=informed_builder(method, prompt + ref, seed))
    assert output_ids(records) == ref
    if budget >= 16:
        assert max(r.tau for r in records[1:]) >= 4        # the informed trees were really accepted deeply


def test_ar_equals_generate():
    pair = tiny_pair("llama", 5)
    prompt = [0, 5, 6, 7]
    assert output_ids(run(pair, prompt, DecodeConfig(method="ar", max_new_tokens=30))) == hf_greedy(pair, prompt, 30)


@pytest.fixture(scope="module")
def smollm2_fp32():
    from core.models import EMBEDDED_TARGET, encode_chat, load_custom_pair

    pair = load_custom_pair(EMBEDDED_TARGET, "random", dtype="fp32", device="cpu")
    prompts = ["What is the capital of France? Answer in one sentence and then explain why.",
               "Write a Python function that adds two numbers.",
               "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
               "How many clips did Natalia sell altogether?"]
    ids = [encode_chat(pair.tokenizer, p) for p in prompts]
    return pair, [(prompt, hf_greedy(pair, prompt, 64)) for prompt in ids]   # references once, not once per case


@pytest.mark.parametrize("method,budget", CASES)
def test_smollm2_random_drafter_greedy_equals_generate(smollm2_fp32, method, budget):
    pair, cases = smollm2_fp32
    for i, (prompt, ref) in enumerate(cases):
        cfg = DecodeConfig(method=method, budget=budget, max_new_tokens=64)
        builder = informed_builder(method, prompt + ref, seed=i) if i else None   # prompt 0: the drafter's own tree
        assert output_ids(run(pair, prompt, cfg, builder=builder)) == ref, f"prompt {i}"
