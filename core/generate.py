"""Generate from the command line, streaming the text, then print the run's summary.

    python -m core.generate --prompt "Write a haiku about trees." --method ddtree --budget 64

The default model pair is the embedded SmolLM2-135M with its shipped DFlash drafter (offline, CPU).
"""
from __future__ import annotations

import argparse
import sys

from core.config import MAX_BUDGET, METHODS, MODEL_PAIRS, DecodeConfig
from core.engine import generate
from core.hardware import describe_dtype
from core.models import ModelLoadError, default_offline, encode_chat, load_custom_pair, load_pair
from core.records import summarize


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m core.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", required=True, help="user message (rendered with the target's chat template)")
    ap.add_argument("--method", default="ddtree", choices=METHODS,
                    help="ar = plain decoding; chain = vanilla DFlash; ddtree = DDTree; presto / presto-beam = "
                         "PRESTO's prefix-aligned trees; ddtree-auto / presto-auto choose the budget "
                         "every step from the measured verification cost (default: ddtree)")
    ap.add_argument("--budget", type=int, default=64, help=f"draft-tree nodes per step, 1..{MAX_BUDGET} (default 64); "
                                                              "for -auto methods the most a step may use")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default 1)")
    ap.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = off (default)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="generation length cap (default 256)")
    ap.add_argument("--seed", type=int, default=0, help="seed for sampling at temperature > 0 (default 0)")
    ap.add_argument("--block-size", type=int, default=None, help="draft block size (default: the drafter's)")
    ap.add_argument("--lam", type=float, default=DecodeConfig.lam,
                    help=f"PRESTO: weight of the n-gram score (default {DecodeConfig.lam})")
    ap.add_argument("--beam-width", type=int, default=None, help="PRESTO-beam: beam width per depth")
    ap.add_argument("--pair", default="smollm2-135m", choices=sorted(MODEL_PAIRS),
                    help="registered target+drafter pair (default: the embedded smollm2-135m)")
    ap.add_argument("--target", default=None, help="any causal-LM hub id or local folder (overrides --pair)")
    ap.add_argument("--drafter", default=None,
                    help="DFlash drafter folder or hub id to go with --target ('random' = untrained)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32", "fp16"],
                    help="weights dtype; auto (default) = bf16 on CUDA and on CPUs with AVX512-BF16 or AMX, fp32 on "
                         "CPUs that would emulate bf16 (there a draft tree costs several times as much in bf16)")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ... (default auto)")
    ap.add_argument("--full-readout", action="store_true",
                    help="draft from the whole vocabulary even when the drafter ships a draft vocabulary")
    ap.add_argument("--quiet", action="store_true", help="print only the summary")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    default_offline()
    args = parse_args(argv)
    cfg = DecodeConfig(method=args.method, budget=args.budget, temperature=args.temperature, top_p=args.top_p,
                       top_k=args.top_k, max_new_tokens=args.max_new_tokens, seed=args.seed,
                       block_size=args.block_size, lam=args.lam, beam_width=args.beam_width,
                       full_readout=args.full_readout)
    try:
        cfg.validate()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if args.target:
            pair = load_custom_pair(args.target, args.drafter if args.method != "ar" else None, args.dtype,
                                    args.device)
        else:
            pair = load_pair(args.pair, args.dtype, args.device, with_drafter=args.method != "ar")
        records = []
        for record in generate(pair, encode_chat(pair.tokenizer, args.prompt), cfg):
            records.append(record)
            if not args.quiet:
                print(record.text, end="", flush=True)
    except (ModelLoadError, ValueError) as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 2
    s = summarize([records])
    why = {"stop": "end of reply", "length": f"--max-new-tokens {cfg.max_new_tokens} reached",
           "context": "the model's context window is full"}.get(records[-1].finish, records[-1].finish)
    print(f"\n\n--- {args.method} budget={cfg.budget} T={cfg.temperature} | {s.tokens} tokens, {s.steps} target "
          f"forwards after the prefill; stopped: {why}")
    print(f"tau (tokens per target forward, bonus counted) = {s.tau:.2f}   expected from the tree (1 + sum q) = "
          f"{s.expected_tau:.2f}" + (f"   oracle = {s.oracle_tau:.2f}" if s.oracle_tau else ""))
    print(f"decode {s.tokens_per_second:.1f} tokens/s (prefill {s.prefill_seconds * 1000:.0f} ms excluded)   "
          "time shares: " + ", ".join(f"{k} {v:.0%}" for k, v in s.phase_shares.items()))
    print("acceptance histogram: " + " ".join(f"{k}:{v}" for k, v in s.histogram.items()))
    print(f"dtype {describe_dtype(pair.dtype, pair.device)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
