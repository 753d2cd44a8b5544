"""Make the drafter's training data with the target itself: chat-templated prompts, the target's own replies.

Usage: python -m core.training.generate_data --out runs/data [--batch-size 16] [--max-new-tokens 512]

Replies are generated as at inference (same chat template), mostly greedy and every `--sample-every`-th prompt
(batch, with `--engine generate`) sampled at temperature 0.8, with continuous batching: `--batch-size`
replies decode together and a finished one's slot takes the next prompt at once (`core.training.batching`).
Output is sharded and resumable: each shard is an .npz of token ids (uint16 when the vocabulary fits) with the
prompt key, the prompt length and whether the reply was sampled. Interrupt at any time (Ctrl-C or `kill`): the
finished replies are written, and rerunning skips every prompt already in a shard.

Every training prompt has one reply per round. `--round 2` (3, ...) answers them all again, every reply sampled at
temperature 0.8 with the round's own seed, under keys `<prompt key>#r<round>`: more data from the same prompts,
once round 1 has answered every one of them.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import torch

from core.eval.benchmark import add_dtype_option, announce_dtype, progress
from core.models import encode_chat, load_target
from core.training.batching import continuous_generate
from core.config import MODEL_PAIRS
from core.training.data import Sequence, export_replies, source_mix
from core.training.features import FeatureCache
from core.training.prompts import is_held_out, prompt_source, round_key, training_prompts


def done_keys(out: Path) -> set[str]:
    keys = set()
    for f in sorted(out.glob("replies-*.npz")):     # an archive from export_replies (e.g. copied from assets/)
        keys.update(np.load(f, allow_pickle=False)["keys"].tolist())
    for f in sorted(out.glob("shard-*.npz")):
        try:
            keys.update(np.load(f, allow_pickle=False)["keys"].tolist())
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            f.unlink()  # a shard cut short by an interruption: regenerate its prompts
    return keys


def write_shard(out: Path, index: int, rows: list[dict], vocab: int) -> None:
    dtype = np.uint16 if vocab <= 65536 else np.uint32
    ids = np.concatenate([np.asarray(r["ids"], dtype=dtype) for r in rows])
    lengths = np.asarray([len(r["ids"]) for r in rows], dtype=np.int64)
    tmp = out / f".shard-{index:05d}.tmp.npz"
    np.savez(tmp, ids=ids, lengths=lengths, prompt_lengths=np.asarray([r["prompt_len"] for r in rows]),
             keys=np.asarray([r["key"] for r in rows]), sampled=np.asarray([r["sampled"] for r in rows]))
    os.replace(tmp, out / f"shard-{index:05d}.npz")  # atomic: a shard is whole or absent


def pending_prompts(done: set[str], round_: int = 1, seed: int = 0, limit: int = 0, skip: tuple = ()) -> list:
    """The training prompts (held-out ones never, nor those of the prompt sources in `skip`) still without a reply
    in round `round_`; with `limit`, only as many as bring that round to `limit` replies."""
    candidates = [p for p in training_prompts(seed) if not is_held_out(p.key) and prompt_source(p.key) not in skip]
    pending = [p for p in candidates if round_key(p.key, round_) not in done]
    return pending[: max(0, limit - (len(candidates) - len(pending)))] if limit else pending


@torch.inference_mode()
def generate(args) -> None:
    seed = args.seed + args.round - 1         # round 1 keeps the seed its replies were made with
    torch.manual_seed(seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target, tok = load_target(dtype=args.dtype)
    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    prompts = pending_prompts(done_keys(out), args.round, args.seed, args.limit, tuple(args.skip_sources))
    key = lambda p: round_key(p.key, args.round)      # noqa: E731
    shard = 1 + max((int(f.stem.split("-")[1]) for f in out.glob("shard-*.npz")), default=-1)
    bar = progress(total=len(prompts), desc="prompts", unit="prompt")
    made, t0 = 0, time.time()
    if args.engine == "continuous":
        encoded = [encode_chat(tok, p.text)[: args.max_prompt_tokens] for p in prompts]
        sampled = lambda i: args.round > 1 or i % args.sample_every == args.sample_every - 1     # noqa: E731
        rows = []
        capture = _capture(args, target, encoded, [key(p) for p in prompts])
        try:
            for i, reply in continuous_generate(target, encoded, args.max_new_tokens, args.batch_size,
                                                {tok.eos_token_id}, sampled, capture=capture, taps=args.taps,
                                                generator=torch.Generator(target.device).manual_seed(seed)):
                rows.append({"key": key(prompts[i]), "ids": encoded[i] + reply, "prompt_len": len(encoded[i]),
                             "sampled": sampled(i)})
                made += len(reply)
                bar.update(1)
                bar.set_postfix(tok_s=f"{made / (time.time() - t0):.0f}", tokens=made, refresh=False)
                if len(rows) >= args.batch_size * args.batches_per_shard or bar.n == len(prompts):
                    write_shard(out, shard, rows, len(tok))
                    shard, rows = shard + 1, []
        except KeyboardInterrupt:      # keep the finished replies; the slots still decoding are redone next time
            if rows:
                write_shard(out, shard, rows, len(tok))
            print(f"\ninterrupted: {bar.n} replies kept ({made} tokens); rerun to continue", file=sys.stderr)
        bar.close()
        return
    for b in range(0, len(prompts), args.batch_size * args.batches_per_shard):
        rows = []
        chunk = prompts[b: b + args.batch_size * args.batches_per_shard]
        chunk.sort(key=lambda p: (prompt_source(p.key), len(p.text)))  # similar replies batch with less waste
        for i in range(0, len(chunk), args.batch_size):
            batch = chunk[i: i + args.batch_size]
            sampled = args.round > 1 or ((b // args.batch_size + i // args.batch_size) % args.sample_every
                                         == args.sample_every - 1)
            enc = [encode_chat(tok, p.text)[: args.max_prompt_tokens] for p in batch]
            width = max(map(len, enc))
            input_ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc])
            attn = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc])
            gen = target.generate(input_ids=input_ids, attention_mask=attn, max_new_tokens=args.max_new_tokens,
                                  do_sample=sampled, temperature=0.8 if sampled else None, top_p=None, top_k=None,
                                  pad_token_id=pad)
            for p, e, g in zip(batch, enc, gen[:, width:].tolist()):
                reply = g[: g.index(tok.eos_token_id) + 1] if tok.eos_token_id in g else g
                rows.append({"key": key(p), "ids": e + reply, "prompt_len": len(e), "sampled": sampled})
                made += len(reply)
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{made / (time.time() - t0):.0f}", tokens=made, refresh=False)
        write_shard(out, shard, rows, len(tok))
        shard += 1
    bar.close()


def _capture(args, target, encoded: list[list[int]], keys: list[str]):
    """With --features: a `continuous_generate` capture that stores each finished sequence's target features and
    greedy choices where training reads them (`core.training.features`), so its first epoch skips the target."""
    if not args.features:
        return None
    cache = FeatureCache(args.features, target, args.taps, target.dtype == torch.bfloat16)
    return lambda i, reply, features, greedy: cache.put(
        Sequence(keys[i], np.asarray(encoded[i] + reply, dtype=np.int64), len(encoded[i])), features, greedy)


def _shipped_taps() -> list[int]:
    config = json.loads((Path(MODEL_PAIRS["smollm2-135m"].drafter) / "config.json").read_text())
    return config["dflash_config"]["target_layer_ids"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/data", help="folder for the shards (created; resumable)")
    ap.add_argument("--engine", choices=["continuous", "generate"], default="continuous",
                    help="continuous: a finished reply's slot takes the next prompt at once (no padded rows); "
                         "generate: transformers generate on fixed batches")
    ap.add_argument("--batch-size", type=int, default=16, help="prompts generated together (slots)")
    ap.add_argument("--batches-per-shard", type=int, default=4, help="batches written per shard file")
    ap.add_argument("--max-new-tokens", type=int, default=512, help="reply length cap")
    ap.add_argument("--max-prompt-tokens", type=int, default=512, help="longer prompts are cut")
    ap.add_argument("--sample-every", type=int, default=5,
                    help="every n-th prompt (batch with --engine generate) is sampled (T=0.8), the rest greedy")
    ap.add_argument("--limit", type=int, default=0, help="stop after this many prompts in total (0 = all)")
    ap.add_argument("--round", type=int, default=1,
                    help="1: one reply per prompt as --sample-every says; 2, 3, ...: another reply to every prompt, "
                         "all sampled (keys '<prompt key>#r<round>')")
    ap.add_argument("--skip-sources", type=lambda s: [x for x in s.split(",") if x], default=[],
                    help="prompt sources left unanswered, comma-separated (e.g. gsm8k_train: a later round of the "
                         "broader prompts only)")
    add_dtype_option(ap)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--export-replies", default=None,
                    help="instead of generating: write the replies of --out's shards (no prompts) to this .npz")
    ap.add_argument("--features", default=None,
                    help="also store each reply's target features and greedy choices here, for training's feature "
                         "cache (give train's OUT/features; --engine continuous)")
    ap.add_argument("--taps", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="target layers whose outputs --features stores (default: the shipped drafter's taps)")
    ap.add_argument("--mix", action="store_true", help="instead of generating: the replies of --out by source")
    args = ap.parse_args()
    if args.export_replies:
        print(f"{export_replies(args.out, args.export_replies)} replies -> {args.export_replies}")
        return
    if args.mix:
        print(source_mix(args.out))
        return
    args.taps = args.taps or _shipped_taps()
    if args.round < 1:
        ap.error(f"--round counts from 1 (got {args.round})")
    if args.skip_sources:          # the prompts are read once more only when there is a name to check
        known = {prompt_source(p.key) for p in training_prompts(args.seed)}
        if set(args.skip_sources) - known:
            ap.error(f"--skip-sources: no prompt source {sorted(set(args.skip_sources) - known)}; "
                     f"the sources are {', '.join(sorted(known))}")
    if args.threads:
        torch.set_num_threads(args.threads)
    announce_dtype(args.dtype)
    signal.signal(signal.SIGTERM, _interrupt)      # `kill` keeps the finished replies too, as Ctrl-C does
    generate(args)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
