"""One decoding step as an animation in four phases, drawn in the tree's place: (a) the drafter's block, its top
candidates with q for every position, from one forward; (b) the builder adding nodes in the order it pops them, with
a budget counter (PRESTO: each node's λ·log p_ngram beside its log q); (c) verification: the flattened tree under its
ancestor-only mask, one target forward; (d) the walk: the target's choice node by node, the accepted path, the bonus
token and the KV compaction. A phase has frames (nodes appear, the walk advances); `frames` counts them.

Pure: a StepRecord and token texts in, a Plotly figure and a Markdown caption out. `shown_ids` says which tokens'
texts the phases read.
"""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from viz import charts, theme
from viz.tree_graph import tidy_layout, tree_figure

PHASES = ("draft", "build", "verify", "walk")
TITLES = {"draft": "1 · Draft", "build": "2 · Build", "verify": "3 · Verify", "walk": "4 · Walk"}
CANDIDATES = 5            # top candidates per position in the draft phase
BUILD_FRAMES = 16         # the builder's pops are shown in at most this many frames
RECENT = 4                # the build caption's table: the nodes added last
MASK_LIMIT = 64           # the verify phase draws the mask up to this many drafted nodes, the tree above
NGRAM_TOL = 1e-3          # an n-gram term smaller than this is a trace's rounding (4 decimals), not PRESTO


def phases(record) -> tuple[str, ...]:
    """The phases this step had: no draft and no tree for plain steps, only the walk (the target's own choice) for
    the prefill."""
    if record.step == 0:
        return ("walk",)
    has_draft = record.draft_tokens is not None
    return tuple(p for p in PHASES if (p != "draft" or has_draft) and (p != "build" or record.tree.size > 0))


def _chunk(record) -> int:
    return max(1, math.ceil(record.tree.size / BUILD_FRAMES))


def frames(record, phase: str) -> int:
    """Frames of `phase` at this step: the build's pops in chunks, the walk one node at a time and then the bonus."""
    if phase == "build":
        return math.ceil(record.tree.size / _chunk(record))
    if phase == "walk":
        return len(record.accepted) + (record.step > 0)
    return 1


def shown_ids(record, candidates: int = CANDIDATES) -> set[int]:
    """Every token id the step's views and phases show: the tree, the committed tokens, the bonus and the drafter's
    top candidates."""
    ids = set(record.tree.tokens + record.committed + [record.bonus])
    if record.draft_tokens is not None:
        ids |= {int(t) for t in np.asarray(record.draft_tokens)[:, :candidates].ravel()}
    return ids


def figure(record, texts: dict[int, str], phase: str, frame: int, **style) -> go.Figure:
    """The figure of `phase` at `frame` (0-based); `style` is the tree figure's (height, label sizes)."""
    frame = max(0, min(frame, frames(record, phase) - 1))
    height = style.get("height")
    if phase == "draft":
        return draft_figure(record, texts, height)
    if phase == "build":
        shown = min(record.tree.size, (frame + 1) * _chunk(record))
        fig = tree_figure(record, texts, title=f"{TITLES['build']}: node {shown} of {record.tree.size} popped",
                          nodes=shown + 1, path=0, **style)
        return _ring(fig, record, range(max(1, shown - _chunk(record) + 1), shown + 1))
    if phase == "verify":
        title = f"{TITLES['verify']}: {record.tree.size + 1} tokens in one target forward"
        fig = charts.mask_heatmap(record, texts, MASK_LIMIT)
        if record.tree.size > MASK_LIMIT:          # no readable mask: the tree, whose nodes all go in
            fig = tree_figure(record, texts, title=title, path=0, **style)
        fig.update_layout(title_text=f"{title}, ancestor-only mask", **({"height": height} if height else {}))
        return fig
    last = frame >= len(record.accepted) or record.step == 0
    title = f"{TITLES['walk']}: " + (f"τ = {record.tau}, bonus and KV compaction" if last else
                                     f"the target's choice after node {record.accepted[frame]}")
    return tree_figure(record, texts, title=title, path=None if last else frame + 1, **style)


def _ring(fig: go.Figure, record, new) -> go.Figure:
    """Circles round the nodes this frame added."""
    tree = record.tree
    y = tidy_layout(tree.parents, tree.score)
    new = list(new)
    fig.add_scatter(x=[tree.depths[i] for i in new], y=[y[i] for i in new], mode="markers", hoverinfo="skip",
                    name="just popped", marker=dict(size=20, symbol="circle-open", color=theme.BONUS,
                                                    line=dict(width=2.5, color=theme.BONUS)))
    return fig


def draft_figure(record, texts: dict[int, str], height: int | None = None, k: int = CANDIDATES) -> go.Figure:
    """L columns (draft positions) of the drafter's top-k candidates, coloured by log10 q on the tree's scale."""
    tokens = np.asarray(record.draft_tokens)[:, :k]                      # [L, k]
    logq = None if record.draft_logq is None else np.asarray(record.draft_logq, dtype=np.float64)[:, :k]
    n_pos = tokens.shape[0]
    z = (np.log10(np.exp(logq)) if logq is not None else np.full(tokens.shape, theme.LOG10_PMIN)).T   # [k, L]
    cells = [[theme.label(texts.get(int(tokens[d, r]), f"#{int(tokens[d, r])}"), 8) +
              (f"<br>{math.exp(logq[d, r]):.2f}" if logq is not None else "") for d in range(n_pos)]
             for r in range(tokens.shape[1])]
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(1, n_pos + 1)), y=list(range(1, tokens.shape[1] + 1)), text=cells,
        texttemplate="%{text}", textfont=dict(size=11), zmin=theme.LOG10_PMIN, zmax=theme.LOG10_PMAX,
        colorscale=theme.COLORSCALE, colorbar=theme.colorbar() | {"title": dict(text="log₁₀ q", side="right")},
        xgap=2, ygap=2, name="candidates",
        hovertemplate="position %{x}, rank %{y}: %{text}<extra></extra>"))
    what = "q" if logq is not None else "q (not stored in this trace)"
    fig.update_layout(**theme.layout(
        f"{TITLES['draft']}: one drafter forward, top {tokens.shape[1]} of {n_pos} positions with {what}",
        filename=f"draft-step-{record.step}", showlegend=False, height=height or 400,
        xaxis=dict(title="draft position d (tokens after the bonus)", dtick=1, showgrid=False),
        yaxis=dict(title="rank", autorange="reversed", dtick=1, showgrid=False)))
    return fig


def _piece(texts: dict[int, str], token: int) -> str:
    return f"<code>{theme.escape(theme.show_whitespace(texts.get(token, f'#{token}')))}</code>"


def caption(record, texts: dict[int, str], phase: str, frame: int, method: str = "ddtree") -> str:
    """What the phase at `frame` shows, with this step's numbers."""
    frame = max(0, min(frame, frames(record, phase) - 1))
    head = f"**{TITLES[phase]}** (step {record.step}, frame {frame + 1} of {frames(record, phase)}). "
    tree = record.tree
    if phase == "draft":
        n_pos = np.asarray(record.draft_tokens).shape[0]
        top = ""
        if record.draft_logq is not None:
            q1 = math.exp(float(np.max(record.draft_logq[0])))
            top = f" Position 1's top candidate has q = {q1:.2f}."
        return head + (f"One drafter forward, conditioned on the target's hidden states, gives a distribution q_d "
                       f"for each of the {n_pos} positions after the bonus token {_piece(texts, tree.tokens[0])}, "
                       f"all at once (a block-diffusion drafter does not draft token by token).{top}")
    if phase == "build":
        return head + _build_caption(record, texts, frame, method)
    if phase == "verify":
        return head + (f"The root and the {tree.size} drafted nodes are laid out flat in pop order and go through "
                       f"the target in **one forward**: each node sits at position past + depth and, by the "
                       f"ancestor-only mask, sees the cache and its own root-to-node path only, so one forward scores "
                       f"every branch at once.")
    return head + _walk_caption(record, texts, frame)


def ngram_terms(tree) -> list[float]:
    """[N] each node's λ·log p_ngram: its score's step from its parent's, less its log q (0 for DDTree's nodes)."""
    return [0.0] + [tree.score[i] - tree.score[tree.parents[i]] - tree.logq[i] for i in range(1, len(tree.tokens))]


def _build_caption(record, texts, frame: int, method: str) -> str:
    tree = record.tree
    shown = min(tree.size, (frame + 1) * _chunk(record))
    lam = ngram_terms(tree)
    presto = method.startswith("presto") or any(abs(v) > NGRAM_TOL for v in lam)
    how = ("PRESTO's best-first search pops the path with the highest prefix-aligned score S(u) = Σ log q + "
           "λ·log p_ngram (the n-gram model given the path so far)" if presto else
           "the builder pops the prefix with the highest q(u) = Π q off a heap (DDTree's best-first search)")
    rows = range(max(1, shown - RECENT + 1), shown + 1)
    if presto:
        table = "| node | token | depth | log q | λ·log p_ngram | S(u) |\n|---|---|---|---|---|---|\n" + "\n".join(
            f"| {i} | {_piece(texts, tree.tokens[i])} | {tree.depths[i]} | {tree.logq[i]:.2f} | {lam[i]:.2f} | "
            f"{tree.score[i]:.2f} |" for i in rows)
    else:
        table = "| node | token | depth | log q | q(u) |\n|---|---|---|---|---|\n" + "\n".join(
            f"| {i} | {_piece(texts, tree.tokens[i])} | {tree.depths[i]} | {tree.logq[i]:.2f} | "
            f"{math.exp(tree.prefix_logq[i]):.3f} |" for i in rows)
    return (f"Budget counter: **{shown} of {tree.size}** nodes (budget {record.budget_used or tree.size}); {how}, "
            f"then pushes its children. The nodes added last:\n\n{table}")


def _walk_caption(record, texts, frame: int) -> str:
    path, tree = record.accepted, record.tree
    if record.step == 0:
        return f"The prefill: the target read the prompt and chose the first token itself, {_piece(texts, record.bonus)}."
    if frame >= len(path):
        kept = len(path)
        return (f"**τ = {record.tau}**: {record.accepted_drafts} accepted draft"
                f"{'s' if record.accepted_drafts != 1 else ''} plus the bonus {_piece(texts, record.bonus)}, the "
                f"target's own token. KV compaction: verification appended {tree.size + 1} rows to the cache; it "
                f"keeps the {kept} on the accepted path (root first) and drops the other {tree.size + 1 - kept}. The "
                "bonus token is the next step's root.")
    node = path[frame]
    where = "the root" if frame == 0 else f"node {node} {_piece(texts, tree.tokens[node])}"
    p = record.p_committed[frame] if frame < len(record.p_committed) else None
    chance = f" (p = {p:.2f})" if p is not None else ""
    if frame + 1 < len(path):
        nxt = path[frame + 1]
        return (f"At {where} the target's token{chance} is {_piece(texts, tree.tokens[nxt])}: a child of this node, "
                "so the draft is **accepted** and the walk goes on. (At temperature 0 the token is the target's "
                "argmax; above it, a sample that keeps the target's distribution.)")
    leaf = not any(tree.parents[i] == node for i in range(1, len(tree.tokens)))
    why = "this node has no children" if leaf else "no child of this node carries it"
    return (f"At {where} the target's token{chance} is {_piece(texts, record.bonus)}: {why}, so the walk stops "
            "here; that token becomes the bonus.")
