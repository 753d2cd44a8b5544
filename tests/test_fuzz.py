"""Property-based tests: tree builders on any scores (ties, NaN, inf, any budget, K larger than the vocabulary)
and the engine on any settings give a valid result or a clear ValueError, never a crash or a hang."""
import math
import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from core.builders import build_chain, build_ddtree
from core.config import DecodeConfig
from core.engine import output_ids, run
from core.presto import build_presto, build_presto_beam
from tests.conftest import tiny_pair
from tests.test_presto import HashNgram

scores = st.floats(allow_nan=True, allow_infinity=True, width=32) | st.sampled_from([0.0, -1.0, -1.0, -math.inf])


@st.composite
def candidates(draw):
    n_pos, k = draw(st.integers(0, 6)), draw(st.integers(0, 7))
    logq = draw(arrays(np.float32, (n_pos, k), elements=scores))
    tokens = draw(arrays(np.int64, (n_pos, k), elements=st.integers(0, 5)))   # duplicates and K > vocab
    return logq, tokens


def check_tree(tree, logq, tokens, budget):
    n_pos = logq.shape[0]
    assert tree.size <= max(0, budget) and tree.max_depth <= n_pos
    assert all(0 <= tree.parents[i] < i for i in range(1, len(tree.tokens)))
    assert all(tree.depths[i] == tree.depths[tree.parents[i]] + 1 for i in range(1, len(tree.tokens)))
    for i in range(1, len(tree.tokens)):
        assert tree.tokens[i] == tokens[tree.depths[i] - 1, tree.ranks[i]]


@settings(max_examples=300, deadline=None)
@given(candidates(), st.integers(-3, 10_000))
def test_builders_never_crash(cand, budget):
    logq, tokens = cand
    for tree in (build_chain(logq, tokens, budget, 1), build_ddtree(logq, tokens, min(budget, 400), 1),
                 build_presto(logq, tokens, min(budget, 200), 1, [3, 4], HashNgram(), 0.3),
                 build_presto_beam(logq, tokens, min(budget, 200), 1, [3], HashNgram(), 0.3, beam_width=3)):
        check_tree(tree, logq, tokens, budget)
        assert not math.isnan(tree.expected_accepted) or np.isnan(logq).any()


settings_values = st.fixed_dictionaries({
    "method": st.sampled_from(["ar", "chain", "ddtree", "presto", "presto-beam", "nope"]),
    "budget": st.integers(-2, 2000) | st.sampled_from([1, 16, 1024]),
    "temperature": st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 0.7, 1.0]),
    "top_p": st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1.0, 0.5]),
    "top_k": st.integers(-2, 200) | st.just(0),
    "max_new_tokens": st.integers(-1, 12),
    "seed": st.integers(-5, 2**64),
    "block_size": st.none() | st.integers(-1, 20),
})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(settings_values, st.lists(st.integers(0, 95), max_size=12))
def test_engine_settings_are_valid_or_rejected(values, prompt):
    pair = tiny_pair()
    try:
        cfg = DecodeConfig(**values)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            records = run(pair, prompt, cfg)
    except ValueError as e:
        assert str(e)
        return
    out = output_ids(records)
    assert 1 <= len(out) <= cfg.max_new_tokens and all(0 <= t < 96 for t in out)
    assert records[-1].finish in ("stop", "length", "context")


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=300))
def test_any_unicode_prompt_encodes(text):
    from core.models import encode_chat, load_tokenizer

    global _TOK
    _TOK = globals().get("_TOK") or load_tokenizer()
    ids = encode_chat(_TOK, text)
    assert ids and all(0 <= i < 49152 for i in ids)
