"""Training sequences from the generated shards, and DFlash's random-anchor block batches.

A sequence is the chat-templated prompt followed by the target's reply; only reply tokens carry a loss. Each
epoch draws new random anchors among reply positions; every anchor a gives one block [x_a, MASK x (B-1)] at
positions a..a+B-1 whose position k is trained to predict x_{a+k}.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from core.models import encode_chat
from core.training.prompts import prompt_key, prompt_source, training_prompts


@dataclass(frozen=True)
class Sequence:
    key: str
    ids: np.ndarray        # [T] int64 prompt + reply
    prompt_len: int


def load_sequences(folder: str | Path, min_reply: int = 8, tokenizer=None) -> list[Sequence]:
    """Sequences from `generate_data` shards, plus replies-only archives (prompts rebuilt from their keys with
    `tokenizer`; archives carry no prompt text, so shared prompt sets are never redistributed)."""
    out = []
    if tokenizer is not None:
        out += _from_replies(_rows(folder, "replies-*.npz"), tokenizer, min_reply)
    out += [Sequence(key, ids, n) for key, ids, n in _rows(folder, "shard-*.npz") if len(ids) - n >= min_reply]
    return list({s.key: s for s in out}.values())      # a prompt in both an archive and a shard counts once


def load_replies(folder: str | Path) -> dict[str, np.ndarray]:
    """Reply token ids by prompt key from shards and replies-only archives alike (no tokenizer needed: prompts
    are not rebuilt). A prompt in both counts once, the shard's reply winning as in `load_sequences`."""
    return {key: ids[n:] for pattern in ("replies-*.npz", "shard-*.npz") for key, ids, n in _rows(folder, pattern)}


def cap_sources(seqs: list[Sequence], caps: dict[str, int], seed: int = 0) -> list[Sequence]:
    """`seqs` keeping at most caps[source] replies of each capped prompt source, a seeded choice among its keys (the
    same every epoch and on resume): a broad mix from data where one source dominates (GSM8K: 71 % of tokens)."""
    rng = np.random.default_rng(seed)
    dropped: set[str] = set()
    for source, n in caps.items():
        keys = sorted(s.key for s in seqs if prompt_source(s.key) == source)
        if len(keys) > n:
            dropped |= set(keys) - set(rng.choice(keys, n, replace=False).tolist())
    return [s for s in seqs if s.key not in dropped]


def repeat_sources(seqs: list[Sequence], repeats: dict[str, int]) -> list[Sequence]:
    """`seqs` with each reply of a repeated prompt source given repeats[source] times: a short run from a trained
    drafter passes over a few percent of the replies, and a new source would otherwise be a few percent of that.
    Each pass over a reply draws its own anchors."""
    return [s for s in seqs for _ in range(repeats.get(prompt_source(s.key), 1))]


def source_mix(folder: str | Path) -> str:
    """The replies of `folder` by prompt source: count, tokens and share of tokens, one line per source."""
    counts: dict[str, list[int]] = {}
    for key, reply in load_replies(folder).items():
        c = counts.setdefault(prompt_source(key), [0, 0])
        c[0], c[1] = c[0] + 1, c[1] + len(reply)
    total = sum(t for _, t in counts.values()) or 1
    return "\n".join(f"{source:>30}: {n:6d} replies {t:9d} tokens ({100 * t / total:4.1f} %)"
                     for source, (n, t) in sorted(counts.items(), key=lambda kv: -kv[1][1]))


def export_replies(folder: str | Path, out: str | Path) -> int:
    """Write every reply of `folder` (shards and archives already there, no prompt tokens) into one compact
    archive; returns the reply count."""
    replies = load_replies(folder)
    np.savez_compressed(out, keys=np.asarray(list(replies)),
                        lengths=np.asarray([len(r) for r in replies.values()], dtype=np.int64),
                        ids=np.concatenate(list(replies.values())).astype(np.uint16))
    return len(replies)


def _rows(folder: str | Path, pattern: str):
    """(key, token ids, prompt length) for every row of the `pattern` files: a shard row holds prompt + reply, an
    archive row the reply alone (prompt length 0)."""
    for f in sorted(Path(folder).glob(pattern)):
        d = np.load(f, allow_pickle=False)
        ids, keys = d["ids"], d["keys"].tolist()      # each d[...] decompresses the whole array: read it once
        starts = np.concatenate([[0], np.cumsum(d["lengths"])])
        prompt_lens = d["prompt_lengths"] if "prompt_lengths" in d.files else np.zeros(len(keys), np.int64)
        for i, key in enumerate(keys):
            yield key, ids[starts[i]: starts[i + 1]].astype(np.int64), int(prompt_lens[i])


def _from_replies(rows, tokenizer, min_reply: int) -> list[Sequence]:
    text = {p.key: p.text for p in training_prompts()}
    out = []
    for key, reply, _ in rows:
        prompt_text = text.get(prompt_key(key))        # a later round's reply answers its round-1 prompt
        if prompt_text is not None and len(reply) >= min_reply:
            prompt = np.asarray(encode_chat(tokenizer, prompt_text), dtype=np.int64)
            out.append(Sequence(key, np.concatenate([prompt, reply]), len(prompt)))
    return out


def draft_vocab(seqs: list[Sequence], size: int, vocab_size: int, always: tuple[int, ...] = ()) -> list[int]:
    """The `size` most frequent token ids over the training sequences (prompts and replies), `always` (the stop
    tokens) included. Ties, unseen tokens among them, go to the lower id: BPE ids follow merge order."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for s in seqs:
        counts += np.bincount(s.ids, minlength=vocab_size)
    counts[list(always)] = np.iinfo(np.int64).max
    order = np.lexsort((np.arange(vocab_size), -counts))      # count descending, then id ascending
    return sorted(order[: min(size, vocab_size)].tolist())


@dataclass
class BlockBatch:
    ids: torch.Tensor          # [T] the sequence (context for the target's features)
    anchors: torch.Tensor      # [N] anchor positions, sorted
    block_ids: torch.Tensor    # [N*B] [x_a, MASK, ...] per block
    positions: torch.Tensor    # [T + N*B] context positions then block positions
    mask: torch.Tensor         # [1, 1, N*B, T + N*B] bool, True = attend
    labels: torch.Tensor       # [N, B-1] x_{a+k}, -100 where no loss
    weights: torch.Tensor      # [B-1] exp(-(k-1)/gamma)

    def to(self, device: torch.device) -> "BlockBatch":
        return BlockBatch(*(getattr(self, f.name).to(device) for f in fields(self)))


def make_blocks(seq: Sequence, block_size: int, mask_token_id: int, max_anchors: int, gamma: float,
                rng: np.random.Generator, tokens_per_anchor: int = 8) -> BlockBatch | None:
    t = len(seq.ids)
    candidates = np.arange(seq.prompt_len, t - 1)         # anchors are reply tokens: the bonus token at inference
    if len(candidates) == 0:
        return None
    n = int(min(max_anchors, max(1, len(candidates) // tokens_per_anchor), len(candidates)))
    anchors = np.sort(rng.choice(candidates, size=n, replace=False))
    ids = torch.from_numpy(seq.ids)
    b = block_size
    block_ids = torch.full((n, b), mask_token_id, dtype=torch.long)
    block_ids[:, 0] = ids[anchors]
    block_pos = torch.from_numpy(anchors)[:, None] + torch.arange(b)[None]           # [N, B]
    label_pos = block_pos[:, 1:]
    labels = torch.where(label_pos < t, ids[label_pos.clamp(max=t - 1)], torch.full_like(label_pos, -100))
    # query block i sees context strictly before its anchor and its own block, nothing else
    ctx_visible = torch.arange(t)[None, :] < torch.from_numpy(anchors)[:, None]       # [N, T]
    own = torch.eye(n, dtype=torch.bool)                                                # [N, N]
    mask = torch.cat([ctx_visible.repeat_interleave(b, 0),
                      own.repeat_interleave(b, 0).repeat_interleave(b, 1)], dim=1)      # [N*B, T + N*B]
    positions = torch.cat([torch.arange(t), block_pos.reshape(-1)])
    weights = torch.exp(-torch.arange(b - 1, dtype=torch.float32) / gamma)
    return BlockBatch(ids, torch.from_numpy(anchors), block_ids.reshape(-1), positions, mask[None, None], labels,
                      weights)
