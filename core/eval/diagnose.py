"""Where a drafter misses: draft from every position of the target's own greedy reply and compare with the reply.

    python -m core.eval.diagnose --drafter assets/drafters/smollm2-135m-dflash-b16 --datasets gsm8k --n 30

The benchmark and the judge count what each verification step accepts. Here every reply token is an anchor, as
if it were a step's bonus token, and the drafter's top-1 token at each depth is compared with the reply: how often
depth d is right on its own and with every shallower depth right (a chain's acceptance from that anchor); how
depth 1 does against the target's own confidence in the token it must draft (a miss where the target is sure is
the drafter's fault, not a near-tie); and how often depth d drafted the reply token one or two places away
instead (the block lost count of its positions).
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from core.dflash import extract_features
from core.drafter import Drafting, clip_draft
from core.eval.benchmark import announce_dtype
from core.eval.judge import parse_reference_args, reference_replies
from core.fast_forward import forward
from core.kv_cache import new_cache
from core.models import default_offline, load_drafter, load_pair

CONFIDENCE_EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)
OFFSETS = (-2, -1, 1, 2)


@torch.inference_mode()
def anchor_drafts(pair, prompt_ids: list[int], reference: list[int], depth: int) -> tuple[np.ndarray, np.ndarray]:
    """(drafted, p): drafted[t, d] is the top-1 token drafted at depth d + 1 with reference[t] as the bonus token
    at position P + t [R-1, depth]; p[t] is the target's probability of reference[t + 1] there [R-1]. One target
    forward over prompt + reply; the drafter's context cache grows anchor by anchor, as in the loop."""
    target, drafter, n = pair.target, pair.drafter, len(prompt_ids)
    ids = torch.tensor([prompt_ids + reference[:-1]], device=pair.device)
    out = forward(target, ids, new_cache(target), output_hidden_states=True, logits_to_keep=0)
    features = extract_features(out.hidden_states, drafter.target_layer_ids)[0]     # [P+R-1, n_taps*H]
    probs = torch.softmax(out.logits[0, n - 1:].float(), -1)                          # [R, V] predicts reference
    p = probs[torch.arange(1, len(reference)), torch.tensor(reference[1:])].cpu().numpy()
    drafting, drafted = Drafting(drafter, target, prompt_ids, depth, 1), []
    for t in range(len(reference) - 1):
        drafting.read(features[n + t - 1: n + t] if t else features[:n])
        drafted.append(clip_draft(drafting.draft(reference[t], n + t), depth).tokens[:, 0])
    return np.asarray(drafted, dtype=np.int64).reshape(-1, depth), p


def summarize(drafted: np.ndarray, p: np.ndarray, reference: list[int]) -> dict:
    """Counts over anchors (sums, so that prompts pool): per depth d, anchors with a reply token there (`n`), right
    (`right`), right with every shallower depth (`chain`), equal to the reply token d+j places on (`offset`);
    depth 1 per bucket of the target's confidence (`buckets`: anchors, right)."""
    r, depth = np.asarray(reference), drafted.shape[1]
    out = {"n": [0] * depth, "right": [0] * depth, "chain": [0] * depth,
           "offset": {f"{j:+d}": [0] * depth for j in OFFSETS}, "buckets": [[0, 0] for _ in CONFIDENCE_EDGES[1:]]}
    alive = np.ones(len(drafted), dtype=bool)
    for d in range(depth):
        t = np.arange(len(drafted) - d)                  # anchors with reference[t + 1 + d] in the reply
        right = drafted[t, d] == r[t + 1 + d]
        alive = alive[: len(t)] & right
        out["n"][d], out["right"][d], out["chain"][d] = len(t), int(right.sum()), int(alive.sum())
        for j in OFFSETS:
            at = t + 1 + d + j
            ok = (at >= 0) & (at < len(r))
            out["offset"][f"{j:+d}"][d] = int((drafted[t[ok], d] == r[at[ok]]).sum())
    right1 = drafted[:, 0] == r[1:]
    bucket = np.clip(np.searchsorted(CONFIDENCE_EDGES, p, side="right") - 1, 0, len(CONFIDENCE_EDGES) - 2)
    for b in range(len(CONFIDENCE_EDGES) - 1):
        out["buckets"][b] = [int((bucket == b).sum()), int(right1[bucket == b].sum())]
    return out


def pool(parts: list[dict]) -> dict:
    """Sum `summarize` counts over prompts, and count the prompts (so that a partial `--out` says how far it got)."""
    def total(get):
        return np.sum([get(part) for part in parts], axis=0).tolist()

    return {"prompts": len(parts), **{key: total(lambda part: part[key]) for key in ("n", "right", "chain", "buckets")},
            "offset": {j: total(lambda part: part["offset"][j]) for j in parts[0]["offset"]}}


def report(stats: dict) -> str:
    """Two markdown tables: per depth, then depth 1 per target-confidence bucket."""
    depth = len(stats["n"])
    share = lambda a, b: f"{100 * a / b:.1f} %" if b else "–"                    # noqa: E731
    head = "| depth | anchors | right | chain (all depths so far right) | " + " | ".join(
        f"drafted depth d{j:+d}'s token" for j in OFFSETS) + " |"
    lines = [head, "|" + "---:|" * (4 + len(OFFSETS))]
    for d in range(depth):
        n = stats["n"][d]
        offs = " | ".join(share(stats["offset"][f"{j:+d}"][d], n) for j in OFFSETS)
        lines.append(f"| {d + 1} | {n} | {share(stats['right'][d], n)} | {share(stats['chain'][d], n)} | {offs} |")
    total = sum(b[0] for b in stats["buckets"])
    lines += ["", "| target's p of the token depth 1 must draft | share of anchors | depth 1 right |",
              "|---|---:|---:|"]
    for (lo, hi), (n, right) in zip(zip(CONFIDENCE_EDGES, CONFIDENCE_EDGES[1:]), stats["buckets"]):
        lines.append(f"| [{lo:.2f}, {hi:.2f}{']' if hi == 1.0 else ')'} | {share(n, total)} | {share(right, n)} |")
    return "\n".join(lines)


def main(argv=None, pair=None) -> dict:
    """`pair` stands in for loading, as in tests."""
    default_offline()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default=None, help="drafter folder or hub id (default: the pair's own)")
    ap.add_argument("--depth", type=int, default=4, help="drafted depths to examine")
    ap.add_argument("--out", default=None,
                    help="file for the pooled counts (JSON), rewritten as each prompt finishes, so that an "
                         "interrupted run keeps its counts so far")
    args = parse_reference_args(ap, argv)
    if args.depth < 1:
        ap.error("--depth must be at least 1")
    announce_dtype(args.dtype, pair)
    pair = pair or load_pair(args.pair, dtype=args.dtype)
    if args.drafter:
        pair = replace(pair, drafter=load_drafter(args.drafter, pair.target, pair.dtype))
    if args.depth > pair.drafter.block_size - 1:
        ap.error(f"--depth is at most {pair.drafter.block_size - 1} for this drafter (block size "
                 f"{pair.drafter.block_size})")
    results = {}
    for dataset in args.datasets.split(","):
        parts = []
        for _, prompt_ids, reference in reference_replies(pair, dataset, args.n, args.max_new_tokens):
            if len(reference) > 1:
                parts.append(summarize(*anchor_drafts(pair, prompt_ids, reference, args.depth), reference))
                results[dataset] = pool(parts)
                if args.out:
                    write_json(Path(args.out), results)
        if not parts:
            print(f"\n{dataset}: no reply of two tokens or more, nothing to diagnose")
            continue
        print(f"\n{dataset}, {len(parts)} prompts\n\n{report(results[dataset])}")
    if args.out:
        write_json(Path(args.out), results)
    return results


def write_json(path: Path, data) -> None:
    """Whole or not at all: an interruption mid-write leaves the previous version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
