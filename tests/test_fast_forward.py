"""The engine's target forward equals transformers' `model(...)` bit for bit: logits, hidden states and cache, for
every kind of call the engine makes (prefill, one token, a causal chain after a cache, a tree with its mask)."""
import pytest
import torch

from core import fast_forward
from core.kv_cache import cache_kwargs, new_cache
from tests.conftest import tiny_target


def _calls(dtype):
    allow = torch.ones(3, 11, dtype=torch.bool)                 # 8 cached; a root (column 8) and two children
    allow[0, 9:] = allow[1, 10] = allow[2, 9] = False
    tree_mask = torch.zeros(1, 1, 3, 11, dtype=dtype).masked_fill_(~allow, torch.finfo(dtype).min)
    return [dict(input_ids=torch.tensor([[3, 4, 5, 6]])),                              # prefill
            dict(input_ids=torch.tensor([[7]]), position_ids=torch.tensor([[4]])),     # one token
            dict(input_ids=torch.tensor([[7, 8, 9]]), position_ids=torch.tensor([[5, 6, 7]])),   # a chain
            dict(input_ids=torch.tensor([[7, 8, 2]]), position_ids=torch.tensor([[8, 9, 9]]),    # a tree
                 attention_mask=tree_mask),
            dict(input_ids=torch.tensor([[11]]))]                                      # positions from the cache


def _assert_same_as_stock(target, calls):
    stock, ours = new_cache(target), new_cache(target)
    for call in calls:
        with torch.no_grad():
            a = target(**call, **cache_kwargs(target, stock), output_hidden_states=True)
        b = fast_forward.forward(target, cache=ours, output_hidden_states=True, **call)
        assert torch.equal(a.logits, b.logits)
        assert len(a.hidden_states) == len(b.hidden_states)
        assert all(torch.equal(x, y) for x, y in zip(a.hidden_states, b.hidden_states))
        assert all(torch.equal(s.keys, o.keys) and torch.equal(s.values, o.values)
                   for s, o in zip(stock.layers, ours.layers))


def _packed_tiny_target():
    """A bf16 tiny target with its packed weights; skips where oneDNN's packed product is not bit-exact."""
    target = tiny_target().to(torch.bfloat16)
    if fast_forward.pack_linears(target) == 0:
        pytest.skip("oneDNN's packed bf16 product is not bit-exact on this CPU, so nothing is packed")
    return target


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiny_targets_match_transformers_bit_for_bit(arch, dtype):
    target = tiny_target(arch).to(dtype)
    assert fast_forward.covered(target)
    _assert_same_as_stock(target, _calls(dtype))
    if dtype == torch.float32:
        assert fast_forward.pack_linears(target) == 0          # packing is for bf16 only (fp32 products differ)


def test_uncovered_models_run_the_stock_forward():
    target = tiny_target()
    target.config._attn_implementation = "eager"
    assert not fast_forward.covered(target)
    cache = new_cache(target)
    out = fast_forward.forward(target, torch.tensor([[3, 4, 5]]), cache, output_hidden_states=True)
    assert type(out).__name__ == "CausalLMOutputWithPast" and cache.get_seq_length() == 3


def test_a_changed_weight_is_not_served_from_a_stale_packed_copy():
    target = _packed_tiny_target()
    proj = target.model.layers[0].mlp.up_proj
    x = torch.randn(1, 2, proj.in_features, dtype=torch.bfloat16)
    with torch.no_grad():
        proj.weight.mul_(2)                       # an in-place edit bumps the tensor's version
        assert torch.equal(fast_forward.linear(proj, x), proj(x))


@pytest.mark.parametrize("rows", [fast_forward.PACK_MAX_ROWS, fast_forward.PACK_MAX_ROWS + 1])
def test_only_forwards_of_few_rows_take_the_packed_product(rows, monkeypatch):
    """A prefill or a large tree takes the stock product on every CPU: with AMX, oneDNN's packed kernel for more
    than PACK_MAX_ROWS rows rounds differently from F.linear's where no probe can tell."""
    target = _packed_tiny_target()
    calls = []
    packed_linear = fast_forward.packed_linear
    monkeypatch.setattr(fast_forward, "packed_linear", lambda *a: calls.append(a) or packed_linear(*a))
    proj = target.model.layers[0].mlp.up_proj
    x = torch.randn(1, rows, proj.in_features, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(fast_forward.linear(proj, x), proj(x))
    assert len(calls) == (rows <= fast_forward.PACK_MAX_ROWS)


def test_fp32_and_autocast_inputs_take_the_stock_path():
    """A packed bf16 weight never meets an fp32 input: training runs an evaluated (packed) target's LM head on fp32
    drafter states under autocast."""
    target = _packed_tiny_target()
    head = target.get_output_embeddings()
    x = torch.randn(2, 3, head.in_features)
    with torch.no_grad():
        assert torch.equal(fast_forward.linear(head, x.bfloat16()), head(x.bfloat16()))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(fast_forward.linear(head, x), head(x))


def test_embedded_target_in_bf16_is_exact():
    from core.models import load_target

    target, _ = load_target(dtype="bf16")
    assert fast_forward.covered(target)     # packed where bit-exact on this CPU (all 211 weights)
    prefix = dict(input_ids=torch.arange(100, 140)[None])
    tree_mask = torch.zeros(1, 1, 17, 58, dtype=torch.bfloat16)                     # 41 cached, 17 nodes
    tree_mask[..., 41:] = torch.finfo(torch.bfloat16).min
    tree_mask[..., torch.arange(17), 41 + torch.arange(17)] = 0                     # 17 siblings: each sees itself
    _assert_same_as_stock(target, [prefix, dict(input_ids=torch.tensor([[5]])),
                                   dict(input_ids=torch.arange(200, 217)[None],
                                        position_ids=torch.full((1, 17), 41), attention_mask=tree_mask)])
