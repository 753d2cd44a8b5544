"""One step's draft tree as a NetworkX graph: what students take away to analyse on their own.

Nodes are the tree's node indices (0 = the root, the bonus token the step started from) with the token, its text,
depth, the drafter's rank and q, the prefix probability q(u), the builder's score, who proposed it (hybrid trees)
and whether the target accepted it; edges run parent -> child. `graph_facts` gives the numbers the step view shows;
GraphML and node-link JSON are the two download formats (both read back by `networkx`).
"""
from __future__ import annotations

import io
import json
import math

import networkx as nx

from core.tree import DRAFTER, RETRIEVED, origins

PROPOSER = {0: "root", DRAFTER: "drafter", RETRIEVED: "retrieval", DRAFTER | RETRIEVED: "both"}


def step_graph(record, texts: dict[int, str]) -> nx.DiGraph:
    """The record's tree as an `nx.DiGraph` (graph attributes: step, τ, the bonus token that followed the path)."""
    tree, on_path, origin = record.tree, set(record.accepted), origins(record.tree)
    graph = nx.DiGraph(step=record.step, tau=record.tau, bonus=record.bonus,
                       bonus_text=texts.get(record.bonus, str(record.bonus)))
    for i, token in enumerate(tree.tokens):
        graph.add_node(i, token=token, text=texts.get(token, str(token)), depth=tree.depths[i], rank=tree.ranks[i],
                       q=math.exp(tree.logq[i]), prefix_q=math.exp(tree.prefix_logq[i]), score=float(tree.score[i]),
                       proposer=PROPOSER[origin[i]], accepted=i in on_path)
        if tree.parents[i] >= 0:
            graph.add_edge(tree.parents[i], i)
    return graph


def graph_facts(graph: nx.DiGraph) -> dict:
    """Nodes per depth, mean branching (children per inner node) per depth, leaves (= root-to-leaf paths)."""
    by_depth: dict[int, list[int]] = {}
    for node, depth in graph.nodes(data="depth"):
        by_depth.setdefault(depth, []).append(node)
    branching = {}
    for depth, nodes in sorted(by_depth.items()):
        inner = [graph.out_degree(n) for n in nodes if graph.out_degree(n)]
        if inner:
            branching[depth] = sum(inner) / len(inner)
    leaves = sum(1 for n in graph if graph.out_degree(n) == 0)
    return {"nodes_per_depth": {d: len(n) for d, n in sorted(by_depth.items())}, "branching": branching,
            "leaves": leaves, "paths": leaves, "depth": max(by_depth)}


def facts_line(graph: nx.DiGraph) -> str:
    """The facts in one line for the step view."""
    facts = graph_facts(graph)
    if graph.number_of_nodes() == 1:
        return "Tree: the root alone (nothing drafted)."
    per_depth = ", ".join(f"{n}" for d, n in facts["nodes_per_depth"].items() if d > 0)
    branching = ", ".join(f"{b:.1f}" for b in facts["branching"].values())
    return (f"Tree: {facts['leaves']} root-to-leaf paths, depth {facts['depth']}; nodes per depth {per_depth}; "
            f"children per inner node, by depth from the root: {branching}.")


def graphml(graph: nx.DiGraph) -> str:
    """A GraphML document, XML declaration included (what other tools expect of a .graphml file)."""
    buffer = io.BytesIO()
    nx.write_graphml(graph, buffer)
    return buffer.getvalue().decode("utf-8")


def node_link_json(graph: nx.DiGraph) -> str:
    return json.dumps(nx.node_link_data(graph, edges="edges"), ensure_ascii=False)
