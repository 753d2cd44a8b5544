"""The draft tree of one step as a tidy tree, depth left to right so it reads like text.

Node colour is log10 of the prefix probability q(u) on a range fixed for the whole run; the accepted path is drawn
on top, and the target's bonus token follows it as a distinct node. Labels only where they fit; WebGL above 300
nodes. Inputs are a StepRecord and a token-id -> text map; no model is touched.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go

from viz import theme

LABEL_LIMIT = 64   # nodes up to which every node is labelled (above: only the accepted path)
GL_LIMIT = 300


def tidy_layout(parents: list[int], order_key: list[float] | None = None) -> list[float]:
    """y slot per node: leaves take consecutive slots (children in `order_key` descending), parents sit at the
    mean of their children. O(N)."""
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[parents[i]].append(i)
    if order_key is not None:
        for c in children:
            c.sort(key=lambda i: -order_key[i])
    y = [0.0] * n
    next_slot = 0.0
    stack = [(0, False)]
    while stack:                      # iterative post-order: a deep chain must not hit the recursion limit
        node, done = stack.pop()
        if not children[node]:
            y[node] = next_slot
            next_slot += 1
        elif done:
            y[node] = sum(y[c] for c in children[node]) / len(children[node])
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(children[node]))
    return y


def tree_figure(record, texts: dict[int, str], title: str = "", height: int | None = None) -> go.Figure:
    tree = record.tree
    n = len(tree.tokens)
    y = tidy_layout(tree.parents, tree.score)
    x = list(tree.depths)
    on_path = set(record.accepted)
    scatter = go.Scattergl if n > GL_LIMIT else go.Scatter

    ex, ey = [], []
    for i in range(1, n):
        p = tree.parents[i]
        ex += [x[p], x[i], None]
        ey += [y[p], y[i], None]
    edges = scatter(x=ex, y=ey, mode="lines", line=dict(color=theme.EDGE, width=1), hoverinfo="skip")

    log10p = [max(theme.LOG10_PMIN, s / math.log(10)) for s in tree.prefix_logq]
    p_walk = {node: p for node, p in zip(record.accepted[1:], record.p_committed)}
    labels = [theme.label(texts.get(t, str(t))) for t in tree.tokens]
    custom = [[labels[i], tree.tokens[i], tree.depths[i], tree.ranks[i], math.exp(tree.logq[i]),
               math.exp(tree.prefix_logq[i]), tree.score[i],
               f"{p_walk[i]:.3f}" if i in p_walk else "–", "accepted" if i in on_path else "not accepted"]
              for i in range(n)]
    show_text = n <= LABEL_LIMIT
    nodes = scatter(
        x=x, y=y, mode="markers+text" if show_text else "markers",
        text=labels if show_text else None, textposition="top center", textfont=dict(size=11),
        marker=dict(size=12 if n <= 128 else 7, color=log10p, cmin=theme.LOG10_PMIN, cmax=theme.LOG10_PMAX,
                    colorscale=theme.COLORSCALE, line=dict(width=0.5, color="white"),
                    colorbar=dict(title=dict(text="log₁₀ q(prefix)"), thickness=12)),
        customdata=custom,
        hovertemplate=("<b>%{customdata[0]}</b> (id %{customdata[1]})<br>depth %{customdata[2]}, rank "
                       "%{customdata[3]}<br>q (drafter) %{customdata[4]:.3f}<br>q(prefix) %{customdata[5]:.2e}<br>"
                       "score %{customdata[6]:.3f}<br>p (target, on the walk) %{customdata[7]}<br>"
                       "%{customdata[8]}<extra></extra>"))

    path = record.accepted
    last = path[-1]
    bonus_x, bonus_y = x[last] + 1, y[last]
    px = [x[i] for i in path] + [bonus_x]
    py = [y[i] for i in path] + [bonus_y]
    accepted = scatter(x=px[:-1], y=py[:-1], mode="lines+markers+text", line=dict(color=theme.ACCEPTED, width=4),
                       marker=dict(size=15, color=theme.ACCEPTED, line=dict(width=1, color="white")),
                       text=[labels[i] for i in path], textposition="bottom center",
                       textfont=dict(color=theme.ACCEPTED, size=12), hoverinfo="skip")
    bonus_label = theme.label(texts.get(record.bonus, str(record.bonus)))
    bonus = scatter(x=px[-2:], y=py[-2:], mode="lines+markers+text",
                    line=dict(color=theme.BONUS, width=3, dash="dot"),
                    marker=dict(size=[0, 16], color=theme.BONUS, symbol="star"),
                    text=["", bonus_label], textposition="bottom center", textfont=dict(color=theme.BONUS, size=12),
                    hovertemplate=f"bonus token from the target: <b>{bonus_label}</b><extra></extra>")
    leaves = max(y) + 1 if y else 1
    fig = go.Figure([edges, nodes, accepted, bonus])
    fig.update_layout(**theme.layout(
        title=dict(text=title, x=0.01, font=dict(size=14)),
        height=height or int(min(900, max(320, 26 * leaves + 120))),
        xaxis=dict(title="depth (tokens after the bonus root)", dtick=1, zeroline=False, showgrid=True,
                   gridcolor="#f1f5f9", range=[-0.6, max(x) + 1.8]),
        yaxis=dict(visible=False, range=[leaves, -1])))
    return fig
