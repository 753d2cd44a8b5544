"""Which dtype this machine computes fastest, and why.

bf16 halves the bytes a forward reads, but a CPU without native bf16 arithmetic (AVX512-BF16 or AMX) emulates it:
there a 16-token verification forward costs about 9 one-token forwards in bf16 against about 2 in fp32, and every
draft tree loses to plain decoding. So `--dtype auto` picks bf16 on CUDA and on CPUs that compute it natively, and
fp32 elsewhere. Flags decide where they are readable (Linux x86); elsewhere a probe of a few milliseconds does.
"""
from __future__ import annotations

import functools
import platform
import re
import time
from dataclasses import dataclass

import torch

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")   # x86 flags with hardware bf16 dot products
FLAG_NAMES = (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX-BF16"))


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str          # one line for the app header, /health and the CLI summary

    @property
    def name(self) -> str:
        return {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}[self.dtype]


@functools.lru_cache(maxsize=1)
def cpu_info() -> tuple[str, frozenset[str]]:
    """(model name, flags) from /proc/cpuinfo; ("", {}) where it cannot be read."""
    try:
        text = open("/proc/cpuinfo", encoding="utf-8", errors="replace").read()
    except OSError:
        return platform.processor() or platform.machine(), frozenset()
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.M)
    return ((model.group(1).strip() if model else platform.machine()),
            frozenset(flags.group(1).split()) if flags else frozenset())


def cpu_summary() -> str:
    """The CPU model and the flags that decide bf16 speed, e.g. 'AMD EPYC (AVX2; no AVX512-BF16, no AMX-BF16)'."""
    model, flags = cpu_info()
    if not flags:
        return model
    have = [name for f, name in FLAG_NAMES if f in flags]
    lacks = [name for f, name in FLAG_NAMES[2:] if f not in flags]
    return f"{model} ({', '.join(have) or 'no AVX2'}" + (f"; no {', no '.join(lacks)}" if lacks else "") + ")"


def isa_tag() -> str:
    """The CPU's widest vector features that change forward costs, for cache keys: one model name ("AMD EPYC")
    covers generations with and without AVX-512 or native bf16, whose cost curves differ several-fold."""
    _, flags = cpu_info()
    return "-".join(short for f, short in (("avx2", "avx2"), ("avx512f", "avx512"), ("avx512_bf16", "avx512bf16"),
                                           ("amx_bf16", "amx")) if f in flags) or "base"


def probe_bf16_native(rows: int = 64, width: int = 576, repeats: int = 5) -> bool:
    """True when a bf16 product of a verification-sized block is no slower than fp32's (a few ms)."""
    a, w = torch.randn(rows, width), torch.randn(4 * width, width)

    def best(dtype) -> float:
        x, y = a.to(dtype), w.to(dtype)
        torch.nn.functional.linear(x, y)                     # warm-up: first-call kernel selection
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.nn.functional.linear(x, y)
            times.append(time.perf_counter() - t0)
        return min(times)

    return best(torch.bfloat16) <= best(torch.float32)


@functools.lru_cache(maxsize=4)
def auto_dtype(device_type: str = "cpu") -> DtypeChoice:
    """bf16 on CUDA and on CPUs with native bf16; fp32 where bf16 would be emulated."""
    if device_type == "cuda":
        return DtypeChoice(torch.bfloat16, "bf16: CUDA computes it natively")
    if device_type != "cpu":
        return DtypeChoice(torch.float32, f"fp32: the safe choice on {device_type}")
    _, flags = cpu_info()
    native = [f for f in NATIVE_BF16_FLAGS if f in flags]
    if native:
        return DtypeChoice(torch.bfloat16, f"bf16: this CPU computes it natively, {', '.join(native)}")
    if "avx2" in flags or "avx512f" in flags:
        return DtypeChoice(torch.float32, "fp32: this CPU has no AVX512-BF16 or AMX, so bf16 would be emulated "
                                          "and a tree forward would cost several times as much")
    if probe_bf16_native():
        return DtypeChoice(torch.bfloat16, "bf16: a probe found bf16 products no slower than fp32 here")
    return DtypeChoice(torch.float32, "fp32: a probe found bf16 products slower than fp32 here")


def dtype_facts(dtype: torch.dtype, device: torch.device) -> tuple[str, str, str]:
    """(dtype name, why it is used, the machine): every speed figure depends on all three."""
    name = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}.get(dtype, str(dtype))
    choice = auto_dtype(device.type)
    why = (choice.reason.split(": ", 1)[1] if choice.dtype == dtype
           else f"set explicitly; auto would pick {choice.name}")
    return name, why, cpu_summary() if device.type == "cpu" else str(device)


def describe_dtype(dtype: torch.dtype, device: torch.device) -> str:
    name, why, where = dtype_facts(dtype, device)
    return f"{name} on {where}: {why}"
