"""Faults: model pairs that cannot load, an unwritable cache folder, a missing n-gram table, a full disk while
converting the GGUF, interrupted checkpoint and shard writes. Each gives a clear message, the app stays up and its
embedded default still works, and nothing half-written is left to break the next start."""
import errno
import json
import warnings
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch

from core import costs, models
from core.config import MODEL_PAIRS, PairSpec
from core.dflash import random_drafter_for
from tests.conftest import tiny_pair, tiny_target

EMBEDDED = "embedded:smollm2-135m-instruct"


def broken_drafters(tmp_path: Path) -> dict[str, tuple[PairSpec, str]]:
    corrupt = tmp_path / "corrupt"
    random_drafter_for(models.load_target(EMBEDDED, dtype="bf16")[0], n_layers=1).save(corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x00" * 100)
    wrong = tmp_path / "wrong"
    random_drafter_for(tiny_target(), n_layers=1).save(wrong)              # made for a 64-wide target
    (tmp_path / "empty").mkdir()
    return {"missing-drafter": (PairSpec(EMBEDDED, str(tmp_path / "no" / "such" / "drafter")), "neither"),
            "corrupt-drafter": (PairSpec(EMBEDDED, str(corrupt)), "weights cannot be read"),
            "wrong-drafter": (PairSpec(EMBEDDED, str(wrong)), "hidden size"),
            "missing-target": (PairSpec(str(tmp_path / "empty"), str(wrong)), "cannot load target")}


def test_broken_pairs_fail_clearly_and_the_default_still_works(tmp_path, monkeypatch):
    import app
    from studio import handlers
    from studio.handlers import Form

    for name, (spec, message) in broken_drafters(tmp_path).items():
        monkeypatch.setitem(MODEL_PAIRS, name, spec)
        with pytest.raises(gr.Error, match=message):
            app.get_pair(name)
        assert name not in app.PAIRS                                        # nothing half-loaded is kept
    *_, last = handlers.run(Form("Say hello.", "DDTree", 16, 0.0, 1.0, 0, 8, 0, "smollm2-135m"), None)
    assert "τ" in last[3] and last[-1]["records"]


def test_unwritable_cache_folder(tmp_path, monkeypatch):
    import app

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DRAFT_TREE_CACHE", str(blocker / "cache"))
    with pytest.raises(models.ModelLoadError, match="DRAFT_TREE_CACHE"):
        models.embedded_target_dir()
    monkeypatch.setitem(MODEL_PAIRS, "uncached", PairSpec(EMBEDDED, None))
    with pytest.raises(gr.Error, match="not writable"):
        app.get_pair("uncached")
    # the measured cost curve is still returned when it cannot be cached
    monkeypatch.setattr(costs, "measure", lambda t, **_: {1: 2.0, 4: 3.0})
    assert costs.cost_curve(tiny_target(), blocker / "costs") == {1: 2.0, 4: 3.0}


def test_missing_ngram_table_falls_back_in_the_app(tmp_path, monkeypatch):
    from studio import handlers, state
    from studio.handlers import Form

    pair = tiny_pair()
    pair.ngram_table = tmp_path / "missing.npz"
    monkeypatch.setitem(state.PAIRS, "tiny-no-table", pair)
    shown = []
    monkeypatch.setattr(handlers.gr, "Warning", lambda message, *a, **k: shown.append(message))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        *_, last = handlers.run(Form("0 5 6 7 8", "PRESTO", 16, 0.0, 1.0, 0, 16, 0, "tiny-no-table"), None)
    assert last[-1]["records"] and shown and "n-gram table" in shown[0]
    pair.ngram_table = tmp_path / "corrupt.npz"
    pair.ngram_table.write_bytes(b"PK\x03\x04 a zip cut short")
    with pytest.raises(gr.Error):
        list(handlers.run(Form("0 5 6 7 8", "PRESTO", 16, 0.0, 1.0, 0, 16, 0, "tiny-no-table"), None))


class _FakeTokenizer:
    def save_pretrained(self, folder):
        Path(folder, "tokenizer.json").write_text("{}")


def test_disk_full_while_converting_leaves_nothing_behind(tmp_path, monkeypatch):
    import transformers

    gguf = tmp_path / "wheel" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("DRAFT_TREE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "smollm2_gguf_path", lambda: gguf)
    fake = tiny_target()
    fake.config.quantization_config = {"quant_method": "gguf"}
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: fake)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _FakeTokenizer())
    real_save = transformers.LlamaForCausalLM.save_pretrained

    def disk_full(self, folder, *a, **k):
        Path(folder, "model.safetensors").write_bytes(b"\x00" * 1000)      # half a file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(transformers.LlamaForCausalLM, "save_pretrained", disk_full)
    with pytest.raises(models.ModelLoadError, match="free disk space"):
        models.embedded_target_dir()
    assert list((tmp_path / "cache").iterdir()) == []                      # no partial folder, no temp folder
    monkeypatch.setattr(transformers.LlamaForCausalLM, "save_pretrained", real_save)
    fake.config.quantization_config = {"quant_method": "gguf"}
    out = models.embedded_target_dir()                                       # the next start converts cleanly
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [out.name]


def test_interrupted_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    import core.training.train

    from core.training.train import load_checkpoint, save_checkpoint

    drafter = random_drafter_for(tiny_target(), n_layers=1)
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-3)
    save_checkpoint(tmp_path, drafter, opt, {"step": 7, "epoch": 0, "best_tau": 0.0, "history": []})

    def crash(tensors, path, *a, **k):
        Path(path).write_bytes(b"\x00" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(core.training.train, "save_file", crash)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(1.0)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, drafter, opt, {"step": 9, "epoch": 0, "best_tau": 0.0, "history": []})
    monkeypatch.undo()
    fresh = random_drafter_for(tiny_target(), n_layers=1)
    state = load_checkpoint(tmp_path, fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-3))
    assert state["step"] == 7 and json.loads((tmp_path / "state.json").read_text())["step"] == 7


def test_truncated_data_shard_is_dropped_and_regenerated(tmp_path):
    from core.training.generate_data import done_keys, write_shard

    write_shard(tmp_path, 0, [{"key": "gsm8k_train:1", "ids": [1, 2, 3], "prompt_len": 1, "sampled": False}], 100)
    (tmp_path / "shard-00001.npz").write_bytes(b"PK\x03\x04 cut short")
    assert done_keys(tmp_path) == {"gsm8k_train:1"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-00000.npz"]
    assert np.load(tmp_path / "shard-00000.npz")["ids"].tolist() == [1, 2, 3]


def test_memory_caps_refuse_what_does_not_fit(monkeypatch):
    from core import limits
    from core.config import DecodeConfig
    from core.engine import check_inputs

    pair = tiny_pair()
    t = pair.target
    assert limits.step_bytes(t, 65, 100) < limits.step_bytes(t, 129, 100) < limits.step_bytes(t, 129, 400)
    allowance = limits.step_bytes(t, 33, 2048) + 1
    cap = limits.limits(t, allowance)
    assert limits.step_bytes(t, cap.max_budget + 1, 512) <= allowance     # the tiny window is 512 tokens
    assert cap.max_budget == 1024 or limits.step_bytes(t, cap.max_budget + 2, 512) > allowance
    monkeypatch.setattr(limits, "available_bytes", lambda device=None: 2 * limits.step_bytes(t, 17, 40))
    check_inputs(pair, [0, 5, 6], DecodeConfig(method="ddtree", budget=16, max_new_tokens=30))
    with pytest.raises(ValueError, match="lower the budget"):
        check_inputs(pair, [0, 5, 6], DecodeConfig(method="ddtree", budget=512, max_new_tokens=30))


def test_the_app_dtype_comes_from_the_environment_and_a_bad_one_is_named(monkeypatch):
    from studio import state

    seen = []
    monkeypatch.setattr(state, "load_pair", lambda name, dtype: seen.append(dtype) or tiny_pair())
    monkeypatch.setattr(state.COSTS, "start", lambda *a: None)
    monkeypatch.setitem(MODEL_PAIRS, "dtype-test", PairSpec(EMBEDDED, None))
    monkeypatch.delenv("DRAFT_TREE_DTYPE", raising=False)
    assert state.app_dtype() == "auto"
    monkeypatch.setenv("DRAFT_TREE_DTYPE", " FP32 ")
    assert state.app_dtype() == "fp32"
    state.get_pair("dtype-test")
    assert seen == ["fp32"]
    state.PAIRS.pop("dtype-test")
    monkeypatch.setenv("DRAFT_TREE_DTYPE", "double")
    with pytest.raises(ValueError, match="DRAFT_TREE_DTYPE is 'double': set it to auto, bf16, fp32 or fp16"):
        state.app_dtype()
    with pytest.raises(gr.Error, match="DRAFT_TREE_DTYPE"):                 # in the page: a message, not a crash
        state.get_pair("dtype-test")
    assert "dtype-test" not in state.PAIRS
