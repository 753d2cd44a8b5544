"""The generated text as HTML: every token coloured by how it was produced, step boundaries marked.

Green = a drafted token the target accepted; blue = the target's own token (the bonus after each accepted path,
and the prefill's first token). Hover shows the step, the depth and the target's probability. Token text is
escaped: it is data, never markup. The dark-theme colours are in theme.DARK_CSS (the legend's class is not
`legend`, which Plotly's own legend uses).
"""
from __future__ import annotations

from viz import theme

LEGEND = ('<div class="tokens-legend"><span class="tok acc">accepted draft</span> '
          '<span class="tok bonus">target (bonus) token</span> <span class="stepmark">│</span> step boundary</div>')

CSS = f"""
.tokens {{ font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 14px; line-height: 1.9;
          white-space: pre-wrap; word-break: break-word; }}
.tok {{ border-radius: 3px; padding: 1px 0; }}
.tok.acc {{ background: {theme.ACCEPTED}22; border-bottom: 2px solid {theme.ACCEPTED}; }}
.tok.bonus {{ background: {theme.BONUS}22; border-bottom: 2px solid {theme.BONUS}; }}
.tok.first {{ box-shadow: -2px 0 0 #64748b; }}
.tokens-legend {{ font-size: 12px; color: #475569; margin-bottom: 6px; }}
.stepmark {{ color: #64748b; font-weight: bold; }}
.tok.diff {{ outline: 2px solid #dc2626; outline-offset: 1px; }}
.tokens-scroll {{ max-height: 130px; overflow-y: auto; display: flex; flex-direction: column-reverse; }}
"""


def token_html(records, texts: dict[int, str] | None = None, highlight: int | None = None) -> str:
    """HTML for all committed tokens of the records (texts: optional per-id strings; default the step's text).
    `highlight`: index of a token to outline (where a run first differs from plain decoding). The text scrolls
    inside a box that stays at its end while it streams (column-reverse anchors the scroll at the bottom)."""
    parts = [LEGEND, '<div class="tokens-scroll"><div class="tokens">']
    position = 0
    for r in records:
        pieces = [texts[t] for t in r.committed] if texts else _split(r)
        for j, (tok, piece) in enumerate(zip(r.committed, pieces)):
            kind = "acc" if j < r.accepted_drafts else "bonus"   # drafts first, then the target's bonus
            first = " first" if j == 0 else ""
            p = r.p_committed[j] if j < len(r.p_committed) else float("nan")
            title = f"step {r.step}, {'accepted draft at depth ' + str(j + 1) if kind == 'acc' else 'target token'}" \
                    f", id {tok}, p = {p:.3f}"
            diff = " diff" if position == highlight else ""
            title += ": the first token that differs from plain decoding" if diff else ""
            parts.append(f'<span class="tok {kind}{first}{diff}" title="{title}">{theme.escape(piece)}</span>')
            position += 1
    parts.append("</div></div>")
    return "".join(parts)


def _split(record) -> list[str]:
    # without per-token strings, show the step's text on its first token (keeps the output exact)
    return [record.text] + [""] * (len(record.committed) - 1)
