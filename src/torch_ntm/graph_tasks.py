"""The graph tasks of the Differentiable Neural Computer paper (Graves et al. 2016, Nature 538,
Methods "Graph tasks"): `TraversalTask` and `ShortestPathTask` on random graphs.

A graph is given to the model as its edges, one (source, edge label, destination) triple a step;
a query follows; the model answers with the triples of a path. Both tasks share:

**The graph** (`random_graph`). n nodes (uniform on ``min_nodes..max_nodes``) are placed
uniformly in the unit square; each node gets K outbound edges (K uniform on
``min_out..max_out``, at most n - 1, drawn for each node) to its K nearest other nodes
(Euclidean), so the graph is directed and may not be strongly connected. Nodes get distinct
labels drawn uniformly from ``0 .. 10^digits - 1``; the edges leaving a node get distinct labels
from the same range (edges leaving different nodes may share one), so a start node and a
sequence of edge labels name exactly one path. The E triples are shown in a random order.

**The encoding.** A label is ``digits`` decimal digits, most significant first, each a one-hot
group of 10 units; a field is ``10 * digits`` units (D = 10 * digits below), a triple three fields
(source, edge, destination), 3D units. A blank field (the parts of a query not given, the answer
phase's inputs) is all zeros. With ``digits = 2`` (the default), label 47 is the digit 4's group
then the 7's: units 4 and 10 + 7 of the field are 1.

    input  channels 0 .. D-1     source      channel 3D    graph flag    (1 on graph steps)
           channels D .. 2D-1    edge        channel 3D+1  query flag    (1 on query steps)
           channels 2D .. 3D-1   destination channel 3D+2  planning flag (1 on planning steps)
                                             channel 3D+3  answer flag   (1 on answer steps)
    target channels 0 .. 3D-1    the answer's triple, as the input's first 3D channels

The input has ``3D + 4`` channels, the target ``3D``. The loss is a softmax cross-entropy over
each group of 10 (``loss = "cross_entropy"``, ``label_groups = 3 * digits``) on the answer steps
only (the mask); a step is wrong when any of its digits is (the harness's ``bit_errors`` are then
wrong answer triples per query and ``perfect`` the fraction of queries without one). The extra
scores are ``queries_right``, the fraction of queries whose every answer triple is exactly
right, and ``triples_right``, the fraction of answer triples right (averaged by query).

Sequences of a batch have their own graphs and lengths; a shorter one is padded at its end with
zero inputs, zero targets and a false mask. All randomness comes from the ``generator`` argument,
so a fixed seed gives fixed tensors. Graphs are built one sequence at a time (a nearest-neighbour
sort and, for shortest paths, a breadth-first search from every node), a Python loop over the
batch on plain lists, made tensors once (what that costs: docs/speed.md, "Data").

The size knob is the number of nodes, the training range ``min_nodes..max_nodes``; a curriculum
(``ntm train --set curriculum_start=N``, `Task.up_to`) trains on graphs of up to N nodes first and
adds a node each time the training rows' wrong triples per query fall to
``curriculum_bit_errors``. The presets train without one: from 3-node graphs the DNC learnt to
answer small graphs from its controller and stayed there; on every size at once it learnt
traversal (docs/results/dnc.md).
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from torch_ntm.metrics import label_errors
from torch_ntm.task_base import Batch, Task

__all__ = ["Graph", "random_graph", "TraversalTask", "ShortestPathTask", "GRAPH", "QUERY",
           "PLAN", "ANSWER"]

# The phases, in the order of their flag channels after the three fields (channel 3D + phase).
GRAPH, QUERY, PLAN, ANSWER = range(4)
_BLANK = -1  # a field with no label: all zeros
_BASE = 10  # labels are decimal digits
_MAX_GRAPHS = 1000  # shortest path: graphs drawn for one sequence before giving up
# Labels are drawn from 10 ** digits values, each node's edge labels by a permutation of them:
# above 4 digits (10,000 labels) that is a typo, not a plan (6 digits took minutes a batch).
MAX_DIGITS = 4


class Graph(NamedTuple):
    """A random graph: n nodes, E edges (node indices ``0 .. n-1``, not labels)."""

    points: Tensor  # [n, 2] float64, the nodes' places in the unit square
    labels: Tensor  # [n] long, each node's label, distinct
    source: Tensor  # [E] long, the node an edge leaves
    edge: Tensor  # [E] long, the edge's label, distinct among the edges leaving a node
    destination: Tensor  # [E] long, the node it enters


def random_graph(nodes: int, min_out: int, max_out: int, labels: int,
                 generator: torch.Generator | None = None) -> Graph:
    """A graph of ``nodes`` points uniform in the unit square, each joined to its K nearest.

    K is drawn for each node uniformly on ``min(min_out, n-1) .. min(max_out, n-1)``; node
    labels are distinct, uniform on ``0 .. labels-1``; the labels of the edges leaving a node
    are distinct, uniform on the same range. Edges are in a random order.

    Args:
        nodes: n >= 2.
        min_out: the least K, >= 1.
        max_out: the most K, ``min_out <= max_out <= labels``.
        labels: how many labels there are (``nodes <= labels``).
        generator: CPU `torch.Generator` supplying all randomness (None: the global one).

    Raises:
        ValueError: unless the sizes are as above (each node needs its own label, and each of
            a node's edges one of its own).
    """
    n = nodes
    for name, value, least in (("nodes", nodes, 2), ("min_out", min_out, 1),
                               ("labels", labels, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"random_graph needs {name} >= {least}, got {value!r}")
    if not min_out <= max_out <= labels or nodes > labels:
        raise ValueError(f"random_graph needs min_out <= max_out <= labels and nodes <= labels "
                         f"(distinct labels for the nodes and for a node's edges), got "
                         f"nodes={nodes}, min_out={min_out}, max_out={max_out}, labels={labels}")
    points = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    dist = torch.cdist(points, points).fill_diagonal_(float("inf"))  # never an edge to itself
    low, high = min(min_out, n - 1), min(max_out, n - 1)
    nearest = dist.argsort(dim=1)[:, :high].tolist()  # per node, the nearest others first
    out = torch.randint(low, high + 1, (n,), generator=generator).tolist()  # K per node
    node_labels = torch.randperm(labels, generator=generator)[:n]
    # distinct labels for a node's edges: the first K of a permutation per node
    edge_labels = torch.rand(n, labels, generator=generator).argsort(dim=1)[:, :high].tolist()
    # the edges node by node, each node's K nearest in order (plain lists: a graph is small, and
    # a torch op on it costs more than its arithmetic), then shown in a random order
    edges = [(i, edge_labels[i][j], nearest[i][j]) for i in range(n) for j in range(out[i])]
    order = torch.randperm(len(edges), generator=generator).tolist()
    source, edge, destination = _long_tensor(
        [edges[o][f] for f in range(3) for o in order], 3, len(edges))
    return Graph(points, node_labels, source, edge, destination)


def _long_tensor(values: list[int], *shape: int) -> Tensor:
    """An int64 tensor of ``shape`` from a flat list (~50x faster than `torch.tensor` on the
    nested lists of a batch: it reads the list once as machine integers)."""
    return torch.frombuffer(array("q", values), dtype=torch.long).view(*shape)


def _encode(labels: Tensor, digits: int) -> Tensor:
    """``[..., F]`` long labels (or `_BLANK`) -> ``[..., F * digits * 10]`` one-hot digits."""
    place = _BASE ** torch.arange(digits - 1, -1, -1)  # most significant first
    blank = labels == _BLANK
    each = labels.clamp(min=0).unsqueeze(-1) // place % _BASE  # [..., F, digits]
    code = F.one_hot(each, _BASE).float() * ~blank.unsqueeze(-1).unsqueeze(-1)
    return code.flatten(-3)


@dataclass
class _GraphTask(Task):
    """What the two graph tasks share: the graph, the encoding, the batch and the scores."""

    min_nodes: int = 3
    max_nodes: int = 10
    min_out: int = 1
    max_out: int = 3
    digits: int = 2
    min_path: int = 1
    max_path: int = 4
    planning_steps: int = 0

    size_name: ClassVar[str] = "nodes"
    size_range: ClassVar[tuple[str, str]] = ("min_nodes", "max_nodes")
    loss: ClassVar[str] = "cross_entropy"

    def __post_init__(self) -> None:
        self._check(min_nodes=2, max_nodes=2, min_out=1, max_out=1, digits=1, min_path=1,
                    max_path=1, planning_steps=0)
        self._check_range("min_nodes", "max_nodes")
        self._check_range("min_out", "max_out")
        self._check_range("min_path", "max_path")
        name = type(self).__name__
        if self.digits > MAX_DIGITS:
            raise ValueError(f"{name}: digits={self.digits} draws labels from 10**{self.digits} "
                             f"values; at most {MAX_DIGITS} digits ({_BASE**MAX_DIGITS:,} labels)")
        if self.max_nodes > self.labels:
            raise ValueError(f"{name}: max_nodes={self.max_nodes} needs more distinct labels than "
                             f"digits={self.digits} give ({self.labels}); raise digits")
        if self.max_out > self.labels:
            raise ValueError(f"{name}: max_out={self.max_out} edges leaving a node need distinct "
                             f"labels, more than digits={self.digits} give ({self.labels})")

    @property
    def eval_sizes(self) -> tuple[int, ...]:  # type: ignore[override]
        """The sizes to evaluate: 1, 1.5, 2 and 3 times ``max_nodes`` (rounded), those that the
        labels can name; (10, 15, 20, 30) at the defaults."""
        n = self.max_nodes
        return tuple(sorted({round(f * n) for f in (1, 1.5, 2, 3) if round(f * n) <= self.labels}))

    @property
    def max_edges(self) -> int:
        """The most edges a graph of the task has: ``max_nodes * min(max_out, max_nodes - 1)``."""
        return self.max_nodes * min(self.max_out, self.max_nodes - 1)

    @property
    def max_steps(self) -> int:
        """The most steps a sequence of the task can take (from its parameters, no sequence
        drawn): the graph's edges, the query, the planning steps and the longest answer."""
        raise NotImplementedError

    @property
    def labels(self) -> int:
        """How many labels there are: ``10 ** digits``."""
        return _BASE**self.digits

    @property
    def field_size(self) -> int:
        """D: units of one field (one label)."""
        return _BASE * self.digits

    @property
    def input_size(self) -> int:
        return 3 * self.field_size + 4

    @property
    def output_size(self) -> int:
        return 3 * self.field_size

    @property
    def label_groups(self) -> int:
        """Softmax groups of 10: ``digits`` per field, three fields."""
        return 3 * self.digits

    @property
    def label_task(self) -> bool:
        """False: scored by labels (one softmax per digit), but with graph sizes to generalise
        to, as the bit tasks are, rather than by accuracy by instance."""
        return False

    @property
    def extra_metrics(self) -> tuple[str, ...]:
        """``queries_right``: the fraction of queries whose every answer triple is right (each
        digit's most likely value the target's); ``triples_right``: the fraction of a query's
        answer triples that are right, averaged over queries."""
        return ("queries_right", "triples_right")

    def extra_scores(self, logits: Tensor, targets: Tensor, mask: Tensor) -> dict[str, float]:
        """`extra_metrics`' means over the batch (time-major ``[T, B, 3D]``)."""
        wrong = label_errors(logits, targets, mask, groups=self.label_groups)  # [B]
        answers = mask.sum(0).to(wrong.dtype)  # [B], >= 1 for every sequence
        return {"queries_right": float((wrong == 0).double().mean()),
                "triples_right": float((1 - wrong / answers).double().mean())}

    def _episode(self, graph: Graph, generator: torch.Generator | None
                 ) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
        """The query's steps and the answer's triples, as labels (or `_BLANK`); None where
        ``graph`` has no query that fits (shortest path)."""
        raise NotImplementedError

    def _graph(self, generator: torch.Generator | None) -> Graph:
        nodes = int(torch.randint(self.min_nodes, self.max_nodes + 1, (1,), generator=generator))
        return random_graph(nodes, self.min_out, self.max_out, self.labels, generator)

    def _sample(self, batch_size: int, generator: torch.Generator | None) -> Batch:
        blank = (_BLANK,) * 3
        episodes = []  # per sequence: its steps' labels in and out, and their phases
        for _ in range(batch_size):
            graph, query, answer = self._draw(generator)
            names = graph.labels.tolist()
            shown = [(names[s], e, names[d]) for s, e, d in zip(
                graph.source.tolist(), graph.edge.tolist(), graph.destination.tolist())]
            steps = [shown, query, [blank] * self.planning_steps, [blank] * len(answer)]
            given = [step for part in steps for step in part]
            wanted = [blank] * (len(given) - len(answer)) + answer
            # the steps' phases in order: GRAPH, QUERY, PLAN, ANSWER are 0, 1, 2, 3
            phase = [(p,) for p, part in enumerate(steps) for _ in part]
            episodes.append((given, wanted, phase))
        T = max(len(e[2]) for e in episodes)  # shorter sequences padded with blanks at the end

        def padded(i: int, pad: tuple) -> Tensor:  # [T, B, fields]: episodes' part i
            flat = []
            for e in episodes:
                for step in e[i] + [pad] * (T - len(e[i])):
                    flat.extend(step)
            return _long_tensor(flat, batch_size, T, len(pad)).transpose(0, 1).contiguous()

        given, wanted = padded(0, blank), padded(1, blank)
        phase = padded(2, (_BLANK,)).squeeze(-1)
        inputs = torch.cat([_encode(given, self.digits),
                            F.one_hot(phase.clamp(min=0), 4).float() * (phase >= 0).unsqueeze(-1)],
                           dim=-1)
        mask = phase == ANSWER
        targets = _encode(wanted, self.digits)
        return Batch(inputs, targets, mask)

    def _draw(self, generator: torch.Generator | None):
        graph = self._graph(generator)
        query, answer = self._episode(graph, generator)
        return graph, query, answer


@dataclass
class TraversalTask(_GraphTask):
    """Traversal: follow a sequence of edge labels from a start node; answer with the path.

    A random graph (the module's text says how it is drawn and encoded) with E edges, then a query
    of P edge labels (P uniform on ``min_path..max_path``) from a start node (uniform over the
    nodes), then ``planning_steps`` steps with no data (S; default 0), then P answer steps. With
    the walk v_0 (the start), v_1, ..., v_P, where v_i is the destination of the edge labelled e_i
    leaving v_{i-1} (one exists, and only one: every node has an edge leaving it, and the labels
    of a node's edges differ; e_i is the label of one of them chosen uniformly), a sequence takes
    ``T = E + P + S + P`` steps:

        step    0 .. E-1         E            E+1 .. E+P-1   E+P .. E+P+S-1   E+P+S .. T-1
        phase   graph            query        query          planning         answer
        input   (s_j, e_j, d_j)  (v_0, e_1, _)  (_, e_i, _)  (_, _, _)        (_, _, _)
        flag    3D               3D+1         3D+1           3D+2             3D+3
        target  0                0            0              0                (v_{i-1}, e_i, v_i)
        mask    0                0            0              0                1

    ``_`` is a blank field (zeros); node fields hold the node's label. Answer step i (i = 1..P)
    is the triple of the i-th edge of the walk, every one an edge of the graph. E.g. the graph
    7 -> 3 -> 5 -> 7 with edge labels 4, 6, 9, shown as (3, 6, 5), (7, 4, 3), (5, 9, 7), and the
    query (7, 4, _), (_, 6, _): the answer is (7, 4, 3), (3, 6, 5), T = 3 + 2 + 0 + 2 = 7 steps,
    the last two scored. The size knob is
    the number of nodes (``min_nodes..max_nodes``, default 3..10); ``eval_sizes`` go to 3 times
    ``max_nodes``.
    """

    name: ClassVar[str] = "traversal"

    @property
    def max_steps(self) -> int:
        return self.max_edges + 2 * self.max_path + self.planning_steps

    def _episode(self, graph, generator):
        n = graph.labels.numel()
        leaving = [[] for _ in range(n)]  # per node: (edge label, destination)
        for s, e, d in zip(graph.source.tolist(), graph.edge.tolist(),
                           graph.destination.tolist()):
            leaving[s].append((e, d))
        hops = int(torch.randint(self.min_path, self.max_path + 1, (1,), generator=generator))
        node = int(torch.randint(n, (1,), generator=generator))
        names = graph.labels.tolist()
        query, answer = [], []
        for i in range(hops):
            choices = sorted(leaving[node])  # by label: independent of the edges' shown order
            e, d = choices[int(torch.randint(len(choices), (1,), generator=generator))]
            query.append((names[node] if i == 0 else _BLANK, e, _BLANK))
            answer.append((names[node], e, names[d]))
            node = d
        return query, answer


@dataclass
class ShortestPathTask(_GraphTask):
    """Shortest path: given a source and a destination, answer with a shortest path's triples.

    A random graph (the module's text says how it is drawn and encoded) with E edges, then one
    query step (source, _, destination), then ``planning_steps`` steps with no data (S; default
    10, the paper's planning phase), then P answer steps, the P edges of the shortest path
    (fewest edges) from the source to the destination. Only pairs joined by exactly one shortest
    path are asked, so the answer is unique: a pair (u, v), u != v, is drawn uniformly among the
    pairs with v reachable from u, one shortest path and P in ``min_path..max_path``; a graph
    without such a pair is drawn again (with ``min_path = 1`` every graph has one: an edge is a
    pair's only one-edge path). A pair with no path is never asked. A sequence takes
    ``T = E + 1 + S + P`` steps:

        step    0 .. E-1         E           E+1 .. E+S    E+S+1 .. T-1
        phase   graph            query       planning      answer
        input   (s_j, e_j, d_j)  (u, _, v)   (_, _, _)     (_, _, _)
        flag    3D               3D+1        3D+2          3D+3
        target  0                0           0             (w_{i-1}, e_i, w_i)
        mask    0                0           0             1

    with the path w_0 = u, w_1, ..., w_P = v and e_i the label of the edge from w_{i-1} to
    w_i. The answer phase's length tells the model P. The size knob is the number of nodes
    (``min_nodes..max_nodes``, default 3..10); ``eval_sizes`` go to 3 times
    ``max_nodes``.
    """

    max_path: int = 10
    planning_steps: int = 10

    name: ClassVar[str] = "shortest_path"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_path > self.max_nodes - 1:
            raise ValueError(f"ShortestPathTask: min_path={self.min_path} edges is longer than any "
                             f"path in a graph of max_nodes={self.max_nodes} nodes (at most "
                             f"{self.max_nodes - 1}); lower min_path or raise max_nodes")

    @property
    def max_steps(self) -> int:
        return self.max_edges + 1 + self.planning_steps + min(self.max_path, self.max_nodes - 1)

    def check_drawable(self) -> None:
        """Raise `ValueError` (naming min_path) if a few sequences cannot be drawn: pairs with
        a unique shortest path of ``min_path`` edges or more may be too rare in these graphs
        for `_draw` (``min_path=9`` on graphs of up to 10 nodes needs a chain of all of them)."""
        self.sample(2, torch.Generator().manual_seed(0))

    def _draw(self, generator):
        for _ in range(_MAX_GRAPHS):
            graph = self._graph(generator)
            episode = self._episode(graph, generator)
            if episode is not None:
                return graph, *episode
        raise ValueError(f"ShortestPathTask: no pair with a unique shortest path of "
                         f"{self.min_path}..{self.max_path} edges in {_MAX_GRAPHS} graphs; "
                         f"lower min_path")

    def _episode(self, graph, generator):
        """The query and answer of a pair drawn as the docstring says; None if none fits."""
        n = graph.labels.numel()
        leaving = [[] for _ in range(n)]
        for s, e, d in sorted(zip(graph.source.tolist(), graph.edge.tolist(),
                                  graph.destination.tolist())):
            leaving[s].append((e, d))
        pairs = []  # (u, v, [(edge label, node) along the path])
        for u in range(n):
            for v, path in _unique_shortest_paths(leaving, u).items():
                if self.min_path <= len(path) <= self.max_path:
                    pairs.append((u, v, path))
        if not pairs:
            return None
        u, v, path = pairs[int(torch.randint(len(pairs), (1,), generator=generator))]
        names = graph.labels.tolist()
        answer, node = [], u
        for e, d in path:
            answer.append((names[node], e, names[d]))
            node = d
        return [(names[u], _BLANK, names[v])], answer


def _unique_shortest_paths(leaving: list[list[tuple[int, int]]], start: int
                           ) -> dict[int, list[tuple[int, int]]]:
    """Breadth-first search from ``start``: for each node v != start joined to it by exactly
    one shortest path, that path as its (edge label, node) steps."""
    parent = {start: None}  # node -> (previous node, edge label) on its shortest path
    count = {start: 1}  # shortest paths to a node, capped at 2
    depth = {start: 0}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for e, d in leaving[node]:
            if d not in depth:
                depth[d], count[d], parent[d] = depth[node] + 1, count[node], (node, e)
                queue.append(d)
            elif depth[d] == depth[node] + 1:
                count[d] = min(2, count[d] + count[node])
    paths = {}
    for v in depth:
        if v == start or count[v] != 1:
            continue
        steps, node = [], v
        while node != start:
            previous, e = parent[node]
            steps.append((e, node))
            node = previous
        paths[v] = steps[::-1]
    return paths

