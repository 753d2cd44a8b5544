"""Token n-gram model behind PRESTO's prefix-aligned score: p_ng(token | previous n-1 tokens).

Interpolated (Jelinek-Mercer) smoothing over orders n..1 plus a uniform floor, so every probability is > 0 and,
for any context, the probabilities sum to 1 over the vocabulary. Orders whose context was never seen drop out and
the remaining weights are renormalised. Counts come from a static table built from the target's own generations
(the drafter's training data) plus online counts of the current request (prompt and tokens generated so far).

    python -m core.training.build_ngram --data runs/data --out assets/ngram/smollm2-135m-3gram.npz [--order 3]
"""
from __future__ import annotations

import functools
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
                             f"`{build_command(path)}`") from e
        return cls(order, vocab, rows)


def _row(counter: Counter) -> tuple[np.ndarray, np.ndarray]:
    toks = np.array(sorted(counter), dtype=np.int32)
    return toks, np.array([counter[t] for t in toks.tolist()], dtype=np.int32)


class NgramModel:
    """p_ng over the vocabulary for a context: static table + online counts of the current request.

    Lookups run once per expanded tree node, so they are vectorised over the node's K candidates: unigram counts
    are a dense [V] array, and each higher-order context's row (static and online counts merged, sorted by token)
    is built once and cached until `observe` counts that context again."""

    def __init__(self, vocab: int, order: int = 3, table: NgramTable | None = None,
                 weights: tuple[float, ...] | None = None):
        if order < 1:
            raise ValueError(f"n-gram order must be >= 1 (got {order})")
        if table is not None and table.order < order:
            raise ValueError(f"the n-gram table has order {table.order}, fewer than the requested {order}")
        self.vocab, self.order, self.table = vocab, order, table
        self.weights = weights or DEFAULT_WEIGHTS.get(order) or tuple(0.5 ** i for i in range(order))
        self.online: dict[int, dict[int, Counter]] = {j: defaultdict(Counter) for j in range(2, order + 1)}
        self.unigram = np.zeros(max(vocab, table.vocab if table else 0))   # [V] static + online counts
        if table is not None and 0 in table.rows[1]:
            toks, cnt = table.rows[1][0]
            self.unigram[toks] += cnt
        self.unigram_total = float(self.unigram.sum())
        self._rows: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, float] | None] = {}   # merged, cached
        self.seen = 0   # tokens of the request already counted

    def observe(self, history: list[int]) -> None:
        """Count the request's tokens not yet counted (the prompt first, then each step's committed tokens)."""
        for i in range(self.seen, len(history)):
            self.unigram[history[i]] += 1
            self.unigram_total += 1
            for j in range(2, self.order + 1):
                if i - (j - 1) < 0:
                    break
                key = context_key(history[i - j + 1: i])
                self.online[j][key][history[i]] += 1
                self._rows.pop((j, key), None)
        self.seen = len(history)

    def logprobs(self, context: list[int], candidates: np.ndarray) -> np.ndarray:
        """[K] log p_ng(candidate | last order-1 tokens of context); always finite."""
        cands = np.asarray(candidates, dtype=np.int64)
        mix = np.zeros(len(cands))
        total_w = FLOOR
        for level, j in enumerate(range(self.order, 0, -1)):
            if j == 1:
                num, den = self.unigram[cands], self.unigram_total
            else:
                if len(context) < j - 1:
                    continue
                row = self._merged_row(j, context_key(context[len(context) - (j - 1):]))
                if row is None:
                    continue
                toks, cnt, den = row
                idx = np.searchsorted(toks, cands).clip(max=len(toks) - 1)
                num = np.where(toks[idx] == cands, cnt[idx], 0.0)
            if den > 0:
                w = self.weights[level]
                mix += w * num / den
                total_w += w
        return np.log((mix + FLOOR / self.vocab) / total_w)

    def _merged_row(self, j: int, key: int) -> tuple[np.ndarray, np.ndarray, float] | None:
        """(sorted next tokens, counts, total) of a context, static and online counts together; None if unseen."""
        try:
            return self._rows[(j, key)]
        except KeyError:
            pass
        static = self.table.rows[j].get(key) if self.table is not None else None
        extra = self.online[j].get(key)
        if extra:
            merged = Counter(dict(zip(static[0].tolist(), static[1].tolist()))) if static is not None else Counter()
            merged.update(extra)
            toks, cnt = _row(merged)
            row = (toks, cnt.astype(np.float64), float(cnt.sum()))
        elif static is not None:
            row = (static[0], static[1].astype(np.float64), float(static[1].sum()))
        else:
            row = None
        self._rows[(j, key)] = row
        return row


def load_model(path: str | Path | None, vocab: int, order: int = 3) -> NgramModel:
    """The n-gram model for PRESTO. A missing table falls back to online-only counts (with a warning);
    a corrupt one is an error."""
    if path is None:
        warnings.warn("this model pair has no n-gram table: PRESTO uses only the request's own n-gram counts "
                      f"(build one with `{build_command('assets/ngram/PAIR-3gram.npz', vocab, order)}` and name it "
                      "in the pair's `ngram_table`, core/config.py)", stacklevel=2)
        return NgramModel(vocab, order)
    if not Path(path).exists():
        warnings.warn(f"n-gram table {path} not found: PRESTO uses only the request's own n-gram counts "
                      f"(build it with `{build_command(path, vocab, order)}`)", stacklevel=2)
        return NgramModel(vocab, order)
    path = Path(path)
    return NgramModel(vocab, order, _cached_table(str(path.resolve()), path.stat().st_mtime_ns))


def build_command(out: str | Path, vocab: int | None = None, order: int = 3) -> str:
    """The command that builds a table at `out` from the target's replies (`core.training.generate_data`'s);
    without `vocab`, the embedded target's vocabulary size (the command's default)."""
    sizes = f" --order {order} --vocab {vocab}" if vocab is not None else ""
    return f"python -m core.training.build_ngram --data runs/data --out {out}{sizes}"


@functools.lru_cache(maxsize=4)
def _cached_table(path: str, mtime_ns: int) -> NgramTable:
    """Tables are read-only (a model keeps its online counts apart), so requests share one load per file version."""
    return NgramTable.load(path)
