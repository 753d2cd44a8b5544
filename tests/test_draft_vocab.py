"""The draft vocabulary: a drafter that reads out only frequent tokens (and the prompt's) drafts from them alone,
with q normalised over them; it is chosen from the training data, saved and loaded, and decoding stays lossless."""
import json

import numpy as np
import pytest
import torch

from core.config import DecodeConfig
from core.dflash import DRAFT_VOCAB_FILE, DraftKV, extract_features
from core.drafter import draft_block, readout_for
from core.engine import output_ids, run
from core.models import ModelLoadError, load_drafter
from core.training.data import Sequence, draft_vocab
from tests.conftest import tiny_pair
from tests.test_lossless import hf_greedy

VOCAB = list(range(0, 96, 2)) + [1]          # even ids and the stop token of the tiny target


def test_draft_vocab_keeps_the_most_frequent_tokens_and_the_stops():
    seqs = [Sequence("a", np.array([5, 5, 5, 7, 7, 9]), 2), Sequence("b", np.array([7, 3, 5]), 1)]
    assert draft_vocab(seqs, 3, vocab_size=12) == sorted([5, 7, 3])       # 5 ×4, 7 ×3, then 3 and 9 tie: lower id
    assert draft_vocab(seqs, 3, vocab_size=12, always=(11,)) == [5, 7, 11]
    assert draft_vocab(seqs, 5, vocab_size=12) == [0, 3, 5, 7, 9]          # unseen ids fill up from the lowest
    assert draft_vocab(seqs, 50, vocab_size=12) == list(range(12))


def test_draft_block_reads_out_the_draft_vocabulary_and_the_prompt_only():
    pair = tiny_pair("llama", 0)
    drafter, target = pair.drafter, pair.target
    prompt = [0, 5, 9, 13, 17, 21]
    ctx = extract_features(target(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states,
                           drafter.target_layer_ids)[0]
    full = draft_block(drafter, target, ctx, 4, 6, DraftKV(len(drafter.layers)), 7, k=96)
    assert readout_for(drafter, target, prompt) is None                     # no draft vocabulary: all V
    drafter.set_draft_vocab(VOCAB)
    readout = readout_for(drafter, target, prompt)
    allowed = sorted(set(VOCAB) | set(prompt))
    assert readout.ids.tolist() == allowed
    sub = draft_block(drafter, target, ctx, 4, 6, DraftKV(len(drafter.layers)), 7, k=96, readout=readout)
    assert sub.tokens.shape == (7, len(allowed)) and set(sub.tokens.ravel()) == set(allowed)
    np.testing.assert_allclose(np.exp(sub.logq).sum(1), 1.0, rtol=1e-5)    # q normalised over the readout
    for row_full, row_sub in zip(full.tokens, sub.tokens):                   # same logits, same order among them
        assert [t for t in row_full if t in allowed] == row_sub.tolist()


def test_draft_vocab_saves_loads_and_bad_files_are_clear_errors(tmp_path):
    pair = tiny_pair("llama", 0)
    pair.drafter.set_draft_vocab(VOCAB)
    pair.drafter.save(tmp_path, dtype=torch.float32)
    assert json.loads((tmp_path / DRAFT_VOCAB_FILE).read_text())["token_ids"] == sorted(VOCAB)
    loaded = load_drafter(tmp_path, pair.target, dtype="fp32")
    assert loaded.draft_vocab.tolist() == sorted(VOCAB)
    pair.drafter.set_draft_vocab(None)
    pair.drafter.save(tmp_path, dtype=torch.float32)                         # a full readout removes the file
    assert not (tmp_path / DRAFT_VOCAB_FILE).exists() and load_drafter(tmp_path, pair.target).draft_vocab is None
    for bad in ("{not json", json.dumps({"token_ids": [3, 96]}), json.dumps({"ids": [1]})):
        (tmp_path / DRAFT_VOCAB_FILE).write_text(bad)
        with pytest.raises(ModelLoadError, match="delete it"):
            load_drafter(tmp_path, pair.target)


@pytest.mark.parametrize("method,budget", [("chain", 16), ("ddtree", 16), ("presto", 16)])
def test_greedy_output_is_the_targets_with_a_draft_vocabulary(method, budget):
    for seed in (0, 1):
        pair = tiny_pair("llama", seed)
        pair.drafter.set_draft_vocab(VOCAB)        # the target's choices include odd ids the drafter never drafts
        prompt = [0] + list(np.random.default_rng(seed).integers(2, 90, size=12))
        ref = hf_greedy(pair, prompt, 40)
        assert any(t % 2 for t in ref)
        for full in (False, True):
            cfg = DecodeConfig(method=method, budget=budget, max_new_tokens=40, full_readout=full)
            assert output_ids(run(pair, prompt, cfg)) == ref
