"""No remote code, no pickle: checkpoints are safetensors, arrays are loaded with allow_pickle=False, and the app
takes model pairs only from the operator's registry (a dropdown), never a typed id or path."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for d in ("core", "viz", "studio") for p in (ROOT / d).rglob("*.py")] + [ROOT / "app.py"]


def test_no_remote_code_and_no_pickle():
    for path in SOURCES:
        text = path.read_text()
        assert not re.search(r"trust_remote_code\s*=\s*True", text), path
        assert "torch.load(" not in text and "import pickle" not in text, path
        for call in re.findall(r"np\.load\([^)]*\)", text):
            assert "allow_pickle=False" in call, (path, call)


def test_app_model_choice_is_the_registry():
    import app
    from core.config import MODEL_PAIRS

    assert set(app.usable_pairs()) <= set(MODEL_PAIRS)
    dropdowns = [b for b in app.demo.blocks.values() if type(b).__name__ == "Dropdown"]
    pair_box = next(d for d in dropdowns if d.label.startswith("Model pair"))
    assert not pair_box.allow_custom_value


def test_token_text_is_escaped_in_every_view():
    import json

    from viz import text as words

    import app
    from viz import charts
    from viz.tokens import token_html
    from viz.tree_graph import tree_figure
    from tests.test_viz import synthetic_run

    records = synthetic_run()
    evil = "<img src=x onerror=alert(1)>"
    texts = {t: evil for t in range(1000)}
    figures = (tree_figure(records[1], texts), charts.icicle(records[1], texts), charts.mask_heatmap(records[1], texts))
    for fig in figures:
        labels = json.dumps([[getattr(tr, f, None) for f in ("text", "labels", "x", "y", "hovertext", "customdata")]
                             for tr in fig.data], default=str)
        assert "<img" not in labels and "&lt;img" in labels
    assert "<img" not in token_html(records, texts)
    for r in records[:2]:
        assert "<img" not in words.step_explanation(r, texts, "ddtree", 8) + words.step_caption(r, texts, 8)
