"""Draft-tree studio: watch a block-diffusion drafter's draft tree get verified, step by step.

Handlers first, then the layout, then the wiring. Every figure comes from `viz/` built from the engine's
StepRecords; the speeds shown are the engine's own timings. Model work runs in one queue (one at a time).
"""
from __future__ import annotations

import hashlib
import html
import threading
import time
from pathlib import Path

import gradio as gr
import psutil
import torch

try:                                    # Hugging Face ZeroGPU Spaces: a GPU is attached per decorated call
    import spaces
    gpu = spaces.GPU(duration=120)
except ImportError:                     # local machines, CPU Spaces, CI
    def gpu(fn):
        return fn

from core.accept import GREEDY_BELOW
from core.config import MAX_BUDGET, MODEL_PAIRS, DecodeConfig
from core.costs import BackgroundCurves
from core.divergence import first_divergence
from core.engine import check_inputs, generate
from core.hardware import describe_dtype, dtype_facts
from core.models import ModelLoadError, encode_chat, load_pair
from core.records import summarize
from core.tree import accepted_by
from viz import charts, text as words
from viz.theme import DARK_CSS
from viz.tokens import CSS as TOKEN_CSS
from viz.tokens import token_html
from viz.tree_graph import tree_figure

METHODS = {"Plain decoding (AR)": "ar", "DFlash chain": "chain", "DDTree": "ddtree", "PRESTO": "presto",
           "PRESTO-beam": "presto-beam", "Hybrid (drafter + retrieval)": "hybrid", "DDTree, auto budget": "ddtree-auto",
           "PRESTO, auto budget": "presto-auto", "Hybrid, auto budget": "hybrid-auto"}
EXAMPLES = [
    ["Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
     "clips did Natalia sell altogether in April and May?\nPlease reason step by step, and put your final answer "
     "within \\boxed{}."],
    ["Write a Python function that checks whether a string is a palindrome."],
    ["What are some good tips for staying focused while studying?"],
    ["Write a short story about a robot who learns to paint."],
]
UPDATE_INTERVAL = 0.35       # seconds between streamed UI updates (the engine never waits for the UI)
FULL_INTERVAL = 1.5          # seconds between updates of the whole chart set while a run streams
MAX_PROMPT_CHARS = 20_000
TREE_HEIGHT = 400            # px: fixed, so the page never jumps as trees grow and shrink
DEFAULT_METHOD, DEFAULT_BUDGET = "DDTree, auto budget", 64  # fastest (BENCHMARKS.md, "The app on this CPU")
COMPARED = ("Plain decoding (AR)", "DFlash chain", "DDTree", "DDTree, auto budget", "PRESTO", "Hybrid, auto budget")
COMPARE_HEADERS = ["method", "budget", "τ", "tokens/s", "speed-up vs plain", "identical to plain?"]
PAIRS: dict[str, object] = {}           # loaded model pairs, shared by all sessions
COSTS = BackgroundCurves()              # each pair's verification-cost curve, measured in the background
LIVE: dict[str, tuple[tuple, object, list]] = {}   # session -> (settings, live generator, records) for Step
MAX_LIVE = 8                            # Step generations kept at once (each holds a KV cache); oldest dropped
STOPPED: dict[str, float] = {}          # session -> when Stop was last pressed; runs end at the next step
_LOAD_LOCK = threading.Lock()


# ----- handlers -----------------------------------------------------------------------------------------------

def usable_pairs() -> list[str]:
    names = [n for n, spec in MODEL_PAIRS.items() if not spec.needs_gpu or torch.cuda.is_available()]
    return sorted(names, key=lambda n: n != "smollm2-135m")


def get_pair(name: str):
    if name in PAIRS:
        return PAIRS[name]
    if name not in MODEL_PAIRS:
        raise gr.Error(f"Unknown model pair {name!r}. Choose one from the list.")
    with _LOAD_LOCK:
        if name not in PAIRS:
            try:
                PAIRS[name] = load_pair(name)
            except ModelLoadError as e:
                raise gr.Error(f"Model pair {name!r} cannot be loaded here: {e}") from e
            COSTS.start(name, PAIRS[name].target)
    return PAIRS[name]


def _settings(method_label, budget, temperature, top_p, top_k, max_new, seed) -> DecodeConfig:
    if method_label not in METHODS:
        raise gr.Error(f"Unknown method {method_label!r}.")
    try:
        return DecodeConfig(method=METHODS[method_label], budget=int(budget), temperature=float(temperature),
                            top_p=float(top_p), top_k=int(top_k), max_new_tokens=int(max_new),
                            seed=int(seed)).validate()
    except (TypeError, ValueError) as e:
        raise gr.Error(f"Invalid setting: {e}") from e


def _prompt_ids(pair, prompt: str) -> list[int]:
    prompt = (prompt or "").strip()
    if not prompt:
        raise gr.Error("The prompt is empty: type something or pick an example.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise gr.Error(f"The prompt is {len(prompt)} characters; the limit here is {MAX_PROMPT_CHARS}.")
    return encode_chat(pair.tokenizer, prompt)


def _texts(pair, records, texts: dict[int, str]) -> dict[int, str]:
    ids = {t for r in records for t in r.tree.tokens + r.committed + [r.bonus]} - texts.keys()
    texts.update({t: pair.tokenizer.decode([t]) for t in ids})
    return texts


def _plain(pair, ids: list[int], cfg: DecodeConfig, state: dict, tokens: int) -> tuple[float, list]:
    """Plain decoding's tokens/s and records on the same prompt and settings, over as many new tokens as the run
    made (speed per token falls as the context grows, so a shorter baseline would flatter it); cached per session
    and prompt. The records let a greedy run be checked token for token against plain decoding."""
    key = f"{pair.name}:{hashlib.sha1(str(ids).encode()).hexdigest()}:{cfg.temperature}:{tokens}"
    if key not in state["ar"]:
        ar = DecodeConfig(method="ar", temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                          seed=cfg.seed, max_new_tokens=tokens)
        with COSTS.decoding():
            records = list(generate(pair, ids, ar))
            state["ar"][key] = (summarize([records]).tokens_per_second, records)
    return state["ar"][key]


def metrics_md(records, ar_tps: float | None, status: str = "done", difference: str = "") -> str:
    if not records:
        return ""
    hybrid = any(r.tree.origin is not None for r in records)
    sources = tuple(map(sum, zip(*(accepted_by(r.tree, r.accepted) for r in records)))) if hybrid else None
    return words.metrics(summarize([records]), ar_tps, status, sources) + (f"\n\n{difference}" if difference else "")


def _block_size(pair):
    return pair.drafter.block_size if pair.drafter is not None else None


def _render(pair, records, state, ar_tps, full: bool, status: str = "done", shown: int | None = None,
            highlight: int | None = None):
    """UI values for the records: while running, the latest step (full=False skips the slow run-level charts);
    when done, a representative step with the slider on it (or step index `shown`, token `highlight` outlined)."""
    texts = _texts(pair, records, state["texts"])
    if shown is not None:
        rule = "where it first differs from plain decoding"
    elif status == "running":
        shown, rule = len(records) - 1, ""
    else:
        shown, rule = words.representative_step(records)
    views = _step_views(pair, records, shown, texts, state, rule, full)
    slider = gr.Slider(minimum=0, maximum=max(1, len(records) - 1), value=shown, step=1, interactive=True,
                       label=f"Step (replay any stored step; showing {shown} of {len(records) - 1})")
    out = [token_html(records, texts, highlight), views[0], slider,
           metrics_md(records, ar_tps, status, state.get("difference", "")),
           charts.budget_figure(records, COSTS.curves.get(pair.name), _draft_ms(records))]
    if full:
        out += [charts.tau_per_step(records), charts.histogram(records), charts.depth_rates(records),
                charts.time_breakdown(records), charts.calibration(records), *views[1:]]
    else:
        out += [gr.skip()] * 9 + [views[5]]
    return out


def _step_views(pair, records, k, texts, state, rule="", full=True):
    """Tree, icicle, mask, explanation, tree again (How it works) and the caption for stored step k (full=False:
    the tree and the caption only)."""
    r = records[k]
    note = f" ({rule})" if rule else ""
    fig = tree_figure(r, texts, title=f"step {r.step}: {r.tree.size} nodes, τ = {r.tau}{note}", height=TREE_HEIGHT)
    caption = words.step_caption(r, texts, _block_size(pair), state.get("prompt_tokens"), state.get("method", ""))
    if not full:
        return [fig, None, None, None, None, caption]
    explanation = words.step_explanation(r, texts, state.get("method", "ddtree"), _block_size(pair))
    return [fig, charts.icicle(r, texts), charts.mask_heatmap(r, texts), HOW_IT_WORKS + "\n\n" + explanation,
            fig, caption]


def _warn_missing_table(pair, cfg: DecodeConfig) -> None:
    table = getattr(pair, "ngram_table", None)
    if cfg.method.startswith("presto") and (table is None or not Path(table).is_file()):
        gr.Warning("No n-gram table for this model pair: PRESTO scores paths with this request's own n-gram counts "
                   "only (build one with `python -m core.training.build_ngram`).")


def _guarded(steps):
    """The engine's records; any failure reaches the user as a readable message, and the app stays up."""
    try:
        yield from steps
    except ValueError as e:
        raise gr.Error(str(e)) from e
    except Exception as e:  # noqa: BLE001 - an unexpected fault must not kill the page
        raise gr.Error(f"The run failed ({type(e).__name__}: {e}). Try a smaller budget or fewer tokens.") from e


def _draft_ms(records):
    steps = [r for r in records if r.step > 0 and "draft" in r.seconds]
    return 1000 * sum(r.seconds["draft"] for r in steps) / len(steps) if steps else None


@gpu
def run(prompt, method_label, budget, temperature, top_p, top_k, max_new, seed, pair_name, state,
        request: gr.Request = None):
    """Decode the prompt, streaming one UI update per step (throttled); ends with the speed-up."""
    state = _fresh_state(state)
    pair = get_pair(pair_name)
    cfg = _settings(method_label, budget, temperature, top_p, top_k, max_new, seed)
    ids = _prompt_ids(pair, prompt)
    try:
        check_inputs(pair, ids, cfg)
    except ValueError as e:
        raise gr.Error(str(e)) from e
    LIVE.pop(_session(request), None)
    _warn_missing_table(pair, cfg)
    records, last, last_full, started = [], 0.0, 0.0, time.time()
    state |= {"records": records, "method": cfg.method, "prompt_tokens": len(ids)}
    with COSTS.decoding():                          # the background cost measurement waits meanwhile
        for record in _guarded(generate(pair, ids, cfg)):
            records.append(record)
            if STOPPED.get(_session(request), 0.0) > started:
                break                                   # Stop: end cleanly between steps, keep what was made
            now = time.perf_counter()
            if now - last >= UPDATE_INTERVAL:           # text, tree, numbers and budget curve at every update
                full = now - last_full >= FULL_INTERVAL  # the other charts less often: decoding stays fast
                yield _render(pair, records, state, None, full=full, status="running") + [state]
                last = time.perf_counter()
                last_full = last if full else last_full
    stopped = STOPPED.get(_session(request), 0.0) > started
    if cfg.method == "ar":
        ar_tps = summarize([records]).tokens_per_second
    elif stopped:
        ar_tps = None
    else:
        ar_tps, plain = _plain(pair, ids, cfg, state, sum(len(r.committed) for r in records))
        div = first_divergence(plain, records) if cfg.temperature < GREEDY_BELOW else None
        state["difference"] = words.divergence_note(div, method_label, _texts(pair, plain, state["texts"]),
                                                    dtype_facts(pair.dtype, pair.device)[0]) if div else ""
    state["ar_tps"] = ar_tps
    yield _render(pair, records, state, ar_tps, full=True, status="stopped" if stopped else "done") + [state]


@gpu
def step_once(prompt, method_label, budget, temperature, top_p, top_k, max_new, seed, pair_name, state,
              request: gr.Request = None):
    """Advance exactly one decoding step (the first press runs the prefill)."""
    state = state if state and state.get("records") is not None else _fresh_state(state)
    pair = get_pair(pair_name)
    cfg = _settings(method_label, budget, temperature, top_p, top_k, max_new, seed)
    ids = _prompt_ids(pair, prompt)
    key = (pair_name, tuple(ids), cfg)
    live = LIVE.get(_session(request))
    if live is None or live[0] != key:
        try:
            check_inputs(pair, ids, cfg)
        except ValueError as e:
            raise gr.Error(str(e)) from e
        _warn_missing_table(pair, cfg)
        live = (key, _guarded(generate(pair, ids, cfg)), [])
        LIVE.pop(_session(request), None)
        while len(LIVE) >= MAX_LIVE:                 # sessions that stepped and left: free their caches
            LIVE.pop(next(iter(LIVE)))
        LIVE[_session(request)] = live
        state = _fresh_state(state) | {"method": cfg.method, "prompt_tokens": len(ids)}
    with COSTS.decoding():
        record = next(live[1], None)
    if record is None:
        gr.Info("The generation has finished; press Run or change a setting to start again.")
    else:
        live[2].append(record)
    state["records"] = live[2]
    if not live[2]:
        return [gr.skip()] * (len(OUTPUTS) - 1) + [state]
    status = "running"    # Step shows the step it just made, never a representative one
    return _render(pair, live[2], state, state.get("ar_tps"), full=True, status=status) + [state]


def show_step(k, pair_name, state):
    """Replay a stored step: its tree, icicle, mask, explanation and caption."""
    records = (state or {}).get("records") or []
    if not records:
        return [gr.skip()] * 6
    k = int(min(max(0, k or 0), len(records) - 1))
    pair = get_pair(pair_name)
    return _step_views(pair, records, k, _texts(pair, records[: k + 1], state["texts"]), state)


@gpu
def compare(prompt, budget, temperature, top_p, top_k, max_new, seed, pair_name, state=None,
            request: gr.Request = None):
    """Plain decoding and the speculative methods on the same prompt and settings; a row appears as each
    finishes, the verdict after the last. At temperature 0 a run that differs from plain decoding says where
    and why (`core.divergence`); clicking its row shows that step."""
    pair = get_pair(pair_name)
    ids = _prompt_ids(pair, prompt)
    state = state or _fresh_state(None)
    rows, runs, started = [], {}, time.time()
    for label in COMPARED:
        if STOPPED.get(_session(request), 0.0) > started:
            return
        cfg = _settings(label, budget, temperature, top_p, top_k, max_new, seed)
        with COSTS.decoding():
            records = list(_guarded(generate(pair, ids, cfg)))
        s = summarize([records])
        div = first_divergence(runs[COMPARED[0]][0], records) if runs else None
        runs[label] = (records, div, cfg.method)
        rows.append({"method": label, "budget": "–" if cfg.method in ("ar", "chain") else
                     f"≤ {cfg.budget}" if cfg.method.endswith("-auto") else cfg.budget,
                     "tau": round(s.tau, 2) if s.steps else 1.0, "tokens/s": round(s.tokens_per_second, 1),
                     "identical": _same(div, temperature)})
        for row in rows:
            row["speedup"] = round(row["tokens/s"] / (rows[0]["tokens/s"] or 1.0), 2)
        table = [[r["method"], r["budget"], r["tau"], r["tokens/s"], f'{r["speedup"]:.2f}×', r["identical"]]
                 for r in rows]
        state = state | {"compared": runs, "compare_ids": ids}
        yield table, charts.compare_bars(rows), _verdict(pair, rows, runs, temperature, state), state


def _same(div, temperature: float) -> str:
    if div is None:
        return "yes"
    if temperature > 0:
        return "no (sampled)"
    return f"no: token {div.position}, " + ("near-tie" if div.near_tie else "not a near-tie")


def _verdict(pair, rows, runs, temperature: float, state) -> str:
    if len(rows) < len(COMPARED):
        return f"{len(rows)} of {len(COMPARED)} methods done; running {COMPARED[len(rows)]}…"
    if all(r["identical"] == "yes" for r in rows):
        return "All outputs are **identical** to plain decoding: every method is lossless."
    if temperature > 0:
        return ("Outputs differ from plain decoding, as expected when sampling: each method draws different random "
                "numbers; the distribution is the same (tested).")
    dtype = dtype_facts(pair.dtype, pair.device)[0]
    notes = [words.divergence_note(div, label, _texts(pair, records, state["texts"]), dtype)
             for label, (records, div, _) in runs.items() if div is not None]
    return "\n\n".join(notes + ["Click a row that differs to see that step, the token outlined in the text."])


def show_difference(evt: gr.SelectData, pair_name, state):
    """A Compare row clicked: that run in the step view, on the step where it first differs."""
    runs = (state or {}).get("compared") or {}
    label = COMPARED[evt.index[0]] if evt.index and evt.index[0] < len(COMPARED) else None
    if label not in runs:
        return [gr.skip()] * (len(OUTPUTS) - 1) + [state]
    records, div, method = runs[label]
    pair = get_pair(pair_name)
    state = state | {"records": records, "method": method, "prompt_tokens": len(state.get("compare_ids", []))}
    shown = next(i for i, r in enumerate(records) if r.step == div.step) if div else None
    out = _render(pair, records, state, None, full=True, shown=shown,
                  highlight=div.position if div else None)
    return out + [state]


def _fresh_state(state):
    return {"records": [], "texts": {}, "ar": (state or {}).get("ar", {})}


def stop(request: gr.Request = None):
    """Runs and comparisons end at their next step; a half-stepped Step generation is dropped."""
    STOPPED[_session(request)] = time.time()
    LIVE.pop(_session(request), None)


def forget(request: gr.Request = None):
    """A closed tab: drop its Step generation (and its KV cache) and its stop flag."""
    LIVE.pop(_session(request), None)
    STOPPED.pop(_session(request), None)


def health() -> dict:
    """GET /health: answered outside the model queue, even while a run holds it."""
    from core.limits import limits

    out = {"status": "ok", "loaded_pairs": sorted(PAIRS), "step_sessions": len(LIVE),
           "rss_mb": round(psutil.Process().memory_info().rss / 2**20)}
    if PAIRS:
        name, pair = next(iter(PAIRS.items()))
        cap = limits(pair.target)
        out |= {"max_budget": cap.max_budget, "max_context": cap.max_context,
                "dtype": describe_dtype(pair.dtype, pair.device), "cost_curve": COSTS.status(name)}
    return out


def machine_md(pair_name: str | None = None) -> str:
    """The header line: where this runs, in which dtype and why, and the cost measurement's progress."""
    name = pair_name if pair_name in PAIRS else next(iter(PAIRS), None)
    if name is None:
        return "Loading the model pair…"
    pair = PAIRS[name]
    status = COSTS.status(name)
    curve = COSTS.curves.get(name)
    cost = (f"verifying 17 tokens costs {words.verify_ratio(curve, 17):.1f} and 65 tokens "
            f"{words.verify_ratio(curve, 65):.1f} one-token forwards here" if curve else
            f"{status} of the verification-cost curve (runs do not wait for it)")
    dtype, why, where = dtype_facts(pair.dtype, pair.device)
    return f"**{name}** in **{dtype}** on {where} ({why}) · {cost}"


def refresh(method_label, budget, pair_name):
    """The header and the budget note; the timer that calls this stops once the curve is measured."""
    pair = PAIRS.get(pair_name)
    method = METHODS.get(method_label, "ddtree")
    curve = COSTS.curves.get(pair_name)
    machine = f"{dtype_facts(pair.dtype, pair.device)[0]} on this {pair.device.type.upper()}" if pair else ""
    note = words.budget_note(method, int(budget or 1), _block_size(pair) if pair else None, curve, machine)
    return machine_md(pair_name), note, gr.Timer(active=curve is None)


def launch(block: bool = False, **kwargs):
    """Launch the app with GET /health; returns launch()'s tuple (block=True serves until interrupted)."""
    for name, pair in PAIRS.items():
        COSTS.start(name, pair.target)
    result = demo.launch(css=TOKEN_CSS + DARK_CSS + LAYOUT_CSS, prevent_thread_lock=True, **kwargs)
    demo.app.add_api_route("/health", health, methods=["GET"])
    if block:
        demo.block_thread()
    return result


def _session(request) -> str:
    return getattr(request, "session_hash", None) or "local"


HOW_IT_WORKS = """
**DFlash** drafts a whole block at once: a small drafter reads the target's hidden states and, in *one*
forward over `[bonus, MASK × L]`, gives a distribution q_i for each of the next L positions. Vanilla DFlash
verifies only the argmax chain.

**DDTree** builds the draft tree that maximises the expected number of accepted drafts under a node budget B.
For a tree T, E[accepted] = Σ_{u∈T} q(u) with q(u) = Π q_i(u_i) (Proposition 1), so the best tree is the top-B
prefixes by q(u): a best-first heap over rank tuples (next sibling, first child) pops them in order. The tree is
verified in one target forward with an ancestor-only attention mask; the target walks it and the longest
matching path is accepted, plus one token of its own (the bonus). Lossless at any temperature.

**PRESTO** ranks paths with a prefix-aligned score S(u) = Σ log q_i(u_i) + λ · log p_ngram(u_i | path so far),
since the drafter's q_i cannot see which token the path chose before position i.

**Hybrid** adds what the drafter cannot propose: continuations copied from the prompt and the reply so far
(the tokens that followed the current suffix before, as prompt lookup does), grafted at the root and below the
drafter's nodes. A retrieved token's probability is its measured acceptance rate for its match length in this run,
so one heap ranks both proposers on one scale; retrieved nodes wear a fuchsia diamond.

**Auto budget** (DDTree / PRESTO, auto budget) removes the budget guesswork: every step it builds the tree at the
slider's budget B and keeps the first b nodes that maximise expected tokens per second,
(1 + α · Σ_{first b} q(u)) / (t_other + t_verify(b + 1)), with the target's verification latency measured once for
this machine (cached) and α, t_other calibrated on the steps already run. B is then the largest budget it may use.
"""


# ----- layout -------------------------------------------------------------------------------------------------

LAYOUT_CSS = f"""
#machine p {{ font-size: 13px; margin: 0; }}
#budget_note p {{ font-size: 12.5px; margin: 0; }}
#caption p {{ font-size: 13.5px; margin: 2px 0; }}
#tree {{ min-height: {TREE_HEIGHT}px; }}
"""

with gr.Blocks(title="Draft-tree studio", analytics_enabled=False) as demo:
    state = gr.State(None)
    gr.Markdown("### Draft-tree studio — lossless speculative decoding with block-diffusion draft trees")
    machine = gr.Markdown("Loading the model pair…", elem_id="machine")
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300):
            prompt = gr.Textbox(label="Prompt", lines=4, max_lines=8, elem_id="prompt", value=EXAMPLES[0][0])
            with gr.Row():
                run_btn = gr.Button("Run", variant="primary", elem_id="run", min_width=60)
                step_btn = gr.Button("Step", elem_id="step", min_width=60)
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop", min_width=60)
            method = gr.Dropdown(list(METHODS), value=DEFAULT_METHOD, label="Method", elem_id="method")
            budget = gr.Slider(1, min(512, MAX_BUDGET), value=DEFAULT_BUDGET, step=1,
                               label="Node budget B (auto: the most it may use)", elem_id="budget")
            budget_note = gr.Markdown(elem_id="budget_note")
            with gr.Accordion("Sampling, length, seed, model pair", open=False):
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
            gr.Examples(EXAMPLES, inputs=[prompt], label="Examples: math, code, chat, story")
        with gr.Column(scale=3):
            text = gr.HTML(elem_id="out", label="Output")
            tree = gr.Plot(show_label=False, elem_id="tree")
            caption = gr.Markdown("Press **Run** to decode the prompt, or **Step** to advance one target forward "
                                  "at a time.", elem_id="caption")
            slider = gr.Slider(0, 1, value=0, step=1, label="Step (replay any stored step)", elem_id="step_slider")
            metrics = gr.Markdown(elem_id="metrics")
            with gr.Tabs():
                with gr.Tab("Acceptance vs budget"):
                    budget_fig = gr.Plot(show_label=False, elem_id="budget_chart")
                with gr.Tab("Per step"):
                    tau_fig = gr.Plot(show_label=False)
                    time_fig = gr.Plot(show_label=False)
                with gr.Tab("Distributions"):
                    hist_fig = gr.Plot(show_label=False)
                    depth_fig = gr.Plot(show_label=False)
                    calib_fig = gr.Plot(show_label=False)
                with gr.Tab("Step views"):
                    icicle_fig = gr.Plot(show_label=False)
                    mask_fig = gr.Plot(show_label=False)
                with gr.Tab("Compare"):
                    compare_btn = gr.Button("Compare plain decoding, chain, DDTree, auto budget and PRESTO on this "
                                            "prompt", elem_id="compare")
                    compare_table = gr.Dataframe(headers=COMPARE_HEADERS, elem_id="compare_table",
                                                 datatype=["str", "str", "number", "number", "str", "str"],
                                                 interactive=False)
                    compare_note = gr.Markdown(elem_id="compare_note")
                    compare_fig = gr.Plot(show_label=False)
                with gr.Tab("How it works"):
                    explain = gr.Markdown(HOW_IT_WORKS)
                    gr.Markdown("The current step's tree, coloured by q(u): Σ over its nodes is the expected "
                                "number of accepted drafts; the green path is what the target accepted.")
                    explain_tree = gr.Plot(show_label=False)
    timer = gr.Timer(1.0)

    # ----- wiring -------------------------------------------------------------------------------------------
    settings = [prompt, method, budget, temperature, top_p, top_k, max_new, seed, pair_name, state]
    OUTPUTS = [text, tree, slider, metrics, budget_fig, tau_fig, hist_fig, depth_fig, time_fig, calib_fig,
               icicle_fig, mask_fig, explain, explain_tree, caption, state]
    # always_last: a Run pressed while one is pending (or right after Stop) runs once, after it, never twice
    run_btn.click(run, settings, OUTPUTS, concurrency_id="model", show_progress="minimal",
                  trigger_mode="always_last")
    step_btn.click(step_once, settings, OUTPUTS, concurrency_id="model", show_progress="minimal",
                   trigger_mode="always_last")
    slider.input(show_step, [slider, pair_name, state],
                 [tree, icicle_fig, mask_fig, explain, explain_tree, caption],
                 concurrency_id="model", trigger_mode="always_last", show_progress="hidden")
    compare_btn.click(compare, [prompt, budget, temperature, top_p, top_k, max_new, seed, pair_name, state],
                      [compare_table, compare_fig, compare_note, state], concurrency_id="model")
    compare_table.select(show_difference, [pair_name, state], OUTPUTS, concurrency_id="model")
    stop_btn.click(stop, None, None, queue=False)   # outside the model queue, so it acts while a run holds it
    status_inputs, status_outputs = [method, budget, pair_name], [machine, budget_note, timer]
    demo.load(refresh, status_inputs, status_outputs, queue=False)
    timer.tick(refresh, status_inputs, status_outputs, queue=False, show_progress="hidden")
    gr.on([method.change, budget.change, pair_name.change], refresh, status_inputs, status_outputs, queue=False)
    demo.unload(forget)
    demo.queue(max_size=16, default_concurrency_limit=1)


if __name__ == "__main__":
    get_pair(usable_pairs()[0])       # load (and on first use convert) the default before the first visitor
    launch(block=True, theme=gr.themes.Soft(primary_hue="green", secondary_hue="blue"))
