"""Judge drafters on one fixed trajectory per prompt: acceptance along the target's own greedy reply.

    python -m core.eval.judge --drafters assets/drafters/smollm2-135m-dflash-b16,runs/final13 --datasets gsm8k --n 30

The benchmark decodes for real, and in bf16 a drafter that tips one near-tie sends the reply down another path:
per-prompt τ then swings by whole tokens for reasons that are not the drafter's. At temperature 0 the loop is
lossless, so it emits the target's greedy reply, and each step accepts the longest tree path that matches that
reply. This replays exactly that walk (`core.replay`) against one reference reply per prompt, decoded once by plain
decoding: one target forward over prompt + reply gives every context feature, then each step costs one drafter
forward and one tree build, no verification. Every drafter is measured on the same tokens, in a fraction of a
benchmark's time; where the real loop emits the reference (fp32: always), its τ is the same, step for step (a test
checks it).

`--curves` instead decodes each prompt for real at each budget B and sets the app's counterfactual budget curve
(that run's trees cut to b nodes) beside the exact one (a run at b replayed on the same reply), b = 1, 2, 4, ... B.
"""
from __future__ import annotations

import argparse
import json
import statistics
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from core.builders import NESTED
from core.config import AUTO_METHODS, METHODS, TREE_METHODS, DecodeConfig
from core.engine import output_ids, run
from core.eval.baselines import prompt_lookup_steps
from core.eval.benchmark import add_dtype_option, announce_dtype, conversations, dataset_name, progress
from core.models import default_offline, encode_messages, load_drafter, load_pair
from core.replay import curve_budgets, exact_budget_points, prompt_tau, reference_states, replay

__all__ = ["main", "prompt_tau", "reference_reply", "reference_replies", "reference_states", "replay"]

PROMPT_LOOKUP = "hf-prompt-lookup"   # the baseline's name in the benchmark


def reference_reply(pair, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The target's greedy reply, by plain decoding (the loop's `ar`)."""
    return output_ids(run(pair, prompt_ids, DecodeConfig(method="ar", max_new_tokens=max_new_tokens)))


def dataset_prompts(pair, dataset: str, n: int, skip: set[int] = frozenset()):
    """(index, prompt_ids) for the first n prompts of a single-turn set, each first turn as the user's message.
    Prompts whose index is in `skip` (a resumed run has their rows) are left out; the progress bar counts them as
    done, so its ETA is the rest's."""
    items = conversations(dataset, n)
    todo = [(index, turns) for index, turns in enumerate(items) if index not in skip]
    for index, turns in progress(todo, total=len(items), initial=len(items) - len(todo), desc=dataset_name(dataset),
                                 unit="prompt"):
        yield index, encode_messages(pair.tokenizer, [{"role": "user", "content": turns[0]}])


def reference_replies(pair, dataset: str, n: int, max_new_tokens: int, skip: set[int] = frozenset()):
    """(index, prompt_ids, reference): `dataset_prompts` with the target's greedy reply to each (shared with
    `core.eval.diagnose`)."""
    for index, prompt_ids in dataset_prompts(pair, dataset, n, skip):
        yield index, prompt_ids, reference_reply(pair, prompt_ids, max_new_tokens)


def parse_reference_args(ap: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """Adds and checks the options that choose the prompts and the target's greedy replies to them (shared with
    `core.eval.diagnose`)."""
    ap.add_argument("--datasets", default="gsm8k",
                    help="comma-separated single-turn sets: gsm8k, humaneval, mt-bench-first, compmath, science, "
                         "or a local .jsonl")
    ap.add_argument("--n", type=int, default=30, help="prompts per dataset (first n of a seed-0 shuffle)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--pair", default="smollm2-135m")
    add_dtype_option(ap)
    args = ap.parse_args(argv)
    if "mt-bench" in args.datasets.split(","):
        ap.error("mt-bench has two turns; use its first turns with --datasets mt-bench-first")
    if args.max_new_tokens < 1 or args.n < 1:
        ap.error("--n and --max-new-tokens must be at least 1")
    return args


def main(argv=None, pair=None, drafters: dict | None = None) -> list[dict]:
    """`pair` and `drafters` (name -> loaded drafter) stand in for loading, as in tests."""
    default_offline()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafters", required=True,
                    help="comma-separated drafter folders or hub ids; the first is the one the others are compared to")
    ap.add_argument("--methods", default="chain,ddtree",
                    help="comma-separated: chain, ddtree, presto, presto-beam, hybrid, and hf-prompt-lookup "
                         "(transformers' prompt lookup on the same replies; it needs no drafter)")
    ap.add_argument("--budgets", default="16,64", help="comma-separated budgets for tree methods")
    ap.add_argument("--out", default=None,
                    help="folder for rows.jsonl (per-step acceptance; --curves: curves.jsonl), appended as each "
                         "prompt finishes; a rerun reuses the rows it finds there and replays only the rest")
    ap.add_argument("--curves", action="store_true",
                    help="instead: decode each prompt for real with the first drafter at each budget B, and set the "
                         "app's counterfactual curve (that run's trees cut to b nodes) beside the exact one (a run "
                         "at b replayed on the same reply) at b = 1, 2, 4, ... B")
    args = parse_reference_args(ap, argv)
    methods = args.methods.split(",")
    judged_methods = [m for m in METHODS if m != "ar" and m not in AUTO_METHODS] + [PROMPT_LOOKUP]
    for m in methods:
        if m not in judged_methods:
            why = ("drafts nothing" if m == "ar" else "calibrates its budget on the real loop's steps"
                   if m in AUTO_METHODS else "is not a method")
            ap.error(f"{m} {why}; choose from {', '.join(judged_methods)}")
    try:
        budgets = [int(b) for b in args.budgets.split(",")]
    except ValueError:
        ap.error(f"--budgets takes whole numbers separated by commas (got {args.budgets!r})")
    if args.curves and any(m not in NESTED for m in methods):
        ap.error(f"--curves cuts a run's trees to smaller budgets, so it takes nested methods: "
                 f"{', '.join(sorted(NESTED))}")
    announce_dtype(args.dtype, pair)
    pair = pair or load_pair(args.pair, dtype=args.dtype)
    drafters = drafters or {d: load_drafter(d, pair.target, pair.dtype) for d in args.drafters.split(",")}
    if args.curves:
        return curves(replace(pair, drafter=next(iter(drafters.values()))), methods, budgets, args)
    judged = {(name, method, budget): DecodeConfig(method=method, budget=budget or budgets[0],
                                                   max_new_tokens=args.max_new_tokens)
              for name in drafters for method in methods for budget in (budgets if method in TREE_METHODS else [None])}
    path = Path(args.out) / "rows.jsonl" if args.out else None
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
    found = {row_key(r): r for r in map(json.loads, path.read_text().splitlines())} if path and path.exists() else {}

    rows = []
    with open(path, "a") if path else nullcontext() as f:
        for dataset in args.datasets.split(","):
            done = {i for i in range(args.n) if all((dataset, i, *j) in found for j in judged)}
            replies = reference_replies(pair, dataset, args.n, args.max_new_tokens, skip=done)
            for index, prompt_ids, reference in replies:
                missing = {j: cfg for j, cfg in judged.items() if (dataset, index, *j) not in found}
                new = [{"dataset": dataset, "prompt": index, **r}
                       for r in judge_prompt(pair, drafters, missing, prompt_ids, reference)]
                found.update({row_key(r): r for r in new})
                if f:
                    f.write("".join(json.dumps(r) + "\n" for r in new))
                    f.flush()
                done.add(index)
            rows += [found[(dataset, i, *j)] for i in sorted(done) for j in judged]
    print(table(rows, list(drafters)))
    return rows


def row_key(row: dict) -> tuple:
    """What a row measures: (dataset, prompt, drafter, method, budget); a resumed run reuses rows by it."""
    return row["dataset"], row["prompt"], row["drafter"], row["method"], row["budget"]


def judge_prompt(pair, drafters: dict, judged: dict[tuple, DecodeConfig], prompt_ids: list[int],
                 reference: list[int]) -> list[dict]:
    """One prompt's rows, less dataset and prompt, for each (drafter name, method, budget) in `judged` (with its
    config), all on one forward's hidden states."""
    states = reference_states(pair, prompt_ids, reference)
    rows, lookup = [], None
    for (name, method, budget), cfg in judged.items():
        if method == PROMPT_LOOKUP:          # the same for every drafter: computed once
            lookup = lookup or prompt_lookup_steps(pair, prompt_ids, reference, cfg.max_new_tokens)
            steps = lookup
        else:
            steps = replay(replace(pair, drafter=drafters[name]), prompt_ids, reference, cfg, states)
        rows.append({"drafter": name, "method": method, "budget": budget, "tokens": len(reference),
                     "steps": len(steps), "tau": prompt_tau(steps), "committed": steps})
    return rows


def table(rows: list[dict], drafters: list[str]) -> str:
    """τ per drafter and setting: mean of per-prompt τ, pooled (committed tokens ÷ steps), and against the first
    drafter the median per-prompt change and the prompts it wins and loses."""
    lines = ["| dataset | method | budget | drafter | prompts | τ | pooled τ | median Δτ vs first "
             "| higher / lower |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    keys = dict.fromkeys((r["dataset"], r["method"], r["budget"]) for r in rows)
    for dataset, method, budget in keys:
        by = {d: {r["prompt"]: r for r in rows if (r["dataset"], r["method"], r["budget"], r["drafter"]) ==
                  (dataset, method, budget, d)} for d in drafters}
        first = by[drafters[0]]
        for d in drafters:
            rs = by[d]
            tau = statistics.mean(r["tau"] for r in rs.values())
            pooled = sum(sum(r["committed"]) for r in rs.values()) / max(1, sum(r["steps"] for r in rs.values()))
            delta = [rs[p]["tau"] - first[p]["tau"] for p in rs]
            vs = "–" if d == drafters[0] else f"{statistics.median(delta):+.3f}"
            wins = "–" if d == drafters[0] else f"{sum(x > 0 for x in delta)} / {sum(x < 0 for x in delta)}"
            lines.append(f"| {dataset} | {method} | {budget or '–'} | {d} | {len(rs)} | {tau:.3f} | {pooled:.3f} | "
                         f"{vs} | {wins} |")
    return "\n".join(lines)


def curves(pair, methods: list[str], budgets: list[int], args) -> list[dict]:
    """--curves: per prompt, method and run budget B, the counterfactual and the exact τ at b = 1, 2, 4, ... B
    (`curve_rows`), appended to --out/curves.jsonl as each prompt finishes (a rerun skips the prompts it finds)."""
    path = Path(args.out) / "curves.jsonl" if args.out else None
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
    found = list(map(json.loads, path.read_text().splitlines())) if path and path.exists() else []
    rows = []
    with open(path, "a") if path else nullcontext() as f:
        for dataset in args.datasets.split(","):
            done = {r["prompt"] for r in found if r["dataset"] == dataset}
            rows += [r for r in found if r["dataset"] == dataset]
            for index, prompt_ids in dataset_prompts(pair, dataset, args.n, skip=done):
                new = [{"dataset": dataset, "prompt": index, **r}
                       for r in curve_rows(pair, prompt_ids, methods, budgets, args.max_new_tokens)]
                rows += new
                if f:
                    f.write("".join(json.dumps(r) + "\n" for r in new))
                    f.flush()
    print(curve_table(rows))
    return rows


def curve_rows(pair, prompt_ids: list[int], methods: list[str], budgets: list[int], max_new_tokens: int) -> list[dict]:
    """One prompt's rows: for each method and budget B, a real greedy run at B, then per b in `curve_budgets(B)` its
    counterfactual τ (mean over its steps of `StepRecord.tau_at(b)`, what the app's chart draws) and the exact τ
    (`core.replay`, a run at b replayed on the run's reply; shared by runs that emitted the same reply)."""
    rows, exact, states = [], {}, {}
    for method in methods:
        for top in budgets:
            cfg = DecodeConfig(method=method, budget=top, max_new_tokens=max_new_tokens)
            records = run(pair, prompt_ids, cfg)
            steps, reply = records[1:], tuple(output_ids(records))
            if reply not in states:
                states[reply] = reference_states(pair, prompt_ids, list(reply))
            todo = [b for b in curve_budgets(top) if (reply, method, b) not in exact]
            for b, tau in exact_budget_points(pair, prompt_ids, list(reply), cfg, todo, states[reply]):
                exact[reply, method, b] = tau
            rows += [{"method": method, "run_budget": top, "budget": b, "tokens": len(reply),
                      "achieved": prompt_tau([r.tau for r in steps]),
                      "counterfactual": prompt_tau([r.tau_at(b) for r in steps]), "exact": exact[reply, method, b]}
                     for b in curve_budgets(top)]
    return rows


def curve_table(rows: list[dict]) -> str:
    """Per method, run budget B and budget b: mean counterfactual and exact τ over the prompts, the counterfactual's
    relative error, the prompts where it is higher / lower, the gain from b to B each one predicts (τ at B, the
    run's own, over τ at b), and whether the exact τ at B is the run's own."""
    lines = ["| dataset | method | run budget B | b | prompts | counterfactual τ | exact τ | (cf − exact) / exact "
             "| cf higher / lower | gain from b to B: cf / exact |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    keys = dict.fromkeys((r["dataset"], r["method"], r["run_budget"], r["budget"]) for r in rows)
    for key in keys:
        rs = [r for r in rows if (r["dataset"], r["method"], r["run_budget"], r["budget"]) == key]
        cf, ex = statistics.mean(r["counterfactual"] for r in rs), statistics.mean(r["exact"] for r in rs)
        top = statistics.mean(r["achieved"] for r in rs)
        higher = sum(r["counterfactual"] > r["exact"] + 1e-9 for r in rs)
        lower = sum(r["counterfactual"] < r["exact"] - 1e-9 for r in rs)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {len(rs)} | {cf:.3f} | {ex:.3f} | "
                     f"{100 * (cf / ex - 1):+.1f} % | {higher} / {lower} | "
                     f"{100 * (top / cf - 1):+.1f} % / {100 * (top / ex - 1):+.1f} % |")
    own = [r for r in rows if r["budget"] == r["run_budget"]]
    same = sum(abs(r["exact"] - r["achieved"]) < 1e-9 for r in own)
    return "\n".join(lines) + f"\n\nexact τ at the run's own budget equals the run's τ in {same} of {len(own)} runs"


if __name__ == "__main__":
    main()
