"""Budget and context caps derived from the memory this machine has free, so that a huge budget or a long
context is refused with a clear message before the forward, instead of swapping the machine or getting the process
killed mid-run.

A verification forward of N tree tokens over P cached ones needs, beyond the weights (estimates, in bytes):
    KV cache      2 * layers * kv_heads * head_dim * (P + N) * dtype
    mask          N * (P + N) * dtype                  the 4-D ancestor mask
    attention     heads * N * (P + N) * 4              one layer's scores (fp32)
    hidden states (layers + 1) * N * hidden * dtype    kept for the drafter's features
    MLP           3 * N * intermediate * dtype
    logits        N * vocab * (dtype + 4)              and their fp32 copy for acceptance
A run may use at most SHARE of the memory available when it starts.
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass

import psutil
import torch

from core.config import MAX_BUDGET

SHARE = 0.5     # of the currently available memory, for one run's cache and transient tensors


def available_bytes(device: torch.device | None = None) -> int:
    """Free memory where the model runs: the GPU's when it is on CUDA, else the system's."""
    if device is not None and device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


def context_window(target) -> int:
    """The target's context window (max_position_embeddings), or practically unbounded when it has none."""
    cfg = getattr(target.config, "text_config", target.config)
    return int(getattr(cfg, "max_position_embeddings", None) or 1 << 30)


def step_bytes(target, n_tree: int, past_len: int) -> int:
    """Estimated peak bytes of one verification forward (see the module docstring)."""
    cfg = getattr(target.config, "text_config", target.config)
    b = torch.finfo(target.dtype).bits // 8 if target.dtype.is_floating_point else 4
    layers, hidden = cfg.num_hidden_layers, cfg.hidden_size
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    inter = getattr(cfg, "intermediate_size", 4 * hidden)
    vocab = target.get_output_embeddings().weight.shape[0]
    n, total = n_tree, past_len + n_tree
    return (2 * layers * kv_heads * head_dim * total * b + n * total * b + heads * n * total * 4
            + (layers + 1) * n * hidden * b + 3 * n * inter * b + n * vocab * (b + 4))


@dataclass(frozen=True)
class Limits:
    allowance: int      # bytes a run may use
    max_budget: int     # largest budget whose step fits at a 2048-token context (or the window, if smaller)
    max_context: int    # longest context (prompt + new tokens) whose step fits at budget 64


def limits(target, allowance: int | None = None) -> Limits:
    allowance = int(available_bytes(target.device) * SHARE) if allowance is None else allowance
    window = context_window(target)
    ctx = min(window, 2048)
    return Limits(allowance, _largest(lambda n: step_bytes(target, n + 1, ctx) <= allowance, 0, MAX_BUDGET),
                  _largest(lambda p: step_bytes(target, 65, p) <= allowance, 0, window))


def check_memory(target, budget: int, prompt_len: int, max_new_tokens: int) -> None:
    """ValueError when the run's largest step would not fit in the memory available now."""
    context = min(context_window(target), prompt_len + max_new_tokens)
    need, allowance = step_bytes(target, budget + 1, context), int(available_bytes(target.device) * SHARE)
    if need > allowance:
        cap = limits(target, allowance)
        raise ValueError(f"a step with budget {budget} at a {context}-token context needs about {need / 2**30:.1f} "
                         f"GiB, but this machine can give a run {allowance / 2**30:.1f} GiB now; lower the budget "
                         f"(≤ {cap.max_budget} here) or the prompt plus new tokens (≤ {cap.max_context})")


def _libc():
    try:
        return ctypes.CDLL("libc.so.6") if sys.platform.startswith("linux") else None
    except OSError:
        return None


_LIBC = _libc()


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc `malloc_trim`). A decode step frees and re-allocates tensors
    whose sizes grow with the context; glibc keeps the freed pages, so without this a long run's resident memory
    climbs by ~0.5 MiB per step on the embedded default (RELIABILITY.md §6). Costs well under a millisecond."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _largest(fits, lo: int, hi: int) -> int:
    """The largest x in [lo, hi] with fits(x) (fits is monotone: true, then false); lo if none."""
    if fits(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
