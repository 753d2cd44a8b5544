"""One palette and figure style for every view (tree, charts, token text).

Figures are drawn on a transparent background with mid-tone grid and edge colours, so they sit on Gradio's light and
dark themes alike; the text colour cannot be known server-side, so `DARK_CSS` recolours the figures' text under
Gradio's `.dark` class.
"""
from __future__ import annotations

import math

from plotly.colors import sample_colorscale

ACCEPTED = "#16a34a"    # drafted token the target accepted
BONUS = "#2563eb"       # token chosen by the target itself (bonus / correction)
RETRIEVED = "#c026d3"   # ring around a node found by retrieval (hybrid trees): copied from the prompt or the reply
REJECTED = "#9ca3af"    # drafted token off the accepted path
ORACLE = "#f59e0b"
DRAFT = "#8b5cf6"
TEXT = "#334155"        # light-theme text; DARK_CSS recolours exactly this fill
MUTED = "#8391a7"       # secondary text, readable on white and on dark
EDGE = "rgba(128, 128, 128, 0.55)"
GRID = "rgba(128, 128, 128, 0.22)"
LINE = "rgba(128, 128, 128, 0.6)"
TRANSPARENT = "rgba(0,0,0,0)"
# log10 prefix probability: light yellow (improbable) -> orange -> dark red (certain); no green, no blue, so the
# accepted path and the bonus token stand out against every node
COLORSCALE = [[0.0, "#fff3b0"], [0.25, "#fec44f"], [0.5, "#fd8d3c"], [0.75, "#e31a1c"], [1.0, "#800026"]]
LOG10_PMIN, LOG10_PMAX = -6.0, 0.0   # fixed colour range of log10 prefix probability for a whole run
FONT = dict(family="Inter, system-ui, sans-serif", size=13, color=TEXT)
TICKS = [2 ** k for k in range(16)]   # readable log-axis ticks: 1, 2, 4, 8, ...

_AXIS = dict(automargin=True, gridcolor=GRID, zerolinecolor=GRID, linecolor=LINE, title=dict(standoff=10))
# a few bytes of template instead of Plotly's default one: it reaches every axis, secondary and subplot ones too
TEMPLATE = dict(layout=dict(xaxis=_AXIS, yaxis=_AXIS))
# presenter mode (a projector at the back of a room): every figure's text at least 16 px, in full-contrast ink
PRESENTER_PX = 18       # tick labels, axis titles, colour bar
PRESENTER_SMALL_PX = 16  # legend, subtitle, annotations: the smallest text a presenter's figure has
INK = {"light": "#0f172a", "dark": "#f8fafc"}
LEGEND = dict(orientation="h", x=0, xanchor="left", y=0, yanchor="bottom", yref="container",
              bgcolor=TRANSPARENT, font=dict(size=12))


def layout(title: str, subtitle: str | None = None, filename: str = "figure", **kw) -> dict:
    """Shared layout: a title on every figure, transparent backgrounds, margins that grow to fit tick labels and
    axis titles, the legend under the plot, the user's zoom kept across streamed updates; `filename` (no suffix)
    names the figure's PNG and SVG downloads (`layout.meta`, read by the app's download buttons, which stand in for
    the modebar's camera)."""
    text = dict(text=title, subtitle=dict(text=subtitle, font=dict(size=12, color=MUTED))) if subtitle else \
        dict(text=title)
    base = dict(template=TEMPLATE, font=FONT, title=dict(x=0.01, xanchor="left", font=dict(size=15), **text),
                meta=dict(filename=filename),
                margin=dict(l=50, r=30, t=60 if subtitle else 45, b=50), uirevision="keep",
                paper_bgcolor=TRANSPARENT, plot_bgcolor=TRANSPARENT, showlegend=True, legend=LEGEND,
                modebar=dict(bgcolor=TRANSPARENT, color=MUTED, activecolor=BONUS, remove=["toImage"]))
    base.update(kw)
    return base


def presenter_template(mode: str) -> dict:
    """Presenter mode's Plotly template for the page's theme (`mode` "light" or "dark"): large type in full-contrast
    ink, a stronger grid and axis lines."""
    ink, grid = INK[mode], "rgba(128, 128, 128, 0.45)"
    font = dict(family=FONT["family"], size=PRESENTER_PX, color=ink)
    axis = dict(_AXIS, gridcolor=grid, zerolinecolor=grid, linecolor=ink, tickfont=font,
                title=dict(standoff=12, font=font))
    return dict(layout=dict(font=font, xaxis=axis, yaxis=axis, coloraxis=dict(colorbar=dict(tickfont=font)),
                            legend=dict(font=dict(size=PRESENTER_SMALL_PX, color=ink)),
                            hoverlabel=dict(font=dict(size=PRESENTER_SMALL_PX))))


def present(fig, mode: str | None):
    """The figure restyled for presenter mode on a "light" or "dark" page (None: left as it is): the presenter
    template, and every font the figure sets itself raised to at least PRESENTER_SMALL_PX, in the ink colour where
    it had the default text colour."""
    if mode not in INK:
        return fig
    ink, template = INK[mode], presenter_template(mode)
    subtitle = dict(font=dict(size=PRESENTER_SMALL_PX, color=ink)) if fig.layout.title.subtitle.text else {}
    fig.update_layout(template=template, font=template["layout"]["font"], legend=template["layout"]["legend"],
                      title=dict(font=dict(size=24, color=ink), subtitle=subtitle),
                      margin=dict(t=max(fig.layout.margin.t or 0, 100 if subtitle else 64)))
    for note in fig.layout.annotations:
        note.font.size = max(note.font.size or 0, PRESENTER_SMALL_PX)
        if note.font.color in (None, TEXT, MUTED):
            note.font.color = ink
    return fig


def log10_prefix(prefix_logq) -> list[float]:
    """log10 q(prefix) of each node, floored at the bottom of the run's fixed colour range."""
    return [max(LOG10_PMIN, s / math.log(10)) for s in prefix_logq]


def prefix_colours(prefix_logq) -> list[str]:
    """The colour scale's colour for each node's log10 q(prefix), for traces that take colours, not values."""
    span = LOG10_PMAX - LOG10_PMIN
    return sample_colorscale(COLORSCALE, [(v - LOG10_PMIN) / span for v in log10_prefix(prefix_logq)])


def colorbar() -> dict:
    return dict(title=dict(text="log₁₀ q(prefix)", side="right"), thickness=12, outlinewidth=0)


def _rgb(hex_colour: str) -> str:
    """A colour as the browser writes it in a style attribute: `rgb(r, g, b)`."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


# Under Gradio's `.dark` (on <body>): Plotly text drawn in TEXT turns light (titles, ticks, axis titles, legend,
# colour bar, annotations) and the accepted path's and bonus token's labels get lighter greens and blues; hover
# labels, which Plotly colours against their own background, keep theirs; the modebar icons and the token highlights
# get stronger.
_TEXT_IN = '.dark .js-plotly-plot .main-svg text[style*="fill: {}"]:not(.hoverlayer text)'
DARK_CSS = f"""
{_TEXT_IN.format(_rgb(TEXT))} {{ fill: #e5e7eb !important; }}
{_TEXT_IN.format(_rgb(ACCEPTED))} {{ fill: #4ade80 !important; }}
{_TEXT_IN.format(_rgb(BONUS))} {{ fill: #60a5fa !important; }}
.dark .js-plotly-plot .modebar-btn path {{ fill: #9ca3af !important; }}
.dark .js-plotly-plot .modebar-btn.active path {{ fill: #e5e7eb !important; }}
.dark .js-plotly-plot .modebar-btn:hover path {{ fill: #e5e7eb !important; }}
.dark .tok.acc {{ background: {ACCEPTED}66; border-bottom-color: #4ade80; }}
.dark .tok.bonus {{ background: {BONUS}77; border-bottom-color: #60a5fa; }}
.dark .tok.first {{ box-shadow: -2px 0 0 #94a3b8; }}
.dark .tokens {{ color: #f3f4f6; }}
.dark .tokens-legend {{ color: #cbd5e1; }}
.dark .stepmark {{ color: #cbd5e1; }}
"""


def show_whitespace(text: str) -> str:
    """Token text with whitespace made visible (space ␣, newline ⏎, tab ⇥)."""
    return text.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥") or "∅"


def escape(text: str) -> str:
    """Token text is data, never markup: escape it for HTML and Plotly labels."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def label(text: str, limit: int | None = None) -> str:
    """Token text for a figure: whitespace visible, escaped, and cut to `limit` characters (before escaping, so
    an entity is never cut)."""
    shown = show_whitespace(text)
    if limit is not None and len(shown) > limit:
        shown = shown[:limit - 1] + "…"
    return escape(shown)
