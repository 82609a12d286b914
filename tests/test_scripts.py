"""The analysis scripts that the results pages (docs/results/) quote run on the shipped models
and print figures that add up (the commands in those pages must not rot)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_ntm import pretrained
from torch_ntm.checkpoint import load_checkpoint, save_checkpoint
from torch_ntm.factories import build_model, build_task
from torch_ntm.metrics import bit_errors
from torch_ntm.presets import resolve_config
from torch_ntm.tasks import make_task

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _call(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _run(script: str, *args: str) -> str:
    result = _call(script, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _evaluated(name: str):
    """Shipped model ``name`` in eval mode with the rows `ntm evaluate` runs it with (its
    eval_memory_size: repeat copy trained with 64 rows and runs with 128), as scripts load it."""
    return load_checkpoint(pretrained.path(name)).model(evaluation=True).eval()


@pytest.mark.slow  # a Python process each, ~5 s in CI
@pytest.mark.parametrize("script", ["sort_precision.py", "repeat_copy_loops.py",
                                    "repeat_copy_count.py", "recall_errors.py",
                                    "graph_errors.py", "ngrams_memory.py"])
@pytest.mark.parametrize(("run", "message"), [
    ("no-such-run", "no such checkpoint"),
    (str(pretrained.path("copy")), "is a 'copy' run; this script reads"),
])
def test_a_wrong_run_ends_in_one_line(script, run, message):
    result = _call(script, run)
    assert result.returncode != 0 and message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("float64", [False, True])
def test_sort_precision_splits_every_sequence(float64, shipped):
    out = _run("sort_precision.py", str(pretrained.path("priority_sort")), "--sequences", "40",
               *(["--float64"] if float64 else []))
    assert "20 inputs, 16 outputs, 40 sequences" in out
    rows = re.findall(r"^\s+([\d.e-]+)\s+(\d+)\s+\S+ \|\s+(\d+)\s+\S+$", out, re.M)
    assert len(rows) == 5
    below = [int(b) for _, b, _ in rows]
    assert all(int(b) + int(rest) == 40 for _, b, rest in rows)
    assert below == sorted(below)  # a larger gap has at least as many sequences below it
    # its share of perfect sequences is the library's on the same draw (seed 777), same dtype
    dtype = torch.float64 if float64 else torch.float32
    model, task = shipped("priority_sort")
    batch = task.held_out().sample(40, torch.Generator().manual_seed(777))
    with torch.no_grad():
        logits, _ = model.to(dtype)(batch.inputs.to(dtype))
    perfect = float((bit_errors(logits, batch.targets, batch.mask) == 0).double().mean())
    assert f"{perfect:.1%} perfect" in out


@pytest.mark.slow
def test_repeat_copy_loops_prints_every_copy():
    out = _run("repeat_copy_loops.py", str(pretrained.path("repeat_copy")), "--repeats", "3,20",
               "--sequences", "8")
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines[::4]] == ["L = 10, R = 3", "L = 10, R = 20"]
    for line, focus_line, left_line, write_line, repeats in zip(
            lines[::4], lines[1::4], lines[2::4], lines[3::4], (3, 20)):
        moved, peak = write_line.split("rows moved ")[1].split("; largest weight ")
        assert len(moved.split()) == len(peak.split()) == repeats
        assert all(1 / 128 <= float(v) <= 1 for v in peak.split())
        per_copy = line.split("per copy ")[1].split(";")[0].split()
        assert len(per_copy) == repeats
        assert all(0 <= float(v) <= 80 for v in per_copy)  # at most every bit of a copy (10 x 8)
        focus = focus_line.split("read focus per copy ")[1].split()
        assert len(focus) == repeats
        assert all(1 / 128 <= float(v) <= 1 for v in focus)  # a weighting's largest of 128 rows
        left = [float(v) for v in left_line.split("unerased after copy ")[1].split()]
        assert len(left) == repeats
        assert all(1 >= a >= b >= 0 for a, b in zip(left, left[1:]))  # a product of factors <= 1
    assert float(lines[1].split()[-1]) > 0.9  # the shipped model reads one row at a time at R = 3
    # What is left of the stored sequence after the 20th copy, recomputed step by step on the
    # script's sequences: the row the write head was on at each input step, and every answer
    # step's erase there.
    model = _evaluated("repeat_copy")
    batch = make_task("repeat_copy").with_size(10).with_repeats(20).sample(
        8, torch.Generator().manual_seed(123))
    with torch.no_grad():
        _, _, trace = model.trace(batch.inputs)
    kept = torch.ones(8, 10, 20, dtype=torch.float64)
    for b in range(8):
        rows = trace.write_weights[1:11, b, 0].argmax(-1)
        for t in range(12, 12 + 200):
            w, e = trace.write_weights[t, b, 0, rows].double(), trace.erase[t, b, 0].double()
            kept[b] *= 1 - w[:, None] * e[None, :]
    assert float(lines[6].split()[-1]) == pytest.approx(float(kept.mean()), abs=0.006)
    # The write head's rows moved in the first and the last copy, recomputed row by row: the
    # shorter way round the 128 rows from each step's row of most write weight to the next.
    for copy, printed in ((0, 0), (19, -1)):
        steps = range(11 + 10 * copy, 11 + 10 * copy + 10)  # from the step before the copy
        rows = [[int(trace.write_weights[t, b, 0].argmax()) for t in [*steps, steps[-1] + 1]]
                for b in range(8)]
        moved = [sum((b - a + 64) % 128 - 64 for a, b in zip(r, r[1:])) for r in rows]
        shown = lines[7].split("rows moved ")[1].split(";")[0].split()[printed]
        assert float(shown) == pytest.approx(sum(moved) / 8, abs=0.051)
    # The shipped model keeps copying past 20 (the model shipped before 2026-11-26 erased the
    # stored sequence after its early marker: 0.5 and less).
    assert float(kept.mean()) > 0.9


@pytest.mark.slow
def test_repeat_copy_count_reads_the_cells_the_count_moves():
    out = _run("repeat_copy_count.py", str(pretrained.path("repeat_copy")), "--max-repeats", "14",
               "--units", "3", "--sequences", "2")
    rows = re.findall(r"^cell (\d+): ([-\d. ]+); extrapolates (-?[\d.]+)$", out, re.M)
    assert len(rows) == 3
    # the first cell's values are the library's: cell state after the count, R = 1..14, the
    # mean over the two sequences, each run with the count set to R / 10 one R at a time
    model, task = _evaluated("repeat_copy"), make_task("repeat_copy")
    prefixes = task.with_size(10).sample(2, torch.Generator().manual_seed(123)).inputs[:12]
    cells = torch.zeros(14, 100)
    with torch.no_grad():
        for r in range(1, 15):
            x = prefixes.clone()
            x[11, :, task.width + 1] = r / task.repeats_norm
            _, state = model(x)
            cells[r - 1] = state.controller[1][0].mean(0)  # one layer of 100 cells
    unit, values, ratio = int(rows[0][0]), [float(v) for v in rows[0][1].split()], rows[0][2]
    assert values == pytest.approx(cells[:, unit].tolist(), abs=0.006)
    assert (cells[9] - cells[0]).abs().argmax() == unit  # the cell the count moves most
    within, beyond = (values[9] - values[0]) / 9, (values[13] - values[9]) / 4
    assert float(ratio) == pytest.approx(beyond / within, abs=0.05)


@pytest.mark.slow
def test_repeat_copy_count_refuses_a_feedforward_controller(tmp_path):
    config = resolve_config("repeat_copy", "ntm-ff")
    save_checkpoint(tmp_path, config, build_model(config, build_task(config)), step=0)
    result = _call("repeat_copy_count.py", str(tmp_path))
    assert result.returncode != 0 and "no LSTM controller" in result.stderr


@pytest.mark.slow
def test_recall_errors_counts_the_sequences():
    run = pretrained.path("associative_recall")
    out = _run("recall_errors.py", str(run), "--sequences", "50", "--items", "12")
    wrong, total = map(int, re.match(r"(\d+) of (\d+) sequences with a wrong bit", out).groups())
    # the same 50 sequences of 12 items (seed 123), scored here
    ckpt = load_checkpoint(run)
    batch = ckpt.task().with_size(12).sample(50, torch.Generator().manual_seed(123))
    with torch.no_grad():
        logits, _ = ckpt.model(evaluation=True).eval()(batch.inputs)
    expected = int((bit_errors(logits, batch.targets, batch.mask) > 0).sum())
    assert total == 50 and wrong == expected


@pytest.mark.slow
@pytest.mark.parametrize("task", ["traversal", "shortest_path"])
def test_graph_errors_splits_every_answer_triple_by_field(task, tmp_path):
    config = resolve_config(task, overrides=["controller_size=8", "memory_size=8",
                                             "memory_width=4", "read_heads=1"])
    model = build_model(config, build_task(config))
    save_checkpoint(tmp_path, config, model, step=0)
    out = _run("graph_errors.py", str(tmp_path), "--sizes", "3,4", "--sequences", "20")
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$",
                      out, re.M)
    task_ = build_task(config)
    for size in (3, 4):  # one row per answer step, as many triples as the same draw answers
        batch = task_.with_size(size).sample(20, torch.Generator().manual_seed(123))
        answers = batch.mask.sum(0)  # [B] answer steps of each sequence
        mine = [r for r in rows if int(r[0]) == size]
        assert [int(r[1]) for r in mine] == list(range(1, int(answers.max()) + 1))
        assert [int(r[2]) for r in mine] == [int((answers >= i).sum()) for i in range(
            1, len(mine) + 1)]
        for r in mine:
            fields, any_ = [float(f) for f in r[3:6]], float(r[6])
            assert all(0 <= f <= 1 for f in fields) and max(fields) <= any_ <= min(1, sum(fields))


@pytest.mark.slow
def test_profile_step_splits_a_native_step():
    from torch_ntm.engines import library

    if not library.available("ntm", torch.float32):
        pytest.skip("native library not built")
    out = _run("profile_step.py", "--batch-size", "1,2", "--memory-size", "8", "--seq-len", "3",
               "--steps", "2", "--repeats", "1")
    heads = re.findall(r"^native, batch (\d+), 8 rows, L = 3: ([\d.]+) ms per step", out, re.M)
    assert [b for b, _ in heads] == ["1", "2"] and all(float(t) > 0 for _, t in heads)
    for line in re.findall(r"^  of which: (.*)$", out, re.M):
        parts = dict(p.rsplit(" ", 1) for p in line.split(", "))
        assert float(parts["native forward call"]) > 0 and float(parts["native backward call"]) > 0


@pytest.mark.slow  # 9 s in CI
def test_heads_bench_times_the_library_heads():
    from torch_ntm.engines import library

    if not library.available("ntm", torch.float32):
        pytest.skip("native library not built")
    out = _run("heads_bench.py", "--batch-size", "1,3", "--memory-size", "64", "--steps", "4",
               "--repeats", "1")
    rows = re.findall(r"^\s+64\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["1", "3"]
    assert all(int(f) > 0 and int(b) > 0 for _, f, b, _ in rows)
    # kept per sequence and step: the memory (64 x 20) and two heads' cosines (2 x 64), float32
    assert [float(r[3]) for r in rows] == [round(4 * b * 1408 * 4 / 1e6, 2) for b in (1, 3)]


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.py")
                                          if not p.name.startswith("_")))
@pytest.mark.slow
def test_every_script_answers_help_with_its_usage(script):
    """copy_seed_table.py read ``--help.log`` and, given nothing, printed an empty table."""
    assert _run(script, "--help").startswith(f"usage: {script} ")
    if script == "copy_seed_table.py":
        result = _call(script)
        assert result.returncode == 2 and "the following arguments are required: RUN" in \
            result.stderr


@pytest.mark.slow  # two measuring processes, ~15 s
def test_ab_calls_times_every_model_of_each_tree():
    src = str(Path(__file__).resolve().parent.parent / "src")
    out = _run("ab_calls.py", f"one={src}", f"two={src}", "--rounds", "1", "--core", "-1")
    assert "| model | batch | one | two | one / two |" in out
    rows = re.findall(r"^\| (NTM|MANN|DNC) \| (1|16) \| (.+) \|$", out, re.M)
    assert [(m, b) for m, b, _ in rows] == [(m, b) for m in ("NTM", "MANN", "DNC")
                                            for b in ("1", "16")]
    for _, _, cells in rows:  # each tree's time (training, inference), then the ratio
        numbers = [float(v) for v in re.findall(r"[\d.]+", cells)]
        assert len(numbers) == 6 and all(v > 0 for v in numbers), cells


def test_ab_calls_refuses_a_missing_tree(tmp_path):
    result = _call("ab_calls.py", f"one={tmp_path / 'nowhere'}", f"two={tmp_path}")
    assert result.returncode == 2 and "each SRC a tree's src folder" in result.stderr


@pytest.mark.slow  # the shipped n-grams model on 40 sequences and their eager trace
def test_ngrams_memory_splits_the_cost_by_count_and_describes_each_head():
    out = _run("ngrams_memory.py", str(pretrained.path("ngrams")), "--sequences", "40")
    total = re.search(r"40 sequences of 200 bits: ([\d.]+) bits a sequence, the optimum "
                      r"([\d.]+) \(([+-][\d.]+)%\)", out)
    assert total, out
    model, optimum, above = (float(v) for v in total.groups())
    assert model > optimum and abs(100 * (model / optimum - 1) - above) < 0.01
    rows = re.findall(r"^\s+(\S+) \|\s+([\d.]+)% \| ([\d.]+) \(([\d.]+)\)\s+\| ([+-][\d.]+)$",
                      out, re.M)
    assert [r[0] for r in rows] == ["0-0", "1-1", "2-3", "4-7", "8-15", "16+"]
    assert abs(sum(float(r[1]) for r in rows) - 100) < 0.5  # the bins cover every scored step
    assert float(rows[0][3]) == 1.0  # a context never seen: the optimum predicts 1/2
    # the bins' excess adds up to the total's (bits a sequence)
    assert abs(sum(float(r[4]) for r in rows) - (model - optimum)) < 0.01
    heads = re.findall(r"^(read|write) head 0: ([\d.]+) rows used of 128, largest weight "
                       r"([\d.]+), purity ([\d.]+)$", out, re.M)
    assert [h[0] for h in heads] == ["read", "write"]
    assert all(0 < float(h[2]) <= 1 and 0 < float(h[3]) <= 1 for h in heads)
