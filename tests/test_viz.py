"""viz/ figures from synthetic records (no model), and the app's handlers on a tiny random model."""
import math
import re
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from core.builders import build_ddtree
from core.records import StepRecord
from core.tree import root_only
from tests.test_builders import marginals
from viz import charts, theme
from viz.tokens import token_html
from studio.views import PRESENTER_TREE
from viz.tree_graph import BESIDE_PX, GAP_PX, LABEL_PX, LEADER_PX, WIDTH_PX, ems, fit, tidy_layout, tree_figure


def synthetic_run(budget=20, steps=5, seed=0, k=5):
    records = [StepRecord(0, root_only(7), [0], 7, [7], "x", {"prefill": 0.01}, [0.9])]
    for s in range(1, steps + 1):
        logq, tokens = marginals(seed + s, n_pos=6, k=k)
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
    assert nodes.marker.colorscale is not None and nodes.marker.showscale is not False   # the colour bar stays
    assert sum(v is None for v in edges.x) == 20                              # one segment per edge
    labels = [a.text for a in fig.layout.annotations]
    assert labels and all("<t" not in t and "&lt;t" in t for t in labels)   # token text is escaped
    big = synthetic_run(budget=400, steps=1)[1]
    assert type(tree_figure(big, {}).data[1]).__name__ == "Scattergl"


def _labelled(fig) -> set:
    return {(a.x, a.y) for a in fig.layout.annotations}


@pytest.mark.parametrize("budget", [64, 256, 512])
def test_tree_labels_the_path_and_the_top_nodes_of_each_depth_at_any_size(budget):
    r = synthetic_run(budget=budget, steps=1, k=8)[1]
    tree = r.tree
    assert len(tree.tokens) == budget + 1
    fig = tree_figure(r, {}, height=380)
    assert fig.layout.height == 380
    nodes = fig.data[1]
    at = {i: (nodes.x[i], nodes.y[i]) for i in range(len(tree.tokens))}
    labelled = _labelled(fig)
    assert all(at[i] in labelled for i in r.accepted)
    for d in range(1, tree.max_depth + 1):
        top = sorted((i for i in range(len(tree.tokens)) if tree.depths[i] == d),
                     key=lambda i: -tree.prefix_logq[i])[:3]
        assert all(at[i] in labelled for i in top), d
    # labels are pushed apart: no two in one column closer than a label's height
    for column in {a.x for a in fig.layout.annotations}:
        centres = sorted(_label_centre(fig, a) for a in fig.layout.annotations if a.x == column)
        assert all(b - a >= LABEL_PX - 1e-6 for a, b in zip(centres, centres[1:]))


def deep_record(texts_seed=3):
    """One step of a 16-deep, 64-node tree whose rank-0 chain is accepted for twelve levels."""
    rng = np.random.default_rng(texts_seed)
    logits = rng.normal(size=(16, 6)) * 1.5
    logits[:, 0] += 4
    logq = (logits - np.log(np.exp(logits).sum(1, keepdims=True))).astype(np.float32)
    tree = build_ddtree(logq, rng.integers(0, 36, size=(16, 6)), 64, bonus=1)
    path = [0]
    while len(path) < 13 and (kids := [i for i in range(len(tree.tokens))
                                       if tree.parents[i] == path[-1] and tree.ranks[i] == 0]):
        path.append(kids[0])
    assert max(tree.depths) == 16 and len(path) >= 7
    committed = [tree.tokens[i] for i in path[1:]] + [3]
    return StepRecord(1, tree, path, 3, committed, "x", {"draft": .01}, [0.5] * len(committed))


LONG_WORDS = dict(enumerate([" function", "<|im_end|>", " calculate", " the", "\n", " answer", ".", " is", "(x)",
                             " return", " we", ","] * 3))


@pytest.mark.parametrize("style", [{"height": 360}, PRESENTER_TREE], ids=["page", "presenter"])
def test_tree_labels_stop_before_the_next_column(style):
    """No label runs into a node or a label of a deeper column or past the plot's right edge (at the width the figure
    is laid out for); cut labels end in an ellipsis and the accepted path keeps every label."""
    r = deep_record()
    deepest = r.tree.depths.index(max(r.tree.depths))
    fig = tree_figure(r, LONG_WORDS | {r.tree.tokens[deepest]: " calculations"}, **style)     # a long last label
    width = style.get("width_px", WIDTH_PX)
    font = style.get("label_px", LABEL_PX) - 2
    last = max(fig.data[1].x) + 0.6                                     # the x range: -0.5 to the last column + 0.6
    column = (width - 20 - BESIDE_PX) / (last + 0.5)
    lo, hi = fig.layout.yaxis.range
    span = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    nodes = [(x * column, (y - hi) / (lo - hi) * span) for x, y in zip(fig.data[1].x, fig.data[1].y)]
    boxes = []
    for a in fig.layout.annotations:
        left = a.x * column + GAP_PX + (LEADER_PX if a.showarrow else 0)
        text = a.text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
        boxes.append((left, left + ems(text) * font, _label_centre(fig, a), a.x, text))
    assert {a.text for a in fig.layout.annotations} - {theme.label(t) for t in LONG_WORDS.values()}   # some are cut
    for left, right, centre, x, text in boxes:
        assert right <= last * column + 1 or len(text) == 1                 # the plot's right edge
        for other_left, _, other_centre, other_x, _ in boxes:
            if other_x > x and abs(other_centre - centre) < font:
                assert right <= other_left + 1 or len(text) == 1, (x, other_x)
        for node_x, node_y in nodes:
            if node_x > x * column and abs(node_y - centre) < font / 2 + 6:
                assert right <= node_x - 6 + 1 or len(text) == 1        # one character is always kept
    at = {(a.x, a.y) for a in fig.layout.annotations}
    assert all((r.tree.depths[i], fig.data[1].y[i]) in at for i in r.accepted)


def test_a_cut_label_shows_letters_and_an_ellipsis():
    assert fit("␣the", 10) == "␣the"                        # fits whole: the space mark stays
    assert fit("␣function", 2.5) == "fu…"                   # cut: the space mark goes first
    assert fit("<|im_end|>", 2) == "<…"
    assert fit("<|im_end|>", 0.5) == "<"                    # at least one character
    assert fit("␣calculations", 99) == "calculati…"          # LABEL_CHARS at most
    assert ems("mmm") > ems("iii")


def _label_centre(fig, a) -> float:
    """A label's centre in pixels from the plot's top."""
    lo, hi = fig.layout.yaxis.range
    span = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    node = (a.y - hi) / (lo - hi) * span
    return node + (a.ay if a.showarrow else -(a.yshift or 0))


def test_tree_colour_scale_has_neither_the_accepted_green_nor_the_bonus_blue():
    def rgb(c):
        return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)

    for _, colour in theme.COLORSCALE:
        r, g, b = rgb(colour)
        assert r >= g and r > b                                               # warm: no green, no blue
    for accent in (theme.ACCEPTED, theme.BONUS):
        assert accent not in [c for _, c in theme.COLORSCALE]
    fig = tree_figure(synthetic_run()[2], {})
    assert fig.data[1].marker.colorscale == tuple(tuple(s) for s in theme.COLORSCALE)
    icicle = charts.icicle(synthetic_run()[2], {})
    off_path = [c for i, c in enumerate(icicle.data[0].marker.colors) if i not in synthetic_run()[2].accepted]
    assert off_path and all(c.startswith("rgb(") for c in off_path)          # sampled from the same scale


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


EXACT = {1: 1.5, 2: 2.0, 4: 2.5, 8: 2.8, 16: 2.9, 20: 3.0}


def test_budget_chart_sets_the_exact_curve_beside_the_counterfactual_and_says_which_is_which():
    records = synthetic_run()
    fig = charts.budget_figure(records, cost_ms={1: 30.0, 32: 45.0, 64: 60.0}, draft_ms=8.0, exact=EXACT)
    names = [t.name for t in fig.data]
    assert names[:3] == [charts.COUNTERFACTUAL, "expected: 1 + Σ q(u) of the first b nodes", charts.EXACT]
    exact = fig.data[2]
    assert list(exact.x) == list(EXACT) and list(exact.y) == list(EXACT.values())
    assert fig.layout.title.subtitle.text == charts.EXACT_NOTE
    assert "exact τ" in fig.data[-1].name and list(fig.data[-1].x) == list(EXACT)   # speed-up from the exact τ
    coming = charts.budget_figure(records, exact={1: 1.5}, exact_note=charts.exact_progress(1, 6))
    assert "1 of 6 done" in coming.layout.title.subtitle.text and len(coming.data) == 4
    sampled = charts.budget_figure(records, exact_note=charts.NO_EXACT_SAMPLED)
    assert charts.EXACT not in [t.name for t in sampled.data]
    assert "temperature > 0" in sampled.layout.title.subtitle.text
    beam = [replace(r, nested=False) for r in records]        # PRESTO-beam: no counterfactual, the exact curve only
    fig = charts.budget_figure(beam, exact=EXACT)
    assert [t.name for t in fig.data] == [charts.EXACT, "achieved (this run)"]
    assert fig.layout.title.subtitle.text == charts.EXACT_ONLY_NOTE
    assert "chosen per step" in charts.budget_figure(beam).layout.title.text
    plain = [replace(r, tree=root_only(r.tree.tokens[0])) for r in records]           # nothing drafted
    assert "after the first speculative step" in charts.budget_figure(plain).layout.annotations[0].text
    assert "plain decoding drafts no tree" in charts.budget_figure(plain, method="ar").layout.annotations[0].text


def test_the_counterfactual_never_exceeds_what_a_step_committed():
    records = synthetic_run()
    cut = replace(records[1], committed=records[1].committed[:1])     # a stop token: the first draft ends the reply
    assert cut.tau_at(20) == 1 and records[1].tau_at(20) == records[1].tau > 1
    assert charts.budget_curves([records[0], cut])["tau"][-1] == 1


@pytest.mark.parametrize("budget,ticks", [(20, [1, 2, 4, 8, 16]), (400, [1, 2, 4, 8, 16, 32, 64, 128, 256]),
                                          (512, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512])])
def test_budget_axis_is_ticked_at_powers_of_two_inside_the_data(budget, ticks):
    fig = charts.budget_figure(synthetic_run(budget=budget, steps=2, k=8))
    axis = fig.layout.xaxis
    assert axis.type == "log" and list(axis.tickvals) == ticks and list(axis.ticktext) == [str(t) for t in ticks]
    chosen = charts.chosen_budgets(synthetic_run(budget=budget, steps=2, k=8)).layout.yaxis2
    assert chosen.type == "log" and all(t & (t - 1) == 0 for t in chosen.tickvals)


def every_figure(records=None):
    """Every builder's figure, with data and as the empty placeholder."""
    records = records or synthetic_run()
    prefill = records[:1]
    rows = [{"method": "Plain decoding (AR)", "tau": 1.0, "tokens/s": 20.0, "speedup": 1.0, "tokens": 24},
            {"method": "DDTree", "tau": 3.2, "tokens/s": 50.0, "speedup": 2.5, "tokens": 24}]
    return {
        "budget": charts.budget_figure(records, cost_ms={1: 30.0, 32: 45.0, 64: 60.0}, draft_ms=8.0),
        "budget (empty)": charts.budget_figure(prefill),
        "budget (exact)": charts.budget_figure(records, cost_ms={1: 30.0, 64: 60.0}, draft_ms=8.0, exact=EXACT),
        "chosen": charts.chosen_budgets(records), "chosen (empty)": charts.chosen_budgets(prefill),
        "tau": charts.tau_per_step(records), "tau (empty)": charts.tau_per_step(prefill),
        "histogram": charts.histogram(records), "histogram (empty)": charts.histogram(prefill),
        "depth": charts.depth_rates(records), "depth (empty)": charts.depth_rates(prefill),
        "time": charts.time_breakdown(records), "time (empty)": charts.time_breakdown(prefill),
        "calibration": charts.calibration(records), "calibration (empty)": charts.calibration(prefill),
        "icicle": charts.icicle(records[1], {}), "mask": charts.mask_heatmap(records[1], {}),
        "mask (too big)": charts.mask_heatmap(synthetic_run(budget=100, steps=1)[1], {}),
        "compare": charts.compare_bars(rows), "compare (empty)": charts.compare_bars([]),
        "tree": tree_figure(records[1], {}), "tree (titled)": tree_figure(records[1], {}, title="step 1", height=380),
    }


def test_every_figure_has_a_descriptive_title_and_a_transparent_background():
    for name, fig in every_figure().items():
        assert len(fig.layout.title.text or "") > 12, name
        assert fig.layout.paper_bgcolor == fig.layout.plot_bgcolor == "rgba(0,0,0,0)", name
        if not fig.data:                                                      # a placeholder says what will come
            assert "appear" in fig.layout.annotations[0].text or "at most" in fig.layout.annotations[0].text, name
    assert "Draft tree" in every_figure()["tree (titled)"].layout.title.text


def test_every_mark_has_a_legend_entry():
    for name, fig in every_figure().items():
        if not fig.data:
            continue
        assert fig.layout.showlegend, name
        shown = {t.legendgroup for t in fig.data if t.type != "icicle" and t.showlegend is not False}
        for t in fig.data:
            assert t.name, (name, t.type)
            if t.type in ("icicle", "heatmap"):                               # no legend of their own: a key beside
                assert sum(u.type == "scatter" and u.showlegend is not False for u in fig.data) >= 2, name
            elif t.showlegend is False:
                assert t.legendgroup and t.legendgroup in shown, (name, t.name)
    tau = every_figure()["tau"]
    assert [t.name for t in tau.data][0] == "τ of the step" and "oracle bound" in tau.data[1].name
    assert "top-K" in tau.data[1].name
    hybrid = [replace(r, tree=replace(r.tree, origin=[0] * len(r.tree.tokens))) for r in synthetic_run()]
    oracle = charts.tau_per_step(hybrid).data[1]          # retrieval can accept past the drafter's top-K
    assert "bound" not in oracle.name and "retrieval can go past it" in oracle.name and "≤" not in oracle.hovertemplate
    tree = [t.name for t in every_figure()["tree"].data if t.showlegend is not False]
    assert any("drafted node" in n for n in tree) and "accepted path" in tree and any("bonus" in n for n in tree)


def test_every_figure_is_named_after_what_it_shows_for_its_downloads():
    names = {name: fig.layout.meta["filename"] for name, fig in every_figure().items()}
    assert all(re.fullmatch(r"[a-z]+(-[a-z0-9]+)+|calibration", n) for n in names.values()), names
    assert names["tree"] == "tree-step-1" and names["icicle"] == "icicle-step-1" and names["mask"] == "mask-step-1"
    assert names["budget"] == names["budget (empty)"] == names["budget (exact)"] == "acceptance-vs-budget"
    assert names["mask (too big)"] == "mask-step-1" and names["compare"] == "compare-methods"


def test_every_plot_in_the_app_has_png_and_svg_buttons_and_no_camera():
    """The buttons beside each plot download it by its figure's name; the modebar's camera, which would save
    `newplot.png` on a transparent background, is left out of every figure."""
    import gradio as gr

    import app
    from studio.plots import DOWNLOAD_JS

    plots = [b for b in app.demo.blocks.values() if isinstance(b, gr.Plot)]
    assert len(plots) == 11 and all([b.value for b in p.buttons] == ["PNG", "SVG"] for p in plots)
    assert "layout.meta" in DOWNLOAD_JS and "downloadImage" in DOWNLOAD_JS
    assert all(list(fig.layout.modebar.remove) == ["toImage"] for fig in every_figure().values())


def test_axes_make_room_for_their_titles_and_tick_labels():
    for name, fig in every_figure().items():
        template = fig.layout.template.layout
        assert template.xaxis.automargin and template.yaxis.automargin, name
        assert template.yaxis.title.standoff and template.xaxis.title.standoff, name
        for axis in [k for k in fig.layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]:
            assert fig.layout[axis].automargin is not False, (name, axis)
    budget = every_figure()["budget"]
    assert budget.layout.yaxis2.title.text and budget.layout.margin.r >= 20


def test_step_axes_tick_whole_steps_on_short_runs():
    short = synthetic_run()
    assert short[-1].step - short[0].step <= 10
    for fig in (charts.tau_per_step(short), charts.time_breakdown(short), charts.chosen_budgets(short)):
        assert fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.title.text == "step"    # never 0.5, 1.5 ...
    long = [replace(short[-1], step=s) for s in range(1, 60)]
    assert charts.tau_per_step(long).layout.xaxis.dtick is None                        # plotly's own spacing


def test_chosen_budget_line_breaks_across_plain_steps():
    run = synthetic_run(steps=4)                                   # the prefill, then four drafted steps
    line = charts.chosen_budgets(run[:1] + [replace(r, step=s) for r, s in zip(run[1:], (1, 2, 9, 10))]).data[1]
    assert list(line.x) == [1, 2, None, 9, 10] and line.y[2] is None and line.connectgaps is False
    assert "plain steps" in line.name


def test_dark_css_is_scoped_to_dark_and_covers_plots_and_tokens():
    css = theme.DARK_CSS
    rules = [r.strip() for r in css.split("}") if r.strip()]
    assert rules
    for rule in rules:
        selectors, depth, part = [], 0, ""
        for ch in rule.split("{")[0]:                                         # commas inside [..] and (..) stay
            depth += ch in "[(" and 1 or ch in "])" and -1 or 0
            if ch == "," and depth == 0:
                selectors.append(part)
                part = ""
            else:
                part += ch
        selectors.append(part)
        assert all(s.strip().startswith(".dark ") for s in selectors), rule
    assert ".js-plotly-plot" in css and "text" in css and "!important" in css and ".hoverlayer" in css
    assert ".tok.acc" in css and ".tok.bonus" in css
    assert f"rgb({int(theme.TEXT[1:3], 16)}, {int(theme.TEXT[3:5], 16)}, {int(theme.TEXT[5:7], 16)})" in css
    assert every_figure()["tau"].layout.font.color == theme.TEXT                # the fill DARK_CSS recolours


def test_compare_bars_takes_rows_as_dicts_with_extra_keys():
    rows = [{"method": "Plain decoding (AR)", "tau": 1.0, "tokens/s": 20.0, "speedup": 1.0, "tokens": 24,
             "identical": True},
            {"method": "DDTree", "tau": 3.2, "tokens/s": 50.0, "speedup": 2.5}]
    fig = charts.compare_bars(rows)
    assert len(fig.data) == 3 and list(fig.data[1].y) == ["Plain decoding (AR)", "DDTree"]
    assert list(fig.data[2].x) == [1.0, 2.5]


def test_other_charts_and_token_html():
    records = synthetic_run()
    for fig in (charts.tau_per_step(records), charts.histogram(records), charts.depth_rates(records),
                charts.time_breakdown(records), charts.calibration(records), charts.icicle(records[1], {}),
                charts.mask_heatmap(records[1], {})):
        assert fig.data
    assert sum(charts.histogram(records).data[0].y) == pytest.approx(100)
    too_big = charts.mask_heatmap(synthetic_run(budget=100, steps=1)[1], {})
    assert not too_big.data and "at most" in too_big.layout.annotations[0].text and too_big.layout.title.text
    html = token_html(records, {t: "<b>" for t in range(60)})
    assert "<b>" not in html.replace('<span class="tok', "") and "&lt;b&gt;" in html
    assert html.count('class="tok acc') - 1 == sum(r.accepted_drafts for r in records)   # - the legend's
    icicle = charts.icicle(records[1], {})
    assert math.isclose(icicle.data[0]["values"][0], 1.0)


def test_app_handlers_stream_one_update_per_step(monkeypatch):
    from studio import handlers, state
    from studio.handlers import Form
    from studio.views import REPLAY_VIEWS, TREE_HEIGHT
    from tests.conftest import tiny_pair

    monkeypatch.setattr(handlers, "UPDATE_INTERVAL", 0.0)
    monkeypatch.setitem(state.PAIRS, "tiny", tiny_pair())
    updates = list(handlers.run(Form("0 5 6 7 8", "DDTree", 16, 0.0, 1.0, 0, 24, 0, "tiny"), None))
    session = updates[-1][-1]
    records = session["records"]
    assert len(updates) == len(records) + 1                                   # one per step, then the final one
    assert sum(len(r.committed) for r in records) <= 24
    assert [r.step for r in records] == list(range(len(records)))
    assert "τ" in updates[-1][3] and "speed-up" in updates[-1][3]
    # replay an earlier step from the stored records
    shown = dict(zip(REPLAY_VIEWS, handlers.show_step(1, "tiny", session)))
    tree, explain, caption = shown["tree"], shown["explain"], shown["caption"]
    # the slider's label names the step shown; its value stays the visitor's (a drag is not pulled back)
    assert shown["slider"].label == f"Step (replay any stored step; showing 1 of {len(records) - 1})"
    assert "value" not in shown["slider"].constructor_args
    assert len(tree.data[1].x) == len(records[1].tree.tokens) and "This step (1)" in explain and caption
    assert "**Step 1.** Tree:" in shown["tree_facts"] and Path(shown["graphml"]).read_text().startswith("<?xml")
    assert tree.layout.height == TREE_HEIGHT and "Draft tree" in tree.layout.title.text
    # Step: exactly one decoding step per press, the first being the prefill
    s = None
    for k in range(3):
        out = handlers.step_once(Form("0 5 6 7 8", "DDTree", 16, 0.0, 1.0, 0, 24, 0, "tiny"), s)
        s = out[-1]
        assert [r.step for r in s["records"]] == list(range(k + 1))
        metrics = out[3]                                     # after the prefill alone: no 0.00s, no "0 / 0"
        assert ("Step 0 was the prefill" in metrics and "0 / 0" not in metrics) if k == 0 else "τ = " in metrics
        assert "measuring" not in metrics                    # Step never measures plain decoding: it says so
        assert k == 0 or "– (Run measures it)" in metrics


def test_app_auto_budget_shows_the_budget_chosen_per_step(monkeypatch, tmp_path):
    from studio import handlers, state
    from studio.handlers import Form
    from tests.conftest import tiny_pair

    from core import costs

    monkeypatch.setenv("DRAFT_TREE_CACHE", str(tmp_path))
    monkeypatch.setattr(costs, "measure", lambda t, **_: {n: 1.0 for n in costs.SIZES})   # trees cost nothing extra
    monkeypatch.setitem(state.PAIRS, "tiny", tiny_pair())
    updates = list(handlers.run(Form("0 5 6 7 8", "DDTree, auto budget", 16, 0.0, 1.0, 0, 24, 0, "tiny"), None))
    records = updates[-1][-1]["records"]
    assert all(r.budget_used <= 16 for r in records) and any(r.budget_used > 0 for r in records)
    assert "chosen per step" in updates[-1][4].layout.title.text


def test_app_draws_the_exact_curve_when_its_background_replay_is_done(monkeypatch):
    """A greedy run queues its exact curve; the timer's tick draws it once done (equal to `core.replay`'s) and then
    stops; a newer run supersedes it; a sampled run says why it has none."""
    import gradio as gr

    from core.replay import exact_budget_curve
    from studio import handlers, state, views
    from studio.handlers import Form
    from tests.conftest import tiny_pair

    pair = tiny_pair()
    monkeypatch.setitem(state.PAIRS, "tiny", pair)
    *_, last = handlers.run(Form("0 5 6 7 8", "DDTree", 16, 0.0, 1.0, 0, 24, 0, "tiny"), None)
    session, timer = last[-1], last[views.OUTPUTS.index("exact_timer")]
    job = state.EXACT.jobs[session["exact"]]
    assert isinstance(timer, gr.Timer) and (timer.active or job.done)   # a fast replay may finish first
    deadline = time.time() + 60
    while not job.done and time.time() < deadline:
        time.sleep(0.02)
    fig, timer = handlers.show_exact(session)
    exact = next(t for t in fig.data if t.name == charts.EXACT)
    reply = [t for r in session["records"] for t in r.committed]
    assert dict(zip(exact.x, exact.y)) == exact_budget_curve(pair, [0, 5, 6, 7, 8], reply, job.cfg, [1, 2, 4, 8, 16])
    assert charts.COUNTERFACTUAL in [t.name for t in fig.data] and not timer.active
    assert handlers.show_exact(session) == (gr.skip(), gr.skip())                   # nothing new: nothing sent
    *_, newer = handlers.run(Form("0 5 6 7 8", "DDTree", 8, 0.0, 1.0, 0, 24, 0, "tiny"), session)
    assert job.id not in state.EXACT.jobs and newer[-1]["exact"] in state.EXACT.jobs
    *_, sampled = handlers.run(Form("0 5 6 7 8", "DDTree", 16, 0.7, 1.0, 0, 24, 0, "tiny"), None)
    assert sampled[-1]["exact"] == charts.NO_EXACT_SAMPLED
    assert sampled[views.OUTPUTS.index("budget_fig")].layout.title.subtitle.text == charts.NO_EXACT_SAMPLED


@pytest.mark.parametrize("args,match", [
    (("", "DDTree", 16, 0.0, 1.0, 0, 24, 0, "tiny"), "empty"),
    (("0 5", "DDTree", 0, 0.0, 1.0, 0, 24, 0, "tiny"), "budget"),
    (("0 5", "DDTree", 16, -1.0, 1.0, 0, 24, 0, "tiny"), "temperature"),
    (("0 5", "DDTree", 16, 0.0, 3.0, 0, 24, 0, "tiny"), "top_p"),
    (("0 5", "DDTree", 16, 0.0, 1.0, 0, 24, 0, "no-such-pair"), "Unknown model pair"),
])
def test_app_bad_input_is_a_readable_error(monkeypatch, args, match):
    import gradio as gr

    from studio import handlers, state
    from studio.handlers import Form
    from tests.conftest import tiny_pair

    monkeypatch.setitem(state.PAIRS, "tiny", tiny_pair())
    with pytest.raises(gr.Error, match=match):
        list(handlers.run(Form(*args), None))


def test_app_compare_reports_identical_outputs(monkeypatch):
    import warnings

    from studio import handlers, state
    from studio.handlers import Form
    from tests.conftest import tiny_pair

    monkeypatch.setitem(state.PAIRS, "tiny", tiny_pair())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        updates = list(handlers.compare(Form("0 5 6 7 8", budget=16, max_new=20, pair_name="tiny")))
    table, fig, verdict, _ = updates[-1]
    assert [row[0] for row in table] == list(handlers.COMPARED) == list(fig.data[0].y)
    assert table[0][4] == "1.00×" and "identical" in verdict and len(fig.data) == 3


def test_background_forwards_wait_for_the_plain_baseline_and_between_compared_runs(monkeypatch):
    """A run's plain-decoding baseline is its speed-up's denominator, and Compare's rows are ranked by speed: no
    background forward (the cost curve's timings, an exact curve's replay) may start between a run and its baseline
    or between two compared runs, or a ratio shown is skewed. `COSTS.idle()` returns only while nothing holds
    `decoding()`."""
    import warnings

    from studio import handlers, state
    from studio.handlers import Form
    from tests.conftest import tiny_pair
    from viz import page

    monkeypatch.setattr(handlers, "UPDATE_INTERVAL", 0.0)
    monkeypatch.setitem(state.PAIRS, "tiny", tiny_pair())
    held, plain, row = [], handlers._plain, page.compare_row
    monkeypatch.setattr(handlers, "_plain", lambda *a: held.append(state.COSTS._busy) or plain(*a))
    monkeypatch.setattr(page, "compare_row", lambda *a: held.append(state.COSTS._busy) or row(*a))
    list(handlers.run(Form("0 5 6 7 8", "DDTree", 16, 0.0, 1.0, 0, 16, 0, "tiny"), None))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        list(handlers.compare(Form("0 5 6 7 8", budget=16, max_new=12, pair_name="tiny")))
    assert held == [1] * (1 + len(handlers.COMPARED)) and state.COSTS._busy == 0


def _fonts(fig) -> list[float]:
    """Every font size a figure's text is drawn at (the layout's, its title's, legend's and annotations')."""
    layout = fig.layout
    sizes = [layout.font.size, layout.title.font.size, layout.legend.font.size]
    sizes += [a.font.size for a in layout.annotations]
    if layout.title.subtitle.text:
        sizes.append(layout.title.subtitle.font.size)
    return [s for s in sizes if s is not None]


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_presenter_mode_draws_every_figure_in_large_full_contrast_type(mode):
    from studio.views import PRESENTER_TREE

    figures = every_figure() | {"tree (presenter)": tree_figure(synthetic_run()[1], {}, **PRESENTER_TREE)}
    for name, fig in figures.items():
        theme.present(fig, mode)
        assert min(_fonts(fig)) >= theme.PRESENTER_SMALL_PX, (name, _fonts(fig))
        assert fig.layout.font.size >= 16 and fig.layout.font.color == theme.INK[mode], name
        template = fig.layout.template.layout
        assert template.xaxis.tickfont.size >= 16 and template.yaxis.title.font.size >= 16, name
    assert theme.present(tree_figure(synthetic_run()[1], {}), None).layout.font.size == theme.FONT["size"]   # off
    # the presenter tree's labels are spaced for their larger type
    tree = figures["tree (presenter)"]
    for column in {a.x for a in tree.layout.annotations}:
        centres = sorted(_label_centre(tree, a) for a in tree.layout.annotations if a.x == column)
        assert all(b - a >= PRESENTER_TREE["label_px"] - 1e-6 for a, b in zip(centres, centres[1:]))


def test_presenter_toggle_redraws_the_run_in_its_style_and_a_new_run_keeps_it(monkeypatch):
    from studio import handlers, state
    from studio.handlers import Form
    from studio.views import OUTPUTS, PRESENTER_TREE, TREE_HEIGHT
    from tests.conftest import tiny_pair

    monkeypatch.setattr(handlers, "UPDATE_INTERVAL", 0.0)
    monkeypatch.setitem(state.PAIRS, "tiny", tiny_pair())
    form = Form("0 5 6 7 8", "DDTree", 16, 0.0, 1.0, 0, 16, 0, "tiny")
    session = list(handlers.run(form, None))[-1][-1]
    on = dict(zip(OUTPUTS + ("state",), handlers.present(True, True, "tiny", session)))
    assert on["state"]["presenter"] == "dark" and on["tree"].layout.height == PRESENTER_TREE["height"]
    assert on["tree"].layout.font.color == theme.INK["dark"] and on["tau_fig"].layout.font.size >= 16
    # the large title is short (the PNG/SVG buttons stand beside it); the counts are in its subtitle
    shown = session["records"][on["slider"].value]
    assert on["tree"].layout.title.text == f"Draft tree, step {shown.step}"
    assert on["tree"].layout.title.subtitle.text == f"{shown.tree.size} nodes, τ = {shown.tau}"
    again = dict(zip(OUTPUTS + ("state",), list(handlers.run(form, on["state"]))[-1]))
    assert again["tree"].layout.font.color == theme.INK["dark"]                   # a new run stays in presenter mode
    off = dict(zip(OUTPUTS + ("state",), handlers.present(False, True, "tiny", again["state"])))
    assert off["state"]["presenter"] is None and off["tree"].layout.height == TREE_HEIGHT
    assert off["tree"].layout.font.size == theme.FONT["size"]
    assert off["tree"].layout.title.text.endswith(f"{shown.tree.size} nodes, τ = {shown.tau}")
    rule = off["tree"].layout.title.subtitle.text
    assert rule.startswith(("A typical step", "The last step"))                    # the rule, one clause a line
    assert "; " not in rule and (rule == "The last step" or ";<br>the last is step" in rule)
    empty = handlers.present(True, False, "tiny", None)                          # before any run: only the state
    assert empty[-1]["presenter"] == "light"
