"""`--dtype auto`: bf16 only where it is computed natively (CUDA, AVX512-BF16, AMX), fp32 where a CPU would emulate
it; flags decide where readable, a probe elsewhere."""
import pytest
import torch

from core import hardware
from core.models import resolve_dtype


@pytest.fixture(autouse=True)
def fresh_cache():
    hardware.auto_dtype.cache_clear()
    yield
    hardware.auto_dtype.cache_clear()


@pytest.mark.parametrize("flags,dtype", [
    ({"avx2", "avx512f", "avx512_bf16"}, torch.bfloat16),           # AMD EPYC Genoa, Intel Cooper Lake
    ({"avx2", "avx512f", "amx_bf16", "amx_tile"}, torch.bfloat16),  # Intel Sapphire Rapids
    ({"avx2", "avx512f"}, torch.float32),                          # AVX-512 without BF16: emulated
    ({"avx2", "fma"}, torch.float32),                              # AVX2 only: emulated
])
def test_cpu_flags_decide(monkeypatch, flags, dtype):
    monkeypatch.setattr(hardware, "cpu_info", lambda: ("Some CPU", frozenset(flags)))
    monkeypatch.setattr(hardware, "probe_bf16_native", lambda: pytest.fail("flags were enough"))
    choice = hardware.auto_dtype("cpu")
    assert choice.dtype == dtype and choice.reason.startswith(choice.name)


@pytest.mark.parametrize("fast", [True, False])
def test_unknown_cpu_is_probed(monkeypatch, fast):
    monkeypatch.setattr(hardware, "cpu_info", lambda: ("arm64", frozenset()))
    monkeypatch.setattr(hardware, "probe_bf16_native", lambda: fast)
    choice = hardware.auto_dtype("cpu")
    assert choice.dtype == (torch.bfloat16 if fast else torch.float32) and "probe" in choice.reason


def test_cuda_keeps_bf16(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_info", lambda: ("Some CPU", frozenset({"avx2"})))
    assert hardware.auto_dtype("cuda").dtype == torch.bfloat16


def test_auto_resolves_to_the_rule_and_the_probe_is_quick():
    assert resolve_dtype("auto", "cpu") == hardware.auto_dtype("cpu").dtype
    assert resolve_dtype("fp32") == torch.float32 and resolve_dtype("bf16") == torch.bfloat16
    with pytest.raises(ValueError, match="auto, bf16, fp32"):
        resolve_dtype("int3")
    assert isinstance(hardware.probe_bf16_native(), bool)


def test_cpu_summary_names_the_flags_that_matter(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_info", lambda: ("AMD EPYC", frozenset({"avx2", "fma"})))
    assert hardware.cpu_summary() == "AMD EPYC (AVX2; no AVX512-BF16, no AMX-BF16)"
    monkeypatch.setattr(hardware, "cpu_info", lambda: ("Xeon", frozenset({"avx2", "avx512f", "amx_bf16"})))
    assert hardware.cpu_summary() == "Xeon (AVX2, AVX-512, AMX-BF16; no AVX512-BF16)"
