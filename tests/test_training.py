"""Drafter training on a tiny random target: the block masks, the loss falls, checkpoints round-trip, and the
training prompts never include an evaluation prompt."""
import re
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from core.config import DecodeConfig
from core.dflash import DFlashDrafter, drafter_config_for, init_weights
from core.training.data import Sequence, make_blocks
from core.training.train import load_checkpoint, lr_at, save_checkpoint, soft_labels, weighted_loss
from tests.conftest import tiny_target


@pytest.fixture
def patched_target(monkeypatch):
    """The real tokenizer with a tiny random target behind it, served by `core.models.load_target` so that
    `core.training.train.main` runs end to end in seconds."""
    import core.training.train
    from core.models import load_tokenizer

    tok = load_tokenizer()
    target = tiny_target(vocab=len(tok))
    monkeypatch.setattr(core.training.train, "load_target", lambda *a, **k: (target, tok))
    return target, tok


def test_blocks_see_context_before_their_anchor_and_their_own_block_only():
    seq = Sequence("x", np.arange(2, 42), prompt_len=10)
    b = make_blocks(seq, block_size=4, mask_token_id=1, max_anchors=5, gamma=4.0, rng=np.random.default_rng(0))
    n, t = len(b.anchors), 40
    assert n == 30 // 8 and (b.anchors >= 10).all()       # one anchor per 8 reply tokens, at most 5
    mask = b.mask[0, 0]
    for i, a in enumerate(b.anchors.tolist()):
        rows = mask[i * 4: (i + 1) * 4]
        assert rows[:, :t].sum(1).eq(a).all() and rows[:, :a].all()              # context strictly before a
        own = torch.zeros(n * 4, dtype=torch.bool)
        own[i * 4: (i + 1) * 4] = True
        assert (rows[:, t:] == own).all()                                         # own block, bidirectional
        assert b.block_ids[i * 4] == seq.ids[a] and (b.block_ids[i * 4 + 1: (i + 1) * 4] == 1).all()
        labels = b.labels[i].tolist()
        assert labels == [int(seq.ids[a + k]) if a + k < t else -100 for k in range(1, 4)]
        assert b.positions[t + i * 4: t + (i + 1) * 4].tolist() == [a, a + 1, a + 2, a + 3]
    assert torch.allclose(b.weights, torch.exp(-torch.arange(3.0) / 4.0))


@pytest.mark.parametrize("arch, packed", [("llama", False), ("qwen3", False), ("qwen3", True)])
def test_each_training_block_predicts_what_the_loop_drafts_from_that_anchor(arch, packed):
    """Training and inference see the same thing: block i's logits in the trainer's forward (per-block attention,
    or all blocks packed under one mask) equal the loop's draft from anchor a_i (context features before a_i, fed
    chunk by chunk into the drafter's cache as the loop does, bonus token x_a at position a). The context mask,
    positions and embeddings all enter this."""
    from core.dflash import DraftKV, extract_features
    from core.drafter import draft_block
    from core.training.train import block_logits
    from tests.conftest import tiny_pair

    pair = tiny_pair(arch, vocab=96, block_size=8)
    drafter, target = pair.drafter, pair.target
    ids = np.random.default_rng(1).integers(2, 90, 40)
    batch = make_blocks(Sequence("x", ids, prompt_len=6), 8, 95, 6, 4.0, np.random.default_rng(0), 1)
    logits, _ = block_logits(drafter, target, batch, autocast=False, packed=packed)      # [N, 7, V]
    with torch.no_grad():
        states = target(torch.as_tensor(ids)[None], output_hidden_states=True).hidden_states
    features = extract_features(states, drafter.target_layer_ids)[0]                   # [T, n_taps*H]
    kv, fed = DraftKV(len(drafter.layers)), 0
    for i, a in enumerate(batch.anchors.tolist()):
        draft = draft_block(drafter, target, features[fed:a], int(ids[a]), a, kv, 7, 96)
        fed = a
        logq = torch.empty(7, 96)
        logq.scatter_(1, torch.as_tensor(draft.tokens), torch.as_tensor(draft.logq))
        assert torch.allclose(logq, torch.log_softmax(logits[i].float(), -1), atol=1e-4), (i, a)


def test_cached_features_and_greedy_choices_are_the_targets_own_and_are_read_back(tmp_path):
    """The feature cache stores one target forward per sequence: what it returns (first computed, then read from
    disk) is the target's tapped features (fp16-close) and its argmax at every position; another sequence, target
    precision or tap set is another entry."""
    from core.dflash import extract_features
    from core.training.features import FeatureCache

    target = tiny_target(vocab=64)
    seq = Sequence("c", np.random.default_rng(0).integers(2, 60, 30), prompt_len=5)
    with torch.no_grad():
        out = target(torch.as_tensor(seq.ids)[None], output_hidden_states=True)
    want = extract_features(out.hidden_states, [0, 1])[0]
    cache = FeatureCache(tmp_path, target, [0, 1], autocast=False)
    for _ in range(2):
        features, greedy = cache.get(seq)
        assert torch.allclose(features, want, rtol=1e-3, atol=1e-3)
        assert torch.equal(greedy, out.logits[0].argmax(-1))
    assert (cache.misses, cache.hits) == (1, 1)
    cache.get(Sequence("c", seq.ids[:-1], prompt_len=5))
    FeatureCache(tmp_path, target, [1], autocast=False).get(seq)
    assert cache.misses == 2 and len(list(tmp_path.glob("*.feat.npy"))) == 3
    assert not list(tmp_path.glob(".*tmp"))


def test_greedy_labels_and_loss_depth_pick_the_targets_choices_on_the_first_positions():
    """`greedy` replaces each label x_{a+k} by the target's choice after x_{<a+k} (greedy[a+k-1]); `depth` keeps
    only the first drafted positions, whose loss is the full loss's terms there, reweighted."""
    import torch.nn.functional as F

    from core.training.train import block_logits

    target = tiny_target(vocab=64)
    drafter = tiny_drafter(target)
    seq = Sequence("d", np.random.default_rng(2).integers(2, 60, 40), prompt_len=6)
    batch = make_blocks(seq, 4, 63, 16, 4.0, np.random.default_rng(0), tokens_per_anchor=2)
    greedy = torch.as_tensor(np.random.default_rng(3).integers(2, 60, 40))
    logits, _ = block_logits(drafter, target, batch, autocast=False)                      # [N, 3, V]
    labels = torch.where(batch.labels >= 0, greedy[(batch.anchors[:, None] + torch.arange(3)).clamp(max=39)], -100)
    assert (labels != batch.labels).any()
    for depth in (3, 2, 1):
        loss, correct, count = weighted_loss(drafter, target, batch, autocast=False, greedy=greedy, depth=depth)
        ce = F.cross_entropy(logits[:, :depth].reshape(-1, 64), labels[:, :depth].reshape(-1), reduction="none")
        w = (batch.weights[:depth][None] * (labels[:, :depth] >= 0)).reshape(-1)
        assert torch.allclose(loss, (ce * w).sum() / w.sum(), atol=1e-6)
        assert count.tolist() == (labels[:, :depth] >= 0).sum(0).tolist()


def test_anchor_density_follows_tokens_per_anchor_up_to_the_cap():
    seq = Sequence("x", np.arange(2, 142), prompt_len=10)                     # 129 anchor candidates
    n = [len(make_blocks(seq, 4, 1, cap, 4.0, np.random.default_rng(0), per).anchors)
         for per, cap in [(8, 48), (4, 48), (2, 48)]]
    assert n == [129 // 8, 129 // 4, 48]


def tiny_drafter(target):
    d = DFlashDrafter.from_config_dict(drafter_config_for(target.config, n_layers=1, n_taps=2, block_size=4))
    init_weights(d, seed=0)
    return d


@pytest.mark.parametrize("distill, readout", [(0.0, None), (0.5, None), (0.0, range(3, 30)), (0.5, range(3, 30))])
def test_loss_falls_and_checkpoint_round_trips(tmp_path, distill, readout):
    target = tiny_target(vocab=64)
    drafter = tiny_drafter(target)
    rng = np.random.default_rng(0)
    seqs = [Sequence(str(i), np.tile(np.arange(5, 17), 4) + i % 3, prompt_len=6) for i in range(4)]
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    losses = []
    for step in range(80):
        opt.zero_grad()
        batch = make_blocks(seqs[step % 4], 4, 63, 8, 4.0, rng)
        rows = None if readout is None else torch.tensor(list(readout))
        loss, correct, count = weighted_loss(drafter, target, batch, autocast=False, distill=distill, readout=rows)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    save_checkpoint(tmp_path, drafter, opt, {"step": 30, "epoch": 1})
    other = tiny_drafter(target)
    opt2 = torch.optim.AdamW(other.parameters(), lr=3e-3)
    state = load_checkpoint(tmp_path, other, opt2)
    assert state["step"] == 30
    assert all(torch.equal(a, b) for a, b in zip(drafter.state_dict().values(), other.state_dict().values()))
    p0, q0 = opt.param_groups[0]["params"][0], opt2.param_groups[0]["params"][0]
    assert torch.equal(opt.state[p0]["exp_avg"], opt2.state[q0]["exp_avg"])
    assert not list(tmp_path.glob(".*tmp"))                                    # nothing half-written left


def test_draft_readout_loss_is_cross_entropy_over_the_readout_columns():
    """--draft-readout: q normalised over the readout ids (as when drafting), labels outside them left out; over the
    whole vocabulary it is the plain loss."""
    import torch.nn.functional as F

    from core.drafter import readout_ids

    target = tiny_target(vocab=64)
    drafter = tiny_drafter(target)
    drafter.set_draft_vocab(list(range(20, 40)))
    seq = Sequence("r", np.concatenate([[5, 6, 7], np.arange(18, 58)]), prompt_len=3)
    ids = readout_ids(drafter, seq.ids[: seq.prompt_len])
    assert ids.tolist() == [5, 6, 7] + list(range(20, 40))              # the prompt's tokens join the readout
    batch = make_blocks(seq, 4, 63, 16, 4.0, np.random.default_rng(0), tokens_per_anchor=2)
    loss, correct, count = weighted_loss(drafter, target, batch, autocast=False, readout=ids)
    full, _, full_count = weighted_loss(drafter, target, batch, autocast=False)
    assert torch.allclose(weighted_loss(drafter, target, batch, autocast=False, readout=torch.arange(64))[0], full)
    with torch.no_grad():                                                 # by hand: the block states, the columns
        feats = extract(target, batch.ids, drafter)
        noise = F.embedding(batch.block_ids[None], target.get_input_embeddings().weight)
        hidden = drafter(feats, noise, batch.positions[None], attention_mask=batch.mask)
        hidden = hidden.view(*batch.labels.shape[:1], 4, -1)[:, 1:]
        log_q = F.log_softmax(drafter.logits(hidden, target.get_output_embeddings())[..., ids], -1)
    inside = torch.isin(batch.labels, ids)
    assert 0 < inside.sum() < (batch.labels >= 0).sum()                  # some labels fall outside the readout
    column = {int(t): i for i, t in enumerate(ids)}
    ce = torch.stack([-log_q[n, k, column[int(batch.labels[n, k])]] for n, k in inside.nonzero().tolist()])
    w = batch.weights[None].expand_as(batch.labels)[inside]
    assert torch.allclose(loss, (ce * w).sum() / w.sum(), atol=1e-5)
    assert torch.equal(count, inside.sum(0)) and (count <= full_count).all()


def extract(target, ids, drafter):
    from core.dflash import extract_features

    out = target(input_ids=ids[None], output_hidden_states=True)
    return extract_features(out.hidden_states, drafter.target_layer_ids)


def test_soft_labels_are_the_targets_prediction_of_each_block_label():
    """On a greedy reply of the target itself, the soft label's argmax at block position k is the label x_{a+k}."""
    target = tiny_target(vocab=64)
    ids = torch.tensor([[5, 9, 12, 7]])
    with torch.no_grad():
        for _ in range(30):
            ids = torch.cat([ids, target(input_ids=ids).logits[:, -1:].argmax(-1)], 1)
        logits = target(input_ids=ids).logits[0]                                         # [T, V]
    seq = Sequence("g", ids[0].numpy(), prompt_len=4)
    batch = make_blocks(seq, 6, 63, 8, 4.0, np.random.default_rng(1))
    log_p = soft_labels(logits, batch.anchors, 5)                                       # [N, 5, V]
    valid = batch.labels >= 0
    assert valid.sum() >= 10
    assert torch.equal(log_p.argmax(-1)[valid], batch.labels[valid])
    assert torch.allclose(log_p.exp().sum(-1), torch.ones(log_p.shape[:2]))


def test_distill_share_outside_zero_to_one_is_refused(capsys):
    from core.training.train import main

    with pytest.raises(SystemExit):
        main(["--distill", "1.5"])
    assert "--distill is the KL share of the loss, between 0 and 1 (got 1.5)" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--anchors", "--tokens-per-anchor"])
def test_anchor_counts_below_one_are_refused(flag, capsys):
    from core.training.train import main

    with pytest.raises(SystemExit):
        main([flag, "0"])
    assert f"{flag} must be at least 1 (got 0)" in capsys.readouterr().err


def test_deepened_drafter_predicts_as_before_and_trains_its_new_layers():
    """--deepen: appended layers start as the identity (same block states to the bit), yet receive gradient."""
    from core.dflash import deepen

    target = tiny_target(vocab=64)
    drafter = tiny_drafter(target)
    drafter.set_draft_vocab([3, 5, 8])
    grown = deepen(drafter, 3)
    assert len(grown.layers) == 3 and grown.config_dict()["num_hidden_layers"] == 3
    assert grown.draft_vocab.tolist() == [3, 5, 8]
    batch = make_blocks(Sequence("s", np.tile(np.arange(5, 17), 3), prompt_len=6), 4, 63, 8, 4.0,
                        np.random.default_rng(0))
    loss, _, _ = weighted_loss(grown, target, batch, autocast=False)
    before, _, _ = weighted_loss(drafter, target, batch, autocast=False)
    assert torch.equal(loss, before)
    loss.backward()
    assert grown.layers[2].self_attn.o_proj.weight.grad.abs().sum() > 0
    assert grown.layers[2].mlp.down_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="cannot deepen a 3-layer drafter to 2"):
        deepen(grown, 2)


def test_deepen_below_the_init_drafters_layers_is_refused(tmp_path, patched_target, capsys):
    from core.dflash import random_drafter_for
    from core.training.train import main

    target, _ = patched_target
    random_drafter_for(target, n_layers=2, n_taps=2, block_size=4, mask_token_id=16).save(tmp_path / "init")
    with pytest.raises(SystemExit, match="--deepen 1: cannot deepen a 2-layer drafter to 1 layers; give at least"):
        main(["--init", str(tmp_path / "init"), "--deepen", "1", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit):
        main(["--init", str(tmp_path / "init"), "--deepen", "-1"])
    assert "--deepen is the drafter's new layer count (got -1)" in capsys.readouterr().err


def test_lr_schedule_warms_up_then_decays():
    lrs = [lr_at(s, 100, 1.0, 0.1) for s in range(100)]
    assert lrs[0] < lrs[9] == pytest.approx(1.0) and lrs[-1] < 0.01 and all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_training_prompts_exclude_evaluation_prompts():
    from core.eval.datasets import compmath, gsm8k_test, humaneval, mtbench_questions, science
    from core.training.prompts import training_prompts

    train = {p.text.strip() for p in training_prompts()}
    train_raw = {t.split("\nPlease reason step by step")[0].strip() for t in train}
    evals = [q.split("\nPlease reason step by step")[0].strip() for q in gsm8k_test() + compmath()]
    evals += [p.strip() for p in humaneval() + science()] + [t.strip() for turns in mtbench_questions() for t in turns]
    assert len(evals) > 1319 + 164 + 32 + 32
    assert not (set(evals) & (train | train_raw))
    assert len(train) > 8000


def test_shipped_replies_answer_training_prompts_only():
    from pathlib import Path

    from core.training.prompts import is_held_out, prompt_key, training_prompts

    prompts = training_prompts()
    allowed = {p.key for p in prompts if not is_held_out(p.key)}
    archives = sorted((Path(__file__).parents[1] / "assets" / "training_data").glob("replies-*.npz"))
    keys = [k for f in archives for k in np.load(f)["keys"].tolist()]
    assert archives and len(keys) == len(set(keys))   # each prompt answered once a round
    assert {prompt_key(k) for k in keys} <= allowed  # training prompts only, no evaluation or held-out one
    first_sources = ("gsm8k_train", "alpaca", "self_instruct", "code:")
    assert {k for k in allowed if k.startswith(first_sources)} <= set(keys)   # the first sources all answered


def test_api_and_template_prompts_are_stable_and_varied():
    """The prompts made from documented functions and templates are the same on every call and in every process
    (keys rebuild them: no default prints an address), unique, and cover several modules and forms."""
    from core.training.prompts import API_FORMS, api_prompts, math_prompts, science_prompts

    api = api_prompts()
    assert [(p.key, p.text) for p in api] == [(p.key, p.text) for p in api_prompts()]
    assert len({p.key for p in api}) == len(api) > 500
    assert len({p.key.split(":")[1].rsplit(".", 1)[0] for p in api}) > 30
    for form in API_FORMS:
        assert any(p.text.startswith(form.split("{")[0]) for p in api)
    assert "`bit_length(value, /)`" in next(p.text for p in api if p.key == "api:int.bit_length")
    assert not [p.key for p in api if " at 0x" in p.text or sys.executable in p.text]
    assert "get_paths(scheme=get_default_scheme()," in next(p.text for p in api if p.key == "api:sysconfig.get_paths")
    assert "charjunk=IS_CHARACTER_JUNK)" in next(p.text for p in api if p.key == "api:difflib.ndiff")
    assert len(science_prompts()) > 300 and len(math_prompts()) > 150


def _by_source(prompts) -> dict:
    """Prompts grouped by their source: {source: {key: text}}."""
    from core.training.prompts import prompt_source

    by_source = {}
    for p in prompts:
        by_source.setdefault(prompt_source(p.key), {})[p.key] = p.text
    return by_source


def test_training_splits_written_by_people_make_benchmark_format_prompts_and_no_evaluation_one():
    from core.eval.datasets import MATH_SUFFIX, evaluation_texts
    from core.training.prompts import asset_prompts

    prompts = asset_prompts()
    assert [(p.key, p.text) for p in prompts] == [(p.key, p.text) for p in asset_prompts()]
    by_source = _by_source(prompts)                                            # source -> {key: text}
    assert sorted(by_source) == ["arc_train", "chat_rl_prompts", "dolly_no_context", "dolly_open_qa", "exercism",
                                 "gpteacher_code", "gpteacher_roleplay", "math_train", "mbpp_train", "nl2bash",
                                 "oasst1_en", "openstax_algebra", "openstax_anatomy_physiology",
                                 "openstax_astronomy", "openstax_biology", "openstax_chemistry",
                                 "openstax_microbiology", "openstax_physics", "openstax_prealgebra",
                                 "openstax_statistics", "openstax_university_physics", "pubmedqa", "qasc_train",
                                 "tal_scq5k_train"]
    math, mbpp, arc = [*by_source["math_train"].values()], by_source["mbpp_train"], by_source["arc_train"]
    dolly, chat = by_source["dolly_open_qa"], by_source["dolly_no_context"]
    qasc, oasst = by_source["qasc_train"], by_source["oasst1_en"]
    assert len(math) == 7499 and all(t.endswith(MATH_SUFFIX) for t in math)
    assert len(mbpp) == 374 and mbpp["mbpp_train:0"].startswith(
        "Write a function to find the longest chain which can be formed from the given set of pairs. Your code should "
        "pass these tests:\n\nassert max_chain_length(")
    assert not {t.split(MATH_SUFFIX)[0].strip() for t in math} & evaluation_texts()
    assert not {t.strip() for t in mbpp.values()} & evaluation_texts()
    assert len(arc) == 3370 and arc["arc_train:0"] == (
        "George wants to warm his hands quickly by rubbing them. Which skin surface will produce the most heat?\n\n"
        "A. dry palms\nB. wet palms\nC. palms covered with oil\nD. palms covered with lotion\n\n"
        "Which choice is correct, and why?")
    assert sum(t.endswith("then give the correct answer.") for t in arc.values()) > 1000   # the requests vary
    assert len(dolly) == len(set(dolly.values())) == 3705
    assert dolly["dolly_open_qa:0"] == "Why can camels survive for long without water?"
    assert len(chat) == len(set(chat.values())) == 6664 and not set(chat.values()) & set(dolly.values())
    assert len(qasc) == 6551 and qasc["qasc_train:1"].startswith("Where do beads of water come from?")
    assert not any("___" in t for t in qasc.values())                        # the fill-in hints are gone
    assert sum(t.endswith("Explain your answer.") for t in qasc.values()) > 1500   # the requests vary
    assert len(oasst) == len(set(oasst.values())) == 4058
    assert oasst["oasst1_en:0"] == "Could you please translate this sentence from English to Spanish?"
    assert not set(oasst.values()) & {*arc.values(), *dolly.values(), *chat.values(), *qasc.values()}
    code, roleplay, pubmed = by_source["gpteacher_code"], by_source["gpteacher_roleplay"], by_source["pubmedqa"]
    assert len(code) == len(set(code.values())) == 4535 and code["gpteacher_code:0"] == (
        "Write a C++ program that calculates the area of a rectangle, given its width and height."
        "\n\nwidth: 5, height: 8")
    assert len(roleplay) == len(set(roleplay.values())) == 1923 and roleplay["gpteacher_roleplay:0"].startswith(
        "Imagine you are a detective trying to solve a murder mystery in a fictional Victorian-era town.")
    assert len(pubmed) == 500 and pubmed["pubmedqa:0"] == (
        "Can tailored interventions increase mammography use among HMO women? What does the evidence say?")
    assert sum(t.endswith("then explain why.") for t in pubmed.values()) > 100           # the requests vary
    books = {s: by_source[f"openstax_{s}"] for s in ("physics", "chemistry", "university_physics", "astronomy",
                                                    "microbiology", "anatomy_physiology", "algebra", "prealgebra",
                                                    "statistics", "biology")}                   # file order
    assert [len(b) for b in books.values()] == [952, 1437, 3753, 856, 1071, 1160, 7487, 4000, 1614, 1419]
    exercises = [t for b in books.values() for t in b.values()]
    assert len(set(exercises)) == len(exercises) and min(map(len, exercises)) >= 25
    assert books["physics"]["openstax_physics:0"] == (                 # lettered choices, one a line
        "What characteristics of the solar system would have to be known or calculated in order to send a probe to a "
        "distant planet, such as Jupiter?\n(a) the effects due to the light from the distant stars\n(b) the effects "
        "due to the air in the solar system\n(c) the effects due to the gravity from the other planets\n(d) the "
        "effects due to the cosmic microwave background radiation")
    assert "(a) pascal, or N/m^3\n" in books["physics"]["openstax_physics:430"]      # powers as ^
    assert books["algebra"]["openstax_algebra:2"] == (                 # the math books' MathML as LaTeX
        "Write each of the following rational numbers as either a terminating or repeating decimal.\n"
        "(a) $-\\frac{5}{7}$\n(b) $\\frac{15}{5}$\n(c) $\\frac{13}{25}$")
    math_books = [t for s in ("algebra", "prealgebra", "statistics") for t in books[s].values()]
    assert sum("$" in t for t in math_books) > 10000
    unescaped = lambda c, t: len(re.findall(r"(?<!\\)" + re.escape(c), t))        # noqa: E731; not \$ or \{
    assert all(unescaped("$", t) % 2 == 0 and unescaped("{", t) == unescaped("}", t) for t in math_books)
    assert not any(re.search(r"^\([a-z]\)\s*$", t, re.M) for t in exercises)     # no empty lettered item
    turns = by_source["chat_rl_prompts"]
    assert len(turns) == len(set(turns.values())) == 5121 and turns["chat_rl_prompts:0"] == (
        "Why do they sell hotdog wieners in packs of 10 and the buns in packs of 8?")
    assert not any("<extra_id_1>" in t for t in turns.values())              # HelpSteer2's later turns cut off
    assert not set(turns.values()) & {*oasst.values(), *dolly.values(), *chat.values()}
    markup = r"\bfigures?\b|\btable\b|</?(para|emphasis|link|sup|sub|item|list|m:\w+)\b|\x97"
    assert not any(re.search(markup, t) for t in exercises)                 # text-only, markup gone
    assert not {t.strip() for t in [*arc.values(), *dolly.values(), *chat.values(), *qasc.values(),
                                    *oasst.values(), *code.values(), *roleplay.values(), *pubmed.values(), *exercises,
                                    *turns.values()]
                } & evaluation_texts()


def test_competition_programming_and_shell_sets_make_clean_prompts():
    """TAL-SCQ5K's problems print as ARC's (choices one a line) with the math suffix or another request; Exercism's
    exercises come in five languages; NL2Bash's descriptions end a sentence before their request; none is an
    evaluation prompt, and no LaTeX-display or link markup is left."""
    from core.eval.datasets import MATH_SUFFIX, evaluation_texts
    from core.training.prompts import asset_prompts

    by_source = _by_source(asset_prompts())                                   # source -> {key: text}
    tal, ex, sh = by_source["tal_scq5k_train"], by_source["exercism"], by_source["nl2bash"]
    assert len(tal) == len(set(tal.values())) == 2762 and tal["tal_scq5k_train:0"] == (
        "If a four-digit number $5A2A$ can be divisible by $20$, the digit that $A$ represents is .\n\n"
        "A. $0$\nB. $1$\nC. $2$\nD. $5$\nE. $8$")
    assert 800 < sum(t.endswith(MATH_SUFFIX.strip()) for t in tal.values()) < 1000   # the requests vary
    assert all("\nA. " in t and "$$" not in t and "\\uline" not in t and "\u3000" not in t for t in tal.values())
    assert len(ex) == len(set(ex.values())) == 137 * 5 and ex["exercism:0"].startswith(
        "Convert a phrase to its acronym.\n\nTechies love their TLA (Three Letter Acronyms)!")
    assert [ex[f"exercism:{i}"].rsplit("\n", 1)[1] for i in range(5)] == [
        f"Write a solution in {lang}." for lang in ("Python", "JavaScript", "Java", "C++", "Rust")]
    assert not any(re.search(r"\]\(https?:|^\[[^\]]+\]: |~~~~|^# ", t, re.M) for t in ex.values())
    assert len(sh) == len(set(sh.values())) == 3000 and sh["nl2bash:1"] == (
        "(GNU specific) Display info on most CPU-intensive processes once and exit. Give a shell command that does "
        "this, and explain it briefly.")
    assert all(re.search(r"[.?!]$", t) for t in sh.values())
    assert not {t.strip() for t in [*tal.values(), *ex.values(), *sh.values()]} & evaluation_texts()


def _write_shard(tok, folder, prompts, reply):
    """One `generate_data` shard in `folder`: each prompt chat-templated, followed by `reply(i)`."""
    from core.models import encode_chat
    from core.training.generate_data import write_shard

    rows = []
    for i, p in enumerate(prompts):
        ids = encode_chat(tok, p.text)
        rows.append({"key": p.key, "ids": ids + reply(i), "prompt_len": len(ids), "sampled": False})
    write_shard(folder, 0, rows, len(tok))


def test_replies_archive_round_trips_without_prompt_text(tmp_path):
    from core.models import load_tokenizer
    from core.training.data import export_replies, load_sequences
    from core.training.generate_data import done_keys
    from core.training.prompts import training_prompts

    tok = load_tokenizer()
    prompts = training_prompts()[:3]
    shards, archive = tmp_path / "shards", tmp_path / "archive"
    shards.mkdir(), archive.mkdir()
    _write_shard(tok, shards, prompts, lambda i: [100 + i, 200 + i, 2])
    assert export_replies(shards, archive / "replies-x.npz") == 3
    data = np.load(archive / "replies-x.npz")
    assert data["ids"].tolist() == [100, 200, 2, 101, 201, 2, 102, 202, 2]      # replies only
    rebuilt = {s.key: s for s in load_sequences(archive, min_reply=1, tokenizer=tok)}
    for s in load_sequences(shards, min_reply=1):
        assert np.array_equal(rebuilt[s.key].ids, s.ids) and rebuilt[s.key].prompt_len == s.prompt_len
    assert done_keys(archive) == {p.key for p in prompts}                       # generation resumes past them


def test_a_later_round_answers_every_training_prompt_again():
    from core.training.generate_data import pending_prompts
    from core.training.prompts import is_held_out, prompt_key, prompt_source, round_key, training_prompts

    train = [p.key for p in training_prompts() if not is_held_out(p.key)]
    assert round_key(train[0], 1) == train[0] and prompt_key(round_key(train[0], 2)) == train[0]
    assert all(is_held_out(round_key(p.key, 3)) == is_held_out(p.key) for p in training_prompts()[:200])
    assert [p.key for p in pending_prompts(set())] == train
    assert pending_prompts(set(train)) == []                                    # round 1 done
    assert [p.key for p in pending_prompts(set(train), round_=2)] == train       # round 2 starts over
    done = set(train) | {round_key(k, 2) for k in train[:3]}
    assert [p.key for p in pending_prompts(done, round_=2, limit=5)] == train[3:5]   # 5 in round 2 in all
    broad = [k for k in train if prompt_source(k) != "gsm8k_train"]
    assert 0 < len(broad) < len(train)
    assert [p.key for p in pending_prompts(done, round_=2, skip=("gsm8k_train",))] == \
        [k for k in broad if k not in train[:3]]                                 # a round of the broader prompts


def test_skipping_an_unknown_prompt_source_is_refused_by_name(tmp_path, monkeypatch, capsys):
    import sys

    from core.training import generate_data

    monkeypatch.setattr(sys, "argv", ["generate_data", "--out", str(tmp_path), "--skip-sources", "gsm8k"])
    with pytest.raises(SystemExit):
        generate_data.main()
    err = capsys.readouterr().err
    assert "no prompt source ['gsm8k']" in err and "gsm8k_train" in err and not list(tmp_path.iterdir())


def test_replies_of_two_rounds_rebuild_the_same_prompt_and_both_train(tmp_path):
    from core.models import load_tokenizer
    from core.training.data import export_replies, load_sequences
    from core.training.generate_data import done_keys
    from core.training.prompts import Prompt, round_key, training_prompts

    tok = load_tokenizer()
    prompts = training_prompts()[:2]
    again = [Prompt(round_key(p.key, 2), p.text) for p in prompts]
    shards, archive = tmp_path / "shards", tmp_path / "archive"
    shards.mkdir(), archive.mkdir()
    _write_shard(tok, shards, prompts + again, lambda i: [100 + i, 200 + i, 2])
    assert export_replies(shards, archive / "replies-x.npz") == 4
    seqs = {s.key: s for s in load_sequences(archive, min_reply=1, tokenizer=tok)}
    assert set(seqs) == {p.key for p in prompts + again}
    for p, q in zip(prompts, again):
        first, second = seqs[p.key], seqs[q.key]
        assert first.prompt_len == second.prompt_len
        assert np.array_equal(first.ids[: first.prompt_len], second.ids[: second.prompt_len])
        assert not np.array_equal(first.ids[first.prompt_len:], second.ids[second.prompt_len:])
    assert done_keys(archive) == set(seqs)


def test_export_after_resuming_keeps_the_archived_replies(tmp_path, capsys):
    """The documented resume (archive copied into the data folder, more shards generated, exported again) keeps
    every reply: the archive's and the new shards'."""
    from core.models import load_tokenizer
    from core.training.data import export_replies, load_replies
    from core.training.prompts import training_prompts

    tok = load_tokenizer()
    prompts = training_prompts()[:4]
    first, data = tmp_path / "first", tmp_path / "data"
    first.mkdir(), data.mkdir()
    _write_shard(tok, first, prompts[:2], lambda i: [100 + i, 2])
    export_replies(first, data / "replies-shipped.npz")
    _write_shard(tok, data, prompts[2:], lambda i: [300 + i, 2])     # generation resumed after the archive
    assert export_replies(data, tmp_path / "all.npz") == 4
    d = np.load(tmp_path / "all.npz")
    assert sorted(d["keys"].tolist()) == sorted(p.key for p in prompts)
    assert sorted(d["ids"].tolist()) == sorted([100, 2, 101, 2, 300, 2, 301, 2])
    assert {k: r.tolist() for k, r in load_replies(data).items()} == {
        prompts[0].key: [100, 2], prompts[1].key: [101, 2], prompts[2].key: [300, 2], prompts[3].key: [301, 2]}

    from core.training.build_ngram import main as build_ngram
    build_ngram(["--data", str(data), "--out", str(tmp_path / "t.npz")])   # counts the archive's too
    assert capsys.readouterr().out.startswith("8 tokens from 4 replies")


@pytest.mark.parametrize("deepen", [0, 2])
def test_training_continues_from_a_trained_drafter(tmp_path, patched_target, deepen):
    """--init: the drafter's own config and draft vocabulary, its held-out tau measured first, exports only above it;
    --deepen adds layers to it; --export-final exports the last step regardless."""
    import json

    from core.dflash import random_drafter_for
    from core.training.prompts import is_held_out, training_prompts
    from core.training.train import main

    target, tok = patched_target
    init = random_drafter_for(target, seed=3, n_layers=1, n_taps=2, block_size=4, mask_token_id=16)
    init.set_draft_vocab(list(range(2, 600)))
    init.save(tmp_path / "init")
    rng = np.random.default_rng(0)
    (tmp_path / "data").mkdir()
    _write_shard(tok, tmp_path / "data", [p for p in training_prompts() if not is_held_out(p.key)][:3],
                 lambda i: rng.integers(3, 600, 40).tolist() + [2])
    main(["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--export", str(tmp_path / "export"),
          "--init", str(tmp_path / "init"), "--steps", "2", "--accum", "1", "--eval-every", "0",
          "--eval-prompts", "1", "--eval-tokens", "4", "--no-bf16", "--deepen", str(deepen),
          "--export-final", str(tmp_path / "final")] + ["--draft-readout"] * bool(deepen))
    state = json.loads((tmp_path / "out" / "state.json").read_text())
    assert state["step"] == 2 and state["draft_vocab"] == list(range(2, 600))
    final = json.loads((tmp_path / "final" / "training_state.json").read_text())    # whatever its tau
    assert final["step"] == 2 and final["tau_heldout"] == state["history"][-1]["tau"]
    assert json.loads((tmp_path / "final" / "config.json").read_text())["num_hidden_layers"] == (deepen or 1)
    start = state["history"][0]
    assert start["step"] == 0 and start["init"] == str(tmp_path / "init")
    from safetensors.torch import load_file

    ckpt = load_file(str(tmp_path / "out" / "ckpt.safetensors"))
    assert {k.split(".")[2] for k in ckpt if k.startswith("model.layers.")} == {str(i) for i in range(deepen or 1)}
    trained = {k[6:]: v for k, v in ckpt.items() if k.startswith("model.")}
    assert any(not torch.equal(trained[k], v) for k, v in init.state_dict().items() if k in trained)
    if (tmp_path / "export" / "training_state.json").exists():                         # only above the start
        exported = json.loads((tmp_path / "export" / "training_state.json").read_text())
        assert exported["tau_heldout"]["ddtree"] > start["tau"]["ddtree"]


@pytest.mark.parametrize("scale", [0.0, 0.5])
def test_init_lr_scale_slows_or_freezes_the_trained_layers_and_resumes(tmp_path, patched_target, scale):
    """--init-lr-scale: the layers --deepen added train at --lr, the --init drafter's own parameters at that share
    of it (0: frozen, no AdamW state); a run with two lr groups resumes from its checkpoint."""
    from safetensors.torch import load_file

    from core.dflash import random_drafter_for
    from core.training.prompts import is_held_out, training_prompts
    from core.training.train import main

    target, tok = patched_target
    init = random_drafter_for(target, seed=3, n_layers=1, n_taps=2, block_size=4, mask_token_id=16)
    init.save(tmp_path / "init")
    rng = np.random.default_rng(0)
    (tmp_path / "data").mkdir()
    _write_shard(tok, tmp_path / "data", [p for p in training_prompts() if not is_held_out(p.key)][:3],
                 lambda i: rng.integers(3, 600, 40).tolist() + [2])
    args = ["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--init", str(tmp_path / "init"),
            "--deepen", "2", "--init-lr-scale", str(scale), "--accum", "1", "--eval-every", "1000",
            "--eval-prompts", "1", "--eval-tokens", "4", "--no-bf16", "--lr", "1e-2"]
    main(args + ["--steps", "2"])
    first = load_file(str(tmp_path / "out" / "ckpt.safetensors"))
    main(args + ["--steps", "3"])                                       # resumes: the groups' AdamW state loads
    ckpt = load_file(str(tmp_path / "out" / "ckpt.safetensors"))
    from core.models import load_drafter

    old = {k: v for k, v in load_drafter(tmp_path / "init", target, dtype="fp32").named_parameters()}
    moved = {k for k, v in old.items() if not torch.equal(ckpt[f"model.{k}"], v)}
    assert moved == set() if scale == 0 else moved
    new = "model.layers.1.self_attn.o_proj.weight"
    assert not torch.equal(ckpt[new], first[new])
    n_new = sum(1 for k in ckpt if k.startswith("model.layers.1."))
    assert sum(1 for k in ckpt if k.endswith(".exp_avg")) == (n_new if scale == 0 else n_new + len(old))


def test_init_lr_scale_needs_deepen_and_a_share(tmp_path, capsys):
    from core.training.train import main

    with pytest.raises(SystemExit):
        main(["--init", str(tmp_path), "--init-lr-scale", "0.1"])
    assert "--init-lr-scale sets the lr of the layers --deepen did not add" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--init", str(tmp_path), "--deepen", "6", "--init-lr-scale", "2"])
    assert "--init-lr-scale is a share of --lr, between 0 and 1 (got 2.0)" in capsys.readouterr().err


def test_resuming_mid_epoch_trains_on_the_rest_of_that_epoch(tmp_path, patched_target, monkeypatch):
    """An interrupted run resumes where its epoch stopped: every reply once per epoch, none twice, in the same order
    as one uninterrupted run."""
    import json

    import core.training.train as training
    from core.dflash import random_drafter_for
    from core.training.prompts import is_held_out, training_prompts

    target, tok = patched_target
    random_drafter_for(target, seed=3, n_layers=1, n_taps=2, block_size=4, mask_token_id=16).save(tmp_path / "init")
    keys = [p.key for p in training_prompts() if not is_held_out(p.key)][:5]
    (tmp_path / "data").mkdir()
    _write_shard(tok, tmp_path / "data", [p for p in training_prompts() if p.key in keys],
                 lambda i: list(range(40 + i, 60 + i)) + [2])
    seen = []
    make_blocks = training.make_blocks
    monkeypatch.setattr(training, "make_blocks", lambda seq, *a: seen.append(seq.key) or make_blocks(seq, *a))

    def run(out, steps, data="data"):
        training.main(["--data", str(tmp_path / data), "--out", str(tmp_path / out), "--init", str(tmp_path / "init"),
                       "--steps", str(steps), "--accum", "1", "--eval-every", "1000", "--eval-prompts", "1",
                       "--eval-tokens", "2", "--no-bf16"])
        return json.loads((tmp_path / out / "state.json").read_text())

    run("once", 7)
    uninterrupted, seen[:] = list(seen), []
    assert sorted(uninterrupted[:5]) == sorted(keys)                # epoch 0: each reply once
    assert run("cut", 2)["offset"] == 2
    state = run("cut", 7)
    assert seen == uninterrupted                    # steps 3-5 finish epoch 0, steps 6-7 start epoch 1
    assert (state["epoch"], state["offset"]) == (1, 2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="0 usable replies"):
        run("none", 1, data="empty")


def test_a_source_cap_keeps_a_seeded_share_of_one_source_and_the_rest_whole():
    from core.training.data import cap_sources

    seqs = [Sequence(f"gsm8k_train:{i}", np.arange(3), 1) for i in range(10)] + \
        [Sequence(f"code:{i}", np.arange(3), 1) for i in range(4)]
    kept = cap_sources(seqs, {"gsm8k_train": 3}, seed=0)
    assert sum(s.key.startswith("gsm8k") for s in kept) == 3 and sum(s.key.startswith("code") for s in kept) == 4
    assert kept == cap_sources(list(reversed(seqs)), {"gsm8k_train": 3}, seed=0)[::-1]    # by key, not by order
    assert {s.key for s in kept} != {s.key for s in cap_sources(seqs, {"gsm8k_train": 3}, seed=1)}
    assert cap_sources(seqs, {"gsm8k_train": 99, "math": 1}, seed=0) == seqs


def test_a_source_repeat_gives_each_reply_of_one_source_k_passes_an_epoch_and_the_rest_one():
    from core.training.data import repeat_sources

    seqs = [Sequence(f"gsm8k_train:{i}", np.arange(3), 1) for i in range(3)] + \
        [Sequence(f"pubmedqa:{i}", np.arange(3), 1) for i in range(2)]
    repeated = [s.key for s in repeat_sources(seqs, {"pubmedqa": 3, "math": 5})]
    assert repeated == ["gsm8k_train:0", "gsm8k_train:1", "gsm8k_train:2"] + ["pubmedqa:0"] * 3 + ["pubmedqa:1"] * 3
    assert repeat_sources(seqs, {}) == seqs


def test_the_trainer_trains_on_a_capped_source_only_up_to_its_cap(tmp_path, patched_target, monkeypatch, capsys):
    import core.training.train as training
    from core.dflash import random_drafter_for
    from core.training.prompts import is_held_out, training_prompts

    target, tok = patched_target
    random_drafter_for(target, seed=3, n_layers=1, n_taps=2, block_size=4, mask_token_id=16).save(tmp_path / "init")
    prompts = [p for p in training_prompts() if not is_held_out(p.key) and p.key.startswith("gsm8k_train:")][:5]
    (tmp_path / "data").mkdir()
    _write_shard(tok, tmp_path / "data", prompts, lambda i: list(range(40 + i, 60 + i)) + [2])
    seen = []
    make_blocks = training.make_blocks
    monkeypatch.setattr(training, "make_blocks", lambda seq, *a: seen.append(seq.key) or make_blocks(seq, *a))
    args = ["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--init", str(tmp_path / "init"),
            "--steps", "6", "--accum", "1", "--eval-every", "1000", "--eval-prompts", "1", "--eval-tokens", "2",
            "--no-bf16"]
    training.main(args + ["--source-cap", "gsm8k_train=2"])
    assert len(seen) == 6 and len(set(seen)) == 2                   # three epochs of the two replies kept
    assert "gsm8k_train: at most 2 replies (--source-cap)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        training.main(args + ["--source-cap", "gsm8k_train"])
    assert "--source-cap takes SOURCE=N" in capsys.readouterr().err
    seen.clear()
    training.main([*args, "--out", str(tmp_path / "out2"), "--source-cap", "gsm8k_train=2",
                   "--source-repeat", "gsm8k_train=3"])
    assert sorted(Counter(seen).values()) == [3, 3]                 # one epoch: each of the two replies 3 times
    assert "gsm8k_train: each reply 3 times an epoch (--source-repeat)" in capsys.readouterr().out
    for bad in ("gsm8k_train=x", "gsm8k_train=0"):
        with pytest.raises(SystemExit):
            training.main(args + ["--source-repeat", bad])
        assert "--source-repeat takes" in capsys.readouterr().err


def test_a_drafter_fitted_to_the_targets_replies_drafts_them_in_the_real_loop():
    """What the trainer fits is what the loop accepts: fitted to the target's greedy replies, a drafter that
    accepted about nothing gets nearly whole blocks of them accepted by the real decode loop (τ near B = 8), and the
    output stays the target's."""
    from core.engine import output_ids, run
    from core.eval.judge import reference_reply
    from core.models import ModelPair
    from core.records import summarize
    from core.training.train import evaluate_tau
    from tests.conftest import fitted_drafter, tiny_pair

    pair = tiny_pair(vocab=96, block_size=8)
    prompts = [[3, 4, 5, 6], [9, 8, 7, 6, 5, 11], [20, 5, 6, 7, 40]]
    replies = [reference_reply(pair, p, 40) for p in prompts]
    before = evaluate_tau(pair.drafter, pair.target, pair.tokenizer, prompts, 40)         # random
    fitted = ModelPair("fitted", pair.target, pair.tokenizer, fitted_drafter(pair, prompts, replies), torch.float32,
                       pair.device)
    results = [run(fitted, p, DecodeConfig(method="chain", max_new_tokens=40)) for p in prompts]
    assert [output_ids(r) for r in results] == replies                        # lossless in fp32
    assert before["chain"] < 1.5 and summarize(results).tau > 4.0
