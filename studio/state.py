"""The app's session state, in one place: the loaded model pairs (shared by all sessions), each pair's
verification-cost curve measured in the background, each session's exact budget curve replayed in the background,
the Step generations kept per session and when each session last pressed Stop. Also the state-only handlers (Stop,
a closed tab, GET /health) and the header line.
"""
from __future__ import annotations

import atexit
import os
import threading
import time

import gradio as gr
import psutil
import torch

from core.config import MODEL_PAIRS
from core.costs import BackgroundCurves
from core.hardware import describe_dtype, dtype_facts
from core.limits import limits
from core.models import ModelLoadError, load_pair, resolve_dtype
from studio.exact import ExactCurves
from viz import text as words

PAIRS: dict[str, object] = {}           # loaded model pairs, shared by all sessions
COSTS = BackgroundCurves()              # each pair's verification-cost curve, measured in the background
EXACT = ExactCurves(COSTS.idle)         # each session's exact budget curve, replayed while no run decodes
LIVE: dict[str, tuple[tuple, object, list]] = {}   # session -> (settings, live generator, records) for Step
MAX_LIVE = 8                            # Step generations kept at once (each holds a KV cache); oldest dropped
STOPPED: dict[str, float] = {}          # session -> when Stop was last pressed; runs end at the next step
_LOAD_LOCK = threading.Lock()


@atexit.register
def _stop_background() -> None:
    """Stop both background workers before the interpreter finalises (a daemon thread still inside a torch
    operator then aborts the process); the cost measurement first, since the replays wait on its gate."""
    COSTS.shutdown()
    EXACT.shutdown()


def app_dtype() -> str:
    """The dtype the app loads its pairs in: `DRAFT_TREE_DTYPE` (auto, bf16, fp32 or fp16), default auto. fp32 makes
    every greedy output token-equal to plain decoding's on any CPU, at the cost of speed where bf16 is native."""
    name = os.environ.get("DRAFT_TREE_DTYPE", "").strip().lower() or "auto"
    try:
        resolve_dtype(name, "cpu")
    except ValueError:
        raise ValueError(f"DRAFT_TREE_DTYPE is {name!r}: set it to auto, bf16, fp32 or fp16, or unset it "
                         "(auto)") from None
    return name


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
                PAIRS[name] = load_pair(name, dtype=app_dtype())
            except (ModelLoadError, ValueError) as e:
                raise gr.Error(f"Model pair {name!r} cannot be loaded here: {e}") from e
            COSTS.start(name, PAIRS[name].target)
    return PAIRS[name]


def start_cost_curves() -> None:
    """Measure (or read from the cache) the cost curve of every pair loaded before launch."""
    for name, pair in PAIRS.items():
        COSTS.start(name, pair.target)


def session(request) -> str:
    return getattr(request, "session_hash", None) or "local"


def stopped_since(request, started: float) -> bool:
    """Whether this session pressed Stop after `started` (time.time())."""
    return STOPPED.get(session(request), 0.0) > started


def keep_live(request, live: tuple) -> None:
    """This session's new Step generation; the oldest others are dropped beyond MAX_LIVE."""
    LIVE.pop(session(request), None)
    while len(LIVE) >= MAX_LIVE:                 # sessions that stepped and left: free their caches
        LIVE.pop(next(iter(LIVE)))
    LIVE[session(request)] = live


def fresh_state(state) -> dict:
    """A session's state for a new run: no records or token texts, the plain-decoding baselines, presenter mode and
    the animation's lock kept."""
    kept = {name: (state or {})[name] for name in ("ar", "presenter", "anim_lock") if name in (state or {})}
    return {"records": [], "texts": {}, "ar": {}, "presenter": None} | kept


def stop(request: gr.Request = None):
    """Runs and comparisons end at their next step; a half-stepped Step generation is dropped."""
    STOPPED[session(request)] = time.time()
    LIVE.pop(session(request), None)


def forget(request: gr.Request = None):
    """A closed tab: drop its Step generation (and its KV cache), its exact curve and its stop flag."""
    LIVE.pop(session(request), None)
    EXACT.cancel(session(request))
    STOPPED.pop(session(request), None)


def health() -> dict:
    """GET /health: answered outside the model queue, even while a run holds it."""
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
        return "No model pair is loaded yet: the first Run or Step loads it. A trace replays without one."
    pair = PAIRS[name]
    status = COSTS.status(name)
    curve = COSTS.curves.get(name)
    cost = (f"verifying 17 tokens costs {words.verify_ratio(curve, 17):.1f} and 65 tokens "
            f"{words.verify_ratio(curve, 65):.1f} one-token forwards here" if curve else
            f"{status} of the verification-cost curve (runs do not wait for it)")
    dtype, why, where = dtype_facts(pair.dtype, pair.device)
    return f"**{name}** in **{dtype}** on {where} ({why}) · {cost}"
