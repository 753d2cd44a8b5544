"""The app's event handlers: Run (streamed), Step, replaying a stored step, Compare and a clicked Compare row, and
the header refresh. A visitor's settings arrive as one `Form`, become one validated `DecodeConfig` per run, and
every UI value comes from `studio.views` built from the engine's StepRecords.
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from core.accept import GREEDY_BELOW
from core.config import MAX_BUDGET, DecodeConfig
from core.divergence import first_divergence
from core.engine import check_fits, generate, output_ids
from core.hardware import dtype_facts
from core.models import encode_chat
from core.ngram import build_command
from core.records import summarize
from core.replay import CURVE_METHODS, curve_budgets
from studio import animation, sharing
from studio.state import COSTS, EXACT, LIVE, PAIRS, fresh_state, get_pair, keep_live, machine_md, session, \
    stopped_since
from studio.views import REPLAY_VIEWS, block_size, budget_figure, render, slider_label, step_views, token_texts, \
    values
from viz import charts, page, text as words, theme

METHODS = {"Plain decoding (AR)": "ar", "DFlash chain": "chain", "DDTree": "ddtree", "PRESTO": "presto",
           "PRESTO-beam": "presto-beam", "Hybrid (drafter + retrieval)": "hybrid", "DDTree, auto budget": "ddtree-auto",
           "PRESTO, auto budget": "presto-auto", "Hybrid, auto budget": "hybrid-auto"}
COMPARED = ("Plain decoding (AR)", "DFlash chain", "DDTree", "DDTree, auto budget", "PRESTO", "Hybrid, auto budget")
DEFAULT_METHOD, DEFAULT_BUDGET = "Hybrid, auto budget", 64  # fastest (BENCHMARKS.md, "The app on this CPU")
PAGE_MAX_BUDGET = min(512, MAX_BUDGET)      # the budget slider's top
UPDATE_INTERVAL = 0.35       # seconds between streamed UI updates (the engine never waits for the UI)
FULL_INTERVAL = 1.5          # seconds between updates of the whole chart set while a run streams
MAX_PROMPT_CHARS = 20_000


@dataclass(frozen=True)
class Form:
    """The visitor's settings as the page's controls hold them (labels, floats from number boxes); the defaults
    are the page's."""
    prompt: str = ""
    method: str = DEFAULT_METHOD      # a label of METHODS
    budget: float = DEFAULT_BUDGET
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: float = 0
    max_new: float = 128
    seed: float = 0
    pair_name: str = "smollm2-135m"

    def config(self, pair, method: str | None = None) -> DecodeConfig:
        """The settings as one validated DecodeConfig (for method label `method` instead of the form's)."""
        label = method or self.method
        if label not in METHODS:
            raise gr.Error(f"Unknown method {label!r}.")
        try:
            return DecodeConfig(method=METHODS[label], budget=int(self.budget), temperature=float(self.temperature),
                                top_p=float(self.top_p), top_k=int(self.top_k), max_new_tokens=int(self.max_new),
                                seed=int(self.seed)).validate(max_block=block_size(pair))
        except (TypeError, ValueError) as e:
            raise gr.Error(f"Invalid setting: {e}") from e


def prompt_ids(pair, prompt: str) -> list[int]:
    prompt = (prompt or "").strip()
    if not prompt:
        raise gr.Error("The prompt is empty: type something or pick an example.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise gr.Error(f"The prompt is {len(prompt)} characters; the limit here is {MAX_PROMPT_CHARS}.")
    return encode_chat(pair.tokenizer, prompt)


def _start(pair, ids: list[int], cfg: DecodeConfig):
    """The engine's records for a checked run; a missing n-gram table for PRESTO is said first."""
    try:
        check_fits(pair, ids, cfg)
    except ValueError as e:
        raise gr.Error(str(e)) from e
    table = getattr(pair, "ngram_table", None)
    if cfg.method.startswith("presto") and (table is None or not Path(table).is_file()):
        vocab = pair.target.get_output_embeddings().weight.shape[0]
        out = table or f"assets/ngram/{pair.name}-3gram.npz"
        gr.Warning("No n-gram table for this model pair: PRESTO scores paths with this request's own n-gram counts "
                   f"only (build one with `{build_command(out, vocab, cfg.ngram_order)}`).")
    return _guarded(generate(pair, ids, cfg))


def _guarded(steps):
    """The engine's records; any failure reaches the user as a readable message, and the app stays up."""
    try:
        yield from steps
    except ValueError as e:
        raise gr.Error(str(e)) from e
    except Exception as e:  # noqa: BLE001 - an unexpected fault must not kill the page
        raise gr.Error(f"The run failed ({type(e).__name__}: {e}). Try a smaller budget or fewer tokens.") from e


def _plain(pair, ids: list[int], cfg: DecodeConfig, state: dict, tokens: int) -> tuple[float, list]:
    """Plain decoding's tokens/s and records on the same prompt and settings, over as many new tokens as the run
    made (speed per token falls as the context grows, so a shorter baseline would flatter it); cached per session
    and prompt. The records let a greedy run be checked token for token against plain decoding. The caller holds
    `COSTS.decoding()`, from its own run through this one."""
    key = f"{pair.name}:{hashlib.sha1(str(ids).encode()).hexdigest()}:{cfg.temperature}:{tokens}"
    if key not in state["ar"]:
        ar = DecodeConfig(method="ar", temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                          seed=cfg.seed, max_new_tokens=tokens)
        records = list(generate(pair, ids, ar))
        state["ar"][key] = (summarize([records]).tokens_per_second, records)
    return state["ar"][key]


def run(form: Form, state, request: gr.Request = None):
    """Decode the prompt, streaming one UI update per step (throttled); ends with the speed-up."""
    state = fresh_state(state)
    pair = get_pair(form.pair_name)
    cfg = form.config(pair)
    ids = prompt_ids(pair, form.prompt)
    steps = _start(pair, ids, cfg)
    LIVE.pop(session(request), None)
    EXACT.cancel(session(request))                  # the previous run's exact curve: superseded
    records, last, last_full, started = [], 0.0, 0.0, time.time()
    state |= {"records": records, "method": cfg.method, "prompt_tokens": len(ids), "block_size": block_size(pair)}
    with COSTS.decoding():                          # background work waits until the baseline is done
        for record in steps:
            records.append(record)
            if stopped_since(request, started):
                break                                   # Stop: end cleanly between steps, keep what was made
            now = time.perf_counter()
            if now - last >= UPDATE_INTERVAL:           # text, tree, numbers and budget curve at every update
                full = now - last_full >= FULL_INTERVAL  # the other charts less often: decoding stays fast
                yield values(render(pair, records, state, None, full=full, status="running")) + [state]
                last = time.perf_counter()
                last_full = last if full else last_full
        stopped = stopped_since(request, started)
        state["exact"] = _exact_curve(pair, ids, records, cfg, stopped, request)
        if cfg.method == "ar":
            ar_tps = summarize([records]).tokens_per_second
        elif stopped:
            ar_tps = None
        else:
            ar_tps, plain = _plain(pair, ids, cfg, state, sum(len(r.committed) for r in records))
            div = first_divergence(plain, records) if cfg.temperature < GREEDY_BELOW else None
            texts = token_texts(pair, plain + records, state["texts"])       # both tokens where they differ
            state["difference"] = words.divergence_note(div, form.method, texts,
                                                        dtype_facts(pair.dtype, pair.device)[0]) if div else ""
    state["ar_tps"] = ar_tps
    status = "stopped" if stopped else "done"
    views = render(pair, records, state, ar_tps, full=True, status=status)
    views["trace_file"] = sharing.export(pair, form.prompt, cfg, records, len(ids), ar_tps)
    yield values(views) + [state]


def _exact_curve(pair, ids: list[int], records, cfg: DecodeConfig, stopped: bool, request) -> int | str | None:
    """A finished greedy run of a fixed-budget tree method: its exact budget curve, queued in the background (the
    job's id). Otherwise why there is none (a note for the chart), or None where the chart has no budget axis."""
    if cfg.method not in CURVE_METHODS or not any(r.tree.size for r in records[1:]):
        return None
    if cfg.temperature >= GREEDY_BELOW:
        return charts.NO_EXACT_SAMPLED
    if stopped:
        return charts.NO_EXACT_STOPPED
    top = max(r.tree.size for r in records[1:])
    return EXACT.start(session(request), pair, ids, output_ids(records), cfg, curve_budgets(top)).id


def show_exact(state):
    """The timer's tick while an exact curve is replayed: the budget chart again when it has news, and the timer
    stopped once the curve is done (or gone)."""
    job = EXACT.jobs.get((state or {}).get("exact"))
    if job is None:
        return gr.skip(), gr.Timer(active=False)
    news = (len(job.points), job.done)
    if news == job.shown:
        return gr.skip(), gr.skip()
    job.shown = news
    return budget_figure(job.pair, state["records"], state), gr.Timer(active=not job.done)


def step_once(form: Form, state, request: gr.Request = None):
    """Advance exactly one decoding step (the first press runs the prefill)."""
    state = state if state and state.get("records") is not None else fresh_state(state)
    pair = get_pair(form.pair_name)
    cfg = form.config(pair)
    ids = prompt_ids(pair, form.prompt)
    key = (form.pair_name, tuple(ids), cfg)
    live = LIVE.get(session(request))
    if live is None or live[0] != key:
        live = (key, _start(pair, ids, cfg), [])
        keep_live(request, live)
        EXACT.cancel(session(request))
        state = fresh_state(state) | {"method": cfg.method, "prompt_tokens": len(ids), "block_size": block_size(pair)}
    with COSTS.decoding():
        record = next(live[1], None)
    if record is None:
        gr.Info("The generation has finished; press Run or change a setting to start again.")
    else:
        live[2].append(record)
    state["records"] = live[2]
    if not live[2]:
        return values({}) + [state]
    # Step shows the step it just made, never a representative one
    return values(render(pair, live[2], state, state.get("ar_tps"), full=True, status="stepping")) + [state]


def show_step(k, pair_name, state):
    """Replay a stored step: its tree, icicle, mask, explanation and caption, and the slider's label says which (its
    value is the visitor's: set here, it would pull back a slider still being dragged)."""
    records = (state or {}).get("records") or []
    if not records:
        return values({}, REPLAY_VIEWS)
    k = int(min(max(0, k or 0), len(records) - 1))
    pair = _pair_of(pair_name, state)
    views = step_views(pair, records, k, token_texts(pair, records[: k + 1], state["texts"]), state)
    state["anim"] = {"step": k, "phase": None, "frame": 0, "mode": None}    # a playing step stops at its next tick
    return values(views | {"slider": gr.Slider(label=slider_label(records, k))}, REPLAY_VIEWS)


def compare(form: Form, state=None, request: gr.Request = None):
    """Plain decoding and the speculative methods on the same prompt and settings; a row appears as each
    finishes, the verdict after the last. At temperature 0 a run that differs from plain decoding says where
    and why (`core.divergence`); clicking its row shows that step."""
    pair = get_pair(form.pair_name)
    ids = prompt_ids(pair, form.prompt)
    state = state or fresh_state(None)
    rows, runs, started = [], {}, time.time()
    with COSTS.decoding():                  # held from the first run to the last: no background work between them
        for label in COMPARED:
            if stopped_since(request, started):
                return
            cfg = form.config(pair, method=label)
            records = list(_guarded(generate(pair, ids, cfg)))
            div = first_divergence(runs[COMPARED[0]][0], records) if runs else None
            runs[label] = (records, div, cfg.method)
            rows.append(page.compare_row(label, cfg, records, page.same(div, form.temperature)))
            table = page.compare_table(rows)
            state = state | {"compared": runs, "compare_ids": ids}
            bars = theme.present(charts.compare_bars(rows), state.get("presenter"))
            yield table, bars, _verdict(pair, rows, runs, form.temperature, state), state


def _verdict(pair, rows, runs, temperature: float, state) -> str:
    verdict = page.verdict(rows, COMPARED, temperature)
    if verdict is not None:
        return verdict
    dtype = dtype_facts(pair.dtype, pair.device)[0]
    texts = token_texts(pair, [r for records, _, _ in runs.values() for r in records], state["texts"])  # plain's too
    return page.differences([words.divergence_note(div, label, texts, dtype)
                             for label, (records, div, _) in runs.items() if div is not None])


def show_difference(evt: gr.SelectData, pair_name, state, request: gr.Request = None):
    """A Compare row clicked: that run in the step view, on the step where it first differs."""
    runs = (state or {}).get("compared") or {}
    label = COMPARED[evt.index[0]] if evt.index and evt.index[0] < len(COMPARED) else None
    if label not in runs:
        return values({}) + [state]
    records, div, method = runs[label]
    pair = get_pair(pair_name)
    EXACT.cancel(session(request))                  # the shown run changes: its exact curve is not this one's
    state = state | {"records": records, "method": method, "prompt_tokens": len(state.get("compare_ids", [])),
                     "exact": None, "block_size": block_size(pair)}
    shown = next(i for i, r in enumerate(records) if r.step == div.step) if div else None
    return values(render(pair, records, state, None, full=True, shown=shown,
                         highlight=div.position if div else None)) + [state]


def present(on: bool, dark: bool, pair_name, state):
    """Presenter mode switched on or off (`dark`: the page's theme): the session keeps it (in place: a link's step
    may be opening meanwhile), and the run on the page is drawn again in its style, on the step and phase shown."""
    state = state if state is not None else fresh_state(None)
    state["presenter"] = ("dark" if dark else "light") if on else None
    records = state.get("records")
    if not records:
        return values({}) + [state]
    anim = state.pop("anim", None)                 # popped: `at` draws that step's other views too
    views = render(_pair_of(pair_name, state), records, state, state.get("ar_tps"), full=True)
    if anim:
        views |= animation.at(state, anim["step"], anim["phase"], anim["frame"], None)
    return values(views) + [state]


def _pair_of(pair_name, state):
    """The model pair the shown records came from; None for a replayed trace, which needs no model."""
    return None if (state or {}).get("trace") else get_pair(pair_name)


def refresh(method_label, budget, pair_name):
    """The header and the budget note; the timer that calls this stops once the curve is measured. It takes the
    controls' raw values (events with preprocess=False): a budget typed past the slider's range, before the box is
    left, gets a note instead of Gradio's wordless error badge."""
    pair = PAIRS.get(pair_name)
    method = METHODS.get(method_label, "ddtree")
    curve = COSTS.curves.get(pair_name)
    machine = f"{dtype_facts(pair.dtype, pair.device)[0]} on this {pair.device.type.upper()}" if pair else ""
    try:
        typed = float(budget)
    except (TypeError, ValueError):
        typed = float(DEFAULT_BUDGET)
    b = int(min(max(round(typed), 1), PAGE_MAX_BUDGET)) if math.isfinite(typed) else PAGE_MAX_BUDGET
    note = words.budget_note(method, b, block_size(pair) if pair else None, curve, machine)
    if not 1 <= typed <= PAGE_MAX_BUDGET:
        note = (f"**B = {typed:g} is out of range**: the node budget runs from 1 to {PAGE_MAX_BUDGET}, so leaving the "
                f"box sets it to {b}. " + note)
    return machine_md(pair_name), note, gr.Timer(active=curve is None)
