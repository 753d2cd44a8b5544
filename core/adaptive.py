"""Adaptive node budget (`ddtree-auto`, `presto-auto`): pick, at every step, the budget that maximises expected
committed tokens per second, instead of asking the user for one.

For a nested builder the budget-b tree is the first b nodes of the largest tree, so one build gives every
candidate budget at once. With C(b) the sum of q over the first b nodes (the expected accepted drafts, DDTree's
Proposition 1), the rule is
    b* = argmax_b  (1 + alpha * C(b)) / (overhead + s * verify(b + 1))
where verify(n) is the target's measured forward latency for n tree tokens (`core.costs`, cached per model, device
and dtype; before it is measured, an estimated line whose intercept and slope are then fitted to the steps' own
verification times), alpha calibrates the drafter's q against the acceptance actually realised, s rescales the
cached curve
to the latency seen now, and overhead is the measured draft + tree + accept time. All three are updated online from
each step's record, with exponential forgetting.
"""
from __future__ import annotations

import math

import numpy as np

from core.builders import TreeBuilder, as_builder
from core.tree import DraftTree, truncate

DECAY = 0.9   # weight of the past in the online estimates (about the last ten steps count)
MAX_PAUSE = 64  # most plain steps between two probes while drafting does not pay


def interpolate_cost(curve: dict[int, float], n: np.ndarray) -> np.ndarray:
    """Verification ms for n tree tokens: linear between measured sizes, the last slope beyond them."""
    sizes = np.asarray(sorted(curve), dtype=np.float64)
    ms = np.asarray([curve[int(s)] for s in sizes], dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    out = np.interp(n, sizes, ms)
    if len(sizes) > 1:
        slope = max(0.0, (ms[-1] - ms[-2]) / (sizes[-1] - sizes[-2]))
        out = np.where(n > sizes[-1], ms[-1] + slope * (n - sizes[-1]), out)
    return out


def choose_budget(node_q: np.ndarray, verify_ms: np.ndarray, overhead_ms: float, alpha: float = 1.0) -> int:
    """The b in 0..len(node_q) maximising (1 + alpha * sum(node_q[:b])) / (overhead_ms + verify_ms[b]).

    node_q: [B] q(u) of the nested tree's drafted nodes in build order; verify_ms: [B + 1] latency of a tree of
    b + 1 tokens (root included). Ties go to the smaller budget."""
    gain = 1.0 + alpha * np.concatenate([[0.0], np.cumsum(np.asarray(node_q, dtype=np.float64))])   # [B + 1]
    rate = gain / (overhead_ms + np.asarray(verify_ms, dtype=np.float64))
    return int(np.argmax(rate))


class LineFit:
    """verify ms = a + b * n fitted online (least squares, exponential forgetting) to (tree tokens, ms) pairs,
    regularised by two fixed pseudo-observations of a prior line, so that steps that all verify one size still
    give a line (their level, the prior's slope)."""

    def __init__(self, prior: np.ndarray, prior_weight: float = 0.05):
        self.prior, self.w0 = prior, prior_weight      # prior: [cap + 1] ms for 1..cap + 1 tree tokens
        self.stats = np.zeros(5)                       # decayed sums of w, w n, w t, w n^2, w n t
        self.shift = 1.0                               # the prior rescaled to the first observation's level

    def add(self, n: int, ms: float) -> None:
        if not self.stats[0]:
            self.shift = ms / float(self.prior[min(n, len(self.prior)) - 1])
        self.stats = DECAY * self.stats + np.array([1.0, n, ms, n * n, n * ms])

    def __call__(self) -> np.ndarray:
        ends = np.array([1.0, float(len(self.prior))])
        w, sn, st, snn, snt = self.stats + self.w0 * np.array(
            [2.0, ends.sum(), self.shift * (self.prior[0] + self.prior[-1]), (ends ** 2).sum(),
             self.shift * (self.prior[0] + ends[1] * self.prior[-1])])
        slope = max(0.0, (w * snt - sn * st) / (w * snn - sn * sn))
        n = np.arange(1, len(self.prior) + 1, dtype=np.float64)
        return np.maximum(st / w + slope * (n - sn / w), 1e-3)


class AdaptiveBudget(TreeBuilder):
    """A builder wrapper: build the nested tree at the cap, keep the best prefix. `observe(record)` is called by
    the engine after each step and updates the calibration; `choices` lists the budget chosen at every step.
    With `measured=False` the curve is only an estimate, and a line fitted to the steps' own costs replaces it."""

    def __init__(self, base, cost_curve: dict[int, float], cap: int, measured: bool = True):
        self.base, self.cap = as_builder(base), cap
        self.verify_ms = interpolate_cost(cost_curve, np.arange(1, cap + 2))    # [cap + 1] for b = 0..cap
        self.fit = None if measured else LineFit(self.verify_ms)
        self.realised = self.expected = 1.0     # alpha = realised / expected accepted drafts (prior: alpha = 1)
        self.seen_ms = self.predicted_ms = 1.0  # s = measured / cached verification latency
        self.overhead_ms = 0.1 * float(self.verify_ms[0])
        self.choices: list[int] = []
        self.pause = self.backoff = 0          # plain steps left before the next draft; the current back-off
        self.speed = {True: [0.0, 0.0], False: [0.0, 0.0]}   # drafted / plain steps: decayed tokens, seconds

    @property
    def alpha(self) -> float:
        return self.realised / self.expected

    @property
    def scale(self) -> float:
        return self.seen_ms / self.predicted_ms

    def __call__(self, draft, budget, bonus, history) -> DraftTree:
        # build no more than twice the largest recent choice (at least 32): the best budget can still double
        # every step, and a cap of hundreds does not cost a hundreds-node heap at every step
        recent = self.choices[-32:]
        grow = min(self.cap, max(32, 2 * max(recent))) if recent else self.cap
        tree = self.base(draft, min(budget, grow), bonus, history)
        node_q = np.exp(np.asarray(tree.prefix_logq[1:], dtype=np.float64))
        curve = self.fit() if self.fit is not None and self.fit.stats[0] else self.scale * self.verify_ms
        verify = curve[: tree.size + 1]
        b = choose_budget(node_q, verify, self.overhead_ms, self.alpha)
        self.choices.append(b)
        return truncate(tree, b)

    def rate(self, drafted: bool) -> float:
        """Committed tokens per ms measured over recent drafted (or plain) steps."""
        tokens, seconds = self.speed[drafted]
        return tokens / (1000 * seconds) if seconds else 0.0

    def should_draft(self) -> bool:
        """False while drafting does not pay for itself: those steps run as plain decoding, without the drafter's
        forward, and a probe after 1, 4, 16 ... up to MAX_PAUSE of them checks whether it pays again (each drafted
        step that pays makes the next pause 4x shorter)."""
        if self.pause:
            self.pause -= 1
            return False
        return True

    def observe(self, record) -> None:
        self.base.observe(record)            # a builder with memory (hybrid) learns too
        drafted = record.draft_tokens is not None
        for kind, (tokens, seconds) in self.speed.items():      # both decay: after a long pause, a probe counts
            mine = kind == drafted
            self.speed[kind] = [DECAY * tokens + mine * record.tau, DECAY * seconds + mine * record.total_seconds]
        if not drafted:
            return
        plain = self.rate(False) or 1 / (self.scale * float(self.verify_ms[0]))   # before any plain step: the curve
        if self.rate(True) < plain:           # plain steps (no drafter forward) have been faster: pause drafting
            self.backoff = min(MAX_PAUSE, 4 * self.backoff or 1)
            self.pause = self.backoff
        elif record.tau >= plain * 1000 * record.total_seconds:   # this step paid: the next pause is 4x shorter,
            self.backoff //= 4                # so a lone lucky probe shortens it once, not back to one step
        s = record.seconds
        n = record.tree.size
        self.realised = DECAY * self.realised + record.accepted_drafts
        self.expected = DECAY * self.expected + record.expected_accepted
        if "verify" in s and self.fit is not None:
            self.fit.add(n + 1, 1000 * s["verify"])
        if "verify" in s:
            self.seen_ms = DECAY * self.seen_ms + 1000 * s["verify"]
            self.predicted_ms = DECAY * self.predicted_ms + float(self.verify_ms[min(n, self.cap)])
        other = 1000 * sum(v for k, v in s.items() if k != "verify")
        if math.isfinite(other):
            self.overhead_ms = DECAY * self.overhead_ms + (1 - DECAY) * other
