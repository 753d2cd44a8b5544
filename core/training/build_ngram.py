"""Count the n-grams of the target's own generations (the drafter's training replies) into the static table that
PRESTO's n-gram model reads (`core.ngram.NgramTable`). Held-out and evaluation prompts' replies are never counted.

    python -m core.training.build_ngram --data runs/data --out assets/ngram/smollm2-135m-3gram.npz [--order 3]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from core.ngram import NgramTable
from core.training.data import load_replies
from core.training.prompts import is_held_out, prompt_key, training_prompts


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="runs/data",
                    help="shards (and replies archives) from core.training.generate_data")
    ap.add_argument("--out", default="assets/ngram/smollm2-135m-3gram.npz")
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=49152)
    args = ap.parse_args(argv)
    allowed = {p.key for p in training_prompts() if not is_held_out(p.key)}   # never an evaluation prompt's reply
    seqs = [r for key, r in load_replies(args.data).items() if prompt_key(key) in allowed]
    table = NgramTable.build(seqs, args.order, args.vocab)
    table.save(args.out)
    print(f"{sum(len(s) for s in seqs)} tokens from {len(seqs)} replies -> {args.out} "
          f"({Path(args.out).stat().st_size / 1e6:.1f} MB; contexts per order: "
          f"{ {j: len(r) for j, r in table.rows.items()} })")


if __name__ == "__main__":
    main()
