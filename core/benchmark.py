"""Benchmark methods and budgets on prompt sets, with plain decoding of the same prompts in the same run.

    python -m core.benchmark --datasets gsm8k --n 30 --methods ar,chain,ddtree --budgets 64 --max-new-tokens 256

Per prompt, every (method, budget) runs back to back after plain decoding (`ar`), after one warm-up generation.
Rows (one per prompt x method x budget) go to `<out>/rows.jsonl` as they finish, so an interrupted run resumes
where it stopped; the summary table (τ = mean of per-prompt means, bonus counted; speed-up = plain decoding's
time per output token ÷ the method's, prefill excluded) is printed as markdown and written to `<out>/table.md`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tqdm import tqdm  # noqa: E402

from core.config import DecodeConfig  # noqa: E402


def row_for(dataset: str, index: int, cfg: DecodeConfig, records, ar_tpot: float | None) -> dict:
    from core.records import summarize

    s = summarize([records])
    tpot = s.decode_seconds / max(1, s.tokens - 1)
    return {"dataset": dataset, "prompt": index, "method": cfg.method, "budget": cfg.budget,
            "temperature": cfg.temperature, "tau": s.tau if s.steps else 1.0, "tokens": s.tokens, "steps": s.steps,
            "decode_s": s.decode_seconds, "prefill_s": s.prefill_seconds, "tpot": tpot,
            "speedup": (ar_tpot / tpot) if ar_tpot else None, "expected_tau": s.expected_tau,
            "oracle_tau": s.oracle_tau, "histogram": s.histogram, "depth_rates": s.depth_rates,
            "phase_shares": s.phase_shares, "output": [t for r in records for t in r.committed]}


def table(rows: list[dict]) -> str:
    """Markdown: per dataset and (method, budget), τ (mean of per-prompt means), speed-up (mean AR TPOT ÷ mean
    method TPOT over the same prompts), tokens/s and whether the outputs equal plain decoding's."""
    out = ["| dataset | method | budget | T | prompts | τ | speed-up vs plain | tokens/s | same output as plain |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    keys = sorted({(r["dataset"], r["method"], r["budget"], r["temperature"]) for r in rows},
                  key=lambda k: (k[0], k[3], k[1] != "ar", k[1], k[2]))
    ar = {(r["dataset"], r["prompt"], r["temperature"]): r for r in rows if r["method"] == "ar"}
    for d, m, b, t in keys:
        group = [r for r in rows if (r["dataset"], r["method"], r["budget"], r["temperature"]) == (d, m, b, t)]
        base = [ar[(d, r["prompt"], t)] for r in group if (d, r["prompt"], t) in ar]
        speed = statistics.mean(x["tpot"] for x in base) / statistics.mean(r["tpot"] for r in group) if base else 0
        same = sum(r["output"] == ar[(d, r["prompt"], t)]["output"] for r in group if (d, r["prompt"], t) in ar)
        tps = sum(r["tokens"] - 1 for r in group) / sum(r["decode_s"] for r in group)
        out.append(f"| {d} | {m} | {b if m != 'ar' else '–'} | {t:g} | {len(group)} | "
                   f"{statistics.mean(r['tau'] for r in group):.2f} | {speed:.2f}× | {tps:.1f} | "
                   f"{same}/{len(group)} |")
    return "\n".join(out)


def main(argv=None) -> None:
    from core.datasets import load_prompts
    from core.engine import run
    from core.models import encode_chat, load_pair

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="gsm8k", help="comma-separated: gsm8k, humaneval, mt-bench or a .jsonl")
    ap.add_argument("--n", type=int, default=30, help="prompts per dataset (first n of a seed-0 shuffle)")
    ap.add_argument("--methods", default="ar,chain,ddtree", help="comma-separated methods (ar is always run)")
    ap.add_argument("--budgets", default="64", help="comma-separated budgets for tree methods")
    ap.add_argument("--temperatures", default="0", help="comma-separated temperatures")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", default="runs/benchmark", help="folder for rows.jsonl and table.md (resumable)")
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "rows.jsonl"
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.exists() else []
    done = {(r["dataset"], r["prompt"], r["method"], r["budget"], r["temperature"]) for r in rows}
    pair = load_pair(args.pair, dtype=args.dtype)
    methods = ["ar"] + [m for m in args.methods.split(",") if m != "ar"]
    budgets = [int(b) for b in args.budgets.split(",")]
    temps = [float(t) for t in args.temperatures.split(",")]
    jobs = []
    for d in args.datasets.split(","):
        for i, text in enumerate(load_prompts(d, args.n)):
            for t in temps:
                for m in methods:
                    for b in ([budgets[0]] if m in ("ar", "chain") else budgets):
                        jobs.append((d, i, text, DecodeConfig(method=m, budget=b, temperature=t,
                                                              max_new_tokens=args.max_new_tokens)))
    warm = encode_chat(pair.tokenizer, "Say hello.")
    for m in methods:
        run(pair, warm, DecodeConfig(method=m, budget=budgets[0], max_new_tokens=16))
    with open(rows_path, "a") as f:
        for d, i, text, cfg in tqdm(jobs, desc="benchmark", dynamic_ncols=True):
            key = (d, i, cfg.method, cfg.budget, cfg.temperature)
            if key in done:
                continue
            records = run(pair, encode_chat(pair.tokenizer, text), cfg)
            base = next((r for r in rows if (r["dataset"], r["prompt"], r["method"], r["temperature"]) ==
                         (d, i, "ar", cfg.temperature)), None)
            row = row_for(d, i, cfg, records, base["tpot"] if base else None)
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
    text = table(rows)
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
