"""Other ways to decode the same prompt, for side-by-side benchmarks on the same target:
- `hf-generate`: `transformers` `generate`, greedy (or sampled at temperature > 0);
- `hf-prompt-lookup`: `transformers` prompt-lookup decoding (`prompt_lookup_num_tokens`), the training-free
  speculative option;
- `dflash-official`: z-lab's own vanilla DFlash loop (`dflash` package) on the same drafter weights.
Each returns a `BaselineRun` timed like the engine: prefill (up to the first token) apart from decoding.
"""
from __future__ import annotations

import tempfile
import time
import warnings
from dataclasses import dataclass

import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

BASELINES = ("hf-generate", "hf-prompt-lookup", "dflash-official")
PROMPT_LOOKUP_TOKENS = 10     # transformers' documented default for prompt_lookup_num_tokens


@dataclass
class BaselineRun:
    output: list[int]      # generated ids, the first (prefill) token included
    prefill_s: float       # prompt forward up to the first token
    decode_s: float        # everything after the first token
    forwards: int          # target forwards after the prefill

    @property
    def tau(self) -> float:
        """Tokens per target forward after the prefill (the papers' convention, bonus counted)."""
        return (len(self.output) - 1) / self.forwards if self.forwards else 1.0


class _Clock:
    """A `generate` streamer that only timestamps: put() is called with the prompt, then with each new chunk."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        self.times.append(time.perf_counter())


def _count_forwards(model):
    calls = [0]
    handle = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls, handle


@torch.inference_mode()
def hf_generate(pair, prompt_ids: list[int], cfg, prompt_lookup: int | None = None) -> BaselineRun:
    """`model.generate` on one prompt; with `prompt_lookup`, prompt-lookup decoding drafting that many tokens."""
    target = pair.target
    ids = torch.tensor([prompt_ids], device=pair.device)
    sample = cfg.temperature >= 1e-5
    # sampling: exactly the engine's warpers (top_k 0 and top_p 1 switch theirs off, overriding generation_config)
    kwargs = dict(do_sample=sample, temperature=cfg.temperature if sample else None,
                  top_p=cfg.top_p if sample else None, top_k=cfg.top_k if sample else None)
    if prompt_lookup:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup
    if sample:
        torch.manual_seed(cfg.seed)
    clock = _Clock()
    calls, handle = _count_forwards(target)
    try:
        t0 = time.perf_counter()
        out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=cfg.max_new_tokens,
                              eos_token_id=list(pair.stop_ids), pad_token_id=list(pair.stop_ids)[0],
                              streamer=clock, **kwargs)
        t_end = time.perf_counter()
    finally:
        handle.remove()
    output = out[0, len(prompt_ids):].tolist()
    t_first = clock.times[1] if len(clock.times) > 2 else t_end
    return BaselineRun(output, t_first - t0, t_end - t_first, max(0, calls[0] - 1))


_OFFICIAL: dict[int, object] = {}


def official_drafter(pair):
    """The pair's drafter weights loaded into z-lab's `DFlashDraftModel` (saved once to a temporary folder)."""
    from dflash.model import DFlashDraftModel   # optional package (z-lab's reference code), only this baseline

    key = id(pair.drafter)
    if key not in _OFFICIAL:
        with tempfile.TemporaryDirectory() as folder:
            pair.drafter.save(folder, dtype=pair.dtype)
            _OFFICIAL[key] = DFlashDraftModel.from_pretrained(folder, dtype=pair.dtype).to(pair.device).eval()
    return _OFFICIAL[key]


@torch.inference_mode()
def dflash_official(pair, prompt_ids: list[int], cfg) -> BaselineRun:
    """z-lab's `dflash_generate` (vanilla DFlash, argmax chain) with its own timers."""
    import dflash.model as official   # optional package (z-lab's reference code), only this baseline

    if pair.device.type != "cuda":
        official._cuda_time = time.perf_counter       # its timer synchronises CUDA, which a CPU run lacks
    if cfg.temperature >= 1e-5:
        torch.manual_seed(cfg.seed)
    ids, drafter = torch.tensor([prompt_ids], device=pair.device), official_drafter(pair)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        # dflash 0.1.0 calls the target with `past_key_values=`, which transformers 5 renamed `cache`; the call is
        # inside z-lab's loop, so only that one deprecation is silenced, and only here
        warnings.filterwarnings("ignore", r"`past_key_values` is deprecated", FutureWarning)
        stats = official.dflash_generate(drafter, target=pair.target, input_ids=ids,
                                         max_new_tokens=cfg.max_new_tokens, stop_token_ids=list(pair.stop_ids),
                                         temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                         return_stats=True)
    total = time.perf_counter() - t0
    output = stats.output_ids[0, len(prompt_ids):].tolist()
    decode = stats.time_per_output_token * stats.num_output_tokens
    return BaselineRun(output, total - decode, decode, len(stats.acceptance_lengths))


def prompt_lookup_steps(pair, prompt_ids: list[int], reference: list[int], max_new_tokens: int) -> list[int]:
    """Tokens committed per target forward by `transformers`' greedy prompt-lookup decoding when its output is the
    fixed reply `reference` (the judge's trajectory; reference[0] is the prefill's token): `transformers`' own
    candidate generator, configured as `generate` configures it, proposes; the reply decides, as greedy assisted
    decoding does (the longest matching prefix, then the target's own token)."""
    lookup = PromptLookupCandidateGenerator(
        eos_token_id=torch.tensor(sorted(pair.stop_ids)), num_output_tokens=PROMPT_LOOKUP_TOKENS,
        max_matching_ngram_size=pair.target.generation_config.max_matching_ngram_size or 2,
        max_length=len(prompt_ids) + max_new_tokens)
    steps, t = [], 0
    while t < len(reference) - 1:              # reference[t] is the last token the target has chosen
        ids = torch.tensor([prompt_ids + reference[: t + 1]])
        proposed = lookup.get_candidates(ids)[0][0, ids.shape[1]:].tolist()
        n = 0
        while n < len(proposed) and t + 1 + n < len(reference) and proposed[n] == reference[t + 1 + n]:
            n += 1
        steps.append(min(n + 1, len(reference) - 1 - t))
        t += steps[-1]
    return steps


def run_baseline(method: str, pair, prompt_ids: list[int], cfg) -> BaselineRun:
    if method == "hf-generate":
        return hf_generate(pair, prompt_ids, cfg)
    if method == "hf-prompt-lookup":
        return hf_generate(pair, prompt_ids, cfg, prompt_lookup=PROMPT_LOOKUP_TOKENS)
    if method == "dflash-official":
        return dflash_official(pair, prompt_ids, cfg)
    raise ValueError(f"unknown baseline {method!r}; choose one of {', '.join(BASELINES)}")
