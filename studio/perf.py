"""The app's speed, measured through its own Run handler (the tool side of `core.eval.perf`, which never imports
the app).

    python -m studio.perf app-overhead   # a run streamed through the app's handler against the bare loop
    python -m studio.perf app-speed      # the app's speed-up against plain decoding on its four examples

Medians over repeats; the machine is shared and noisy, so read the ratios.
"""
from __future__ import annotations

import argparse
import re
import statistics
import time

import torch

import app
from core.config import DecodeConfig
from core.engine import run
from core.eval.perf import PROMPTS
from core.models import default_offline, encode_chat
from studio import handlers
from studio.handlers import Form
from studio.state import COSTS, get_pair, usable_pairs


def app_overhead(budget: int, new_tokens: int, repeats: int) -> None:
    """Wall time of a whole run streamed through the app's handler (figures built, throttled updates) against
    the bare engine loop the CLI runs, same prompts and settings; the app's post-run plain-decoding
    measurement is excluded (it is a separate baseline run)."""
    pair = get_pair("smollm2-135m")
    handlers._plain = lambda *a, **k: (1.0, [])
    ratios = []
    for rep in range(repeats + 1):
        for text in PROMPTS:
            ids = encode_chat(pair.tokenizer, text)
            t0 = time.perf_counter()
            records = run(pair, ids, DecodeConfig(method="ddtree", budget=budget, max_new_tokens=new_tokens))
            cli = time.perf_counter() - t0
            t0 = time.perf_counter()
            form = Form(text, "DDTree", budget, 0.0, 1.0, 0, new_tokens, 0, "smollm2-135m")
            updates = list(handlers.run(form, None))
            ui = time.perf_counter() - t0
            assert len(updates[-1][-1]["records"]) == len(records)
            if rep:
                ratios.append(cli / ui)
    print(f"| app speed / CLI speed (median of {len(ratios)} paired runs) | {statistics.median(ratios):.3f} |\n"
          f"| min | {min(ratios):.3f} |")


def app_speed(methods: list[str], budget: int, new_tokens: int, repeats: int) -> None:
    """What a visitor reads: the app's Run handler on each example prompt (math, code, chat, story) with the
    app's own defaults, and the speed-up against plain decoding that its metrics table shows (plain decoding of
    the same prompt, measured by the app in the same process). Medians over `repeats` rounds."""
    pair = get_pair(usable_pairs()[0])
    print(f"app defaults: method {handlers.DEFAULT_METHOD!r}, budget {handlers.DEFAULT_BUDGET}; cost curve "
          f"{COSTS.status(pair.name)}; {new_tokens} new tokens")
    print("| example | method | τ | tokens/s | speed-up vs plain (median) | each round |\n"
          "|---|---|---:|---:|---:|---|")
    names = ("math", "code", "chat", "story")
    for name, (prompt,) in zip(names, app.EXAMPLES):
        for label in methods:
            state, seen = None, []
            for _ in range(repeats):
                *_, last = handlers.run(Form(prompt, label, budget, 0.0, 1.0, 0, new_tokens, 0, pair.name), state)
                state = {"ar": {}}                # a fresh plain-decoding baseline every round
                table = last[3].splitlines()[2]
                tau, tps, speed = re.findall(r"[\d.]+", table)[:3]
                seen.append((float(tau), float(tps), float(speed)))
            speeds = [x[2] for x in seen]
            print(f"| {name} | {label} | {statistics.median(x[0] for x in seen):.2f} | "
                  f"{statistics.median(x[1] for x in seen):.1f} | **{statistics.median(speeds):.2f}×** | "
                  + ", ".join(f"{v:.2f}" for v in speeds) + " |", flush=True)


def main(argv=None) -> None:
    default_offline()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["app-overhead", "app-speed"])
    ap.add_argument("--methods", default=handlers.DEFAULT_METHOD,
                    help="app-speed: the app's method labels, separated by '|' (default: the app's default)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budgets", default="64", help="the budget (the first of a comma-separated list)")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    budget = int(args.budgets.split(",")[0])
    if args.what == "app-speed":
        app_speed(args.methods.split("|"), budget, args.new_tokens, args.repeats)
    else:
        app_overhead(budget, args.new_tokens, args.repeats)


if __name__ == "__main__":
    main()
