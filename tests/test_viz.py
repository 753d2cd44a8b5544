"""viz/ figures from synthetic records (no model), and the app's handlers on a tiny random model."""
import math

import numpy as np
import pytest

from core.builders import build_ddtree
from core.records import StepRecord
from core.tree import root_only
from tests.test_builders import marginals
from viz import charts, theme
from viz.tokens import token_html
from viz.tree_graph import tidy_layout, tree_figure


def synthetic_run(budget=20, steps=5, seed=0):
    records = [StepRecord(0, root_only(7), [0], 7, [7], "x", {"prefill": 0.01}, [0.9])]
    for s in range(1, steps + 1):
        logq, tokens = marginals(seed + s, n_pos=6, k=5)
        tree = build_ddtree(logq, tokens, budget, bonus=records[-1].bonus)
        path = [0]
        while True:   # accept along the rank-0 children for two levels
            kids = [i for i in range(len(tree.tokens)) if tree.parents[i] == path[-1] and tree.ranks[i] == 0]
            if not kids or len(path) > 2:
                break
            path.append(kids[0])
        committed = [tree.tokens[i] for i in path[1:]] + [3]
        records.append(StepRecord(s, tree, path, 3, committed, "ab", {"draft": .01, "tree": .001, "verify": .04,
                                  "accept": .002}, [0.5] * len(committed), nested=True,
                                  draft_tokens=tokens, draft_logq=logq, oracle_depth=3, budget_used=budget))
    return records


def test_tree_figure_nodes_path_and_colour_range():
    records = synthetic_run()
    r = records[2]
    fig = tree_figure(r, {t: f"<t{t}>" for t in range(50)})
    edges, nodes, path, bonus = fig.data
    assert len(nodes.x) == len(r.tree.tokens) == 21
    assert list(path.x) == [r.tree.depths[i] for i in r.accepted]            # accepted path highlighted
    assert path.line.color == theme.ACCEPTED and bonus.marker.color == theme.BONUS
    assert list(bonus.x)[-1] == r.tree.depths[r.accepted[-1]] + 1            # the bonus token follows the path
    assert nodes.marker.cmin == theme.LOG10_PMIN and nodes.marker.cmax == theme.LOG10_PMAX
    assert all(theme.LOG10_PMIN <= c <= 0 for c in nodes.marker.color)
    assert sum(v is None for v in edges.x) == 20                              # one segment per edge
    assert all("<t" not in str(t) for t in nodes.text)                        # token text is escaped
    big = synthetic_run(budget=400, steps=1)[1]
    assert type(tree_figure(big, {}).data[1]).__name__ == "Scattergl" and tree_figure(big, {}).data[1].text is None


def test_tidy_layout_centres_parents():
    parents = [-1, 0, 0, 1, 1, 2]
    y = tidy_layout(parents)
    assert y[3] == 0 and y[4] == 1 and y[5] == 2 and y[1] == 0.5 and y[0] == (0.5 + 2) / 2
    deep = [-1] + list(range(5000))
    assert len(tidy_layout(deep)) == 5001                                     # no recursion limit


def test_budget_curve_is_counterfactual_and_monotone():
    records = synthetic_run()
    c = charts.budget_curves(records)
    assert len(c["budgets"]) == 20 and np.all(np.diff(c["tau"]) >= 0) and np.all(np.diff(c["expected"]) >= 0)
    assert c["tau"][-1] == pytest.approx(np.mean([r.tau for r in records[1:]]))
    for b in (1, 5, 20):
        assert c["tau"][b - 1] == pytest.approx(np.mean([r.tau_at(b) for r in records[1:]]))
    fig = charts.budget_figure(records, cost_ms={1: 30.0, 32: 45.0, 64: 60.0}, draft_ms=8.0)
    assert len(fig.data) == 4


def test_other_charts_and_token_html():
    records = synthetic_run()
    for fig in (charts.tau_per_step(records), charts.histogram(records), charts.depth_rates(records),
                charts.time_breakdown(records), charts.calibration(records), charts.icicle(records[1], {}),
                charts.mask_heatmap(records[1], {})):
        assert fig.data
    assert sum(charts.histogram(records).data[0].y) == pytest.approx(100)
    too_big = charts.mask_heatmap(synthetic_run(budget=100, steps=1)[1], {})
    assert not too_big.data and "at most" in too_big.layout.annotations[0].text
    html = token_html(records, {t: "<b>" for t in range(60)})
    assert "<b>" not in html.replace('<span class="tok', "") and "&lt;b&gt;" in html
    assert html.count('class="tok acc') - 1 == sum(r.accepted_drafts for r in records)   # - the legend's
    icicle = charts.icicle(records[1], {})
    assert math.isclose(icicle.data[0]["values"][0], 1.0)


def test_app_handlers_stream_one_update_per_step(monkeypatch):
    import app
    from tests.conftest import tiny_pair

    monkeypatch.setattr(app, "UPDATE_INTERVAL", 0.0)
    monkeypatch.setitem(app.PAIRS, "tiny", tiny_pair())
    updates = list(app.run("0 5 6 7 8", "DDTree", 16, 0.0, 1.0, 0, 24, 0, "tiny", None))
    state = updates[-1][-1]
    records = state["records"]
    assert len(updates) == len(records) + 1                                   # one per step, then the final one
    assert sum(len(r.committed) for r in records) <= 24
    assert [r.step for r in records] == list(range(len(records)))
    assert "τ" in updates[-1][3] and "speed-up" in updates[-1][3]
    # replay an earlier step from the stored records
    tree, icicle, mask, explain, _ = app.show_step(1, "tiny", state)
    assert len(tree.data[1].x) == len(records[1].tree.tokens) and "This step (1)" in explain
    # Step: exactly one decoding step per press, the first being the prefill
    s = None
    for k in range(3):
        out = app.step_once("0 5 6 7 8", "DDTree", 16, 0.0, 1.0, 0, 24, 0, "tiny", s)
        s = out[-1]
        assert [r.step for r in s["records"]] == list(range(k + 1))


def test_app_auto_budget_shows_the_budget_chosen_per_step(monkeypatch, tmp_path):
    import app
    from tests.conftest import tiny_pair

    from core import costs

    monkeypatch.setenv("DRAFT_TREE_CACHE", str(tmp_path))
    monkeypatch.setattr(costs, "measure", lambda t, **_: {n: 1.0 for n in costs.SIZES})   # trees cost nothing extra
    monkeypatch.setitem(app.PAIRS, "tiny", tiny_pair())
    updates = list(app.run("0 5 6 7 8", "DDTree, auto budget", 16, 0.0, 1.0, 0, 24, 0, "tiny", None))
    records = updates[-1][-1]["records"]
    assert all(r.budget_used <= 16 for r in records) and any(r.budget_used > 0 for r in records)
    assert "chosen per step" in updates[-1][4].layout.title.text


@pytest.mark.parametrize("args,match", [
    (("", "DDTree", 16, 0.0, 1.0, 0, 24, 0, "tiny"), "empty"),
    (("0 5", "DDTree", 0, 0.0, 1.0, 0, 24, 0, "tiny"), "budget"),
    (("0 5", "DDTree", 16, -1.0, 1.0, 0, 24, 0, "tiny"), "temperature"),
    (("0 5", "DDTree", 16, 0.0, 3.0, 0, 24, 0, "tiny"), "top_p"),
    (("0 5", "DDTree", 16, 0.0, 1.0, 0, 24, 0, "no-such-pair"), "Unknown model pair"),
])
def test_app_bad_input_is_a_readable_error(monkeypatch, args, match):
    import gradio as gr

    import app
    from tests.conftest import tiny_pair

    monkeypatch.setitem(app.PAIRS, "tiny", tiny_pair())
    with pytest.raises(gr.Error, match=match):
        list(app.run(*args, None))


def test_app_compare_reports_identical_outputs(monkeypatch):
    import warnings

    import app
    from tests.conftest import tiny_pair

    monkeypatch.setitem(app.PAIRS, "tiny", tiny_pair())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        updates = list(app.compare("0 5 6 7 8", 16, 0.0, 1.0, 0, 20, 0, "tiny"))
    rows, fig, verdict = updates[-1]
    assert [r["method"] for r in rows] == ["Plain decoding (AR)", "DFlash chain", "DDTree", "PRESTO"]
    assert rows[0]["speedup"] == 1.0 and "identical" in verdict and len(fig.data) == 3
