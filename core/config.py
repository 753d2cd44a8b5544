"""Frozen decoding settings and the registry of named target+drafter pairs.

`DecodeConfig.validate()` is the one place where user-facing limits live, so the CLI, the app and the library
all reject bad input with the same clear message.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

METHODS = ("ar", "chain", "ddtree", "presto", "presto-beam", "hybrid", "ddtree-auto", "presto-auto", "hybrid-auto")
TREE_METHODS = ("ddtree", "presto", "presto-beam", "hybrid", "ddtree-auto", "presto-auto", "hybrid-auto")
# adaptive budget over a nested builder
AUTO_METHODS = {"ddtree-auto": "ddtree", "presto-auto": "presto", "hybrid-auto": "hybrid"}
MAX_BUDGET = 1024  # verification cost grows ~linearly past 64 nodes; beyond this a step costs more than it saves


@dataclass(frozen=True)
class DecodeConfig:
    # method: ar | chain (vanilla DFlash) | ddtree | presto | presto-beam | hybrid (drafter + retrieval, one tree)
    #         | ddtree-auto | presto-auto | hybrid-auto
    method: str = "ddtree"
    budget: int = 64             # draft-tree nodes B, the root (bonus token) not counted; -auto: the largest tried
    temperature: float = 0.0     # 0 (or < 1e-5) = greedy; > 0 samples from the (top-p / top-k warped) target
    top_p: float = 1.0           # nucleus mass kept, in (0, 1]
    top_k: int = 0               # 0 = off
    max_new_tokens: int = 256
    seed: int = 0                # seeds the target's samples at temperature > 0
    block_size: int | None = None  # None = the drafter's own; smaller values draft fewer positions
    topk: int | None = None      # candidates per depth K; None = min(budget, vocab) as in DDTree
    lam: float = 0.8             # PRESTO: weight of the n-gram log-probability (λ sweep, docs/benchmarks/history.md)
    beam_width: int | None = None  # PRESTO-beam: W per depth; None = 2 * ceil(budget / L)
    ngram_order: int = 3         # PRESTO: n of the n-gram model
    entropy_lam: bool = False    # PRESTO: scale lam by the drafter's normalised entropy per depth
    record_k: int = 64           # drafter candidates per position kept in each StepRecord (oracle bound, viz)
    full_readout: bool = False   # draft from all V even when the drafter ships a draft vocabulary

    def validate(self, max_block: int | None = None) -> "DecodeConfig":
        """Raise ValueError with a message that says what to change."""
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        _int_in("budget", self.budget, 1, MAX_BUDGET)
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) \
                or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (got {self.temperature})")
        if not isinstance(self.top_p, (int, float)) or not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        _int_in("top_k", self.top_k, 0, 10**9)
        _int_in("max_new_tokens", self.max_new_tokens, 1, 100_000)
        _int_in("seed", self.seed, 0, 2**63 - 1)
        if self.block_size is not None:
            _int_in("block_size", self.block_size, 2, 10**6)
            if max_block is not None and self.block_size > max_block:
                raise ValueError(f"block_size {self.block_size} is larger than the drafter's {max_block}")
        if self.topk is not None:
            _int_in("topk", self.topk, 1, 10**9)
        if not isinstance(self.lam, (int, float)) or not math.isfinite(self.lam) or self.lam < 0:
            raise ValueError(f"lambda must be a finite number >= 0 (got {self.lam})")
        if self.beam_width is not None:
            _int_in("beam_width", self.beam_width, 1, 10**6)
        _int_in("ngram_order", self.ngram_order, 1, 8)
        _int_in("record_k", self.record_k, 0, 4096)
        return self


def _int_in(name: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}] (got {value!r})")


@dataclass(frozen=True)
class PairSpec:
    target: str                     # hub id, local folder, or "embedded:smollm2-135m-instruct"
    drafter: str | None             # hub id or local folder of a DFlash drafter (z-lab format)
    device_map: str | None = None   # "auto" spreads a large target over several GPUs (accelerate)
    note: str = ""                  # shown in the app and the CLI help
    needs_gpu: bool = False
    ngram_table: str | None = None  # PRESTO's n-gram counts for this tokenizer (None: online counts only)


MODEL_PAIRS: dict[str, PairSpec] = {
    "smollm2-135m": PairSpec("embedded:smollm2-135m-instruct", "assets/drafters/smollm2-135m-dflash-b16",
                             note="embedded default: runs offline on a CPU",
                             ngram_table="assets/ngram/smollm2-135m-3gram.npz"),
    "qwen3-4b": PairSpec("Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16", note="paper setting; GPU", needs_gpu=True),
    "qwen3-8b": PairSpec("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", note="paper setting; GPU", needs_gpu=True),
    "qwen3-coder-30b-a3b": PairSpec("Qwen/Qwen3-Coder-30B-A3B-Instruct", "z-lab/Qwen3-Coder-30B-A3B-DFlash",
                                    device_map="auto", note="paper setting; one or more GPUs", needs_gpu=True),
}

# Operators add a pair without code edits: TARGET_MODEL_ID / DRAFT_MODEL_ID (e.g. as Space variables).
if os.environ.get("TARGET_MODEL_ID") and os.environ.get("DRAFT_MODEL_ID"):
    MODEL_PAIRS["custom"] = PairSpec(os.environ["TARGET_MODEL_ID"], os.environ["DRAFT_MODEL_ID"],
                                     device_map=os.environ.get("DEVICE_MAP") or None,
                                     note="from TARGET_MODEL_ID / DRAFT_MODEL_ID", needs_gpu=True)
