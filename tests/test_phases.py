"""The step as an animation: the four phases' frames and captions (viz.phases), and the page's handlers for
Prev/Next phase, Play, the timer, `?step=&phase=&view=` and links to a step (studio.animation)."""
from __future__ import annotations

import math
import threading
import time
import types

import gradio as gr
import numpy as np
import pytest

from core.presto import build_presto
from core.tree import path_to
from studio import animation, handlers, sharing, trace as traces
from studio.state import fresh_state
from tests.test_builders import marginals
from tests.test_presto import HashNgram
from tests.test_viz import synthetic_run
from viz import phases as ph
from viz import theme

TEXTS = {t: f"<t{t}>" for t in range(200)}


def _trace(name: str = "math"):
    return traces.loads((sharing.TRACES_DIR / f"{name}{sharing.SUFFIX}").read_bytes())


def test_each_step_has_the_phases_it_had():
    records = synthetic_run(budget=20, steps=2)
    assert ph.phases(records[0]) == ("walk",)                           # the prefill: the target's own token
    assert ph.phases(records[1]) == ph.PHASES
    plain = types.SimpleNamespace(step=3, draft_tokens=None, tree=types.SimpleNamespace(size=0))
    assert ph.phases(plain) == ("verify", "walk")


@pytest.mark.parametrize("budget", [5, 20, 60])
def test_the_build_reveals_nodes_in_pop_order_with_a_budget_counter(budget):
    r = synthetic_run(budget=budget, steps=1)[1]
    n = ph.frames(r, "build")
    assert n == min(r.tree.size, ph.BUILD_FRAMES) or n < ph.BUILD_FRAMES
    shown = []
    for f in range(n):
        fig = ph.figure(r, TEXTS, "build", f)
        nodes = next(t for t in fig.data if t.name.startswith("drafted node"))
        ring = next(t for t in fig.data if t.name == "just popped")
        shown.append(len(nodes.x) - 1)
        assert not any(t.name == "accepted path" for t in fig.data)     # nothing is verified yet
        assert f"node {shown[-1]} of {r.tree.size}" in fig.layout.title.text
        assert f"**{shown[-1]} of {r.tree.size}**" in ph.caption(r, TEXTS, "build", f)
        assert len(ring.x) == shown[-1] - (shown[-2] if f else 0)       # the ring marks this frame's pops
    assert shown == sorted(shown) and shown[-1] == r.tree.size and len(set(shown)) == n


def test_the_walk_goes_node_by_node_then_the_bonus_and_the_compaction():
    r = synthetic_run(budget=20, steps=1)[1]
    assert ph.frames(r, "walk") == len(r.accepted) + 1
    for f in range(len(r.accepted)):
        fig = ph.figure(r, TEXTS, "walk", f)
        path = next((t for t in fig.data if t.name == "accepted path"), None)
        assert len(path.x) == f + 1 if f else path is None or len(path.x) == 1
        assert not any(t.name.startswith("bonus") for t in fig.data)
    last = ph.figure(r, TEXTS, "walk", len(r.accepted))
    assert any(t.name.startswith("bonus") for t in last.data)
    words = ph.caption(r, TEXTS, "walk", len(r.accepted))
    kept = len(r.accepted)
    assert f"τ = {r.tau}" in words and f"keeps the {kept}" in words and f"other {r.tree.size + 1 - kept}" in words
    assert "accepted" in ph.caption(r, TEXTS, "walk", 0)
    assert "becomes the bonus" in ph.caption(r, TEXTS, "walk", len(r.accepted) - 1)


def test_the_draft_phase_shows_each_positions_top_candidates_with_q():
    r = synthetic_run(budget=20, steps=1, k=6)[1]
    fig = ph.figure(r, TEXTS, "draft", 0)
    heat = fig.data[0]
    n_pos = r.draft_tokens.shape[0]
    assert np.asarray(heat.z).shape == (min(6, ph.CANDIDATES), n_pos)
    best = int(np.argmax(r.draft_logq[0]))
    cell = heat.text[0][0]
    assert theme.label(TEXTS[int(r.draft_tokens[0, best])], 8) in cell
    assert f"{math.exp(r.draft_logq[0, best]):.2f}" in cell
    assert f"{n_pos} positions" in ph.caption(r, TEXTS, "draft", 0)


def test_presto_shows_the_ngram_term_beside_log_q():
    logq, tokens = marginals(3, n_pos=3, k=4)
    context, lam = [7, 8], 0.4
    tree = build_presto(logq, tokens, 12, 5, context, HashNgram(), lam=lam)
    terms = ph.ngram_terms(tree)
    for i in range(1, len(tree.tokens)):
        path = [tree.tokens[j] for j in path_to(tree, tree.parents[i])[1:]]
        expected = lam * HashNgram().logprobs((context + path)[-1:], [tree.tokens[i]])[0]
        assert terms[i] == pytest.approx(expected, abs=1e-9)
    r = synthetic_run(budget=12, steps=1)[1]
    r = types.SimpleNamespace(**{**vars(r), "tree": tree})
    words = ph.caption(r, TEXTS, "build", ph.frames(r, "build") - 1, "presto")
    assert "λ·log p_ngram" in words and f"{terms[len(tree.tokens) - 1]:.2f}" in words
    ddtree = synthetic_run(budget=12, steps=1)[1]
    assert "λ·log p_ngram" not in ph.caption(ddtree, TEXTS, "build", 0, "ddtree")


def _state(name="math"):
    t = _trace(name)
    state = fresh_state(None) | {"records": t.records, "texts": dict(t.texts), "trace": name, "shipped": True,
                                 "method": t.settings["method"]}
    return t, state


def _at(out) -> tuple[int, str]:
    """(slider step, phase label) a handler's output puts on the page."""
    views = dict(zip(animation.OUTPUTS, out[:-1]))
    return views["slider"].value, views["phase"]


def _with_a_build():
    """The story trace's session and its first step whose build has more than two frames."""
    t, state = _state("story-ddtree64")
    return t, state, next(i for i, r in enumerate(t.records) if ph.frames(r, "build") > 2)


def test_next_and_prev_walk_the_phases_and_the_steps():
    t, state = _state()
    k = next(i for i, r in enumerate(t.records) if ph.phases(r) == ph.PHASES and i + 1 < len(t.records))
    label = animation.WHOLE
    seen = []
    for _ in range(len(ph.PHASES) + 1):
        out = animation.next_phase(k, label, state)
        k, label = _at(out)
        seen.append((k, label))
    assert [s[1] for s in seen[:4]] == [ph.TITLES[p] for p in ph.PHASES]
    assert seen[4] == (seen[0][0] + 1, ph.TITLES[ph.phases(t.records[seen[0][0] + 1])[0]])   # then the next step
    out = animation.prev_phase(k, label, state)                       # back: this step whole, then
    assert _at(out) == (k, animation.WHOLE)
    out = animation.prev_phase(*_at(out), state)                      # the step before's walk, complete
    assert _at(out) == (seen[0][0], ph.TITLES["walk"])
    assert state["anim"]["frame"] == ph.frames(t.records[seen[0][0]], "walk") - 1


def test_play_runs_frame_by_frame_and_a_phase_stops_at_its_end():
    t, state, k = _with_a_build()
    out = animation.pick(k, ph.TITLES["build"], state)               # the picker plays the phase once
    frames = [state["anim"]["frame"]]
    while state["anim"]["mode"]:
        out = animation.tick(*_at(out), state)
        frames.append(state["anim"]["frame"])
    last = ph.frames(t.records[k], "build") - 1
    assert frames == list(range(last + 1)) + [last]                       # the last tick stops on the last frame
    assert _at(out) == (k, ph.TITLES["build"])
    out = animation.play(k, ph.TITLES["build"], state)               # Play goes on into the next phases
    assert dict(zip(animation.OUTPUTS, out[:-1]))["play"] == animation.PAUSE
    for _ in range(3):
        out = animation.tick(*_at(out), state)
    assert _at(out)[1] in (ph.TITLES["verify"], ph.TITLES["walk"])
    out = animation.play(*_at(out), state)                            # Pause
    assert state["anim"]["mode"] is None and dict(zip(animation.OUTPUTS, out[:-1]))["play"] == animation.PLAY


def test_pause_and_ticks_read_the_session_while_the_page_lags_behind():
    """A tick or a Pause sent before the last tick's answer reached the page carries the step and phase before it:
    the tick goes on from where the session is and the Pause pauses (read from the page, it would play again)."""
    t, state = _state("story-ddtree64")
    k = next(i for i, r in enumerate(t.records) if ph.phases(r) == ph.PHASES and i + 1 < len(t.records))
    stale = (k, ph.TITLES["walk"])
    out = animation.play(*stale, state)
    for _ in range(ph.frames(t.records[k], "walk") + 1):               # on into the next step
        out = animation.tick(*stale, state)
    assert _at(out)[0] == k + 1 and state["anim"]["mode"] == "play"
    out = animation.play(*stale, state)                                # Pause, pressed on the lagging page
    assert state["anim"]["mode"] is None and _at(out)[0] == k + 1
    assert dict(zip(animation.OUTPUTS, out[:-1]))["play"] == animation.PLAY
    animation.play(*_at(out), state)                                   # playing again, the slider moved by hand:
    handlers.show_step(0, None, state)
    out = animation.tick(k + 1, ph.TITLES["draft"], state)             # the next tick stops the timer
    views = dict(zip(animation.OUTPUTS, out[:-1]))
    assert views["play"] == animation.PLAY and state["anim"]["step"] == 0 and not state["anim"]["mode"]


def test_a_pause_drawn_while_a_tick_comes_in_is_where_the_tick_answers_from(monkeypatch):
    """A session's presses and ticks take turns: a tick that arrives while a Pause is drawn waits, then finds the
    session paused and only stops the timer. Run side by side, it would draw the next frame and turn the timer on
    again, and the page would keep whichever answer came last, not where the session is."""
    t, state, k = _with_a_build()
    animation.play(k, ph.TITLES["build"], state)
    frame = state["anim"]["frame"]
    drawing, draw = threading.Event(), animation._phase_views

    def slow_for_the_pause(*args):
        if threading.current_thread().name == "pause":
            drawing.set()
            time.sleep(0.5)
        return draw(*args)

    monkeypatch.setattr(animation, "_phase_views", slow_for_the_pause)
    answers = {}
    pause = threading.Thread(target=lambda: answers.update(pause=animation.play(k, ph.TITLES["build"], state)),
                             name="pause")
    tick = threading.Thread(target=lambda: answers.update(tick=animation.tick(k, ph.TITLES["build"], state)))
    pause.start()
    assert drawing.wait(10)
    tick.start()
    pause.join(10), tick.join(10)
    assert set(answers) == {"pause", "tick"}                           # both answered (neither raised nor hung)
    paused, ticked = (dict(zip(animation.OUTPUTS, answers[name][:-1])) for name in ("pause", "tick"))
    assert paused["play"] == animation.PLAY and state["anim"]["mode"] is None and state["anim"]["frame"] == frame
    assert not ticked["anim_timer"].active and ticked["play"] == animation.PLAY
    assert all(isinstance(ticked[name], type(gr.skip())) for name in ("tree", "caption", "slider"))


def test_a_superseded_tick_draws_nothing(monkeypatch):
    """A tick whose session moved on (a press, a trace opened, a step picked) before it began drawing answers with
    nothing and draws nothing: the records it would draw from may no longer be the ones it read."""
    t, state, k = _with_a_build()
    animation.pick(k, ph.TITLES["build"], state)
    drawn = []
    monkeypatch.setattr(animation, "_phase_views", lambda *args: drawn.append(args) or {})
    monkeypatch.setattr(animation, "step_views", lambda *args: drawn.append(args) or {})
    assert animation.at(state, k, "build", 1, "phase", since=dict(state["anim"])) is None
    assert not drawn and state["anim"]["frame"] == 0
    assert animation.at(state, k, "build", 1, "phase", since=state["anim"]) is not None and state["anim"]["frame"] == 1


def test_a_trace_opened_or_a_run_keeps_the_sessions_turns():
    """The session's lock outlives a new run's or an opened trace's fresh state: a press drawn meanwhile and the
    next one still take turns."""
    t, state = _state("story-ddtree64")
    animation.pick(0, ph.TITLES["build"], state)
    lock = state["anim_lock"]
    assert fresh_state(state)["anim_lock"] is lock and "anim_lock" not in fresh_state(None)
    sharing.open_named(state, _request({"trace": "math"}))
    assert state["anim_lock"] is lock and state["trace"] == "math"


def _request(query: dict):
    return types.SimpleNamespace(query_params=query)


def test_a_url_opens_its_step_phase_and_tab_and_a_link_names_them():
    t, state = _state()
    k = next(i for i, r in enumerate(t.records) if "build" in ph.phases(r) and i > 3)
    out = animation.open_url(state, _request({"trace": "math", "step": str(k), "phase": "build", "view": "how"}))
    *views, _, tabs, view = out
    assert _at(views + [None]) == (k, ph.TITLES["build"]) and view == "how"
    assert state["anim"]["frame"] == ph.frames(t.records[k], "build") - 1          # the phase drawn complete
    box = animation.link(k, ph.TITLES["build"], "how", state)
    assert box.value == f"?trace=math&step={k}&phase=build&view=how"
    uploaded = dict(state, shipped=False)
    assert "not one" in animation.link(k, ph.TITLES["build"], "how", uploaded).value


def test_a_url_phase_the_step_lacks_falls_back_to_the_whole_step(monkeypatch):
    t, state = _state()
    warned = []
    monkeypatch.setattr(gr, "Warning", lambda message: warned.append(message))
    out = animation.open_url(state, _request({"step": "0", "phase": "build"}))
    assert _at(out[:-2]) == (0, animation.WHOLE) and "has no phase 'build'" in warned[0]
    out = animation.open_url(state, _request({"step": "many", "phase": "nonsense"}))
    assert _at(out[:-2]) == (0, animation.WHOLE)


def test_a_trace_keeps_the_drafters_top_candidates_for_the_draft_phase():
    t = _trace("math")
    drafted = [r for r in t.records if r.draft_tokens is not None]
    assert drafted and all(r.draft_logq is not None and r.draft_logq.shape[1] == traces.CANDIDATES for r in drafted)
    assert all(ph.shown_ids(r) <= t.texts.keys() for r in t.records)             # every candidate's text is there
