"""Benchmark methods and budgets on prompt sets, with plain decoding of the same prompts in the same run.

    python -m core.eval.benchmark --datasets gsm8k --n 30 --methods ar,chain,ddtree --budgets 64 --max-new-tokens 256

Methods: the engine's (ar, chain, ddtree, presto, presto-beam, hybrid, ddtree-auto, presto-auto, hybrid-auto) and,
on the same target and prompts, `hf-generate` (transformers generate), `hf-prompt-lookup` (transformers prompt-lookup
decoding) and `dflash-official` (z-lab's vanilla DFlash on the same drafter, when the `dflash` package is importable).
Datasets: gsm8k, humaneval, mt-bench (both turns, as in DFlash's benchmark: the second turn continues the chat
after plain decoding's first reply, so every method sees the same context), mt-bench-first (first turns only),
compmath and science (the project's own breadth sets, `core.eval.datasets`), or a local .jsonl with a prompt field.
Per prompt, every (method, budget) runs back to back after plain decoding (`ar`), after one warm-up generation.
Rows (one per prompt x method x budget x temperature) go to `<out>/rows.jsonl` as they finish, so an interrupted
run resumes where it stopped. The summary table (τ = mean of per-prompt means, bonus counted; speed-up = the
baseline's time per output token ÷ the method's over the same prompts, prefill excluded) is printed as markdown and
written to `<out>/table.md`, under a line naming the dtype and the machine; figures (τ and speed-up against budget,
acceptance histogram, time split) go to `<out>/figures/` as HTML and PNG.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from itertools import product
from pathlib import Path

import torch
from tqdm import tqdm

from core.config import AUTO_METHODS, METHODS, TREE_METHODS, DecodeConfig
from core.divergence import first_difference, flatten
from core.engine import run
from core.eval.baselines import BASELINES, run_baseline
from core.eval.datasets import load_prompts, mtbench_questions, subset
from core.eval.figures import write_figures
from core.hardware import DtypeChoice, auto_dtype, cpu_summary
from core.models import default_offline, encode_messages, load_drafter, load_pair, resolve_device, resolve_dtype
from core.records import summarize

SWEPT = ("presto", "presto-beam")   # methods run once per --lams value
DRAFTING = ("chain",) + TREE_METHODS   # methods run once per --readouts value
DTYPES = ("auto", "bf16", "fp32", "fp16")
DTYPE_ALIASES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}     # as older commands spell them
DTYPE_HELP = ("auto (default): bf16 on CUDA and on CPUs that compute it natively (AVX512-BF16 or AMX), fp32 on "
              "other CPUs, where emulated bf16 makes a tree forward several times dearer")
PROGRESS_SECONDS = 5.0     # between progress-bar updates: enough for a terminal, few lines in a nohup log


def add_dtype_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dtype", default="auto", choices=DTYPES, type=lambda s: DTYPE_ALIASES.get(s, s),
                    help=DTYPE_HELP)


def announce_dtype(requested: str, pair=None):
    """(DtypeChoice, line): the dtype a run computes in, why, and on what, printed to stderr at its start, since
    bf16 on a CPU that emulates it is several times slower. "auto" is `core.hardware.auto_dtype`'s choice for the
    device; `pair`: an already loaded pair, whose dtype rules."""
    if pair is not None:
        choice, device = DtypeChoice(pair.dtype, "the pair given"), pair.device
    else:
        device = resolve_device("auto")
        auto = auto_dtype(device.type)
        choice = auto if requested == "auto" else DtypeChoice(resolve_dtype(requested), f"--dtype {requested}" + (
            "" if requested == auto.name else f"; auto would choose {auto.reason}"))
    where = f"{torch.cuda.get_device_name(device)}, CPU {cpu_summary()}" if device.type == "cuda" else cpu_summary()
    line = f"dtype {choice.name} ({choice.reason}) on {where}"
    print(line, file=sys.stderr)
    return choice, line


def progress(iterable=None, **kwargs) -> tqdm:
    """A progress bar with elapsed time and, given a length, an ETA; on stderr, so stdout keeps only results."""
    return tqdm(iterable, file=sys.stderr, dynamic_ncols=True, mininterval=PROGRESS_SECONDS, **kwargs)


def row_for(dataset: str, index: int, cfg: DecodeConfig, records, ar_tpot: float | None,
            label: str | None = None) -> dict:
    """One prompt's row; `label` names the method in tables (e.g. "presto λ=0.1" in a λ sweep)."""
    s = summarize([records])
    tpot = s.decode_seconds / max(1, s.tokens - 1)
    row = {"dataset": dataset, "prompt": index, "method": label or cfg.method, "budget": _budget(cfg),
           "temperature": cfg.temperature, "tau": s.tau if s.steps else 1.0, "tokens": s.tokens, "steps": s.steps,
           "decode_s": s.decode_seconds, "prefill_s": s.prefill_seconds, "tpot": tpot,
           "speedup": (ar_tpot / tpot) if ar_tpot else None, "expected_tau": s.expected_tau,
           "oracle_tau": s.oracle_tau, "histogram": s.histogram, "depth_rates": s.depth_rates,
           "phase_shares": s.phase_shares, "output": [t for r in records for t in r.committed],
           "runner_up": flatten(records)[2]}       # greedy: per token, the target's second choice and the gap
    if cfg.method in AUTO_METHODS:
        row["budgets_chosen"] = [r.budget_used for r in records if r.draft_tokens is not None]
    return row


def baseline_row(dataset: str, index: int, cfg: DecodeConfig, run, ar_tpot: float | None,
                 label: str | None = None) -> dict:
    """A row for a baseline outside the engine (`core.eval.baselines`): same fields, no per-step detail."""
    tokens = len(run.output)
    tpot = run.decode_s / max(1, tokens - 1)
    return {"dataset": dataset, "prompt": index, "method": label or cfg.method, "budget": 0,
            "temperature": cfg.temperature,
            "tau": run.tau, "tokens": tokens, "steps": run.forwards, "decode_s": run.decode_s,
            "prefill_s": run.prefill_s, "tpot": tpot, "speedup": (ar_tpot / tpot) if ar_tpot else None,
            "expected_tau": None, "oracle_tau": None, "histogram": {}, "depth_rates": [], "phase_shares": {},
            "output": run.output}


def _budget(cfg: DecodeConfig) -> int:
    return cfg.budget if cfg.method in TREE_METHODS else 0     # 0: the method has no budget (shown as –)


def _speedup(group: list[dict], base: dict) -> str:
    pairs = [(base[r["prompt"]]["tpot"], r["tpot"]) for r in group if r["prompt"] in base]
    if not pairs:
        return "–"
    return f"{statistics.mean(b for b, _ in pairs) / statistics.mean(m for _, m in pairs):.2f}×"


def table(rows: list[dict]) -> str:
    """Markdown: per dataset, temperature and (method, budget): τ (mean of per-prompt means), speed-up against
    plain decoding and against `transformers` generate (mean baseline TPOT ÷ mean method TPOT over the same
    prompts), tokens/s, and how many outputs equal plain decoding's."""
    out = ["| dataset | T | method | budget | prompts | τ | oracle τ | speed-up vs plain | vs HF generate | tokens/s "
           "| tree build share | same output as plain |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    keys = sorted({(r["dataset"], r["temperature"], r["method"], r["budget"]) for r in rows},
                  key=lambda k: (k[0], k[1], k[2] != "ar", k[2] not in BASELINES, k[2], k[3]))
    for d, t, m, b in keys:
        group = [r for r in rows if (r["dataset"], r["temperature"], r["method"], r["budget"]) == (d, t, m, b)]
        ar = {r["prompt"]: r for r in rows if (r["dataset"], r["temperature"], r["method"]) == (d, t, "ar")}
        hf = {r["prompt"]: r for r in rows if (r["dataset"], r["temperature"], r["method"]) == (d, t, "hf-generate")}
        same, notes = _same_output([(ar[r["prompt"]], r) for r in group if r["prompt"] in ar])
        tps = sum(r["tokens"] - 1 for r in group) / max(1e-9, sum(r["decode_s"] for r in group))
        budget = b if b else "–"
        if m in AUTO_METHODS:
            chosen = [x for r in group for x in r.get("budgets_chosen", [])]
            budget = f"auto ≤{b} (median {statistics.median(chosen):g})" if chosen else f"auto ≤{b}"
        oracle = [r["oracle_tau"] for r in group if r.get("oracle_tau") is not None]
        tree = [r["phase_shares"]["tree"] for r in group if r.get("phase_shares")]
        out.append(f"| {d} | {t:g} | {m} | {budget} | {len(group)} | "
                   f"{statistics.mean(r['tau'] for r in group):.2f} | "
                   f"{f'{statistics.mean(oracle):.2f}' if oracle else '–'} | {_speedup(group, ar)} | "
                   f"{_speedup(group, hf)} | {tps:.1f} | {f'{statistics.mean(tree):.1%}' if tree else '–'} | "
                   f"{same}/{len(group)}{notes} |")
    return "\n".join(out)


def _same_output(pairs: list[tuple[dict, dict]]) -> tuple[int, str]:
    """Outputs equal to plain decoding's, and a note (" (3 near-ties)"): of the others at temperature 0, how many
    first differ at a near-tie flipped by rounding (`core.divergence`); any that does not is named: a bug."""
    same, ties, other = 0, 0, 0
    for plain, row in pairs:
        if row["output"] == plain["output"]:
            same += 1
            continue
        div = first_difference((plain["output"], [], plain.get("runner_up") or []),
                               (row["output"], [], row.get("runner_up") or []))
        if div is None or row["temperature"] > 0 or not plain.get("runner_up") or not row.get("runner_up"):
            continue
        ties, other = ties + div.near_tie, other + (not div.near_tie)
    notes = ([f"{ties} near-tie{'s' * (ties != 1)}"] if ties else []) + ([f"{other} NOT a near-tie"] if other else [])
    return same, f" ({', '.join(notes)})" if notes else ""


def main(argv=None, pair=None) -> list[dict]:
    """Run the benchmark; `pair` (a loaded ModelPair) replaces --pair / --dtype."""
    default_offline()
    ap = _parser()
    args = ap.parse_args(argv)
    _, machine = announce_dtype(args.dtype, pair)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "rows.jsonl"
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.exists() else []
    done = {(r["dataset"], r["prompt"], r["method"], r["budget"], r["temperature"]) for r in rows}
    pair = pair or load_pair(args.pair, dtype=args.dtype)
    if args.drafter:
        pair = replace(pair, name=f"{pair.name}+{args.drafter}", drafter=load_drafter(args.drafter, pair.target,
                                                                                        pair.dtype))
    methods = ["ar"] + [m for m in args.methods.split(",") if m != "ar"]
    for m in methods:
        if m not in METHODS and m not in BASELINES:
            ap.error(f"unknown method {m!r}; choose from {', '.join(METHODS + BASELINES)}")
    budgets = [int(b) for b in args.budgets.split(",")]
    temps = [float(t) for t in args.temperatures.split(",")]
    lams = [float(x) for x in args.lams.split(",")]
    readouts = args.readouts.split(",")
    if not set(readouts) <= {"draft", "full"}:
        ap.error(f"unknown readout in {args.readouts!r}; choose draft, full or draft,full")
    jobs = []
    for source in args.datasets.split(","):
        d = dataset_name(source)
        for i, turns in enumerate(conversations(source, args.n)):
            for j, text in enumerate(turns):
                for t in temps:
                    for m in methods:
                        for b in ([args.auto_cap or max(budgets)] if m in AUTO_METHODS else
                                  budgets if m in TREE_METHODS else [0]):
                            for lam, ro in product(lams if m in SWEPT else lams[:1],
                                                   readouts if m in DRAFTING else readouts[:1]):
                                label = f"{m} λ={lam:g}" if m in SWEPT and len(lams) > 1 else m
                                label += " full-head" if ro == "full" and len(readouts) > 1 else ""
                                jobs.append((d, i, turns[: j + 1], label, DecodeConfig(
                                    method=m, budget=b or budgets[0], temperature=t, lam=lam,
                                    max_new_tokens=args.max_new_tokens, full_readout=ro == "full")))
    pending = [(d, _key(n, len(turns)), n, turns, label, cfg) for d, n, turns, label, cfg in jobs
               if (d, _key(n, len(turns)), label, _budget(cfg), cfg.temperature) not in done]
    warm = encode_messages(pair.tokenizer, [{"role": "user", "content": pending[0][3][0]}]) if pending else []
    for m in methods if warm else []:         # one short warm-up generation per method
        _generate(m, pair, warm, DecodeConfig(method=m if m not in BASELINES else "ar", budget=budgets[0],
                                              max_new_tokens=16))
    with open(rows_path, "a") as f:           # resumed jobs count as done, so the ETA is the pending ones'
        for d, i, n, turns, label, cfg in progress(pending, total=len(jobs), initial=len(jobs) - len(pending),
                                                   desc="benchmark", unit="run"):
            base = next((r for r in rows if (r["dataset"], r["prompt"], r["method"], r["temperature"]) ==
                         (d, i, "ar", cfg.temperature)), None)
            ids = encode_messages(pair.tokenizer, _messages(d, n, turns, cfg.temperature, rows, pair.tokenizer))
            result = _generate(cfg.method, pair, ids, cfg)
            make = baseline_row if cfg.method in BASELINES else row_for
            row = make(d, i, cfg, result, base["tpot"] if base else None, label)
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
    text = table(rows)
    (out / "table.md").write_text(f"{machine}\n\n{text}\n")
    print(text)
    for path in write_figures(rows, out / "figures"):
        print("figure:", path)
    return rows


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="gsm8k", help="comma-separated: gsm8k, humaneval, mt-bench, mt-bench-first, "
                                                         "compmath, science, a .jsonl, "
                                                         "or hub:<id>[/<config>][:<split>[:<field>]]")
    ap.add_argument("--n", type=int, default=30, help="prompts per dataset (first n of a seed-0 shuffle)")
    ap.add_argument("--methods", default="ar,chain,ddtree", help="comma-separated methods (ar is always run)")
    ap.add_argument("--budgets", default="64", help="comma-separated budgets for tree methods")
    ap.add_argument("--auto-cap", type=int, default=None,
                    help="largest budget an auto method (ddtree-auto, presto-auto, hybrid-auto) may choose "
                         "(default: the largest of --budgets)")
    ap.add_argument("--temperatures", default="0", help="comma-separated temperatures")
    ap.add_argument("--lams", default=str(DecodeConfig.lam),
                    help="comma-separated λ for presto / presto-beam (a sweep: one row label per value, "
                         "e.g. 'presto λ=0.1')")
    ap.add_argument("--readouts", default="draft",
                    help="comma-separated: draft (the drafter's draft vocabulary plus the prompt's tokens, when it "
                         "ships one), full (all V); with both, full rows are labelled '<method> full-head'")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--drafter", default=None,
                    help="DFlash drafter folder or hub id to use instead of the pair's (e.g. a training export)")
    add_dtype_option(ap)
    ap.add_argument("--out", default="runs/benchmark", help="folder for rows.jsonl and table.md (resumable)")
    return ap


def dataset_name(source: str) -> str:
    """A prompt set's name in rows and tables: a .jsonl's stem, a hub set's id."""
    return Path(source).stem if source.endswith(".jsonl") else source.split(":")[1] if source.startswith(
        "hub:") else source


def conversations(source: str, n: int) -> list[list[str]]:
    """User turns per item: MT-Bench has two (as in DFlash's benchmark), every other set (mt-bench-first too) one."""
    if source == "mt-bench":
        return subset(mtbench_questions(), n)
    return [[p] for p in load_prompts(source, n)]


def _key(index: int, turn: int):
    """A row's prompt key: the item's index for its first turn, "index.turn" for later turns."""
    return index if turn == 1 else f"{index}.{turn}"


def _messages(dataset: str, index: int, turns: list[str], temperature: float, rows: list[dict],
              tokenizer) -> list[dict]:
    """The chat up to the last user turn. Earlier assistant turns are plain decoding's reply at this temperature
    (from this run's rows), so every method continues the same conversation and speed-ups stay paired."""
    messages = []
    for j, text in enumerate(turns):
        messages.append({"role": "user", "content": text})
        if j < len(turns) - 1:
            ar = next(r for r in rows if (r["dataset"], r["prompt"], r["method"], r["temperature"]) ==
                      (dataset, _key(index, j + 1), "ar", temperature))
            messages.append({"role": "assistant", "content": tokenizer.decode(ar["output"], skip_special_tokens=True)})
    return messages


def _generate(method: str, pair, prompt_ids: list[int], cfg: DecodeConfig):
    """Records from the engine, or a BaselineRun for a baseline outside it."""
    if method in BASELINES:
        return run_baseline(method, pair, prompt_ids, cfg)
    return run(pair, prompt_ids, cfg)


if __name__ == "__main__":
    main()
