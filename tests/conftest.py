"""Shared fixtures: tiny random targets (Llama and Qwen3 architectures), drafters for them, and a mock tokenizer.

Everything runs offline on a CPU with no downloaded weights.
"""
from __future__ import annotations

import os
import shutil
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from core.dflash import random_drafter_for
from core.models import ModelPair

torch.set_num_threads(min(2, torch.get_num_threads()))


class IdTokenizer:
    """Decodes ids as space-separated numbers; enough for the engine's records."""

    eos_token_id = 1
    chat_template = None

    def decode(self, ids, **_):
        return "".join(f" {i}" for i in ids)

    def __call__(self, text, **_):
        return {"input_ids": [int(t) for t in text.split()]}


def tiny_target(arch: str = "llama", seed: int = 0, vocab: int = 96, layers: int = 4, std: float = 0.2):
    """A random target whose logits are spread wide enough that greedy choices have no near-ties."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, eos_token_id=1, bos_token_id=0, pad_token_id=0,
                  initializer_range=std)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    return model.float().eval().requires_grad_(False)


def tiny_pair(arch="llama", seed=0, vocab=96, drafter_layers=1, block_size=8, **kw) -> ModelPair:
    target = tiny_target(arch, seed, vocab, **kw)
    drafter = random_drafter_for(target, seed=seed + 1, n_layers=drafter_layers, n_taps=2, block_size=block_size,
                                 mask_token_id=vocab - 1).float().eval().requires_grad_(False)
    return ModelPair(f"tiny-{arch}", target, IdTokenizer(), drafter, torch.float32, torch.device("cpu"))


def fitted_drafter(pair: ModelPair, prompts: list[list[int]], replies: list[list[int]], steps: int = 240):
    """A fresh drafter for `pair.target` fitted with the trainer's loss to these replies (seconds): one that
    drafts them well, where a random drafter drafts nothing."""
    import numpy as np

    from core.training.data import Sequence, make_blocks
    from core.training.train import weighted_loss

    b, mask = pair.drafter.block_size, pair.drafter.mask_token_id
    drafter = random_drafter_for(pair.target, seed=0, n_layers=1, n_taps=2, block_size=b, mask_token_id=mask)
    seqs = [Sequence(str(i), np.asarray(p + r), prompt_len=len(p)) for i, (p, r) in enumerate(zip(prompts, replies))]
    rng, opt = np.random.default_rng(0), torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    for step in range(steps):
        opt.zero_grad()
        batch = make_blocks(seqs[step % len(seqs)], b, mask, 48, 4.0, rng, tokens_per_anchor=1)
        weighted_loss(drafter, pair.target, batch, autocast=False)[0].backward()
        opt.step()
    return drafter.eval().requires_grad_(False)


@pytest.fixture
def pair():
    return tiny_pair()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium for the browser tests. Missing, it fails them with the command that installs it (as
    `.ci/run` does) rather than skipping them unseen; SKIP_BROWSER_TESTS=1 skips them on purpose."""
    if os.environ.get("SKIP_BROWSER_TESTS") == "1":
        pytest.skip("SKIP_BROWSER_TESTS=1")
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("the browser tests need Debian's chromium: `apt-get install -y chromium` "
                    "(or SKIP_BROWSER_TESTS=1 to skip them)", pytrace=False)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("the browser tests need playwright: `.venv/bin/python -m pip install -r requirements-dev.txt` "
                    "(or SKIP_BROWSER_TESTS=1 to skip them)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def url():
    """The app on the embedded default, launched once on a free loopback port for all live tests. The pair is
    loaded in fp32, where tree verification and plain decoding agree to the token (bf16 may flip near-ties)."""
    import app
    from core.models import load_pair
    from studio.state import COSTS

    app.PAIRS["smollm2-135m"] = load_pair("smollm2-135m", dtype="fp32")
    _, local_url, _ = app.launch(server_name="127.0.0.1", server_port=free_port(), quiet=True)
    deadline = time.time() + 300      # the page as a visitor sees it once the background cost curve is measured
    while COSTS.status("smollm2-135m").startswith("measuring") and time.time() < deadline:
        time.sleep(0.5)
    yield local_url
    app.demo.close()
