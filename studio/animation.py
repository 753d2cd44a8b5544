"""The step as an animation (`viz.phases`) and the page's URL state: Prev/Next phase, Play/Pause (a timer advances
one frame a tick), the phase picker, `?trace=NAME&step=K&phase=P&view=V` and "copy link to this step".

Where the page is: the step is the slider's value and the phase the picker's, both read from the page on every
event; the session keeps the frame and whether it plays (`state["anim"]`). Nothing here needs a model: the records
and token texts are the session's.

A session's presses and ticks run one at a time (`_in_turn`): a Pause drawn while a tick is drawn pauses where the
tick went, rather than each answering from the same frame and the later answer winning on the page.
"""
from __future__ import annotations

import functools
import threading

import gradio as gr

from studio import sharing
from studio.views import PLAY, PRESENTER_TREE, STEP_VIEWS, TREE_HEIGHT, WHOLE_STEP as WHOLE, presented, slider, \
    step_views, values
from viz import phases as ph

CHOICES = [WHOLE] + [ph.TITLES[p] for p in ph.PHASES]
NAMES = {ph.TITLES[p]: p for p in ph.PHASES} | {p: p for p in ph.PHASES} | {WHOLE: None, "step": None}
PAUSE = "❚❚ Pause"
TICK_S = 0.7
VIEWS = {"budget": "Acceptance vs budget", "per-step": "Per step", "distributions": "Distributions",
         "step-views": "Step views", "compare": "Compare", "how": "How it works"}
OUTPUTS = STEP_VIEWS + ("slider", "anim_timer", "play")
# the page's keys: → / ← next / previous phase (or step), space plays; not while typing in a field
KEYS_JS = """() => {
  document.addEventListener("keydown", (e) => {
    const t = e.target, ids = {ArrowRight: "phase_next", ArrowLeft: "phase_prev", " ": "play"};
    if (!ids[e.key] || e.altKey || e.ctrlKey || e.metaKey) return;
    if (t && (t.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(t.tagName))) return;
    if (e.key === " " && t && t.tagName === "BUTTON") return;      // a focused button's own space press
    const button = document.getElementById(ids[e.key]);
    if (button) { e.preventDefault(); button.click(); }
  });
}"""
# "copy link to this step": the query string the server made, as a whole URL on this page, copied where allowed
LINK_JS = """(query) => {
  if (!query || !query.startsWith("?")) return query;
  const url = window.location.origin + window.location.pathname + query;
  if (navigator.clipboard) navigator.clipboard.writeText(url).catch(() => {});
  return url;
}"""


def _where(records, k, label, state, playing: bool = True) -> tuple[int, str | None, int, str | None]:
    """(step, phase, frame, mode) the page is at; a phase the step lacks is the whole step. While it plays the
    session knows (the page's slider and picker may lag a tick behind: a Pause read from them would play again);
    `playing=False` reads the page all the same (a phase just picked)."""
    anim = (state or {}).get("anim") or {}
    if playing and anim.get("mode") and anim["step"] < len(records):
        return anim["step"], anim["phase"], anim["frame"], anim["mode"]
    k = int(min(max(0, k or 0), len(records) - 1))
    phase = NAMES.get(label)
    if phase not in ph.phases(records[k]):
        return k, None, 0, None
    same = anim.get("step") == k and anim.get("phase") == phase
    frame = anim.get("frame", 0) if same else ph.frames(records[k], phase) - 1
    return k, phase, frame, anim.get("mode") if same else None


def show(state, k: int, phase: str | None, frame: int, mode: str | None, since: dict | None = None) -> list:
    """The page at step k in `phase` (None: the whole step) at `frame`; `mode` "play" or "phase" keeps the timer
    running (through everything, or to the phase's end). With `since` (the timer's tick): nothing, if a press moved
    the page meanwhile (a Pause must not be undone by a tick drawn at the same time)."""
    views = at(state, k, phase, frame, mode, since)
    return _unchanged() if views is None else values(views, OUTPUTS) + [state]


def at(state, k: int, phase: str | None, frame: int, mode: str | None, since: dict | None = None) -> dict | None:
    """`show`'s views (None: superseded, see `show`: checked before drawing, and after, as a trace opened or the
    presenter toggle may change the session meanwhile); the session's state notes where the page is, in place."""
    records, texts = state.get("records"), state.get("texts")     # read first: `anim` still `since` vouches for them
    if since is not None and state.get("anim") is not since:
        return None
    moved = (state.get("anim") or {}).get("step") != k       # another step: its icicle, mask and facts too
    shown = {"step": k, "phase": phase, "frame": frame, "mode": mode}
    views = step_views(None, records, k, texts, state) if phase is None or moved else {}
    if phase is not None:
        views |= _phase_views(records[k], texts, state, phase, frame)
    if since is not None and state.get("anim") is not since:
        return None
    state["anim"] = shown
    return views | {"slider": slider(records, k), "phase": WHOLE if phase is None else ph.TITLES[phase],
                    "anim_timer": gr.Timer(active=mode is not None), "play": PAUSE if mode == "play" else PLAY}


def _phase_views(record, texts, state, phase: str, frame: int) -> dict:
    style = PRESENTER_TREE if state.get("presenter") else {"height": TREE_HEIGHT}
    fig = ph.figure(record, texts, phase, frame, **style)
    return presented({"tree": fig, "caption": ph.caption(record, texts, phase, frame, state.get("method", ""))}, state)


def _in_turn(handler):
    """`handler` under its session's lock: one press or tick of a session at a time, each from where the one before
    left the page (other sessions are not held up)."""
    @functools.wraps(handler)
    def in_turn(*args):
        state = args[-1]
        if not isinstance(state, dict):
            return handler(*args)
        with state.setdefault("anim_lock", threading.Lock()):
            return handler(*args)
    return in_turn


def _unchanged() -> list:
    return values({}, OUTPUTS) + [gr.skip()]


def _following(records, k: int, phase: str | None) -> tuple[int, str] | None:
    """The phase after `phase` at step k (the next step's first after the last); None at the run's end."""
    steps = ph.phases(records[k])
    if phase is None:
        return k, steps[0]
    if steps.index(phase) + 1 < len(steps):
        return k, steps[steps.index(phase) + 1]
    return (k + 1, ph.phases(records[k + 1])[0]) if k + 1 < len(records) else None


@_in_turn
def next_phase(k, label, state) -> list:
    """→: the next phase (or the next step's first), played to its end."""
    records = (state or {}).get("records")
    if not records:
        return _unchanged()
    k, phase, _, _ = _where(records, k, label, state)
    after = _following(records, k, phase)
    if after is None:
        return show(state, k, phase, ph.frames(records[k], phase) - 1 if phase else 0, None)
    return show(state, *after, 0, "phase")


@_in_turn
def prev_phase(k, label, state) -> list:
    """←: the previous phase, drawn complete (from the first phase: the whole step; from there the step before's
    last phase)."""
    records = (state or {}).get("records")
    if not records:
        return _unchanged()
    k, phase, _, _ = _where(records, k, label, state)
    steps = ph.phases(records[k])
    if phase is None:
        if k == 0:
            return show(state, 0, None, 0, None)
        k, phase = k - 1, ph.phases(records[k - 1])[-1]
    elif steps.index(phase) == 0:
        return show(state, k, None, 0, None)
    else:
        phase = steps[steps.index(phase) - 1]
    return show(state, k, phase, ph.frames(records[k], phase) - 1, None)


@_in_turn
def pick(k, label, state) -> list:
    """A phase chosen in the picker: played from its first frame (the whole step: drawn at once)."""
    records = (state or {}).get("records")
    if not records:
        return _unchanged()
    k, phase, _, _ = _where(records, k, label, state, playing=False)
    return show(state, k, phase, 0, "phase" if phase else None)


@_in_turn
def play(k, label, state) -> list:
    """Play / Pause: plays frame by frame through the phases and the steps after this one."""
    records = (state or {}).get("records")
    if not records:
        return _unchanged()
    k, phase, frame, mode = _where(records, k, label, state)
    if mode == "play":
        return show(state, k, phase, frame, None)
    if phase is None:
        return show(state, k, ph.phases(records[k])[0], 0, "play")
    return show(state, k, phase, frame, "play")


@_in_turn
def tick(k, label, state) -> list:
    """The timer: one frame on; at a phase's end the next phase (playing) or a stop (one phase)."""
    records = (state or {}).get("records")
    if not records:
        return values({"anim_timer": gr.Timer(active=False)}, OUTPUTS) + [gr.skip()]
    since = state.get("anim")
    k, phase, frame, mode = _where(records, k, label, state)
    if mode is None or phase is None:
        return values({"anim_timer": gr.Timer(active=False), "play": PLAY}, OUTPUTS) + [gr.skip()]
    if frame + 1 < ph.frames(records[k], phase):
        return show(state, k, phase, frame + 1, mode, since)
    after = _following(records, k, phase) if mode == "play" else None
    if after is None:
        return show(state, k, phase, frame, None, since)
    return show(state, *after, 0, mode, since)


def open_url(state, request: gr.Request = None) -> list:
    """Page load: `?step=K&phase=P&view=V` (after `?trace=` opened a trace) opens that step, that phase drawn
    complete, and that tab (the tab and its name, kept for links)."""
    query = request.query_params if request is not None else {}
    view = query.get("view")
    tabs = [gr.Tabs(selected=view), view] if view in VIEWS else [gr.skip(), gr.skip()]
    records = (state or {}).get("records")
    if not records or ("step" not in query and "phase" not in query):
        return _unchanged() + tabs
    try:
        k = int(query.get("step", 0))
    except ValueError:
        k = 0
    k = min(max(0, k), len(records) - 1)
    phase = NAMES.get(query.get("phase") or "step", "unknown")
    if phase == "unknown" or (phase is not None and phase not in ph.phases(records[k])):
        gr.Warning(f"Step {k} has no phase {query.get('phase')!r}; it has {', '.join(ph.phases(records[k]))}.")
        phase = None
    frame = ph.frames(records[k], phase) - 1 if phase else 0
    return show(state, k, phase, frame, None) + tabs


def link(k, label, view, state) -> gr.Textbox:
    """The link box, shown, with the query string that opens this step, phase and tab of a shipped trace, or why
    there is none (the browser makes the query a whole URL and copies it)."""
    return gr.Textbox(value=_query(k, label, view, state), visible=True)


def _query(k, label, view, state) -> str:
    records = (state or {}).get("records")
    name = (state or {}).get("trace")
    if not records:
        return "Run, or open a trace, first: a link opens a step of a trace."
    if not name or not (state or {}).get("shipped") or name not in sharing.shipped():
        return ("A link opens a step of a shipped trace (assets/traces/), with no model. This run is not one: export "
                "it with \"Export the run (trace)\" and share the file; it opens with \"Open a trace\".")
    k, phase, _, _ = _where(records, k, label, state)
    query = f"?trace={name}&step={k}&phase={phase or 'step'}"
    query += f"&view={view}" if view in VIEWS else ""
    return query + ("&presenter=1" if state.get("presenter") else "")
