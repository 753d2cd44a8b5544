"""Continuous batching for data generation: every reply equals the target's own greedy reply to that prompt alone
(fp32), whatever the slot count, prompt lengths and order in which replies finish."""
import numpy as np
import pytest
import torch

from core.training.batching import continuous_generate
from tests.conftest import tiny_target
from tests.test_lossless import hf_greedy


class _Pair:
    def __init__(self, target):
        self.target = target


@pytest.mark.parametrize("slots", [1, 3, 8])
def test_replies_equal_greedy_generate_alone(slots):
    target = tiny_target("llama", seed=5)
    rng = np.random.default_rng(0)
    prompts = [[0] + rng.integers(2, 90, size=int(n)).tolist() for n in (3, 12, 5, 30, 7, 2, 18)]
    got = dict(continuous_generate(target, prompts, max_new_tokens=24, slots=slots, stop_ids={1},
                                   sampled=lambda i: False))
    assert sorted(got) == list(range(len(prompts)))
    for i, prompt in enumerate(prompts):
        ref = hf_greedy(_Pair(target), prompt, 24)
        ref = ref[: ref.index(1) + 1] if 1 in ref else ref
        assert got[i] == ref, i


def test_sampled_rows_are_reproducible_and_differ_from_greedy():
    target = tiny_target("qwen3", seed=2)
    prompts = [[0, 4, 5, 6], [0, 7, 8]]
    draws = [dict(continuous_generate(target, prompts, 16, 2, {1}, lambda i: True, 1.0,
                                      torch.Generator().manual_seed(3))) for _ in range(2)]
    greedy = dict(continuous_generate(target, prompts, 16, 2, {1}, lambda i: False))
    assert draws[0] == draws[1] and draws[0] != greedy


def test_captured_features_are_the_targets_forward_over_prompt_and_reply(tmp_path):
    """What generation captures for training (tapped features and greedy choices, prompt and reply positions, some
    replies sampled) is what one target forward over the finished sequence gives, and the feature cache then
    serves it without running the target."""
    from core.training.data import Sequence
    from core.training.features import FeatureCache, target_pass

    target = tiny_target("llama", seed=5)
    rng = np.random.default_rng(1)
    prompts = [[0] + rng.integers(2, 90, size=int(n)).tolist() for n in (3, 12, 5, 9)]
    cache = FeatureCache(tmp_path, target, [0, 1], autocast=False)
    seqs = {}

    def capture(i, reply, features, greedy):
        seqs[i] = Sequence(str(i), np.asarray(prompts[i] + reply), len(prompts[i]))
        cache.put(seqs[i], features, greedy)

    replies = dict(continuous_generate(target, prompts, 20, 3, {1}, lambda i: i % 2 == 1, 1.0,
                                       torch.Generator().manual_seed(0), capture=capture, taps=[0, 1]))
    assert sorted(seqs) == sorted(replies) == [0, 1, 2, 3]
    for i, seq in seqs.items():
        want_f, want_g = target_pass(target, torch.as_tensor(seq.ids), [0, 1], autocast=False)
        features, greedy = cache.get(seq)
        assert features.shape == want_f.shape
        assert torch.allclose(features[:-1], want_f[:-1], rtol=1e-3, atol=1e-3), i      # the last token: never fed
        assert torch.equal(greedy[:-1], want_g[:-1]), i
    assert cache.misses == 0


def test_generate_data_end_to_end_resumes(tmp_path, monkeypatch):
    """The data CLI on the embedded target: shards of chat-templated prompts + replies, resumed without repeats."""
    import sys

    from core.training import generate_data

    def cli(*extra):
        monkeypatch.setattr(sys, "argv", ["generate_data", "--out", str(tmp_path), "--max-new-tokens", "6",
                                          "--batch-size", "3", "--batches-per-shard", "1", "--threads", "2", *extra])
        generate_data.main()

    cli("--limit", "4")
    first = generate_data.done_keys(tmp_path)
    cli("--limit", "7", "--features", str(tmp_path / "features"), "--dtype", "fp32")
    shards = sorted(p.name for p in tmp_path.glob("shard-*.npz"))
    keys = generate_data.done_keys(tmp_path)
    assert len(first) == 4 and len(keys) == 7 and first <= keys
    assert shards == ["shard-00000.npz", "shard-00001.npz", "shard-00002.npz"]
    d = np.load(tmp_path / shards[0], allow_pickle=False)
    assert all(0 < n - p <= 6 for n, p in zip(d["lengths"], d["prompt_lengths"]))
    from core.models import load_target
    from core.training.data import load_sequences
    from core.training.features import FeatureCache

    cache = FeatureCache(tmp_path / "features", load_target(dtype="fp32")[0], generate_data._shipped_taps(), False)
    new = [s for s in load_sequences(tmp_path, min_reply=1) if s.key not in first]
    assert len(new) == 3 and all(cache.get(s)[0].shape[0] == len(s.ids) for s in new)
    assert (cache.hits, cache.misses) == (3, 0)     # the second call's replies were captured as they were made


def test_interrupt_keeps_finished_replies(tmp_path, monkeypatch):
    """Ctrl-C during generation writes the replies already finished; the rerun skips exactly those."""
    import sys

    from core.training import batching, generate_data

    real = batching.continuous_generate

    def interrupted(*args, **kwargs):
        for n, item in enumerate(real(*args, **kwargs)):
            if n == 2:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(generate_data, "continuous_generate", interrupted)
    monkeypatch.setattr(sys, "argv", ["generate_data", "--out", str(tmp_path), "--max-new-tokens", "4",
                                      "--batch-size", "2", "--batches-per-shard", "4", "--limit", "6",
                                      "--threads", "2"])
    generate_data.main()
    assert len(generate_data.done_keys(tmp_path)) == 2          # the shard was not complete, still written
    monkeypatch.setattr(generate_data, "continuous_generate", real)
    generate_data.main()
    assert len(generate_data.done_keys(tmp_path)) == 6
