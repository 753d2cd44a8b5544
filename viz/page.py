"""The app page's fixed and derived words: How it works, the layout CSS, the metrics under a run and Compare's
table rows and verdict. Pure functions of records and numbers (no torch, no Gradio); the app's handlers call them.
"""
from __future__ import annotations

from core.records import summarize
from core.tree import accepted_by
from viz import text as words

COMPARE_HEADERS = ["method", "budget", "τ", "tokens/s", "speed-up vs plain", "identical to plain?"]

HOW_IT_WORKS = """
**DFlash** drafts a whole block at once: a small drafter reads the target's hidden states and, in *one*
forward over `[bonus, MASK × L]`, gives a distribution q_i for each of the next L positions. Vanilla DFlash
verifies only the argmax chain.

**DDTree** builds the draft tree that maximises the expected number of accepted drafts under a node budget B.
For a tree T, E[accepted] = Σ_{u∈T} q(u) with q(u) = Π q_i(u_i) (Proposition 1), so the best tree is the top-B
prefixes by q(u): a best-first heap over rank tuples (next sibling, first child) pops them in order. The tree is
verified in one target forward with an ancestor-only attention mask; the target walks it and the longest
matching path is accepted, plus one token of its own (the bonus). Lossless at any temperature.

**PRESTO** ranks paths with a prefix-aligned score S(u) = Σ log q_i(u_i) + λ · log p_ngram(u_i | path so far),
since the drafter's q_i cannot see which token the path chose before position i.

**Hybrid** adds what the drafter cannot propose: continuations copied from the prompt and the reply so far
(the tokens that followed the current suffix before, as prompt lookup does), grafted at the root and below the
drafter's nodes. A retrieved token's probability is its measured acceptance rate for its match length in this run,
so one heap ranks both proposers on one scale; retrieved nodes wear a fuchsia diamond.

**Auto budget** (DDTree / PRESTO, auto budget) removes the budget guesswork: every step it builds the tree at the
slider's budget B and keeps the first b nodes that maximise expected tokens per second,
(1 + α · Σ_{first b} q(u)) / (t_other + t_verify(b + 1)), with the target's verification latency measured once for
this machine (cached) and α, t_other calibrated on the steps already run. B is then the largest budget it may use.
"""


def layout_css(tree_height: int) -> str:
    """The page's own CSS: compact header lines, and a tree pane of fixed height (so the page never jumps)."""
    return f"""
#machine p {{ font-size: 13px; margin: 0; }}
#budget_note p {{ font-size: 12.5px; margin: 0; }}
#caption p {{ font-size: 13.5px; margin: 2px 0; }}
#tree {{ min-height: {tree_height}px; }}
"""


def metrics_md(records, ar_tps: float | None, status: str = "done", difference: str = "") -> str:
    """The run's numbers (τ, tokens/s, speed-up), the accepted drafts by proposer for hybrid trees, and where the
    text first differs from plain decoding's when it does."""
    if not records:
        return ""
    hybrid = any(r.tree.origin is not None for r in records)
    sources = tuple(map(sum, zip(*(accepted_by(r.tree, r.accepted) for r in records)))) if hybrid else None
    return words.metrics(summarize([records]), ar_tps, status, sources) + (f"\n\n{difference}" if difference else "")


def compare_row(label: str, cfg, records, identical: str) -> dict:
    """One method's row in Compare: its budget as set, τ, tokens/s and whether it matched plain decoding."""
    s = summarize([records])
    auto = cfg.method.endswith("-auto")
    budget = "–" if cfg.method in ("ar", "chain") else f"≤ {cfg.budget}" if auto else cfg.budget
    return {"method": label, "budget": budget, "tau": round(s.tau, 2) if s.steps else 1.0,
            "tokens/s": round(s.tokens_per_second, 1), "identical": identical}


def compare_table(rows: list[dict]) -> list[list]:
    """The table under COMPARE_HEADERS; each row's speed-up against the first (plain decoding) is set on it."""
    for row in rows:
        row["speedup"] = round(row["tokens/s"] / (rows[0]["tokens/s"] or 1.0), 2)
    return [[r["method"], r["budget"], r["tau"], r["tokens/s"], f'{r["speedup"]:.2f}×', r["identical"]] for r in rows]


def same(div, temperature: float) -> str:
    """Compare's "identical to plain?" cell for a run's first divergence (None: identical)."""
    if div is None:
        return "yes"
    if temperature > 0:
        return "no (sampled)"
    return f"no: token {div.position}, " + ("near-tie" if div.near_tie else "not a near-tie")


def verdict(rows: list[dict], compared: tuple[str, ...], temperature: float) -> str | None:
    """Compare's verdict so far; None when greedy runs differ from plain decoding and each needs its note."""
    if len(rows) < len(compared):
        return f"{len(rows)} of {len(compared)} methods done; running {compared[len(rows)]}…"
    if all(r["identical"] == "yes" for r in rows):
        return "All outputs are **identical** to plain decoding: every method is lossless."
    if temperature > 0:
        return ("Outputs differ from plain decoding, as expected when sampling: each method draws different random "
                "numbers; the distribution is the same (tested).")
    return None


def differences(notes: list[str]) -> str:
    """The verdict when greedy runs differ: where and why each one does, and how to see it."""
    return "\n\n".join(notes + ["Click a row that differs to see that step, the token outlined in the text."])
