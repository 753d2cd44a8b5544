"""Judge drafters on one fixed trajectory per prompt: acceptance along the target's own greedy reply.

    python -m core.eval.judge --drafters assets/drafters/smollm2-135m-dflash-b16,runs/final13 --datasets gsm8k --n 30

The benchmark decodes for real, and in bf16 a drafter that tips one near-tie sends the reply down another path:
per-prompt τ then swings by whole tokens for reasons that are not the drafter's. At temperature 0 the loop is
lossless, so it emits the target's greedy reply, and each step accepts the longest tree path that matches that
reply. This replays exactly that walk against one reference reply per prompt, decoded once by plain decoding:
one target forward over prompt + reply gives every context feature, then each step costs one drafter forward and
one tree build, no verification. Every drafter is measured on the same tokens, in a fraction of a benchmark's
time; where the real loop emits the reference (fp32: always), its τ is the same, step for step (a test checks it).
"""
from __future__ import annotations

import argparse
import json
import statistics
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch

from core.config import AUTO_METHODS, METHODS, TREE_METHODS, DecodeConfig
from core.accept import follow
from core.builders import as_builder
from core.dflash import extract_features
from core.drafter import Drafting, clip_draft
from core.engine import check_inputs, default_builder, depth_cap, draft_sizes, output_ids, run, step_record
from core.eval.baselines import prompt_lookup_steps
from core.eval.benchmark import add_dtype_option, announce_dtype, conversations, dataset_name, progress
from core.fast_forward import forward
from core.kv_cache import new_cache
from core.limits import context_window
from core.models import default_offline, encode_messages, load_drafter, load_pair
from core.tree import root_only

PROMPT_LOOKUP = "hf-prompt-lookup"   # the baseline's name in the benchmark


def reference_reply(pair, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The target's greedy reply, by plain decoding (the loop's `ar`)."""
    return output_ids(run(pair, prompt_ids, DecodeConfig(method="ar", max_new_tokens=max_new_tokens)))


def reference_replies(pair, dataset: str, n: int, max_new_tokens: int, skip: set[int] = frozenset()):
    """(index, prompt_ids, reference) for the first n prompts of a single-turn set: each first turn as the user's
    message, and the target's greedy reply to it (shared with `core.eval.diagnose`). Prompts whose index is in `skip` (a
    resumed run has their rows) are not decoded; the progress bar counts them as done, so its ETA is the rest's."""
    items = conversations(dataset, n)
    todo = [(index, turns) for index, turns in enumerate(items) if index not in skip]
    for index, turns in progress(todo, total=len(items), initial=len(items) - len(todo), desc=dataset_name(dataset),
                                 unit="prompt"):
        prompt_ids = encode_messages(pair.tokenizer, [{"role": "user", "content": turns[0]}])
        yield index, prompt_ids, reference_reply(pair, prompt_ids, max_new_tokens)


@torch.inference_mode()
def reference_states(pair, prompt_ids: list[int], reference: list[int]) -> tuple[torch.Tensor, ...]:
    """The target's hidden states over prompt + reference (its last token is never context): one forward, shared
    by every drafter and setting judged on this prompt."""
    ids = torch.tensor([prompt_ids + reference[:-1]], device=pair.device)
    return forward(pair.target, ids, new_cache(pair.target), output_hidden_states=True, logits_to_keep=1).hidden_states


def prompt_tau(committed: list[int]) -> float:
    """A prompt's τ from `replay`: mean tokens committed a step (a reply with no step counts as 1, as the loop's)."""
    return statistics.mean(committed) if committed else 1.0


@torch.inference_mode()
def replay(pair, prompt_ids: list[int], reference: list[int], cfg: DecodeConfig,
           states: tuple[torch.Tensor, ...] | None = None) -> list[int]:
    """Tokens committed per step (accepted drafts + bonus, cut at the reply's end: the loop's `StepRecord.tau`)
    when the loop's output is `reference`, the reply `cfg.max_new_tokens` of plain decoding gave. `states`:
    `reference_states` of this prompt, when several replays share them."""
    cfg = check_inputs(pair, prompt_ids, cfg)
    build, window = as_builder(default_builder(cfg, pair)), context_window(pair.target)
    n_pos, k = draft_sizes(pair, cfg)
    states = states if states is not None else reference_states(pair, prompt_ids, reference)
    features = extract_features(states, pair.drafter.target_layer_ids)[0]      # [P+R-1, n_taps*H]
    drafting = Drafting(pair.drafter, pair.target, prompt_ids, n_pos, k, cfg.entropy_lam, cfg.full_readout)
    records, t, fed = [], 0, 0
    while t < len(reference) - 1:             # reference[t] is this step's bonus token, at position P + t
        past, bonus, draft = len(prompt_ids) + t, reference[t], None
        drafting.read(features[fed:past])
        fed, cap = past, depth_cap(n_pos, cfg, t + 1, past, window)
        if cap > 0 and build.should_draft():
            draft = drafting.draft(bonus, past)
        tree = build(clip_draft(draft, cap), cfg.budget, bonus, prompt_ids + reference[: t + 1]) if draft is not None \
            else root_only(bonus)
        # the loop's greedy walk, with the reply's next token as the target's choice after each node
        accepted = follow(tree, [reference[t + 1 + d] if t + 1 + d < len(reference) else -1 for d in tree.depths])
        committed = reference[t + 1: t + 1 + len(accepted)]       # accepted drafts + bonus, cut at the reply's end
        record = step_record(cfg, len(records) + 1, tree, draft, accepted, committed[-1], committed)
        build.observe(record)
        records.append(record)
        t += len(accepted)
    return [r.tau for r in records]


def parse_reference_args(ap: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """Adds and checks the options that choose the prompts and the target's greedy replies to them (shared with
    `core.eval.diagnose`)."""
    ap.add_argument("--datasets", default="gsm8k",
                    help="comma-separated single-turn sets: gsm8k, humaneval, mt-bench-first, or a local .jsonl")
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
                    help="folder for rows.jsonl (per-step acceptance), appended as each prompt finishes; a rerun "
                         "reuses the rows it finds there and replays only the rest")
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
    announce_dtype(args.dtype, pair)
    pair = pair or load_pair(args.pair, dtype=args.dtype)
    drafters = drafters or {d: load_drafter(d, pair.target, pair.dtype) for d in args.drafters.split(",")}
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


if __name__ == "__main__":
    main()
