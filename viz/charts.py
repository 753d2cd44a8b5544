"""Run-level charts from StepRecords: acceptance against node budget, per-step acceptance, histogram, per-depth
rates, time split, calibration, and the step views (icicle, attention mask). Pure functions of records."""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from core.tree import ancestor_mask
from viz import theme

PHASES = {"draft": ("draft: drafter forward", theme.DRAFT), "tree": ("tree: build the draft tree", theme.ORACLE),
          "verify": ("verify: target forward", theme.BONUS), "accept": ("accept: walk the tree", theme.ACCEPTED),
          "compact": ("compact: keep the accepted path's KV", theme.MUTED)}
MASKED = "rgba(128, 128, 128, 0.12)"   # a masked cell: mid-tone, so the matrix reads on light and dark


def _decode(records):
    return [r for r in records if r.step > 0]


COUNTERFACTUAL = "counterfactual: this run's trees cut to b nodes"
EXACT = "exact: a run at budget b, replayed on this reply"
EXACT_NOTE = "exact: what budget b gives on this reply · counterfactual: this run's own steps only"
EXACT_ONLY_NOTE = "exact: what budget b gives on this reply (this method's trees are not nested: no counterfactual)"
NO_EXACT_SAMPLED = "no exact curve at temperature > 0: a sampled reply differs per budget, so none can be replayed"
NO_EXACT_STOPPED = "no exact curve for a stopped run: it replays a finished reply"


def exact_progress(done: int, total: int, error: str | None = None) -> str:
    """The chart's note while the exact curve is replayed in the background (or why it failed)."""
    if error:
        return f"exact curve failed ({error})"
    return f"exact curve: replaying each budget on this reply ({done} of {total} done)…"


def budget_curves(records) -> dict:
    """Mean acceptance length per budget b (the counterfactual curve from the nested trees: this run's steps, each
    tree cut to its first b nodes), the tree's expected acceptance 1 + sum of the first b prefix probabilities,
    and the achieved point."""
    steps = [r for r in _decode(records) if r.nested]
    if not any(r.tree.size for r in steps):
        return {}
    top = max(r.tree.size for r in steps)
    budgets = np.arange(1, top + 1)
    realised = np.zeros(top)
    expected = np.zeros(top)
    for r in steps:
        idx = np.asarray(r.accepted[1:], dtype=np.int64)
        hits = np.zeros(top + 1)
        np.add.at(hits, np.minimum(idx, top), 1)
        realised += np.minimum(1 + np.cumsum(hits[1:]), r.tau)        # `StepRecord.tau_at` for every b at once
        q = np.exp(np.asarray(r.tree.prefix_logq[1:]))
        cum = np.cumsum(q)
        expected += 1 + np.concatenate([cum, np.full(top - len(cum), cum[-1] if len(cum) else 0.0)])
    return {"budgets": budgets, "tau": realised / len(steps), "expected": expected / len(steps),
            "achieved": achieved(records)}


def achieved(records) -> tuple[int, float]:
    """(the budget a run's drafting steps used, median; its τ): the run's own point on the budget chart."""
    drafting = [r.budget_used for r in _decode(records) if r.tree.size] or [1]
    return int(np.median(drafting)), float(np.mean([r.tau for r in _decode(records)]))


def budget_figure(records, cost_ms: dict[int, float] | None = None, draft_ms: float | None = None,
                  exact: dict[int, float] | None = None, exact_note: str | None = None,
                  method: str | None = None) -> go.Figure:
    """Acceptance against node budget: the counterfactual curve, the expected one, the achieved point and, when
    given, the exact τ per budget (`core.replay`, as far as it has come) or `exact_note` (why there is none yet);
    with the verification-cost curve, the estimated speed-up per budget (from the exact τ where there is one).
    `method` "ar" (plain decoding, which never drafts) says so instead of promising a curve."""
    title = "Acceptance length vs node budget"
    c = budget_curves(records)
    drafted = any(r.tree.size for r in _decode(records))
    if not c and not (exact and drafted):
        if drafted:
            return chosen_budgets(records)
        if method == "ar":
            return _empty(title, "plain decoding drafts no tree, so τ does not depend on a node budget: "
                                 "pick a tree method to see this chart", "acceptance-vs-budget")
        return _empty(title, "τ against the node budget b appears here after the first speculative step",
                      "acceptance-vs-budget")
    fig = go.Figure()
    if c:
        fig.add_scatter(x=c["budgets"], y=c["tau"], name=COUNTERFACTUAL, line=dict(color=theme.ACCEPTED))
        fig.add_scatter(x=c["budgets"], y=c["expected"], name="expected: 1 + Σ q(u) of the first b nodes",
                        line=dict(color=theme.ACCEPTED, dash="dot"))
    if exact:
        fig.add_scatter(x=list(exact), y=list(exact.values()), mode="lines+markers", name=EXACT,
                        line=dict(color=theme.DRAFT, width=3), marker=dict(size=8))
    point = achieved(records)
    fig.add_scatter(x=[point[0]], y=[point[1]], mode="markers", name="achieved (this run)",
                    marker=dict(size=13, color=theme.BONUS, symbol="diamond"))
    b, tau = (np.array(list(exact)), np.array(list(exact.values()))) if exact else (c["budgets"], c["tau"])
    if cost_ms and draft_ms is not None:
        sizes = np.array(sorted(cost_ms))
        verify = np.interp(b + 1, sizes, [cost_ms[s] for s in sizes])
        which = "exact" if exact else "counterfactual"
        fig.add_scatter(x=b, y=tau * cost_ms[sizes[0]] / (draft_ms + verify), yaxis="y2",
                        name=f"estimated speed-up ({which} τ · t_AR / (t_draft + t_verify(b)))",
                        line=dict(color=theme.ORACLE), mode="lines+markers" if exact else "lines")
        fig.update_layout(yaxis2=dict(title="est. speed-up ×", overlaying="y", side="right", showgrid=False,
                                      tickmode="auto"))
        title += " and estimated speed-up"
    top = int(c["budgets"][-1]) if c else int(max(exact))
    note = exact_note or ((EXACT_NOTE if c else EXACT_ONLY_NOTE) if exact else None)
    fig.update_layout(**theme.layout(title, note, "acceptance-vs-budget",
                                     xaxis=dict(title="node budget b", **_budget_ticks(1, top)),
                                     yaxis=dict(title="τ (tokens / target forward)")))
    return fig


def step_axis(steps) -> dict:
    """An x axis of decoding steps: whole-number ticks (left alone, a run of a few steps gets 0.5, 1.5 ...)."""
    return dict(title="step", dtick=1 if steps[-1].step - steps[0].step <= 10 else None)


def chosen_budgets(records) -> go.Figure:
    """Adaptive-budget runs: the budget chosen at each step against the acceptance it bought."""
    title = "The auto budget chosen per step"
    steps = [r for r in _decode(records) if r.draft_tokens is not None]
    if not steps:
        return _empty(title, "the node budget chosen at each step appears here after the first speculative step",
                      "budget-chosen-per-step")
    budgets = [max(1, r.budget_used) for r in steps]
    lo, hi = math.floor(math.log2(min(budgets))), math.ceil(math.log2(max(budgets)))
    lo, hi = (lo - 1, hi + 1) if lo == hi else (lo, hi)
    ticks = _budget_ticks(2 ** lo, 2 ** hi) | dict(range=[lo * math.log10(2), hi * math.log10(2)])
    fig = go.Figure()
    fig.add_bar(x=[r.step for r in steps], y=[r.tau for r in steps], name="τ of the step",
                marker_color=theme.ACCEPTED, opacity=0.45, hovertemplate="step %{x}: τ %{y}<extra></extra>")
    x, y = [], []                    # the line breaks across plain steps (a paused auto budget drafts nothing)
    for r, b in zip(steps, budgets):
        if x and r.step > x[-1] + 1:
            x.append(None)
            y.append(None)
        x.append(r.step)
        y.append(b)
    fig.add_scatter(x=x, y=y, mode="lines+markers", name="node budget chosen (gaps: plain steps)", yaxis="y2",
                    connectgaps=False, line=dict(color=theme.ORACLE),
                    hovertemplate="step %{x}: budget %{y}<extra></extra>")
    fig.update_layout(**theme.layout(title, filename="budget-chosen-per-step",
                                     xaxis=step_axis(steps),
                                     yaxis=dict(title="τ of the step", dtick=1),
                                     yaxis2=dict(title="node budget b", overlaying="y", side="right", showgrid=False,
                                                 **ticks)))
    return fig


def _budget_ticks(lo: float, hi: float) -> dict:
    """A log budget axis ticked at the powers of two from lo to hi: 1, 2, 4, 8, ... (not Plotly's "10 2 3")."""
    ticks = [t for t in theme.TICKS if lo <= t <= hi]
    return dict(type="log", tickvals=ticks, ticktext=[str(t) for t in ticks])


def tau_per_step(records) -> go.Figure:
    """τ of every step, with the oracle bound where the run recorded it."""
    title = "Acceptance length τ per step"
    steps = _decode(records)
    if not steps:
        return _empty(title, "τ of each step appears here after the first speculative step", "tau-per-step")
    fig = go.Figure(go.Bar(x=[r.step for r in steps], y=[r.tau for r in steps], marker_color=theme.ACCEPTED,
                           name="τ of the step", hovertemplate="step %{x}: τ %{y}<extra></extra>"))
    if steps[0].oracle_depth is not None:
        # a hybrid's retrieved nodes can reach past the drafter's top-K: there it bounds the drafter's part only
        hybrid = any(r.tree.origin is not None for r in steps)
        name, hover = (("drafter's oracle: 1 + deepest depth the target's continuation stays in the drafter's "
                        "top-K (retrieval can go past it)", "drafter's oracle %{y}") if hybrid else
                       ("oracle bound on τ: 1 + deepest depth the target's continuation stays in the drafter's "
                        "top-K", "oracle bound τ ≤ %{y}"))
        fig.add_scatter(x=[r.step for r in steps], y=[1 + (r.oracle_depth or 0) for r in steps], mode="markers",
                        marker=dict(color=theme.ORACLE, symbol="line-ew-open", size=14, line=dict(width=3)),
                        name=name, hovertemplate=f"step %{{x}}: {hover}<extra></extra>")
    fig.update_layout(**theme.layout(title, filename="tau-per-step", xaxis=step_axis(steps),
                                     yaxis=dict(title="τ (tokens / target forward)")))
    return fig


def histogram(records) -> go.Figure:
    title = "Acceptance histogram: how often each τ occurred"
    taus = [r.tau for r in _decode(records)]
    if not taus:
        return _empty(title, "the share of steps per τ appears here after the first speculative step",
                      "acceptance-histogram")
    values, counts = np.unique(taus, return_counts=True)
    fig = go.Figure(go.Bar(x=list(values), y=[100 * c / len(taus) for c in counts], marker_color=theme.ACCEPTED,
                           name="steps with this τ (%)",
                           hovertemplate="τ = %{x}: %{y:.1f}% of steps<extra></extra>"))
    fig.update_layout(**theme.layout(title, filename="acceptance-histogram", xaxis=dict(title="τ of a step", dtick=1),
                                     yaxis=dict(title="% of steps")))
    return fig


def depth_rates(records) -> go.Figure:
    title = "Per-depth acceptance rate"
    steps = _decode(records)
    depth = max((r.tree.max_depth for r in steps), default=0)
    if not depth:
        return _empty(title, "the share of steps accepting each depth appears here after the first speculative step",
                      "per-depth-acceptance")
    rates = [100 * sum(r.accepted_drafts >= d for r in steps) / len(steps) for d in range(1, depth + 1)]
    fig = go.Figure(go.Bar(x=list(range(1, depth + 1)), y=rates, marker_color=theme.ACCEPTED,
                           name="steps accepting a draft at depth ≥ d (%)",
                           hovertemplate="depth %{x}: %{y:.1f}% of steps<extra></extra>"))
    fig.update_layout(**theme.layout(title, filename="per-depth-acceptance", xaxis=dict(title="depth d", dtick=1),
                                     yaxis=dict(title="% of steps accepting depth ≥ d", range=[0, 100])))
    return fig


def time_breakdown(records) -> go.Figure:
    title = "Time per step, by phase"
    steps = _decode(records)
    if not steps:
        return _empty(title, "the time of each step's phases appears here after the first speculative step",
                      "time-per-phase")
    fig = go.Figure([go.Bar(x=[r.step for r in steps], y=[1000 * r.seconds.get(p, 0.0) for r in steps], name=name,
                            marker_color=color, hovertemplate=f"step %{{x}}: {p} %{{y:.1f}} ms<extra></extra>")
                     for p, (name, color) in PHASES.items()])
    fig.update_layout(**theme.layout(title, filename="time-per-phase", barmode="stack", xaxis=step_axis(steps),
                                     yaxis=dict(title="time (ms)")))
    return fig


def calibration(records) -> go.Figure:
    title = "Calibration: expected vs accepted drafts per step"
    steps = [r for r in _decode(records) if r.tree.size > 0]
    if not steps:
        return _empty(title, "expected against accepted drafts appears here after the first step with a draft tree",
                      "calibration")
    exp = [r.expected_accepted for r in steps]
    real = [r.accepted_drafts for r in steps]
    top = max(exp + real + [1])
    fig = go.Figure([go.Scatter(x=[0, top], y=[0, top], mode="lines", line=dict(color=theme.EDGE, dash="dash"),
                                name="perfect calibration (accepted = expected)", hoverinfo="skip"),
                     go.Scatter(x=exp, y=real, mode="markers", marker=dict(color=theme.BONUS, opacity=0.75, size=9),
                                name="a step", text=[f"step {r.step}" for r in steps],
                                hovertemplate="%{text}: expected %{x:.2f}, accepted %{y}<extra></extra>")])
    fig.update_layout(**theme.layout(title, filename="calibration",
                                     xaxis=dict(title="expected accepted drafts Σ q(u)"),
                                     yaxis=dict(title="accepted drafts")))
    return fig


def icicle(record, texts: dict[int, str], max_nodes: int = 600) -> go.Figure:
    """The tree's prefix probabilities: each child's width is its share of its parent's mass; gaps are the mass
    the tree did not draft."""
    tree = record.tree
    n = min(len(tree.tokens), max_nodes)
    path = set(record.accepted)
    colours = theme.prefix_colours(tree.prefix_logq[:n])
    fig = go.Figure(go.Icicle(
        ids=[str(i) for i in range(n)], parents=[""] + [str(tree.parents[i]) for i in range(1, n)],
        labels=[theme.label(texts.get(t, str(t))) for t in tree.tokens[:n]],
        values=icicle_widths(tree.parents[:n], tree.prefix_logq[:n]), branchvalues="total", name="draft tree",
        customdata=[math.exp(v) for v in tree.prefix_logq[:n]],
        marker=dict(colors=[theme.ACCEPTED if i in path else colours[i] for i in range(n)],
                    line=dict(color=theme.EDGE, width=0.5)),
        tiling=dict(orientation="h"), leaf=dict(opacity=1),
        hovertemplate="%{label}<br>q(prefix) %{customdata:.2e}<extra></extra>"))
    # legend and colour bar only: the icicle trace itself has neither
    fig.add_scatter(x=[None], y=[None], mode="markers", name="drafted node (colour: log₁₀ q(prefix))",
                    marker=dict(symbol="square", size=12, color=[theme.LOG10_PMAX / 2 + theme.LOG10_PMIN / 2],
                                cmin=theme.LOG10_PMIN, cmax=theme.LOG10_PMAX, colorscale=theme.COLORSCALE,
                                showscale=True, colorbar=theme.colorbar()))
    fig.add_scatter(x=[None], y=[None], mode="markers", name="accepted path",
                    marker=dict(symbol="square", size=12, color=theme.ACCEPTED))
    fig.update_layout(**theme.layout("Prefix probabilities of the draft tree (icicle)",
                                     "width = share of the parent's probability; gaps = mass the tree did not draft",
                                     f"icicle-step-{record.step}",
                                     margin=dict(l=5, r=5, t=60, b=40),
                                     xaxis=dict(visible=False), yaxis=dict(visible=False)))
    return fig


def icicle_widths(parents: list[int], prefix_logq: list[float]) -> list[float]:
    """Each node's width: its prefix probability, except where a parent's children hold more than the parent
    (a hybrid's retrieved child beside the drafter's: two proposers' estimates need not sum to one), whose
    children then share the parent's width in proportion. DDTree's trees are drawn exactly."""
    p = [math.exp(v) for v in prefix_logq]
    held = [0.0] * len(p)
    for i in range(1, len(p)):
        held[parents[i]] += p[i]
    width = p[:1] + [0.0] * (len(p) - 1)
    for i in range(1, len(p)):             # parents come before their children
        width[i] = width[parents[i]] * p[i] / max(p[parents[i]], held[parents[i]])
    return width


def mask_heatmap(record, texts: dict[int, str], limit: int = 64) -> go.Figure:
    """The verified tree's mask, root and drafted nodes flattened in pop order; for trees of at most `limit` drafted
    nodes (a budget-64 tree fits)."""
    title = "Ancestor-only attention mask (row attends to column)"
    tree = record.tree
    if tree.size > limit:
        return _empty(title, f"the mask is shown for trees of at most {limit} drafted nodes (this one has "
                             f"{tree.size})", f"mask-step-{record.step}")
    labels = [f"{i}:{theme.label(texts.get(t, str(t)), 16)}" for i, t in enumerate(tree.tokens)]
    fig = go.Figure(go.Heatmap(z=ancestor_mask(tree).astype(int), x=labels, y=labels, showscale=False,
                               colorscale=[[0, MASKED], [1, theme.BONUS]], xgap=1, ygap=1, name="mask",
                               hovertemplate="%{y} sees %{x}: %{z}<extra></extra>"))
    for name, colour in (("row attends to column (an ancestor or itself)", theme.BONUS), ("masked", MASKED)):
        fig.add_scatter(x=[None], y=[None], mode="markers", name=name,
                        marker=dict(symbol="square", size=12, color=colour, line=dict(color=theme.LINE, width=1)))
    fig.update_layout(**theme.layout(title, filename=f"mask-step-{record.step}",
                                     xaxis=dict(tickangle=-90, showgrid=False),
                                     yaxis=dict(autorange="reversed", showgrid=False),
                                     height=max(380, 14 * len(labels) + 180)))
    return fig



def compare_bars(rows: list[dict]) -> go.Figure:
    """τ, tokens/s and speed-up per method, side by side; rows are dicts with "method", "tau", "tokens/s" and
    "speedup" (other keys are ignored)."""
    from plotly.subplots import make_subplots

    title = "Compare methods (same prompt and settings)"
    if not rows:
        return _empty(title, "τ, tokens/s and speed-up of each method appear here once the comparison runs",
                      "compare-methods")
    names = [str(r.get("method", "?")) for r in rows]
    metrics = (("tau", "τ (tokens / target forward)", theme.ACCEPTED), ("tokens/s", "tokens/s", theme.DRAFT),
               ("speedup", "speed-up × (vs plain decoding)", theme.BONUS))
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[m[1] for m in metrics])
    for col, (key, name, colour) in enumerate(metrics, start=1):
        fig.add_bar(y=names, x=[r.get(key) for r in rows], orientation="h", marker_color=colour, name=name,
                    texttemplate="%{x}", textposition="auto", row=1, col=col,
                    hovertemplate="%{y}: %{x}<extra>" + name + "</extra>")
    fig.update_annotations(font_size=13)          # the subplot titles, under the figure's own
    fig.update_layout(**theme.layout(title, filename="compare-methods", height=380, margin=dict(l=50, r=30, t=80, b=50),
                                     yaxis=dict(autorange="reversed")))
    return fig


def _empty(title: str, message: str, filename: str) -> go.Figure:
    """A placeholder with the chart's title and what will appear there."""
    fig = go.Figure()
    fig.update_layout(**theme.layout(title, filename=filename, showlegend=False, xaxis=dict(visible=False),
                                     yaxis=dict(visible=False),
                                     annotations=[dict(text=message, showarrow=False,
                                                       font=dict(color=theme.MUTED))]))
    return fig
