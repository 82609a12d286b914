"""The tasks' paper-level criteria (`torch_ntm.criteria`) and ``ntm sweep --seeds A-B
--criterion``'s arguments."""

import argparse

import pytest

from torch_ntm import pretrained
from torch_ntm.checkpoint import load_checkpoint
from torch_ntm.cli import _seed_range, main
from torch_ntm.criteria import CRITERIA, Criterion, format_criteria, measure
from torch_ntm.evaluate import evaluate_sizes


def test_a_criterion_is_the_mean_over_sets_of_the_worst_size():
    run = pretrained.path("associative_recall")
    criterion = Criterion("perfect at 6 and 12 items", (6, 12), "perfect", at_least=0.9)
    got = measure(run, criterion, sets=(1, 2), sequences=50)
    ckpt = load_checkpoint(run)
    model = ckpt.model(evaluation=True).eval()
    expected = [min(row["perfect"] for row in evaluate_sizes(model, ckpt.task(), (6, 12), 50,
                                                             seed=seed)) for seed in (1, 2)]
    assert got["sets"] == expected
    assert got["mean"] == pytest.approx(sum(expected) / 2)
    assert (got["min"], got["max"]) == (min(expected), max(expected))
    assert got["met"] == (got["mean"] >= 0.9)


def test_bounds_from_above_and_below():
    low = Criterion("x", (1,), "bit_errors", at_most=1.0)
    high = Criterion("y", (1,), "perfect", at_least=0.9)
    assert low.met(1.0) and not low.met(1.01) and low.worst([0.5, 2.0]) == 2.0
    assert high.met(0.9) and not high.met(0.89) and high.worst([0.95, 0.8]) == 0.8
    assert (low.bound, high.bound) == ("<= 1", ">= 0.9")


def test_the_table_counts_the_seeds_that_meet_it():
    runs = {0: pretrained.path("copy"), 1: pretrained.path("copy")}
    table = format_criteria("copy", runs, sets=(1,), sequences=4)
    assert table.splitlines()[0].startswith("wrong bits per sequence at L = 120 (<= 0)")
    assert len(table.splitlines()) == 4 and table.endswith("of 2 seeds meet it")


def test_repeat_copy_criteria_evaluate_with_their_repeats():
    criteria = CRITERIA["repeat_copy"]
    assert [(c.sizes, c.repeats) for c in criteria] == [((20,), 10), ((10,), 20)]
    got = measure(pretrained.path("repeat_copy"), criteria[1], sets=(1,), sequences=4)
    assert got["sets"][0] >= 0 and len(got["sets"]) == 1


def test_the_ngrams_criterion_is_the_cost_relative_to_the_bayes_optimal():
    (criterion,) = CRITERIA["ngrams"]
    run = pretrained.path("ngrams")
    got = measure(run, criterion, sets=(1,), sequences=8)
    ckpt = load_checkpoint(run)
    (row,) = evaluate_sizes(ckpt.model(evaluation=True).eval(), ckpt.task(), (200,), 8, seed=1)
    assert got["sets"] == [row["cost_bits"] / row["reference_cost_bits"] - 1]
    assert got["met"] == (got["sets"][0] <= 0.01)


def test_a_figure_without_a_bound_is_reported_not_counted():
    sort = CRITERIA["priority_sort"]
    assert [(c.metric, c.bound) for c in sort] == [("cost_bits", "<= 18"), ("perfect", "reported")]
    assert sort[1].met(0.3) is None and sort[1].worst([0.2, 0.5]) == 0.2
    runs = {0: pretrained.path("priority_sort")}
    table = format_criteria("priority_sort", runs, sets=(1,), sequences=4).splitlines()
    assert table[0].startswith("cost in bits per sequence at 20 inputs (<= 18)")
    assert table[2] == "  1 of 1 seeds meet it" or table[2] == "  0 of 1 seeds meet it"
    assert table[3].startswith("perfect at 20 inputs (reported)")
    assert len(table) == 5 and not table[4].endswith(("meets it", "does not"))


def test_criteria_at_the_same_sizes_share_one_evaluation_of_a_run(monkeypatch):
    """Priority sort's cost and perfect fraction are both read at 20 inputs: one evaluation."""
    import torch_ntm.criteria as criteria

    calls = []
    real = criteria._evaluations
    monkeypatch.setattr(criteria, "_evaluations",
                        lambda *args: calls.append(args) or real(*args))
    format_criteria("priority_sort", {0: pretrained.path("priority_sort")}, sets=(1,),
                    sequences=4)
    assert len(calls) == 1


def test_seed_ranges_and_counts():
    assert _seed_range("5") == (None, 5) and _seed_range("0-4") == (0, 5)
    assert _seed_range("7-7") == (7, 1)
    assert _seed_range("0") == (None, 0)  # refused by the sweep: "--seeds must be >= 1"
    for bad in ("4-0", "a-b", "1-", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="a range A-B of seeds"):
            _seed_range(bad)


def test_criterion_of_a_task_without_one_is_refused(capsys, tmp_path):
    assert main(["sweep", "shortest_path", "--seeds", "0-1", "--criterion", "--out",
                 str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "--criterion: no criterion for shortest_path; tasks with one: copy, repeat_copy" in err
    assert not (tmp_path / "s").exists()
    assert main(["sweep", "copy", "--seeds", "0-1", "--first-seed", "3", "--out",
                 str(tmp_path / "s")]) == 2
    assert "--seeds A-B names the first seed; drop --first-seed" in capsys.readouterr().err
    assert main(["sweep", "copy", "--seeds", "0-1", "--criterion", "--grid", "lr=1e-3,3e-3",
                 "--out", str(tmp_path / "s")]) == 2
    assert "--criterion: not with --grid" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
