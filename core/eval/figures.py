"""Benchmark figures from rows (`core.eval.benchmark`): τ against budget, speed-up against budget, the acceptance
histogram and the time split, per dataset and temperature. Each figure is a small spec rendered twice: interactive
HTML (Plotly, loading plotly.js from its CDN) and a static PNG (matplotlib) for documents."""
from __future__ import annotations

import statistics
from pathlib import Path

import plotly.graph_objects as go

from core.eval.baselines import BASELINES
from core.records import PHASES



def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault((r["dataset"], r["temperature"]), []).append(r)
    return out


def _mean_speedup(group: list[dict], ar: dict) -> float:
    pairs = [(ar[r["prompt"]]["tpot"], r["tpot"]) for r in group if r["prompt"] in ar]
    return statistics.mean(a for a, _ in pairs) / statistics.mean(m for _, m in pairs) if pairs else 0.0


def specs(rows: list[dict]) -> dict[str, dict]:
    """Figure name -> spec {title, xlabel, ylabel, kind: line | bar | stacked, series: [(name, x, y)], xlog},
    for every dataset and temperature present."""
    out = {}
    for (d, t), rs in _groups(rows).items():
        ar = {r["prompt"]: r for r in rs if r["method"] == "ar"}
        by = {}
        for r in rs:
            by.setdefault((r["method"], r["budget"]), []).append(r)
        tag = f"{d}-T{t:g}"
        tree = sorted({m for m, b in by if b and not m.endswith("-auto")})
        flat = sorted({m for m, b in by if not b or m.endswith("-auto")}, key=lambda m: (m != "ar", m))
        budgets = sorted({b for m, b in by if b and not m.endswith("-auto")}) or sorted({b for _, b in by if b})
        for name, value, title, label in (
                ("tau", lambda g: statistics.mean(r["tau"] for r in g), "τ", "τ (tokens / target forward)"),
                ("speedup", lambda g: _mean_speedup(g, ar), "Speed-up", "speed-up vs plain decoding (×)")):
            series = [(m, [b for b in budgets if (m, b) in by], [value(by[(m, b)]) for b in budgets if (m, b) in by])
                      for m in tree]
            # methods without a budget (or choosing their own) as flat lines across the budget axis
            series += [(f"{m} ≤{b}" if b else f"{m} (no budget)", [budgets[0], budgets[-1]], [value(g)] * 2)
                       for (m, b), g in sorted(by.items()) if m in flat and budgets]
            out[f"{name}-vs-budget-{tag}"] = {"title": f"{title} against node budget — {d}, T={t:g}",
                                              "xlabel": "node budget B", "ylabel": label, "kind": "line",
                                              "series": series, "xlog": True, "flat_from": len(tree)}
        best = {m: max((b for mm, b in by if mm == m), key=lambda b: _mean_speedup(by[(m, b)], ar)) for m in tree}
        hist = []
        for m, b in [("chain", 0)] + sorted(best.items()):
            if (m, b) not in by:
                continue
            counts: dict[int, int] = {}
            for r in by[(m, b)]:
                for k, v in r["histogram"].items():
                    counts[int(k)] = counts.get(int(k), 0) + v
            total = sum(counts.values()) or 1
            xs = sorted(counts)
            hist.append((f"{m}" + (f" B={b}" if b else ""), xs, [counts[x] / total for x in xs]))
        out[f"histogram-{tag}"] = {"title": f"Acceptance length per step — {d}, T={t:g}", "xlabel": "τ of a step",
                                   "ylabel": "share of steps", "kind": "bar", "series": hist}
        engine = [(m, b) for (m, b) in sorted(by) if m not in BASELINES and m != "ar"]
        labels = [f"{m}" + (f" B={b}" if b else "") for m, b in engine]
        out[f"time-split-{tag}"] = {
            "title": f"Where a step's time goes — {d}, T={t:g}", "xlabel": "method", "ylabel": "share of decode time",
            "kind": "stacked",
            "series": [(p, labels, [statistics.mean(r["phase_shares"].get(p, 0.0) for r in by[k]) for k in engine])
                       for p in PHASES]}
    return out


def _plotly(spec: dict):
    fig = go.Figure()
    for i, (name, x, y) in enumerate(spec["series"]):
        if spec["kind"] == "line":
            flat = i >= spec.get("flat_from", len(spec["series"]))    # methods without a budget: dashed
            fig.add_scatter(x=x, y=y, name=name, mode="lines" if flat else "lines+markers",
                            line=dict(dash="dash" if flat else "solid"))
        else:
            fig.add_bar(x=x, y=y, name=name)
    fig.update_layout(title=spec["title"], xaxis_title=spec["xlabel"], yaxis_title=spec["ylabel"],
                      barmode="stack" if spec["kind"] == "stacked" else "group", template="plotly_white")
    if spec.get("xlog"):
        fig.update_xaxes(type="log")
    return fig


def _png(spec: dict, path: Path) -> None:
    # imported here: the PNG export alone needs matplotlib, whose backend must be chosen before pyplot loads
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    n = max(1, len(spec["series"]))
    bottom = None
    for i, (name, x, y) in enumerate(spec["series"]):
        if spec["kind"] == "line":
            flat = i >= spec.get("flat_from", len(spec["series"]))
            ax.plot(x, y, marker=None if flat else "o", linestyle="--" if flat else "-", label=name)
        elif spec["kind"] == "bar":
            ax.bar([v + (i - (n - 1) / 2) * 0.8 / n for v in x], y, width=0.8 / n, label=name)
        else:
            ax.bar(x, y, bottom=bottom, label=name)
            bottom = y if bottom is None else [a + b for a, b in zip(bottom, y)]
    if spec.get("xlog"):
        ax.set_xscale("log", base=2)
    ax.set_title(spec["title"], fontsize=10)
    ax.set_xlabel(spec["xlabel"])
    ax.set_ylabel(spec["ylabel"])
    ax.grid(alpha=0.3)
    if spec["series"]:
        ax.legend(fontsize=7)
    plt.setp(ax.get_xticklabels(), rotation=20 if spec["kind"] == "stacked" else 0, fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_figures(rows: list[dict], folder: Path) -> list[Path]:
    """Write <name>.html and <name>.png for every spec; returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, spec in specs(rows).items():
        html, png = folder / f"{name}.html", folder / f"{name}.png"
        _plotly(spec).write_html(html, include_plotlyjs="cdn")
        _png(spec, png)
        paths += [html, png]
    return paths
