"""Continuous batching for training-data generation: `slots` replies decode together, and a reply that ends is
replaced by the next prompt at once, so no forward is spent on finished rows (plain `generate` pads them until the
longest reply of its batch ends).

All rows share one cache time axis. A new prompt is prefilled alone and its keys/values are written into the last
P columns of its row; the row's earlier columns are masked out. Each row has its own position ids, so rotary phases
are those of the row alone. Columns that no live row can see any more are dropped every few steps.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch

from core.dflash import extract_features
from core.kv_cache import cache_kwargs, new_cache

Capture = Callable[[int, list[int], torch.Tensor, torch.Tensor], None]


def _layers(cache):
    return [(layer, "keys", "values") for layer in cache.layers]


@torch.inference_mode()
def continuous_generate(target, prompts: list[list[int]], max_new_tokens: int, slots: int, stop_ids: set[int],
                        sampled: Callable[[int], bool], temperature: float = 0.8,
                        generator: torch.Generator | None = None, capture: Capture | None = None,
                        taps: list[int] = ()) -> Iterator[tuple[int, list[int]]]:
    """Yield (prompt index, reply ids) as replies finish (in any order). `sampled(i)` says whether prompt i is
    sampled at `temperature` (else greedy). The reply includes its stop token when it has one. `capture(i, reply,
    features, greedy)`, called before prompt i's reply is yielded, receives what training needs from the target
    and decoding computed anyway: the `taps` layers' outputs [T, n_taps*H] and the argmax [T] at each of the T
    prompt + reply positions (the last token, never fed, gets zeros: no training block reads it)."""
    device = target.device
    queue = list(range(len(prompts)))[::-1]
    rows: list[dict | None] = [None] * slots       # per slot: prompt index, position, reply so far
    cache, width = None, 0                         # shared cache [slots, H, width, D] and its valid-column mask
    visible = torch.zeros(slots, 0, dtype=torch.bool, device=device)
    steps = 0

    def admit(slot: int) -> None:
        """Prefill the next prompt alone and place its keys/values at the right end of `slot`'s row."""
        nonlocal cache, width, visible
        i = queue.pop()
        ids = torch.tensor([prompts[i]], device=device)
        one = new_cache(target)
        out = target(input_ids=ids, **cache_kwargs(target, one), logits_to_keep=0 if capture else 1,
                     output_hidden_states=capture is not None)
        logits = out.logits[0, -1]
        p = ids.shape[1]
        if cache is None:
            cache, width = _shared_cache(target, one, slots, p), p
            visible = torch.zeros(slots, p, dtype=torch.bool, device=device)
        if p > width:                               # make room on the left for a long prompt
            visible, width = _pad_left(cache, visible, p - width), p
        for (layer, k, v), (lo, lk, lv) in zip(_layers(cache), _layers(one)):
            getattr(layer, k)[slot, :, width - p:] = getattr(lo, lk)[0]
            getattr(layer, v)[slot, :, width - p:] = getattr(lo, lv)[0]
        visible[slot] = False
        visible[slot, width - p:] = True
        token = _pick(logits, sampled(i), temperature, generator)
        rows[slot] = {"i": i, "pos": p, "reply": [token]}
        if capture:
            rows[slot]["feats"] = [extract_features(out.hidden_states, taps)[0]]     # [P, n_taps*H]
            rows[slot]["greedy"] = [out.logits[0].argmax(-1)]                       # [P]

    for s in range(min(slots, len(queue))):
        admit(s)
    while any(r is not None for r in rows):
        for s, r in enumerate(rows):               # finished rows leave; the next prompt takes the slot
            if r is not None and (r["reply"][-1] in stop_ids or len(r["reply"]) >= max_new_tokens):
                if capture:
                    _hand_over(r, capture)
                yield r["i"], r["reply"]
                rows[s] = None
                if queue:
                    admit(s)
        live = [s for s, r in enumerate(rows) if r is not None]
        if not live:
            break
        tokens = torch.tensor([[rows[s]["reply"][-1] if rows[s] else 0] for s in range(slots)], device=device)
        positions = torch.tensor([[rows[s]["pos"] if rows[s] else 0] for s in range(slots)], device=device)
        step_visible = torch.cat([visible, torch.zeros(slots, 1, dtype=torch.bool, device=device)], 1)
        for s in live:
            step_visible[s, -1] = True
        mask = step_visible.long()
        mask[[s for s in range(slots) if rows[s] is None], -1] = 1    # empty rows attend to themselves only
        out = target(input_ids=tokens, attention_mask=mask, position_ids=positions, **cache_kwargs(target, cache),
                     logits_to_keep=1, output_hidden_states=capture is not None)
        step_feats = extract_features(out.hidden_states, taps)[:, -1:] if capture else None  # [slots, 1, n*H]
        visible, width = step_visible, width + 1
        for s in live:
            r = rows[s]
            r["pos"] += 1
            r["reply"].append(_pick(out.logits[s, -1], sampled(r["i"]), temperature, generator))
            if capture:
                r["feats"].append(step_feats[s])
                r["greedy"].append(out.logits[s, -1:].argmax(-1))
        steps += 1
        if steps % 32 == 0:
            visible, width = _drop_unseen(cache, visible, width)


def _shared_cache(target, one, slots: int, width: int):
    """An empty cache of `slots` rows and `width` columns, of the dtype and device of `one`, a prompt's own."""
    cache = new_cache(target)
    for layer, lo in zip(cache.layers, one.layers):
        layer.lazy_initialization(lo.keys, lo.values)
        layer.keys = lo.keys.new_zeros((slots, lo.keys.shape[1], width, lo.keys.shape[-1]))
        layer.values = lo.values.new_zeros((slots, lo.values.shape[1], width, lo.values.shape[-1]))
    return cache


def _pad_left(cache, visible: torch.Tensor, pad: int) -> torch.Tensor:
    """`pad` empty columns on the left of every row (room for a prompt longer than the cache is wide)."""
    for layer, k, v in _layers(cache):
        setattr(layer, k, torch.nn.functional.pad(getattr(layer, k), (0, 0, pad, 0)))
        setattr(layer, v, torch.nn.functional.pad(getattr(layer, v), (0, 0, pad, 0)))
    return torch.nn.functional.pad(visible, (pad, 0))


def _drop_unseen(cache, visible: torch.Tensor, width: int) -> tuple[torch.Tensor, int]:
    """Drop the cache columns no live row can see any more."""
    seen = visible.any(0).nonzero()
    first = int(seen[0]) if len(seen) else width
    if first > 0:
        for layer, k, v in _layers(cache):
            setattr(layer, k, getattr(layer, k)[:, :, first:].contiguous())
            setattr(layer, v, getattr(layer, v)[:, :, first:].contiguous())
    return visible[:, first:], width - first


def _hand_over(row: dict, capture: Capture) -> None:
    """A finished row's captured features and greedy choices, with zeros for its last, never fed, token."""
    feats = torch.cat(row["feats"])
    capture(row["i"], row["reply"], torch.cat([feats, feats.new_zeros(1, feats.shape[1])]),
            torch.cat([*row["greedy"], row["greedy"][0].new_zeros(1)]))


def _pick(logits: torch.Tensor, sample: bool, temperature: float, generator) -> int:
    if not sample:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, -1)
    return int(torch.multinomial(probs, 1, generator=generator))
