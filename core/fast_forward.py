"""The target's forward for Llama and Qwen3 decoders with SDPA, bitwise equal to `model(...)` and faster on a CPU.

Two savings. (1) In bf16 on a CPU, `F.linear` hands oneDNN a plain weight that it reorders into its blocked
layout on every call; for the few-token forwards of decoding that reorder costs as much as the product. Here
each weight is reordered once (`mkldnn._reorder_linear_weight`) and kept beside the model, which halves a
one-token forward's matrix time with bitwise-equal results (checked per weight when it is packed; a weight whose
packed product differs is never packed; forwards of more than PACK_MAX_ROWS rows take the stock product).
(2) transformers wraps every layer and attention call in keyword rewriting, output-capture hooks and mask
dispatch; this runs the same ops in the same order with the same SDPA calls transformers makes (GQA folded without
a mask, keys repeated with the same boolean or additive mask otherwise). Logits, hidden states and cache equal
`model(...)`'s bit for bit (tested). Anything not covered (other architectures, rope scaling, sliding windows,
another attention implementation, a model split over devices) goes through `model(...)` unchanged.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.kv_cache import cache_kwargs

COVERED = {"llama", "qwen3"}
PACK_MAX_ROWS = 32       # packed products serve forwards of at most this many rows (one token, a chain, a small tree)
PACK_MAX_BYTES = 2 << 30     # a packed copy doubles the linear weights' memory: only for small targets
_seen: weakref.WeakSet = weakref.WeakSet()          # modules `pack_linears` has run on
_packed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # nn.Linear -> (weight version, packed) | None


@dataclass
class Output:
    logits: torch.Tensor                          # [1, N or logits_to_keep, V]
    hidden_states: tuple[torch.Tensor, ...] | None  # embeddings, then each layer's output (the last one normed)


def covered(model) -> bool:
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return (cfg.model_type in COVERED and cfg._attn_implementation == "sdpa"
            and rope.get("rope_type", "default") == "default" and not getattr(cfg, "sliding_window", None)
            and not getattr(cfg, "attention_bias", False) and not getattr(cfg, "mlp_bias", False)
            and getattr(cfg, "hidden_act", "silu") == "silu" and not model.training
            and len(set((getattr(model, "hf_device_map", None) or {}).values())) <= 1)   # hooks live per layer


def forward(model, input_ids, cache, position_ids=None, attention_mask=None, output_hidden_states=False,
            logits_to_keep=0):
    """`model(input_ids=…, cache=…, use_cache=True, …)` with the same results, faster where `covered`."""
    if not covered(model):
        return model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                     output_hidden_states=output_hidden_states, logits_to_keep=logits_to_keep,
                     **cache_kwargs(model, cache))
    ensure_packed(model)
    with torch.no_grad():
        return _forward(model, input_ids, cache, position_ids, attention_mask, output_hidden_states, logits_to_keep)


def pack_weight(weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """oneDNN's blocked copy of a bf16 CPU weight [out, in], or None where its product is not bit-exact."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)
            probes = [torch.randn(1, rows, weight.shape[1], generator=gen).to(weight.dtype)
                      for rows in (1, 17, PACK_MAX_ROWS)]
            same = all(torch.equal(packed_linear(x, packed, bias), F.linear(x, weight, bias)) for x in probes)
        except (RuntimeError, AttributeError):
            return None
    return packed if same else None


def few_rows(x: torch.Tensor) -> bool:
    """Whether `x` [..., in] is small enough for a packed product: with AMX, oneDNN's kernel for more than
    PACK_MAX_ROWS rows rounds differently from F.linear's at data-dependent places, which no probe can rule out."""
    return x.numel() <= PACK_MAX_ROWS * x.shape[-1]


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _version(weight: torch.Tensor) -> tuple[int, int]:
    return weight.data_ptr(), weight._version          # changes with any in-place edit or a new tensor


def pack_linears(module: torch.nn.Module) -> int:
    """Pack every linear weight of `module` (once); returns how many are packed. Skipped for large modules: the
    packed copy doubles the linear weights' memory."""
    linears = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    if sum(m.weight.numel() * m.weight.element_size() for m in linears) > PACK_MAX_BYTES:
        return 0
    for m in linears:
        if m not in _packed or _packed[m][0] != _version(m.weight):
            _packed[m] = (_version(m.weight), pack_weight(m.weight, m.bias))
    return sum(_packed[m][1] is not None for m in linears)


def linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`module(x)`, through its packed weight when it has an up-to-date one, `x` has the weight's dtype (autocast
    and fp32 inputs take the stock path), has `few_rows` and no gradient is wanted."""
    entry = _packed.get(module)
    if (entry is not None and entry[1] is not None and entry[0] == _version(module.weight)
            and x.dtype == module.weight.dtype and few_rows(x)
            and not (torch.is_grad_enabled() and module.weight.requires_grad)):
        return packed_linear(x, entry[1], module.bias)
    return module(x)


def ensure_packed(module: torch.nn.Module) -> None:
    if module not in _seen:
        pack_linears(module)
        _seen.add(module)


def _rms(x: torch.Tensor, norm) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _forward(model, input_ids, cache, position_ids, attention_mask, output_hidden_states, logits_to_keep):
    body, cfg = model.model, model.config
    past = cache.get_seq_length()
    h = body.embed_tokens(input_ids)                                                   # [1, N, H]
    b, n, _ = h.shape
    if position_ids is None:
        position_ids = torch.arange(past, past + n, device=h.device)[None]
    cos, sin = body.rotary_emb(h, position_ids=position_ids)                           # [1, N, D]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    mask = attention_mask
    if mask is None and n > 1 and past > 0:     # what transformers builds for a causal block after a cache
        mask = (torch.arange(past + n, device=h.device)[None] <= torch.arange(past, past + n, device=h.device)[:, None])
        mask = mask[None, None]                                                        # [1, 1, N, P+N] bool
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    rep = heads // kv_heads
    hidden = [h] if output_hidden_states else None
    for i, layer in enumerate(body.layers[: cfg.num_hidden_layers]):
        attn = layer.self_attn
        x = _rms(h, layer.input_layernorm)
        shape = (b, n, -1, attn.head_dim)
        q, k, v = (linear(proj, x).view(shape) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        if hasattr(attn, "q_norm"):                                                    # Qwen3
            q, k = _rms(q, attn.q_norm), _rms(k, attn.k_norm)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)              # [1, heads, N, D]
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = cache.update(k, v, i)                                                   # [1, kv_heads, P+N, D]
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1, scale=attn.scaling,
                                               enable_gqa=rep > 1)
        else:
            if rep > 1:
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
        h = h + linear(attn.o_proj, o.transpose(1, 2).reshape(b, n, -1))
        x = _rms(h, layer.post_attention_layernorm)
        mlp = layer.mlp
        h = h + linear(mlp.down_proj, F.silu(linear(mlp.gate_proj, x)) * linear(mlp.up_proj, x))
        if hidden is not None:
            hidden.append(h)
    h = _rms(h, body.norm)
    if hidden is not None:
        hidden[-1] = h
    logits = linear(model.lm_head, h[:, -logits_to_keep:] if logits_to_keep else h)
    return Output(logits, tuple(hidden) if hidden is not None else None)
