"""What the decode loop reports: one `StepRecord` per target forward, and pure aggregation into a `RunSummary`.

Conventions (the papers'): tau = tokens committed per target forward, counting the bonus token; a run's tau is the
mean of per-prompt means; tokens/s and phase shares exclude the prefill, which is timed on its own. Records hold
plain Python and numpy data only, so the app can keep them in session state and `viz/` can read them without torch.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from core.tree import DraftTree

PHASES = ("draft", "tree", "verify", "accept", "compact")


@dataclass
class StepRecord:
    step: int                        # 0 = prefill, then 1, 2, ... one per verification forward
    tree: DraftTree                  # the verified tree (root only for plain decoding and the prefill)
    accepted: list[int]              # accepted node indices, root first
    bonus: int                       # the target's token after the accepted path
    committed: list[int]             # token ids emitted by this step (accepted drafts, then the bonus; cut at a stop)
    text: str                        # their decoded text
    seconds: dict[str, float]        # per phase: draft, tree, verify, accept, compact (prefill: {"prefill": s})
    p_committed: list[float]         # the target's probability of each committed token
    nested: bool = False             # the builder is nested: the first b nodes are the budget-b tree
    draft_logq: np.ndarray | None = None    # [L, K'] drafter candidates' log q (K' <= 64), for the oracle and viz
    draft_tokens: np.ndarray | None = None  # [L, K'] their token ids
    oracle_depth: int | None = None  # longest prefix of the target's continuation inside the drafter's top-K
    #                                  (`fill_oracle`, once the run is over and the continuation known)
    budget_used: int = 0             # the budget the builder was given (adaptive methods choose it per step)
    finish: str | None = None        # why the run ended after this step: "stop", "length", "context"
    runner_up: list[tuple[int, float]] = field(default_factory=list)  # greedy: per committed token, the target's
    #                                  second choice and the logit gap to it (`core.divergence` reads them)

    @property
    def tau(self) -> int:
        """Tokens this forward committed (accepted drafts + bonus): the acceptance length."""
        return len(self.committed)

    @property
    def accepted_drafts(self) -> int:
        return len(self.accepted) - 1

    @property
    def expected_accepted(self) -> float:
        return self.tree.expected_accepted

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def tau_at(self, budget: int) -> int | None:
        """Acceptance length the budget-`budget` tree would have had at this step (nested builders; exact for
        the same target draws): path nodes have increasing indices, so it is the accepted nodes numbered <= budget,
        plus the bonus, and no more than this step committed (a stop token cuts both at the same place)."""
        if not self.nested:
            return None
        return min(1 + sum(1 for i in self.accepted[1:] if i <= budget), self.tau)


@dataclass
class RunSummary:
    tau: float                        # mean over prompts of the per-prompt mean acceptance length
    tokens: int                       # generated tokens (prefill token included)
    steps: int                        # verification forwards
    decode_seconds: float             # all phases of all decode steps
    prefill_seconds: float
    tokens_per_second: float          # decode tokens / decode seconds (prefill token and time excluded)
    phase_shares: dict[str, float]    # share of decode time per phase
    histogram: dict[int, int]         # acceptance length -> number of steps
    depth_rates: list[float]          # [d-1] = share of steps that accepted a draft at depth >= d
    expected_tau: float               # 1 + mean expected accepted drafts (sum of q over the tree)
    oracle_tau: float | None = None   # 1 + mean oracle depth, capped at the budget: a perfect ranker's acceptance
    per_prompt_tau: list[float] = field(default_factory=list)


@contextmanager
def timed(seconds: dict, name: str, sync=None):
    """Add the block's wall time to seconds[name]; `sync` (e.g. torch.cuda.synchronize) runs before reading."""
    if sync:
        sync()
    t0 = time.perf_counter()
    yield
    if sync:
        sync()
    seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0


def fill_oracle(run: list[StepRecord]) -> None:
    """Oracle depth of every drafted step of a finished run: how far the target's actual continuation (the tokens
    this and the later steps committed) stays inside the drafter's recorded top-K at every depth."""
    flat = [t for r in run for t in r.committed]
    start = 0
    for record in run:
        if record.draft_tokens is not None:
            continuation = flat[start: start + record.draft_tokens.shape[0]]
            depth = 0
            while depth < len(continuation) and continuation[depth] in record.draft_tokens[depth]:
                depth += 1
            record.oracle_depth = depth
        start += len(record.committed)


def summarize(runs: list[list[StepRecord]]) -> RunSummary:
    """Aggregate one or more prompts' records (each list starts with its prefill record)."""
    decode = [r for run in runs for r in run if r.step > 0]
    per_prompt = [float(np.mean([r.tau for r in run if r.step > 0])) for run in runs if any(r.step for r in run)]
    secs = {p: sum(r.seconds.get(p, 0.0) for r in decode) for p in PHASES}
    total = sum(secs.values())
    prefill = sum(r.seconds.get("prefill", 0.0) for run in runs for r in run if r.step == 0)
    tokens = sum(len(r.committed) for run in runs for r in run)
    decode_tokens = sum(len(r.committed) for r in decode)
    hist: dict[int, int] = {}
    for r in decode:
        hist[r.tau] = hist.get(r.tau, 0) + 1
    depth = max((r.tree.max_depth for r in decode), default=0)
    rates = [sum(1 for r in decode if r.accepted_drafts >= d) / len(decode) for d in range(1, depth + 1)]
    oracle = [min(r.oracle_depth, r.budget_used) for r in decode if r.oracle_depth is not None]
    return RunSummary(
        tau=float(np.mean(per_prompt)) if per_prompt else 0.0, tokens=tokens, steps=len(decode),
        decode_seconds=total, prefill_seconds=prefill,
        tokens_per_second=decode_tokens / total if total > 0 else 0.0,
        phase_shares={p: (s / total if total > 0 else 0.0) for p, s in secs.items()},
        histogram=dict(sorted(hist.items())), depth_rates=rates,
        expected_tau=1.0 + float(np.mean([r.expected_accepted for r in decode])) if decode else 0.0,
        oracle_tau=1.0 + float(np.mean(oracle)) if oracle else None, per_prompt_tau=per_prompt)
