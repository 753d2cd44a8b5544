"""The draft tree of one step as a tidy tree, depth left to right so it reads like text.

Node colour is log10 of the prefix probability q(u) on a range fixed for the whole run, on a scale with no green and
no blue; the accepted path is drawn on top in green, and the target's bonus token follows it as a blue star. In a
hybrid tree, nodes found by retrieval wear a fuchsia diamond (a legend entry of their own). Labelled
at any size: the accepted path, the bonus and the most probable nodes of each depth, pushed apart (with a leader line)
so they do not overlap at the figure's height; other nodes where their label fits. A label is cut short where it
would run into a node or a label of a deeper column or the plot's right edge (at the width the figure is laid out
for). WebGL above 300 nodes. Inputs are a StepRecord and a token-id -> text map; no model is touched.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go

from core.tree import DRAFTER, RETRIEVED, origins
from viz import theme

TOP_PER_DEPTH = 3   # most probable nodes of each depth that are always labelled
GL_LIMIT = 300
LABEL_PX = 13       # vertical room of one label
LABEL_CHARS = 10    # longer token texts are cut in the label (the hover has them whole)
PATH_DROP_PX = 9    # a path label's centre sits this far below (or above) its node, off the path's line
GAP_PX = 8          # from a node's centre to its label
LEADER_PX = 8       # a moved label (with a leader line) starts this much further right
OPTIONAL_PER_COLUMN = 8   # other nodes labelled per depth at most, where there is room
# labels are spaced for this plot area: Gradio gives a titled, labelled plot a top margin of at least 100 px;
# the x-axis title and the legend are below the plot
MARGIN = dict(l=10, r=10, t=100, b=80)
WIDTH_PX = 890      # the width labels are cut for: the tree's beside the settings on a 1280 px page (wider: room)
BESIDE_PX = 100     # of it, the colour bar and its margin beside the plot (measured in Chromium)
# a character's width in ems (DejaVu Sans, wider than Inter: a label that fits in one fits in both); others 0.6, and
# 1.0 from the CJK blocks on
EM = {c: w for w, chars in ((0.3, "',./:;IJ\\ijl| ·"), (0.4, "!()-[]frt"), (0.5, '"*?_`csz'), (0.7, "ABCKNRUVXZ"),
                            (0.8, "#&+<=>DGHOQ^w~⏎"), (0.9, "M"), (1.0, "%@Wm…")) for c in chars}
NODE_PX = 7         # a node's radius, as an obstacle for labels
MIN_OPTIONAL = 4    # an optional label is shown only with room for this many characters (or all of it)


def tidy_layout(parents: list[int], order_key: list[float] | None = None) -> list[float]:
    """y slot per node: leaves take consecutive slots (children in `order_key` descending), parents sit at the
    mean of their children. O(N)."""
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[parents[i]].append(i)
    if order_key is not None:
        for c in children:
            c.sort(key=lambda i: -order_key[i])
    y = [0.0] * n
    next_slot = 0.0
    stack = [(0, False)]
    while stack:                      # iterative post-order: a deep chain must not hit the recursion limit
        node, done = stack.pop()
        if not children[node]:
            y[node] = next_slot
            next_slot += 1
        elif done:
            y[node] = sum(y[c] for c in children[node]) / len(children[node])
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(children[node]))
    return y


def tree_figure(record, texts: dict[int, str], title: str = "", height: int | None = None,
                subtitle: str | None = None, label_px: int = LABEL_PX, bottom_px: int = MARGIN["b"],
                nodes: int | None = None, path: int | None = None, width_px: int = WIDTH_PX) -> go.Figure:
    """The step's draft tree; `height` fixes the figure's height (labels are spaced for it), `width_px` the width
    labels are cut for; `label_px` is a label's vertical room (its font 2 px smaller), `bottom_px` the room under the
    plot for axis title and legend (presenter mode sets all three). The step's animation draws part of it: only the
    first `nodes` nodes (the builder's first pops) and only the first `path` nodes of the accepted path with no bonus
    (the walk so far); the layout stays the whole tree's, so nothing moves as nodes appear."""
    tree = record.tree
    n = len(tree.tokens) if nodes is None else max(1, min(nodes, len(tree.tokens)))
    y = tidy_layout(tree.parents, tree.score)
    x = list(tree.depths)
    leaves = max(y) + 1 if y else 1
    full_x = max(x[record.accepted[-1]] + 1, max(x))      # the bonus's column: the x range never changes
    height = height or int(min(900, max(340, 26 * leaves + 160)))
    margin = MARGIN | {"b": bottom_px}
    span_px = max(1.0, height - margin["t"] - margin["b"])
    pad_px = label_px                                   # room above the top node for its label
    slot_px = max(0.1, span_px - pad_px) / (leaves + 1)
    top = -1 - pad_px / slot_px
    scatter = go.Scattergl if n > GL_LIMIT else go.Scatter

    ex, ey = [], []
    for i in range(1, n):
        p = tree.parents[i]
        ex += [x[p], x[i], None]
        ey += [y[p], y[i], None]
    edges = scatter(x=ex, y=ey, mode="lines", line=dict(color=theme.EDGE, width=1), hoverinfo="skip",
                    name="tree edge", legendgroup="nodes", showlegend=False)

    dots = _node_trace(record, texts, x, y, slot_px, scatter, n)
    found = [i for i, o in enumerate(origins(tree)[:n]) if i and o & RETRIEVED]
    rings = scatter(x=[x[i] for i in found], y=[y[i] for i in found], mode="markers", hoverinfo="skip",
                    name="found by retrieval (in the prompt or reply)",
                    marker=dict(size=max(8, min(18, int(slot_px) + 6)), symbol="diamond-open", color=theme.RETRIEVED,
                                line=dict(width=2, color=theme.RETRIEVED)))

    with_bonus = path is None
    path = record.accepted if with_bonus else record.accepted[:path]
    on_path = set(path)
    last = path[-1] if path else 0
    bonus_x, bonus_y = x[last] + 1, y[last]
    px = [x[i] for i in path] + [bonus_x]
    py = [y[i] for i in path] + [bonus_y]
    bonus_text = texts.get(record.bonus, str(record.bonus))
    accepted, bonus = _path_traces(px, py, theme.label(bonus_text), scatter)

    # labels beside their nodes; the path's below its green line where the line rises, above where it falls
    texts_of = [bonus_text if i < 0 else texts.get(tree.tokens[i], str(tree.tokens[i])) for i in range(-1, n)]
    where = {i: (x[i], y[i]) for i in range(n)} | ({-1: (bonus_x, bonus_y)} if with_bonus else {})
    node_px = {i: pad_px + (yy + 1) * slot_px for i, (_, yy) in where.items()}
    natural = dict(node_px)
    for i, nxt in zip(path, path[1:] + ([-1] if with_bonus else [])):
        natural[i] += PATH_DROP_PX if where[nxt][1] <= where[i][1] else -PATH_DROP_PX
    must = [(i, theme.ACCEPTED) for i in path] + ([(-1, theme.BONUS)] if with_bonus else []) + \
        [(i, None) for i in top_per_depth(tree.depths[:n], tree.prefix_logq[:n]) if i not in on_path]
    may = sorted((i for i in range(n) if i not in on_path), key=lambda i: -tree.prefix_logq[i])
    spots = place_labels([(i, where[i][0], natural[i]) for i, _ in must], [(i, x[i], natural[i]) for i in may],
                         span_px, label_px)
    x_range = [-0.5, full_x + 0.6]     # depth units: half a column of room beside the root and the last column
    column_px = max(1.0, width_px - margin["l"] - margin["r"] - BESIDE_PX) / (x_range[1] - x_range[0])
    moved = {i for i, spot in spots.items() if abs(spot - natural[i]) > 2}
    colour = dict(must)
    shown = label_texts({i: (where[i][0], spot) for i, spot in spots.items()}, moved, colour, node_px, where,
                        {i: theme.show_whitespace(texts_of[i + 1]) for i in spots}, column_px, label_px, x_range[1])
    annotations = [_annotation(*where[i], spots[i] - node_px[i], i in moved, theme.escape(words), colour.get(i),
                               label_px - 2)
                   for i, words in shown.items()]

    if not title:
        title = f"step {record.step}: {tree.size} nodes, τ = {record.tau}"
    fig = go.Figure([edges, dots] + ([rings] if found else []) + ([accepted] if path else []) +
                    ([bonus] if with_bonus else []))
    fig.update_layout(**theme.layout(
        title if "tree" in title.lower() else f"Draft tree, {title}", subtitle, filename=f"tree-step-{record.step}",
        height=height, margin=margin,
        annotations=annotations,
        xaxis=dict(title="depth (tokens after the root)", dtick=1, zeroline=False, showgrid=True, range=x_range),
        yaxis=dict(visible=False, range=[leaves, top])))
    return fig


def _path_traces(px: list, py: list, bonus_label: str, scatter) -> tuple:
    """The accepted path (all but the last point) and the dotted step from its end to the bonus token's star."""
    accepted = scatter(x=px[:-1], y=py[:-1], mode="lines+markers", name="accepted path",
                       line=dict(color=theme.ACCEPTED, width=4),
                       marker=dict(size=13, color=theme.ACCEPTED, line=dict(width=1, color="white")), hoverinfo="skip")
    bonus = scatter(x=px[-2:], y=py[-2:], mode="lines+markers", name="bonus token (the target's own token)",
                    line=dict(color=theme.BONUS, width=3, dash="dot"),
                    marker=dict(size=[0, 16], color=theme.BONUS, symbol="star"),
                    hovertemplate=f"bonus token from the target: <b>{bonus_label}</b><extra></extra>")
    return accepted, bonus


def _node_trace(record, texts: dict[int, str], x: list[int], y: list[float], slot_px: float, scatter, n: int):
    """The first n nodes, coloured by q(prefix), with what each one is in its hover."""
    tree, on_path = record.tree, set(record.accepted)
    p_walk = {node: p for node, p in zip(record.accepted[1:], record.p_committed)}
    labels = [theme.label(texts.get(t, str(t))) for t in tree.tokens]
    origin = origins(tree)
    custom = [[labels[i], tree.tokens[i], tree.depths[i], tree.ranks[i], math.exp(tree.logq[i]),
               math.exp(tree.prefix_logq[i]), tree.score[i],
               f"{p_walk[i]:.3f}" if i in p_walk else "–", "accepted" if i in on_path else "not accepted",
               PROPOSERS[origin[i]], "q (drafter)" if origin[i] & DRAFTER or not i else "acceptance rate (calibrated)"]
              for i in range(n)]
    return scatter(
        x=x[:n], y=y[:n], mode="markers", name="drafted node (colour: log₁₀ q(prefix))", legendgroup="nodes",
        marker=dict(size=max(4, min(12, int(slot_px))), color=theme.log10_prefix(tree.prefix_logq[:n]),
                    cmin=theme.LOG10_PMIN, cmax=theme.LOG10_PMAX, colorscale=theme.COLORSCALE,
                    line=dict(width=0.5, color="rgba(255, 255, 255, 0.6)"), colorbar=theme.colorbar()),
        customdata=custom,
        hovertemplate=("<b>%{customdata[0]}</b> (id %{customdata[1]})<br>depth %{customdata[2]}, rank "
                       "%{customdata[3]}<br>%{customdata[10]} %{customdata[4]:.3f}<br>q(prefix) %{customdata[5]:.2e}<br>"
                       "score %{customdata[6]:.3f}<br>p (target, on the walk) %{customdata[7]}<br>"
                       "%{customdata[8]}; %{customdata[9]}<extra></extra>"))


PROPOSERS = {0: "the target's bonus token (root)", DRAFTER: "proposed by the drafter",
             RETRIEVED: "found by retrieval", DRAFTER | RETRIEVED: "proposed by the drafter and found by retrieval"}


def top_per_depth(depths: list[int], prefix_logq: list[float], k: int = TOP_PER_DEPTH) -> list[int]:
    """The k most probable nodes (by prefix probability) of every depth, most probable first."""
    by_depth: dict[int, list[int]] = {}
    for i in sorted(range(1, len(depths)), key=lambda i: -prefix_logq[i]):
        if len(by_depth.setdefault(depths[i], [])) < k:
            by_depth[depths[i]].append(i)
    return [i for d in sorted(by_depth) for i in by_depth[d]]


def place_labels(must: list[tuple], may: list[tuple], span_px: float, label_px: float = LABEL_PX) -> dict:
    """Label centres in pixels from the plot's top, {key: px}, for labels (key, column, wanted px). `must` labels
    are all shown: within a column, labels closer than `label_px` form a block centred on what they want (kept inside
    the plot); `may` labels are shown, in order, only where one fits where it wants to be with room to spare, at
    most OPTIONAL_PER_COLUMN a column."""
    columns: dict[float, list[tuple]] = {}
    for key, column, at in must:
        columns.setdefault(column, []).append((at, key))
    lo, hi = label_px / 2, max(label_px / 2, span_px - label_px / 2)
    placed: dict = {}
    for column, items in columns.items():
        items.sort()
        blocks: list[list] = []          # [first centre, wanted centres]: labels label_px apart from there down
        for at, _ in items:
            blocks.append([at, [at]])
            while True:
                wanted = blocks[-1][1]
                first = sum(wanted) / len(wanted) - label_px * (len(wanted) - 1) / 2
                blocks[-1][0] = min(max(lo, first), max(lo, hi - label_px * (len(wanted) - 1)))
                if len(blocks) < 2 or blocks[-2][0] + label_px * len(blocks[-2][1]) <= blocks[-1][0]:
                    break
                blocks[-2][1] += blocks.pop()[1]
        centres = [first + label_px * k for first, wanted in blocks for k in range(len(wanted))]
        placed |= {key: c for (_, key), c in zip(items, centres)}
    taken: dict[float, list[float]] = {}
    for key, column, _ in must:
        taken.setdefault(column, []).append(placed[key])
    extra: dict[float, int] = {}
    for key, column, at in may:
        column_taken = taken.setdefault(column, [])
        if key not in placed and extra.get(column, 0) < OPTIONAL_PER_COLUMN and \
                all(abs(at - other) >= 1.5 * label_px for other in column_taken):
            placed[key] = at
            column_taken.append(at)
            extra[column] = extra.get(column, 0) + 1
    return placed


def ems(text: str) -> float:
    """The text's estimated width in ems."""
    return sum(EM.get(c, 0.6 if c < "\u2e80" else 1.0) for c in text)


def fit(shown: str, room: float) -> str:
    """`shown` (whitespace made visible) within `room` ems and LABEL_CHARS characters: whole, or cut with an
    ellipsis, a leading space mark dropped first (a cut word shows its letters); at least its first character,
    alone where there is no room for the ellipsis too."""
    if len(shown) <= LABEL_CHARS and ems(shown) <= room:
        return shown
    if len(shown) > 2 and shown[0] == "␣":
        shown = shown[1:]
    if ems(shown[:1]) + EM["…"] > room:
        return shown[:1]
    keep = 1
    while keep < LABEL_CHARS - 1 and ems(shown[:keep + 1]) + EM["…"] <= room:
        keep += 1
    return shown if keep >= len(shown) else shown[:keep] + "…"


def label_texts(spots: dict, moved: set, must: dict, node_px: dict, where: dict, shown: dict, column_px: float,
                label_px: float, last: float) -> dict:
    """Each label's text, {key: text}, for labels {key: (column, centre px)} of `shown` texts (the `moved` ones
    start after a leader line): what fits before the first node or label of a deeper column at its height and before
    the plot's right edge (column `last`). An optional label (not in `must`) that cannot show MIN_OPTIONAL
    characters, or all of a shorter text, is left out; it then stands in no other label's way."""
    font_px = label_px - 2

    def room(key, others) -> float:
        column, centre = spots[key]
        ends = [(c - column) * column_px - NODE_PX for k, (c, _) in where.items()
                if c > column and abs(node_px[k] - centre) < label_px / 2 + NODE_PX] + \
               [(spots[k][0] - column) * column_px + GAP_PX + LEADER_PX * (k in moved) for k in others
                if spots[k][0] > column and abs(spots[k][1] - centre) < label_px]
        ends.append((last - column) * column_px)                          # the plot's right edge
        return min(ends) - GAP_PX - LEADER_PX * (key in moved)

    keep = list(spots)
    for key in sorted((k for k in spots if k not in must), key=lambda k: -spots[k][0]):   # deepest first
        words = fit(shown[key], room(key, keep) / font_px)
        if words != shown[key] and len(words.lstrip("␣")) - 1 < MIN_OPTIONAL:
            keep.remove(key)
    return {key: fit(shown[key], room(key, keep) / font_px) for key in keep}


def _annotation(x: float, y: float, dy: float, moved: bool, text: str, colour: str | None, size: int = 11) -> dict:
    """A label right of its node, its centre dy pixels below the node's; a moved one gets a thin leader line."""
    font = dict(size=size, **({"color": colour} if colour else {}))
    if not moved:
        return dict(x=x, y=y, text=text, showarrow=False, xanchor="left", yanchor="middle", xshift=GAP_PX,
                    yshift=-dy, font=font)
    return dict(x=x, y=y, text=text, showarrow=True, xanchor="left", yanchor="middle", ax=GAP_PX + LEADER_PX, ay=dy,
                axref="pixel", ayref="pixel", arrowhead=0, arrowwidth=0.8, standoff=4, arrowcolor=theme.EDGE,
                font=font)
