"""The accept walk over a verified tree (p is the target, q the drafter, as in Leviathan et al.).

Greedy: follow the target's argmax from the root while it is a child. Temperature > 0: sample-and-walk, drawing
one target token x ~ p(. | path) at each visited node and moving to the child that carries x; the first draw
that is not a child becomes the bonus token. Every emitted token is then a draw from the target given exactly the
emitted prefix, so the output distribution is the target's (with its top-k / top-p warping), whatever the tree.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from core.tree import DraftTree, child_maps


@dataclass(frozen=True)
class Acceptance:
    accepted: list[int]    # node indices of the accepted path, starting with the root (0)
    bonus: int             # the target's token after the path: next step's root
    p_tokens: list[float]  # target probability of each emitted token: accepted drafts, then the bonus
    runner_up: list[tuple[int, float]] = ()  # greedy: the target's second choice at each emitted token and the
    #                                          logit gap to it (how near a tie the choice was; `core.divergence`)


GREEDY_BELOW = 1e-5   # temperatures below this decode greedily (as the DDTree reference code does)


def warp(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """[..., V] sampling probabilities: temperature, then top-k, then top-p (the order of HF's warpers)."""
    scores = logits.float() / max(temperature, GREEDY_BELOW)
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p    # keep the smallest set whose mass reaches top_p
        drop[..., 0] = False                              # and always the most likely token
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def follow(tree: DraftTree, choice: list[int]) -> list[int]:
    """The accepted path, root first: from the root, move to the child carrying the target's token after each
    node (choice[i]) while there is one."""
    maps, node, path = child_maps(tree), 0, [0]
    while choice[node] in maps[node]:
        node = maps[node][choice[node]]
        path.append(node)
    return path


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> Acceptance:
    """logits: [N, V]. Walk while the target's argmax is a child."""
    # one device sync for the whole tree; argmax over a float copy is about 2x faster than over bf16 on CPU and
    # picks the same index (same values, first maximum)
    choice = logits.float().argmax(-1).tolist()
    path = follow(tree, choice)
    node = path[-1]
    rows = torch.tensor(path, device=logits.device)
    picked = torch.tensor([tree.tokens[i] for i in path[1:]] + [choice[node]], device=logits.device)
    scores = logits[rows].float()                                                      # [len(path), V]
    p = torch.softmax(scores, -1).gather(-1, picked[:, None])[:, 0].tolist()
    return Acceptance(path, choice[node], p, second_choices(scores, picked))


def second_choices(logits: torch.Tensor, chosen: torch.Tensor) -> list[tuple[int, float]]:
    """logits [N, V], chosen [N] (each row's argmax) -> per row (the best other token, the chosen logit minus
    its): a small gap is a near-tie, which rounding in another forward (bf16 in a wider verification) can break
    the other way. Exact ties are common in bf16, whose logits step by 1/8 near 20: the runner-up is then the tied
    token that argmax passed over, with gap 0."""
    scores = logits.float()
    top = scores.gather(-1, chosen[:, None])[:, 0]                                   # [N]
    others = scores.scatter(-1, chosen[:, None], float("-inf")).max(-1)              # [N] values, indices
    return list(zip(others.indices.tolist(), (top - others.values).tolist()))


def accept_sample(tree: DraftTree, logits: torch.Tensor, temperature: float, top_p: float, top_k: int,
                  generator: torch.Generator) -> Acceptance:
    """Sample-and-walk: one target draw per visited node (lossless at any temperature)."""
    maps, node, path, p_tokens = child_maps(tree), 0, [0], []
    while True:
        probs = warp(logits[node], temperature, top_p, top_k)
        x = int(torch.multinomial(probs.cpu(), 1, generator=generator))
        p_tokens.append(float(probs[x]))
        if x not in maps[node]:
            return Acceptance(path, x, p_tokens)
        node = maps[node][x]
        path.append(node)


def sample_token(logits: torch.Tensor, temperature: float, top_p: float, top_k: int,
                 generator: torch.Generator) -> tuple[int, float]:
    """One token from the target's last-position logits [V] (the prefill), with its probability."""
    if temperature < GREEDY_BELOW:
        x = int(logits.argmax())
        return x, float(torch.softmax(logits.float(), -1)[x])
    probs = warp(logits, temperature, top_p, top_k)
    x = int(torch.multinomial(probs.cpu(), 1, generator=generator))
    return x, float(probs[x])
