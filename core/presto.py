"""PRESTO (Wang et al. 2026): rank draft-tree paths with a prefix-aligned score and grow the tree by search.

The drafter's marginals q_i are prefix-blind: they score a token at depth i the same whatever the path chose
before it. PRESTO adds an n-gram model that does see the path:
    S(u) = sum_i [ log q_i(u_i) + lam_i * log p_ng(u_i | last n-1 tokens of (context, b, u_1..u_{i-1})) ]
Every increment is <= 0, so S never grows along a path and the top-B nodes under S always form a valid tree.
- `build_presto`: best-first, DDTree's heap with per-parent child orders: the exact top-B nodes under S over the
  K-ary candidate lattice. With lam = 0 it is `build_ddtree`, node for node.
- `build_presto_beam`: depth-synchronous beam of width W; every generated node stays in a global pool, and the
  tree is the top-B of the pool (prefix-closed by monotonicity).
Both are pure functions of the candidates, the context and an n-gram model.
"""
from __future__ import annotations

import heapq
import math
from pathlib import Path

import numpy as np

from core.builders import TreeBuilder, _append, clean
from core.ngram import load_model
from core.tree import DraftTree, root_only



def depth_lambdas(lam: float, n_pos: int, entropy: np.ndarray | None, k: int) -> list[float]:
    """lam per depth; entropy-adaptive: lam * H(q_d) / log K, clipped to [0, lam] (trust the n-gram where the
    drafter is unsure)."""
    if entropy is None or k < 2:
        return [lam] * n_pos
    return [lam * min(1.0, max(0.0, float(h) / math.log(k))) for h in entropy[:n_pos]]


class _Scorer:
    """Local scores log q_d(t) + lam_d log p_ng(t | path context) of a node's K candidates, sorted once per node."""

    def __init__(self, logq, tokens, context, ngram, lams, order):
        self.lq, self.tok, self.ngram, self.lams = logq.astype(np.float64), tokens, ngram, lams
        self.n = order - 1                                   # context tokens the n-gram sees
        self.context = list(context[len(context) - self.n:]) if self.n > 0 else []

    def local(self, path_tokens: list[int], depth: int) -> np.ndarray:
        """[K] local scores of the candidates at `depth` (0-based row) after this path."""
        if self.lams[depth] == 0.0:
            return self.lq[depth]
        ctx = (self.context + path_tokens[-self.n:])[-self.n:] if self.n > 0 else []
        return self.lq[depth] + self.lams[depth] * self.ngram.logprobs(ctx, self.tok[depth])

    def children(self, path_tokens: list[int], depth: int) -> tuple[list[int], list[float]]:
        """Candidate indices at `depth` in descending local score (ties: lower index first), and those scores."""
        local = self.local(path_tokens, depth)
        order = (-local).argsort(kind="stable")
        return order.tolist(), local[order].tolist()


def build_presto(logq: np.ndarray, tokens: np.ndarray, budget: int, bonus: int, context: list[int], ngram,
                 lam: float, entropy: np.ndarray | None = None) -> DraftTree:
    """The top-`budget` nodes under S, best first (the exact optimum of S over the K-ary lattice)."""
    n_pos, k = logq.shape
    logq = clean(logq)
    out = root_only(bonus)
    if budget <= 0 or n_pos == 0 or k == 0:
        return out
    lams = depth_lambdas(lam, n_pos, entropy, k)
    scorer = _Scorer(logq, tokens, context, ngram, lams, ngram.order if ngram else 1)
    lq, tok = scorer.lq.tolist(), tokens.tolist()
    best = [max(row) for row in lq]          # max log q per depth: the bound's drafter term
    orders = {0: scorer.children([], 0)}     # node -> (child candidate order, local scores)
    paths = {0: []}
    # heap entry: (-S, ranks in per-parent order, parent node, parent S). A node's first child is pushed lazily:
    # with the bound S(node) + max log q (n-gram terms are <= 0) until it pops, and only then are the node's K
    # children scored, so nodes whose children never reach the top-B cost no n-gram lookups.
    heap = [(-orders[0][1][0], (0,), 0, 0.0)]
    while heap and out.size < budget:
        neg, ranks, parent, parent_s = heapq.heappop(heap)
        if parent not in orders:             # a lazy first child: score the parent's children, push the real one
            orders[parent] = scorer.children(paths[parent], len(ranks) - 1)
            heapq.heappush(heap, (-(parent_s + orders[parent][1][0]), ranks, parent, parent_s))
            continue
        d, r = len(ranks), ranks[-1]
        cand = orders[parent][0][r]
        node = len(out.tokens)
        _append(out, tok[d - 1][cand], parent, d, cand, lq[d - 1][cand], out.prefix_logq[parent] + lq[d - 1][cand],
                -neg)
        if r + 1 < k:
            heapq.heappush(heap, (-(parent_s + orders[parent][1][r + 1]), ranks[:-1] + (r + 1,), parent, parent_s))
        if d < n_pos:
            paths[node] = paths[parent] + [out.tokens[node]]
            if lams[d] == 0.0:               # exact without the n-gram: no bound needed
                orders[node] = scorer.children(paths[node], d)
                heapq.heappush(heap, (neg - orders[node][1][0], ranks + (0,), node, -neg))
            else:
                heapq.heappush(heap, (neg - best[d], ranks + (0,), node, -neg))
    return out


def build_presto_beam(logq: np.ndarray, tokens: np.ndarray, budget: int, bonus: int, context: list[int], ngram,
                      lam: float, beam_width: int, entropy: np.ndarray | None = None) -> DraftTree:
    """Beam search (W per depth) with global retention; the tree is the top-`budget` of every generated node."""
    n_pos, k = logq.shape
    logq = clean(logq)
    if budget <= 0 or n_pos == 0 or k == 0:
        return root_only(bonus)
    scorer = _Scorer(logq, tokens, context, ngram, depth_lambdas(lam, n_pos, entropy, k), ngram.order if ngram else 1)
    # the pool, one array chunk per depth: S, depth, parent pool index (-1 = root), candidate index
    pool_s, pool_d, pool_parent, pool_cand = [], [], [], []
    beam_idx, beam_s, beam_paths = np.array([-1]), np.array([0.0]), [[]]
    offset = 0
    for d in range(n_pos):
        s = beam_s[:, None] + np.stack([scorer.local(path, d) for path in beam_paths])   # [W, K] S of every child
        row, cand = np.divmod(np.arange(s.size), k)
        flat = s.ravel()
        ranked = np.lexsort((cand, row, -flat))         # best S first; ties: earlier beam entry, lower candidate
        pool_s.append(flat[ranked])
        pool_d.append(np.full(len(ranked), d + 1))
        pool_parent.append(beam_idx[row[ranked]])
        pool_cand.append(cand[ranked])
        top = ranked[:beam_width]
        beam_idx, beam_s = offset + np.arange(len(top)), flat[top]
        beam_paths = [beam_paths[r] + [int(tokens[d, c])] for r, c in zip(row[top].tolist(), cand[top].tolist())]
        offset += len(ranked)
    pool_s, pool_d = np.concatenate(pool_s), np.concatenate(pool_d)
    pool_parent, pool_cand = np.concatenate(pool_parent).tolist(), np.concatenate(pool_cand).tolist()
    # top-B by S; ties prefer shallower nodes, so a parent always precedes its children
    chosen = np.lexsort((np.arange(len(pool_s)), pool_d, -pool_s))[:budget].tolist()
    node_of = {-1: 0}
    out = root_only(bonus)
    for i in chosen:
        d, cand = int(pool_d[i]), pool_cand[i]
        node_of[i] = len(out.tokens)
        p = node_of[pool_parent[i]]
        lq = float(logq[d - 1, cand])
        _append(out, int(tokens[d - 1, cand]), p, d, cand, lq, out.prefix_logq[p] + lq, float(pool_s[i]))
    return out


class PrestoBuilder(TreeBuilder):
    """The engine's builder for one request: keeps the n-gram model's online counts up to date with the history."""

    def __init__(self, cfg, ngram):
        self.cfg, self.ngram = cfg, ngram

    def __call__(self, draft, budget: int, bonus: int, history: list[int]) -> DraftTree:
        cfg = self.cfg
        self.ngram.observe(history)
        entropy = draft.entropy if cfg.entropy_lam else None
        if cfg.method == "presto-beam":
            width = cfg.beam_width or 2 * math.ceil(budget / max(1, draft.logq.shape[0]))
            return build_presto_beam(draft.logq, draft.tokens, budget, bonus, history, self.ngram, cfg.lam, width,
                                     entropy)
        return build_presto(draft.logq, draft.tokens, budget, bonus, history, self.ngram, cfg.lam, entropy)


def presto_builder(cfg, vocab: int, table_path: str | Path | None, ngram=None) -> PrestoBuilder:
    """Without a table for this tokenizer, PRESTO scores with the request's own n-gram counts only."""
    if ngram is None:
        ngram = load_model(table_path, vocab=vocab, order=cfg.ngram_order)
    return PrestoBuilder(cfg, ngram)
