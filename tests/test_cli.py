"""The ``ntm`` command line: train, evaluate, plot, and one-line errors for user mistakes."""

import json

import pytest

from torch_ntm.cli import main
from torch_ntm.runlog import read_metrics

TINY = ["--set", "task.max_length=3", "--set", "task.width=4", "--set", "memory_size=8",
        "--set", "memory_width=4", "--set", "controller_size=8", "--set", "eval_sequences=16",
        "--set", "max_sequences=32", "--set", "eval_every=1", "--set", "engine=auto",
        "--no-progress"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", "copy", "--out", str(run), "--no-plots", *TINY]) == 0
    return run


def test_train_writes_a_complete_run_directory(trained, capsys):
    names = {p.name for p in trained.iterdir()}
    assert {"checkpoint.json", "config.json", "metrics.csv", "tb"} <= names
    config = json.loads((trained / "config.json").read_text())
    assert config["task_params"] == {"max_length": 3, "width": 4}
    header = (trained / "metrics.csv").read_text().splitlines()[0]
    assert header == "step,sequences,elapsed_s,split,cost_bits,bit_errors,perfect"
    assert read_metrics(trained / "metrics.csv", "val")


def test_train_reports_the_kept_weights_when_a_later_validation_did_worse(tmp_path, monkeypatch,
                                                                         capsys):
    import torch_ntm.train as module

    script = [(4.0, 0.0), (40.0, 9.0)]  # two validations: solved, then fallen apart

    def scripted(model, batches):
        cost, errors = script.pop(0)
        return {"cost_bits": cost, "bit_errors": errors, "perfect": float(errors == 0)}

    monkeypatch.setattr(module, "evaluate_batches", scripted)
    assert main(["train", "copy", "--out", str(tmp_path / "run"), "--no-plots", *TINY,
                 "--set", "eval_sizes=", "--set", "rollback_bit_errors=-1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "last validation: cost_bits=40, bit_errors=9, perfect=0" in out
    assert ("kept weights (the best validation; below and in ntm evaluate): cost_bits=4, "
            "bit_errors=0, perfect=1") in out


def test_evaluate_json_reports_each_size(trained, capsys):
    assert main(["evaluate", str(trained), "--lengths", "2,5", "--sequences", "8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["length"] for r in rows] == [2, 5]
    for r in rows:
        assert r["sequences"] == 8
        assert 0 <= r["perfect"] <= 1 and r["bit_errors"] >= 0 and r["cost_bits"] > 0
    # Longer sequences hold more bits to get wrong: an untrained model's cost grows with length.
    assert rows[1]["cost_bits"] > rows[0]["cost_bits"]


def test_evaluate_table_and_memory_size_override(trained, capsys):
    assert main(["evaluate", str(trained), "--lengths", "4", "--sequences", "4",
                 "--memory-size", "32"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["length", "sequences", "cost_bits", "bit_errors", "perfect"]
    assert out[1].split()[:2] == ["4", "4"]


@pytest.mark.slow
def test_plot_writes_png_figures(trained, tmp_path, capsys):
    assert main(["plot", str(trained), "--out", str(tmp_path / "fig"), "--length", "3"]) == 0
    names = {p.name for p in (tmp_path / "fig").iterdir()}
    assert names == {"io.png", "attention.png", "memory.png", "learning_curve.png",
                     "generalisation.png"}
    for p in (tmp_path / "fig").iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_plot_runs_the_example_with_the_rows_evaluate_would(tmp_path, monkeypatch):
    """Beyond the training size the example runs with the run's eval_memory_size, as `ntm
    evaluate` scores it; at the training size with the rows it trained with; --memory-size wins.
    (The repeat copy model trained with 64 rows and evaluated with 128 wrapped its write head
    onto the stored sequence in the figure of L = 20 drawn with 64.)"""
    import torch_ntm.plot as plot

    run = tmp_path / "run"
    assert main(["train", "copy", "--out", str(run), "--no-plots", *TINY,
                 "--set", "eval_memory_size=16"]) == 0
    import torch_ntm.evaluate

    rows = []
    monkeypatch.setattr(plot, "plot_memory", lambda trace, path: rows.append(trace.memory.shape[2]))
    monkeypatch.setattr(torch_ntm.evaluate, "evaluate_sizes", lambda *args, **kwargs: [])
    monkeypatch.setattr(plot, "plot_generalisation", lambda *args: None)  # not under test here
    for size, memory_size in [(3, None), (5, None), (5, 32), (3, 32)]:
        plot.plot_run(run, tmp_path / "fig", size=size, memory_size=memory_size)
    assert rows == [8, 16, 32, 32]


def test_resume_through_the_cli(trained, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    assert main(["train", "copy", "--resume", str(run), "--set", "max_sequences=64",
                 "--no-plots", "--no-progress"]) == 0
    assert json.loads((run / "checkpoint.json").read_text())["sequences"] == 64


def test_resuming_a_run_with_nothing_left_to_train_leaves_it_as_it_was(trained, tmp_path,
                                                                     capsys):
    """It wrote the resumed config (here an lr that never ran) into config.json, and a new
    TensorBoard file, and said it had converged after 0 s."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    sequences = json.loads((run / "checkpoint.json").read_text())["sequences"]
    capsys.readouterr()
    assert main(["train", "copy", "--resume", str(run), "--set", f"max_sequences={sequences}",
                 "--set", "lr=0.1", "--no-progress"]) == 0  # with plots: none are written
    out = capsys.readouterr().out.splitlines()
    # the run's config is not printed again (60 lines before the one that matters): where it is
    # and what --set changed
    assert out[:2] == [f"run directory: {run}",
                       f"config: the run's own ({run / 'config.json'}), with lr=0.1 (was 0.003)"]
    (line,) = [x for x in out if x.startswith("nothing to")]
    assert line == out[2]
    assert line.startswith(f"nothing to train: its budget is spent (max_sequences={sequences}")
    assert f"--set init_from={run} --out NEW_DIR (and its --preset and model settings" in line
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after.keys() - {".lock"} == before.keys() - {".lock"}
    assert all(after[k] == before[k] for k in before if k.name != ".lock")


def test_an_absent_device_is_refused_before_a_run_directory_is_made(tmp_path, capsys):
    """It printed the config, then the error, and left a directory holding only its lock."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "run"
    assert main(["train", "copy", "--out", str(out), "--set", "device=cuda"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("ntm: error: device 'cuda': CUDA is not available")
    assert captured.out == "" and not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["train", "copy", "--set", "colour=red"],
     "ntm: error: --set colour: unknown key; valid keys:"),
    (["train", "copy", "--set", "lr=fast"],
     "ntm: error: --set lr=fast: expected a value of type float"),
    (["train", "copy", "--preset", "huge"], "ntm: error: unknown preset 'huge' for task 'copy'"),
    (["evaluate", "/nonexistent/run"], "ntm: error: /nonexistent/run: no such checkpoint"),
    (["train", "copy", "--set", "engine=turbo"],
     "ntm: error: --set: engine='turbo' is not valid; valid choices: auto, native, graphs, eager"),
    (["train", "copy", "--set", "controller=gru"],
     "ntm: error: the model cannot be built from this config: unknown controller 'gru'; valid "
     "choices: feedforward, lstm"),
    (["train", "copy", "--set", "shift_range=100"],
     "ntm: error: the model cannot be built from this config: shift_range=100 needs"),
    (["train", "copy", "--set", "device=tpu"], "ntm: error: device 'tpu' is not a valid torch"),
    (["train", "copy", "--set", "device=cpu:5"], "ntm: error: device 'cpu:5': the CPU has no "
     "index 5; use cpu"),
    (["bench", "--threads", "0"], "ntm: error: --threads must be >= 1, got 0"),
    (["bench", "--seq-len", "0"], "ntm: error: --seq-len must be >= 1, got 0"),
    (["bench", "--steps", "0"], "ntm: error: --steps must be >= 1, got 0"),
    # sequences too long to be meant: refused before one is drawn (a billion steps would not
    # fit in memory) or from one drawn, with its steps
    (["bench", "--seq-len", "1000000000"], "ntm: error: --seq-len 1000000000: a copy sequence "
     "takes at least 1,000,000,000 steps, more than 10,000: choose a shorter --seq-len"),
    (["bench", "--seq-len", "5001"], "ntm: error: --seq-len 5001: a copy sequence takes 10,003 "
     "steps, more than 10,000"),
    (["evaluate", "RUN", "--lengths", "10,1000000000"], "ntm: error: --lengths 1000000000: a "
     "copy sequence takes at least 1,000,000,000 steps, more than 100,000: choose shorter "
     "lengths"),
    (["evaluate", "RUN", "--lengths", "50001"], "ntm: error: --lengths 50001: a copy sequence "
     "takes 100,003 steps, more than 100,000"),
    (["evaluate", "--pretrained", "repeat_copy", "--lengths", "10", "--repeats", "20,10000"],
     "ntm: error: --lengths 10 --repeats 10000: a repeat_copy sequence takes 100,013 steps, "
     "more than 100,000: choose shorter lengths or fewer repeats"),
    (["evaluate", "WEIGHTS"], "ntm: error: WEIGHTS: a weights file; pass its run directory "
     "(RUN) or the checkpoint.json"),
    (["bench", "--memory-size", "2", "--engines", "eager"],
     "ntm: error: --memory-size 2: shift_range=1 needs"),
    (["train", "copy", "--set", "task.min_length=30"],
     "ntm: error: the task cannot be built from this config: CopyTask: min_length=30 must be"),
])
def test_user_mistakes_end_in_one_clear_line(argv, message, capsys, trained, tmp_path,
                                              monkeypatch):
    monkeypatch.chdir(tmp_path)  # a mistake let through would train into runs/ here, not the repo's
    (weights,) = trained.glob("weights-*.safetensors")
    names = {"WEIGHTS": str(weights), "RUN": str(trained)}
    argv = [names.get(a, a) for a in argv]
    for name, value in names.items():
        message = message.replace(name, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_unknown_option_shows_its_command_usage(capsys):
    """It showed the top level's usage (``usage: ntm [-h] COMMAND ...``)."""
    with pytest.raises(SystemExit) as exit:
        main(["train", "copy", "--bogus"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ntm train ")
    assert "ntm train: error: unrecognized arguments: --bogus" in err
    with pytest.raises(SystemExit):  # a command with actions: the action's usage
        main(["pretrained", "export", "RUN", "NAME", "--bogus"])
    err = capsys.readouterr().err
    assert err.startswith("usage: ntm pretrained export ")
    assert "ntm pretrained export: error: unrecognized arguments: --bogus" in err
    with pytest.raises(SystemExit):  # before the command: the top level's, not the command's
        main(["--bogus", "train", "copy"])
    err = capsys.readouterr().err
    assert err.startswith("usage: ntm [-h] COMMAND")
    assert "ntm: error: unrecognized arguments: --bogus" in err


def test_an_unknown_bench_engine_is_a_usage_error_naming_the_engines(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["bench", "--engines", "native,turbo"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert ("ntm bench: error: argument --engines: expected comma-separated engines from auto, "
            "native, graphs, eager, got 'native,turbo'") in err and "Traceback" not in err


@pytest.mark.parametrize("command", [["evaluate", "--pretrained", "copy"],
                                     ["plot", "--pretrained", "copy"]])
def test_a_memory_size_below_one_is_a_usage_error_naming_the_flag(command, capsys):
    """It said "the model cannot be built from this config", not which flag was wrong."""
    with pytest.raises(SystemExit) as exit:
        main([*command, "--memory-size", "-5"])
    assert exit.value.code == 2
    assert ("error: argument --memory-size: expected a positive integer, got '-5'"
            in capsys.readouterr().err)


def test_an_engine_named_twice_is_benchmarked_once():
    from torch_ntm.cli import _engine_list

    assert _engine_list("native,eager,native") == ["native", "eager"]


def test_resume_refuses_to_change_the_model(trained, capsys):
    assert main(["train", "copy", "--resume", str(trained), "--set", "controller_size=9"]) == 2
    assert "--resume cannot change controller_size" in capsys.readouterr().err
    assert main(["train", "copy", "--resume", str(trained), "--set", "lr_decay=0.5"]) == 2
    assert "only device, ema_decay, eval_every, log_every, lr, lr_milestones, max_seconds" in (
        capsys.readouterr().err)
    # a task parameter by the key --set takes (it said "task_params")
    assert main(["train", "copy", "--resume", str(trained), "--set", "task.max_length=5"]) == 2
    assert "--resume cannot change task.max_length; only " in capsys.readouterr().err


def test_corrupt_checkpoint_is_one_line_naming_the_file(trained, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    weights = next(run.glob("weights-*.safetensors"))
    weights.write_bytes(b"garbage")
    assert main(["evaluate", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ntm: error: {weights}: file is corrupt or was modified")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [["train", "copy", "--bogus"], ["train", "sorting"], ["fly"]])
def test_unknown_options_and_names_are_rejected_by_argparse(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_curves_puts_several_runs_on_one_figure(trained, tmp_path, capsys):
    out = tmp_path / "figs" / "curves.png"
    assert main(["curves", str(trained), str(trained), "--labels", "ntm,again",
                 "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["curves", str(trained), "--labels", "a,b"]) == 2
    assert "--labels gives 2 labels for 1 runs" in capsys.readouterr().err
    assert main(["curves", str(trained), str(trained), "--out", str(out)]) == 2  # same labels
    assert "labels must differ" in capsys.readouterr().err


def test_evaluate_with_changed_task_parameters(trained, capsys):
    # Lengths come from --lengths; other task parameters from --task-set (here a width change,
    # which the model cannot take, and a valid change of the length range that --lengths fixes).
    assert main(["evaluate", str(trained), "--lengths", "2", "--sequences", "4",
                 "--task-set", "min_length=2", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["length"] == 2 and row["sequences"] == 4
    assert main(["evaluate", str(trained), "--task-set", "width=5"]) == 2
    assert "alters the task's input or output width" in capsys.readouterr().err
    assert main(["evaluate", str(trained), "--task-set", "min_length=0"]) == 2
    assert "min_length must be an integer >= 1" in capsys.readouterr().err
    # Mistakes are named in --task-set's own terms, not --set task.KEY's.
    for item, message in [
        ("colour=3", "ntm: error: --task-set colour: unknown key; valid keys: max_length, "
                     "min_length, width"),
        ("min_length=x", "ntm: error: --task-set min_length=x: expected a value of type int"),
        ("min_length", "ntm: error: --task-set expects key=value, got 'min_length'"),
    ]:
        assert main(["evaluate", str(trained), "--task-set", item]) == 2
        assert capsys.readouterr().err.strip() == message


def test_evaluate_repeat_copy_by_length_and_repeats(tmp_path, capsys):
    run = tmp_path / "rc"
    tiny = [a.replace("task.max_length=3", "task.max_length=2") for a in TINY]
    assert main(["train", "repeat_copy", "--out", str(run), "--no-plots", *tiny,
                 "--set", "task.max_repeats=2", "--set", "finetune="]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--lengths", "3,2", "--repeats", "4,1", "--sequences",
                 "5", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["length"], r["repeats"]) for r in rows] == [(2, 1), (2, 4), (3, 1), (3, 4)]
    for r in rows:
        assert r["sequences"] == 5 and 0 <= r["end_marker_wrong"] <= 1
        # data bits and marker bits make up the bit errors: at most one marker bit per step
        marker_bits = r["bit_errors"] - r["data_bit_errors"]
        assert 0 <= marker_bits <= r["repeats"] * r["length"] + 1
        assert (marker_bits > 0) == (r["end_marker_wrong"] > 0)
    # More repeats are more bits to get wrong for the untrained model.
    assert rows[1]["cost_bits"] > rows[0]["cost_bits"]
    assert main(["evaluate", str(run), "--lengths", "2", "--repeats", "3", "--sequences",
                 "2"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[:3] == ["length", "repeats", "sequences"] and header[-1] == "end_marker_wrong"


def test_evaluate_repeats_is_refused_for_other_tasks(trained, capsys):
    assert main(["evaluate", str(trained), "--repeats", "3"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "ntm: error: --repeats applies to repeat_copy, not copy"


def test_the_figures_take_a_trace_made_with_gradients(tmp_path, monkeypatch):
    """``model.trace(x)`` outside ``no_grad`` (as the README shows it) gave tensors that need
    a gradient, and each helper failed in ``.numpy()``. Each figure shows the trace's values."""
    import matplotlib.image
    import torch

    from torch_ntm import NTM, plot

    figures, save = {}, plot._save
    monkeypatch.setattr(plot, "_save", lambda fig, path: figures.setdefault(path.name, fig)
                        and save(fig, path))
    x = torch.rand(5, 1, 4)
    logits, _, trace = NTM(4, 3, controller_size=6, memory_size=8, memory_width=4).trace(x)
    assert logits.requires_grad
    outputs = torch.sigmoid(logits[:, 0])
    paths = [plot.plot_attention(trace, tmp_path / "a.png"),
             plot.plot_memory(trace, tmp_path / "m.png"),
             plot.plot_io(x[:, 0], x[:, 0, :3], outputs, torch.ones(5), tmp_path / "io.png")]
    for path in paths:  # written, and an image of some content, not a blank canvas
        assert matplotlib.image.imread(path)[..., :3].std() > 0.05, path

    def images(name):
        return [im.get_array() for ax in figures[name].axes for im in ax.get_images()]

    def rows_of(shown, table):  # every shown row is one of the table's rows, exactly
        return all(any((row == r).all() for r in table) for row in shown)

    # attention: each head's weighting over time, the rows the heads visited, write heads first
    weights = [trace.write_weights[:, 0, 0], trace.read_weights[:, 0, 0]]
    assert len(images("a.png")) == 2
    for shown, w in zip(images("a.png"), weights):
        assert shown.shape[1] == 5 and rows_of(shown, w.detach().numpy().T)
    # memory: the rows in use after steps 0, 1, 3 and 4
    memory = trace.memory[:, 0].detach().numpy()
    titles = [ax.get_title() for ax in figures["m.png"].axes if ax.get_images()]
    assert titles == [f"memory after step {t}" for t in (0, 1, 3, 4)]
    for shown, t in zip(images("m.png"), (0, 1, 3, 4)):
        assert shown.shape[1] == 4 and rows_of(shown, memory[t])
    # io: the inputs, targets and outputs over time
    shown = images("io.png")
    assert (shown[0] == x[:, 0].numpy().T).all() and (shown[1] == x[:, 0, :3].numpy().T).all()
    assert abs(shown[2] - outputs.detach().numpy().T).max() < 1e-6


@pytest.mark.parametrize("heads, grid", [((1, 1), (1, 2)), ((2, 3), (2, 3)), ((0, 5), (1, 5))])
def test_attention_figure_has_a_panel_for_every_head(heads, grid, tmp_path, monkeypatch):
    import torch

    from torch_ntm import NTM, plot

    write, read = heads
    figures = []
    monkeypatch.setattr(plot, "_save", lambda fig, path: figures.append(fig) or path)
    model = NTM(4, 3, controller_size=6, memory_size=8, memory_width=4, read_heads=read,
                write_heads=write)
    with torch.no_grad():
        _, _, trace = model.trace(torch.rand(5, 1, 4))
    plot.plot_attention(trace, tmp_path / "attention.png")
    panels = [ax for ax in figures[0].axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == (
        [f"write weighting (head {h})" for h in range(write)]
        + [f"read weighting (head {h})" for h in range(read)])
    rows, cols = grid  # beside each other up to 4 panels, else writes above reads
    assert {ax.get_subplotspec().get_geometry()[:2] for ax in panels} == {(rows, cols)}


@pytest.mark.parametrize("write_heads", [1, 2])
def test_the_dnc_figures_show_its_usage_gates_links_and_read_modes(write_heads, tmp_path,
                                                                   monkeypatch):
    """A DNC's own figures hold the trace's values: usage over the rows in use, each gate's
    curve, the last link matrix over the written rows, and every read head's modes."""
    import matplotlib.image
    import torch

    from torch_ntm import DNC, plot

    figures, save = {}, plot._save
    monkeypatch.setattr(plot, "_save", lambda fig, path: figures.setdefault(path.name, fig)
                        and save(fig, path))
    torch.manual_seed(0)
    model = DNC(4, 3, controller_size=8, memory_size=12, memory_width=4, read_heads=2,
                write_heads=write_heads)
    _, _, trace = model.trace(torch.rand(7, 1, 4))  # with gradients, as a user calls it
    paths = [plot.plot_usage(trace, tmp_path / "usage.png"),
             plot.plot_link(trace, tmp_path / "link.png"),
             plot.plot_read_modes(trace, tmp_path / "read_modes.png")]
    for path in paths:
        assert matplotlib.image.imread(path)[..., :3].std() > 0.05, path

    def images(name):
        return [im.get_array() for ax in figures[name].axes for im in ax.get_images()]

    def used(w):  # the rows the figure must show: every row with weight above 1e-2
        return (w.detach().reshape(-1, w.shape[-1]) > 1e-2).any(0).nonzero()[:, 0]

    # usage: rows ever used or written, over time; then one curve per gate
    usage = trace.usage[:, 0]
    rows = used(torch.cat([usage, trace.write_weights[:, 0].flatten(0, 1)]))
    (shown,) = images("usage.png")
    assert shown.shape == (len(rows), 7)
    assert (shown == usage[:, rows].T.detach().numpy()).all()
    lines = [line for ax in figures["usage.png"].axes for line in ax.get_lines()]
    gates = ([trace.write_gates[:, 0, h] for h in range(write_heads)]
             + [trace.allocation_gates[:, 0, h] for h in range(write_heads)]
             + [trace.free_gates[:, 0, r] for r in range(2)])
    assert len(lines) == len(gates)
    for line, gate in zip(lines, gates):
        assert (line.get_ydata() == gate.detach().numpy()).all()
    # link: the last step's matrix of each write head, over the rows that head wrote
    shown = images("link.png")
    assert len(shown) == write_heads
    for h, image in enumerate(shown):
        rows = used(trace.write_weights[:, 0, h])
        assert (image == trace.link[-1, 0, h][rows][:, rows].detach().numpy()).all()
    titles = [ax.get_title() for ax in figures["link.png"].axes if ax.get_images()]
    assert titles == [f"link matrix after step 6 (write head {h})" for h in range(write_heads)]
    # read modes: each read head's modes (rows) over time, named backward, content, forward
    shown = images("read_modes.png")
    assert len(shown) == 2
    for r, image in enumerate(shown):
        assert (image == trace.read_modes[:, 0, r].T.detach().numpy()).all()
    names = [t.get_text() for t in figures["read_modes.png"].axes[0].get_yticklabels()]
    assert names == (["backward", "content", "forward"] if write_heads == 1 else
                     ["backward 0", "backward 1", "content", "forward 0", "forward 1"])


def test_evaluate_seeds_scores_one_set_per_seed(trained, capsys):
    # Each seed's rows are what that seed alone gives; the default seed is 2014.
    def rows(*extra):
        assert main(["evaluate", str(trained), "--lengths", "2,3", "--sequences", "8", "--json",
                     *extra]) == 0
        return json.loads(capsys.readouterr().out)

    both = rows("--seeds", "5,2014")
    assert [(r["seed"], r["length"]) for r in both] == [(5, 2), (5, 3), (2014, 2), (2014, 3)]
    assert rows("--seeds", "5") == both[:2]  # named seeds are a column, even one
    assert [{k: v for k, v in r.items() if k != "seed"} for r in both[2:]] == rows()
    assert both[0]["cost_bits"] != both[2]["cost_bits"]  # other sequences


def test_evaluate_seeds_table_gives_each_size_mean_and_range_over_the_sets(trained, capsys):
    # The table's summary is computed from the sets' own rows (as --json gives them); one set
    # has no summary.
    import statistics

    def run(*extra):
        assert main(["evaluate", str(trained), "--lengths", "2,3", "--sequences", "8",
                     *extra]) == 0
        return capsys.readouterr().out

    sets = json.loads(run("--seeds", "5,6,7", "--json"))
    table = run("--seeds", "5,6,7")
    head, _, summary = table.partition("\nover the 3 sets: the mean, min and max at each size\n")
    assert len(head.splitlines()) == 1 + 6  # header, 3 sets x 2 lengths
    lines = [line.split() for line in summary.splitlines()]
    columns = lines[0]
    assert columns[:3] == ["length", "over", "sets"]  # "over sets" is one column's name
    scores = columns[3:]
    assert scores and "seed" not in scores and "sequences" not in scores
    assert [line[:2] for line in lines[1:]] == [[str(n), fold] for n in (2, 3)
                                                for fold in ("mean", "min", "max")]
    for line in lines[1:]:
        values = [r for r in sets if r["length"] == int(line[0])]
        for name, cell in zip(scores, line[2:]):
            got = [r[name] for r in values]
            want = {"mean": statistics.fmean(got), "min": min(got), "max": max(got)}[line[1]]
            assert float(cell) == pytest.approx(want, rel=1e-3, abs=1e-6)
    assert len({r["cost_bits"] for r in sets if r["length"] == 3}) > 1  # the sets differ
    assert "over the" not in run("--seeds", "5")


@pytest.mark.parametrize("seeds", ["1,1", "-1", "a"])
def test_evaluate_seeds_must_be_distinct_non_negative_integers(trained, seeds, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", str(trained), f"--seeds={seeds}"])
    assert exit_.value.code == 2
    assert "--seeds: expected" in capsys.readouterr().err


def test_evaluate_seeds_of_omniglot_gives_each_set_and_their_mean_and_range(capsys):
    import statistics

    def run(*extra):
        assert main(["evaluate", "--pretrained", "omniglot", "--sequences", "20", *extra]) == 0
        return capsys.readouterr().out

    report = json.loads(run("--seeds", "3,4,5", "--json"))
    assert report["split"] == "test" and report["episodes_per_set"] == 20
    assert [s["seed"] for s in report["sets"]] == [3, 4, 5]
    for s in report["sets"]:  # each set as that seed alone scores it
        alone = json.loads(run("--seeds", str(s["seed"]), "--json"))
        assert s["cost_bits"] == alone["cost_bits"]
        assert [s[f"accuracy_{k}"] for k in range(1, 11)] == [
            alone["accuracy_by_instance"][str(k)] for k in range(1, 11)]
    for key in ("cost_bits", "accuracy_2", "accuracy_10"):
        values = [s[key] for s in report["sets"]]
        assert report["mean"][key] == pytest.approx(statistics.fmean(values))
        assert (report["min"][key], report["max"][key]) == (min(values), max(values))
    assert len({s["accuracy_2"] for s in report["sets"]}) > 1  # the sets differ
    table = run("--seeds", "3,4,5").splitlines()
    assert table[0].startswith("3 sets of 20 held-out episodes (test split)")
    assert [line.split()[0] for line in table[2:]] == ["3", "4", "5", "mean", "min", "max"]
