"""The target's verification-cost curve: forward latency against tree size, measured once per model, device and
dtype and cached on disk (JSON, atomic). The app's speed-up estimate and the adaptive budget read it."""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from core.builders import build_ddtree
from core.fast_forward import covered, forward
from core.kv_cache import crop_to, new_cache
from core.limits import context_window
from core.tree import DraftTree
from core.verify import tree_inputs

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def cost_key(target) -> str:
    cfg = getattr(target.config, "text_config", target.config)
    name = Path(str(getattr(target.config, "_name_or_path", "") or cfg.model_type)).name
    return (f"{name}-h{cfg.hidden_size}-l{cfg.num_hidden_layers}-{target.device.type}-"
            f"{str(target.dtype).removeprefix('torch.')}{'-fast' if covered(target) else ''}")


def sample_tree(n: int, vocab: int = 40000) -> DraftTree:
    """A best-first tree of n tokens (root included) over random peaked marginals: a stand-in for timing."""
    rng = np.random.default_rng(n)
    logq = np.sort(np.log(rng.dirichlet(np.ones(64) * 0.3, size=15)), axis=-1)[:, ::-1].copy()
    tokens = rng.integers(min(100, vocab - 1), vocab, size=(15, 64))
    return build_ddtree(logq.astype(np.float32), tokens, n - 1, bonus=5)


@torch.inference_mode()
def measure(target, sizes=SIZES, past_len: int = 256, repeats: int = 5) -> dict[int, float]:
    """Median ms of one verification forward of N tree tokens (a random best-first tree) on a cached context."""
    vocab = target.get_input_embeddings().weight.shape[0]
    sizes = [n for n in sizes if past_len + n <= context_window(target)] or [1]
    cache = new_cache(target)
    forward(target, torch.randint(0, vocab, (1, past_len), device=target.device), cache)
    out = {}
    for n in sizes:
        inputs = tree_inputs(sample_tree(n, vocab), past_len, target.dtype, target.device)
        times = []
        for _ in range(repeats + 1):
            if target.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            forward(target, cache=cache, output_hidden_states=True, **inputs)
            if target.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            crop_to(cache, past_len)
        out[n] = statistics.median(times[1:]) * 1000
    return out


def monotone(curve: dict[int, float]) -> dict[int, float]:
    """The least-squares non-decreasing fit of a measured curve (pool adjacent violators). A bigger tree never
    verifies faster; a noisy dip at small sizes would otherwise draw the adaptive budget towards it."""
    blocks: list[list[float]] = []                      # [sum, count] of pooled neighbouring sizes
    for n in sorted(curve):
        blocks.append([curve[n], 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [total / count for total, count in blocks for _ in range(int(count))]
    return dict(zip(sorted(curve), fitted))


def cost_curve(target, folder: Path | None = None) -> dict[int, float]:
    """The cached curve for this target, device and dtype, made monotone; measured (seconds) when absent."""
    from core.models import cache_dir

    path = (folder or cache_dir() / "costs") / f"{cost_key(target)}.json"
    try:
        data = json.loads(path.read_text())
        if data.get("key") == cost_key(target):
            return monotone({int(k): float(v) for k, v in data["ms"].items()})
    except (OSError, ValueError, KeyError):
        pass
    curve = measure(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": cost_key(target), "ms": curve}))
        os.replace(tmp, path)
    except OSError:
        pass   # an unwritable cache only costs a re-measurement next time
    return monotone(curve)
