"""The decode loop: prefill, then draft -> build tree -> verify -> accept -> compact -> record, one step per target
forward. Every method runs through this one loop; only the tree builder differs (`ar` verifies a root-only tree,
which is exactly plain autoregressive decoding). The engine knows nothing about chat templates or the UI.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import torch

from core.accept import GREEDY_BELOW, accept_greedy, accept_sample, sample_token, second_choices
from core.adaptive import AdaptiveBudget
from core.builders import BUILDERS, NESTED, Ranked, TreeBuilder, as_builder
from core.config import AUTO_METHODS, TREE_METHODS, DecodeConfig
from core.costs import cached_curve, estimated_curve
from core.dflash import extract_features
from core.drafter import BlockDraft, Drafting, clip_draft
from core.fast_forward import forward
from core.hybrid import HybridBuilder
from core.kv_cache import compact, new_cache
from core.limits import check_memory, context_window, release_free_memory
from core.presto import presto_builder
from core.records import StepRecord, fill_oracle, timed
from core.tree import DraftTree, root_only
from core.verify import verify

TRIM_EVERY = 64   # steps between returning freed heap pages to the OS


def check_inputs(pair, prompt_ids: list[int], cfg: DecodeConfig) -> DecodeConfig:
    """Validate everything a run needs before any compute; ValueError says what to change."""
    cfg = cfg.validate(max_block=pair.drafter.block_size if pair.drafter is not None else None)
    check_fits(pair, prompt_ids, cfg)
    return cfg


def check_fits(pair, prompt_ids: list[int], cfg: DecodeConfig) -> None:
    """What a validated config needs of the pair and the prompt: a drafter, room in the context window and in
    memory; ValueError says what to change."""
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


@torch.inference_mode()
def generate(pair, prompt_ids: list[int], cfg: DecodeConfig, builder=None) -> Iterator[StepRecord]:
    """Yield one StepRecord per target forward (the prefill first). `builder(draft, budget, bonus, history)`
    overrides the method's tree builder (a `TreeBuilder`, or any callable with that signature)."""
    cfg = check_inputs(pair, prompt_ids, cfg)
    target, drafter, tok = pair.target, pair.drafter if cfg.method != "ar" else None, pair.tokenizer
    build = as_builder(builder or default_builder(cfg, pair))
    gen = torch.Generator().manual_seed(cfg.seed)
    sync = torch.cuda.synchronize if pair.device.type == "cuda" else None
    layer_ids = drafter.target_layer_ids if drafter is not None else None
    n_pos, k = draft_sizes(pair, cfg)
    window, stops, history, greedy = context_window(target), set(pair.stop_ids), list(prompt_ids), \
        cfg.temperature < GREEDY_BELOW
    cache = new_cache(target)
    drafting = Drafting(drafter, target, prompt_ids, n_pos, k, cfg.entropy_lam, cfg.full_readout) \
        if drafter is not None else None

    # 0) prefill: the target reads the prompt; its first token is the first bonus token
    seconds: dict[str, float] = {}
    with timed(seconds, "prefill", sync):
        ids = torch.tensor([prompt_ids], device=pair.device)
        out = forward(target, ids, cache, output_hidden_states=drafter is not None, logits_to_keep=1)
        bonus, p0 = sample_token(out.logits[0, -1], cfg.temperature, cfg.top_p, cfg.top_k, gen)
        second = second_choices(out.logits[0, -1:], torch.tensor([bonus], device=pair.device)) if greedy else []
        if drafting is not None:
            drafting.read(extract_features(out.hidden_states, layer_ids)[0])                  # [P, n*H]
    past_len, produced, history = len(prompt_ids), 1, history + [bonus]
    finish = _finish([bonus], stops, produced, cfg.max_new_tokens, past_len, window)
    records = [StepRecord(0, root_only(bonus), [0], bonus, [bonus], tok.decode([bonus]), seconds, [p0],
                          finish=finish, runner_up=second)]
    yield records[0]

    while finish is None:
        seconds, draft, cap = {}, None, depth_cap(n_pos, cfg, produced, past_len, window)
        # 1) draft: one drafter forward over [bonus, MASK x L]
        with timed(seconds, "draft", sync):
            if drafting is not None and cap > 0 and build.should_draft():
                draft = drafting.draft(bonus, past_len)
        # 2) build tree: a function of the [L, K] candidates (and the history)
        with timed(seconds, "tree"):
            tree = build(clip_draft(draft, cap), cfg.budget, bonus, history) if draft is not None \
                else root_only(bonus)
        # 3) verify: one target forward over the flattened tree
        with timed(seconds, "verify", sync):
            verification = verify(target, tree, cache, past_len, layer_ids)
        # 4) accept: walk the tree with the target's choices
        with timed(seconds, "accept", sync):
            acceptance = accept_greedy(tree, verification.logits) if greedy else \
                accept_sample(tree, verification.logits, cfg.temperature, cfg.top_p, cfg.top_k, gen)
        # 5) compact: keep only the accepted path's KV, and its features for the drafter's next block
        with timed(seconds, "compact", sync):
            keep = torch.tensor(acceptance.accepted, device=pair.device)
            compact(cache, past_len, keep)
            if drafting is not None:
                drafting.read(verification.features[keep])
        # 6) record
        committed = _cut_at_stop([tree.tokens[i] for i in acceptance.accepted[1:]] + [acceptance.bonus], stops)
        past_len, produced, bonus = past_len + len(acceptance.accepted), produced + len(committed), acceptance.bonus
        history += committed
        finish = _finish(committed, stops, produced, cfg.max_new_tokens, past_len, window)
        record = step_record(cfg, len(records), tree, draft, acceptance.accepted, bonus, committed,
                             text=tok.decode(committed), seconds=seconds, finish=finish,
                             p_committed=acceptance.p_tokens[: len(committed)],
                             runner_up=list(acceptance.runner_up[: len(committed)]))
        build.observe(record)             # a builder with memory (the adaptive budget) learns from the step
        records.append(record)
        if finish is not None:
            fill_oracle(records)          # every step's continuation is known now
        if record.step % TRIM_EVERY == 0 or finish is not None:
            release_free_memory()     # keep resident memory flat over long runs
        yield record


def depth_cap(n_pos: int, cfg: DecodeConfig, produced: int, past_len: int, window: int) -> int:
    """How deep a step may draft: L, less what the length limit and the context window leave room for."""
    return min(n_pos, cfg.max_new_tokens - produced - 1, window - 1 - past_len)


def step_record(cfg: DecodeConfig, step: int, tree: DraftTree, draft: BlockDraft | None, accepted: list[int],
                bonus: int, committed: list[int], *, text: str = "", seconds: dict | None = None,
                p_committed: list[float] | None = None, finish: str | None = None,
                runner_up: list | None = None) -> StepRecord:
    """A verification step's record; the keywords are what only a real target forward measures (the judge's
    replay leaves them empty)."""
    return StepRecord(step, tree, accepted, bonus, committed, text, seconds or {}, p_committed or [],
                      nested=cfg.method in NESTED,
                      draft_logq=None if draft is None else draft.logq[:, : cfg.record_k].copy(),
                      draft_tokens=None if draft is None else draft.tokens[:, : cfg.record_k].copy(),
                      budget_used=tree.size if cfg.method in AUTO_METHODS else cfg.budget, finish=finish,
                      runner_up=runner_up or [])


def draft_sizes(pair, cfg: DecodeConfig) -> tuple[int, int]:
    """L positions drafted per step (0 for `ar`) and K candidates kept per position (DDTree: min(budget, V))."""
    n_pos = (cfg.block_size or pair.drafter.block_size) - 1 if pair.drafter is not None and cfg.method != "ar" else 0
    return n_pos, cfg.topk or min(cfg.budget, pair.target.get_output_embeddings().weight.shape[0])


def default_builder(cfg: DecodeConfig, pair):
    """The tree builder `cfg.method` decodes with (`ar`: the root only)."""
    if cfg.method in AUTO_METHODS:      # never waits for a measurement: a cached curve, else an estimate it fits
        base = default_builder(replace(cfg, method=AUTO_METHODS[cfg.method]), pair)
        curve = cached_curve(pair.target)
        measured = curve is not None
        return AdaptiveBudget(base, curve if measured else estimated_curve(pair.target), cfg.budget, measured)
    if cfg.method in BUILDERS:
        return Ranked(BUILDERS[cfg.method])
    if cfg.method == "ar":
        return TreeBuilder()              # never called: plain decoding drafts nothing
    if cfg.method == "hybrid":
        return HybridBuilder()
    vocab = pair.target.get_output_embeddings().weight.shape[0]
    return presto_builder(cfg, vocab, getattr(pair, "ngram_table", None))


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


def run(pair, prompt_ids: list[int], cfg: DecodeConfig, builder=None) -> list[StepRecord]:
    """All records of one generation."""
    return list(generate(pair, prompt_ids, cfg, builder))


def output_ids(records: list[StepRecord]) -> list[int]:
    return [t for r in records for t in r.committed]
