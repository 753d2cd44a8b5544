"""One target forward over a flattened draft tree.

The tree goes to a stock Hugging Face model as input ids [1, N], explicit position ids past_len + depth, and an
additive 4-D mask [1, 1, N, P+N]: every node sees the whole cached prefix and, inside the tree, only its
ancestors and itself. A chain needs no mask (it is plain causal attention), so the AR and chain paths run exactly
the forward that plain decoding runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from core.dflash import extract_features
from core.fast_forward import forward
from core.tree import DraftTree, ancestor_mask, is_chain, position_ids


@dataclass
class Verification:
    logits: torch.Tensor            # [N, V] the target's next-token logits at every node
    features: torch.Tensor | None   # [N, n_taps*H] drafter context features at every node (None without drafter)


def tree_inputs(tree: DraftTree, past_len: int, dtype: torch.dtype, device) -> dict:
    n = len(tree.tokens)
    ids = torch.tensor([tree.tokens], dtype=torch.long, device=device)                       # [1, N]
    pos = torch.as_tensor(position_ids(tree, past_len), device=device)[None]                 # [1, N]
    if is_chain(tree):
        return {"input_ids": ids, "position_ids": pos, "attention_mask": None}
    allow = torch.ones(n, past_len + n, dtype=torch.bool)
    allow[:, past_len:] = torch.from_numpy(ancestor_mask(tree))
    mask = torch.zeros(n, past_len + n, dtype=dtype).masked_fill_(~allow, torch.finfo(dtype).min)
    return {"input_ids": ids, "position_ids": pos, "attention_mask": mask[None, None].to(device)}  # [1,1,N,P+N]


def verify(target, tree: DraftTree, cache, past_len: int, layer_ids: list[int] | None) -> Verification:
    """Run the target once over the tree (appending N entries to `cache`)."""
    inputs = tree_inputs(tree, past_len, target.dtype, target.device)
    out = forward(target, cache=cache, output_hidden_states=layer_ids is not None, **inputs)
    features = extract_features(out.hidden_states, layer_ids)[0] if layer_ids is not None else None
    return Verification(out.logits[0], features)
