"""Losslessness at temperature > 0: DDTree's sample-and-walk reproduces the target's distribution exactly.

On a tiny target with an 8-token vocabulary the exact distribution of the first three generated tokens is
enumerated (8^3 sequences); 5000 DDTree generations with different seeds must match it (chi-square).
The target has two layers (the fewest the drafter's two feature taps allow) and runs on one thread: its forwards
are a few rows wide, where thread hand-offs cost more than they save, and 15,000 generations make it the suite's
costliest test.
"""
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from core.accept import warp
from core.config import DecodeConfig
from core.engine import output_ids, run
from tests.conftest import tiny_pair

V = 8


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def exact_distribution(pair, prompt, temperature, top_p, top_k):
    probs = {}
    for seq in itertools.product(range(V), repeat=3):
        ids = torch.tensor([prompt + list(seq[:2])])
        logits = pair.target(input_ids=ids).logits[0, len(prompt) - 1:]
        p = warp(logits, temperature, top_p, top_k)
        probs[seq] = float(p[0, seq[0]] * p[1, seq[1]] * p[2, seq[2]])
    return probs


@pytest.mark.parametrize("method,budget,temperature,top_p,top_k", [
    ("ddtree", 16, 1.0, 1.0, 0),
    ("ddtree", 6, 1.5, 0.95, 6),
    ("chain", 8, 1.3, 1.0, 0),
    ("hybrid", 8, 1.0, 1.0, 0),
])
def test_tree_sampling_matches_target_distribution(one_thread, method, budget, temperature, top_p, top_k):
    pair = tiny_pair("llama", seed=7, vocab=V, std=0.6, layers=2)
    pair.target.generation_config.eos_token_id = None
    pair.tokenizer.eos_token_id = None
    prompt = [0, 3, 5, 2]
    exact = exact_distribution(pair, prompt, temperature, top_p, top_k)
    n = 5000
    counts, deep = {}, 0
    for seed in range(n):
        cfg = DecodeConfig(method=method, budget=budget, temperature=temperature, top_p=top_p, top_k=top_k,
                           max_new_tokens=3, seed=seed)
        records = run(pair, prompt, cfg)
        seq = tuple(output_ids(records))
        counts[seq] = counts.get(seq, 0) + 1
        deep += any(r.tau >= 2 for r in records[1:])
    assert deep > (n // 10 if method == "ddtree" else n // 100)   # the walk really accepted drafted tokens
    keys = sorted(exact, key=lambda s: -exact[s])
    expected = np.array([exact[k] * n for k in keys])
    observed = np.array([counts.get(k, 0) for k in keys])
    assert observed.sum() == n and sum(counts.values()) == n   # nothing outside the support
    big = expected >= 5                          # pool the rare outcomes into one bin
    f_exp, f_obs = expected[big], observed[big]
    if expected[~big].sum() > 0:
        f_exp, f_obs = np.append(f_exp, expected[~big].sum()), np.append(f_obs, observed[~big].sum())
    assert len(f_exp) >= 10                      # a distribution with real spread, not a near-certain sequence
    assert chisquare(f_obs, f_exp * f_obs.sum() / f_exp.sum()).pvalue > 1e-3
