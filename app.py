"""Draft-tree studio: watch a block-diffusion drafter's draft tree get verified, step by step.

The Gradio handlers first (the visitor's settings gathered into one `Form`), then the layout, then the wiring. The
handlers live in `studio.handlers`, the session state in `studio.state`, the page's words in `viz.page`; every
figure comes from `viz/` built from the engine's StepRecords. Model work runs in one queue (one at a time).
"""
from __future__ import annotations

import gradio as gr

try:                                    # Hugging Face ZeroGPU Spaces: a GPU is attached per decorated call
    import spaces
    gpu = spaces.GPU(duration=120)
except ImportError:                     # local machines, CPU Spaces, CI
    def gpu(fn):
        return fn

from studio import animation, handlers, sharing, views
from studio.handlers import COMPARED, DEFAULT_BUDGET, DEFAULT_METHOD, METHODS, PAGE_MAX_BUDGET, Form
from studio.plots import plot
from studio.state import PAIRS, app_dtype, forget, fresh_state, get_pair, health, machine_md, start_cost_curves, \
    stop, usable_pairs
from viz.page import COMPARE_HEADERS, EXAMPLES, HOW_IT_WORKS, layout_css
from viz.theme import DARK_CSS
from viz.tokens import CSS as TOKEN_CSS

TREE_HEIGHT = views.TREE_HEIGHT
# presenter mode in the browser: the class on <html> that the page's CSS styles, and the page's theme for the figures
PRESENTER_JS = """(on, dark, pair, state) => {
  document.documentElement.classList.toggle("presenter", !!on);
  return [on, document.querySelector(".dark") !== null, pair, state];
}"""
PRESENTER_URL_JS = "() => new URLSearchParams(window.location.search).get('presenter') === '1'"
__all__ = ["COMPARED", "COMPARE_HEADERS", "PAIRS", "demo", "get_pair", "launch", "usable_pairs"]


# ----- handlers: the form's controls arrive as keyword arguments (`inputs_kwargs`), named as Form's fields ------

@gpu
def run(state, request: gr.Request = None, **form):
    """Decode the prompt, streaming one UI update per step (throttled); ends with the speed-up."""
    yield from handlers.run(Form(**form), state, request)


@gpu
def step_once(state, request: gr.Request = None, **form):
    """Advance exactly one decoding step (the first press runs the prefill)."""
    return handlers.step_once(Form(**form), state, request)


@gpu
def compare(state=None, request: gr.Request = None, **form):
    """Plain decoding and the speculative methods on the same prompt and settings, a row as each finishes."""
    yield from handlers.compare(Form(**form), state, request)


def launch(block: bool = False, **kwargs):
    """Launch the app with GET /health; returns launch()'s tuple (block=True serves until interrupted)."""
    start_cost_curves()
    css = TOKEN_CSS + DARK_CSS + layout_css(TREE_HEIGHT, views.PRESENTER_TREE["height"])
    result = demo.launch(css=css, js=animation.KEYS_JS, prevent_thread_lock=True, **kwargs)
    demo.app.add_api_route("/health", health, methods=["GET"])
    if block:
        demo.block_thread()
    return result


# ----- layout -------------------------------------------------------------------------------------------------

with gr.Blocks(title="Draft-tree studio", analytics_enabled=False) as demo:
    state = gr.State(lambda: fresh_state(None))    # one dict a session; handlers that may overlap change it in place
    with gr.Row(equal_height=True):
        with gr.Column(scale=6):
            gr.Markdown("### Draft-tree studio — lossless speculative decoding with block-diffusion draft trees",
                        elem_id="title")
        with gr.Column(scale=1, min_width=170):
            presenter = gr.Checkbox(False, label="Presenter mode", elem_id="presenter", container=False)
        dark = gr.Checkbox(False, visible=False)      # the page's theme: read in the browser as presenter mode turns on
    machine = gr.Markdown(machine_md(), elem_id="machine")
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_id="controls"):
            prompt = gr.Textbox(label="Prompt", lines=4, max_lines=8, elem_id="prompt", value=EXAMPLES[0][0])
            with gr.Row():
                run_btn = gr.Button("Run", variant="primary", elem_id="run", min_width=60)
                step_btn = gr.Button("Step", elem_id="step", min_width=60)
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop", min_width=60)
            method = gr.Dropdown(list(METHODS), value=DEFAULT_METHOD, label="Method", elem_id="method")
            budget = gr.Slider(1, PAGE_MAX_BUDGET, value=DEFAULT_BUDGET, step=1,
                               label="Node budget B (auto: the most it may use)", elem_id="budget")
            budget_note = gr.Markdown(elem_id="budget_note")
            with gr.Accordion("Sampling, length, seed, model pair", open=False, elem_id="settings"):
                with gr.Row():
                    temperature = gr.Number(0.0, label="Temperature", minimum=0, elem_id="temperature")
                    top_p = gr.Number(1.0, label="Top-p", minimum=0, maximum=1)
                    top_k = gr.Number(0, label="Top-k (0 = off)", minimum=0, precision=0)
                with gr.Row():
                    max_new = gr.Number(128, label="Max new tokens", minimum=1, maximum=2048, precision=0,
                                        elem_id="max_new")
                    seed = gr.Number(0, label="Seed", minimum=0, precision=0)
                pair_name = gr.Dropdown(usable_pairs(), value=usable_pairs()[0],
                                        label="Model pair (target + drafter)")
            gr.Examples(EXAMPLES, inputs=[prompt], label="Examples: math, code, chat, story", elem_id="examples")
            with gr.Row():
                trace_upload = gr.UploadButton("Open a trace", file_types=[".gz", ".json"], elem_id="trace_upload",
                                               size="sm")
                trace_file = gr.DownloadButton("Export the run (trace)", elem_id="trace_export", size="sm")
            link_btn = gr.Button("Copy link to this step", elem_id="link", size="sm")
            link_box = gr.Textbox(label="Link to this step (opens this trace, step, phase and tab)", visible=False,
                                  interactive=False, buttons=["copy"], elem_id="link_box")
            trace_note = gr.Markdown(elem_id="trace_note")
        with gr.Column(scale=3, elem_id="views"):
            text = gr.HTML(elem_id="out", label="Output")
            with gr.Row(elem_id="phase_bar", equal_height=True):
                prev_btn = gr.Button("◀ Phase", elem_id="phase_prev", size="sm", min_width=96, scale=0)
                play_btn = gr.Button(views.PLAY, elem_id="play", size="sm", min_width=90, scale=0)
                next_btn = gr.Button("Phase ▶", elem_id="phase_next", size="sm", min_width=96, scale=0)
                phase = gr.Radio(animation.CHOICES, value=views.WHOLE_STEP, show_label=False, container=False,
                                 elem_id="phase", scale=1)
            tree = plot("tree")
            caption = gr.Markdown("Press **Run** to decode the prompt, or **Step** to advance one target forward "
                                  "at a time.", elem_id="caption")
            slider = gr.Slider(0, 1, value=0, step=1, label="Step (replay any stored step)", elem_id="step_slider")
            metrics = gr.Markdown(elem_id="metrics")
            with gr.Tabs(elem_id="tabs") as tabs:
                with gr.Tab("Acceptance vs budget", id="budget") as budget_tab:
                    budget_fig = plot("budget_chart")
                with gr.Tab("Per step", id="per-step") as per_step_tab:
                    tau_fig = plot("tau_chart")
                    time_fig = plot("time_chart")
                with gr.Tab("Distributions", id="distributions") as distributions_tab:
                    hist_fig = plot("hist_chart")
                    depth_fig = plot("depth_chart")
                    calib_fig = plot("calib_chart")
                with gr.Tab("Step views", id="step-views") as step_views_tab:
                    tree_facts = gr.Markdown("Run or Step to see this step's tree as a graph.", elem_id="tree_facts")
                    with gr.Row():
                        graphml = gr.DownloadButton("Download this tree (GraphML)", elem_id="graphml", size="sm")
                        graph_json = gr.DownloadButton("Download this tree (node-link JSON)", elem_id="graph_json",
                                                       size="sm")
                    icicle_fig = plot("icicle")
                    mask_fig = plot("mask")
                with gr.Tab("Compare", id="compare") as compare_tab:
                    compare_btn = gr.Button("Compare plain decoding, chain, DDTree, PRESTO and the auto budgets on "
                                            "this prompt", elem_id="compare")
                    compare_table = gr.Dataframe(headers=COMPARE_HEADERS, elem_id="compare_table",
                                                 datatype=["str", "str", "number", "number", "str", "str"],
                                                 interactive=False)
                    compare_note = gr.Markdown(elem_id="compare_note")
                    compare_fig = plot("compare_chart")
                with gr.Tab("How it works", id="how") as how_tab:
                    explain = gr.Markdown(HOW_IT_WORKS)
                    gr.Markdown("The current step's tree, coloured by q(u): Σ over its nodes is the expected "
                                "number of accepted drafts; the green path is what the target accepted.")
                    explain_tree = plot("explain_tree")
    timer = gr.Timer(1.0)
    exact_timer = gr.Timer(1.0, active=False)       # runs while the last run's exact budget curve is replayed
    anim_timer = gr.Timer(animation.TICK_S, active=False)   # runs while the step's animation plays
    view = gr.State("budget")                       # the open tab, for links to this step

    # ----- wiring -------------------------------------------------------------------------------------------
    form = {"prompt": prompt, "method": method, "budget": budget, "temperature": temperature, "top_p": top_p,
            "top_k": top_k, "max_new": max_new, "seed": seed, "pair_name": pair_name}
    shown = {"text": text, "tree": tree, "slider": slider, "metrics": metrics, "budget_fig": budget_fig,
             "tau_fig": tau_fig, "hist_fig": hist_fig, "depth_fig": depth_fig, "time_fig": time_fig,
             "calib_fig": calib_fig, "icicle": icicle_fig, "mask": mask_fig, "explain": explain,
             "explain_tree": explain_tree, "caption": caption, "tree_facts": tree_facts, "graphml": graphml,
             "graph_json": graph_json, "exact_timer": exact_timer, "trace_file": trace_file, "phase": phase,
             "anim_timer": anim_timer, "play": play_btn}
    OUTPUTS = [shown[name] for name in views.OUTPUTS] + [state]
    # always_last: a Run pressed while one is pending (or right after Stop) runs once, after it, never twice
    run_btn.click(run, [state], OUTPUTS, inputs_kwargs=form, concurrency_id="model", show_progress="minimal",
                  trigger_mode="always_last")
    step_btn.click(step_once, [state], OUTPUTS, inputs_kwargs=form, concurrency_id="model",
                   show_progress="minimal", trigger_mode="always_last")
    slider.input(handlers.show_step, [slider, pair_name, state], [shown[name] for name in views.REPLAY_VIEWS],
                 concurrency_id="model", trigger_mode="always_last", show_progress="hidden")
    compare_btn.click(compare, [state], [compare_table, compare_fig, compare_note, state], concurrency_id="model",
                      inputs_kwargs={name: c for name, c in form.items() if name != "method"})
    compare_table.select(handlers.show_difference, [pair_name, state], OUTPUTS, concurrency_id="model")
    exact_timer.tick(handlers.show_exact, [state], [budget_fig, exact_timer], queue=False, show_progress="hidden")
    stop_btn.click(stop, None, None, queue=False)   # outside the model queue, so it acts while a run holds it
    status_inputs, status_outputs = [method, budget, pair_name], [machine, budget_note, timer]
    # raw values (no preprocessing): a budget typed out of range gets refresh's note, not a wordless error badge
    gr.on([demo.load, timer.tick, method.change, budget.change, pair_name.change], handlers.refresh, status_inputs,
          status_outputs, queue=False, show_progress="hidden", preprocess=False)
    presenter.change(handlers.present, [presenter, dark, pair_name, state], OUTPUTS, js=PRESENTER_JS,
                     concurrency_id="model", show_progress="hidden")
    demo.load(None, None, presenter, js=PRESENTER_URL_JS)      # ?presenter=1 opens in presenter mode
    # a trace replays with no model: outside the model queue; ?trace=NAME opens a shipped one
    trace_upload.upload(sharing.open_file, [trace_upload, state], OUTPUTS + [trace_note, prompt], queue=False)
    demo.load(sharing.open_named, [state], OUTPUTS + [trace_note, prompt], queue=False).then(
        animation.open_url, [state], [shown[name] for name in animation.OUTPUTS] + [state, tabs, view], queue=False)
    # the step's animation and links to a step: no model, outside the model queue
    ANIM = [shown[name] for name in animation.OUTPUTS] + [state]
    # a press while one is drawn runs after it, on what it drew (two quick → go two phases on)
    for control, handler in ((prev_btn.click, animation.prev_phase), (next_btn.click, animation.next_phase),
                             (play_btn.click, animation.play), (phase.input, animation.pick)):
        control(handler, [slider, phase, state], ANIM, queue=False, show_progress="hidden", trigger_mode="always_last")
    anim_timer.tick(animation.tick, [slider, phase, state], ANIM, queue=False, show_progress="hidden")
    for tab in (budget_tab, per_step_tab, distributions_tab, step_views_tab, compare_tab, how_tab):
        tab.select(lambda tab_id=tab.id: tab_id, None, view, queue=False, show_progress="hidden")
    link_btn.click(animation.link, [slider, phase, view, state], link_box, queue=False).then(
        None, [link_box], [link_box], js=animation.LINK_JS)
    demo.unload(forget)
    demo.queue(max_size=16, default_concurrency_limit=1)


if __name__ == "__main__":
    try:
        app_dtype()
    except ValueError as e:
        raise SystemExit(str(e)) from None
    get_pair(usable_pairs()[0])       # load (and on first use convert) the default before the first visitor
    launch(block=True, theme=gr.themes.Soft(primary_hue="green", secondary_hue="blue"))
