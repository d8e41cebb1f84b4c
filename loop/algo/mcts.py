"""DPO-MCTS's tree math: UCB selection, back-up of returns, the preference pairs. Pure Python.

[P] App. C's DPO-MCTS is "a simplified Agent Q" (Putta et al. 2024, arXiv 2408.07199): a tree
over turns, "nodes are selected by UCB only, with no LLM critic; each expansion samples 2
candidate turns, rolls one out to the end and back-propagates the return, for up to 30
iterations; pairs whose Q-value gap exceeds a threshold go into a persistent offline replay
buffer" trained with DPO. This module is the tree's bookkeeping; the search that samples turns
and rolls them out is loop/rollout/search.py, the DPO loss loop/algo/preference.py (DMPO's with
one turn per sequence is DPO's).

- A node is a state after a sequence of turns; the root is the task's start. Its `payload` is
  the caller's (the turn that led to it); nothing here reads it.
- `ucb`: UCB1 (Auer et al. 2002), Q(s, a) + c sqrt(ln N(s) / N(s, a)), with Q the mean of the
  returns backed up through the child; a child never visited scores +inf, so both candidates
  of an expansion are tried before either is tried twice. Agent Q adds a critic's prior to
  this score; [P]'s simplification has none.
- `select`: from the root, the child of highest UCB (the first on a tie) while the node has
  children; the node reached is expanded (or, if terminal, its return backed up again).
- `backup`: every node on the path from the root gets one visit and the return.
- `sibling_pairs`: for each node with two or more visited children, its best and worst child
  by Q when their gap exceeds `margin` ([P]'s threshold): (chosen, rejected).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Node:
    """One state of the tree: how it was reached, how often visited, what it returned."""

    parent: int | None
    depth: int  # turns from the root
    payload: Any = None  # the caller's: the turn that led here (None at the root)
    children: list[int] = field(default_factory=list)
    visits: int = 0
    value_sum: float = 0.0
    terminal: bool = False  # the episode ended here: nothing to expand

    @property
    def q(self) -> float:
        """The mean return backed up through this node (NaN before its first visit)."""
        return self.value_sum / self.visits if self.visits else math.nan


@dataclass
class Tree:
    """Nodes by index; the root, index 0, is the start state."""

    nodes: list[Node] = field(default_factory=lambda: [Node(parent=None, depth=0)])

    def add_child(self, parent: int, payload: Any) -> int:
        """A new unvisited child of `parent` reached by `payload`; its index."""
        self.nodes.append(Node(parent=parent, depth=self.nodes[parent].depth + 1, payload=payload))
        index = len(self.nodes) - 1
        self.nodes[parent].children.append(index)
        return index

    def path(self, node: int) -> list[int]:
        """The nodes from the root to `node`, both included."""
        out = [node]
        while (parent := self.nodes[out[-1]].parent) is not None:
            out.append(parent)
        return out[::-1]


def ucb(q: float, visits: int, parent_visits: int, c: float) -> float:
    """UCB1 of a child: q + c sqrt(ln(parent_visits) / visits); +inf when never visited."""
    if visits == 0:
        return math.inf
    return q + c * math.sqrt(math.log(max(parent_visits, 1)) / visits)


def select(tree: Tree, c: float) -> int:
    """The leaf that UCB descends to from the root (module docstring)."""
    node = 0
    while tree.nodes[node].children:
        parent = tree.nodes[node]
        scores = [
            ucb(tree.nodes[i].q, tree.nodes[i].visits, parent.visits, c) for i in parent.children
        ]
        node = parent.children[scores.index(max(scores))]
    return node


def backup(tree: Tree, node: int, value: float) -> None:
    """One visit and `value` for every node from the root to `node`."""
    for index in tree.path(node):
        tree.nodes[index].visits += 1
        tree.nodes[index].value_sum += value


def sibling_pairs(tree: Tree, margin: float) -> list[tuple[int, int]]:
    """(chosen, rejected): per node, its best and worst visited children by Q when their gap
    is more than `margin`; in node order."""
    pairs = []
    for node in tree.nodes:
        visited = [i for i in node.children if tree.nodes[i].visits]
        if len(visited) < 2:
            continue
        best = max(visited, key=lambda i: tree.nodes[i].q)
        worst = min(visited, key=lambda i: tree.nodes[i].q)
        if tree.nodes[best].q - tree.nodes[worst].q > margin:
            pairs.append((best, worst))
    return pairs
