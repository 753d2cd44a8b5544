"""The frozen target's part of a training step, computed once per sequence and kept on disk.

The target never changes during training, so its forward over a sequence gives the same two things every epoch:
the tapped layers' outputs (the drafter's context features) and its greedy choice at every position (the clean
label at temperature 0: a sampled reply keeps its context, but each block learns what verification at T = 0
accepts). Recomputing them was a sixth of a step. The first visit of a sequence computes and stores them; later
epochs read them memory-mapped.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import torch

from core.dflash import extract_features
from core.training.data import Sequence


def target_pass(target, ids: torch.Tensor, layer_ids: list[int], autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One frozen forward over a sequence: ([T, n_taps*H] tapped features, [T] the target's argmax at each
    position, i.e. its greedy choice for the next token)."""
    with torch.no_grad(), torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        out = target(input_ids=ids[None], output_hidden_states=True, logits_to_keep=0)
        return extract_features(out.hidden_states, layer_ids)[0].float(), out.logits[0].argmax(-1)


class FeatureCache:
    """`get(seq)` -> (features [T, n_taps*H] float32, greedy [T] int64), from `folder` when it holds the sequence
    (same tokens, taps, target and precision), else from one target forward, stored for the next epoch.
    Features are stored in fp16 (half the disk; a relative error of 5e-4) unless a value overflows it."""

    def __init__(self, folder: str | Path, target, layer_ids: list[int], autocast: bool):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.target, self.layer_ids, self.autocast = target, list(layer_ids), autocast
        self.tag = f"{getattr(target.config, '_name_or_path', '')}|{target.dtype}|{autocast}|{self.layer_ids}"
        self.hits = self.misses = 0

    def _stem(self, seq: Sequence) -> Path:
        h = hashlib.sha1(self.tag.encode() + seq.key.encode() + np.ascontiguousarray(seq.ids, np.int64).tobytes())
        return self.folder / h.hexdigest()[:20]

    def get(self, seq: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
        stem = self._stem(seq)
        feats, greedy = stem.with_suffix(".feat.npy"), stem.with_suffix(".greedy.npy")
        if feats.is_file() and greedy.is_file():
            self.hits += 1
            device = self.target.device
            stored = np.load(feats, mmap_mode="r", allow_pickle=False)
            return (torch.from_numpy(stored.astype(np.float32)).to(device),
                    torch.from_numpy(np.load(greedy, allow_pickle=False).astype(np.int64)).to(device))
        self.misses += 1
        ids = torch.as_tensor(seq.ids, device=self.target.device)
        features, choice = target_pass(self.target, ids, self.layer_ids, self.autocast)
        self.put(seq, features, choice)
        return features, choice

    def put(self, seq: Sequence, features: torch.Tensor, greedy: torch.Tensor) -> None:
        """Store a sequence's features [T, n_taps*H] and greedy choices [T] (from `get`'s forward, or captured
        while the data was generated: `core.training.batching`)."""
        stem = self._stem(seq)
        half = features.half()
        _save(stem.with_suffix(".feat.npy"), (half if torch.isfinite(half).all() else features.float()).cpu().numpy())
        _save(stem.with_suffix(".greedy.npy"), greedy.to(torch.int32).cpu().numpy())   # last: marks a whole entry


def _save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.save(f, array)
    os.replace(tmp, path)
