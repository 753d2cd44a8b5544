"""One DFlash draft step: context features + bonus token -> the drafter's top-K per block position.

The block `[bonus, MASK x (L)]` is embedded with the target's embedding table, run through the drafter once with
the new context features (those not yet in the drafter cache), and read out through the target's LM head: all of
it, or the rows of the drafter's draft vocabulary and the prompt's tokens when it ships one (q is then normalised
over those). Only the [L, K] candidates cross to the CPU, once, for the tree builders.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from core.dflash import DFlashDrafter, DraftKV
from core.fast_forward import ensure_packed, pack_weight


@dataclass(frozen=True)
class Readout:
    """The LM-head rows one request drafts from: the drafter's draft vocabulary plus the prompt's own tokens
    (replies copy names and words from their prompt), read out of the head once per request."""
    ids: torch.Tensor    # [Vr] sorted token ids
    rows: torch.Tensor   # [Vr, H] their LM-head rows
    packed: torch.Tensor | None = None   # the rows in oneDNN's layout (bf16 CPU), see core.fast_forward


def readout_for(drafter: DFlashDrafter, target, prompt_ids: list[int]) -> Readout | None:
    """None (read out all V) when the drafter has no draft vocabulary."""
    ids = readout_ids(drafter, prompt_ids)
    if ids is None:
        return None
    head = target.get_output_embeddings().weight
    ids = ids.to(head.device)
    rows = head.detach()[ids]
    return Readout(ids, rows, pack_weight(rows))


def readout_ids(drafter: DFlashDrafter, prompt_ids) -> torch.Tensor | None:
    """[Vr] sorted token ids a request drafts from (the draft vocabulary plus the prompt's tokens); None: all V.
    Training's `--draft-readout` normalises q over the same ids."""
    if drafter.draft_vocab is None:
        return None
    return torch.cat([drafter.draft_vocab, torch.as_tensor(prompt_ids, dtype=torch.long).cpu()]).unique()


@dataclass(frozen=True)
class BlockDraft:
    logq: np.ndarray     # [L, K] float32 log q_i of the candidates, descending per row (normalised over the readout)
    tokens: np.ndarray   # [L, K] int64 candidate token ids
    entropy: np.ndarray | None = None  # [L] float32 entropy of each q_i (nats); only for entropy-adaptive PRESTO


def draft_block(drafter: DFlashDrafter, target, ctx_features: torch.Tensor, bonus: int, start: int,
                cache: DraftKV, n_pos: int, k: int, entropy: bool = False,
                readout: Readout | None = None) -> BlockDraft:
    """ctx_features: [C, n_taps*H] for positions start-C .. start-1 (appended to `cache`); n_pos = L drafted;
    `readout`: the request's draft rows of the LM head (None: all V). The entropies (a pass over [L, V], about
    1.5 % of a CPU step) are computed only when asked for."""
    c = ctx_features.shape[0]
    assert cache.length + c == start, "drafter cache must end where the new context starts"
    device = ctx_features.device
    block = torch.full((1, n_pos + 1), drafter.mask_token_id, dtype=torch.long, device=device)
    block[0, 0] = bonus
    noise = F.embedding(block, target.get_input_embeddings().weight) * drafter.input_embedding_scale
    positions = torch.arange(start - c, start + n_pos + 1, device=device)[None]        # [1, C+L+1]
    ensure_packed(drafter)
    hidden = drafter(ctx_features[None], noise, positions, cache)                      # [1, L+1, H]
    if readout is None:
        logits = drafter.logits(hidden[0, 1:], target.get_output_embeddings()).float()     # [L, V]
    else:
        logits = drafter.logits_from_rows(hidden[0, 1:], readout.rows, readout.packed).float()   # [L, Vr]
    logq = torch.log_softmax(logits, dim=-1)
    top = torch.topk(logq, min(k, logq.shape[-1]), dim=-1)
    tokens = top.indices if readout is None else readout.ids[top.indices]
    h = torch.special.entr(logq.exp()).sum(-1).cpu().numpy() if entropy else None
    return BlockDraft(top.values.cpu().numpy(), tokens.cpu().numpy(), h)


def clip_draft(draft: BlockDraft, depth: int) -> BlockDraft:
    """The draft's first `depth` positions (what the length limit and the context window leave room for)."""
    if depth >= draft.logq.shape[0]:
        return draft
    entropy = draft.entropy[:depth] if draft.entropy is not None else None
    return BlockDraft(draft.logq[:depth], draft.tokens[:depth], entropy)


class Drafting:
    """The drafter's side of one request, one block draft per step: its KV cache, the target's context features it
    has not read yet, and the request's readout rows. The decode loop, the judge's replay and the diagnosis all
    draft through it, so they feed the drafter the same way."""

    def __init__(self, drafter: DFlashDrafter, target, prompt_ids: list[int], n_pos: int, k: int,
                 entropy: bool = False, full_readout: bool = False):
        self.drafter, self.target, self.n_pos, self.k, self.entropy = drafter, target, n_pos, k, entropy
        self.kv = DraftKV(len(drafter.layers))
        self.readout = None if full_readout else readout_for(drafter, target, prompt_ids)
        self.unread: torch.Tensor | None = None     # [C, n_taps*H] features of positions the drafter has not read

    def read(self, features: torch.Tensor) -> None:
        """Queue the target's features [C, n_taps*H] of the next C positions (the prompt, then accepted paths)."""
        self.unread = features if self.unread is None else torch.cat([self.unread, features])

    def draft(self, bonus: int, past_len: int) -> BlockDraft:
        """One drafter forward over [bonus, MASK x L] at position past_len: all L positions (the record keeps the
        whole block; the builder gets it clipped to the depth the step may still commit, `clip_draft`)."""
        draft = draft_block(self.drafter, self.target, self.unread, bonus, past_len, self.kv, self.n_pos, self.k,
                            self.entropy, self.readout)
        self.unread = self.unread[:0]
        return draft
