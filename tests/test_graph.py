"""Each step's tree as a NetworkX graph: the same nodes, edges and numbers as the tree, the facts the step view
states, and downloads that networkx reads back equal."""
import math

import networkx as nx
import numpy as np

from core.hybrid import build_hybrid
from core.records import StepRecord
from core.retrieval import Calibration, SuffixIndex
from tests.test_viz import synthetic_run
from viz import graph


def test_graph_is_the_tree():
    r = synthetic_run()[2]
    texts = {t: f"<t{t}>" for t in range(50)}
    g = graph.step_graph(r, texts)
    tree = r.tree
    assert sorted(g.nodes) == list(range(len(tree.tokens)))
    assert sorted(g.edges) == sorted((p, i) for i, p in enumerate(tree.parents) if p >= 0)
    assert nx.is_arborescence(g)
    for i in g:
        node = g.nodes[i]
        assert (node["token"], node["depth"], node["rank"]) == (tree.tokens[i], tree.depths[i], tree.ranks[i])
        assert math.isclose(node["prefix_q"], math.exp(tree.prefix_logq[i]))
        assert node["accepted"] == (i in r.accepted) and node["text"] == f"<t{tree.tokens[i]}>"
    assert g.graph["tau"] == r.tau and g.graph["step"] == r.step


def test_facts_count_paths_depths_and_branching():
    r = synthetic_run()[2]
    g = graph.step_graph(r, {})
    facts = graph.graph_facts(g)
    leaves = [i for i in range(len(r.tree.tokens)) if i not in r.tree.parents]
    assert facts["leaves"] == facts["paths"] == len(leaves) and facts["depth"] == r.tree.max_depth
    assert sum(facts["nodes_per_depth"].values()) == len(r.tree.tokens)
    root_children = sum(1 for p in r.tree.parents if p == 0)
    assert facts["branching"][0] == root_children
    line = graph.facts_line(g)
    assert f"{len(leaves)} root-to-leaf paths, depth {r.tree.max_depth}" in line
    assert graph.facts_line(graph.step_graph(synthetic_run()[0], {})) == "Tree: the root alone (nothing drafted)."


def test_downloads_read_back_equal(tmp_path):
    r = synthetic_run()[3]
    g = graph.step_graph(r, {t: f"tok {t} & <x>" for t in range(50)})
    path = tmp_path / "tree.graphml"
    path.write_text(graph.graphml(g))
    back = nx.read_graphml(path, node_type=int)
    assert sorted(back.edges) == sorted(g.edges) and back.nodes[3] == g.nodes[3]
    linked = nx.node_link_graph(__import__("json").loads(graph.node_link_json(g)), edges="edges")
    assert sorted(linked.edges) == sorted(g.edges) and linked.nodes[3] == g.nodes[3]


def test_a_hybrid_tree_names_its_proposers():
    rng = np.random.default_rng(0)
    logq = np.sort(np.log(rng.dirichlet(np.ones(20), size=4)), axis=1)[:, ::-1][:, :5].copy()
    tokens = np.stack([rng.permutation(20)[:5] for _ in range(4)])
    history = [30, 31, 32, 30]
    index = SuffixIndex()
    index.sync(history)
    tree, _ = build_hybrid(logq, tokens, 12, 30, history, index, Calibration().logp)
    record = StepRecord(1, tree, [0], 5, [5], "x", {}, [1.0])
    proposers = nx.get_node_attributes(graph.step_graph(record, {}), "proposer")
    assert proposers[0] == "root" and proposers[tree.tokens.index(31)] == "retrieval"
    assert set(proposers.values()) <= {"root", "drafter", "retrieval", "both"}
