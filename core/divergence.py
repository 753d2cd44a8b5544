"""Where a greedy run first differs from plain decoding, and whether that is rounding or a fault.

Every method is lossless in exact arithmetic: at temperature 0 it emits the target's argmax after the same prefix.
In bf16 a tree verification computes the target's logits in a wider forward than plain decoding's one-token one,
and the products round differently; where the target's two best tokens are nearly tied, the argmax can flip. The
outputs then differ from that token on, and the fault is the tie, not the method. A gap far above what rounding
moves is a bug. Both runs record, for every token, the runner-up and the logit gap (`StepRecord.runner_up`).
"""
from __future__ import annotations

from dataclasses import dataclass

# A flip by rounding means the two forwards moved l_a - l_b by plain_gap + gap, at most twice the largest movement
# of one logit. One-token against 17-token forwards of the embedded target moved its top-2 logits by a median 0.125,
# a 99th percentile 0.375 and at most 0.625 in bf16 (238 positions; in fp32 by under 1e-4: BENCHMARKS.md, "Lossless
# on screen"), so a rounding flip has plain_gap + gap <= 1.25; 1.5 leaves a margin for positions not measured.
NEAR_TIE = 1.5


@dataclass(frozen=True)
class Divergence:
    position: int        # index of the first differing token in the generated text (0 = the prefill's token)
    step: int            # the run's step that emitted it
    plain: int           # the token plain decoding chose there
    chosen: int          # the token the run chose there
    plain_gap: float     # plain decoding's top-1 minus top-2 logit at that position (nan if not recorded)
    gap: float           # the run's, in its own (wider) forward
    plain_second: int | None = None   # plain decoding's runner-up there
    second: int | None = None         # the run's runner-up there

    @property
    def near_tie(self) -> bool:
        """The flip needs the two tokens' logit difference to move by plain_gap + gap (at least that when a third
        token is involved): within what rounding moves. Native bf16 logits near 20 lie 0.125 apart, so three or more
        tokens often tie exactly (both gaps 0), and the recorded runner-ups are then any of the tied tokens."""
        return self.plain_gap + self.gap <= NEAR_TIE

    @property
    def swapped(self) -> bool:
        """The same two tokens, ranked the other way round: the gap sum is then exactly the movement."""
        return self.plain_second == self.chosen and self.second == self.plain


def flatten(records) -> tuple[list[int], list[int], list[tuple[int, float] | None]]:
    """Every committed token of a run in order, the step that emitted it, and its (runner-up, gap) if recorded."""
    tokens, steps, second = [], [], []
    for r in records:
        for j, t in enumerate(r.committed):
            tokens.append(t)
            steps.append(r.step)
            second.append(tuple(r.runner_up[j]) if j < len(r.runner_up) else None)
    return tokens, steps, second


def first_difference(plain: tuple, run: tuple) -> Divergence | None:
    """`flatten`ed plain decoding against `flatten`ed run (steps may be empty): the first token that differs;
    None if one is a prefix of the other (equal up to the shorter, as when a run was stopped)."""
    nan = float("nan")
    for i, (a, b) in enumerate(zip(plain[0], run[0])):
        if a != b:
            pa, pgap = plain[2][i] if i < len(plain[2]) and plain[2][i] else (None, nan)
            sb, gap = run[2][i] if i < len(run[2]) and run[2][i] else (None, nan)
            return Divergence(i, run[1][i] if i < len(run[1]) else -1, a, b, pgap, gap, pa, sb)
    return None


def first_divergence(plain_records, records) -> Divergence | None:
    """The first token where `records` differ from plain decoding's `plain_records` (see `first_difference`)."""
    return first_difference(flatten(plain_records), flatten(records))
