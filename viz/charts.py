"""Run-level charts from StepRecords: acceptance against node budget, per-step acceptance, histogram, per-depth
rates, time split, calibration, and the step views (icicle, attention mask). Pure functions of records."""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from core.tree import ancestor_mask
from viz import theme


def _decode(records):
    return [r for r in records if r.step > 0]


def budget_curves(records) -> dict:
    """Mean acceptance length per budget b (the counterfactual curve from the nested trees), the tree's
    expected acceptance 1 + sum of the first b prefix probabilities, and the achieved point."""
    steps = [r for r in _decode(records) if r.nested and r.tree.size > 0]
    if not steps:
        return {}
    top = max(r.tree.size for r in steps)
    budgets = np.arange(1, top + 1)
    realised = np.zeros(top)
    expected = np.zeros(top)
    for r in steps:
        idx = np.asarray(r.accepted[1:], dtype=np.int64)
        hits = np.zeros(top + 1)
        np.add.at(hits, np.minimum(idx, top), 1)
        realised += 1 + np.cumsum(hits[1:])
        q = np.exp(np.asarray(r.tree.prefix_logq[1:]))
        cum = np.cumsum(q)
        expected += 1 + np.concatenate([cum, np.full(top - len(cum), cum[-1] if len(cum) else 0.0)])
    achieved = float(np.mean([r.tau for r in _decode(records)]))
    return {"budgets": budgets, "tau": realised / len(steps), "expected": expected / len(steps),
            "achieved": (int(np.median([r.budget_used for r in steps])), achieved)}


def budget_figure(records, cost_ms: dict[int, float] | None = None, draft_ms: float | None = None) -> go.Figure:
    """Acceptance against node budget; with the verification-cost curve, the estimated speed-up per budget."""
    c = budget_curves(records)
    fig = go.Figure()
    if not c:
        if any(r.tree.size for r in _decode(records)):
            return chosen_budgets(records)
        return _empty("acceptance vs budget appears after the first speculative step")
    b = c["budgets"]
    fig.add_scatter(x=b, y=c["tau"], name="τ if the budget had been b (same steps)", line=dict(color=theme.ACCEPTED))
    fig.add_scatter(x=b, y=c["expected"], name="expected: 1 + Σ q(u) of the first b nodes",
                    line=dict(color=theme.ACCEPTED, dash="dot"))
    fig.add_scatter(x=[c["achieved"][0]], y=[c["achieved"][1]], mode="markers", name="achieved",
                    marker=dict(size=13, color=theme.BONUS, symbol="diamond"))
    if cost_ms and draft_ms is not None:
        sizes = np.array(sorted(cost_ms))
        verify = np.interp(b + 1, sizes, [cost_ms[s] for s in sizes])
        speedup = c["tau"] * cost_ms[sizes[0]] / (draft_ms + verify)
        fig.add_scatter(x=b, y=speedup, name="estimated speed-up (τ · t_AR / (t_draft + t_verify(b)))",
                        yaxis="y2", line=dict(color=theme.ORACLE))
        fig.update_layout(yaxis2=dict(title="est. speed-up ×", overlaying="y", side="right", showgrid=False))
    fig.update_layout(**theme.layout(title="Acceptance length vs node budget", showlegend=True,
                                     legend=dict(orientation="h", y=-0.25),
                                     xaxis=dict(title="node budget b", type="log"), yaxis=dict(title="τ")))
    return fig


def chosen_budgets(records) -> go.Figure:
    """Adaptive-budget runs: the budget chosen at each step against the acceptance it bought."""
    steps = [r for r in _decode(records) if r.draft_tokens is not None]
    fig = go.Figure()
    fig.add_scatter(x=[r.step for r in steps], y=[r.budget_used for r in steps], mode="lines+markers",
                    name="budget chosen", line=dict(color=theme.ORACLE),
                    hovertemplate="step %{x}: budget %{y}<extra></extra>")
    fig.add_bar(x=[r.step for r in steps], y=[r.tau for r in steps], name="τ", yaxis="y2",
                marker_color=theme.ACCEPTED, opacity=0.45, hovertemplate="step %{x}: τ %{y}<extra></extra>")
    fig.update_layout(**theme.layout(title="Adaptive budget: the budget chosen per step", showlegend=True,
                                     legend=dict(orientation="h", y=-0.25), xaxis=dict(title="step"),
                                     yaxis=dict(title="node budget b"),
                                     yaxis2=dict(title="τ", overlaying="y", side="right", showgrid=False)))
    return fig


def tau_per_step(records) -> go.Figure:
    steps = _decode(records)
    fig = go.Figure(go.Bar(x=[r.step for r in steps], y=[r.tau for r in steps], marker_color=theme.ACCEPTED,
                           hovertemplate="step %{x}: τ %{y}<extra></extra>"))
    if steps and steps[0].oracle_depth is not None:
        fig.add_scatter(x=[r.step for r in steps], y=[1 + (r.oracle_depth or 0) for r in steps], mode="markers",
                        marker=dict(color=theme.ORACLE, symbol="line-ew-open", size=14), name="oracle")
    fig.update_layout(**theme.layout(title="Acceptance length per step", xaxis=dict(title="step"),
                                     yaxis=dict(title="τ (tokens / target forward)")))
    return fig


def histogram(records) -> go.Figure:
    taus = [r.tau for r in _decode(records)]
    values, counts = np.unique(taus, return_counts=True) if taus else ([], [])
    fig = go.Figure(go.Bar(x=list(values), y=[100 * c / max(1, len(taus)) for c in counts],
                           marker_color=theme.ACCEPTED, hovertemplate="τ = %{x}: %{y:.1f}% of steps<extra></extra>"))
    fig.update_layout(**theme.layout(title="Acceptance histogram", xaxis=dict(title="τ of a step", dtick=1),
                                     yaxis=dict(title="% of steps")))
    return fig


def depth_rates(records) -> go.Figure:
    steps = _decode(records)
    depth = max((r.tree.max_depth for r in steps), default=0)
    rates = [100 * sum(r.accepted_drafts >= d for r in steps) / max(1, len(steps)) for d in range(1, depth + 1)]
    fig = go.Figure(go.Bar(x=list(range(1, depth + 1)), y=rates, marker_color=theme.ACCEPTED,
                           hovertemplate="depth %{x}: %{y:.1f}% of steps<extra></extra>"))
    fig.update_layout(**theme.layout(title="Per-depth acceptance rate", xaxis=dict(title="depth", dtick=1),
                                     yaxis=dict(title="% of steps accepting depth ≥ d", range=[0, 100])))
    return fig


def time_breakdown(records) -> go.Figure:
    steps = _decode(records)
    colors = {"draft": "#8b5cf6", "tree": theme.ORACLE, "verify": theme.BONUS, "accept": theme.ACCEPTED}
    fig = go.Figure([go.Bar(x=[r.step for r in steps], y=[1000 * r.seconds.get(p, 0.0) for r in steps], name=p,
                            marker_color=c) for p, c in colors.items()])
    fig.update_layout(**theme.layout(title="Time per step", barmode="stack", showlegend=True,
                                     xaxis=dict(title="step"), yaxis=dict(title="ms")))
    return fig


def calibration(records) -> go.Figure:
    steps = [r for r in _decode(records) if r.tree.size > 0]
    exp = [r.expected_accepted for r in steps]
    real = [r.accepted_drafts for r in steps]
    top = max(exp + real + [1])
    fig = go.Figure([go.Scatter(x=[0, top], y=[0, top], mode="lines", line=dict(color=theme.EDGE, dash="dash"),
                                hoverinfo="skip"),
                     go.Scatter(x=exp, y=real, mode="markers", marker=dict(color=theme.BONUS, opacity=0.6),
                                text=[f"step {r.step}" for r in steps],
                                hovertemplate="%{text}: expected %{x:.2f}, accepted %{y}<extra></extra>")])
    fig.update_layout(**theme.layout(title="Calibration: expected vs accepted drafts per step",
                                     xaxis=dict(title="expected accepted drafts Σ q(u)"),
                                     yaxis=dict(title="accepted drafts")))
    return fig


def icicle(record, texts: dict[int, str], max_nodes: int = 600) -> go.Figure:
    """The tree's prefix probabilities: each child's width is its share of its parent's mass; gaps are the mass
    the tree did not draft."""
    tree = record.tree
    n = min(len(tree.tokens), max_nodes)
    path = set(record.accepted)
    fig = go.Figure(go.Icicle(
        ids=[str(i) for i in range(n)], parents=[""] + [str(tree.parents[i]) for i in range(1, n)],
        labels=[theme.label(texts.get(t, str(t))) for t in tree.tokens[:n]],
        values=[math.exp(s) for s in tree.prefix_logq[:n]], branchvalues="total",
        marker=dict(colors=[theme.ACCEPTED if i in path else "#e2e8f0" for i in range(n)]),
        tiling=dict(orientation="h"), hovertemplate="%{label}<br>q(prefix) %{value:.2e}<extra></extra>"))
    fig.update_layout(**theme.layout(title="Prefix probabilities (icicle)", margin=dict(l=5, r=5, t=40, b=5)))
    return fig


def mask_heatmap(record, texts: dict[int, str], limit: int = 64) -> go.Figure:
    tree = record.tree
    if len(tree.tokens) > limit:
        return _empty(f"the mask is shown for trees of at most {limit} nodes (this one has {len(tree.tokens)})")
    labels = [f"{i}:{theme.label(texts.get(t, str(t)))}" for i, t in enumerate(tree.tokens)]
    fig = go.Figure(go.Heatmap(z=ancestor_mask(tree).astype(int), x=labels, y=labels, showscale=False,
                               colorscale=[[0, "#f8fafc"], [1, theme.BONUS]],
                               hovertemplate="%{y} sees %{x}: %{z}<extra></extra>"))
    fig.update_layout(**theme.layout(title="Ancestor-only attention mask (row attends to column)",
                                     yaxis=dict(autorange="reversed"), height=max(360, 14 * len(labels) + 120)))
    return fig


def compare_bars(rows: list[dict]) -> go.Figure:
    """τ, tokens/s and speed-up per method, side by side."""
    from plotly.subplots import make_subplots

    names = [r["method"] for r in rows]
    fig = make_subplots(rows=1, cols=3, subplot_titles=("τ (tokens / target forward)", "tokens/s", "speed-up ×"))
    for col, (key, color) in enumerate((("tau", theme.ACCEPTED), ("tokens/s", "#8b5cf6"),
                                        ("speedup", theme.BONUS)), start=1):
        fig.add_bar(x=names, y=[r[key] for r in rows], marker_color=color, row=1, col=col,
                    hovertemplate="%{x}: %{y}<extra></extra>")
    fig.update_layout(**theme.layout(title="Compare methods (same prompt and settings)", height=360))
    return fig


def _empty(message: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(**theme.layout(xaxis=dict(visible=False), yaxis=dict(visible=False),
                                     annotations=[dict(text=message, showarrow=False, font=dict(color="#64748b"))]))
    return fig
