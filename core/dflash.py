"""The DFlash block-diffusion drafter (Chen et al. 2026), checkpoint-compatible with z-lab's releases.

Target features `hidden_states[l+1]` for the tapped layers are concatenated, fused by `fc` + `hidden_norm`, and
injected as extra keys/values into every layer; only the block `[bonus, MASK x (L)]` carries a residual stream
and attends bidirectionally within itself. Position k of the block predicts the token at `start + k` (no shift),
through the target's own frozen LM head. Config fields and tensor names are z-lab's (`dflash_config`,
`fc.weight`, `layers.{i}.self_attn.q_proj.weight`, ...), so checkpoints move both ways.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from core.fast_forward import few_rows, linear, packed_linear


def build_target_layer_ids(num_target_layers: int, n: int) -> list[int]:
    """z-lab's default taps: evenly spaced from layer 1 to layer num_target_layers - 3 (banker's rounding)."""
    if n == 1:
        return [num_target_layers // 2]
    return [round(1 + i * (num_target_layers - 4) / (n - 1)) for i in range(n)]


def extract_features(hidden_states: tuple[torch.Tensor, ...], layer_ids: list[int]) -> torch.Tensor:
    """[B, T, n_taps * H]: outputs of the tapped decoder layers (index 0 of hidden_states is the embedding)."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


class DraftKV:
    """Per-layer context keys/values of the drafter. Block keys/values are never stored, so nothing needs
    cropping after a step: the cache always ends at `start`, the first position without a target feature."""

    def __init__(self, n_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[-2]

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor, n_ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the first n_ctx (context) rows; return past context + all new rows for attention."""
        past_k, past_v = self.keys[layer], self.values[layer]
        ctx_end = n_ctx
        if past_k is not None:
            k, v = torch.cat([past_k, k], dim=-2), torch.cat([past_v, v], dim=-2)
            ctx_end += past_k.shape[-2]
        self.keys[layer], self.values[layer] = k[..., :ctx_end, :], v[..., :ctx_end, :]
        return k, v


def _rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    # q: [B, nh, S, hd] uses the last S positions; k: [B, nkv, C+S, hd] uses all; cos/sin: [B, C+S, hd]
    s = q.shape[-2]
    return _rotate(q, cos[..., -s:, :], sin[..., -s:, :]), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, heads, S, hd]; cos/sin: [B, S, hd]
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


class DFlashAttention(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.n_heads, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, h, ctx, cos, sin, cache: DraftKV | None, mask: torch.Tensor | None):
        # h: [B, S, H] normed block states; ctx: [B, C, H] fused features of the new context positions
        b, s, _ = h.shape
        c = ctx.shape[1]
        kv_in = torch.cat([ctx, h], dim=1)                                   # [B, C+S, H]
        q, k, v = self._heads(self.q_proj, h, self.q_norm), self._heads(self.k_proj, kv_in, self.k_norm), \
            self._heads(self.v_proj, kv_in)
        q, k = _rope(q, k, cos, sin)
        if cache is not None:
            k, v = cache.extend(self.layer_idx, k, v, n_ctx=c)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim ** -0.5,
                                             enable_gqa=self.n_heads != self.n_kv)  # non-causal
        return linear(self.o_proj, out.transpose(1, 2).reshape(b, s, -1))

    def _heads(self, proj: nn.Linear, x: torch.Tensor, norm: nn.Module | None = None) -> torch.Tensor:
        """[B, S, H] -> [B, heads, S, hd]: a projection split into heads (RMS-normed per head for q and k)."""
        b, s, _ = x.shape
        y = linear(proj, x).view(b, s, -1, self.head_dim)
        return (y if norm is None else norm(y)).transpose(1, 2)

    def forward_blocks(self, h, ctx, rope_ctx, rope_blocks, visible):
        """Training: N blocks of one sequence, each attending to the context it may see and to itself only.
        h: [N, B, H] normed block states; ctx: [1, T, H] fused features; rope_*: (cos, sin) [1, T, hd] / [N, B, hd];
        visible: [N, 1, 1, T+B] bool (context before the block's anchor, then the block)."""
        n, b, _ = h.shape
        q = self._heads(self.q_proj, h, self.q_norm)                                                 # [N, nh, B, hd]
        k_blk, v_blk = self._heads(self.k_proj, h, self.k_norm), self._heads(self.v_proj, h)        # [N, nkv, B, hd]
        k_ctx, v_ctx = self._heads(self.k_proj, ctx, self.k_norm), self._heads(self.v_proj, ctx)    # [1, nkv, T, hd]
        q, k_blk, k_ctx = _rotate(q, *rope_blocks), _rotate(k_blk, *rope_blocks), _rotate(k_ctx, *rope_ctx)
        k = torch.cat([k_ctx.expand(n, -1, -1, -1), k_blk], dim=2)                                   # [N, nkv, T+B, hd]
        v = torch.cat([v_ctx.expand(n, -1, -1, -1), v_blk], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=self.head_dim ** -0.5,
                                             enable_gqa=self.n_heads != self.n_kv)
        return linear(self.o_proj, out.transpose(1, 2).reshape(n, b, -1))


class DFlashLayer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, h, ctx, cos, sin, cache, mask):
        h = h + self.self_attn(self.input_layernorm(h), ctx, cos, sin, cache, mask)
        return self._mlp(h)

    def forward_blocks(self, h, ctx, rope_ctx, rope_blocks, visible):
        h = h + self.self_attn.forward_blocks(self.input_layernorm(h), ctx, rope_ctx, rope_blocks, visible)
        return self._mlp(h)

    def _mlp(self, h):
        x, mlp = self.post_attention_layernorm(h), self.mlp                  # Qwen3MLP's forward, packed weights
        return h + linear(mlp.down_proj, mlp.act_fn(linear(mlp.gate_proj, x)) * linear(mlp.up_proj, x))


class DFlashDrafter(nn.Module):
    """q: one forward maps (target features, block embeddings) to hidden states for every block position."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        extra = dict(getattr(config, "dflash_config", None) or {})
        self.target_layer_ids = list(extra.get("target_layer_ids") or build_target_layer_ids(
            config.num_target_layers, config.num_hidden_layers))
        self.block_size = int(extra.get("block_size", getattr(config, "block_size", 16)))
        self.mask_token_id = int(extra["mask_token_id"])
        self.input_embedding_scale = float(extra.get("input_embedding_scale", 1.0))
        self.output_multiplier = float(extra.get("output_multiplier", 1.0))
        self.softcap = float(extra.get("final_logit_softcapping") or 0.0)
        self.layers = nn.ModuleList(DFlashLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.draft_vocab: torch.Tensor | None = None    # [Vd] sorted token ids drafted from; None = all V

    @classmethod
    def from_config_dict(cls, config: dict) -> "DFlashDrafter":
        cfg = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type")}
        return cls(Qwen3Config(**cfg))

    def forward(self, ctx_features: torch.Tensor, noise_embedding: torch.Tensor, position_ids: torch.Tensor,
                cache: DraftKV | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, S, H] final-normed block states. ctx_features: [B, C, n_taps*H] (new context only when cached);
        position_ids: [B, C+S] (context positions, then block positions); attention_mask: None (all visible)
        or bool [B or 1, 1, S, past+C+S], True = attend (training packs many blocks with it)."""
        ctx = self.hidden_norm(linear(self.fc, ctx_features))
        h = noise_embedding
        cos, sin = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            h = layer(h, ctx, cos, sin, cache, attention_mask)
        return self.norm(h)

    def forward_blocks(self, ctx_features: torch.Tensor, noise_embedding: torch.Tensor,
                       anchors: torch.Tensor) -> torch.Tensor:
        """Training's forward: [N, B, H] final-normed states of N blocks of one sequence at once, block i at positions
        anchors[i] .. anchors[i]+B-1 seeing the context strictly before anchors[i] and itself, exactly as `forward`
        drafts from that anchor (a test). ctx_features: [T, n_taps*H]; noise_embedding: [N, B, H]; anchors: [N].
        Each block attends to T + B keys, where one packed mask over all blocks would span T + N*B."""
        t, (n, b, _) = ctx_features.shape[0], noise_embedding.shape
        ctx = self.hidden_norm(self.fc(ctx_features))[None]                                      # [1, T, H]
        rope_ctx = self.rotary_emb(ctx, torch.arange(t, device=ctx.device)[None])                # [1, T, hd] x2
        positions = anchors[:, None] + torch.arange(b, device=ctx.device)[None]                  # [N, B]
        rope_blocks = self.rotary_emb(noise_embedding, positions)                                # [N, B, hd] x2
        seen = torch.arange(t, device=ctx.device)[None] < anchors[:, None]                       # [N, T]
        visible = torch.cat([seen, seen.new_ones(n, b)], 1)[:, None, None]                       # [N, 1, 1, T+B]
        h = noise_embedding
        for layer in self.layers:
            h = layer.forward_blocks(h, ctx, rope_ctx, rope_blocks, visible)
        return self.norm(h)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        return self._scaled(linear(lm_head, hidden))

    def set_draft_vocab(self, token_ids) -> None:
        """Draft only from `token_ids` (plus each request's prompt tokens; None: the whole vocabulary). Replies use
        a small part of the vocabulary, so reading out those rows of the LM head (as EAGLE-3's draft vocabulary)
        drafts the same tokens for a fraction of the [V, H] head's memory traffic; verification still scores all V."""
        self.draft_vocab = None if token_ids is None else torch.as_tensor(token_ids, dtype=torch.long).unique()

    def logits_from_rows(self, hidden: torch.Tensor, rows: torch.Tensor,
                         packed: torch.Tensor | None = None) -> torch.Tensor:
        """`logits` restricted to some rows [Vr, H] of the LM head: [..., Vr]; `packed`: the same rows in oneDNN's
        layout (`core.fast_forward.pack_weight`)."""
        return self._scaled(packed_linear(hidden, packed) if packed is not None and few_rows(hidden)
                            else F.linear(hidden, rows))

    def _scaled(self, out: torch.Tensor) -> torch.Tensor:
        """The config's output multiplier and final-logit soft cap, for both readouts."""
        out = out * self.output_multiplier
        return torch.tanh(out / self.softcap) * self.softcap if self.softcap > 0 else out

    def config_dict(self) -> dict:
        """z-lab's config.json layout (model_type qwen3, DFlashDraftModel, dflash_config)."""
        c = self.config
        return {
            "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "head_dim": self.layers[0].self_attn.head_dim,
            "hidden_act": c.hidden_act, "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": _rope_theta(c), "rope_scaling": None,
            "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
            "attention_bias": bool(getattr(c, "attention_bias", False)), "attention_dropout": 0.0,
            "layer_types": ["full_attention"] * c.num_hidden_layers, "sliding_window": None,
            "use_sliding_window": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "num_target_layers": c.num_target_layers, "block_size": self.block_size,
            "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids},
        }

    def save(self, folder, dtype: torch.dtype = torch.bfloat16) -> None:
        """Write config.json + model.safetensors (no embedding or LM head: they are the target's), and
        draft_vocab.json when the readout is restricted (the official implementation ignores it)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()
                 if not k.startswith("rotary_emb")}
        tmp = folder / ".model.safetensors.tmp"
        save_file(state, str(tmp), metadata={"format": "pt"})
        tmp.replace(folder / "model.safetensors")
        (folder / "config.json").write_text(json.dumps(self.config_dict(), indent=2) + "\n")
        vocab_file = folder / DRAFT_VOCAB_FILE
        if self.draft_vocab is not None:
            vocab_file.write_text(json.dumps({"token_ids": self.draft_vocab.tolist()}) + "\n")
        elif vocab_file.exists():
            vocab_file.unlink()


DRAFT_VOCAB_FILE = "draft_vocab.json"


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def drafter_config_for(target_config, n_layers: int = 1, n_taps: int | None = None, block_size: int = 16,
                       mask_token_id: int | None = None, intermediate_size: int | None = None) -> dict:
    """A z-lab style config for a drafter of a given target (attention geometry copied from the target)."""
    t = getattr(target_config, "text_config", target_config)
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    taps = build_target_layer_ids(t.num_hidden_layers, n_taps or n_layers)
    return {
        "hidden_size": t.hidden_size, "intermediate_size": intermediate_size or t.intermediate_size,
        "num_hidden_layers": n_layers, "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads, "head_dim": head_dim, "hidden_act": "silu",
        "rms_norm_eps": t.rms_norm_eps, "rope_theta": _rope_theta(t), "rope_scaling": None,
        "max_position_embeddings": t.max_position_embeddings, "vocab_size": t.vocab_size,
        "attention_bias": False, "attention_dropout": 0.0, "layer_types": ["full_attention"] * n_layers,
        "tie_word_embeddings": False, "num_target_layers": t.num_hidden_layers, "block_size": block_size,
        "dflash_config": {"mask_token_id": t.vocab_size - 1 if mask_token_id is None else mask_token_id,
                          "target_layer_ids": taps},
    }


def init_weights(module: nn.Module, std: float = 0.02, seed: int | None = None) -> None:
    """Qwen3's initialisation: normal(0, std) linears, unit norms."""
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    for m in module.modules():
        if isinstance(m, nn.Linear):
            with torch.no_grad():
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * std)
                if m.bias is not None:
                    m.bias.zero_()
        elif isinstance(m, Qwen3RMSNorm):
            nn.init.ones_(m.weight)


def deepen(drafter: DFlashDrafter, n_layers: int) -> DFlashDrafter:
    """`drafter` with layers appended up to `n_layers`, each a copy of its last layer whose output projections
    (o_proj, down_proj) are zero: the residual stream, hence every logit, is unchanged at the start, and training
    grows the new capacity from the trained function instead of from scratch."""
    if n_layers < len(drafter.layers):
        raise ValueError(f"cannot deepen a {len(drafter.layers)}-layer drafter to {n_layers} layers")
    config = copy.deepcopy(drafter.config)
    config.num_hidden_layers, config.layer_types = n_layers, ["full_attention"] * n_layers
    grown = DFlashDrafter(config).to(next(drafter.parameters()).dtype)
    grown.load_state_dict(drafter.state_dict(), strict=False)
    last = drafter.layers[-1].state_dict()
    for layer in grown.layers[len(drafter.layers):]:
        layer.load_state_dict(last)
        with torch.no_grad():
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    grown.set_draft_vocab(drafter.draft_vocab)
    return grown


def random_drafter_for(target, seed: int = 0, **kw) -> DFlashDrafter:
    """An untrained drafter that fits `target` (tests; a baseline that accepts about one token per step)."""
    drafter = DFlashDrafter.from_config_dict(drafter_config_for(target.config, **kw))
    init_weights(drafter, seed=seed)
    return drafter
