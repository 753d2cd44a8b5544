"""Shareable traces: a finished run as one versioned, gzip-compressed JSON file that replays every view without a
model (the settings, the model ids, every token's text and every StepRecord field the views read).

The format is `docs/TRACES.md`; `load` validates a file and raises `TraceError` with a message that says what to do,
never anything else. `python -m studio.trace record --example math --out assets/traces/math.json.gz` records one.
"""
from __future__ import annotations

import argparse
import gzip
import json
import zlib
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from core.config import MODEL_PAIRS, DecodeConfig
from core.engine import generate
from core.models import encode_chat, load_pair
from core.records import StepRecord
from core.tree import DraftTree
from viz.page import EXAMPLES as PROMPTS
from viz.phases import shown_ids

SCHEMA, VERSION = "draft-tree-trace", 1
MAX_BYTES = 20 * 2**20          # a trace file larger than this is refused before it is decompressed
MAX_JSON_BYTES = 200 * 2**20    # and its decompressed JSON
DIGITS = 4                      # decimals kept of every float (log q, seconds, probabilities, logit gaps)
TREE_FIELDS = [f.name for f in fields(DraftTree)]
# StepRecord fields a trace keeps; of `draft_logq` only the top CANDIDATES columns the draft phase shows (all of it
# would triple the size), absent from traces made before the step animation
RECORD_FIELDS = ("step", "accepted", "bonus", "committed", "text", "seconds", "p_committed", "nested", "draft_tokens",
                 "oracle_depth", "budget_used", "finish", "runner_up")
CANDIDATES = 8


class TraceError(ValueError):
    """A file that is not a readable trace of this version; the message says what to do."""


@dataclass
class Trace:
    settings: dict                  # DecodeConfig's fields, plus the prompt
    models: dict                    # pair name, target and drafter ids, dtype, device, drafter block size
    texts: dict[int, str]           # token id -> its text, for every token the records mention
    records: list[StepRecord]
    prompt_tokens: int
    ar_tps: float | None = None     # plain decoding's tokens/s on the same prompt when it was measured
    meta: dict = field(default_factory=dict)


def _round(values) -> list[float]:
    return [round(float(v), DIGITS) for v in values]


def _record_json(r: StepRecord) -> dict:
    tree = {name: getattr(r.tree, name) for name in TREE_FIELDS}
    for name in ("logq", "prefix_logq", "score"):
        tree[name] = _round(tree[name])
    out = {name: getattr(r, name) for name in RECORD_FIELDS} | {"tree": tree}
    out |= {"seconds": {k: round(v, 6) for k, v in r.seconds.items()}, "p_committed": _round(r.p_committed),
            "runner_up": [[int(t), round(float(g), DIGITS)] for t, g in r.runner_up],
            "draft_tokens": None if r.draft_tokens is None else np.asarray(r.draft_tokens).tolist(),
            "draft_logq": None if r.draft_logq is None else
            [_round(row) for row in np.asarray(r.draft_logq)[:, :CANDIDATES]]}
    return out


def dumps(trace: Trace) -> bytes:
    """The trace as gzip-compressed JSON (header first: schema and version)."""
    body = {"schema": SCHEMA, "version": VERSION, "meta": trace.meta, "settings": trace.settings,
            "models": trace.models, "prompt_tokens": trace.prompt_tokens, "ar_tps": trace.ar_tps,
            "texts": {str(k): v for k, v in sorted(trace.texts.items())},
            "records": [_record_json(r) for r in trace.records]}
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return gzip.compress(text.encode("utf-8"), mtime=0)


def _record(d: dict) -> StepRecord:
    tree = DraftTree(**{name: d["tree"].get(name) for name in TREE_FIELDS})
    draft, logq = d.get("draft_tokens"), d.get("draft_logq")
    plain = {name: d[name] for name in RECORD_FIELDS if name not in ("draft_tokens", "runner_up")}
    return StepRecord(tree=tree, **plain, draft_tokens=None if draft is None else np.asarray(draft, dtype=np.int64),
                      draft_logq=None if logq is None else np.asarray(logq, dtype=np.float32).reshape(len(logq), -1),
                      runner_up=[(int(t), float(g)) for t, g in d.get("runner_up", [])])


def _header(body) -> None:
    if not isinstance(body, dict) or body.get("schema") != SCHEMA:
        raise TraceError("This file is not a draft-tree trace (no \"schema\": \"draft-tree-trace\" header). Export "
                         "one from the app's Trace panel or record one with `python -m studio.trace record`.")
    version = body.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise TraceError(f"This trace has version {version!r}; this app reads version {VERSION} and older. Update the "
                         "app, or export the trace again from this version.")


def _gunzip(data: bytes) -> bytes:
    """The decompressed bytes, at most MAX_JSON_BYTES of them; a cut-off stream is an error, not a shorter file."""
    stream = zlib.decompressobj(wbits=47)
    raw = stream.decompress(data, MAX_JSON_BYTES)
    if not stream.eof:
        raise EOFError("the compressed stream ends early")
    return raw


def loads(data: bytes) -> Trace:
    """A trace from the bytes of a file (gzip-compressed or plain JSON); TraceError says what is wrong."""
    if len(data) > MAX_BYTES:
        raise TraceError(f"The file is {len(data) / 2**20:.0f} MB; a trace is at most {MAX_BYTES // 2**20} MB.")
    try:
        raw = _gunzip(data) if data[:2] == b"\x1f\x8b" else data
        body = json.loads(raw.decode("utf-8"))
    except (zlib.error, EOFError, UnicodeDecodeError, ValueError) as e:
        raise TraceError(f"The file cannot be read as a trace: it is truncated or corrupt ({e}). Download or "
                         "export it again.") from e
    _header(body)
    try:
        records = [_record(d) for d in body["records"]]
        texts = {int(k): str(v) for k, v in body["texts"].items()}
        trace = Trace(dict(body["settings"]), dict(body["models"]), texts, records, int(body["prompt_tokens"]),
                      body.get("ar_tps"), dict(body.get("meta") or {}))
    except (KeyError, TypeError, ValueError, AssertionError, AttributeError) as e:
        raise TraceError(f"The trace is damaged: a field is missing or malformed ({type(e).__name__}: {e}). "
                         "Export or record it again.") from e
    _check(trace)
    return trace


def _check(trace: Trace) -> None:
    """The records hang together: steps in order from the prefill, every token's text present."""
    if not trace.records or [r.step for r in trace.records] != list(range(len(trace.records))):
        raise TraceError("The trace's steps are missing or out of order. Export or record it again.")
    missing = {t for r in trace.records for t in r.tree.tokens + r.committed + [r.bonus]} - trace.texts.keys()
    if missing:
        raise TraceError(f"The trace lacks the text of {len(missing)} tokens. Export or record it again.")


def from_run(pair, prompt: str, cfg: DecodeConfig, records: list[StepRecord], prompt_tokens: int,
             ar_tps: float | None = None) -> Trace:
    """A finished run's trace (token texts decoded with the pair's tokenizer)."""
    ids = set().union(*(shown_ids(r) for r in records))
    spec = MODEL_PAIRS.get(pair.name)
    models = {"pair": pair.name, "target": spec.target if spec else None, "drafter": spec.drafter if spec else None,
              "dtype": str(pair.dtype).removeprefix("torch."), "device": str(pair.device),
              "block_size": pair.drafter.block_size if pair.drafter is not None else None}
    return Trace(asdict(cfg) | {"prompt": prompt}, models, {t: pair.tokenizer.decode([t]) for t in sorted(ids)},
                 list(records), prompt_tokens, ar_tps)


def record(pair, prompt: str, cfg: DecodeConfig) -> Trace:
    """Decode `prompt` with `cfg` and return its trace."""
    ids = encode_chat(pair.tokenizer, prompt)
    return from_run(pair, prompt, cfg, list(generate(pair, ids, cfg)), len(ids))


EXAMPLES = {"math": 0, "code": 1, "chat": 2, "story": 3}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m studio.trace", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="decode one of the app's examples (or --prompt) and write its trace")
    rec.add_argument("--example", choices=sorted(EXAMPLES), default="math")
    rec.add_argument("--prompt", help="instead of an example")
    rec.add_argument("--method", default="hybrid-auto")
    rec.add_argument("--budget", type=int, default=64)
    rec.add_argument("--max-new-tokens", type=int, default=128)
    rec.add_argument("--pair", default="smollm2-135m")
    rec.add_argument("--dtype", default="fp32", help="fp32 (default: the same text on every CPU), bf16 or auto")
    rec.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    pair = load_pair(args.pair, dtype=args.dtype)
    prompt = args.prompt or PROMPTS[EXAMPLES[args.example]][0]
    cfg = DecodeConfig(method=args.method, budget=args.budget, max_new_tokens=args.max_new_tokens).validate()
    data = dumps(record(pair, prompt, cfg))
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"{args.out}: {len(data) / 1024:.0f} KB")


if __name__ == "__main__":
    main()
