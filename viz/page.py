"""The app page's fixed and derived words: How it works, the layout CSS, the metrics under a run and Compare's
table rows and verdict. Pure functions of records and numbers (no torch, no Gradio); the app's handlers call them.
"""
from __future__ import annotations

from core.records import summarize
from core.tree import accepted_by
from viz import text as words

EXAMPLES = [
    ["Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
     "clips did Natalia sell altogether in April and May?\nPlease reason step by step, and put your final answer "
     "within \\boxed{}."],
    ["Write a Python function that checks whether a string is a palindrome."],
    ["What are some good tips for staying focused while studying?"],
    ["Write a short story about a robot who learns to paint."],
]                         # the app's examples: math, code, chat, story
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


# presenter mode: the class `presenter` on <html> (the toggle, or ?presenter=1) sets large type (body text 20 px and
# more), full-contrast text, the settings folded away, and the text beside the tree. Every rule is `!important`:
# Gradio repeats the page's CSS under its container's classes, which outrank a class on <html>.
_PRESENTER_RULES = {
    ".presenter, .presenter body, .presenter .gradio-container":
        "--body-text-size: 20px; --text-xs: 16px; --text-sm: 18px; --text-md: 20px; --text-lg: 22px; "
        "--text-xl: 24px; --block-label-text-size: 18px; --block-info-text-size: 18px; "
        "--block-title-text-size: 20px; --input-text-size: 20px; --button-large-text-size: 22px; "
        "--button-medium-text-size: 20px; --button-small-text-size: 18px; --section-header-text-size: 20px; "
        "--body-text-color: #000; --body-text-color-subdued: #1e293b",
    ".presenter .dark, .presenter.dark, .presenter .dark .gradio-container":
        "--body-text-color: #fff; --body-text-color-subdued: #e2e8f0",
    ".presenter #settings, .presenter #examples, .presenter #budget_note, .presenter #machine": "display: none",
    ".presenter #title h3": "font-size: 22px",
    ".presenter #budget .head > label": "flex: 1 1 100%",     # the label a row of its own, not five narrow lines
    ".presenter #phase_bar button, .presenter #phase label span": "font-size: 18px",   # the phase bar on one line
    ".presenter #phase label": "padding: 1px 5px",
    ".presenter #caption p, .presenter #metrics p, .presenter #metrics td, .presenter #metrics th": "font-size: 20px",
    ".presenter #views": "display: grid; grid-template-columns: minmax(0, 2fr) minmax(0, 3fr); gap: 12px; "
                         "align-items: start",
    ".presenter #views > *": "grid-column: 1 / -1; min-width: 0",
    ".presenter #views > #out": "grid-column: 1; grid-row: 1",
    ".presenter #views > #tree": "grid-column: 2; grid-row: 1",
    ".presenter .tokens": "font-size: 22px; line-height: 1.6; color: #000",
    ".presenter .dark .tokens, .presenter.dark .tokens": "color: #fff",
    ".presenter .tokens-legend, .presenter .stepmark": "font-size: 18px; color: #1e293b",
    ".presenter .dark .tokens-legend, .presenter .dark .stepmark, .presenter.dark .tokens-legend": "color: #e2e8f0",
    ".presenter .tokens-scroll": "max-height: 480px",
    ".presenter .tok.acc": "background: #16a34a40",
    ".presenter .tok.bonus": "background: #2563eb40",
}
PRESENTER_CSS = "".join(f"{selector} {{ {'; '.join(d.strip() + ' !important' for d in rules.split(';'))}; }}\n"
                        for selector, rules in _PRESENTER_RULES.items())


def layout_css(tree_height: int, presenter_tree_height: int) -> str:
    """The page's own CSS: compact header lines, a tree pane of fixed height (so the page never jumps), no Plotly
    modebar on a phone (it lay under the PNG/SVG buttons; pinch-zoom does its work there) and each figure below those
    buttons there (a title ran under them), and presenter mode's."""
    return f"""
#presenter {{ padding: 0 !important; border: none !important; background: none !important; box-shadow: none; }}
#presenter label {{ padding: 0 !important; justify-content: flex-end; }}
#machine p {{ font-size: 13px; margin: 0; }}
#budget_note p {{ font-size: 12.5px; margin: 0; }}
#caption p {{ font-size: 13.5px; margin: 2px 0; }}
#metrics {{ overflow-x: auto; }}
#metrics th, #metrics td {{ overflow-wrap: normal; word-break: normal; }}
#tree {{ min-height: {tree_height}px; }}
#phase_bar {{ gap: 6px; }}
#phase_bar button {{ padding: 1px 10px; min-height: 0; }}
#phase label {{ padding: 1px 8px; }}
.presenter #tree {{ min-height: {presenter_tree_height}px !important; }}
@media (max-width: 640px) {{
  .js-plotly-plot .modebar-container {{ display: none !important; }}
  .downloadable-figure > .js-plotly-plot {{ margin-top: 34px; }}
}}
""" + PRESENTER_CSS


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
