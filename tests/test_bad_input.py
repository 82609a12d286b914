"""Bad input on the surfaces added with the DNC (issue 59): each a one-line error that names the
setting, its limit and the fix, before a run folder, an allocation or a training exists."""

import pytest
import torch

from torch_ntm import DNC, MANN, NTM
from torch_ntm import dnc_functional as dncf
from torch_ntm.cli import main
from torch_ntm.graph_tasks import random_graph


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ntm: error: ") and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("task, sets, what", [
    ("copy", ["model=dnc", "memory_size=100000", "memory_width=1"],
     "the model cannot be built from this config: DNC with memory_size=100000 holds "
     "10,000,500,001 numbers in one sequence's state (link [1, 1, 100000, 100000] the largest)"),
    ("traversal", ["write_heads=10000"],
     "a DNC state of 10.1 GiB per batch of 64 sequences (link 64 x 10000 x 64 x 64 the largest, "
     "with memory_size=64 and write_heads=10000"),
    ("copy", ["model=dnc", "eval_memory_size=100000"],
     "with eval_memory_size=100000: DNC with memory_size=100000 holds"),
])
def test_a_dnc_state_too_large_for_memory_is_refused_before_the_run_folder(
        tmp_path, capsys, task, sets, what):
    """Each passed the check, made the run folder, then failed asking for 640 GB (or, for
    eval_memory_size, after training had finished)."""
    out = tmp_path / "run"
    argv = ["train", task, "--out", str(out), *(a for s in sets for a in ("--set", s))]
    err = one_line_error(capsys, argv)
    assert what in err and "write_heads" in err and "grow with the square of the rows" in err
    assert not out.exists()


@pytest.mark.parametrize("argv", [
    ["evaluate", "--pretrained", "dnc_traversal", "--memory-size", "100000"],
    ["plot", "--pretrained", "dnc_traversal", "--memory-size", "4096"],
    ["bench", "--model", "dnc", "--memory-size", "100000"],
])
def test_a_dnc_memory_size_too_large_for_memory_is_one_line(tmp_path, capsys, argv):
    if argv[0] == "plot":
        argv = [*argv, "--out", str(tmp_path / "figures")]
    err = one_line_error(capsys, argv)
    assert "the link matrices grow with the square of the rows" in err
    assert not (tmp_path / "figures").exists()


@pytest.mark.parametrize("make", [lambda: DNC(9, 8), lambda: MANN(25, 5),
                                  lambda: MANN(25, 5, encoder="conv", image_size=4)],
                         ids=["dnc", "mann", "mann-conv"])
def test_float16_parameters_are_refused_for_every_model(make):
    """The DNC and the MANN returned NaN from the first step in float16, even on zeros."""
    model = make().half()
    with pytest.raises(ValueError, match="does not run in float16.*bfloat16.*autocast"):
        model(torch.zeros(3, 2, model.input_size, dtype=torch.float16))


@pytest.mark.parametrize("make, message", [
    (lambda: DNC(9, 8, memory_size=10**12), r"holds 1,000,000,000,023,000,000,000,064 numbers "
                                            r"in one sequence's state \(link"),
    (lambda: NTM(9, 8, memory_size=10**9), r"\(memory \[1, 1000000000, 20\] the largest\)"),
    (lambda: DNC(9, 8, dtype=torch.complex64), "a real floating dtype.*complex64"),
    (lambda: MANN(9, 5, dtype=torch.int64), "a real floating dtype.*int64"),
])
def test_sizes_and_dtypes_a_model_cannot_run_are_refused_when_it_is_built(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_random_graph_refuses_more_nodes_than_labels():
    """(200, 1, 3, 100) returned 100 labels for 200 nodes without a word."""
    with pytest.raises(ValueError, match="nodes <= labels.*got nodes=200"):
        random_graph(200, 1, 3, 100)
    with pytest.raises(ValueError, match="min_out <= max_out"):
        random_graph(10, 4, 3, 10)
    with pytest.raises(ValueError, match="nodes >= 2"):
        random_graph(1, 1, 1, 10)
    graph = random_graph(10, 1, 3, 10, torch.Generator().manual_seed(0))
    assert graph.labels.unique().numel() == 10


def test_empty_sparse_link_checks_its_k():
    with pytest.raises(ValueError, match="empty_sparse_link keeps k >= 1 entries, got k=0"):
        dncf.empty_sparse_link(2, 1, 5, 0)
    assert dncf.empty_sparse_link(2, 1, 5, 3).values.shape == (2, 1, 5, 3)


def test_evaluate_refuses_a_seed_beyond_torchs(capsys):
    """``--seeds 18446744073709551616`` (2**64) was a traceback; ``train --seed`` refused it."""
    with pytest.raises(SystemExit):
        main(["evaluate", "--pretrained", "copy", "--seeds", str(2**64)])
    err = capsys.readouterr().err
    assert "expected distinct seeds from 0 to 2**64 - 1, got '18446744073709551616'" in err


@pytest.mark.parametrize("sets, message", [
    (["sparse_link=4"], "--set sparse_link: applies to model=dnc, not ntm"),
    (["model=dnc", "encoder=conv"], "--set encoder: applies to model=mann, not dnc"),
    (["model=dnc", "shift_range=2"], "--set shift_range: applies to model=ntm, not dnc"),
    (["model=dnc", "max_beta=5"], "--set max_beta: applies to model=ntm, not dnc"),
    (["model=lstm", "memory_size=64"], "--set memory_size: applies to model=ntm or mann or dnc"),
])
def test_a_key_that_shapes_another_model_is_refused(tmp_path, capsys, sets, message):
    """They were ignored and written to config.json."""
    out = tmp_path / "run"
    err = one_line_error(capsys, ["train", "copy", "--out", str(out),
                                  *(a for s in sets for a in ("--set", s))])
    assert message in err and not out.exists()


def test_a_dnc_of_one_row_is_not_refused_for_the_ntms_shifts():
    """A DNC has no shift_range; the NTM's default (1, which needs 3 rows) refused it."""
    from torch_ntm.presets import resolve_config

    config = resolve_config("copy", overrides=["model=dnc", "memory_size=1", "read_heads=1"])
    assert (config.model, config.model_params.memory_size) == ("dnc", 1)


@pytest.mark.parametrize("task, sets, message", [
    ("traversal", ["task.max_path=100000000"],
     "takes up to 200,000,030 steps, more than 10,000: lower task.max_nodes or task.max_path"),
    ("traversal", ["task.max_path=9000"], "takes up to 18,030 steps"),  # one sample passed it
    ("traversal", ["task.digits=9"], "digits=9 draws labels from 10**9 values; at most 4"),
    ("traversal", ["task.digits=19"], "digits=19 draws labels from 10**19 values"),
    ("shortest_path", ["task.min_path=50", "task.max_path=60"],
     "min_path=50 edges is longer than any path in a graph of max_nodes=10 nodes"),
    ("shortest_path", ["task.min_path=9", "task.max_path=10"],
     "no pair with a unique shortest path of 9..10 edges"),
])
def test_graph_task_sizes_are_bounded_before_anything_is_drawn(tmp_path, capsys, task, sets,
                                                               message):
    """max_path=100000000 drew for 170 s and 7.5 GB, digits>=19 overflowed, min_path=50 was a
    traceback, and min_path=9 made the run folder, then failed drawing the validation set."""
    out = tmp_path / "run"
    err = one_line_error(capsys, ["train", task, "--out", str(out),
                                  *(a for s in sets for a in ("--set", s))])
    assert message in err and not out.exists()


@pytest.mark.parametrize("name", ["traversal", "shortest_path"])
def test_a_graph_tasks_max_steps_bounds_every_sequence(name):
    from torch_ntm.tasks import make_task

    task = make_task(name)
    lengths = [task.sample(1, torch.Generator().manual_seed(s)).inputs.shape[0]
               for s in range(40)]
    assert max(lengths) <= task.max_steps
    fixed = make_task(name, min_nodes=6, max_nodes=6, min_out=2, max_out=2, min_path=3,
                      max_path=3)  # every sequence as long as it can be: the bound is reached
    if name == "traversal":
        assert fixed.sample(4).inputs.shape[0] == fixed.max_steps == 6 * 2 + 2 * 3 + 0


@pytest.mark.parametrize("make", [lambda: NTM(9, 8), lambda: MANN(25, 5), lambda: DNC(9, 8)],
                         ids=["ntm", "mann", "dnc"])
def test_a_layer_without_its_bias_runs_eager_not_into_the_native_engine(make, caplog,
                                                                       monkeypatch):
    """After ``head_params.bias = None`` the native engine raised an AttributeError."""
    from torch_ntm.engines import common

    monkeypatch.setattr(common, "_SAID", set())  # said once per process
    model = make()
    model.head_params.bias = None
    x = torch.rand(4, 2, model.input_size)
    assert model.runs_on(x) == "eager"
    y, _ = model(x)
    model.engine = "eager"
    torch.testing.assert_close(y, model(x)[0])
    assert "the native engine reads every layer's bias, and head_params has none" in caplog.text


def test_bench_refuses_an_engine_the_device_has_not(capsys):
    """``--engines graphs`` on a CPU timed the eager loop for minutes under the graphs name."""
    err = one_line_error(capsys, ["bench", "--model", "dnc", "--engines", "graphs"])
    assert "engine 'graphs' runs on CUDA, not on CPU: drop it, or measure with --device cuda" in err


def test_a_size_the_task_has_not_names_it(capsys):
    err = one_line_error(capsys, ["evaluate", "--pretrained", "dnc_traversal", "--lengths",
                                  "1000"])
    assert "--lengths 1000: no sequence of this task has nodes = 1000" in err
