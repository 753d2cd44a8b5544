"""Tree attention and KV compaction against plain causal decoding (fp32)."""
import pytest
import torch

from core.kv_cache import cache_kwargs, compact, crop_to, new_cache
from core.tree import DraftTree, path_to
from core.verify import tree_inputs, verify
from tests.conftest import tiny_target


def make_tree(tokens, parents):
    depths = [0] * len(tokens)
    for i, p in enumerate(parents):
        if p >= 0:
            depths[i] = depths[p] + 1
    z = [0.0] * len(tokens)
    return DraftTree(list(tokens), list(parents), depths, [-1] + [0] * (len(tokens) - 1), z, z, z)


def prefill(model, ids):
    cache = new_cache(model)
    model(input_ids=torch.tensor([ids]), **cache_kwargs(model, cache))
    return cache


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_chain_mask_equals_causal(arch):
    model = tiny_target(arch)
    ctx = list(range(2, 22))
    cache = prefill(model, ctx)
    chain = make_tree([5, 6, 7, 8, 9], [-1, 0, 1, 2, 3])
    plain = model(input_ids=torch.tensor([chain.tokens]), **cache_kwargs(model, cache)).logits[0]
    crop_to(cache, len(ctx))
    inputs = tree_inputs(chain, len(ctx), torch.float32, "cpu")
    assert inputs["attention_mask"] is None                        # a chain is plain causal attention
    # force the explicit 4-D mask path on the same chain
    forced = make_tree([5, 6, 7, 8, 9, 3], [-1, 0, 1, 2, 3, 0])
    masked = verify(model, forced, cache, len(ctx), None).logits[:5]
    assert (plain - masked).abs().max() <= 1e-4


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_every_node_matches_its_path_run_alone(arch):
    model = tiny_target(arch)
    ctx = list(range(10, 40))
    cache = prefill(model, ctx)
    tree = make_tree([4, 11, 12, 13, 14, 15, 16, 17], [-1, 0, 0, 1, 2, 1, 5, 3])
    logits = verify(model, tree, cache, len(ctx), None).logits
    crop_to(cache, len(ctx))
    for node in range(len(tree.tokens)):
        path = path_to(tree, node)
        alone = model(input_ids=torch.tensor([[tree.tokens[i] for i in path]]), **cache_kwargs(model, cache)).logits
        crop_to(cache, len(ctx))
        assert (alone[0, -1] - logits[node]).abs().max() <= 1e-4


@pytest.mark.parametrize("accepted", [[0, 2, 5], [0, 1, 3], [0, 1], [0]])   # moved, partly in place, in place
def test_compaction_equals_recompute(accepted):
    model = tiny_target("llama")
    ctx = list(range(3, 30))
    cache = prefill(model, ctx)
    tree = make_tree([4, 11, 12, 13, 14, 15], [-1, 0, 0, 1, 2, 2])
    verify(model, tree, cache, len(ctx), None)
    compact(cache, len(ctx), torch.tensor(accepted))
    assert cache.get_seq_length() == len(ctx) + len(accepted)
    nxt = [21, 22]
    after = model(input_ids=torch.tensor([nxt]), **cache_kwargs(model, cache)).logits[0]
    full = ctx + [tree.tokens[i] for i in accepted] + nxt
    ref = model(input_ids=torch.tensor([full])).logits[0, -2:]
    assert (after - ref).abs().max() <= 1e-4
