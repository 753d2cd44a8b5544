"""What long commands say while they run: the dtype they compute in and why (default auto, as `core.hardware`
chooses), and progress bars with an ETA, all on stderr, so that stdout holds the same results as before."""
import json
import re

import pytest
import torch

import core.eval.benchmark
import core.eval.judge
import core.hardware
import core.models
from core.hardware import DtypeChoice, cpu_summary
from tests.conftest import tiny_pair

BAR_WITH_ETA = r"{done}/{total} \[\d\d:\d\d<\d\d:\d\d"      # tqdm's "n/total [elapsed<remaining"


@pytest.fixture
def toy(tmp_path):
    prompts = tmp_path / "toy.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["0 5 6 7", "9 8 7 6 5"]))
    return prompts


def test_dtype_defaults_to_autos_choice_and_says_why(toy, capsys, monkeypatch):
    from core.eval.judge import main

    monkeypatch.setattr(core.eval.benchmark, "auto_dtype", lambda device_type="cpu": DtypeChoice(torch.bfloat16,
                                                                                           "bf16: stub"))
    asked = []
    monkeypatch.setattr(core.eval.judge, "load_pair", lambda name, dtype: asked.append(dtype) or tiny_pair())
    args = ["--drafters", "a", "--datasets", str(toy), "--n", "1", "--methods", "chain", "--max-new-tokens", "4"]
    for extra, line in [([], "dtype bf16 (bf16: stub)"),
                        (["--dtype", "fp32"], "dtype fp32 (--dtype fp32; auto would choose bf16: stub)"),
                        (["--dtype", "bfloat16"], "dtype bf16 (--dtype bf16)")]:
        main(args + extra, drafters={"a": tiny_pair().drafter})
        assert f"{line} on {cpu_summary()}\n" in capsys.readouterr().err
    assert asked == ["auto", "fp32", "bf16"]
    monkeypatch.undo()
    assert core.models.resolve_dtype("auto", "cpu") == core.hardware.auto_dtype("cpu").dtype


def test_judge_and_diagnose_show_progress_on_stderr_only(toy, capsys):
    from core.eval import diagnose, judge

    pair = tiny_pair()
    rows = judge.main(["--drafters", "a", "--datasets", str(toy), "--n", "2", "--methods", "chain",
                       "--max-new-tokens", "8"], pair=pair, drafters={"a": pair.drafter})
    out, err = capsys.readouterr()
    assert out == judge.table(rows, ["a"]) + "\n"
    assert re.search(BAR_WITH_ETA.format(done=2, total=2), err) and "toy" in err
    assert err.startswith(f"dtype fp32 (the pair given) on {cpu_summary()}\n")
    result = diagnose.main(["--datasets", str(toy), "--n", "2", "--max-new-tokens", "8"], pair=pair)
    out, err = capsys.readouterr()
    assert out == f"\n{toy}, 2 prompts\n\n{diagnose.report(result[str(toy)])}\n"
    assert re.search(BAR_WITH_ETA.format(done=2, total=2), err)


def test_benchmark_progress_counts_resumed_runs_as_done(toy, tmp_path, capsys):
    from core.eval.benchmark import main

    args = ["--datasets", str(toy), "--n", "2", "--max-new-tokens", "8", "--out", str(tmp_path / "out")]
    main(args + ["--methods", "chain"], pair=tiny_pair())
    capsys.readouterr()
    main(args + ["--methods", "chain,ddtree"], pair=tiny_pair())           # ar and chain resumed, ddtree run
    out, err = capsys.readouterr()
    assert re.search(BAR_WITH_ETA.format(done=6, total=6), err) and not re.search(r"\d/\d \[", out)
    assert (tmp_path / "out" / "table.md").read_text().startswith(f"dtype fp32 (the pair given) on {cpu_summary()}")
