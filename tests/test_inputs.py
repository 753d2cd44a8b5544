"""Bad input gets a clear error (ValueError / ModelLoadError with what to do), never a crash deep inside."""
import math
import subprocess
import sys

import pytest
import torch

from core.config import DecodeConfig
from core.dflash import random_drafter_for
from core.engine import run
from core.models import ModelLoadError, ModelPair, check_compatible, load_drafter, load_pair
from tests.conftest import IdTokenizer, tiny_pair, tiny_target


@pytest.mark.parametrize("kwargs,match", [
    ({"budget": 0}, "budget"), ({"budget": 10**6}, "budget"), ({"budget": 3.5}, "budget"),
    ({"temperature": -1}, "temperature"), ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"max_new_tokens": 0}, "max_new_tokens"), ({"method": "beam"}, "method"),
    ({"block_size": 64}, "block_size"), ({"lam": -0.1}, "lambda"), ({"lam": math.nan}, "lambda"),
    ({"beam_width": 0}, "beam_width"), ({"ngram_order": 0}, "ngram_order"), ({"seed": -3}, "seed"),
])
def test_bad_settings_are_rejected_clearly(pair, kwargs, match):
    with pytest.raises(ValueError, match=match):
        run(pair, [0, 4, 5], DecodeConfig(**kwargs))


def test_empty_and_too_long_prompts(pair):
    with pytest.raises(ValueError, match="empty"):
        run(pair, [], DecodeConfig())
    with pytest.raises(ValueError, match="context window"):
        run(pair, [3] * 600, DecodeConfig())


def test_prompt_near_the_window_stops_cleanly(pair):
    records = run(pair, [3] * 505, DecodeConfig(budget=32, max_new_tokens=100))
    assert records[-1].finish in ("context", "stop")
    assert 505 + sum(len(r.committed) for r in records) <= 512


def test_speculative_method_without_drafter():
    p = tiny_pair()
    p = ModelPair(p.name, p.target, IdTokenizer(), None, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="needs a drafter"):
        run(p, [0, 4], DecodeConfig(method="ddtree"))
    assert run(p, [0, 4], DecodeConfig(method="ar", max_new_tokens=3))


def test_unknown_pair_and_incompatible_drafters(tmp_path):
    with pytest.raises(ModelLoadError, match="unknown model pair"):
        load_pair("no-such-pair")
    target = tiny_target()
    wide = tiny_target(layers=2)
    wide.config.hidden_size = 128
    with pytest.raises(ModelLoadError, match="hidden size"):
        check_compatible(random_drafter_for(tiny_target()), wide)
    d = random_drafter_for(target, mask_token_id=96)
    with pytest.raises(ModelLoadError, match="mask token"):
        check_compatible(d, target)
    with pytest.raises(ModelLoadError, match="neither a local folder nor a hub id"):
        load_drafter("no/such/drafter/folder", target)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="config.json"):
        load_drafter(tmp_path, target)
    random_drafter_for(target).save(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(ModelLoadError, match="weights cannot be read"):
        load_drafter(tmp_path, target)


def test_cli_help_and_bad_flags():
    out = subprocess.run([sys.executable, "-m", "core.generate", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--budget" in out.stdout and "--temperature" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "core.generate", "--prompt", "hi", "--top-p", "2"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "top_p" in bad.stderr and "Traceback" not in bad.stderr


def test_a_budget_typed_out_of_range_gets_a_note_not_an_error(monkeypatch):
    """The page's status handler takes the budget box's raw value (the box holds 9999 until it is left): it names the
    range and what the box will set, and never raises."""
    from studio import handlers, state

    monkeypatch.setitem(state.PAIRS, "tiny", tiny_pair())
    for typed, kept in ((9999, handlers.PAGE_MAX_BUDGET), (0, 1), (-3.5, 1)):
        note = handlers.refresh("DDTree", typed, "tiny")[1]
        assert f"B = {typed:g} is out of range" in note and f"sets it to {kept}." in note, note
    assert "out of range" not in handlers.refresh("DDTree", 64, "tiny")[1]
    assert "out of range" not in handlers.refresh("DDTree", 63.5, "tiny")[1]          # a fraction, in range
    assert "out of range" not in handlers.refresh("DDTree", None, "tiny")[1]          # an emptied box
