"""What the page shows for a run's records: every output by name (OUTPUTS, the order the app wires them in), the
step views a replayed step refreshes (STEP_VIEWS), and the Gradio values for them. Outputs a handler leaves out
are skipped, so no handler counts the page's components.
"""
from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import gradio as gr

from studio.state import COSTS, EXACT
from viz import charts, graph, page, text as words, theme
from viz.phases import shown_ids
from viz.tokens import token_html
from viz.tree_graph import tree_figure

TREE_HEIGHT = 360            # px: fixed, so the page never jumps as trees grow and shrink
STEP_VIEWS = ("tree", "icicle", "mask", "explain", "explain_tree", "caption", "tree_facts", "graphml", "graph_json",
              "phase")
REPLAY_VIEWS = STEP_VIEWS + ("slider",)   # what moving the step slider refreshes: those, and the slider's label
OUTPUTS = ("text", "tree", "slider", "metrics", "budget_fig", "tau_fig", "hist_fig", "depth_fig", "time_fig",
           "calib_fig", "icicle", "mask", "explain", "explain_tree", "caption", "tree_facts", "graphml", "graph_json",
           "phase", "exact_timer", "anim_timer", "play", "trace_file")
WHOLE_STEP, PLAY = "Whole step", "▶ Play"     # the phase picker's first choice; the Play button at rest
FIGURES = ("tree", "budget_fig", "tau_fig", "hist_fig", "depth_fig", "time_fig", "calib_fig", "icicle", "mask",
           "explain_tree")
# presenter mode's tree: taller and narrower (it stands beside the text: 540 px on a 1280 px page), 17 px labels, room
# below for a legend in 16 px type
PRESENTER_TREE = dict(height=560, label_px=19, bottom_px=210, width_px=540)
DOWNLOADS = Path(tempfile.mkdtemp(prefix="draft-tree-studio-"))   # this process's tree downloads


def values(views: dict, names: tuple[str, ...] = OUTPUTS) -> list:
    """The views in the order of `names`; a name without a view keeps what the page shows."""
    return [views.get(name, gr.skip()) for name in names]


def presented(views: dict, state) -> dict:
    """The views with their figures in presenter mode's style when the session has it on (`state["presenter"]`:
    the page's theme, "light" or "dark"; None: off)."""
    mode = (state or {}).get("presenter")
    return views | {name: theme.present(views[name], mode) for name in FIGURES if name in views}


def token_texts(pair, records, texts: dict[int, str]) -> dict[int, str]:
    """`texts` with every token the records mention decoded (each token once per session); a replayed trace (no
    `pair`) brings its own."""
    if pair is None:
        return texts
    ids = set().union(*(shown_ids(r) for r in records)) - texts.keys()
    texts.update({t: pair.tokenizer.decode([t]) for t in ids})
    return texts


def block_size(pair, state=None):
    """The drafter's block size (a replayed trace's, from the state, when there is no pair)."""
    if pair is None:
        return (state or {}).get("block_size")
    return pair.drafter.block_size if pair.drafter is not None else None


def draft_ms(records):
    steps = [r for r in records if r.step > 0 and "draft" in r.seconds]
    return 1000 * sum(r.seconds["draft"] for r in steps) / len(steps) if steps else None


def render(pair, records, state, ar_tps, full: bool, status: str = "done", shown: int | None = None,
           highlight: int | None = None) -> dict:
    """Views of the records: while running (or stepping, Step's presses), the latest step (full=False leaves out the
    slow run-level charts); when done, a representative step with the slider on it (or step index `shown`, token
    `highlight` outlined)."""
    texts = token_texts(pair, records, state["texts"])
    live = status in ("running", "stepping")   # Run's or Step's latest step: no representative one, no exact curve
    state.pop("anim", None)             # the step's animation stops (its timer below): a tick in flight is superseded
    if shown is not None:
        rule = "where it first differs from plain decoding"
    elif live:
        shown, rule = len(records) - 1, ""
    else:
        shown, rule = words.representative_step(records)
    views = step_views(pair, records, shown, texts, state, rule, full)
    views |= {"text": token_html(records, texts, highlight), "slider": slider(records, shown),
              "metrics": page.metrics_md(records, ar_tps, status, state.get("difference", "")),
              "budget_fig": budget_figure(pair, records, state), "anim_timer": gr.Timer(active=False), "play": PLAY}
    if not live:                      # the timer that draws the exact curve as it comes runs while it is replayed
        job = EXACT.jobs.get(state.get("exact"))
        views["exact_timer"] = gr.Timer(active=job is not None and not job.done)
    if full:
        views |= {"tau_fig": charts.tau_per_step(records), "hist_fig": charts.histogram(records),
                  "depth_fig": charts.depth_rates(records), "time_fig": charts.time_breakdown(records),
                  "calib_fig": charts.calibration(records)}
    return presented(views, state)


def slider(records, k: int) -> gr.Slider:
    """The step slider on stored step k."""
    return gr.Slider(minimum=0, maximum=max(1, len(records) - 1), value=k, step=1, interactive=True,
                     label=slider_label(records, k))


def slider_label(records, k: int) -> str:
    return f"Step (replay any stored step; showing {k} of {len(records) - 1})"


def budget_figure(pair, records, state):
    """The acceptance-against-budget chart, with the exact curve as far as it has come (`studio.exact`) or why
    there is none: `state["exact"]` holds the curve's job id, or the note to show instead."""
    ref, exact, note = state.get("exact"), None, None
    if isinstance(ref, str):
        note = ref
    elif (job := EXACT.jobs.get(ref)) is not None:
        exact = dict(job.points)                       # a copy: the worker adds points meanwhile
        note = None if job.done and not job.error else charts.exact_progress(len(exact), len(job.budgets), job.error)
    costs = COSTS.curves.get(pair.name) if pair is not None else None
    fig = charts.budget_figure(records, costs, draft_ms(records), exact, note, state.get("method"))
    return theme.present(fig, state.get("presenter"))


def step_views(pair, records, k, texts, state, rule="", full=True) -> dict:
    """Tree, icicle, mask, explanation, tree again (How it works) and the caption for stored step k (full=False:
    the tree and the caption only)."""
    r = records[k]
    if state.get("presenter"):          # in large type the title stays clear of the PNG/SVG buttons beside it
        fig = tree_figure(r, texts, title=f"step {r.step}", subtitle=f"{r.tree.size} nodes, τ = {r.tau}",
                          **PRESENTER_TREE)
    else:
        # one clause a line, so a phone's narrow tree keeps the whole rule
        subtitle = (rule[:1].upper() + rule[1:]).replace("; ", ";<br>") or None
        fig = tree_figure(r, texts, title=f"step {r.step}: {r.tree.size} nodes, τ = {r.tau}", subtitle=subtitle,
                          height=TREE_HEIGHT)
    size = block_size(pair, state)
    caption = words.step_caption(r, texts, size, state.get("prompt_tokens"), state.get("method", ""))
    if not full:
        return presented({"tree": fig, "caption": caption, "phase": WHOLE_STEP}, state)
    explanation = words.step_explanation(r, texts, state.get("method", "ddtree"), size)
    g = graph.step_graph(r, texts)
    return presented({"tree": fig, "icicle": charts.icicle(r, texts), "mask": charts.mask_heatmap(r, texts),
            "explain": page.HOW_IT_WORKS + "\n\n" + explanation, "explain_tree": fig, "caption": caption,
            "tree_facts": f"**Step {r.step}.** {graph.facts_line(g)}",
            "graphml": download(f"tree-step{r.step}", "graphml", graph.graphml(g)),
            "graph_json": download(f"tree-step{r.step}", "json", graph.node_link_json(g)), "phase": WHOLE_STEP},
            state)


def download(stem: str, suffix: str, content: str) -> str:
    """A file holding `content` for a download button (named by its content, so a step shown twice is one file)."""
    path = DOWNLOADS / f"{stem}-{hashlib.sha1(content.encode()).hexdigest()[:10]}.{suffix}"
    if not path.exists():
        path.write_text(content, encoding="utf-8")
    return str(path)
