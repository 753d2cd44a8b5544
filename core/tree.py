"""The one draft-tree representation and its pure derivations.

Shape legend used across the project: B batch, T sequence, V vocab, L draft positions (block size - 1),
K candidates per position, N tree nodes including the root, P past length (tokens already in the target cache).

Node 0 is the root: the bonus token, already chosen by the target but not yet run through it. Every other node is
a drafted token; `parents[i] < i` (topological order), `depths[i] = depths[parents[i]] + 1`. Builders emit nodes
in pop order, so for DDTree the first b+1 nodes are exactly the tree of budget b (the nested property).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np


@dataclass(frozen=True)
class DraftTree:
    tokens: list[int]        # [N] token ids; tokens[0] is the bonus token
    parents: list[int]       # [N] parent node, -1 for the root
    depths: list[int]        # [N] 0 for the root
    ranks: list[int]         # [N] rank of the token among the drafter's candidates at its depth (-1: root, or
    #                          a retrieved token the drafter did not propose)
    logq: list[float]        # [N] log q_d(token) of the drafter at that depth (0 for the root; hybrid: a retrieved
    #                          node's calibrated log acceptance rate when that is higher)
    prefix_logq: list[float]  # [N] sum of logq along the root-to-node path: log q(u), DDTree's eq. 7
    score: list[float]       # [N] the builder's ranking score (= prefix_logq for DDTree; PRESTO's S(u))
    origin: list[int] | None = None  # [N] who proposed each node: DRAFTER | RETRIEVED bits (hybrid); None: drafter

    def __post_init__(self):
        n = len(self.tokens)
        assert self.parents[0] == -1 and self.depths[0] == 0
        assert all(len(a) == n for a in (self.parents, self.depths, self.ranks, self.logq, self.prefix_logq,
                                         self.score))
        assert self.origin is None or len(self.origin) == n
        assert all(0 <= self.parents[i] < i for i in range(1, n))

    @property
    def size(self) -> int:
        """Drafted nodes (the budget used); the root is free."""
        return len(self.tokens) - 1

    @property
    def expected_accepted(self) -> float:
        """Sum over drafted nodes of q(u): expected accepted drafts under the drafter (DDTree Proposition 1)."""
        return float(sum(math.exp(s) for s in self.prefix_logq[1:]))

    @property
    def max_depth(self) -> int:
        return max(self.depths)


DRAFTER, RETRIEVED = 1, 2   # `origin` bits: proposed by the drafter, found by retrieval (both: 3; the root: 0)


def origins(tree: DraftTree) -> list[int]:
    """[N] each node's proposers (a tree without `origin` is all the drafter's)."""
    return tree.origin if tree.origin is not None else [0] + [DRAFTER] * tree.size


def accepted_by(tree: DraftTree, accepted: list[int]) -> tuple[int, int, int]:
    """Accepted drafts proposed by the drafter only, found by retrieval only, and by both (hybrid trees)."""
    origin = origins(tree)
    kinds = [origin[i] for i in accepted[1:]]
    return kinds.count(DRAFTER), kinds.count(RETRIEVED), kinds.count(DRAFTER | RETRIEVED)


def root_only(bonus: int) -> DraftTree:
    return DraftTree([bonus], [-1], [0], [-1], [0.0], [0.0], [0.0])


def truncate(tree: DraftTree, budget: int) -> DraftTree:
    """The first `budget` drafted nodes: for nested builders, the tree that budget would have built."""
    n = min(len(tree.tokens), budget + 1)
    return DraftTree(*(None if getattr(tree, f.name) is None else getattr(tree, f.name)[:n] for f in fields(tree)))


def ancestor_mask(tree: DraftTree) -> np.ndarray:
    """[N, N] bool: row i marks i and its ancestors (a node sees its root-to-node path, nothing else)."""
    n = len(tree.tokens)
    mask = np.zeros((n, n), dtype=bool)
    for i, p in enumerate(tree.parents):
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    return mask


def position_ids(tree: DraftTree, past_len: int) -> np.ndarray:
    """[N] absolute positions: the root sits at past_len, a node at past_len + depth (siblings share one)."""
    return past_len + np.asarray(tree.depths, dtype=np.int64)


def child_maps(tree: DraftTree) -> list[dict[int, int]]:
    """[N] dicts token id -> child node, for the accept walk."""
    maps: list[dict[int, int]] = [{} for _ in tree.tokens]
    for i in range(1, len(tree.tokens)):
        maps[tree.parents[i]][tree.tokens[i]] = i
    return maps


def path_to(tree: DraftTree, node: int) -> list[int]:
    """Node indices from the root to `node`, inclusive."""
    path = []
    while node >= 0:
        path.append(node)
        node = tree.parents[node]
    return path[::-1]


def is_chain(tree: DraftTree) -> bool:
    return all(p == i - 1 for i, p in enumerate(tree.parents))
