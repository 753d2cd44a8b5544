"""Checkpoint compatibility with z-lab's official DFlash implementation (PyPI `dflash==0.1.0`, installed --no-deps).

A tiny random drafter saved here loads in the official `DFlashDraftModel` and gives the same outputs for the same
inputs (fp32, <= 1e-5), for a Llama- and a Qwen3-architecture target; a checkpoint saved by the official class
loads here. The official module is only imported in this test.
"""
import pytest
import torch

from core.dflash import DraftKV, extract_features
from core.models import load_drafter
from tests.conftest import tiny_pair

dflash_model = pytest.importorskip("dflash.model")


def official_outputs(official, target, features, noise, positions):
    hidden = official(position_ids=positions, noise_embedding=noise, target_hidden=features)
    return official.compute_logits(hidden[:, 1:], target.get_output_embeddings())


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_saved_drafter_matches_official(arch, tmp_path):
    pair = tiny_pair(arch, seed=3, drafter_layers=2)
    ours = pair.drafter
    ours.save(tmp_path, dtype=torch.float32)
    official = dflash_model.DFlashDraftModel.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert official.target_layer_ids == ours.target_layer_ids and official.mask_token_id == ours.mask_token_id

    ids = torch.tensor([[0, 5, 9, 13, 22, 31, 40, 41, 42, 50]])
    out = pair.target(input_ids=ids, output_hidden_states=True)
    features = extract_features(out.hidden_states, ours.target_layer_ids)          # [1, 10, 2H]
    block = torch.tensor([[17] + [ours.mask_token_id] * (ours.block_size - 1)])
    noise = pair.target.get_input_embeddings()(block)
    positions = torch.arange(10 + ours.block_size)[None]
    with torch.no_grad():
        ref = official_outputs(official, pair.target, features, noise, positions)
        mine = ours.logits(ours(features, noise, positions)[:, 1:], pair.target.get_output_embeddings())
        assert (ref - mine).abs().max() <= 1e-5
        # with the context split over two steps through our drafter cache: same result
        cache = DraftKV(len(ours.layers))
        ours(features[:, :6], noise, positions[:, list(range(6)) + list(range(10, 10 + ours.block_size))], cache)
        assert cache.length == 6
        step = ours.logits(ours(features[:, 6:], noise, positions[:, 6:], cache)[:, 1:],
                           pair.target.get_output_embeddings())
        assert (ref - step).abs().max() <= 1e-5


def test_official_checkpoint_loads_here(tmp_path):
    pair = tiny_pair("qwen3", seed=4, drafter_layers=2)
    pair.drafter.save(tmp_path / "a", dtype=torch.float32)
    official = dflash_model.DFlashDraftModel.from_pretrained(str(tmp_path / "a"), dtype=torch.float32)
    with torch.no_grad():
        for p in official.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    official.save_pretrained(tmp_path / "b")
    loaded = load_drafter(tmp_path / "b", pair.target, dtype=torch.float32)
    theirs = {k: v for k, v in official.state_dict().items() if "rotary" not in k}
    mine = loaded.state_dict()
    assert set(theirs) == {k for k in mine if "rotary" not in k}
    assert all(torch.equal(theirs[k], mine[k]) for k in theirs)
