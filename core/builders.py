"""Pure draft-tree builders: (logq [L, K], tokens [L, K], budget) -> DraftTree.

Inputs are the drafter's per-position top-K log-probabilities (sorted, descending) and token ids on the CPU; no
model, device or timer is touched, so every builder is testable with hand-written numbers.
- `build_chain`: vanilla DFlash, the argmax token at every depth.
- `build_ddtree`: DDTree's Algorithm 1, a best-first heap over rank tuples with next-sibling and first-child
  successors. It pops prefixes in non-increasing q(u) = prod_i q_i(u_i), so the first B pops are the exact top-B
  prefixes (Proposition 2), always a valid tree, in O(B log B).
Ties are broken by the lexicographically smaller rank tuple, as the official code does.
"""
from __future__ import annotations

import heapq

import numpy as np

from core.tree import DraftTree, root_only


def clean(logq: np.ndarray) -> np.ndarray:
    """Log-probabilities as builders need them: <= 0 (so scores never grow along a path) and NaN-free (-inf)."""
    return np.nan_to_num(np.minimum(logq.astype(np.float32), 0.0), nan=-np.inf)


def build_chain(logq: np.ndarray, tokens: np.ndarray, budget: int, bonus: int) -> DraftTree:
    """The argmax path, min(budget, L) deep."""
    if logq.shape[1] == 0:
        return DraftTree([bonus], [-1], [0], [-1], [0.0], [0.0], [0.0])
    depth = max(0, min(budget, logq.shape[0]))
    best = clean(logq[:depth, 0]).astype(np.float64)          # [depth] the argmax path's log q
    prefix = np.concatenate([[0.0], np.cumsum(best)]).tolist()
    return DraftTree(tokens=[bonus] + tokens[:depth, 0].tolist(), parents=list(range(-1, depth)),
                     depths=list(range(depth + 1)), ranks=[-1] + [0] * depth,
                     logq=[0.0] + best.tolist(), prefix_logq=prefix, score=prefix)


def build_ddtree(logq: np.ndarray, tokens: np.ndarray, budget: int, bonus: int) -> DraftTree:
    """The top-`budget` prefixes by q(u), in pop order (so any prefix of the node list is the smaller tree)."""
    n_pos, k = logq.shape
    lq = clean(logq).astype(np.float64).tolist()   # Python floats: a node's score is its parent's plus one term
    tok = tokens.tolist()
    out = DraftTree([bonus], [-1], [0], [-1], [0.0], [0.0], [0.0])
    if budget <= 0 or n_pos == 0 or k == 0:
        return out
    # heap entry: (-score, rank tuple, parent node, parent score); the entry's depth is len(rank tuple)
    heap = [(-lq[0][0], (0,), 0, 0.0)]
    while heap and out.size < budget:
        neg, ranks, parent, parent_score = heapq.heappop(heap)
        d, r = len(ranks), ranks[-1]
        node = len(out.tokens)
        _append(out, tok[d - 1][r], parent, d, r, lq[d - 1][r], -neg, -neg)
        if r + 1 < k:     # next sibling: same parent, next-ranked token at this depth
            heapq.heappush(heap, (-(parent_score + lq[d - 1][r + 1]), ranks[:-1] + (r + 1,), parent, parent_score))
        if d < n_pos:     # first child: this node's best continuation
            heapq.heappush(heap, (neg - lq[d][0], ranks + (0,), node, -neg))
    return out


def _append(tree: DraftTree, token: int, parent: int, depth: int, rank: int, logq: float, prefix: float,
            score: float) -> None:
    # DraftTree is frozen, but its lists are the builder's own until the tree is returned
    tree.tokens.append(token)
    tree.parents.append(parent)
    tree.depths.append(depth)
    tree.ranks.append(rank)
    tree.logq.append(logq)
    tree.prefix_logq.append(prefix)
    tree.score.append(score)


class TreeBuilder:
    """What the decode loop calls a builder: `build(draft, budget, bonus, history) -> DraftTree`, with `history` the
    prompt and every token committed so far. The two hooks let a builder with memory act on the run: the loop asks
    `should_draft()` before drafting (False: this step verifies the root alone) and passes every step's StepRecord
    to `observe`. This base drafts nothing (plain decoding's root-only tree) and its hooks do nothing."""

    def __call__(self, draft, budget: int, bonus: int, history: list[int]) -> DraftTree:
        return root_only(bonus)

    def should_draft(self) -> bool:
        return True

    def observe(self, record) -> None:
        return None


class Ranked(TreeBuilder):
    """A pure builder over the draft's candidates: fn(logq [L, K], tokens [L, K], budget, bonus) -> DraftTree."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, draft, budget: int, bonus: int, history: list[int]) -> DraftTree:
        return self.fn(draft.logq, draft.tokens, budget, bonus)


class Function(TreeBuilder):
    """Any callable with the builder signature (a test's informed builder); hooks it defines are kept, the
    others are the base's."""

    def __init__(self, fn):
        self.fn = fn
        self.should_draft = getattr(fn, "should_draft", self.should_draft)
        self.observe = getattr(fn, "observe", self.observe)

    def __call__(self, draft, budget: int, bonus: int, history: list[int]) -> DraftTree:
        return self.fn(draft, budget, bonus, history)


def as_builder(build) -> TreeBuilder:
    return build if isinstance(build, TreeBuilder) else Function(build)


BUILDERS = {"chain": build_chain, "ddtree": build_ddtree}
NESTED = {"chain", "ddtree", "presto", "hybrid"}   # builders whose budget-b tree is the first b nodes of any larger one
