"""Train a DFlash drafter for a frozen target with the DFlash objective (Chen et al. 2026, section 3.1).

Usage: python -m core.training.train --data runs/data --out runs/train [--steps 4000] [--export assets/drafters/NAME]

Frozen target, embedding and LM head; random anchors over reply tokens, redrawn every epoch; blocks
[x_a, MASK...] that see the context strictly before their anchor and their own block bidirectionally, never other
blocks; cross-entropy weighted exp(-(k-1)/gamma) on the target's own greedy choice after the true prefix;
AdamW with warm-up, cosine decay and gradient clipping; bf16 autocast where the hardware computes bf16 natively
(`--bf16` / `--no-bf16` choose). A step is cheap: the frozen target's features are computed once per sequence and
kept on disk (`core.training.features`), each block attends to its own keys only, and q is normalised over the
draft vocabulary (`python -m core.eval.perf train-step` measures each change against stage 12's recipe).
Checkpoints (safetensors + JSON, atomic) every few minutes; rerunning resumes. Every `--eval-every` minutes tau is measured on held-out prompts
(replayed on fixed greedy replies, `core.eval.judge`, or with the real decode loop), and the best drafter so far is
exported (z-lab format, bf16). New data shards are picked up at each epoch, so training can start while
`generate_data` is still running.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from core.config import DecodeConfig
from core.dflash import DFlashDrafter, deepen, drafter_config_for, extract_features, init_weights
from core.drafter import readout_ids
from core.engine import run
from core.eval.judge import prompt_tau, reference_reply, reference_states, replay
from core.hardware import auto_dtype, cpu_summary
from core.models import ModelPair, encode_chat, load_drafter, load_target, resolve_device
from core.records import summarize
from core.training.data import cap_sources, draft_vocab, load_sequences, make_blocks, repeat_sources, source_mix
from core.training.features import FeatureCache, target_pass
from core.training.prompts import is_held_out, prompt_key, prompt_source, training_prompts


def block_logits(drafter, target, batch, autocast: bool, all_target_logits: bool = False,
                 readout: torch.Tensor | None = None, features: torch.Tensor | None = None,
                 depth: int | None = None, packed: bool = False):
    """The drafter's logits at the first `depth` drafted positions of every block [N, depth, V or Vr] (all B-1 by
    default), exactly what `draft_block` gives for that anchor at inference (a test checks it), and the target's
    output (its logits at every position with `all_target_logits`, as distillation needs; else the last one's),
    or None when `features` ([T, n_taps*H], `core.training.features`) spare the target's forward.
    `packed`: all blocks in one sequence of T + N*B keys under a block mask, where `forward_blocks` (the default)
    gives each block its T + B keys."""
    out = None
    if features is None:
        with torch.no_grad(), torch.autocast(batch.ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            out = target(input_ids=batch.ids[None], output_hidden_states=True,
                         logits_to_keep=0 if all_target_logits else 1)
            features = extract_features(out.hidden_states, drafter.target_layer_ids)[0].float()  # [T, n*H]
    noise = F.embedding(batch.block_ids, target.get_input_embeddings().weight).float()      # [N*B, H]
    noise = noise * drafter.input_embedding_scale
    head = target.get_output_embeddings()
    n, b1 = batch.labels.shape
    depth = min(depth or b1, b1)
    with torch.autocast(batch.ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        if packed:
            hidden = drafter(features[None], noise[None], batch.positions[None], attention_mask=batch.mask)
        else:
            hidden = drafter.forward_blocks(features, noise.view(n, b1 + 1, -1), batch.anchors)
        hidden = hidden.view(n, b1 + 1, -1)[:, 1: 1 + depth]                                    # [N, depth, H]
        if readout is None:
            return drafter.logits(hidden, head), out                                            # [N, depth, V]
        return drafter.logits_from_rows(hidden, head.weight[readout]), out                      # [N, depth, Vr]


def weighted_loss(drafter, target, batch, autocast: bool, distill: float = 0.0, readout: torch.Tensor | None = None,
                  features: torch.Tensor | None = None, greedy: torch.Tensor | None = None,
                  depth: int | None = None, packed: bool = False):
    """Weighted loss over one sequence's blocks; returns (loss, per-position correct [depth], per-position count).

    Per position: cross-entropy on the reply token x_{a+k}, or with `greedy` ([T], the target's argmax at every
    position) on the target's own greedy choice after x_{<a+k} (the label verification accepts at T = 0); with
    `distill` > 0 the mix (1 - distill) * CE + distill * KL(p || q), where p is the target's own next-token
    distribution at a+k given the true prefix (its soft label; free, the target's forward runs anyway). `readout`:
    [Vr] token ids q is normalised over, as when drafting (`core.drafter.readout_ids`); labels outside it carry no
    loss, p is renormalised over it. None: all V. `depth`: only the first drafted positions carry a loss (and
    reach the LM head); `features`, `packed`: as `block_logits`."""
    logits, out = block_logits(drafter, target, batch, autocast, bool(distill), readout, features, depth, packed)
    head = target.get_output_embeddings()
    n, depth = logits.shape[:2]
    labels = batch.labels[:, :depth]                                                            # [N, depth] ids
    if greedy is not None:       # the target's choice at a+k given x_{<a+k}: its argmax at position a+k-1
        src = batch.anchors[:, None] + torch.arange(depth, device=labels.device)[None]          # [N, depth]
        labels = torch.where(labels >= 0, greedy[src.clamp(max=len(greedy) - 1)], labels)
    if readout is not None:      # token ids -> readout columns; a label outside the readout carries no loss
        column = torch.full((head.weight.shape[0],), -100, dtype=torch.long, device=labels.device)
        column[readout] = torch.arange(len(readout), device=labels.device)
        labels = torch.where(labels >= 0, column[labels.clamp(min=0)], labels)
    valid = labels >= 0
    log_q = F.log_softmax(logits.float(), -1)                                                   # [N, depth, V]
    per_pos = -log_q.gather(-1, labels.clamp(min=0)[..., None])[..., 0]                         # [N, depth] CE
    if distill:
        p_logits = out.logits[0] if readout is None else out.logits[0][:, readout]              # [T, V or Vr]
        log_p = soft_labels(p_logits, batch.anchors, depth)                                    # [N, depth, V]
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)                                           # [N, depth]
        per_pos = (1 - distill) * per_pos + distill * kl
    w = batch.weights[None, :depth].expand(n, depth) * valid
    loss = (per_pos * w).sum() / w.sum().clamp(min=1e-6)
    correct = ((logits.argmax(-1) == labels) & valid).sum(0)
    return loss, correct, valid.sum(0)


def soft_labels(target_logits: torch.Tensor, anchors: torch.Tensor, b1: int) -> torch.Tensor:
    """log p(x_{a+k} | x_{<a+k}) for k = 1..B-1 of each anchor a: the target's logits at a+k-1. [T, V] -> [N, B-1, V]"""
    src = (anchors[:, None] + torch.arange(b1, device=anchors.device)[None]).clamp(max=target_logits.shape[0] - 1)
    return F.log_softmax(target_logits[src].float(), -1)


def lr_at(step: int, total: int, peak: float, warmup: float) -> float:
    w = max(1, int(total * warmup))
    if step < w:
        return peak * (step + 1) / w
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - w) / max(1, total - w))))


def param_groups(drafter, init_lr_scale: float, n_init: int | None) -> list[dict]:
    """AdamW groups: the layers appended by --deepen at the full lr, the parameters the --init drafter brought at
    `init_lr_scale` of it, so new capacity can learn fast without undoing what the trained layers know; at scale 0
    those are frozen (no gradient, no AdamW state, and backward stops at the first new layer)."""
    if n_init is None or n_init == len(drafter.layers) or init_lr_scale == 1.0:
        return [{"params": [p for p in drafter.parameters() if p.requires_grad], "lr_scale": 1.0}]
    new_prefixes = tuple(f"layers.{i}." for i in range(n_init, len(drafter.layers)))
    new, old = [], []
    for name, p in drafter.named_parameters():
        if p.requires_grad:
            (new if name.startswith(new_prefixes) else old).append(p)
    if init_lr_scale == 0.0:
        for p in old:
            p.requires_grad_(False)
        return [{"params": new, "lr_scale": 1.0}]
    return [{"params": old, "lr_scale": init_lr_scale}, {"params": new, "lr_scale": 1.0}]


def save_checkpoint(folder: Path, drafter, opt, state: dict) -> None:
    """Drafter + AdamW moments as safetensors, counters as JSON; written to temp files, then renamed."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in drafter.state_dict().items()
               if not k.startswith("rotary_emb")}
    for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
        st = opt.state.get(p)
        if st:
            tensors[f"opt.{i}.exp_avg"], tensors[f"opt.{i}.exp_avg_sq"] = st["exp_avg"].cpu(), st["exp_avg_sq"].cpu()
            state.setdefault("opt_steps", {})[str(i)] = float(st["step"])
    save_file(tensors, str(folder / ".ckpt.tmp"))
    (folder / ".state.tmp").write_text(json.dumps(state))
    os.replace(folder / ".ckpt.tmp", folder / "ckpt.safetensors")
    os.replace(folder / ".state.tmp", folder / "state.json")


def load_checkpoint(folder: Path, drafter, opt) -> dict | None:
    if not (folder / "ckpt.safetensors").is_file() or not (folder / "state.json").is_file():
        return None
    tensors = load_file(str(folder / "ckpt.safetensors"))
    state = json.loads((folder / "state.json").read_text())
    drafter.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")}, strict=False)
    for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
        if f"opt.{i}.exp_avg" in tensors:
            if tensors[f"opt.{i}.exp_avg"].shape != p.shape:
                raise SystemExit(f"{folder}: its optimizer state does not fit these parameters; resume with the "
                                 f"flags it started with (--deepen, --init-lr-scale)")
            opt.state[p] = {"exp_avg": tensors[f"opt.{i}.exp_avg"].to(p.device),
                            "exp_avg_sq": tensors[f"opt.{i}.exp_avg_sq"].to(p.device),
                            "step": torch.tensor(state["opt_steps"][str(i)])}
    return state


def evaluate_tau(drafter, target, tokenizer, prompts: list[list[int]], max_new_tokens: int,
                 references: list[tuple] | None = None) -> dict:
    """tau of chain and DDTree (budget 64), greedy, on held-out prompts: with `references` (`fixed_references`)
    replayed on those fixed replies (`core.eval.judge`: every checkpoint judged on the same tokens), else decoded for
    real, where a near-tie tipped in bf16 moves a reply and its tau by whole tokens."""
    q = copy.deepcopy(drafter).to(target.dtype).eval()
    pair = ModelPair("eval", target, tokenizer, q, target.dtype, target.device)
    result = {}
    for method in ("chain", "ddtree"):
        cfg = DecodeConfig(method=method, budget=64, max_new_tokens=max_new_tokens)
        if references is None:
            result[method] = round(summarize([run(pair, p, cfg) for p in prompts]).tau, 3)
        else:
            taus = [prompt_tau(replay(pair, p, reply, cfg, states)) for p, reply, states in references]
            result[method] = round(float(np.mean(taus)), 3)
    return result


def held_out_mix(held: list, n: int) -> list:
    """n held-out prompts taken in turn from each source (GSM8K, chat, code, science ...), so tau during training
    speaks for every kind of prompt, not only the most numerous."""
    by_source: dict[str, list] = {}
    for p in held:
        by_source.setdefault(prompt_source(p.key), []).append(p)
    mixed = [p for group in itertools.zip_longest(*by_source.values()) for p in group if p is not None]
    return mixed[:n]


def fixed_references(target, tokenizer, prompts: list[list[int]], max_new_tokens: int) -> list[tuple]:
    """(prompt, the target's greedy reply, its hidden states over both) per held-out prompt: made once per run,
    so `evaluate_tau` replays every checkpoint on the same replies."""
    pair = ModelPair("eval", target, tokenizer, None, target.dtype, target.device)
    refs = []
    for p in prompts:
        reply = reference_reply(pair, p, max_new_tokens)
        refs.append((p, reply, reference_states(pair, p, reply)))
    return refs


def _epoch_sequences(args, tok, allowed: set[str]) -> list:
    """The replies an epoch passes over: training prompts only, at most --max-len tokens, capped and repeated by
    source as the flags say (re-read each epoch, so shards written meanwhile join the next one)."""
    seqs = cap_sources([s for s in load_sequences(args.data, tokenizer=tok)
                        if len(s.ids) <= args.max_len and prompt_key(s.key) in allowed], args.source_cap, args.seed)
    seqs = repeat_sources(seqs, args.source_repeat)
    if len(seqs) < args.accum:
        raise SystemExit(f"--data {args.data}: {len(seqs)} usable replies (training prompts, at most --max-len "
                         f"{args.max_len} tokens), fewer than --accum {args.accum}; generate data first")
    return seqs


def train(args) -> None:
    torch.manual_seed(args.seed)
    out = Path(args.out)
    target, tok = load_target(args.target, dtype="bf16" if args.bf16 else "fp32")
    drafter, n_init = _drafter(args, target, tok)
    groups = param_groups(drafter.train(), args.init_lr_scale, n_init)
    params = [p for g in groups for p in g["params"]]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    state = load_checkpoint(out, drafter, opt)
    fresh = state is None
    state = state or {"step": 0, "epoch": 0, "best_tau": 0.0, "history": []}
    if fresh and args.init and drafter.draft_vocab is not None:
        state["draft_vocab"] = drafter.draft_vocab.tolist()
    prompts = training_prompts(args.seed)
    allowed = {p.key for p in prompts if not is_held_out(p.key)}
    if "draft_vocab" not in state:      # the export's draft vocabulary: chosen once, kept on resume
        state["draft_vocab"] = _draft_vocab(args, target, tok, allowed)
    drafter.set_draft_vocab(state["draft_vocab"])
    capped = "".join(f"\n{source:>30}: at most {n} replies (--source-cap)" for source, n in args.source_cap.items())
    capped += "".join(f"\n{source:>30}: each reply {n} times an epoch (--source-repeat)"
                      for source, n in args.source_repeat.items())
    print(f"training replies by source:\n{source_mix(args.data)}{capped}\ndrafter: "
          f"{sum(p.numel() for p in params) / 1e6:.2f} M trainable parameters, taps "
          f"{drafter.target_layer_ids}, mask token {drafter.mask_token_id}, draft vocabulary "
          f"{len(state['draft_vocab'] or []) or 'all'}, resuming at step {state['step']}")
    held = held_out_mix([p for p in prompts if is_held_out(p.key)], args.eval_prompts)
    eval_prompts = [encode_chat(tok, p.text) for p in held]
    references = fixed_references(target, tok, eval_prompts, args.eval_tokens) if args.eval == "judge" else None
    if fresh and args.init:     # the starting point's tau: an export must beat it
        tau = evaluate_tau(drafter, target, tok, eval_prompts, args.eval_tokens, references)
        state["best_tau"] = tau["ddtree"]
        state["history"].append({"step": 0, "tau": tau, "init": str(args.init), "time": round(time.time())})
        print(f"start ({args.init}): tau {tau}")
    bar = tqdm(total=args.steps, initial=state["step"], desc="train", dynamic_ncols=True, mininterval=5.0)
    last_ckpt = last_eval = time.time()
    acc_c = acc_n = torch.zeros(min(args.loss_depth or drafter.block_size - 1, drafter.block_size - 1))
    cache = _feature_cache(args, out, target, drafter)
    while state["step"] < args.steps:
        seqs = _epoch_sequences(args, tok, allowed)
        rng = np.random.default_rng(args.seed + state["epoch"])    # an epoch's order, the same when it resumes
        rng.shuffle(seqs)
        for i in range(state.get("offset", 0), len(seqs) - args.accum + 1, args.accum):
            for g in opt.param_groups:
                g["lr"] = lr_at(state["step"], args.steps, args.lr, args.warmup) * g["lr_scale"]
            opt.zero_grad(set_to_none=True)
            total, acc_c, acc_n = _accumulate(drafter, target, seqs[i: i + args.accum], args, rng, acc_c, acc_n,
                                              cache)
            torch.nn.utils.clip_grad_norm_(params, args.clip)
            opt.step()
            state["step"] += 1
            state["offset"] = i + args.accum                            # sequences of this epoch done
            acc = (acc_c / acc_n.clamp(min=1)).tolist()
            bar.update(1)
            bar.set_postfix(loss=f"{total:.3f}", **{f"acc{k}": f"{acc[k - 1]:.2f}" for k in (1, 4, 8) if k <= len(acc)},
                            epoch=state["epoch"], refresh=False)
            now = time.time()
            if now - last_eval > args.eval_every * 60 or state["step"] >= args.steps:
                tau = evaluate_tau(drafter, target, tok, eval_prompts, args.eval_tokens, references)
                state["history"].append({"step": state["step"], "loss": round(total, 4), "tau": tau,
                                         "acc": [round(a, 3) for a in acc], "time": round(now)})
                tqdm.write(f"step {state['step']}: tau {tau}  loss {total:.3f}")
                if args.export and tau["ddtree"] > state["best_tau"]:
                    state["best_tau"] = tau["ddtree"]
                    export(drafter, args.export, state["step"], tau, args)
                last_eval = time.time()
            if time.time() - last_ckpt > args.ckpt_every * 60:
                save_checkpoint(out, drafter, opt, state)
                last_ckpt = time.time()
            if state["step"] >= args.steps:
                break
        else:
            state["epoch"], state["offset"] = state["epoch"] + 1, 0
    save_checkpoint(out, drafter, opt, state)
    if args.export_final:
        export(drafter, args.export_final, state["step"], state["history"][-1]["tau"] if state["history"] else None,
               args)
    bar.close()


def _drafter(args, target, tok):
    """The drafter to train and the layer count it started with (None when freshly initialised)."""
    cfg = drafter_config_for(target.config, n_layers=args.layers, n_taps=args.taps, block_size=args.block_size,
                             mask_token_id=tok.convert_tokens_to_ids(args.mask_token))
    if args.init:       # continue from a trained drafter (its own config and draft vocabulary), fresh optimizer
        drafter = load_drafter(args.init, target, dtype="fp32")
        n_init = len(drafter.layers)
        if args.deepen:
            try:
                drafter = deepen(drafter, args.deepen)
            except ValueError as e:
                raise SystemExit(f"--deepen {args.deepen}: {e}; give at least the --init drafter's layer count") from e
        drafter.requires_grad_(True)
    else:
        drafter = DFlashDrafter.from_config_dict(cfg)
        init_weights(drafter, seed=args.seed)
        drafter.to(target.device)
        n_init = None
    return drafter, n_init


def _feature_cache(args, out: Path, target, drafter) -> FeatureCache | None:
    """The frozen target's features on disk ('auto': OUT/features on a CPU; an accelerator recomputes them faster
    than a disk reads them)."""
    if args.feature_cache == "off" or (args.feature_cache == "auto" and target.device.type != "cpu"):
        return None
    folder = out / "features" if args.feature_cache == "auto" else Path(args.feature_cache)
    return FeatureCache(folder, target, drafter.target_layer_ids, args.bf16)


def _draft_vocab(args, target, tok, allowed: set) -> list[int] | None:
    """The export's draft vocabulary, chosen from the training replies' tokens (None: all V)."""
    seqs = [s for s in load_sequences(args.data, tokenizer=tok) if prompt_key(s.key) in allowed]
    stops = tuple(ModelPair("train", target, tok, None, target.dtype, target.device).stop_ids)
    vocab = target.get_output_embeddings().weight.shape[0]
    return draft_vocab(seqs, args.draft_vocab, vocab, stops) if args.draft_vocab else None


def _accumulate(drafter, target, batch_seqs, args, rng, acc_c, acc_n, cache: FeatureCache | None = None):
    """Gradients of one optimizer step's sequences (mean loss), and the running per-position accuracy."""
    total = 0.0
    for seq in batch_seqs:
        batch = make_blocks(seq, drafter.block_size, drafter.mask_token_id, args.anchors, args.gamma, rng,
                            args.tokens_per_anchor).to(target.device)
        readout = readout_ids(drafter, seq.ids[: seq.prompt_len]) if args.draft_readout else None
        readout = None if readout is None else readout.to(target.device)
        features, greedy = (cache.get(seq) if cache is not None else
                            target_pass(target, batch.ids, drafter.target_layer_ids, args.bf16))
        if args.distill:         # the soft labels need the target's logits at every position: its forward again
            features = None
        loss, correct, count = weighted_loss(drafter, target, batch, args.bf16, args.distill, readout, features,
                                             greedy if args.labels == "greedy" else None, args.loss_depth,
                                             args.attention == "packed")
        (loss / args.accum).backward()
        total += loss.item() / args.accum
        acc_c, acc_n = acc_c * 0.98 + correct.cpu(), acc_n * 0.98 + count.cpu()
    return total, acc_c, acc_n


def export(drafter, folder, step: int, tau: dict | None, args) -> None:
    """The drafter in z-lab's format, with the step, held-out tau and arguments that made it."""
    drafter.save(folder)
    (Path(folder) / "training_state.json").write_text(json.dumps(
        {"step": step, "tau_heldout": tau, "args": vars(args)}, indent=2))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="runs/data", help="folder of shards from core.training.generate_data")
    ap.add_argument("--out", default="runs/train", help="checkpoint folder (resumes if present)")
    ap.add_argument("--export", default=None, help="folder that receives the best drafter (z-lab format, bf16)")
    ap.add_argument("--export-final", default=None,
                    help="folder that also receives the last step's drafter, whatever its held-out tau (to compare "
                         "it with the best one on a benchmark: ten held-out prompts are a noisy judge)")
    ap.add_argument("--target", default="embedded:smollm2-135m-instruct", help="target model id or folder")
    ap.add_argument("--init", default=None,
                    help="start from this trained drafter folder (its config and draft vocabulary; fresh optimizer; "
                         "exports only what beats its held-out tau); ignored when --out holds a checkpoint")
    ap.add_argument("--layers", type=int, default=3, help="drafter decoder layers")
    ap.add_argument("--deepen", type=int, default=0,
                    help="with --init: append layers up to this many, copies of its last layer with zeroed output "
                         "projections, so training starts from the trained drafter's exact predictions")
    ap.add_argument("--init-lr-scale", type=float, default=1.0,
                    help="with --deepen: the --init drafter's own parameters train at this share of --lr, the "
                         "appended layers at --lr (0 freezes the former: a step only backpropagates through the new "
                         "layers)")
    ap.add_argument("--taps", type=int, default=5, help="target layers fused into the context features")
    ap.add_argument("--block-size", type=int, default=16, help="block size B (B-1 drafted positions)")
    ap.add_argument("--mask-token", default="<empty_output>", help="existing special token used as MASK")
    ap.add_argument("--gamma", type=float, default=7.0, help="loss decay over block positions")
    ap.add_argument("--draft-vocab", type=int, default=16384,
                    help="the exported drafter drafts from the N most frequent training tokens plus each prompt's "
                         "(draft_vocab.json; 0 = the whole vocabulary); chosen at the first start, kept on resume")
    ap.add_argument("--draft-readout", action=argparse.BooleanOptionalAction, default=True,
                    help="normalise q over the rows it drafts from (the draft vocabulary plus the sequence's prompt "
                         "tokens), as at inference; labels outside them carry no loss. About a third of the LM "
                         "head's cost with the default 16,384-token draft vocabulary")
    ap.add_argument("--loss-depth", type=int, default=0,
                    help="only the first N drafted positions of a block carry a loss and reach the LM head (0: all "
                         "B-1); the block keeps its B positions")
    ap.add_argument("--attention", choices=("blocks", "packed"), default="blocks",
                    help="blocks: each block attends to the context before its anchor and itself (T + B keys); "
                         "packed: one mask over all blocks of a sequence (T + N*B keys, the older, slower path)")
    ap.add_argument("--feature-cache", default="auto",
                    help="folder keeping the frozen target's features and greedy choices per sequence, computed on "
                         "a sequence's first visit and read back in later epochs ('auto': OUT/features, about 6 KB "
                         "a token; 'off': run the target every step)")
    ap.add_argument("--labels", choices=("greedy", "reply"), default="greedy",
                    help="greedy: each drafted position learns the target's own argmax after the true prefix (what "
                         "verification accepts at T = 0; sampled replies then still teach clean labels); reply: the "
                         "reply's next token")
    ap.add_argument("--distill", type=float, default=0.0,
                    help="share of KL to the target's soft labels in the loss (0: the paper's cross-entropy)")
    ap.add_argument("--anchors", type=int, default=48, help="max anchors (blocks) per sequence")
    ap.add_argument("--tokens-per-anchor", type=int, default=8,
                    help="one anchor per this many reply tokens (up to --anchors): denser anchors give more drafter "
                         "signal per frozen target forward")
    ap.add_argument("--max-len", type=int, default=1024, help="skip longer sequences")
    ap.add_argument("--source-cap", action="append", default=[], metavar="SOURCE=N",
                    help="train on at most N replies of this prompt source (a seeded choice, kept on resume; "
                         "repeatable), e.g. gsm8k_train=1000 for a broad mix")
    ap.add_argument("--source-repeat", action="append", default=[], metavar="SOURCE=K",
                    help="train on each reply of this prompt source K times an epoch (repeatable): weight a new "
                         "source in a short run from a trained drafter, e.g. pubmedqa=4")
    ap.add_argument("--steps", type=int, default=4000, help="optimizer steps in total")
    ap.add_argument("--accum", type=int, default=4, help="sequences per optimizer step")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=float, default=0.04, help="warm-up share of the steps")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient-norm clip")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 autocast (default: where the hardware computes bf16 natively, as --dtype auto)")
    ap.add_argument("--ckpt-every", type=float, default=5.0, help="minutes between checkpoints")
    ap.add_argument("--eval-every", type=float, default=20.0, help="minutes between tau evaluations")
    ap.add_argument("--eval", choices=("judge", "decode"), default="judge",
                    help="held-out tau by replaying the target's greedy reply to each prompt, fixed once per run "
                         "(judge: every checkpoint on the same tokens, no verification forwards), or by decoding "
                         "for real (decode: a tipped near-tie in bf16 moves a reply and its tau)")
    ap.add_argument("--eval-prompts", type=int, default=6, help="held-out prompts for tau, in turn from each source")
    ap.add_argument("--eval-tokens", type=int, default=128, help="new tokens per held-out prompt")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def _per_source(ap, flag: str, what: str, values: list[str]) -> dict[str, int]:
    """{source: n} from repeated SOURCE=N flags, or a usage error that names the flag."""
    out = {}
    for value in values:
        source, _, n = value.partition("=")
        if not source or not n.isdigit():
            ap.error(f"{flag} takes SOURCE=N, a prompt source and {what} (got {value!r})")
        out[source] = int(n)
    return out


def main(argv=None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    if not 0.0 <= args.distill <= 1.0:
        ap.error(f"--distill is the KL share of the loss, between 0 and 1 (got {args.distill})")
    if args.loss_depth < 0:
        ap.error(f"--loss-depth counts drafted positions, 0 for all (got {args.loss_depth})")
    if args.anchors < 1:
        ap.error(f"--anchors must be at least 1 (got {args.anchors})")
    if args.tokens_per_anchor < 1:
        ap.error(f"--tokens-per-anchor must be at least 1 (got {args.tokens_per_anchor})")
    if args.deepen < 0:
        ap.error(f"--deepen is the drafter's new layer count (got {args.deepen})")
    if args.deepen and not args.init:
        ap.error("--deepen grows a trained drafter: give it with --init (a new drafter takes --layers)")
    if not 0.0 <= args.init_lr_scale <= 1.0:
        ap.error(f"--init-lr-scale is a share of --lr, between 0 and 1 (got {args.init_lr_scale})")
    if args.init_lr_scale != 1.0 and not args.deepen:
        ap.error("--init-lr-scale sets the lr of the layers --deepen did not add: give --deepen (to train a drafter "
                 "more slowly, lower --lr)")
    args.source_cap = _per_source(ap, "--source-cap", "a reply count", args.source_cap)
    args.source_repeat = _per_source(ap, "--source-repeat", "a number of passes", args.source_repeat)
    if 0 in args.source_repeat.values():
        ap.error("--source-repeat takes K >= 1 (to leave a source out, use --source-cap SOURCE=0)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.bf16 is None:       # emulated bf16 makes a step several times slower than fp32
        choice = auto_dtype(resolve_device("auto").type)
        args.bf16 = choice.dtype == torch.bfloat16
        print(f"dtype {choice.name} ({choice.reason}) on {cpu_summary()}", file=sys.stderr)
    train(args)


if __name__ == "__main__":
    main()
