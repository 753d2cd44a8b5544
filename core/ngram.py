"""Token n-gram model behind PRESTO's prefix-aligned score: p_ng(token | previous n-1 tokens).

Interpolated (Jelinek-Mercer) smoothing over orders n..1 plus a uniform floor, so every probability is > 0 and,
for any context, the probabilities sum to 1 over the vocabulary. Orders whose context was never seen drop out and
the remaining weights are renormalised. Counts come from a static table built from the target's own generations
(the drafter's training data) plus online counts of the current request (prompt and tokens generated so far).

    python -m core.ngram build --data runs/data --out assets/ngram/smollm2-135m-3gram.npz [--order 3]
"""
from __future__ import annotations

import argparse
import os
import warnings
import zipfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

DEFAULT_WEIGHTS = {1: (1.0,), 2: (0.7, 0.3), 3: (0.6, 0.3, 0.1)}   # highest order first
FLOOR = 0.01                                                         # weight of the uniform distribution
_MOD, _MUL = (1 << 61) - 1, 1_000_003


def context_key(tokens) -> int:
    """Hash of a context tuple (an int, stable across runs); the empty context is 0."""
    h = 0
    for t in tokens:
        h = (h * _MUL + int(t) + 1) % _MOD
    return h


class NgramTable:
    """Static counts: for each order j, contexts of length j-1 -> (sorted next tokens, counts)."""

    def __init__(self, order: int, vocab: int, rows: dict[int, dict[int, tuple[np.ndarray, np.ndarray]]]):
        self.order, self.vocab, self.rows = order, vocab, rows   # rows[j][context key] = (tokens, counts)

    @classmethod
    def build(cls, sequences, order: int, vocab: int) -> "NgramTable":
        counts: dict[int, dict[int, Counter]] = {j: defaultdict(Counter) for j in range(1, order + 1)}
        for seq in sequences:
            seq = [int(t) for t in seq]
            for i, tok in enumerate(seq):
                for j in range(1, order + 1):
                    if i - (j - 1) < 0:
                        break
                    counts[j][context_key(seq[i - j + 1: i])][tok] += 1
        rows = {j: {k: _row(c) for k, c in table.items()} for j, table in counts.items()}
        return cls(order, vocab, rows)

    def save(self, path: str | Path) -> None:
        arrays = {"meta": np.array([self.order, self.vocab], dtype=np.int64)}
        for j, table in self.rows.items():
            keys = np.fromiter(table.keys(), dtype=np.int64, count=len(table))
            lengths = np.array([len(t[0]) for t in table.values()], dtype=np.int64)
            arrays[f"keys{j}"] = keys
            arrays[f"ptr{j}"] = np.concatenate([[0], np.cumsum(lengths)])
            arrays[f"tok{j}"] = np.concatenate([t[0] for t in table.values()]) if table else np.zeros(0, np.int32)
            arrays[f"cnt{j}"] = np.concatenate([t[1] for t in table.values()]) if table else np.zeros(0, np.int32)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez_compressed(tmp, **arrays)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> "NgramTable":
        """ValueError with the file named if it is missing or not a table written by `save`."""
        try:
            with np.load(path, allow_pickle=False) as d:
                order, vocab = (int(x) for x in d["meta"])
                rows = {}
                for j in range(1, order + 1):
                    keys, ptr, tok, cnt = d[f"keys{j}"], d[f"ptr{j}"], d[f"tok{j}"], d[f"cnt{j}"]
                    rows[j] = {int(k): (tok[ptr[i]: ptr[i + 1]], cnt[ptr[i]: ptr[i + 1]])
                               for i, k in enumerate(keys.tolist())}
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise ValueError(f"n-gram table {path} is missing or unreadable ({e}); rebuild it with "
                             "`python -m core.ngram build`") from e
        return cls(order, vocab, rows)


def _row(counter: Counter) -> tuple[np.ndarray, np.ndarray]:
    toks = np.array(sorted(counter), dtype=np.int32)
    return toks, np.array([counter[t] for t in toks.tolist()], dtype=np.int32)


class NgramModel:
    """p_ng over the vocabulary for a context: static table + online counts of the current request."""

    def __init__(self, vocab: int, order: int = 3, table: NgramTable | None = None,
                 weights: tuple[float, ...] | None = None):
        if order < 1:
            raise ValueError(f"n-gram order must be >= 1 (got {order})")
        if table is not None and table.order < order:
            raise ValueError(f"the n-gram table has order {table.order}, fewer than the requested {order}")
        self.vocab, self.order, self.table = vocab, order, table
        self.weights = weights or DEFAULT_WEIGHTS.get(order) or tuple(0.5 ** i for i in range(order))
        self.online: dict[int, dict[int, Counter]] = {j: defaultdict(Counter) for j in range(1, order + 1)}
        self.seen = 0   # tokens of the request already counted

    def observe(self, history: list[int]) -> None:
        """Count the request's tokens not yet counted (the prompt first, then each step's committed tokens)."""
        for i in range(self.seen, len(history)):
            for j in range(1, self.order + 1):
                if i - (j - 1) < 0:
                    break
                self.online[j][context_key(history[i - j + 1: i])][history[i]] += 1
        self.seen = len(history)

    def logprobs(self, context: list[int], candidates: np.ndarray) -> np.ndarray:
        """[K] log p_ng(candidate | last order-1 tokens of context); always finite."""
        cands = np.asarray(candidates, dtype=np.int64)
        mix = np.zeros(len(cands))
        total_w = FLOOR
        for level, j in enumerate(range(self.order, 0, -1)):
            ctx = context[len(context) - (j - 1):] if j > 1 else []
            if j > 1 and len(context) < j - 1:
                continue
            key = context_key(ctx)
            num, den = self._counts(j, key, cands)
            if den > 0:
                w = self.weights[level]
                mix += w * num / den
                total_w += w
        return np.log((mix + FLOOR / self.vocab) / total_w)

    def _counts(self, j: int, key: int, cands: np.ndarray) -> tuple[np.ndarray, float]:
        num, den = np.zeros(len(cands)), 0.0
        row = self.table.rows[j].get(key) if self.table is not None else None
        if row is not None:
            toks, cnt = row
            idx = np.searchsorted(toks, cands).clip(max=len(toks) - 1)
            num += np.where(toks[idx] == cands, cnt[idx], 0)
            den += float(cnt.sum())
        extra = self.online[j].get(key)
        if extra:
            num += np.array([extra.get(int(c), 0) for c in cands])
            den += float(sum(extra.values()))
        return num, den


def load_model(path: str | Path | None, vocab: int, order: int = 3) -> NgramModel:
    """The n-gram model for PRESTO. A missing table falls back to online-only counts (with a warning);
    a corrupt one is an error."""
    if path is None or not Path(path).exists():
        warnings.warn(f"n-gram table {path} not found: PRESTO uses only the request's own n-gram counts "
                      "(build the table with `python -m core.ngram build`)", stacklevel=2)
        return NgramModel(vocab, order)
    return NgramModel(vocab, order, NgramTable.load(path))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="count n-grams of the target's generations")
    b.add_argument("--data", default="runs/data", help="shards from core.training.generate_data")
    b.add_argument("--out", default="assets/ngram/smollm2-135m-3gram.npz")
    b.add_argument("--order", type=int, default=3)
    b.add_argument("--vocab", type=int, default=49152)
    args = ap.parse_args(argv)
    from core.training.data import load_sequences
    from core.training.prompts import is_held_out, training_prompts

    allowed = {p.key for p in training_prompts() if not is_held_out(p.key)}   # never an evaluation prompt's reply
    seqs = [s.ids[s.prompt_len:] for s in load_sequences(args.data) if s.key in allowed]
    table = NgramTable.build(seqs, args.order, args.vocab)
    table.save(args.out)
    print(f"{sum(len(s) for s in seqs)} tokens from {len(seqs)} replies -> {args.out} "
          f"({Path(args.out).stat().st_size / 1e6:.1f} MB; contexts per order: "
          f"{ {j: len(r) for j, r in table.rows.items()} })")


if __name__ == "__main__":
    main()
