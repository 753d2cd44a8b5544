"""Shareable traces (`studio.trace`): a run exported and re-imported is the same run, and a bad file of any kind is
refused with a message that says what to do."""
import gzip
import json
import math

import numpy as np
import pytest

from core.config import DecodeConfig
from studio import trace as traces
from studio.trace import TraceError
from tests.conftest import tiny_pair


@pytest.fixture(scope="module")
def recorded():
    return traces.record(tiny_pair(), "0 5 6 7 8", DecodeConfig(method="ddtree", budget=16, max_new_tokens=24))


def _same_float(a, b) -> bool:
    return math.isclose(a, b, abs_tol=10 ** -traces.DIGITS)


def test_an_exported_trace_reimports_equal(recorded):
    data = traces.dumps(recorded)
    assert data[:2] == b"\x1f\x8b"                                               # gzip
    header = json.loads(gzip.decompress(data))
    assert header["schema"] == traces.SCHEMA and header["version"] == traces.VERSION
    back = traces.loads(data)
    assert back.settings == recorded.settings and back.models == recorded.models
    assert back.texts == recorded.texts and back.prompt_tokens == recorded.prompt_tokens
    assert len(back.records) == len(recorded.records) > 2
    for a, b in zip(recorded.records, back.records):
        for name in ("step", "accepted", "bonus", "committed", "text", "nested", "oracle_depth", "budget_used",
                     "finish"):
            assert getattr(a, name) == getattr(b, name), name
        assert a.tree.tokens == b.tree.tokens and a.tree.parents == b.tree.parents and a.tree.depths == b.tree.depths
        assert a.tree.ranks == b.tree.ranks and a.tree.origin == b.tree.origin
        assert all(map(_same_float, a.tree.prefix_logq + a.tree.logq + a.tree.score + a.p_committed,
                       b.tree.prefix_logq + b.tree.logq + b.tree.score + b.p_committed))
        assert a.seconds.keys() == b.seconds.keys() and a.tau == b.tau
        assert (a.draft_tokens is None) == (b.draft_tokens is None)
        if a.draft_tokens is not None:
            assert np.array_equal(a.draft_tokens, b.draft_tokens)
        assert [t for t, _ in a.runner_up] == [t for t, _ in b.runner_up]
    assert traces.dumps(back) == data                                          # a second round trip is exact


def _gz(body) -> bytes:
    return gzip.compress(json.dumps(body).encode())


@pytest.mark.parametrize("bad, says", [
    (b"", "truncated or corrupt"),
    (b"\x1f\x8b\x08\x00garbage", "truncated or corrupt"),
    (b"PK\x03\x04 a zip file", "truncated or corrupt"),
    (_gz({"hello": "world"}), "not a draft-tree trace"),
    (_gz([1, 2, 3]), "not a draft-tree trace"),
    (_gz({"schema": "draft-tree-trace", "version": 99}), "Update the app"),
    (_gz({"schema": "draft-tree-trace", "version": 1}), "damaged"),
])
def test_a_bad_file_gets_a_message_that_says_what_to_do(bad, says):
    with pytest.raises(TraceError, match=says):
        traces.loads(bad)


def test_a_truncated_or_tampered_trace_gets_a_message(recorded):
    data = traces.dumps(recorded)
    with pytest.raises(TraceError, match="truncated or corrupt"):
        traces.loads(data[: len(data) // 2])
    body = json.loads(gzip.decompress(data))
    body["records"] = body["records"][1:]                                      # the prefill is gone
    with pytest.raises(TraceError, match="out of order"):
        traces.loads(_gz(body))
    body = json.loads(gzip.decompress(data))
    body["texts"] = {}
    with pytest.raises(TraceError, match="lacks the text"):
        traces.loads(_gz(body))
    body = json.loads(gzip.decompress(data))
    body["records"][1]["tree"]["parents"] = [5] * len(body["records"][1]["tree"]["parents"])   # not a tree
    with pytest.raises(TraceError, match="damaged"):
        traces.loads(_gz(body))


def test_a_trace_replays_every_view_with_no_model_and_a_bad_upload_is_refused(recorded, tmp_path, monkeypatch):
    from studio import handlers, sharing, state
    from studio.views import OUTPUTS, STEP_VIEWS

    def no_model(name):
        raise AssertionError("a trace must replay without loading a model")

    monkeypatch.setattr(state, "load_pair", no_model)
    monkeypatch.setattr(state, "PAIRS", {})
    path = tmp_path / "mine.json.gz"
    path.write_bytes(traces.dumps(recorded))
    out = sharing.open_file(str(path), None)
    views, session, note, prompt = dict(zip(OUTPUTS, out)), out[-3], out[-2], out[-1]
    assert "Replaying the trace mine" in note and session["trace"] == "mine"
    assert prompt == recorded.settings["prompt"]                              # the prompt box shows its prompt
    assert len(views["tree"].data[1].x) == len(recorded.records[views["slider"].value].tree.tokens)
    assert "τ" in views["metrics"] and views["tau_fig"].data and "Step" in views["caption"]
    shown = dict(zip(STEP_VIEWS, handlers.show_step(1, "smollm2-135m", session)))   # the slider, still no model
    assert "step 1:" in shown["tree"].layout.title.text
    assert handlers.present(True, False, "smollm2-135m", session)[-1]["presenter"] == "light"
    path.write_bytes(b"\x1f\x8b\x08 not really")
    refused = sharing.open_file(str(path), session)
    assert refused[-2].startswith("⚠") and "truncated or corrupt" in refused[-2]


def test_the_shipped_traces_open_and_a_256_token_ddtree_64_one_is_under_1_mb():
    from studio import sharing

    assert {"math", "code", "chat", "story", "story-ddtree64"} <= set(sharing.shipped())
    for name in sharing.shipped():
        data = (sharing.TRACES_DIR / f"{name}{sharing.SUFFIX}").read_bytes()
        trace = traces.loads(data)
        assert trace.models["pair"] == "smollm2-135m" and len(data) < 1_000_000, name
    big = traces.loads((sharing.TRACES_DIR / "story-ddtree64.json.gz").read_bytes())
    assert big.settings["method"] == "ddtree" and big.settings["budget"] == 64
    assert sum(len(r.committed) for r in big.records) == 256                   # measured: 203 KB


def test_a_finished_run_in_the_app_exports_a_trace_that_reopens_as_the_same_run(monkeypatch):
    from studio import handlers, sharing, state
    from studio.handlers import Form
    from studio.views import OUTPUTS

    monkeypatch.setattr(handlers, "UPDATE_INTERVAL", 0.0)
    monkeypatch.setitem(state.PAIRS, "tiny", tiny_pair())
    final = list(handlers.run(Form("0 5 6 7 8", "DDTree", 16, 0.0, 1.0, 0, 16, 0, "tiny"), None))[-1]
    path, session = dict(zip(OUTPUTS, final))["trace_file"], final[-1]
    assert path.endswith(".json.gz")
    out = sharing.open_file(path, None)
    replayed = out[-3]["records"]
    assert [r.committed for r in replayed] == [r.committed for r in session["records"]]
    assert out[-3]["method"] == "ddtree" and out[-3]["ar_tps"] == pytest.approx(session["ar_tps"])
