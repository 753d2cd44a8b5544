"""The app's trace handlers: a finished run exported as a trace file, and a trace opened by upload or by
`?trace=NAME` (a shipped one in assets/traces/) and replayed in every view with no model loaded. A bad file gets a
message that says what to do; the page stays up. The file format is `studio.trace`'s.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import gradio as gr

from core.config import DecodeConfig
from studio import trace as traces
from studio.state import fresh_state
from studio.views import DOWNLOADS, OUTPUTS, render, values

TRACES_DIR = Path(__file__).resolve().parent.parent / "assets" / "traces"
SUFFIX = ".json.gz"


def shipped() -> list[str]:
    """The names `?trace=` accepts: the traces in assets/traces/."""
    return sorted(p.name.removesuffix(SUFFIX) for p in TRACES_DIR.glob(f"*{SUFFIX}"))


def export(pair, prompt: str, cfg: DecodeConfig, records, prompt_tokens: int, ar_tps: float | None) -> str:
    """A finished run's trace file, for the page's export button."""
    data = traces.dumps(traces.from_run(pair, prompt, cfg, records, prompt_tokens, ar_tps))
    path = DOWNLOADS / f"trace-{cfg.method}-{len(records) - 1}-steps-{hashlib.sha1(data).hexdigest()[:10]}{SUFFIX}"
    path.write_bytes(data)
    return str(path)


def _show(trace: traces.Trace, name: str, state) -> list:
    """Every view of the trace, its settings said in the note and its prompt in the prompt box; the state replays
    it with no model (`trace`)."""
    settings, models = trace.settings, trace.models
    prompt = settings.get("prompt", "")
    prompt = prompt if len(prompt) <= 160 else prompt[:160].rsplit(" ", 1)[0] + "…"
    replay = fresh_state(state) | {"records": trace.records, "texts": dict(trace.texts), "trace": name,
                                   "method": settings.get("method", ""), "prompt_tokens": trace.prompt_tokens,
                                   "block_size": models.get("block_size"), "ar_tps": trace.ar_tps, "exact": None}
    state = _in_place(state, replay)
    note = (f"**Replaying the trace {name}** (no model needed): {settings.get('method')} with budget "
            f"{settings.get('budget')}, {models.get('pair')} in {models.get('dtype')}, temperature "
            f"{settings.get('temperature')}. Prompt: *{prompt}*. Timings are the "
            "recording machine's. Run decodes anew.")
    views = render(None, trace.records, state, trace.ar_tps, full=True)
    return values(views) + [state, note, settings.get("prompt", gr.skip())]


def _in_place(state, new: dict) -> dict:
    """The session's state dict made `new` (a presenter toggle running meanwhile writes to the same dict)."""
    if not isinstance(state, dict):
        return new
    state.clear()
    state.update(new)
    return state


def _refuse(message: str) -> list:
    gr.Warning(message)
    return values({}, OUTPUTS) + [gr.skip(), f"⚠ {message}", gr.skip()]


def open_file(path, state) -> list:
    """An uploaded trace file, replayed; a bad one is refused with a message."""
    if not path:
        return values({}, OUTPUTS) + [gr.skip()] * 3
    try:
        file = Path(path)
        if file.stat().st_size > traces.MAX_BYTES:
            raise traces.TraceError(f"The file is larger than {traces.MAX_BYTES // 2**20} MB: not a trace.")
        return _show(traces.loads(file.read_bytes()), file.name.removesuffix(SUFFIX), state)
    except traces.TraceError as e:
        return _refuse(str(e))


def open_named(state, request: gr.Request = None) -> list:
    """Page load: `?trace=NAME` opens the shipped trace NAME; no parameter, nothing happens."""
    name = request.query_params.get("trace") if request is not None else None
    if not name:
        return values({}, OUTPUTS) + [gr.skip()] * 3
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) or name not in shipped():
        return _refuse(f"No shipped trace is named {name[:64]!r}; the shipped ones are {', '.join(shipped())}. "
                       "Open one with ?trace=NAME, or upload a trace file.")
    try:
        out = _show(traces.loads((TRACES_DIR / f"{name}{SUFFIX}").read_bytes()), name, state)
        out[-3]["shipped"] = True                  # links to a step name it (`studio.animation.link`)
        return out
    except traces.TraceError as e:
        return _refuse(str(e))
