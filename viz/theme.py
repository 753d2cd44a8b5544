"""One palette and figure style for every view (tree, charts, token text)."""
from __future__ import annotations

ACCEPTED = "#16a34a"    # drafted token the target accepted
BONUS = "#2563eb"       # token chosen by the target itself (bonus / correction)
REJECTED = "#9ca3af"    # drafted token off the accepted path
ROOT = "#111827"
EDGE = "#cbd5e1"
ORACLE = "#f59e0b"
COLORSCALE = "Viridis"
LOG10_PMIN, LOG10_PMAX = -6.0, 0.0   # fixed colour range of log10 prefix probability for a whole run
FONT = dict(family="Inter, system-ui, sans-serif", size=13)


def layout(**kw) -> dict:
    """Shared layout: no template payload, small margins, the user's zoom kept across streamed updates."""
    base = dict(template="none", font=FONT, margin=dict(l=40, r=20, t=40, b=40), uirevision="keep",
                paper_bgcolor="white", plot_bgcolor="white", showlegend=False)
    base.update(kw)
    return base


def show_whitespace(text: str) -> str:
    """Token text with whitespace made visible (space ␣, newline ⏎, tab ⇥)."""
    return text.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥") or "∅"


def escape(text: str) -> str:
    """Token text is data, never markup: escape it for HTML and Plotly labels."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def label(text: str) -> str:
    return escape(show_whitespace(text))
