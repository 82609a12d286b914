"""Tests of torch_ntm.graph_tasks: the random graphs against a distance computation of their own,
the episode layout read back with plain loops from the docstrings, traversals followed by hand,
shortest paths against a brute-force enumeration of paths, the scores, and a tiny training run.

The batches are decoded here without the module's encoder: a field is ``digits`` groups of 10
units, most significant digit first, blank when all zero.
"""

import json
import math

import pytest
import torch

from torch_ntm.cli import main
from torch_ntm.graph_tasks import (
    ANSWER,
    GRAPH,
    PLAN,
    QUERY,
    Graph,
    ShortestPathTask,
    TraversalTask,
    _encode,
    _unique_shortest_paths,
    random_graph,
)
from torch_ntm.metrics import objective
from torch_ntm.presets import default_preset, resolve_config
from torch_ntm.runlog import read_metrics
from torch_ntm.tasks import TASKS, make_task

# small sizes; one digit (labels 0..9) so that a field is 10 units; unequal batch sizes below
SMALL_TRAVERSAL = TraversalTask(min_nodes=3, max_nodes=7, min_out=1, max_out=3, digits=1,
                                min_path=1, max_path=5, planning_steps=2)
SMALL_SHORTEST = ShortestPathTask(min_nodes=3, max_nodes=8, digits=1, planning_steps=3)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _field(units, digits):
    """One field's units -> its label, or None if blank; every group must be one-hot."""
    if not units.any():
        return None
    value = 0
    for d in range(digits):
        group = units[10 * d: 10 * (d + 1)]
        assert sorted(group.tolist()) == [0.0] * 9 + [1.0], group  # exactly one-hot
        value = value * 10 + int(group.argmax())
    return value


def _triple(vector, digits):
    D = 10 * digits
    return tuple(_field(vector[f * D: (f + 1) * D], digits) for f in range(3))


def _episode(task, batch, b):
    """Sequence ``b`` of a batch read back by its flags: phase per step, the graph's triples,
    the query's triples, the number of planning steps and the answer's triples. Checks the flags
    say one phase per step, in the documented order, then padding."""
    D3 = 3 * 10 * task.digits
    flags = batch.inputs[:, b, D3:]  # (T, 4)
    phases = []
    for t in range(flags.shape[0]):
        on = flags[t].nonzero().flatten().tolist()
        assert flags[t].sum() <= 1 and len(on) <= 1
        phases.append(on[0] if on else None)
    length = len([p for p in phases if p is not None])
    assert all(p is not None for p in phases[:length]) and phases[length:] == [None] * (
        len(phases) - length)  # padding only at the end
    assert phases[:length] == sorted(phases[:length])  # graph, query, planning, answer
    steps = {p: [t for t in range(length) if phases[t] == p] for p in (GRAPH, QUERY, PLAN, ANSWER)}
    mask = batch.mask[:, b]
    assert mask.tolist() == [p == ANSWER for p in phases]  # the loss on the answer steps only
    assert not batch.targets[~mask, b].any()
    assert not batch.inputs[length:, b].any()
    for t in steps[PLAN] + steps[ANSWER]:
        assert not batch.inputs[t, b, :D3].any()  # no data while planning or answering
    graph = [_triple(batch.inputs[t, b], task.digits) for t in steps[GRAPH]]
    query = [_triple(batch.inputs[t, b], task.digits) for t in steps[QUERY]]
    answer = [_triple(batch.targets[t, b], task.digits) for t in steps[ANSWER]]
    assert all(None not in triple for triple in graph + answer)
    return graph, query, len(steps[PLAN]), answer


def _episodes(task, batch_size, seed):
    batch = task.sample(batch_size, _gen(seed))
    return batch, [_episode(task, batch, b) for b in range(batch_size)]


# ---------------------------------------------------------------- the graphs


def test_random_graph_joins_each_node_to_its_nearest_nodes_with_distinct_labels():
    for seed in range(20):
        n = 3 + seed % 6
        graph = random_graph(n, 1, 3, 10, _gen(seed))
        points = graph.points.tolist()
        assert len(set(graph.labels.tolist())) == n and all(0 <= x < 10 for x in graph.labels)
        for node in range(n):
            ends = [d for s, d in zip(graph.source.tolist(), graph.destination.tolist())
                    if s == node]
            labels = [e for s, e in zip(graph.source.tolist(), graph.edge.tolist()) if s == node]
            assert 1 <= len(ends) <= min(3, n - 1) and len(set(labels)) == len(labels)
            others = sorted((math.dist(points[node], points[j]), j) for j in range(n)
                            if j != node)
            assert sorted(ends) == sorted(j for _, j in others[: len(ends)])


def test_random_graph_shows_its_edges_in_random_order_and_caps_k_at_n_minus_1():
    graph = random_graph(2, 3, 3, 10, _gen(0))  # two nodes: one edge each way
    assert sorted(zip(graph.source.tolist(), graph.destination.tolist())) == [(0, 1), (1, 0)]
    sources = [random_graph(6, 2, 2, 10, _gen(s)).source.tolist() for s in range(5)]
    assert any(s != sorted(s) for s in sources)


# ---------------------------------------------------------------- the layout


def test_labels_are_decimal_digits_most_significant_first():
    code = _encode(torch.tensor([[47, -1, 5]]), 2)[0]  # the docstring's example, a blank, 05
    assert code.shape == (60,)
    assert code.nonzero().flatten().tolist() == [4, 10 + 7, 40 + 0, 40 + 10 + 5]


@pytest.mark.parametrize("task", [SMALL_TRAVERSAL, SMALL_SHORTEST], ids=["traversal", "shortest"])
def test_shapes_and_sizes_as_documented(task):
    batch = task.sample(5, _gen(1))
    T = batch.mask.shape[0]
    assert batch.inputs.shape == (T, 5, 34) and batch.targets.shape == (T, 5, 30)
    assert batch.inputs.dtype == batch.targets.dtype == torch.float32
    assert batch.mask.dtype == torch.bool
    first = task.sample(5, _gen(1), batch_first=True)
    assert torch.equal(first.inputs, batch.inputs.transpose(0, 1))
    default = make_task(task.name)
    assert (default.input_size, default.output_size, default.label_groups) == (64, 60, 6)
    assert default.loss == "cross_entropy" and not default.label_task
    assert default.eval_sizes == (10, 15, 20, 30) and default.train_size == 10
    assert default.size_name == "nodes"


def test_traversal_layout_and_answer_follow_the_query_through_the_shown_graph():
    for seed in range(3):
        _, episodes = _episodes(SMALL_TRAVERSAL, 7, seed)
        for graph, query, planning, answer in episodes:
            P = len(answer)
            assert 1 <= P <= 5 and len(query) == P and planning == 2
            assert query[0][0] is not None and query[0][2] is None
            assert all(q[0] is None and q[2] is None for q in query[1:])
            node = query[0][0]
            for (_, label, _), triple in zip(query, answer):
                # followed by hand: the one shown edge leaving node with this label
                matches = [t for t in graph if t[0] == node and t[1] == label]
                assert len(matches) == 1 and triple == matches[0]
                node = triple[2]
            sources = {s for s, _, _ in graph}
            assert 3 <= len(sources) <= 7  # every node has an edge leaving it


def test_traversal_of_a_hand_built_cycle():
    # labels 7 -> 3 -> 5 -> 7 (edge labels 4, 6, 9): any walk is fixed by its start
    graph = Graph(torch.zeros(3, 2), torch.tensor([7, 3, 5]), torch.tensor([0, 1, 2]),
                  torch.tensor([4, 6, 9]), torch.tensor([1, 2, 0]))
    task = TraversalTask(digits=1, min_path=4, max_path=4)
    expected = {7: [(7, 4, 3), (3, 6, 5), (5, 9, 7), (7, 4, 3)],
                3: [(3, 6, 5), (5, 9, 7), (7, 4, 3), (3, 6, 5)],
                5: [(5, 9, 7), (7, 4, 3), (3, 6, 5), (5, 9, 7)]}
    seen = set()
    for seed in range(30):
        query, answer = task._episode(graph, _gen(seed))
        start = query[0][0]
        assert answer == expected[start]
        assert query == [(start, answer[0][1], -1)] + [(-1, t[1], -1) for t in answer[1:]]
        seen.add(start)
    assert seen == {7, 3, 5}


def _simple_paths(edges, u, v, limit):
    """Every simple path (as triples) from u to v in the triples ``edges``, by brute force."""
    paths = []

    def extend(node, path, visited):
        if node == v and path:
            paths.append(list(path))
            return
        if len(path) == limit:
            return
        for s, e, d in edges:
            if s == node and d not in visited:
                extend(d, path + [(s, e, d)], visited | {d})

    extend(u, [], {u})
    return paths


def test_shortest_path_is_the_only_shortest_path_by_brute_force():
    for seed in range(3):
        _, episodes = _episodes(SMALL_SHORTEST, 6, seed)
        for graph, query, planning, answer in episodes:
            assert len(query) == 1 and planning == 3
            u, blank, v = query[0]
            assert blank is None and u != v
            paths = _simple_paths(graph, u, v, len({s for s, _, _ in graph}))
            assert paths  # a pair with no path is never asked
            shortest = min(len(p) for p in paths)
            assert [p for p in paths if len(p) == shortest] == [answer]


def test_shortest_path_never_asks_an_unreachable_or_ambiguous_pair():
    # 0 -> 1 -> 3 and 0 -> 2 -> 3: two shortest paths from 0 to 3; nothing enters node 4
    source, edge, dest = zip((0, 1, 1), (0, 2, 2), (1, 3, 3), (2, 4, 3), (3, 5, 0), (4, 6, 0))
    graph = Graph(torch.zeros(5, 2), torch.tensor([10, 11, 12, 13, 14]), torch.tensor(source),
                  torch.tensor(edge), torch.tensor(dest))
    leaving = [[(e, d) for s, e, d in zip(source, edge, dest) if s == n] for n in range(5)]
    assert _unique_shortest_paths(leaving, 0) == {1: [(1, 1)], 2: [(2, 2)]}
    assert _unique_shortest_paths(leaving, 4) == {0: [(6, 0)], 1: [(6, 0), (1, 1)],
                                                 2: [(6, 0), (2, 2)]}
    task = ShortestPathTask()
    asked = set()
    for seed in range(200):
        query, answer = task._episode(graph, _gen(seed))
        u, _, v = query[0]
        asked.add((u, v))
        assert answer[0][0] == u and answer[-1][2] == v
    assert (10, 13) not in asked and (14, 13) not in asked  # two shortest paths
    assert all(v != 14 for _, v in asked)  # 4 cannot be reached
    assert (13, 10) in asked and (14, 12) in asked


def test_every_answer_triple_is_an_edge_and_answers_chain():
    for task in (SMALL_TRAVERSAL, SMALL_SHORTEST, make_task("traversal"),
                 make_task("shortest_path")):
        _, episodes = _episodes(task, 8, 5)
        for graph, _, _, answer in episodes:
            assert all(triple in graph for triple in answer)
            assert all(a[2] == b[0] for a, b in zip(answer, answer[1:]))


def test_minimal_graphs_of_two_nodes():
    for task in (SMALL_TRAVERSAL.with_size(2), SMALL_SHORTEST.with_size(2)):
        _, episodes = _episodes(task, 4, 0)
        for graph, query, _, answer in episodes:
            (a, e1, b), (b2, e2, a2) = sorted(graph)
            assert (b2, a2) == (b, a)
            edges = {a: (a, e1, b), b: (b, e2, a)}
            node = query[0][0]
            for triple in answer:  # alternates between the two nodes
                assert triple == edges[node]
                node = triple[2]
    with pytest.raises(ValueError, match="min_path=2 edges is longer than any path in a graph "
                                         "of max_nodes=2 nodes"):
        ShortestPathTask(min_nodes=2, max_nodes=2, min_path=2)
    # three nodes each joined to both others: every shortest path is one edge
    with pytest.raises(ValueError, match="no pair with a unique shortest path of 2..10 edges"):
        ShortestPathTask(min_nodes=3, max_nodes=3, min_out=2, max_out=2, min_path=2).sample(
            1, _gen(0))


def test_sizes_and_the_curriculum():
    task = make_task("traversal")
    for size in (2, 4, 13):
        _, episodes = _episodes(task.with_size(size), 3, size)
        assert all(len({s for s, _, _ in g}) == size for g, _, _, _ in episodes)
    step = task.up_to(4)
    assert (step.min_nodes, step.max_nodes) == (3, 4) and task.up_to(10) == task
    _, episodes = _episodes(step, 20, 0)
    assert {len({s for s, _, _ in g}) for g, _, _, _ in episodes} == {3, 4}


def test_seeded_generator_gives_the_same_batch():
    for task in (SMALL_TRAVERSAL, SMALL_SHORTEST):
        a, b = task.sample(4, _gen(3)), task.sample(4, _gen(3))
        c = task.sample(4, _gen(4))
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert a.inputs.shape != c.inputs.shape or not torch.equal(a.inputs, c.inputs)


@pytest.mark.parametrize("params, match", [
    ({"min_nodes": 1}, "min_nodes must be an integer >= 2"),
    ({"min_nodes": 6, "max_nodes": 5}, "min_nodes=6 must be <= max_nodes=5"),
    ({"digits": 1, "max_nodes": 11}, "max_nodes=11 needs more distinct labels"),
    ({"digits": 1, "max_out": 11, "max_nodes": 5}, "max_out=11"),
    ({"min_path": 0}, "min_path must be an integer >= 1"),
    ({"planning_steps": -1}, "planning_steps must be an integer >= 0"),
])
def test_invalid_parameters_are_refused(params, match):
    for name in ("traversal", "shortest_path"):
        with pytest.raises(ValueError, match=match):
            make_task(name, **params)


# ---------------------------------------------------------------- scores


def test_queries_right_counts_queries_with_every_answer_triple_right():
    task = SMALL_TRAVERSAL
    batch = task.sample(4, _gen(2))
    logits = (batch.targets * 2 - 1) * 5.0  # the targets' digits most likely
    scores = task.extra_scores(logits, batch.targets, batch.mask)
    assert scores == {"queries_right": 1.0, "triples_right": 1.0}
    answers = batch.mask.sum(0)  # answer triples per query
    t = int(batch.mask[:, 0].nonzero()[0])
    logits[t, 0, 10:20] = logits[t, 0, 10:20].roll(1)  # one wrong edge digit in query 0
    logits[:, 1] = -logits[:, 1]  # query 1 all wrong
    logits[~batch.mask] = 0.0  # padding and unscored steps do not count
    scores = task.extra_scores(logits, batch.targets, batch.mask)
    assert scores["queries_right"] == 0.5
    expected = (1 - 1 / answers[0].item() + 0 + 1 + 1) / 4
    assert math.isclose(scores["triples_right"], expected)
    score = objective(task.loss, task.label_groups)
    wrong = score.errors(logits, batch.targets, batch.mask)
    assert wrong.tolist() == [1.0, answers[1].item(), 0.0, 0.0]  # wrong triples per query


# ---------------------------------------------------------------- registry and presets


def test_registered_with_the_dnc_as_default_and_baselines():
    assert TASKS["traversal"] is TraversalTask and TASKS["shortest_path"] is ShortestPathTask
    for name in ("traversal", "shortest_path"):
        assert default_preset(name) == "dnc"
        dnc, lstm, ntm = (resolve_config(name, p) for p in ("dnc", "lstm", "ntm"))
        assert (dnc.model, lstm.model, ntm.model) == ("dnc", "lstm", "ntm")
        for config in (dnc, lstm, ntm):
            assert config.optim.optimizer == "adam" and config.optim.lr == 1e-3
            assert config.optim.clip_norm > 0
            assert config.stabilise.curriculum_start == 0  # all sizes at once
        assert resolve_config(name).preset == "dnc"


@pytest.mark.slow
def test_ntm_train_traversal_loss_falls_and_evaluate_reports_queries_right(tmp_path, capsys):
    run = tmp_path / "run"
    tiny = [f"--set={key}" for key in (
        "max_sequences=3200", "eval_every=200", "log_every=20", "lr=3e-3", "eval_sequences=16",
        "task.digits=1", "task.min_nodes=4", "task.max_nodes=4", "task.min_path=2",
        "task.max_path=2", "controller_size=32", "memory_size=16", "memory_width=8",
        "read_heads=1", "eval_memory_size=0", "curriculum_start=0")]
    assert main(["train", "traversal", "--out", str(run), "--no-plots", "--no-progress",
                 *tiny]) == 0
    rows = read_metrics(run / "metrics.csv", "train")
    costs = [float(row["cost_bits"]) for row in rows]
    assert len(costs) == 10 and costs[-1] < 0.9 * costs[0], costs  # 19.7 -> 15.7 when written
    val = read_metrics(run / "metrics.csv", "val")[-1]
    assert 0.0 <= float(val["queries_right"]) <= float(val["triples_right"]) <= 1.0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--json", "--sequences", "20"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [row["nodes"] for row in table] == [4, 6, 8]
    assert all({"queries_right", "triples_right"} <= set(row) for row in table)
