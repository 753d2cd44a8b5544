"""The app's words: what a step did, the run's numbers with their definitions, and what a budget costs on this
machine. Pure functions of records and numbers (no torch, no Gradio), so tests can read exactly what a user reads.
"""
from __future__ import annotations

import html
import statistics

from core.adaptive import interpolate_cost
from core.divergence import NEAR_TIE
from core.records import PHASES
from core.tree import RETRIEVED, accepted_by
from viz import theme

METHOD_WORDS = {"chain": "the argmax chain", "ddtree": "the most probable prefixes (DDTree's heap)",
                "presto": "the best prefixes by PRESTO's score", "presto-beam": "PRESTO's beam",
                "ddtree-auto": "the most probable prefixes, as many as pay (auto budget)",
                "presto-auto": "the best PRESTO prefixes, as many as pay (auto budget)",
                "hybrid": "the most probable prefixes of the drafter's and retrieval's proposals together",
                "hybrid-auto": "the most probable drafter and retrieved prefixes, as many as pay (auto budget)"}


def _piece(texts: dict[int, str], token: int) -> str:
    return html.escape(theme.show_whitespace(texts.get(token, "?")))


def step_caption(record, texts: dict[int, str], block_size: int | None, prompt_tokens: int | None = None,
                 method: str = "ddtree") -> str:
    """One line under the tree: what this step did, with its real numbers."""
    if record.step == 0:
        size = f" ({prompt_tokens} tokens)" if prompt_tokens else ""
        return (f"**Step 0 is the prefill**: the target read the prompt{size} "
                f"in one forward and chose the first token itself (<code>{_piece(texts, record.bonus)}</code>). "
                "Nothing is drafted yet; drafting starts at step 1.")
    t = record.tree
    if record.draft_tokens is None and method.endswith("-auto"):
        return (f"**Step {record.step}**: no draft: lately a plain step (one target forward, no drafter forward) "
                f"has committed tokens faster than a drafted one, so the auto budget decodes plainly and probes "
                f"again after a while (<code>{_piece(texts, record.bonus)}</code>).")
    if record.draft_tokens is None or t.size == 0:
        return (f"**Step {record.step}**: plain decoding, one target forward for one token "
                f"(<code>{_piece(texts, record.bonus)}</code>).")
    drafted = record.draft_tokens.shape[0]
    block = f" (block size {block_size}: the bonus token plus {block_size - 1} masked positions)" if block_size else ""
    acc = "".join(_piece(texts, t.tokens[i]) for i in record.accepted[1:])
    return (f"**Step {record.step}**: the drafter drafted a {drafted}-position block{block} in one forward → the "
            f"builder kept **{t.size} nodes** reaching depth {t.max_depth} → one target forward verified "
            f"{t.size + 1} tokens → it accepted **{record.accepted_drafts}** "
            f"draft{'s' if record.accepted_drafts != 1 else ''}{f' (<code>{acc}</code>)' if acc else ''} and added "
            f"the bonus <code>{_piece(texts, record.bonus)}</code>: τ = {record.tau}.{_sources(t, record)}")


def _sources(tree, record) -> str:
    """Hybrid trees: how many nodes retrieval added and where the accepted drafts came from."""
    if tree.origin is None:
        return ""
    found = sum(1 for o in tree.origin if o & RETRIEVED)
    return (f" Retrieval found {found} of the {tree.size} nodes; the accepted drafts came "
            f"{proposer_words(accepted_by(tree, record.accepted))}.")


def proposer_words(counts: tuple[int, int, int]) -> str:
    drafter, retrieval, both = counts
    return f"{drafter} from the drafter, {retrieval} from retrieval, {both} from both"


def step_explanation(record, texts: dict[int, str], method: str, block_size: int | None) -> str:
    """The long form for 'How it works': the same numbers tied to the definitions."""
    if record is None:
        return ""
    if record.step == 0 or record.tree.size == 0:
        return "### This step\n" + step_caption(record, texts, block_size)
    t = record.tree
    kept = METHOD_WORDS.get(method, "its tree")
    return (f"### This step ({record.step})\n"
            f"The drafter drafted {record.draft_tokens.shape[0]} positions in one forward"
            + (f" (its block size is {block_size}: the bonus token, whose q is not needed, plus {block_size - 1} "
               "masks)" if block_size else "")
            + f". The builder kept {kept}: **{t.size} nodes** reaching depth {t.max_depth}, whose prefix "
              f"probabilities sum to **{t.expected_accepted:.2f}**, the expected number of accepted drafts "
              f"(Proposition 1). One target forward verified all {t.size + 1} tokens (the root is the last bonus) "
              f"with the ancestor-only mask; the walk accepted **{record.accepted_drafts}** drafts and the target "
              f"added the bonus token <code>{_piece(texts, record.bonus)}</code>: τ = {record.tau} for this step.")


def representative_step(records) -> tuple[int, str]:
    """The index of a step that shows what the run typically did, and the rule that chose it.

    The last step is often cut short by the length limit (a flat fan, or an empty tree), so the choice is the
    latest drafting step, not the last, whose τ is nearest the run's median τ."""
    drafting = [i for i, r in enumerate(records) if r.step > 0 and r.tree.size > 0]
    full = [i for i in drafting if i != len(records) - 1] or drafting
    if not full:
        return len(records) - 1, "the last step"
    median = statistics.median(records[i].tau for i in full)
    best = min(full, key=lambda i: (abs(records[i].tau - median), -i))
    # an auto budget's plain steps (τ = 1) are not in the median: say so, or it contradicts the run's mean τ
    plain = any(r.step > 0 and r.tree.size == 0 for r in records[:-1])
    whose = "the drafting steps'" if plain else "the run's"
    return best, f"a typical step: τ nearest {whose} median τ ({median:g}); the last is step {records[-1].step}"


def metrics(summary, ar_tps: float | None, status: str = "done",
            sources: tuple[int, int, int] | None = None) -> str:
    """The numbers that matter, with their definitions; status: running | stepping | stopped | done (stepping:
    Step's presses, which never measure plain decoding); sources: a hybrid run's accepted drafts by proposer
    (drafter, retrieval, both)."""
    s = summary
    if not s.steps:
        return ("Step 0 was the prefill: the numbers (τ, tokens/s, the speed-up against plain decoding) count the "
                "decoding steps, from step 1 on.")
    if ar_tps:
        speed = f"{s.tokens_per_second / ar_tps:.2f}×"
    else:
        speed = {"running": "measuring…", "stepping": "– (Run measures it)",
                 "stopped": "– (stopped)"}.get(status, "–")
    shares = " / ".join(f"{s.phase_shares[p]:.0%}" for p in PHASES)
    oracle = f"; oracle (perfect ranking, top-K) = {s.oracle_tau:.2f}" if s.oracle_tau else ""
    return "\n".join([
        f"| τ | tokens/s | speed-up vs plain | target forwards saved | {' / '.join(PHASES)} |",
        "|---:|---:|---:|---:|---|",
        f"| **{s.tau:.2f}** | {s.tokens_per_second:.1f} | {speed} | {max(0, s.tokens - 1 - s.steps)} of "
        f"{s.tokens - 1} | {shares} |",
        "",
        f"τ = tokens committed per target forward (bonus counted) = {s.tokens - 1} / {s.steps}; expected from the "
        f"trees 1 + Σ q(u) = {s.expected_tau:.2f}{oracle}. tokens/s = decode tokens / decode time (prefill "
        "excluded), from the engine's timers. Speed-up = this run's tokens/s ÷ plain decoding's on the same prompt, "
        "measured in this app run. Forwards saved = tokens that needed no target forward of their own."
        + (f" Accepted drafts by proposer: {proposer_words(sources)}." if sources else ""),
    ])


def verify_ratio(curve: dict[int, float], n: int) -> float:
    """Cost of verifying n tokens in one forward, in one-token forwards (the adaptive budget's interpolation)."""
    return float(interpolate_cost(curve, [n])[0]) / curve[min(curve)]


def budget_note(method: str, budget: int, block_size: int | None, curve: dict[int, float] | None,
                machine: str) -> str:
    """One line under the budget: whether a tree of this size can pay on this machine, with the curve's number."""
    if method == "ar":
        return "Plain decoding: one target forward per token, the baseline every speed-up is measured against."
    if curve is None:
        return "Measuring what verification costs on this machine… (the auto budget starts from an estimate)."
    if method.endswith("-auto"):
        return (f"The auto budget keeps, each step, the b ≤ {budget} nodes that maximise expected tokens per second "
                f"here: in {machine}, verifying 17 tokens costs {verify_ratio(curve, 17):.1f} and 65 tokens "
                f"{verify_ratio(curve, 65):.1f} one-token forwards.")
    n = (block_size or 16) if method == "chain" else budget + 1
    ratio = verify_ratio(curve, n)
    if ratio < 1.5:
        return f"In {machine}, verifying {n} tokens costs {ratio:.1f} one-token forwards: cheap."
    return (f"⚠ In {machine}, verifying {n} tokens costs {ratio:.1f} one-token forwards, so this tree pays only if "
            f"τ exceeds {ratio:.1f} (plus the draft's cost). The auto budget picks the size that pays here.")


def divergence_note(div, label: str, texts: dict[int, str], dtype: str) -> str:
    """Where a greedy run first left plain decoding, and why: a near-tie flipped by rounding, or a bug."""
    if div is None:
        return ""
    a, b = f"<code>{_piece(texts, div.plain)}</code>", f"<code>{_piece(texts, div.chosen)}</code>"
    where = (f"**{label}** first differs at token {div.position} (step {div.step}): plain decoding chose {a} "
             f"(logit gap {div.plain_gap:.3f} over its runner-up), {label} chose {b} (gap {div.gap:.3f}).")
    if div.near_tie:
        fix = ("With fp32 the outputs are identical (`--dtype fp32`; `auto` picks it on CPUs without native bf16)."
               if dtype != "fp32" else "")
        tied = "two best tokens" if div.swapped else "best tokens (more than two, tied within rounding)"
        return (f"{where} The target's {tied} there were a near-tie, broken differently by {dtype} rounding "
                f"in the wider verification forward: not a fault of the method. {fix}").strip()
    return (f"{where} ⚠ That is not a near-tie (gaps summing to more than the {NEAR_TIE} logits rounding can move): "
            "it would be a bug. Please report it with this prompt and these settings.")
