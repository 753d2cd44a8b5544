"""Hybrid draft trees: the drafter's best prefixes and retrieved continuations under one node budget.

The drafter and retrieval (`core.retrieval`) are right in different places: the drafter on fluent text it was
trained on, retrieval where the reply copies its prompt or itself. One best-first heap ranks both on one scale,
the estimated probability that a node is accepted:
- a drafter child of node u at depth d: P(u) * q_d(token), DDTree's product of marginals;
- a retrieved child: P(u) * c(m), with c the calibrated acceptance rate of a retrieved token whose match is m long.
Retrieved chains start at the root (the context's suffix) and below any drafter node (the suffix through its path),
and continue one token per level with m + 1. A token proposed by both is one node, ranked by the higher estimate,
with both origin bits. Every increment is <= 0, so the first b pops are the budget-b tree (nested, like DDTree),
and verification and the accept walk are unchanged: lossless at any temperature, as for any tree.
"""
from __future__ import annotations

import heapq
import itertools

import numpy as np

from core.builders import TreeBuilder, _append, clean
from core.retrieval import MAX_N, Calibration, Match, SuffixIndex
from core.tree import DRAFTER, RETRIEVED, DraftTree, path_to

MAX_CANDIDATES = 3   # retrieved continuations tried per node (distinct first tokens)


def build_hybrid(logq: np.ndarray, tokens: np.ndarray, budget: int, bonus: int, history: list[int],
                 index: SuffixIndex, logc, max_candidates: int = MAX_CANDIDATES) -> tuple[DraftTree, list[int]]:
    """The top-`budget` nodes by estimated acceptance probability, in pop order, and each node's retrieval match
    length (0: not retrieved). logq, tokens: [L, K] drafter candidates; history: the tokens before the bonus and
    the bonus (indexed in `index`); logc(m): log acceptance rate of a retrieved token with match length m."""
    n_pos, k = logq.shape
    lq, tok = clean(logq).astype(np.float64).tolist(), tokens.tolist()
    out = DraftTree([bonus], [-1], [0], [-1], [0.0], [0.0], [0.0], origin=[0])
    children: list[dict[int, int]] = [{}]      # node -> token -> child node
    offers: list[dict[int, Match]] = [{}]      # node -> token -> the retrieved continuation starting with it
    lengths = [0]
    tail = list(history[-MAX_N:])
    heap: list = []   # (-score, order, parent, depth row d, drafter rank r or -1, retrieved Match or None)
    order = itertools.count()   # ties: first pushed, first popped, so the build is deterministic

    def push_drafter(parent: int, d: int, r: int) -> None:
        if d < n_pos and r < k:
            heapq.heappush(heap, (-(out.prefix_logq[parent] + lq[d][r]), next(order), parent, d, r, None))

    def push_retrieved(parent: int, d: int, match: Match) -> None:
        if d < n_pos and match.tokens and match.tokens[0] not in offers[parent]:
            offers[parent][match.tokens[0]] = match
            score = out.prefix_logq[parent] + logc(match.length)
            heapq.heappush(heap, (-score, next(order), parent, d, -1, match))

    def lookup(node: int, d: int) -> None:
        path = [out.tokens[i] for i in path_to(out, node)[1:]]
        for match in index.continuations((tail + path)[-MAX_N:], n_pos - d, max_candidates):
            push_retrieved(node, d, match)

    if budget > 0 and n_pos > 0:
        push_drafter(0, 0, 0)
        lookup(0, 0)
    while heap and out.size < budget:
        neg, _, parent, d, r, match = heapq.heappop(heap)
        token = tok[d][r] if match is None else match.tokens[0]
        if match is None:
            push_drafter(parent, d, r + 1)      # next sibling: the parent's next-ranked drafter token
        if token in children[parent]:           # proposed by both: one node, made by the higher estimate's pop
            continue
        # a node's origin is known when it is made (the drafter's tokens at a depth are the same under every
        # parent, and the parent's retrieved offers were made with it), so a smaller budget's tree is a prefix
        rank = r if match is None else _rank(tok[d], token)
        match = offers[parent].get(token)
        node = len(out.tokens)
        _append(out, token, parent, d + 1, rank, -neg - out.prefix_logq[parent], -neg, -neg)
        out.origin.append((DRAFTER if rank >= 0 else 0) | (RETRIEVED if match is not None else 0))
        children[parent][token] = node
        children.append({})
        offers.append({})
        lengths.append(0 if match is None else match.length)
        push_drafter(node, d + 1, 0)            # first child: the drafter's best token one level down
        if match is None:
            lookup(node, d + 1)                 # what followed this path's suffix earlier
        else:
            push_retrieved(node, d + 1, Match(match.tokens[1:], match.length + 1))   # the copy goes on
    return out, lengths


def _rank(candidates: list[int], token: int) -> int:
    """The drafter's rank of a retrieved token at its depth, -1 if it is not among the candidates."""
    return candidates.index(token) if token in candidates else -1


class HybridBuilder(TreeBuilder):
    """Method `hybrid`: a builder with memory. It indexes the history as tokens commit, and `observe` (called by
    the engine after every step) counts which retrieved nodes the target accepted, so c(m) is this run's own."""

    def __init__(self, max_candidates: int = MAX_CANDIDATES):
        self.index, self.calibration = SuffixIndex(), Calibration()
        self.max_candidates = max_candidates
        self.lengths: list[int] = []

    def __call__(self, draft, budget: int, bonus: int, history: list[int]) -> DraftTree:
        self.index.sync(history)
        tree, self.lengths = build_hybrid(draft.logq, draft.tokens, budget, bonus, history, self.index,
                                          self.calibration.logp, self.max_candidates)
        return tree

    def observe(self, record) -> None:
        if record.draft_tokens is None:          # a plain step: nothing was drafted or retrieved
            return
        n = len(record.tree.tokens)              # the adaptive budget may have kept a prefix of the built tree
        self.calibration.update(record.tree.parents, record.accepted, self.lengths[:n])
