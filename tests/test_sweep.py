"""Seed sweeps: the report from hand-written run directories, grids of settings, and real tiny
sweeps (in processes, and on a local Ray instance where Ray is installed)."""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torch_ntm.checkpoint import load_checkpoint
from torch_ntm.cli import main
from torch_ntm.config import TrainConfig
from torch_ntm.presets import resolve_config
from torch_ntm.runlog import read_metrics
from torch_ntm.sweep import (
    GridPoint,
    format_grid_report,
    format_report,
    parse_grid,
    summarise,
)

HEADER = "step,sequences,elapsed_s,split,cost_bits,bit_errors,perfect"

# (step, sequences, elapsed_s, split, cost_bits, bit_errors, perfect) per row; train rows as the
# trainer writes them (perfect empty).
RUNS = {
    "seed-0": dict(nan_steps=0, rows=[  # converges at 200 sequences, stays converged
        (5, 80, 0.8, "train", 9.0, 4.0, ""), (6, 100, 1.0, "val", 8.0, 3.5, 0.0),
        (12, 200, 2.0, "val", 0.1, 0.0, 1.0), (18, 300, 3.0, "val", 0.2, 0.25, 0.9)]),
    "seed-1": dict(nan_steps=0, rows=[  # never converges
        (6, 100, 1.0, "val", 9.0, 5.0, 0.0), (12, 200, 2.0, "val", 5.0, 2.0, 0.1),
        (18, 300, 3.0, "val", 4.0, 1.5, 0.2)]),
    "seed-2": dict(nan_steps=0, rows=[  # converges at 200, collapses at 300, recovers
        (6, 100, 1.5, "val", 7.0, 2.0, 0.0), (12, 200, 4.0, "val", 0.1, 0.0, 1.0),
        (18, 300, 6.0, "val", 6.0, 3.0, 0.1), (24, 400, 8.0, "val", 0.1, 0.0, 1.0)]),
    "seed-3": dict(nan_steps=3, rows=[  # converges at 100; one training row with a NaN cost
        (6, 100, 0.5, "val", 0.1, 0.0, 1.0), (9, 150, 0.7, "train", "nan", 8.0, ""),
        (12, 200, 1.0, "val", 0.1, 0.0, 1.0)]),
    "seed-4": dict(nan_steps=0, rows=[  # converges at 100, falls apart at 200 and is rolled back
        (6, 100, 1.0, "val", 0.1, 0.0, 1.0), (12, 200, 2.0, "val", 30.0, 12.0, 0.0),
        (12, 200, 2.0, "rollback", 0.1, 0.0, 1.0), (18, 300, 3.0, "val", 0.1, 0.0, 1.0)]),
}


def write_run(folder, nan_steps, rows, max_sequences=None):
    folder.mkdir(parents=True)
    lines = [HEADER] + [",".join(str(v) for v in row) for row in rows]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    seed = int(folder.name.split("-")[1])
    sequences = rows[-1][1]
    record = {"format": "torch-ntm-checkpoint", "version": 1, "sequences": sequences,
              "config": {"seed": seed, "max_sequences": max_sequences or sequences},
              "extra": {"nan_steps": nan_steps, "streak": 0}}
    (folder / "checkpoint.json").write_text(json.dumps(record))
    return folder


@pytest.fixture
def runs(tmp_path):
    return {name: write_run(tmp_path / name, **spec) for name, spec in RUNS.items()}


def test_summary_of_four_kinds_of_seed(runs):
    summary = summarise(list(runs.values()))
    rows = [{k: v for k, v in r.items() if k != "run_dir"} for r in summary.pop("seeds")]
    common = {"complete": True, "collapsed": False, "rolled_back": 0, "diverged": False,
              "nan_steps": 0}
    assert rows == [
        {**common, "seed": 0, "converged": True, "converged_sequences": 200, "converged_s": 2.0,
         "final_bit_errors": 0.25},
        {**common, "seed": 1, "converged": False, "converged_sequences": None,
         "converged_s": None, "final_bit_errors": 1.5},
        {**common, "seed": 2, "converged": True, "converged_sequences": 200, "converged_s": 4.0,
         "collapsed": True, "final_bit_errors": 0.0},
        {**common, "seed": 3, "converged": True, "converged_sequences": 100, "converged_s": 0.5,
         "diverged": True, "nan_steps": 3, "final_bit_errors": 0.0},
        {**common, "seed": 4, "converged": True, "converged_sequences": 100, "converged_s": 1.0,
         "rolled_back": 1, "final_bit_errors": 0.0},
    ]
    assert summary == {
        "threshold": 0.0, "collapse_bit_errors": 1.0, "num_seeds": 5, "num_converged": 4,
        "median_converged_s": 1.5, "median_converged_sequences": 150,
        "max_over_median_s": pytest.approx(4 / 1.5), "num_collapsed": 1, "total_rolled_back": 1,
        "num_diverged": 1, "total_nan_steps": 3, "goal_met": False,
    }


def test_a_collapse_counts_unless_the_trainer_rolls_it_back_at_once(tmp_path):
    caught = summarise([write_run(tmp_path / "seed-0", 0, RUNS["seed-4"]["rows"])])
    assert caught["goal_met"] and caught["total_rolled_back"] == 1
    late = RUNS["seed-4"]["rows"] + [(24, 400, 4.0, "val", 9.0, 4.0, 0.0)]  # falls apart at the end
    (row,) = summarise([write_run(tmp_path / "seed-1", 0, late)])["seeds"]
    assert row["collapsed"] and row["rolled_back"] == 1 and row["final_bit_errors"] == 4.0
    gap = late + [(30, 500, 5.0, "val", 0.1, 0.0, 1.0), (30, 500, 5.0, "rollback", 0, 0, 1)]
    (row,) = summarise([write_run(tmp_path / "seed-2", 0, gap)])["seeds"]
    assert row["collapsed"] and row["rolled_back"] == 2  # the rollback came a validation late


def test_goal_is_met_only_by_reliable_seeds_within_three_times_the_median(runs, tmp_path):
    assert summarise([runs["seed-0"]])["goal_met"]
    for name in ("seed-1", "seed-2", "seed-3"):  # no convergence, a collapse, NaN
        assert not summarise([runs["seed-0"], runs[name]])["goal_met"], name
    assert summarise([runs["seed-0"], runs["seed-4"]])["goal_met"]  # rolled back at once
    slow = write_run(tmp_path / "seed-9", 0, [(70, 700, 7.0, "val", 0.1, 0.0, 1.0)])
    fast = [runs["seed-0"], runs["seed-0"]]  # 2.0 s each
    two = summarise([*fast, slow])  # median 2 s, slowest 7 s: 3.5x
    assert two["max_over_median_s"] == 3.5 and not two["goal_met"]
    three = summarise([*fast, slow, slow])  # median 4.5 s: 7 / 4.5 < 3
    assert three["max_over_median_s"] == pytest.approx(7 / 4.5) and three["goal_met"]


def test_threshold_and_incomplete_or_missing_runs(runs, tmp_path):
    (row,) = summarise([runs["seed-1"]], threshold=1.5)["seeds"]
    assert row["converged"] and row["converged_sequences"] == 300 and row["converged_s"] == 3.0
    short = write_run(tmp_path / "seed-5", 0, RUNS["seed-0"]["rows"], max_sequences=1000)
    summary = summarise([short, tmp_path / "seed-7"])
    first, missing = summary["seeds"]
    assert first["converged"] and not first["complete"]
    assert missing == {"seed": 7, "run_dir": str(tmp_path / "seed-7"), "complete": False,
                       "converged": False, "converged_sequences": None, "converged_s": None,
                       "collapsed": False, "rolled_back": 0, "diverged": False, "nan_steps": 0,
                       "final_bit_errors": None}
    assert summary["num_converged"] == 1 and not summary["goal_met"]


def test_markdown_report(runs):
    text = format_report(summarise(list(runs.values())), "Sweep: copy")
    assert text.splitlines() == [
        "# Sweep: copy",
        "",
        "| seed | converged | sequences | time (s) | collapsed | rolled back | diverged "
        "| NaN steps | final bit errors |",
        "|---:|:---:|---:|---:|:---:|---:|:---:|---:|---:|",
        "| 0 | yes | 200 | 2.0 | no | 0 | no | 0 | 0.25 |",
        "| 1 | no | - | - | no | 0 | no | 0 | 1.5 |",
        "| 2 | yes | 200 | 4.0 | yes | 0 | no | 0 | 0 |",
        "| 3 | yes | 100 | 0.5 | no | 0 | yes | 3 | 0 |",
        "| 4 | yes | 100 | 1.0 | no | 1 | no | 0 | 0 |",
        "",
        "- converged: 4/5 (validation bit errors per sequence <= 0)",
        "- median time to converge: 1.5 s (150 sequences)",
        "- slowest / median time: 2.67",
        "- collapsed after converging (validation bit errors > 1, not rolled back): 1",
        "- rollbacks to the best weights: 1",
        "- diverged (non-finite cost): 1; NaN steps: 3",
        "- goal (all converge within 3x the median time, none collapses, no NaN): not met",
    ]


def test_a_preset_without_a_stop_rule_is_not_judged_by_reaching_zero_bit_errors(runs):
    # n-grams has no bit-exact answer: "converged 0/5, goal not met" above its criterion's
    # "5 of 5 seeds meet it" read as a failure. Its stop_bit_errors is -1.
    judged, unjudged = summarise([runs["seed-0"]]), summarise([runs["seed-0"]], -1.0)
    assert judged["goal_met"] is True and unjudged["goal_met"] is None
    # The seeds' rows are those of a threshold of 0.
    assert unjudged["seeds"] == judged["seeds"] and unjudged["threshold"] == 0
    last = format_report(unjudged).splitlines()[-1]
    assert last == ("- goal: not judged here: the preset trains a fixed budget rather than to 0 "
                    "bit errors; the task's criterion (--criterion) judges each seed")
    assert format_report(judged).endswith("no NaN): met")
    # ... and in a grid's table.
    points = [{"point": "lr=0.1", **unjudged}, {"point": "lr=0.2", **judged}]
    rows = format_grid_report({"title": "Sweep: ngrams", "points": points}).splitlines()[4:6]
    assert [row.rsplit("|", 2)[1].strip() for row in rows] == ["not judged", "met"]


def test_a_grid_is_every_combination_of_its_values_the_first_key_outermost():
    assert parse_grid([]) == [GridPoint("", ())]  # no grid: one point, the sweep's folder
    assert parse_grid(["lr=1e-3, 3e-3", "batch_size=16,32"]) == [
        GridPoint("lr=1e-3,batch_size=16", ("lr=1e-3", "batch_size=16")),
        GridPoint("lr=1e-3,batch_size=32", ("lr=1e-3", "batch_size=32")),
        GridPoint("lr=3e-3,batch_size=16", ("lr=3e-3", "batch_size=16")),
        GridPoint("lr=3e-3,batch_size=32", ("lr=3e-3", "batch_size=32")),
    ]
    # Semicolons separate values that hold commas themselves.
    assert [p.overrides for p in parse_grid(["eval_sizes=40,120;80"])] == [
        ("eval_sizes=40,120",), ("eval_sizes=80",)]


def test_markdown_report_of_a_grid(runs):
    names = {"lr=0.1": ["seed-0", "seed-4"], "lr=0.2": ["seed-1", "seed-2", "seed-3"]}
    points = [{"point": point, **summarise([runs[n] for n in seeds])}
              for point, seeds in names.items()]
    text = format_grid_report({"title": "Sweep: copy, 2 grid points", "points": points})
    lines = text.splitlines()
    assert lines[:6] == [
        "# Sweep: copy, 2 grid points",
        "",
        "| grid point | converged | median time (s) | median sequences | slowest / median "
        "| collapsed | rolled back | diverged | NaN steps | goal |",
        "|:---|:---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
        "| lr=0.1 | 2/2 | 1.5 | 150 | 1.33 | 0 | 1 | 0 | 0 | met |",
        "| lr=0.2 | 2/3 | 2.2 | 150 | 1.78 | 1 | 0 | 1 | 3 | not met |",
    ]
    # Then each point's own report, as a sweep without a grid has it.
    assert "\n".join(lines[6:]) == "\n".join(
        f"\n## {p['point']}\n\n{format_report(p)}" for p in points)


TINY = ["--set", "task.max_length=2", "--set", "task.width=3", "--set", "memory_size=8",
        "--set", "memory_width=4", "--set", "controller_size=8", "--set", "engine=auto",
        "--set", "eval_every=5", "--set", "eval_sequences=16"]


@pytest.mark.slow
def test_a_tiny_sweep_through_the_cli(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "copy", "--seeds", "2", "--jobs", "2", "--sequences", "160",
                 "--first-seed", "4", "--out", str(out), *TINY]) == 0
    printed = capsys.readouterr().out
    assert (out / "report.md").read_text() in printed + "\n"
    report = json.loads((out / "report.json").read_text())
    assert report["num_seeds"] == 2 and report["exit_codes"] == {"4": 0, "5": 0}
    assert [r["seed"] for r in report["seeds"]] == [4, 5]
    for seed in (4, 5):
        run = out / f"seed-{seed}"
        assert "stopped (budget) after 160 sequences" in (run / "train.log").read_text()
        config = TrainConfig.from_dict(json.loads((run / "config.json").read_text()))
        assert (config.seed, config.max_sequences, config.evaluation.stop_bit_errors,
                config.threads) == (seed, 160, -1.0, 1)
    assert all(r["complete"] for r in report["seeds"])
    table = [line for line in (out / "report.md").read_text().splitlines()
             if line.startswith("| ") and line[2].isdigit()]
    assert len(table) == 2
    # The same seeds with other settings would overwrite the runs: refused.
    assert main(["sweep", "copy", "--seeds", "1", "--first-seed", "5", "--out", str(out)]) == 2
    assert "seed-5 already holds a run with other settings" in capsys.readouterr().err


@pytest.mark.slow
def test_a_criterion_sweep_trains_each_seed_as_the_default_command_does(tmp_path, capsys):
    # --criterion scores the default command's runs: the preset's stop rule is kept (a sweep
    # past convergence sets stop_bit_errors=-1), so the kept weights are those `ntm train` keeps.
    out = tmp_path / "sweep"
    assert main(["sweep", "copy", "--seeds", "1", "--jobs", "1", "--criterion", "--sequences",
                 "64", "--out", str(out), *TINY]) == 0
    printed = capsys.readouterr().out
    assert "as `ntm train` runs each (the preset's stop rule, at most 64 sequences)" in printed
    assert "wrong bits per sequence at L = 120 (<= 0), mean of 3 sets of 1,000" in printed
    run = out / "seed-0"
    config = TrainConfig.from_dict(json.loads((run / "config.json").read_text()))
    preset = resolve_config("copy", overrides=[a for a in TINY if a != "--set"])
    assert (config.evaluation.stop_bit_errors, config.evaluation.patience_evals,
            config.max_sequences) == (preset.evaluation.stop_bit_errors,
                                      preset.evaluation.patience_evals, 64)
    assert preset.evaluation.stop_bit_errors == 0
    trained = tmp_path / "train"
    assert main(["train", "copy", "--seed", "0", "--no-plots", "--out", str(trained),
                 "--set", "max_sequences=64", "--set", "threads=1", *TINY]) == 0
    swept, alone = load_checkpoint(run), load_checkpoint(trained)
    assert swept.sequences == alone.sequences and swept.metrics == alone.metrics
    # run again: the seed is over (its budget or its stop rule), reused without training
    assert main(["sweep", "copy", "--seeds", "1", "--jobs", "1", "--criterion", "--sequences",
                 "64", "--out", str(out), *TINY]) == 0
    assert "seed 0: complete already" in capsys.readouterr().out


@pytest.mark.slow
def test_a_sweep_run_again_reuses_complete_seeds_and_resumes_the_others(tmp_path, capsys,
                                                                        monkeypatch):
    out = tmp_path / "sweep"
    argv = ["sweep", "copy", "--seeds", "2", "--jobs", "2", "--out", str(out), *TINY]
    assert main([*argv, "--sequences", "32"]) == 0
    # A longer budget: both seeds are incomplete now and continue from their checkpoints.
    assert main([*argv, "--sequences", "80"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["exit_codes"] == {"0": 0, "1": 0} and report["reused"] == []
    for seed in (0, 1):
        log = (out / f"seed-{seed}" / "train.log").read_text()
        assert "stopped (budget) after 32 sequences" in log  # the first part is kept
        assert "stopped (budget) after 80 sequences" in log
        rows = read_metrics(out / f"seed-{seed}" / "metrics.csv", "val")
        assert [r["step"] for r in rows] == ["2", "5"]
    capsys.readouterr()

    def no_training(*args, **kwargs):
        raise AssertionError("a training process was started")

    monkeypatch.setattr("torch_ntm.sweep.subprocess.Popen", no_training)
    assert main([*argv, "--sequences", "80"]) == 0  # all complete: nothing to train
    again = json.loads((out / "report.json").read_text())
    assert again["reused"] == [0, 1] and again["exit_codes"] == {}
    assert again["seeds"] == report["seeds"]
    # A smaller budget: the report would have said "32 sequences each" of runs of 80.
    assert main([*argv, "--sequences", "32"]) == 2
    assert ("seed-0 holds a run with a budget of 80 sequences, more than --sequences 32; pass "
            "--sequences 80 to reuse it") in capsys.readouterr().err


@pytest.mark.slow
def test_a_grid_sweep_trains_each_point_in_its_own_folder(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sweep"
    argv = ["sweep", "copy", "--seeds", "1", "--grid", "lr=0.03,0.01", "--jobs", "2",
            "--sequences", "32", "--out", str(out), *TINY]
    assert main(argv) == 0
    text = (out / "report.md").read_text()
    assert text in capsys.readouterr().out + "\n"
    report = json.loads((out / "report.json").read_text())
    assert report["title"].endswith("32 sequences each, 2 grid points")
    assert report["grid"] == ["lr=0.03,0.01"]
    assert [p["point"] for p in report["points"]] == ["lr=0.03", "lr=0.01"]
    for point, lr in zip(report["points"], (0.03, 0.01)):
        run = out / point["point"] / "seed-0"
        assert point["overrides"] == [point["point"]] and point["exit_codes"] == {"0": 0}
        assert [r["run_dir"] for r in point["seeds"]] == [str(run)]
        assert point["seeds"][0]["complete"]
        config = TrainConfig.from_dict(json.loads((run / "config.json").read_text()))
        assert (config.optim.lr, config.seed, config.max_sequences) == (lr, 0, 32)
        assert f"\n| {point['point']} | " in text and f"\n## {point['point']}\n" in text

    def no_training(*args, **kwargs):
        raise AssertionError("a training process was started")

    monkeypatch.setattr("torch_ntm.sweep.subprocess.Popen", no_training)
    assert main(argv) == 0  # all complete: nothing to train
    again = json.loads((out / "report.json").read_text())
    assert [p["reused"] for p in again["points"]] == [[0], [0]]
    assert [p["seeds"] for p in again["points"]] == [p["seeds"] for p in report["points"]]


@pytest.mark.slow
def test_a_grid_sweep_on_a_local_ray_instance_reports_its_runs_metrics(tmp_path, capsys,
                                                                      monkeypatch):
    ray = pytest.importorskip("ray")
    out = tmp_path / "sweep"
    threshold = 2.0  # bit errors per sequence: lr=0.03 gets there within the budget
    argv = ["sweep", "copy", "--seeds", "2", "--grid", "lr=0.03,0.01", "--ray", "--jobs", "2",
            "--sequences", "240", "--out", str(out), *TINY, "--set", f"stop_bit_errors={threshold}"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.count("queued on Ray (") == 4 and printed.count("done after") == 4
    assert not ray.is_initialized()  # the sweep's own local instance, shut down
    report = json.loads((out / "report.json").read_text())
    table = (out / "report.md").read_text().splitlines()
    for point in report["points"]:
        assert point["exit_codes"] == {"0": 0, "1": 0}
        times, sequences = [], []
        for row, seed in zip(point["seeds"], (0, 1)):
            run = out / point["point"] / f"seed-{seed}"
            assert row["seed"] == seed and row["run_dir"] == str(run) and row["complete"]
            assert json.loads((run / "checkpoint.json").read_text())["sequences"] == 240
            assert json.loads((run / "config.json").read_text())["threads"] == 1
            rows = [r for r in read_metrics(run / "metrics.csv") if r["split"] in ("val",
                                                                                 "rollback")]
            first = next((r for r in rows if r["split"] == "val"
                          and float(r["bit_errors"]) <= threshold), None)
            assert row["converged"] == (first is not None)
            if first is not None:
                times.append(float(first["elapsed_s"]))
                sequences.append(int(first["sequences"]))
                assert (row["converged_s"], row["converged_sequences"]) == (times[-1],
                                                                            sequences[-1])
            assert row["final_bit_errors"] == float(rows[-1]["bit_errors"])
        assert point["num_converged"] == len(times)
        median = statistics.median(times) if times else None
        assert point["median_converged_s"] == median
        shown = "-" if median is None else f"{median:.1f}"
        assert f"| {point['point']} | {len(times)}/2 | {shown} |" in "\n".join(table)
    assert report["points"][0]["num_converged"] > 0  # the comparison above is not vacuous

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(ray, "init", no_ray)
    assert main(argv) == 0  # all complete: nothing to train, no Ray to start
    again = json.loads((out / "report.json").read_text())
    assert [p["reused"] for p in again["points"]] == [[0, 1], [0, 1]]
    assert [p["seeds"] for p in again["points"]] == [p["seeds"] for p in report["points"]]


def test_ray_missing_is_one_line_saying_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert main(["sweep", "copy", "--ray", "--out", str(tmp_path / "sweep")]) == 2
    assert capsys.readouterr().err == ("ntm: error: --ray needs Ray, which is not installed: "
                                       "pip install 'torch-ntm[ray]'\n")
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("argv, message", [
    (["sweep", "sorting"], "ntm: error: unknown task 'sorting'; valid tasks: associative_recall"),
    (["sweep", "copy", "--seeds", "0"], "ntm: error: --seeds must be >= 1, got 0"),
    (["sweep", "copy", "--jobs", "0"], "ntm: error: --jobs must be >= 1, got 0"),
    # seed -1's folder would be seed-1, another seed's
    (["sweep", "copy", "--first-seed", "-1"], "ntm: error: --first-seed must be >= 0, got -1"),
    (["sweep", "copy", "--sequences", "0"], "ntm: error: --sequences must be >= 1, got 0"),
    # the last seed would fail only when its training starts, after the others had run
    (["sweep", "copy", "--first-seed", str(2**64 - 1), "--seeds", "2"], "ntm: error: "
     "--first-seed 18446744073709551615 with --seeds 2 goes past the largest seed, 2**64 - 1; "
     "give --first-seed <= 18446744073709551614"),
    (["sweep", "copy", "--set", "seed=3"], "ntm: error: --set seed: the sweep sets seed itself"),
    (["sweep", "copy", "--set", "max_sequences=9"], "ntm: error: --set max_sequences: the sweep"),
    (["sweep", "copy", "--set", "colour=red"], "ntm: error: --set colour: unknown key"),
    (["sweep", "copy", "--set", "task.max_length=0"], "ntm: error: the task cannot be built"),
    (["sweep", "copy", "--grid", "colour=red,blue"], "ntm: error: --grid colour: unknown key; "
                                                    "valid keys: amsgrad"),
    (["sweep", "copy", "--grid", "lr=0.1,fast"], "ntm: error: --grid lr=fast: expected a value "
                                                 "of type float"),
    (["sweep", "copy", "--grid", "lr=0.1,-1"], "ntm: error: --grid: lr=-1.0 is out of range"),
    (["sweep", "copy", "--grid", "task.size=3"], "ntm: error: --grid task.size: unknown key; "
                                                 "valid keys: task.max_length"),
    (["sweep", "copy", "--grid", "seed=1,2"], "ntm: error: --grid seed: the sweep sets seed "
                                              "itself; use --first-seed"),
    (["sweep", "copy", "--grid", "lr=0.1", "--set", "lr=0.2"], "ntm: error: --grid lr: also "
                                                               "given with --set"),
    (["sweep", "copy", "--grid", "lr=0.1", "--grid", "lr=0.2"], "ntm: error: --grid lr: given "
                                                                "twice"),
    (["sweep", "copy", "--grid", "lr=0.1,0.1"], "ntm: error: --grid lr=0.1,0.1: has an empty or "
                                                "repeated value"),
    (["sweep", "copy", "--grid", "lr"], "ntm: error: --grid expects key=value1,value2,..."),
    (["sweep", "copy", "--grid", "device=../x"], "ntm: error: --grid device=../x: a value names "
                                                 "the grid point's folder"),
    # Each value alone is fine; one combination needs 7.45 GiB of memory per batch.
    (["sweep", "copy", "--grid", "batch_size=16,1000", "--grid", "memory_size=128,100000"],
     "ntm: error: grid point batch_size=1000,memory_size=100000: --grid: memory_size=100000 x "
     "memory_width=20 needs 7.45 GiB"),
    (["sweep", "copy", "--gpus-per-run", "1"], "ntm: error: --gpus-per-run needs --ray"),
])
def test_sweep_mistakes_end_in_one_line_before_any_training(argv, message, tmp_path, capsys,
                                                           monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("a training process was started")

    monkeypatch.setattr("torch_ntm.sweep.subprocess.Popen", no_training)
    assert main([*argv, "--out", str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sweep").exists()


def test_sigterm_stops_the_children_and_restores_the_handler(tmp_path, monkeypatch):
    import os
    import signal

    from torch_ntm.sweep import run_sweep

    class Child:  # a training that never ends; its first poll delivers SIGTERM to the sweep
        started, terminated = [], []

        def __init__(self, argv, **kwargs):
            Child.started.append(self)

        def poll(self):
            os.kill(os.getpid(), signal.SIGTERM)

        def terminate(self):
            Child.terminated.append(self)

        def wait(self):
            return -15

    def unhandled(signum, frame):  # what SIGTERM does unless the sweep handles it
        raise RuntimeError("the sweep left SIGTERM unhandled")

    monkeypatch.setattr("torch_ntm.sweep.subprocess.Popen", Child)
    monkeypatch.setattr("torch_ntm.sweep.time.sleep", lambda s: None)
    before = signal.signal(signal.SIGTERM, unhandled)
    try:
        with pytest.raises(SystemExit) as stopped:
            run_sweep("copy", 3, jobs=2, out=tmp_path / "sweep", echo=lambda line: None)
        assert signal.getsignal(signal.SIGTERM) is unhandled  # put back afterwards
    finally:
        signal.signal(signal.SIGTERM, before)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert len(Child.started) == 2 and Child.terminated == Child.started


def test_a_stopped_sweep_reports_the_seeds_that_finished(tmp_path, monkeypatch, capsys):
    import os
    import signal

    class Child:  # the first training finishes, the second's poll delivers SIGTERM
        started = []

        def __init__(self, argv, **kwargs):
            self.seed = int(argv[argv.index("--seed") + 1])
            Child.started.append(self)

        def poll(self):
            if self.seed == 0:
                self.returncode = 0
                return 0
            os.kill(os.getpid(), signal.SIGTERM)

        def terminate(self):
            pass

        def wait(self):
            return -15

    monkeypatch.setattr("torch_ntm.sweep.subprocess.Popen", Child)
    monkeypatch.setattr("torch_ntm.sweep.time.sleep", lambda s: None)
    out = tmp_path / "sweep"
    assert main(["sweep", "copy", "--seeds", "3", "--jobs", "2", "--out", str(out)]) == 143
    err = capsys.readouterr().err
    assert err.strip() == (f"ntm: sweep interrupted; {out / 'report.md'} reports the seeds that "
                           f"finished; run the same command to continue")
    report = json.loads((out / "report.json").read_text())
    assert report["exit_codes"] == {"0": 0} and report["num_seeds"] == 3
    assert (out / "report.md").exists()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_sweep_takes_its_trainings_with_it(tmp_path):
    """SIGKILL cannot be caught, so the sweep cannot stop its children itself: the kernel sends
    each one SIGTERM when the sweep dies, and it saves a checkpoint and exits."""
    out = tmp_path / "sweep"
    sweep = subprocess.Popen([sys.executable, "-m", "torch_ntm", "sweep", "copy", "--seeds", "1",
                              "--jobs", "1", "--sequences", "10000000", "--out", str(out), *TINY],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def children() -> list[int]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if b"train" in cmdline and str(out).encode() in cmdline and state != "Z":
                found.append(int(pid))
        return found

    deadline = time.monotonic() + 60
    while not (out / "seed-0" / "metrics.csv").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert children(), "the sweep's training did not start"
    sweep.kill()
    sweep.wait()
    deadline = time.monotonic() + 30
    while children() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not children()


def test_a_run_with_a_fine_tune_is_reported_from_its_first_stage_on(tmp_path):
    """The report reads a run with ``finetune`` as one run: the first stage's rows, then the
    fine-tune's with their sequences and seconds counted on from the first stage's end."""
    from torch_ntm.checkpoint import stage_dir
    from torch_ntm.sweep import _timeline, summarise
    from torch_ntm.train import train

    overrides = ["task.max_length=2", "task.width=3", "memory_size=8", "memory_width=4",
                 "controller_size=8", "batch_size=2", "eval_every=2", "eval_sequences=4",
                 "lr=0.01", "max_sequences=8", "eval_sizes=", "log_every=1",
                 "finetune=lr=0.001 max_sequences=6 eval_every=3"]
    run = tmp_path / "seed-0"
    train(resolve_config("copy", overrides=overrides), run, progress=False)
    first, second = read_metrics(stage_dir(run) / "metrics.csv"), read_metrics(run / "metrics.csv")
    rows = _timeline(run)
    assert rows[:len(first)] == first and len(rows) == len(first) + len(second)
    assert [int(r["sequences"]) for r in rows[len(first):]] == [
        8 + int(r["sequences"]) for r in second]
    assert int(rows[-1]["sequences"]) == 14
    seconds = [float(r["elapsed_s"]) for r in rows]
    assert seconds == sorted(seconds)
    (seed,) = summarise([run])["seeds"]
    assert seed["complete"] and seed["seed"] == 0
