"""The shipped drafter and n-gram table: z-lab format, sizes, they load here and in the official implementation,
and the drafter fits the embedded target."""
import json

import pytest
import torch

from core.config import MODEL_PAIRS
from core.dflash import extract_features
from core.models import REPO_ROOT, load_drafter, load_target

DRAFTER = REPO_ROOT / MODEL_PAIRS["smollm2-135m"].drafter
NGRAM = REPO_ROOT / MODEL_PAIRS["smollm2-135m"].ngram_table


def test_drafter_files_are_zlab_format_and_small():
    config = json.loads((DRAFTER / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert set(config["dflash_config"]) >= {"mask_token_id", "target_layer_ids"}
    assert (DRAFTER / "model.safetensors").stat().st_size <= 40 * 2**20
    assert (DRAFTER / "README.md").is_file()
    from safetensors import safe_open

    with safe_open(str(DRAFTER / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in names)
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"} <= names
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in names)


@pytest.fixture(scope="module")
def target():
    return load_target(dtype="fp32", device="cpu")


def test_shipped_drafter_matches_official_implementation(target):
    dflash_model = pytest.importorskip("dflash.model")
    model, tok = target
    ours = load_drafter(DRAFTER, model, dtype=torch.float32)
    official = dflash_model.DFlashDraftModel.from_pretrained(str(DRAFTER), dtype=torch.float32).eval()
    ids = torch.tensor([tok("The capital of France is Paris, and the capital of Italy is")["input_ids"]])
    feats = extract_features(model(input_ids=ids, output_hidden_states=True).hidden_states, ours.target_layer_ids)
    block = torch.tensor([[tok.convert_tokens_to_ids("ĠRome")] + [ours.mask_token_id] * (ours.block_size - 1)])
    noise = model.get_input_embeddings()(block)
    pos = torch.arange(ids.shape[1] + ours.block_size)[None]
    with torch.no_grad():
        mine = ours.logits(ours(feats, noise, pos)[:, 1:], model.get_output_embeddings())
        ref = official.compute_logits(official(position_ids=pos, noise_embedding=noise, target_hidden=feats)[:, 1:],
                                      model.get_output_embeddings())
    assert (mine - ref).abs().max() <= 1e-4


def test_ngram_table_loads_and_is_small():
    from core.ngram import NgramTable

    assert NGRAM.stat().st_size <= 20 * 2**20
    table = NgramTable.load(NGRAM)
    assert table.order >= 3 and table.vocab == 49152 and len(table.rows[3]) > 1000


def test_shipped_drafter_chain_tau_on_two_fixed_prompts():
    """The first two prompts of the benchmark's GSM8K-test set (never trained on), fp32, greedy: a random drafter
    gets τ ≈ 1.0. Chain and DDTree with this drafter emit plain decoding's tokens exactly."""
    from core.config import DecodeConfig
    from core.eval.datasets import load_prompts
    from core.engine import output_ids, run
    from core.models import encode_chat, load_pair

    pair = load_pair("smollm2-135m", dtype="fp32", device="cpu")
    taus = []
    for text in load_prompts("gsm8k", 2):
        prompt = encode_chat(pair.tokenizer, text)
        records = run(pair, prompt, DecodeConfig(method="chain", max_new_tokens=128))
        taus.append(sum(r.tau for r in records[1:]) / (len(records) - 1))
        plain = output_ids(run(pair, prompt, DecodeConfig(method="ar", max_new_tokens=128)))
        tree = output_ids(run(pair, prompt, DecodeConfig(method="ddtree", budget=64, max_new_tokens=128)))
        assert output_ids(records) == plain == tree
    assert sum(taus) / 2 >= 2.0, f"chain τ per prompt {taus}"
