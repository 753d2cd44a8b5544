"""The target's verification-cost curve: forward latency against tree size, measured once per model, device, CPU
model and vector features (`core.hardware.isa_tag`) and dtype and cached on disk (JSON, atomic). The app's speed-up
estimate and the adaptive budget read it.

No run waits for it: the app measures it in the background at start, and until a measured curve is cached the
adaptive budget starts from `estimated_curve` and fits the real costs from its own steps."""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from core.builders import build_ddtree
from core.fast_forward import covered, forward
from core.hardware import NATIVE_BF16_FLAGS, cpu_info, describe_dtype, isa_tag
from core.kv_cache import crop_to, new_cache
from core.limits import context_window
from core.models import cache_dir, default_offline, load_pair
from core.tree import DraftTree
from core.verify import tree_inputs

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
QUIET_S = 1.0       # background forwards start only after this long without a run (see BackgroundCurves.idle)
RETAKES = 3         # a timing overlapped by a run is taken again at most this often (runs back to back never starve it)


def cost_key(target) -> str:
    cfg = getattr(target.config, "text_config", target.config)
    name = Path(str(getattr(target.config, "_name_or_path", "") or cfg.model_type)).name
    device = target.device.type
    if device == "cpu":          # CPUs differ between machines that share a cache folder (a Space, a home dir)
        device += "-" + re.sub(r"[^A-Za-z0-9]+", "_", cpu_info()[0]).strip("_")[:48] + "-" + isa_tag()
    return (f"{name}-h{cfg.hidden_size}-l{cfg.num_hidden_layers}-{device}-"
            f"{str(target.dtype).removeprefix('torch.')}{'-fast' if covered(target) else ''}")


def sample_tree(n: int, vocab: int = 40000) -> DraftTree:
    """A best-first tree of n tokens (root included) over random peaked marginals: a stand-in for timing."""
    rng = np.random.default_rng(n)
    logq = np.sort(np.log(rng.dirichlet(np.ones(64) * 0.3, size=15)), axis=-1)[:, ::-1].copy()
    tokens = rng.integers(min(100, vocab - 1), vocab, size=(15, 64))
    return build_ddtree(logq.astype(np.float32), tokens, n - 1, bonus=5)


@torch.inference_mode()
def measure(target, sizes=SIZES, past_len: int = 256, repeats: int = 5, progress=None,
            statistic=statistics.median, idle=None) -> dict[int, float]:
    """ms of one verification forward of N tree tokens (a random best-first tree) on a cached context, the
    `statistic` of `repeats` timings after a warm-up (min resists a CPU shared with other work). The sizes are
    timed in turn, round after round, so a burst of other work spoils one round of every size, not every timing of
    one size (which would bend the curve for good: it is cached).
    `progress(done, total)` is called before each timing and at the end (the app shows it; a caller may pause).
    `idle()` (the app's) waits while a run decodes and returns how many runs have started: a timing that a run
    overlapped is taken again, up to RETAKES times."""
    vocab = target.get_input_embeddings().weight.shape[0]
    sizes = [n for n in sizes if past_len + n <= context_window(target)] or [1]
    cache = new_cache(target)
    forward(target, torch.randint(0, vocab, (1, past_len), device=target.device), cache)
    inputs = {n: tree_inputs(sample_tree(n, vocab), past_len, target.dtype, target.device) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    total = (repeats + 1) * len(sizes)
    for done in range(total):                 # round 0 warms up (first-call kernel selection), then is dropped
        n = sizes[done % len(sizes)]
        if progress is not None:
            progress(done, total)
        for retake in range(RETAKES + 1):
            runs = idle() if idle is not None else 0
            if target.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            forward(target, cache=cache, output_hidden_states=True, **inputs[n])
            if target.device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            crop_to(cache, past_len)
            if idle is None or retake == RETAKES or idle() == runs:       # no run started meanwhile
                break
        times[n].append(seconds)
    if progress is not None:
        progress(total, total)
    return {n: statistic(t[1:]) * 1000 for n, t in times.items()}


def monotone(curve: dict[int, float]) -> dict[int, float]:
    """The least-squares non-decreasing fit of a measured curve (pool adjacent violators). A bigger tree never
    verifies faster; a noisy dip at small sizes would otherwise draw the adaptive budget towards it."""
    blocks: list[list[float]] = []                      # [sum, count] of pooled neighbouring sizes
    for n in sorted(curve):
        blocks.append([curve[n], 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [total / count for total, count in blocks for _ in range(int(count))]
    return dict(zip(sorted(curve), fitted))


def _path(target, folder: Path | None) -> Path:
    return (folder or cache_dir() / "costs") / f"{cost_key(target)}.json"


def cached_curve(target, folder: Path | None = None) -> dict[int, float] | None:
    """The measured curve for this target, device, CPU and dtype, made monotone; None when not measured yet."""
    try:
        data = json.loads(_path(target, folder).read_text())
        if data.get("key") == cost_key(target):
            return monotone({int(k): float(v) for k, v in data["ms"].items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def cost_curve(target, folder: Path | None = None, **measure_kw) -> dict[int, float]:
    """The cached curve, measured (seconds) and cached first when absent."""
    curve = cached_curve(target, folder)
    if curve is not None:
        return curve
    curve = measure(target, **measure_kw)
    path = _path(target, folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": cost_key(target), "ms": curve}))
        os.replace(tmp, path)
    except OSError:
        pass   # an unwritable cache only costs a re-measurement next time
    return monotone(curve)


# Marginal cost of one more tree token, as a share of a one-token forward, by how the device computes the dtype.
# Measured on the embedded 135M target (BENCHMARKS.md, "Verification cost by dtype"): fp32 on AVX2 0.05-0.08,
# emulated bf16 about 0.45, native bf16 (AMX) about 0.01; a GPU forward is flat over the tree sizes that matter.
SLOPE = {"cuda": 0.002, "native-bf16": 0.01, "fp32": 0.08, "emulated-bf16": 0.5}


def estimated_curve(target, one_token_ms: float = 30.0) -> dict[int, float]:
    """A linear stand-in for the curve before it is measured: t(n) = t(1) * (1 + slope * (n - 1)). Only its shape
    matters: the adaptive budget rescales it and then fits the real costs from the steps it runs."""
    slope = SLOPE[cost_class(target)]
    return {n: one_token_ms * (1 + slope * (n - 1)) for n in SIZES}


def cost_class(target) -> str:
    if target.device.type == "cuda":
        return "cuda"
    if target.dtype == torch.float32:
        return "fp32"
    native = any(f in cpu_info()[1] for f in NATIVE_BF16_FLAGS)
    return "native-bf16" if native else "emulated-bf16"


class BackgroundCurves:
    """Each loaded target's curve, measured once in a background thread and cached on disk. The measurement
    pauses before each timing while a run decodes (`decoding()`) and takes again a timing that a run overlapped,
    so a visitor never waits for it and no run's forward enters it. `shutdown` stops it between timings, before
    the interpreter finalises (a daemon thread caught inside a torch operator then would abort the process)."""

    def __init__(self, repeats: int = 3, quiet: float = QUIET_S):
        self.repeats, self.curves, self.progress, self.quiet = repeats, {}, {}, quiet
        self._busy, self._started, self._ended, self._cond = 0, 0, -quiet, threading.Condition()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    def start(self, name: str, target) -> None:
        if name in self.curves or name in self.progress:
            return
        curve = cached_curve(target)
        if curve is not None:
            self.curves[name] = curve
            return
        self.progress[name] = (0, (self.repeats + 1) * len(SIZES))
        thread = threading.Thread(target=self._measure, args=(name, target), daemon=True, name=f"cost-{name}")
        self._threads.append(thread)
        thread.start()

    def _measure(self, name: str, target) -> None:
        def tick(done: int, total: int) -> None:      # `measure` itself waits for `idle` before each timing
            self.progress[name] = (done, total)
            if self._stopping.is_set():
                raise InterruptedError("the process is exiting")

        try:
            self.curves[name] = cost_curve(target, repeats=self.repeats, progress=tick, statistic=min,
                                           idle=self.idle)
        except Exception:  # noqa: BLE001 - a failed measurement leaves the estimate in use, never the app down
            self.progress[name] = (-1, 0)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the measurements at their next timing and wait (up to `timeout` s) for them to end."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def status(self, name: str) -> str:
        if name in self.curves:
            return "measured"
        done, total = self.progress.get(name, (0, 0))
        return "failed" if done < 0 else f"measuring {done} of {total} timings" if total else "not started"

    def idle(self) -> int:
        """Return once no run has decoded for `quiet` seconds (at once when none has, or when the process exits)
        how many runs have started so far; other background work waits here too. The quiet spell keeps a forward
        out of the moment between two runs that follow each other (a visitor's next Run, a script's loop), where
        it would slow the next run's start."""
        with self._cond:
            while not self._stopping.is_set():
                left = self._ended + self.quiet - time.monotonic()
                if self._busy == 0 and left <= 0:
                    break
                self._cond.wait(None if self._busy else left)
            return self._started

    @contextmanager
    def decoding(self):
        with self._cond:
            self._busy += 1
            self._started += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._ended = time.monotonic()
                self._cond.notify_all()


def main(argv=None) -> int:
    """python -m core.costs: measure and cache the curve for a model pair's target (what the app does in the
    background), so that `ddtree-auto` in the CLI starts from it instead of an estimate."""
    ap = argparse.ArgumentParser(prog="python -m core.costs", description=main.__doc__)
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--dtype", default="auto", help="auto (default), bf16, fp32 or fp16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--force", action="store_true", help="measure again even if a curve is cached")
    args = ap.parse_args(argv)
    default_offline()
    pair = load_pair(args.pair, dtype=args.dtype, with_drafter=False)
    print(f"dtype {describe_dtype(pair.dtype, pair.device)}")
    if args.force:
        _path(pair.target, None).unlink(missing_ok=True)
    with tqdm(total=(args.repeats + 1) * len(SIZES), desc="cost curve", unit="forward", dynamic_ncols=True) as bar:
        curve = cost_curve(pair.target, repeats=args.repeats, statistic=min,
                           progress=lambda done, total: bar.update(done - bar.n))
    print(f"{_path(pair.target, None)}\n" + "\n".join(f"{n:>4} tokens: {ms:7.1f} ms = {ms / curve[1]:5.2f} one-token "
                                                       f"forwards" for n, ms in curve.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
