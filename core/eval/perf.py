"""Engine micro-benchmarks, each measured side by side with its baseline in one process.

    python -m core.eval.perf ar-vs-generate   # our `ar` loop against transformers `generate`, greedy, same prompts
    python -m core.eval.perf verify-latency   # target forward time for 1..512 tree tokens on a cached context
    python -m core.eval.perf forward-ab       # the engine's target forward against transformers' model(...), per N
    python -m core.eval.perf tree-cost        # tree build + mask time per step as a share of the step
    python -m core.eval.perf first-token      # seconds from Run to the first token in a browser, fresh cache
    python -m core.eval.perf logit-drift      # how far forward width moves the target's logits
    python -m core.eval.perf memory           # RSS over a long run and over repeated runs, against the records' size
    python -m core.eval.perf train-step       # a training sequence's loss + backward: stage 12's recipe, each change

The app's own speed (app-overhead, app-speed) is measured by `python -m studio.perf`, which may import the app.
Medians over repeats; the machine is shared and noisy, so read the ratios.
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import fields
from pathlib import Path

import networkx as nx
import numpy as np
import psutil
import torch

from core.config import DecodeConfig
from core.costs import measure, sample_tree
from core.drafter import readout_ids
from core.engine import generate, output_ids, run
from core.eval.benchmark import DTYPE_ALIASES, DTYPE_HELP, DTYPES, announce_dtype
from core.fast_forward import forward, pack_linears
from core.kv_cache import cache_kwargs, crop_to, new_cache
from core.models import (EMBEDDED_TARGET, ModelPair, default_offline, embedded_target_dir, encode_chat,
                         load_custom_pair, load_drafter, load_pair, load_target)
from core.builders import build_ddtree
from core.records import StepRecord, summarize
from core.training.data import load_sequences, make_blocks
from core.training.features import FeatureCache
from core.training.train import weighted_loss
from core.verify import tree_inputs
from viz.graph import step_graph
from viz.tree_graph import tidy_layout

PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "What are some good tips for staying focused while studying?",
           "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did Natalia sell altogether in April and May?"]


def ar_vs_generate(dtype: str, new_tokens: int, repeats: int) -> None:
    pair = load_pair("smollm2-135m", dtype=dtype, with_drafter=False)
    prompts = [encode_chat(pair.tokenizer, p) for p in PROMPTS]
    ours, theirs = [], []
    for rep in range(repeats + 1):
        for ids in prompts:
            t0 = time.perf_counter()
            out = pair.target.generate(torch.tensor([ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                       do_sample=False, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
            hf = (out.shape[1] - len(ids)) / (time.perf_counter() - t0)
            records = run(pair, ids, DecodeConfig(method="ar", max_new_tokens=new_tokens))
            s = summarize([records])
            mine = s.tokens / (s.decode_seconds + s.prefill_seconds)   # same scope as generate: prefill included
            if rep:   # the first round warms up
                ours.append(mine)
                theirs.append(hf)
    print(f"| ar loop (ours) | {statistics.median(ours):.1f} tok/s |\n| transformers generate | "
          f"{statistics.median(theirs):.1f} tok/s |\n| ratio (median of pairs) | "
          f"{statistics.median([a / b for a, b in zip(ours, theirs)]):.3f} |")


def verify_latency(sizes: list[int], past_len: int, repeats: int, dtypes: list[str]) -> dict:
    table = {}
    for dtype in dtypes:
        target, _ = load_target(dtype=dtype)
        for n, ms in measure(target, sizes, past_len, repeats).items():
            table[(dtype, n)] = ms
    print("| tree tokens N | " + " | ".join(f"{d} ms" for d in dtypes) + " |\n|---:|" + "---:|" * len(dtypes))
    for n in sizes:
        print(f"| {n} | " + " | ".join(f"{table[(d, n)]:.1f}" for d in dtypes) + " |")
    return table


def forward_ab(sizes: list[int], past_len: int, repeats: int, dtype: str) -> None:
    """Tree verification forwards through `core.fast_forward` and through `model(...)`, alternating on the same
    cached context, with a bit-for-bit comparison of their logits and hidden states."""
    target, _ = load_target(dtype=dtype)
    vocab = target.get_input_embeddings().weight.shape[0]
    ours, stock = new_cache(target), new_cache(target)
    prefix = torch.randint(0, vocab, (1, past_len))
    forward(target, prefix, ours)
    with torch.no_grad():
        target(input_ids=prefix, **cache_kwargs(target, stock))
    print(f"packed linear weights: {pack_linears(target)}\n")
    print("| tree tokens N | transformers ms | ours ms | ratio | bitwise equal |\n|---:|---:|---:|---:|:---:|")
    for n in sizes:
        inputs = tree_inputs(sample_tree(n, vocab), past_len, target.dtype, target.device)
        a, b, equal = [], [], True
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            with torch.no_grad():
                x = target(**inputs, **cache_kwargs(target, stock), output_hidden_states=True)
            a.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            y = forward(target, cache=ours, output_hidden_states=True, **inputs)
            b.append(time.perf_counter() - t0)
            equal &= torch.equal(x.logits, y.logits) and all(map(torch.equal, x.hidden_states, y.hidden_states))
            crop_to(stock, past_len)
            crop_to(ours, past_len)
        sa, sb = statistics.median(a[1:]) * 1000, statistics.median(b[1:]) * 1000
        print(f"| {n} | {sa:.1f} | {sb:.1f} | {sb / sa:.2f} | {'yes' if equal else 'NO'} |")


def tree_cost(budgets: list[int], prompts: int, new_tokens: int, dtype: str, drafter: str | None,
              builders: list[str]) -> None:
    pair = load_custom_pair(EMBEDDED_TARGET, drafter, dtype) if drafter else load_pair("smollm2-135m", dtype=dtype)
    ids = [encode_chat(pair.tokenizer, p) for p in PROMPTS[:prompts]]
    print("| method | budget | tree build ms/step | mask ms/step | step ms | (tree + mask) share of step | "
          "verify share | draft share |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for method, b in ((m, b) for m in builders for b in budgets):
        records = [run(pair, p, DecodeConfig(method=method, budget=b, max_new_tokens=new_tokens)) for p in ids]
        s = summarize(records)
        steps = [r for run_ in records for r in run_ if r.step]
        tree_ms = statistics.median([r.seconds["tree"] * 1000 for r in steps])
        mask_ms = []
        for r in steps:   # the mask is built inside the verify phase; time it on its own, same inputs
            t0 = time.perf_counter()
            tree_inputs(r.tree, 300, pair.target.dtype, pair.device)
            mask_ms.append((time.perf_counter() - t0) * 1000)
        step_ms = statistics.median([r.total_seconds * 1000 for r in steps])
        share = (tree_ms + statistics.median(mask_ms)) / step_ms
        print(f"| {method} | {b} | {tree_ms:.2f} | {statistics.median(mask_ms):.2f} | {step_ms:.1f} | {share:.1%} | "
              f"{s.phase_shares['verify']:.1%} | {s.phase_shares['draft']:.1%} |")


def tree_layout(nodes: int, repeats: int) -> None:
    """The tree view's tidy layout against NetworkX's layered `bfs_layout` on one deep `nodes`-node DDTree tree:
    time, edge crossings between neighbouring depths, and mean vertical edge length (a share of the height)."""
    rng = np.random.default_rng(0)
    logq = np.tile(-(0.05 + 1.2 * np.log1p(np.arange(nodes))), (15, 1)) + rng.normal(0, 0.2, (15, nodes))
    tokens = np.stack([rng.permutation(nodes + 100)[:nodes] for _ in range(15)])
    tree = build_ddtree(np.sort(logq, axis=1)[:, ::-1].copy(), tokens, nodes, 0)
    g = step_graph(StepRecord(1, tree, [0], 1, [1], "", {}, [1.0]), {})
    layouts = {"tidy (viz.tree_graph)": lambda: tidy_layout(tree.parents, tree.score),
               "networkx bfs_layout": lambda: [p[1] for _, p in sorted(nx.bfs_layout(g, 0).items())]}
    print(f"{len(tree.tokens)} nodes, depth {tree.max_depth}, median of {repeats}\n"
          "| layout | ms | edge crossings | mean edge drop / height |\n|---|---:|---:|---:|")
    for name, layout in layouts.items():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            y = layout()
            times.append(1000 * (time.perf_counter() - t0))
        by_depth: dict[int, list] = {}          # depth -> (parent y, child y) of the edges ending there
        for i, p in enumerate(tree.parents[1:], 1):
            by_depth.setdefault(tree.depths[i], []).append((y[p], y[i]))
        edges = [edge for es in by_depth.values() for edge in es]
        crossings = sum(a[0] < b[0] and a[1] > b[1] for es in by_depth.values() for a in es for b in es)
        span = (max(y) - min(y)) or 1.0
        drop = statistics.mean(abs(c - p) / span for p, c in edges)
        print(f"| {name} | {statistics.median(times):.2f} | {crossings} | {drop:.3f} |")


@torch.inference_mode()
def logit_drift(dtype: str, new_tokens: int, width: int) -> None:
    """How far forward width moves the target's logits: each reply position's top-2 logits from the one-token
    forward plain decoding runs, against the same positions inside one `width`-token forward on the same cache
    (a verification's width). A greedy flip needs a top-1/top-2 gap below this movement (`core.divergence`)."""
    pair = load_pair("smollm2-135m", dtype=dtype, with_drafter=False)
    moves, gaps = [], []
    for text in PROMPTS:
        ids = encode_chat(pair.tokenizer, text)
        reply = output_ids(run(pair, ids, DecodeConfig(method="ar", max_new_tokens=new_tokens)))
        seq = torch.tensor([ids + reply])
        for start in range(len(ids), len(ids) + len(reply) - width, width):
            cache = new_cache(pair.target)
            forward(pair.target, seq[:, :start], cache)
            wide = forward(pair.target, seq[:, start: start + width], cache).logits[0].float()    # [W, V]
            crop_to(cache, start)
            for k in range(width):
                one = forward(pair.target, seq[:, start + k: start + k + 1], cache).logits[0, -1].float()
                top = one.topk(2).indices
                gaps.append(float(one[top[0]] - one[top[1]]))
                moves.append(float(((one - wide[k])[top]).abs().max()))
    q = np.quantile(moves, [0.5, 0.99, 1.0])
    print(f"| dtype | positions | logit movement of the top-2, median / 99th pct / max | positions with a gap below "
          f"the max movement |\n|---|---:|---:|---:|\n| {dtype} | {len(moves)} | {q[0]:.4f} / {q[1]:.4f} / "
          f"{q[2]:.4f} | {sum(g < q[2] for g in gaps)} |")


def first_token(methods: list[str], budget: int, repeats: int) -> None:
    """Seconds from Run to the first committed token on screen, as a first visitor sees it: a fresh
    DRAFT_TREE_CACHE holding only the converted weights, the app started, its page in headless Chromium at
    1280x720 (Debian's chromium, driven by Playwright), the default math example. "default" keeps the app's
    method; another name is chosen in the dropdown with the budget set."""
    # playwright is a dev requirement that only this measurement needs, so it is imported here
    from playwright.sync_api import sync_playwright

    weights = embedded_target_dir()
    print("| setting | app up after (s) | first token after Run (s) |\n|---|---:|---:|")
    for method in methods:
        for _ in range(repeats):
            cache = Path(tempfile.mkdtemp(prefix="fresh-cache-"))
            shutil.copytree(weights, cache / weights.name)
            env = dict(os.environ, DRAFT_TREE_CACHE=str(cache), GRADIO_SERVER_PORT="7871")
            t0 = time.perf_counter()
            app = subprocess.Popen([sys.executable, "app.py"], env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
            try:
                while True:
                    try:
                        urllib.request.urlopen("http://127.0.0.1:7871/health", timeout=1)
                        break
                    except OSError:
                        time.sleep(0.5)
                up = time.perf_counter() - t0
                with sync_playwright() as p:
                    browser = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True,
                                                args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                                                      "--disable-background-networking", "--disable-sync"])
                    page = browser.new_page(viewport={"width": 1280, "height": 720})
                    page.goto("http://127.0.0.1:7871/")
                    if method != "default":
                        page.locator("#method input").click()
                        page.get_by_role("option", name=method, exact=True).click()
                        page.locator("#budget input[type=number]").fill(str(budget))
                        page.locator("#budget input[type=number]").press("Enter")
                    t1 = time.perf_counter()
                    page.locator("#run").click()
                    page.wait_for_selector("#out .tok", timeout=120_000)
                    first = time.perf_counter() - t1
                    browser.close()
                print(f"| {method} | {up:.1f} | {first:.1f} |", flush=True)
            finally:
                app.terminate()
                app.wait()
                shutil.rmtree(cache, ignore_errors=True)


def record_bytes(record) -> int:
    """Approximate memory a StepRecord holds: its lists (pointers + Python numbers) and numpy arrays."""
    def deep(x):
        if isinstance(x, np.ndarray):
            return x.nbytes
        if isinstance(x, (list, tuple)):
            return sys.getsizeof(x) + sum(sys.getsizeof(v) for v in x)
        if isinstance(x, dict):
            return sys.getsizeof(x) + sum(sys.getsizeof(v) for v in x.values())
        return sys.getsizeof(x)

    tree = record.tree
    return sum(deep(getattr(tree, f)) for f in ("tokens", "parents", "depths", "ranks", "logq", "prefix_logq",
                                                "score")) + sum(deep(v) for v in vars(record).values()
                                                                if v is not tree)


def memory(budget: int, new_tokens: int, repeats: int, dtype: str) -> None:
    """Resident memory while one long generation runs (no stop token, so it lasts `new_tokens`), against the bytes
    its records hold; then after each of `repeats` further runs whose records are dropped."""
    class NoStop(ModelPair):
        stop_ids = property(lambda self: [])

    loaded = load_pair("smollm2-135m", dtype=dtype)
    pair = NoStop(**{f.name: getattr(loaded, f.name) for f in fields(ModelPair)})
    proc = psutil.Process()
    ids = encode_chat(pair.tokenizer, PROMPTS[0])
    cfg = DecodeConfig(method="ddtree", budget=budget, max_new_tokens=new_tokens)
    records, rows = [], []
    gc.collect()
    for record in generate(pair, ids, cfg):
        records.append(record)
        if record.step in (50, 100) or record.step % 200 == 0 or record.finish:
            kept = sum(record_bytes(r) for r in records)
            rows.append((record.step, sum(len(r.committed) for r in records), proc.memory_info().rss, kept))
    print("| step | tokens | RSS MiB | records MiB | RSS growth since step 50 − records growth, MiB |")
    print("|---:|---:|---:|---:|---:|")
    base = next(r for r in rows if r[0] >= 50)
    for step, tokens, rss, kept in rows:
        print(f"| {step} | {tokens} | {rss / 2**20:.0f} | {kept / 2**20:.1f} | "
              f"{((rss - base[2]) - (kept - base[3])) / 2**20:.1f} |")
    del records
    gc.collect()
    after = []
    for _ in range(repeats):
        list(generate(pair, ids, DecodeConfig(method="ddtree", budget=budget, max_new_tokens=256)))
        gc.collect()
        after.append(proc.memory_info().rss / 2**20)
    print(f"\nRSS after each of {repeats} further 256-token runs (records dropped), MiB: "
          + ", ".join(f"{x:.0f}" for x in after))


def train_step(dtype: str, prompts: int, repeats: int, anchors: int, tokens_per_anchor: int, depth: int) -> None:
    """Seconds of loss + backward per training sequence of the shipped drafter on the shipped replies: stage 12's
    recipe (the target's forward every step, a packed mask over all blocks, the softmax over all V, every depth)
    and each change of the cheap step added one after another, alternating on the same sequences and blocks."""
    target, tok = load_target("embedded:smollm2-135m-instruct", dtype=dtype)
    drafter = load_drafter("assets/drafters/smollm2-135m-dflash-b16", target, dtype="fp32").requires_grad_(True)
    seqs = load_sequences("assets/training_data", tokenizer=tok)
    rng = np.random.default_rng(0)
    picked = [seqs[i] for i in rng.choice(len(seqs), prompts, replace=False)]
    autocast = dtype == "bf16"
    variants = ["stage 12's recipe", "+ draft-vocabulary readout", "+ per-block attention",
                "+ cached target features and greedy labels", f"+ loss on depths 1-{depth} only"]
    times = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as folder:
        cache = FeatureCache(folder, target, drafter.target_layer_ids, autocast)
        for seq in picked:
            cache.get(seq)                                   # filled once, as a first epoch does
        for rep in range(repeats + 1):
            for seq in picked:
                batch = make_blocks(seq, drafter.block_size, drafter.mask_token_id, anchors, 5.0, rng,
                                    tokens_per_anchor)
                readout = readout_ids(drafter, seq.ids[: seq.prompt_len])
                for i, name in enumerate(variants):
                    t0 = time.perf_counter()
                    features, greedy = cache.get(seq) if i >= 3 else (None, None)
                    weighted_loss(drafter, target, batch, autocast, readout=readout if i >= 1 else None,
                                  features=features, greedy=greedy, depth=depth if i >= 4 else None,
                                  packed=i < 2)[0].backward()
                    if rep:   # the first round warms up
                        times[name].append(time.perf_counter() - t0)
                    drafter.zero_grad(set_to_none=True)
    base = times[variants[0]]
    print(f"{prompts} sequences (median {int(np.median([len(s.ids) for s in picked]))} tokens, up to {anchors} "
          f"anchors, one per {tokens_per_anchor} reply tokens), {repeats} repeats, {torch.get_num_threads()} threads\n"
          "| training step | s/sequence (median) | speed-up over stage 12 (median of pairs) | sequence passes per "
          "CPU-hour |\n|---|---|---|---|")
    for name in variants:
        speedup = statistics.median(b / t for b, t in zip(base, times[name]))
        print(f"| {name} | {statistics.median(times[name]):.2f} | {speedup:.2f}x | "
              f"{3600 / statistics.median(times[name]) / torch.get_num_threads():.0f} |")


def main(argv=None) -> None:
    default_offline()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["ar-vs-generate", "verify-latency", "forward-ab", "tree-cost", "first-token",
                                     "logit-drift", "memory", "train-step", "tree-layout"])
    ap.add_argument("--methods", default="default",
                    help="first-token: the app's method labels, separated by '|' ('default' keeps the app's)")
    ap.add_argument("--dtype", default="auto",
                    help=f"auto, bf16, fp32 or fp16 (verify-latency: a comma-separated list); {DTYPE_HELP}")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--past-len", type=int, default=200, help="verify-latency, forward-ab: cached context length")
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64,128,256,512",
                    help="verify-latency, forward-ab: tree tokens N")
    ap.add_argument("--budgets", default="64,256", help="tree-cost: tree budgets")
    ap.add_argument("--builders", default="ddtree", help="tree-cost: comma-separated tree methods (ddtree, hybrid …)")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--drafter", default=None, help="tree-cost: drafter folder or 'random' (default: the shipped one)")
    ap.add_argument("--anchors", type=int, default=96, help="train-step: max anchors a sequence")
    ap.add_argument("--tokens-per-anchor", type=int, default=4, help="train-step: one anchor per this many tokens")
    ap.add_argument("--loss-depth", type=int, default=8, help="train-step: the depth cap of the last variant")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    requested = [DTYPE_ALIASES.get(d, d) for d in args.dtype.split(",")]
    if any(d not in DTYPES for d in requested) or (len(requested) > 1 and args.what != "verify-latency"):
        ap.error(f"--dtype takes one of {', '.join(DTYPES)} (verify-latency: several, comma-separated); "
                 f"got {args.dtype!r}")
    dtypes = [announce_dtype(d)[0].name for d in requested]      # "auto" named as what it chose
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, dtype {','.join(dtypes)}")
    if args.what == "ar-vs-generate":
        ar_vs_generate(dtypes[0], args.new_tokens, args.repeats)
    elif args.what == "verify-latency":
        verify_latency([int(x) for x in args.sizes.split(",")], args.past_len, args.repeats, dtypes)
    elif args.what == "forward-ab":
        forward_ab([int(x) for x in args.sizes.split(",")], args.past_len, args.repeats, dtypes[0])
    elif args.what == "memory":
        memory(int(args.budgets.split(",")[0]), args.new_tokens, args.repeats, dtypes[0])
    elif args.what == "train-step":
        train_step(dtypes[0], args.prompts, args.repeats, args.anchors, args.tokens_per_anchor, args.loss_depth)
    elif args.what == "tree-layout":
        tree_layout(int(args.budgets.split(",")[-1]), args.repeats)
    elif args.what == "first-token":
        first_token(args.methods.split("|"), int(args.budgets.split(",")[0]), args.repeats)
    elif args.what == "logit-drift":
        logit_drift(dtypes[0], args.new_tokens, int(args.sizes.split(",")[0]))
    else:
        tree_cost([int(x) for x in args.budgets.split(",")], args.prompts, args.new_tokens, dtypes[0], args.drafter,
                  args.builders.split(","))


if __name__ == "__main__":
    main()
