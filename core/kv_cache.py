"""Cropping and compaction of the target's Hugging Face `DynamicCache`, hiding layout differences.

transformers 5.x keeps `cache.layers[i].keys / .values`; 4.x kept `key_cache / value_cache` lists. After a tree
verification the cache holds past_len + N entries; `compact` keeps only the accepted path. Accepted nodes have
depths 0..k, exactly their final positions, so their cached keys already carry the right rotary phase.
"""
from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache


def new_cache(model) -> DynamicCache:
    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


def _kv_pairs(cache):
    if hasattr(cache, "layers"):
        return [(layer, "keys", "values") for layer in cache.layers]
    return [(cache, ("key_cache", i), ("value_cache", i)) for i in range(len(cache.key_cache))]


def crop_to(cache, length: int) -> None:
    """Drop everything after the first `length` positions (portable: crop only takes negatives in 5.x)."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def compact(cache, past_len: int, keep: torch.Tensor) -> None:
    """Keep entries past_len + keep (keep: [M] long, increasing, relative to past_len), then crop to past_len + M.
    Entries already in place (keep[i] == i: the whole path of a chain, the root and often more of a tree) stay."""
    m = keep.numel()
    moved = (keep.cpu() != torch.arange(m)).nonzero()
    if len(moved):
        first = int(moved[0])
        for owner, k_name, v_name in _kv_pairs(cache):
            for name in (k_name, v_name):
                t = getattr(owner, name) if isinstance(name, str) else getattr(owner, name[0])[name[1]]
                kept = t.index_select(-2, keep[first:].to(t.device) + past_len)   # [B, H, M-first, D], a copy
                t[..., past_len + first: past_len + m, :].copy_(kept)
    crop_to(cache, past_len + m)


def cache_kwargs(model, cache) -> dict:
    """The cache keyword of `model.forward`: `cache` in transformers 5.x, `past_key_values` before."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache, "use_cache": True}
