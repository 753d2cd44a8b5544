"""The decode loop: prefill, then draft -> build tree -> verify -> accept -> compact -> record, one step per target
forward. Every method runs through this one loop; only the tree builder differs (`ar` verifies a root-only tree,
which is exactly plain autoregressive decoding). The engine knows nothing about chat templates or the UI.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import torch

from core.accept import GREEDY_BELOW, accept_greedy, accept_sample, sample_token, second_choices
from core.builders import BUILDERS, NESTED
from core.config import AUTO_METHODS, TREE_METHODS, DecodeConfig
from core.dflash import DraftKV, extract_features
from core.drafter import BlockDraft, draft_block, readout_for
from core.fast_forward import forward
from core.hybrid import HybridBuilder
from core.kv_cache import compact, new_cache
from core.limits import check_memory, context_window, release_free_memory
from core.records import StepRecord, timed
from core.tree import root_only
from core.verify import verify

TRIM_EVERY = 64   # steps between returning freed heap pages to the OS


def check_inputs(pair, prompt_ids: list[int], cfg: DecodeConfig) -> DecodeConfig:
    """Validate everything a run needs before any compute; ValueError says what to change."""
    cfg = cfg.validate(max_block=pair.drafter.block_size if pair.drafter is not None else None)
    if cfg.method != "ar" and pair.drafter is None:
        raise ValueError(f"method {cfg.method!r} needs a drafter, and model pair {pair.name!r} has none; "
                         "use method 'ar' or load a pair with a drafter")
    if not prompt_ids:
        raise ValueError("the prompt is empty: type something to continue")
    window = context_window(pair.target)
    if len(prompt_ids) >= window:
        raise ValueError(f"the prompt is {len(prompt_ids)} tokens but the context window is {window}; shorten it")
    drafted = 0 if cfg.method == "ar" else cfg.budget if cfg.method in TREE_METHODS else pair.drafter.block_size - 1
    check_memory(pair.target, drafted, len(prompt_ids), cfg.max_new_tokens)
    return cfg


@torch.inference_mode()
def generate(pair, prompt_ids: list[int], cfg: DecodeConfig, builder=None) -> Iterator[StepRecord]:
    """Yield one StepRecord per target forward (the prefill first). `builder(draft, budget, bonus, history)`
    overrides the method's tree builder (PRESTO and the adaptive budget pass theirs)."""
    cfg = check_inputs(pair, prompt_ids, cfg)
    target, drafter, tok = pair.target, pair.drafter if cfg.method != "ar" else None, pair.tokenizer
    build = builder or default_builder(cfg, pair)
    should_draft = getattr(build, "should_draft", lambda: True)   # the auto budget skips drafts that do not pay
    gen = torch.Generator().manual_seed(cfg.seed)
    sync = torch.cuda.synchronize if pair.device.type == "cuda" else None
    layer_ids = drafter.target_layer_ids if drafter is not None else None
    n_pos, k = draft_sizes(pair, cfg)
    window, stops, history = context_window(target), set(pair.stop_ids), list(prompt_ids)
    cache, draft_kv = new_cache(target), DraftKV(len(drafter.layers)) if drafter is not None else None
    readout = readout_for(drafter, target, prompt_ids) if drafter is not None and not cfg.full_readout else None

    # 0) prefill: the target reads the prompt; its first token is the first bonus token
    seconds: dict[str, float] = {}
    with timed(seconds, "prefill", sync):
        ids = torch.tensor([prompt_ids], device=pair.device)
        out = forward(target, ids, cache, output_hidden_states=drafter is not None, logits_to_keep=1)
        bonus, p0 = sample_token(out.logits[0, -1], cfg.temperature, cfg.top_p, cfg.top_k, gen)
        greedy = cfg.temperature < GREEDY_BELOW
        second = second_choices(out.logits[0, -1:], torch.tensor([bonus], device=pair.device)) if greedy else []
        ctx = extract_features(out.hidden_states, layer_ids)[0] if drafter is not None else None  # [P, n*H]
    past_len, produced, history = len(prompt_ids), 1, history + [bonus]
    finish = _finish([bonus], stops, produced, cfg.max_new_tokens, past_len, window)
    yield StepRecord(0, root_only(bonus), [0], bonus, [bonus], tok.decode([bonus]), seconds, [p0], finish=finish,
                     runner_up=second)

    pending_oracle: list[tuple[StepRecord, int]] = []
    step = 0
    while finish is None:
        step, seconds, draft = step + 1, {}, None
        depth_cap = min(n_pos, cfg.max_new_tokens - produced - 1, window - 1 - past_len)
        # 1) draft: one drafter forward over [bonus, MASK x L]
        with timed(seconds, "draft", sync):
            if drafter is not None and depth_cap > 0 and should_draft():
                draft = draft_block(drafter, target, ctx, bonus, past_len, draft_kv, n_pos, k, cfg.entropy_lam,
                                    readout)
                ctx = ctx[:0]
        # 2) build tree: pure function of the [L, K] candidates
        with timed(seconds, "tree"):
            tree = build(clip_draft(draft, depth_cap), cfg.budget, bonus, history) if draft is not None \
                else root_only(bonus)
        # 3) verify: one target forward over the flattened tree
        with timed(seconds, "verify", sync):
            verification = verify(target, tree, cache, past_len, layer_ids)
        # 4) accept: walk the tree with the target's choices; 5) keep only the accepted path's KV
        with timed(seconds, "accept", sync):
            if cfg.temperature < GREEDY_BELOW:
                acceptance = accept_greedy(tree, verification.logits)
            else:
                acceptance = accept_sample(tree, verification.logits, cfg.temperature, cfg.top_p, cfg.top_k, gen)
            keep = torch.tensor(acceptance.accepted, device=pair.device)
            compact(cache, past_len, keep)
            if drafter is not None:
                ctx = torch.cat([ctx, verification.features[keep]])
        # 6) record
        committed = [tree.tokens[i] for i in acceptance.accepted[1:]] + [acceptance.bonus]
        committed = _cut_at_stop(committed, stops)
        past_len, produced, bonus = past_len + len(acceptance.accepted), produced + len(committed), acceptance.bonus
        history += committed
        finish = _finish(committed, stops, produced, cfg.max_new_tokens, past_len, window)
        record = StepRecord(step, tree, acceptance.accepted, bonus, committed, tok.decode(committed), seconds,
                            acceptance.p_tokens[: len(committed)], nested=cfg.method in NESTED,
                            draft_logq=None if draft is None else draft.logq[:, : cfg.record_k].copy(),
                            draft_tokens=None if draft is None else draft.tokens[:, : cfg.record_k].copy(),
                            budget_used=tree.size if cfg.method in AUTO_METHODS else cfg.budget, finish=finish,
                            runner_up=list(acceptance.runner_up[: len(committed)]))
        if hasattr(build, "observe"):
            build.observe(record)         # the adaptive budget calibrates itself on what this step realised
        if draft is not None:
            pending_oracle.append((record, len(history) - len(committed) - 1))
        pending_oracle = _fill_oracle(pending_oracle, history, done=finish is not None)
        if step % TRIM_EVERY == 0 or finish is not None:
            release_free_memory()     # keep resident memory flat over long runs
        yield record


def draft_sizes(pair, cfg: DecodeConfig) -> tuple[int, int]:
    """L positions drafted per step (0 for `ar`) and K candidates kept per position (DDTree: min(budget, V))."""
    n_pos = (cfg.block_size or pair.drafter.block_size) - 1 if pair.drafter is not None and cfg.method != "ar" else 0
    return n_pos, cfg.topk or min(cfg.budget, pair.target.get_output_embeddings().weight.shape[0])


def default_builder(cfg: DecodeConfig, pair):
    """The tree builder `cfg.method` decodes with (`ar`: the root only)."""
    if cfg.method in AUTO_METHODS:      # never waits for a measurement: a cached curve, else an estimate it fits
        from core.adaptive import AdaptiveBudget
        from core.costs import cached_curve, estimated_curve

        base = default_builder(replace(cfg, method=AUTO_METHODS[cfg.method]), pair)
        curve = cached_curve(pair.target)
        measured = curve is not None
        return AdaptiveBudget(base, curve if measured else estimated_curve(pair.target), cfg.budget, measured)
    if cfg.method in BUILDERS:
        fn = BUILDERS[cfg.method]
        return lambda draft, budget, bonus, history: fn(draft.logq, draft.tokens, budget, bonus)
    if cfg.method == "ar":
        return lambda draft, budget, bonus, history: root_only(bonus)
    if cfg.method == "hybrid":
        return HybridBuilder()
    from core.presto import presto_builder  # PRESTO needs its n-gram model

    vocab = pair.target.get_output_embeddings().weight.shape[0]
    return presto_builder(cfg, vocab, getattr(pair, "ngram_table", None))


def clip_draft(draft: BlockDraft | None, depth: int) -> BlockDraft | None:
    if draft is None or depth >= draft.logq.shape[0]:
        return draft
    entropy = draft.entropy[:depth] if draft.entropy is not None else None
    return BlockDraft(draft.logq[:depth], draft.tokens[:depth], entropy)


def _cut_at_stop(tokens: list[int], stops: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in stops:
            return tokens[: i + 1]
    return tokens


def _finish(committed, stops, produced, max_new_tokens, past_len, window) -> str | None:
    if any(t in stops for t in committed):
        return "stop"
    if produced >= max_new_tokens:
        return "length"
    if past_len >= window - 1:
        return "context"
    return None


def _fill_oracle(pending: list[tuple[StepRecord, int]], history: list[int], done: bool):
    """Oracle depth of a step: how far the target's actual continuation (known once later steps commit it) stays
    inside the drafter's recorded top-K at every depth. Steps whose continuation is still unknown stay pending."""
    left = []
    for record, root_pos in pending:
        n_pos = record.draft_tokens.shape[0]
        continuation = history[root_pos + 1: root_pos + 1 + n_pos]
        if len(continuation) < n_pos and not done:
            left.append((record, root_pos))
            continue
        depth = 0
        for i, y in enumerate(continuation):
            if y not in record.draft_tokens[i]:
                break
            depth += 1
        record.oracle_depth = depth
    return left


def run(pair, prompt_ids: list[int], cfg: DecodeConfig, builder=None) -> list[StepRecord]:
    """All records of one generation."""
    return list(generate(pair, prompt_ids, cfg, builder))


def output_ids(records: list[StepRecord]) -> list[int]:
    return [t for r in records for t in r.committed]
