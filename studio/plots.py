"""Figures for slides: every plot on the page downloads as PNG or SVG, named after what it shows (`tree-step-5.svg`,
`acceptance-vs-budget.png`: `viz` names each figure in its `layout.meta`). The browser draws both files with
Plotly's own exporter (`Plotly.downloadImage`), so nothing is exported on the server and nothing needs Chrome or
kaleido there. Downloads get a white background, since the page's figures are transparent for its dark theme.
"""
from __future__ import annotations

import gradio as gr

FIGURE_CLASS = "downloadable-figure"   # every plot block with the buttons (viz.page: on a phone, below them)
PNG_SCALE = 2             # PNG pixels per screen pixel: sharp on a projected slide
# runs in the browser: the plot inside #{elem_id}, exported as drawn (the visitor's zoom included) on white
DOWNLOAD_JS = """() => {{
  const gd = document.querySelector("#{elem_id} .js-plotly-plot");
  if (!gd || !window.Plotly) return;
  const layout = Object.assign({{}}, gd.layout, {{paper_bgcolor: "white", plot_bgcolor: "white"}});
  window.Plotly.downloadImage({{data: gd.data, layout: layout}}, {{
    format: "{fmt}", filename: (gd.layout.meta || {{}}).filename || "figure", scale: {scale},
    width: gd._fullLayout.width, height: gd._fullLayout.height}});
}}"""


def plot(elem_id: str, **kwargs) -> gr.Plot:
    """A gr.Plot with PNG and SVG download buttons in its corner; call inside the Blocks (the buttons' clicks run in
    the browser only, outside the model queue)."""
    png, svg = gr.Button("PNG", size="sm"), gr.Button("SVG", size="sm")
    fig = gr.Plot(show_label=False, elem_id=elem_id, elem_classes=[FIGURE_CLASS], buttons=[png, svg], **kwargs)
    png.click(None, js=DOWNLOAD_JS.format(elem_id=elem_id, fmt="png", scale=PNG_SCALE), queue=False)
    svg.click(None, js=DOWNLOAD_JS.format(elem_id=elem_id, fmt="svg", scale=1), queue=False)
    return fig
