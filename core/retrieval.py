"""Retrieval drafting: continuations of the current suffix found earlier in the prompt and the reply.

Prompt lookup (Saxena 2023; `transformers`' `prompt_lookup_num_tokens`) proposes the tokens that followed the last
occurrence of the context's final n-gram. Replies copy from their prompt (code edits, quoted numbers, names) and
from themselves (repeated phrases), exactly where a drafter trained on other text is weakest. Here:
- `SuffixIndex`: every n-gram (n <= max_n) of a growing token list -> the positions where it ends, updated as
  tokens commit, so the continuations of any suffix cost max_n dictionary look-ups;
- `Calibration`: how often a retrieved token is accepted given its parent was, by match length, counted online
  with a prior, so retrieved nodes and the drafter's q share one probability scale in the hybrid tree.
Pure Python, no model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_N = 4          # longest suffix matched; longer matches than this count as MAX_N
MAX_MATCH = 8      # match lengths the calibration tells apart; a chain's match grows by one per copied token
# prior acceptance rate of a retrieved token by match length 1..MAX_MATCH, worth PRIOR_WEIGHT observed trials
PRIOR = (0.15, 0.3, 0.45, 0.55, 0.6, 0.65, 0.7, 0.7)
PRIOR_WEIGHT = 2.0
SCAN = 64          # most recent occurrences of one n-gram looked at per query (bounds a frequent token's cost)


@dataclass(frozen=True)
class Match:
    tokens: tuple[int, ...]   # the continuation: what followed the matched n-gram, at most `depth` tokens
    length: int               # n, the suffix tokens matched


class SuffixIndex:
    """Positions of every n-gram, n = 1..max_n, of a token list that only grows (prompt, then committed tokens)."""

    def __init__(self, max_n: int = MAX_N):
        self.max_n = max_n
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = {}   # n-gram -> end positions, oldest first

    def sync(self, history: list[int]) -> None:
        """Index `history`, which extends what was indexed before (else it is re-indexed from scratch)."""
        n = len(self.tokens)
        if n > len(history) or (n and history[n - 1] != self.tokens[-1]) or (n and history[0] != self.tokens[0]):
            self.tokens, self.ends, n = [], {}, 0
        for token in history[n:]:
            self.tokens.append(token)
            end = len(self.tokens) - 1
            for k in range(1, min(self.max_n, end + 1) + 1):
                self.ends.setdefault(tuple(self.tokens[end - k + 1: end + 1]), []).append(end)

    def continuations(self, suffix: list[int], depth: int, max_candidates: int = 4) -> list[Match]:
        """Up to `max_candidates` continuations of `suffix` (at most `depth` tokens each, distinct first tokens):
        longest match first, and among equal lengths the most recent occurrence first."""
        out: list[Match] = []
        if depth <= 0 or max_candidates <= 0:
            return out
        seen: set[int] = set()
        last = len(self.tokens) - 1
        for n in range(min(self.max_n, len(suffix)), 0, -1):
            for end in reversed(self.ends.get(tuple(suffix[len(suffix) - n:]), [])[-SCAN:]):
                if end >= last or self.tokens[end + 1] in seen:    # nothing follows it yet, or already proposed
                    continue
                seen.add(self.tokens[end + 1])
                out.append(Match(tuple(self.tokens[end + 1: end + 1 + depth]), n))
                if len(out) == max_candidates:
                    return out
        return out


class Calibration:
    """P(a retrieved token is accepted | its parent was), per match length, from the steps verified so far."""

    def __init__(self):
        self.hits = PRIOR_WEIGHT * np.asarray(PRIOR, dtype=np.float64)     # [MAX_MATCH]
        self.trials = np.full(MAX_MATCH, PRIOR_WEIGHT)

    def logp(self, length: int) -> float:
        m = min(max(length, 1), MAX_MATCH) - 1
        return math.log(self.hits[m] / self.trials[m])

    def update(self, parents: list[int], accepted: list[int], lengths: list[int]) -> None:
        """Count every retrieved node (lengths[i] > 0) whose parent was accepted: a trial, a hit if it was too."""
        on_path = set(accepted)
        for i in range(1, len(parents)):
            if lengths[i] > 0 and parents[i] in on_path:
                m = min(lengths[i], MAX_MATCH) - 1
                self.trials[m] += 1
                self.hits[m] += i in on_path
