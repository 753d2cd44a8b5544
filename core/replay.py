"""The decode loop replayed on a fixed greedy reply, and the exact acceptance-against-budget curve it gives.

At temperature 0 every method is lossless, so a run's reply is the target's greedy reply whatever the budget, and
each step accepts the longest tree path that matches it. `replay` walks exactly that: one target forward over
prompt + reply gives every context feature, then each step costs one drafter forward and one tree build, no
verification. Where the real loop emits the reply (fp32: always) its τ is the replay's, step for step (tested).

`exact_budget_curve` replays one finished greedy run at other budgets: the τ a run at budget b has on this reply.
A run's own nested trees cut to b (`StepRecord.tau_at`) only say what this run's steps would have accepted; a
run at budget b drafts from other positions, so that counterfactual can mislead. The judge (`core.eval.judge`)
and the app both replay through here.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Callable, Iterator

import torch

from core.accept import GREEDY_BELOW, follow
from core.builders import as_builder
from core.config import DecodeConfig
from core.dflash import extract_features
from core.drafter import Drafting, clip_draft
from core.engine import check_inputs, default_builder, depth_cap, draft_sizes, step_record
from core.fast_forward import forward
from core.kv_cache import new_cache
from core.limits import context_window
from core.tree import root_only

CURVE_METHODS = ("chain", "ddtree", "presto", "presto-beam", "hybrid")   # fixed budget: replayable at any other


@torch.inference_mode()
def reference_states(pair, prompt_ids: list[int], reference: list[int]) -> tuple[torch.Tensor, ...]:
    """The target's hidden states over prompt + reference (its last token is never context): one forward, shared
    by every drafter and setting replayed on this prompt."""
    ids = torch.tensor([prompt_ids + reference[:-1]], device=pair.device)
    return forward(pair.target, ids, new_cache(pair.target), output_hidden_states=True, logits_to_keep=1).hidden_states


def prompt_tau(committed: list[int]) -> float:
    """A prompt's τ from `replay`: mean tokens committed a step (a reply with no step counts as 1, as the loop's)."""
    return statistics.mean(committed) if committed else 1.0


@torch.inference_mode()
def replay(pair, prompt_ids: list[int], reference: list[int], cfg: DecodeConfig,
           states: tuple[torch.Tensor, ...] | None = None, pause: Callable[[], None] | None = None) -> list[int]:
    """Tokens committed per step (accepted drafts + bonus, cut at the reply's end: the loop's `StepRecord.tau`)
    when the loop's output is `reference`, the reply `cfg.max_new_tokens` of plain decoding gave. `states`:
    `reference_states` of this prompt, when several replays share them; `pause()` is called before each step (the
    app waits there while a run decodes, and stops a superseded replay by raising)."""
    cfg = check_inputs(pair, prompt_ids, cfg)
    build, window = as_builder(default_builder(cfg, pair)), context_window(pair.target)
    n_pos, k = draft_sizes(pair, cfg)
    states = states if states is not None else reference_states(pair, prompt_ids, reference)
    features = extract_features(states, pair.drafter.target_layer_ids)[0]      # [P+R-1, n_taps*H]
    drafting = Drafting(pair.drafter, pair.target, prompt_ids, n_pos, k, cfg.entropy_lam, cfg.full_readout)
    records, t, fed = [], 0, 0
    while t < len(reference) - 1:             # reference[t] is this step's bonus token, at position P + t
        if pause is not None:
            pause()
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


def curve_budgets(top: int) -> list[int]:
    """The budgets the exact curve is replayed at (each costs a replay): 1, 2, 4, ... below `top`, then `top`."""
    return [b for b in (2 ** k for k in range(top.bit_length())) if b < top] + [top]


def exact_budget_points(pair, prompt_ids: list[int], reply: list[int], cfg: DecodeConfig, budgets: list[int],
                        states: tuple[torch.Tensor, ...] | None = None,
                        pause: Callable[[], None] | None = None) -> Iterator[tuple[int, float]]:
    """(b, τ) for each budget b in turn: the τ a greedy run of `cfg` at budget b has, `reply` being the output of a
    finished greedy run of `cfg` (the same at every budget: the methods are lossless). One target forward, then a
    replay per budget; `pause` as in `replay`. ValueError for a sampled run or a method whose budget is chosen."""
    if cfg.temperature >= GREEDY_BELOW:
        raise ValueError("the exact curve needs a greedy run (temperature 0): a sampled reply differs per budget")
    if cfg.method not in CURVE_METHODS:
        raise ValueError(f"the exact curve replays a fixed budget; {cfg.method!r} is not one of "
                         f"{', '.join(CURVE_METHODS)}")
    if pause is not None:
        pause()
    states = states if states is not None else reference_states(pair, prompt_ids, reply)
    for b in budgets:
        yield b, prompt_tau(replay(pair, prompt_ids, reply, replace(cfg, budget=b), states, pause))


def exact_budget_curve(pair, prompt_ids: list[int], reply: list[int], cfg: DecodeConfig,
                       budgets: list[int] | None = None) -> dict[int, float]:
    """Budget -> exact τ on this finished greedy run's reply, at `budgets` (default: `curve_budgets` of the run's
    budget, as the app's chart shows them)."""
    return dict(exact_budget_points(pair, prompt_ids, reply, cfg, budgets or curve_budgets(cfg.budget)))
