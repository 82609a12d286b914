"""Faults and bad input: crafted records, bad values, concurrent writers, signals.

Each user mistake or hostile file ends in one line (``ntm: error: ...`` from the command line, a
`CheckpointError` or `ConfigError` from the API), a nonzero exit, and nothing written or removed
outside what the run owns.
"""

import errno
import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_ntm.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from torch_ntm.cli import main
from torch_ntm.presets import resolve_config
from torch_ntm.runlog import read_metrics
from torch_ntm.train import train

SRC = os.environ.get("FAULTS_SRC") or str(Path(__file__).resolve().parents[1] / "src")
TINY = ["controller_size=8", "memory_size=8", "memory_width=4", "batch_size=2",
        "max_sequences=4", "eval_every=1", "eval_sequences=2", "engine=auto",
        "task.max_length=3", "task.width=4"]
TINY_SET = [arg for item in TINY for arg in ("--set", item)]


def tiny_config(*extra):
    return resolve_config("copy", overrides=[*TINY, *extra])


def one_line_error(capsys, argv, status=2) -> str:
    """Run ``ntm argv`` in this process; assert one line on stderr and ``status``."""
    assert main(argv) == status
    err = capsys.readouterr().err
    assert err.startswith("ntm: error: "), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def ntm(*argv, timeout=120, **kwargs) -> subprocess.CompletedProcess:
    """``python -m torch_ntm argv`` in a child process (one thread, this checkout's code)."""
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch_ntm", *argv], env=env, timeout=timeout,
                          capture_output=True, text=True, **kwargs)


@pytest.fixture(scope="module")
def run_template(tmp_path_factory):
    run = tmp_path_factory.mktemp("faults") / "run"
    train(tiny_config(), run, progress=False)
    return run


@pytest.fixture
def run(run_template, tmp_path):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_template, copy)
    return copy


def edit_record(run: Path, **changes) -> dict:
    record = json.loads((run / "checkpoint.json").read_text())
    for key, value in changes.items():
        if value is KeyError:
            record.pop(key, None)
        else:
            record[key] = value
    (run / "checkpoint.json").write_text(json.dumps(record))
    return record


# -- Crafted checkpoint records ----------------------------------------------------------------

def hostile_names(tmp_path):
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(b"the user's own file")
    return victim, [str(victim), "../victim.safetensors", "sub/weights-1.safetensors",
                    "weights-1.safetensors/..", "", 7, None]


@pytest.mark.parametrize("key", ["weights", "train_state", "best"])
def test_a_record_naming_a_file_outside_the_run_is_refused(run, tmp_path, key):
    victim, names = hostile_names(tmp_path)
    for name in names:
        edit_record(run, **{key: name})
        with pytest.raises(CheckpointError, match=f"invalid checkpoint record \\({key} must be"):
            ckpt = load_checkpoint(run)
            ckpt.restore_train_state(_optimizer(ckpt))
            ckpt.model()  # the best validation's weights
    assert victim.read_bytes() == b"the user's own file"


@pytest.mark.parametrize("key, value", [("lr", "x"), ("eps", None), ("eps", 0),
                                        ("betas", [0.9, "y"])])
def test_a_hand_edited_optimizer_setting_is_a_one_line_error_at_resume(run, capsys, key,
                                                                      value):
    """lr = "x" passed loading and failed at the first step, in torch's Adam ("unsupported
    operand type(s) for /: 'str' and 'float'")."""
    record = json.loads((run / "checkpoint.json").read_text())
    record["optimizer"]["param_groups"][0][key] = value
    edit_record(run, optimizer=record["optimizer"])
    err = one_line_error(capsys, ["train", "copy", "--resume", str(run), "--no-plots",
                                  "--no-progress", "--set", "max_sequences=8"])
    assert f"optimizer state does not fit this configuration (param_groups {key} is" in err


@pytest.mark.parametrize("size", [3.5, 1_000_000, -1, True])
def test_a_hand_edited_curriculum_size_is_a_one_line_error_at_resume(run, capsys, size):
    """3.5 and 1000000 gave tracebacks from the task's ``up_to`` at resume."""
    record = json.loads((run / "checkpoint.json").read_text())
    edit_record(run, extra={**record["extra"], "curriculum_size": size})
    err = one_line_error(capsys, ["train", "copy", "--resume", str(run), "--no-plots",
                                  "--no-progress", "--set", "max_sequences=8"])
    assert f"extra.curriculum_size is {size!r}, not a size of this task from 1 to 3" in err


def _optimizer(ckpt):
    from torch_ntm.train import make_optimizer

    return make_optimizer(ckpt.config, ckpt.model().parameters())


def test_saving_over_a_crafted_record_removes_nothing_outside_the_run(run, tmp_path):
    victim, names = hostile_names(tmp_path)
    ckpt = load_checkpoint(run)
    model = ckpt.model()
    for name in names:
        edit_record(run, weights=name, train_state=name, best=name)
        save_checkpoint(run, ckpt.config, model, step=5)
        assert victim.read_bytes() == b"the user's own file", name


def test_resume_from_a_crafted_record_is_one_line_and_keeps_the_file(run, tmp_path, capsys):
    victim, _ = hostile_names(tmp_path)
    edit_record(run, weights=str(victim))
    err = one_line_error(capsys, ["train", "copy", "--resume", str(run), "--no-plots",
                                  "--no-progress"])
    assert "weights must be a file name like weights-[0-9]+.safetensors" in err
    assert victim.read_bytes() == b"the user's own file"


@pytest.mark.parametrize("key", ["weights_sha256", "train_state_sha256"])
@pytest.mark.parametrize("value", [None, KeyError, "", "0" * 63, 12])
def test_a_missing_or_null_hash_is_an_error_not_a_skipped_check(run, key, value):
    edit_record(run, **{key: value})
    with pytest.raises(CheckpointError, match=f"{key} must be the SHA-256"):
        ckpt = load_checkpoint(run)
        ckpt.restore_train_state(_optimizer(ckpt))


@pytest.mark.slow  # a Python process, 5 s in CI
def test_a_fifo_or_device_as_weights_is_refused_without_hanging(run, tmp_path):
    record = json.loads((run / "checkpoint.json").read_text())
    weights = run / record["weights"]
    weights.unlink()
    os.mkfifo(weights)
    code = f"from torch_ntm.checkpoint import load_checkpoint; load_checkpoint({str(run)!r})"
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=30)
    assert "not a regular file" in done.stderr
    weights.unlink()
    weights.symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        load_checkpoint(run)


@pytest.mark.parametrize("changes, message", [
    ({"step": "abc"}, "step must be an integer from 0 to 2**63 - 1"),
    ({"step": -1}, "step must be an integer from 0 to 2**63 - 1"),
    ({"sequences": 1.5}, "sequences must be an integer from 0 to 2**63 - 1"),
    ({"elapsed_s": "x"}, "elapsed_s must be a number"),
    ({"metrics": [1, 2]}, "metrics must be an object of numbers"),
    ({"metrics": {"bit_errors": "none"}}, "metrics must be an object of numbers"),
    ({"extra": [1]}, "extra must be an object"),
    ({"config": [1]}, "config must be an object"),
    ({"config": {"lr": "fast"}}, "lr must be float"),
])
def test_hand_edited_records_are_one_line(run, capsys, changes, message):
    edit_record(run, **changes)
    err = one_line_error(capsys, ["evaluate", str(run), "--sequences", "2", "--lengths", "2"])
    assert "invalid checkpoint record" in err and message in err


@pytest.mark.parametrize("running", [[1.0, 2.0], 3.0])
def test_a_hand_edited_running_sum_stops_a_resume_in_one_line(run, capsys, running):
    extra = json.loads((run / "checkpoint.json").read_text())["extra"]
    edit_record(run, extra={**extra, "running": running})
    err = one_line_error(capsys, ["train", "copy", "--resume", str(run), "--set",
                                  "max_sequences=8"])
    assert "invalid checkpoint record (running" in err


def test_deeply_nested_json_is_one_line(run, capsys):
    (run / "checkpoint.json").write_text("[" * 200_000 + "]" * 200_000)
    err = one_line_error(capsys, ["evaluate", str(run)])
    assert "not a readable checkpoint JSON file" in err


def test_a_save_removes_superseded_and_temporary_files_only(run):
    ckpt = load_checkpoint(run)
    leftovers = [".weights-00000002.safetensors.abc123.tmp", ".checkpoint.json.x_y.tmp",
                 ".metrics.csv.q.tmp", "weights-00000003.safetensors",
                 "train-state-00000003.safetensors"]
    kept = ["weights-3.safetensors.bak", ".notes.tmp", "my-weights-1.safetensors", "notes.txt"]
    for name in leftovers + kept:
        (run / name).write_bytes(b"x")
    save_checkpoint(run, ckpt.config, ckpt.model(), step=7)
    names = {p.name for p in run.iterdir()}
    assert not names & set(leftovers)
    assert set(kept) <= names
    assert "weights-00000007.safetensors" in names
    assert not list(run.glob("train-state-*"))  # a weights-only save supersedes the state too
    assert hashlib.sha256((run / "weights-00000007.safetensors").read_bytes()).hexdigest() == \
        json.loads((run / "checkpoint.json").read_text())["weights_sha256"]


# -- --out: nothing overwritten unless asked ---------------------------------------------------

def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes (a lock file's: only that it is there; its
    holder writes what it is doing into it while it holds it)."""
    return {str(p.relative_to(folder)): b"" if p.name == ".lock" else p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def train_argv(out, *extra):
    return ["train", "copy", "--out", str(out), "--no-plots", "--no-progress", *TINY_SET, *extra]


def test_out_refuses_a_folder_of_the_users_own_files(tmp_path, capsys):
    folder = tmp_path / "mine"
    (folder / "figures").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "metrics.csv").write_text("a,b\n1,2\n")
    before = snapshot(folder)
    err = one_line_error(capsys, train_argv(folder))
    assert "is not empty (holds config.json, figures, metrics.csv)" in err and "--overwrite" in err
    assert snapshot(folder) == before and not (folder / ".lock").exists()


def test_out_refuses_an_existing_run_without_resume_or_overwrite(run, capsys):
    before = snapshot(run)
    err = one_line_error(capsys, train_argv(run))
    assert f"--out {run}: already holds a run; continue it with --resume {run}" in err
    assert snapshot(run) == before


def test_a_start_that_fails_on_a_bad_config_leaves_the_old_run_alone(run, capsys):
    before = snapshot(run)
    one_line_error(capsys, train_argv(run, "--set", "batch_size=0", "--overwrite"))
    one_line_error(capsys, train_argv(run, "--set", "shift_range=100", "--overwrite"))
    assert snapshot(run) == before


def test_overwrite_replaces_the_runs_files_and_keeps_the_others(run, capsys):
    (run / "notes.txt").write_text("mine")
    (run / "figures").mkdir(exist_ok=True)  # the old run's figures (it left them with
    (run / "figures" / "io.png").write_bytes(b"old")  # --no-plots), and one of the user's
    (run / "figures" / "mine.png").write_bytes(b"mine")
    old_weights = {p.name for p in run.glob("weights-*")}
    assert main(train_argv(run, "--overwrite", "--set", "max_sequences=2")) == 0
    assert (run / "notes.txt").read_text() == "mine"
    assert load_checkpoint(run).sequences == 2
    assert not old_weights & {p.name for p in run.glob("weights-*")}
    assert {r["sequences"] for r in read_metrics(run / "metrics.csv")} == {"2"}  # none old
    assert [p.name for p in (run / "figures").iterdir()] == ["mine.png"]


def test_a_run_stopped_before_its_first_checkpoint_says_to_start_it_again(tmp_path, capsys):
    """Neither message said why: 'no such checkpoint' and 'is not empty'."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(tiny_config().to_json())
    (run / "metrics.csv").write_text("")
    err = one_line_error(capsys, ["train", "copy", "--resume", str(run)])
    assert err.rstrip().endswith(f"its run was stopped before its first checkpoint: start it "
                                 f"again with ntm train ... --out {run} --overwrite")
    err = one_line_error(capsys, train_argv(run))
    assert err.rstrip().endswith("it holds a run stopped before its first checkpoint, which "
                                 "--overwrite starts again")


def test_resume_takes_the_checkpoint_file_as_evaluate_does(run, capsys):
    """It failed with 'cannot write the run directory (File exists)'."""
    assert main(["train", "copy", "--resume", str(run / "checkpoint.json"), "--no-plots",
                 "--no-progress", "--set", "max_sequences=8"]) == 0
    assert load_checkpoint(run).sequences == 8


@pytest.mark.parametrize("out", ["", "  ", "."])
def test_out_refuses_the_empty_name_and_the_current_directory(tmp_path, monkeypatch, capsys,
                                                               out):
    monkeypatch.chdir(tmp_path)
    one_line_error(capsys, train_argv(out))
    one_line_error(capsys, train_argv(out, "--overwrite"))
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_a_file_or_cannot_be_made_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert "exists and is not a directory" in one_line_error(capsys, train_argv(tmp_path / "file"))
    err = one_line_error(capsys, train_argv("/proc/no-such-dir/run"))
    assert "cannot write the run directory" in err


@pytest.mark.parametrize("flag", [["--seed", "3"], ["--preset", "ntm-ff"], ["--overwrite"],
                                  ["--out", "elsewhere"]])
def test_resume_refuses_options_it_would_ignore(run, capsys, flag):
    before = snapshot(run)
    err = one_line_error(capsys, ["train", "copy", "--resume", str(run), *flag])
    assert f"{flag[0]} cannot be given with --resume" in err
    assert snapshot(run) == before


# -- One writer per run directory -------------------------------------------------------------

def test_a_second_writer_gets_one_line_and_changes_nothing(run, tmp_path, capsys):
    import fcntl

    with open(run / ".lock", "a") as held:  # another process's lock (its own open file)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("training into this run directory (process 1)")  # as a holder says so
        held.flush()
        before = snapshot(run)
        for argv in (["train", "copy", "--resume", str(run), "--set", "max_sequences=8",
                      "--no-plots", "--no-progress"], train_argv(run, "--overwrite")):
            err = one_line_error(capsys, argv)
            assert "another process is training into this run directory" in err
        assert snapshot(run) == before
        with pytest.raises(CheckpointError, match="another process is training"):
            train(tiny_config(), run, resume=True, progress=False)
    assert main(["train", "copy", "--resume", str(run), "--set", "max_sequences=8",
                 "--no-plots", "--no-progress"]) == 0  # released: the run continues


@pytest.mark.slow
def test_two_trainings_into_one_directory_at_once(tmp_path):
    """Two real processes: exactly one trains, the other is refused with one line."""
    out = tmp_path / "run"
    argv = ["train", "copy", "--out", str(out), "--overwrite", "--no-plots", "--no-progress",
            *TINY_SET, "--set", "max_sequences=40"]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "torch_ntm", *argv], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    for p in procs:
        p.stderr.close()
    codes = sorted(code for code, _ in results)
    if codes == [0, 0]:  # the first had finished before the second started: nothing to test
        pytest.skip("the trainings did not overlap")
    assert codes == [0, 2], results
    err = next(e for code, e in results if code == 2)
    assert "another process is training" in err and len(err.strip().splitlines()) == 1
    assert load_checkpoint(out).sequences == 40
    assert len(list(out.glob("weights-*"))) == 1


# -- Every value checked when it is parsed, before anything is written ------------------------

BAD_SETS = ["batch_size=0", "batch_size=-4", "eval_every=0", "log_every=0", "eval_sequences=0",
            "threads=0", "lr=nan", "lr=-1", "lr=inf", "lr=0", "momentum=-1", "momentum=1",
            "rmsprop_alpha=2", "clip_norm=nan", "clip_value=-1", "lr_decay=nan", "lr_decay=0",
            "lr_decay=2", "max_seconds=nan", "max_seconds=-1", "seed=-1",
            "seed=100000000000000000000000", "memory_size=1000000000", "memory_size=0",
            "stop_bit_errors=nan", "max_sequences=0", "patience_evals=0", "batch_size=1e3",
            "seed=1e23", "clip_spikes=0.5", "clip_spikes=nan", "max_gamma=1", "max_gamma=-2",
            "max_beta=inf", "eval_sizes=0", "eval_sizes=40,x", "eval_size_sequences=0",
            "task.max_length=100000", "eval_sizes=40,6000", "eval_repeats=0", "eval_repeats=15",
            "eval_sizes=1000000000"]  # refused before a sequence of a billion steps is drawn


@pytest.mark.parametrize("item", BAD_SETS)
def test_a_bad_set_value_is_one_line_and_writes_nothing(tmp_path, capsys, item):
    out = tmp_path / "run"
    err = one_line_error(capsys, train_argv(out, "--set", item))
    key = item.partition("=")[0]
    assert key in err
    assert not out.exists()


def test_bad_values_from_python_are_refused_before_anything_is_written(tmp_path):
    from torch_ntm.config import ConfigError

    for change in ({"batch_size": 0}, {"lr": float("nan")}, {"momentum": 1.0}):
        config = tiny_config().replaced(**change)
        with pytest.raises(ConfigError, match="out of range"):
            train(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_preset_empty_and_seed_out_of_range_are_one_line(tmp_path, capsys):
    assert "unknown preset ''" in one_line_error(capsys, train_argv(tmp_path / "a", "--preset",
                                                                    ""))
    assert "seed" in one_line_error(capsys, train_argv(tmp_path / "b", "--seed", "-2"))
    assert not list(tmp_path.iterdir())


def test_curves_of_a_run_with_no_validation_yet_says_so(run, capsys):
    """It said "not a run directory?" of a run that had just not validated yet."""
    lines = (run / "metrics.csv").read_text().splitlines()
    (run / "metrics.csv").write_text("\n".join(lines[:1]) + "\n")
    err = one_line_error(capsys, ["curves", str(run), "--out", str(run.parent / "c.png")])
    assert "no val rows in metrics.csv (none logged yet: a run writes its first at" in err


def test_other_commands_check_their_values(run, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    cases = [
        (["evaluate", str(run), "--sequences", "0"], "--sequences must be >= 1"),
        (["evaluate", str(run), "--memory-size", "1000000000"], "memory_size=1000000000"),
        (["plot", str(run), "--length", "-3"], "--length must be >= 1"),
        (["plot", str(run), "--out", str(tmp_path / "file")], "exists and is not a directory"),
        (["pretrained", "export", str(run), "x", "--dest", str(tmp_path / "file")],
         "exists and is not a directory"),
        (["curves", str(run), "--out", str(tmp_path)], "is a directory"),
        (["curves", str(tmp_path), "--labels", "x"], "(not a run directory?)"),
        (["curves", str(run), "--out", str(tmp_path / "c.txt")],  # matplotlib's traceback
         "c.txt: not an image file matplotlib writes; end it in one of .avif, "),
        (["curves", str(run), "--out", str(tmp_path / "curves")], "(e.g. curves.png)"),
        # n-grams sequences are at least 6 long: a size the task refuses is a user's mistake
        (["evaluate", "--pretrained", "ngrams", "--lengths", "5"],
         "--lengths 5: no sequence of this task has length = 5"),
        (["plot", "--pretrained", "ngrams", "--length", "5", "--out", str(tmp_path / "f")],
         "--length 5: no sequence of this task has length = 5"),
    ]
    for argv, message in cases:
        assert message in one_line_error(capsys, argv), argv
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage\n", b" \n", b"step,sequences,elapsed_s,"
                                     b"split,cost_bits,bit_errors,perfect\n,,,,,,\n",
                                     b"step,sequences,elapsed_s,split\nabc,1,2,val\n",
                                     # numbers that are not (curves and plot raised ValueError)
                                     b"step,sequences,elapsed_s,split,cost_bits\n5,abc,0.1,"
                                     b"val,1\n",
                                     b"step,sequences,elapsed_s,split,cost_bits\n5,8,0.1,"
                                     b"val,yy\n"])
def test_an_unreadable_metrics_file_is_one_line(run, capsys, content):
    (run / "metrics.csv").write_bytes(content)
    before = snapshot(run)
    err = one_line_error(capsys, ["curves", str(run), "--out", str(run.parent / "c.png")])
    assert "metrics.csv" in err
    err = one_line_error(capsys, ["plot", str(run), "--out", str(run.parent / "figures")])
    assert "metrics.csv" in err
    err = one_line_error(capsys, ["train", "copy", "--resume", str(run), "--no-plots",
                                  "--no-progress", "--set", "max_sequences=8"])
    assert "metrics.csv" in err
    assert snapshot(run) == before


# -- Signals: a checkpoint at the current step, then one line ---------------------------------

def test_sigterm_saves_the_current_step_and_the_resume_is_bit_identical(tmp_path, monkeypatch):
    import signal

    import torch

    import torch_ntm.metrics as metrics_module  # training takes its loss from metrics.objective
    from torch_ntm.train import Interrupted

    config = tiny_config("max_sequences=16", "eval_every=5", "log_every=1")
    full = train(config, tmp_path / "full", progress=False)
    calls = []
    real_loss = metrics_module.masked_bce

    def loss_then_signal(*args, **kwargs):  # the signal comes in the middle of step 3
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(metrics_module, "masked_bce", loss_then_signal)
    with pytest.raises(Interrupted) as stopped:
        train(config, tmp_path / "split", progress=False)
    assert (stopped.value.step, stopped.value.signum) == (3, signal.SIGTERM)
    assert load_checkpoint(tmp_path / "split").step == 3
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers put back
    monkeypatch.setattr(metrics_module, "masked_bce", real_loss)
    resumed = train(config, tmp_path / "split", resume=True, progress=False)
    assert resumed.step == full.step == 8
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "split")
    for key, value in a.state_dict.items():
        assert torch.equal(value, b.state_dict[key]), key
    assert a.metrics == b.metrics


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])  # SIGHUP saved nothing
def test_a_signal_to_ntm_train_saves_a_checkpoint_and_prints_one_line(tmp_path, signame):
    import signal
    import time

    out = tmp_path / "run"
    argv = [*train_argv(out, "--set", "max_sequences=1000000", "--set", "eval_every=100000",
                        "--set", "log_every=1")]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "torch_ntm", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until it is training: a few rows in metrics.csv
        csv = out / "metrics.csv"
        if csv.exists() and len(csv.read_text().splitlines()) > 3:
            break
        time.sleep(0.1)
    proc.send_signal(getattr(signal, signame))
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 128 + getattr(signal, signame)
    line = err.strip().splitlines()
    assert len(line) == 1 and line[0].startswith("ntm: interrupted at step "), err
    step = int(line[0].split("at step ")[1].split(";")[0])
    assert line[0].endswith(f"checkpoint saved, resume with --resume {out}")
    assert load_checkpoint(out).step == step > 0
    done = ntm("train", "copy", "--resume", str(out), "--no-plots", "--no-progress",
               "--set", f"max_sequences={2 * (step + 2)}")
    assert done.returncode == 0, done.stderr
    assert load_checkpoint(out).step == step + 2


@pytest.mark.slow
@pytest.mark.parametrize("limit", [600, 12000])  # metrics.csv; the training state
def test_a_full_disk_is_one_line_and_leaves_a_loadable_run(tmp_path, limit):
    """A file size limit (ulimit -f) fails some write of a run: the first metrics rows, a
    checkpoint's weights or training state. One line, exit 1, and what is left loads."""
    import resource

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = tmp_path / "run"
    result = ntm(*train_argv(out, "--set", "max_sequences=40", "--set", "log_every=1"),
                 preexec_fn=small_files)
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip().splitlines()
    assert len(line) == 1 and line[0].startswith(f"ntm: error: {out}/"), line
    assert line[0].endswith(": File too large (the file size limit (ulimit -f) is below what the "
                            "run writes: raise it)"), line
    if (out / "checkpoint.json").exists():  # an earlier save completed: it is whole
        assert load_checkpoint(out).step >= 1
    assert not list(out.glob("*.tmp"))


# -- SIGKILL: at random moments and inside saves, then resume: bit-identical -------------------

# The eager engine: its steps take long enough for a kill to land between two of them (the
# native engine ran all 24 of this tiny model's steps between two polls of the log).
KILLED = TINY_SET + ["--set", "log_every=1", "--set", "eval_every=3", "--set", "engine=eager"]
# The child of the kill-in-a-save test: SIGKILL itself at the K-th os.replace (every file of a
# checkpoint, and metrics.csv, is written to a temporary name and renamed into place), WHEN
# "before" (the temporary file is complete, not yet renamed) or "after" the rename.
KILL_AT_REPLACE = """
import os, signal, sys
from torch_ntm.cli import main
k, when, calls, real = int(sys.argv[1]), sys.argv[2], [], os.replace
def replace(*args, **kwargs):
    calls.append(args)
    if len(calls) == k and when == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    real(*args, **kwargs)
    if len(calls) == k and when == "after":
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
sys.exit(main(sys.argv[3:]))
"""


def restart_argv(out: Path, budget: int) -> list[str]:
    """What a user runs after a crash: resume if a checkpoint was written, else start over."""
    budget_set = ["--set", f"max_sequences={budget}"]
    if not (out / "checkpoint.json").exists():
        return train_argv(out, *KILLED, "--overwrite", *budget_set)
    return ["train", "copy", "--resume", str(out), "--no-plots", "--no-progress", *budget_set]


def assert_same_run(a: Path, b: Path) -> None:
    import torch

    first, second = load_checkpoint(a), load_checkpoint(b)
    assert first.step == second.step
    for key, value in first.state_dict.items():
        assert torch.equal(value, second.state_dict[key]), key
    assert first.metrics == second.metrics and first.best().metrics == second.best().metrics


def logged_step(out: Path) -> int:
    """The step of the last complete row in ``out/metrics.csv`` (-1 before the first)."""
    try:
        lines = (out / "metrics.csv").read_bytes().split(b"\n")[1:-1]
    except OSError:
        return -1
    return int(lines[-1].split(b",")[0]) if lines else -1


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run the killed ones must end equal to: 24 steps, validated every 3."""
    out = tmp_path_factory.mktemp("kills") / "full"
    assert main(train_argv(out, *KILLED, "--set", "max_sequences=48")) == 0
    return out


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_is_bit_identical(tmp_path, uninterrupted):
    import random
    import signal
    import time

    rng = random.Random(7)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    argv = train_argv(out, *KILLED, "--set", "max_sequences=48")
    for attempt in range(4):  # killed three times at random steps, then left to finish
        done = load_checkpoint(out).step if (out / "checkpoint.json").exists() else 0
        target = rng.randint(done + 1, 23)  # a step of the 24, plus a moment
        proc = subprocess.Popen([sys.executable, "-m", "torch_ntm", *argv], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while attempt < 3 and proc.poll() is None and time.monotonic() < deadline:
            if logged_step(out) >= target:
                time.sleep(rng.uniform(0, 0.02))
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
        proc.wait(timeout=120)
        assert proc.returncode == (0 if attempt == 3 else -signal.SIGKILL), proc.stderr.read()
        argv = restart_argv(out, 48)
    assert_same_run(uninterrupted, out)


@pytest.mark.parametrize("k, when", [
    (2, "before"),  # config.json, before its rename (metrics.csv is the first)
    (3, "before"),  # the first save's weights file, before its rename: no checkpoint yet
    (6, "after"),  # the first checkpoint.json renamed, superseded files not yet removed
    (7, "after"), (8, "after"),  # the second save: its weights, its training state
    (10, "before")])  # its checkpoint.json, complete under its temporary name
@pytest.mark.slow
def test_sigkill_inside_a_save_then_resume_is_bit_identical(tmp_path, uninterrupted, k, when):
    import signal

    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, "-c", KILL_AT_REPLACE, str(k), when,
                             *train_argv(out, *KILLED, "--set", "max_sequences=48")],
                            env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert main(restart_argv(out, 48)) == 0
    assert_same_run(uninterrupted, out)
    assert not list(out.glob("*.tmp"))  # the temporary files of the killed save are gone


# -- Python API: the wrong dtype or state is a clear ValueError --------------------------------

@pytest.mark.parametrize("engine", ["auto", "eager", "native"])
@pytest.mark.parametrize("dtype", ["int64", "float16", "bfloat16", "float64"])
def test_input_of_another_dtype_names_expected_and_actual(engine, dtype):
    import torch

    from torch_ntm import NTM

    ntm = NTM(5, 4, controller_size=8, memory_size=8, memory_width=4, engine=engine)
    x = torch.zeros(3, 2, 5, dtype=getattr(torch, dtype))
    expected = f"expects input of dtype torch.float32 .*got torch.{dtype}; convert with "
    with pytest.raises(ValueError, match=expected) as error:
        ntm(x)  # the check comes before any engine
    # converting the model is advice only towards another float (not .to(torch.int64))
    assert ("or the model with" in str(error.value)) == (dtype != "int64")


@pytest.mark.parametrize("cell", [False, True])
def test_a_batch_of_zero_is_named(cell):
    """It met initial_state's "batch_size must be an integer >= 1, got 0": an argument the
    caller never passed."""
    import torch

    from torch_ntm import NTM, NTMCell

    model = (NTMCell if cell else NTM)(5, 4, controller_size=8, memory_size=8, memory_width=4)
    x = torch.zeros(0, 5) if cell else torch.zeros(3, 0, 5)
    with pytest.raises(ValueError, match=r"NTM(Cell)? got a batch of 0"):
        model(x)


@pytest.mark.parametrize("dtype", ["int64", "float16", "bfloat16"])
def test_cell_input_of_another_dtype_names_expected_and_actual(dtype):
    import torch

    from torch_ntm.model import NTMCell

    cell = NTMCell(5, 4, controller_size=8, memory_size=8, memory_width=4)
    with pytest.raises(ValueError, match="NTMCell expects input of dtype torch.float32"):
        cell(torch.zeros(2, 5, dtype=getattr(torch, dtype)))


@pytest.mark.parametrize("name", ["NTMCell", "MANNCell"])
@pytest.mark.parametrize("given, error, message", [
    ("list", TypeError, r"{cell} expects a tensor of shape \[batch, 5\], got list"),
    ("sequence", ValueError, r"{cell} expects input of shape \[batch, 5\], got \[3, 2, 5\]; "
                             r"for a sequence \[time, batch, 5\] use {sequence}$"),
    ("too wide", ValueError, r"{cell} expects input of shape \[batch, 5\], got \[2, 6\]"),
])
def test_cell_input_of_another_kind_or_shape_names_the_expected_shape(name, given, error, message):
    import torch

    import torch_ntm

    cell = getattr(torch_ntm, name)(5, 4, controller_size=8, memory_size=8, memory_width=4)
    x = {"list": [[0.0] * 5] * 2, "sequence": torch.zeros(3, 2, 5),
         "too wide": torch.zeros(2, 6)}[given]
    with pytest.raises(error, match=message.format(cell=name, sequence=name[:-4])):
        cell(x)


@pytest.mark.parametrize("engine", ["auto", "eager"])
def test_a_state_from_another_controller_names_the_expected_shape(engine):
    import torch

    from torch_ntm import NTM

    sizes = dict(memory_size=8, memory_width=4)
    lstm = NTM(5, 4, controller_size=8, controller_layers=2, engine=engine, **sizes)
    ff = NTM(5, 4, controller="feedforward", controller_size=8, engine=engine, **sizes)
    wider = NTM(5, 4, controller_size=12, controller_layers=2, engine=engine, **sizes)
    x = torch.zeros(3, 2, 5)
    with pytest.raises(ValueError, match=r"state.controller must be \(h, c\), each of shape "
                                         r"\[2, 2, 8\].*got \(\)"):
        lstm(x, ff.initial_state(2))
    with pytest.raises(ValueError, match=r"each of shape \[2, 2, 8\].*got \(a tensor of shape "
                                         r"\[2, 2, 12\]"):
        lstm(x, wider.initial_state(2))
    with pytest.raises(ValueError, match=r"state.controller must be \(\) for a feed-forward"):
        ff(x, lstm.initial_state(2))
    _, state = lstm(x)  # a state the model itself returned still fits
    lstm(x, state)


def test_a_reader_racing_a_save_gets_the_new_checkpoint(run, monkeypatch):
    """A training saves (and removes the old weights) between a reader's reading the record and
    its weights: the reader follows the new record instead of reporting a missing file."""
    import torch_ntm.checkpoint as module

    ckpt = load_checkpoint(run)
    real = module._load_tensors
    raced = []

    def save_first(path, sha256):
        if not raced:
            raced.append(path)
            save_checkpoint(run, ckpt.config, ckpt.model(), step=9)
        return real(path, sha256)

    monkeypatch.setattr(module, "_load_tensors", save_first)
    assert load_checkpoint(run).step == 9 and not raced[0].exists()


def test_a_loaded_checkpoint_keeps_its_best_weights_when_a_training_replaces_them(run):
    """`ntm plot` on a run still training: it rebuilt the model a second time, seconds after
    loading, and the training had saved again and removed the best validation's file."""
    ckpt = load_checkpoint(run)
    assert ckpt.best_metrics is not None
    best_files = list(run.glob("best-*.safetensors"))
    assert best_files
    for path in best_files:  # what the next save of a training does to them
        path.unlink()
    kept = ckpt.model().state_dict()
    for name, value in ckpt.model(memory_size=64).state_dict().items():
        assert value.equal(kept[name]), name
    assert ckpt.best() is not None


def test_a_failure_while_rewriting_metrics_at_resume_keeps_the_old_rows(run, monkeypatch):
    import csv

    before = (run / "metrics.csv").read_bytes()

    def fail(self, rows):
        raise OSError("killed while writing metrics.csv")

    monkeypatch.setattr(csv.DictWriter, "writerows", fail)
    with pytest.raises(OSError, match="killed while writing"):
        train(tiny_config("max_sequences=8"), run, resume=True, progress=False)
    assert (run / "metrics.csv").read_bytes() == before


def test_evaluating_no_batches_is_a_clear_error():
    from torch_ntm import NTM
    from torch_ntm.evaluate import evaluate_batches

    with pytest.raises(ValueError, match="no batches to evaluate"):
        evaluate_batches(NTM(9, 8), [])


# -- Run directories II: nothing written, removed or read through a planted link ---------------

RESUME = ["--no-plots", "--no-progress", "--set", "max_sequences=8"]


def outside_file(tmp_path: Path, name: str = "victim.txt") -> Path:
    """A file of the user's outside the run, that a link planted in the run points to."""
    victim = tmp_path / "outside" / name
    victim.parent.mkdir(exist_ok=True)
    victim.write_bytes(b"the user's own file")
    return victim


def plant(link: str, path: Path, target: Path) -> None:
    """Put ``link`` ("symlink" or "hardlink") to ``target`` at ``path`` (replacing a file)."""
    if path.is_file() and not path.is_symlink():
        path.unlink()
    if link == "symlink":
        path.symlink_to(target)
    else:
        os.link(target, path)


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_config_json_linked_outside_is_refused_at_resume_and_left_alone(run, tmp_path, capsys,
                                                                       link):
    """`--resume` wrote config.json through the link: the outside file was overwritten."""
    victim = outside_file(tmp_path)
    plant(link, run / "config.json", victim)
    err = one_line_error(capsys, ["train", "copy", "--resume", str(run), *RESUME])
    assert f"{run / 'config.json'}: is " in err
    assert ("symbolic link" if link == "symlink" else "hard-linked") in err
    assert victim.read_bytes() == b"the user's own file"


@pytest.mark.parametrize("folder", ["figures", "tb"])
def test_figures_or_tb_linked_outside_are_refused_and_left_alone(run, tmp_path, capsys, folder):
    """`--overwrite` replaced the outside io.png and deleted an outside events file; a resume
    and `ntm plot` wrote into the outside folder."""
    import shutil

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "io.png").write_bytes(b"mine")
    (outside / "events.out.tfevents.1.host.2.0").write_bytes(b"mine")
    shutil.rmtree(run / folder, ignore_errors=True)
    (run / folder).symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    err = one_line_error(capsys, train_argv(run, "--overwrite"))
    assert f"{folder} is not (a link" in err
    err = one_line_error(capsys, ["train", "copy", "--resume", str(run), *RESUME]
                         if folder == "tb" else ["plot", str(run)])
    assert f"{run / folder}: is a symbolic link" in err
    assert snapshot(outside) == before


def test_overwrite_checks_every_file_it_would_remove_before_removing_any(run, tmp_path, capsys):
    victim = outside_file(tmp_path, "io.png")
    (run / "figures").mkdir(exist_ok=True)
    plant("symlink", run / "figures" / "io.png", victim)
    before = snapshot(run)
    err = one_line_error(capsys, train_argv(run, "--overwrite"))
    assert "figures/io.png is not (a link" in err
    assert snapshot(run) == before and victim.read_bytes() == b"the user's own file"


@pytest.mark.slow
def test_a_sweep_writes_no_log_or_report_through_a_link(tmp_path, capsys):
    """A sweep's seed-0/train.log linked outside was truncated and written; so was report.md."""
    victim = outside_file(tmp_path)
    out = tmp_path / "sweep"
    (out / "seed-0").mkdir(parents=True)
    plant("symlink", out / "seed-0" / "train.log", victim)
    sets = [arg for item in TINY if not item.startswith("max_sequences")
            for arg in ("--set", item)]
    argv = ["sweep", "copy", "--seeds", "1", "--sequences", "4", "--out", str(out), *sets]
    err = one_line_error(capsys, argv)
    assert f"{out / 'seed-0' / 'train.log'}: is a symbolic link" in err
    (out / "seed-0" / "train.log").unlink()
    plant("hardlink", out / "report.md", victim)
    err = one_line_error(capsys, argv)
    assert f"{out / 'report.md'}: is hard-linked" in err
    assert victim.read_bytes() == b"the user's own file"
    assert load_checkpoint(out / "seed-0").sequences == 4  # the training itself went on


def test_a_dangling_lock_link_is_refused_and_its_target_not_created(run, tmp_path, capsys):
    target = tmp_path / "outside" / "created-by-the-lock"
    target.parent.mkdir()
    (run / ".lock").unlink(missing_ok=True)
    (run / ".lock").symlink_to(target)
    err = one_line_error(capsys, ["train", "copy", "--resume", str(run), *RESUME])
    assert f"{run / '.lock'}: is a symbolic link" in err
    assert not target.exists()


def test_weights_linked_to_an_outside_copy_with_their_hash_are_not_read(run, tmp_path):
    """The module says nothing outside the run is read; a link to a copy of the weights (with
    the recorded hash) was read."""
    import shutil

    weights = run / json.loads((run / "checkpoint.json").read_text())["weights"]
    copy = tmp_path / "outside.safetensors"
    shutil.copy(weights, copy)
    plant("symlink", weights, copy)
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        load_checkpoint(run)


def test_metrics_csv_linked_outside_is_not_read(run, tmp_path, capsys):
    """The plots read a metrics.csv linked to a file outside the run."""
    import shutil

    copy = tmp_path / "outside.csv"
    shutil.copy(run / "metrics.csv", copy)
    plant("symlink", run / "metrics.csv", copy)
    err = one_line_error(capsys, ["curves", str(run), "--out", str(tmp_path / "c.png")])
    assert f"{run / 'metrics.csv'}: is a symbolic link" in err


def test_overwrite_refuses_a_folder_whose_config_and_metrics_are_not_a_runs(tmp_path, capsys):
    """`--overwrite` on a folder that holds no run deleted the user's config.json and
    metrics.csv."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text('{"my": "settings"}')
    (folder / "metrics.csv").write_text("a,b\n1,2\n")
    before = snapshot(folder)
    err = one_line_error(capsys, train_argv(folder, "--overwrite"))
    assert "config.json, metrics.csv are not (a link, or not what a run writes there)" in err
    assert snapshot(folder) == before


@pytest.mark.slow  # an `ntm` process, 5.6-6.5 s in CI
def test_a_resume_that_fails_under_a_file_size_limit_keeps_config_json(run):
    """config.json was written in place: a file size limit left it truncated."""
    import resource

    before = (run / "config.json").read_bytes()
    limit = len(before) // 2
    assert (run / "metrics.csv").stat().st_size < limit  # metrics.csv is rewritten first

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = ntm("train", "copy", "--resume", str(run), *RESUME, preexec_fn=small_files)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"ntm: error: {run}/"), result.stderr
    assert "File too large (the file size limit (ulimit -f)" in result.stderr
    assert (run / "config.json").read_bytes() == before
    assert not list(run.glob("*.tmp"))


# -- Export: the destination's lock, and no run or shipped model replaced unless asked ---------

def test_export_onto_a_run_is_refused_and_the_run_still_resumes(run, tmp_path, capsys):
    """Exported onto a training run, it removed the run's training state and best weights."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(run, other)
    before = snapshot(other)
    err = one_line_error(capsys, ["pretrained", "export", str(run), "other", "--dest",
                                  str(tmp_path)])
    assert f"{other}: holds a training run" in err and "--overwrite" in err
    assert snapshot(other) == before
    assert main(["train", "copy", "--resume", str(other), *RESUME]) == 0
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    err = one_line_error(capsys, ["pretrained", "export", str(run), "mine", "--dest",
                                  str(tmp_path)])
    assert "holds files that are not an export (notes.txt)" in err
    assert main(["pretrained", "export", str(run), "other", "--dest", str(tmp_path),
                 "--overwrite"]) == 0
    assert "train_state" not in json.loads((other / "checkpoint.json").read_text())


def test_export_replaces_an_earlier_export_but_a_shipped_model_only_with_overwrite(
        run, tmp_path, capsys, monkeypatch):
    from torch_ntm import pretrained

    zoo = tmp_path / "zoo"
    for _ in range(2):  # an earlier export in --dest is replaced
        assert main(["pretrained", "export", str(run), "tiny", "--dest", str(zoo)]) == 0
    monkeypatch.setattr(pretrained, "ROOT", zoo)  # as if shipped
    before = snapshot(zoo)
    err = one_line_error(capsys, ["pretrained", "export", str(run), "tiny"])
    assert "pretrained model 'tiny' is shipped with torch-ntm" in err and "--overwrite" in err
    assert snapshot(zoo) == before
    assert main(["pretrained", "export", str(run), "tiny", "--overwrite"]) == 0


def test_an_export_waits_for_no_one_it_is_refused_while_the_folder_is_locked(run, tmp_path,
                                                                            capsys):
    import fcntl

    target = tmp_path / "zoo" / "tiny"
    target.mkdir(parents=True)
    with open(target / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("exporting a model into this folder (process 1)")
        held.flush()
        err = one_line_error(capsys, ["pretrained", "export", str(run), "tiny", "--dest",
                                      str(tmp_path / "zoo")])
    assert "another process is exporting a model into this folder (process 1)" in err
    assert [p.name for p in target.iterdir()] == [".lock"]


# -- Documented options: one line, not a traceback ---------------------------------------------

@pytest.mark.parametrize("task, item, message", [
    ("omniglot", "task.root=DIR", "must hold the full Omniglot zips"),
    ("omniglot", "task.rotations=maybe", "task.rotations=maybe: expected a value of type bool, "
                                         "or none"),
    ("omniglot", "task.jitter=2", "task.jitter=2: expected a value of type bool, or none"),
    ("associative_recall", "eval_sizes=1", "eval_sizes=1: associative_recall has no sequences"),
    ("ngrams", "eval_sizes=1", "eval_sizes=1: ngrams has no sequences of that size"),
    ("omniglot", "eval_sizes=40", "eval_sizes=40: omniglot has no sequences of that size"),
])
def test_documented_options_are_one_line_not_a_traceback(tmp_path, capsys, task, item, message):
    """task.root (and the task's other optional keys) ended in AttributeError: 'types.UnionType'
    object has no attribute '__name__'; eval_sizes the task has not, in a ValueError."""
    out = tmp_path / "run"
    err = one_line_error(capsys, ["train", task, "--out", str(out), "--no-plots",
                                  "--no-progress", "--set", item.replace("DIR", str(tmp_path))])
    assert message in err
    assert not out.exists()


def test_an_optional_task_key_takes_a_value_or_none():
    from torch_ntm.config import ConfigError
    from torch_ntm.overrides import apply_overrides

    config = resolve_config("omniglot")
    changed = apply_overrides(config, ["task.rotations=false", "task.jitter=none"])
    assert (changed.task_params.rotations, changed.task_params.jitter) == (False, None)
    with pytest.raises(ConfigError, match="root='/nonexistent' must hold the full Omniglot"):
        apply_overrides(config, ["root=/nonexistent"], "--task-set", prefix="task.")  # evaluate


def test_omniglot_zips_that_are_not_images_name_the_file(tmp_path, capsys):
    import zipfile

    from torch_ntm.omniglot import read_zips

    pytest.importorskip("PIL")
    path = tmp_path / "images_background.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for d in range(1, 21):
            archive.writestr(f"b/A/character01/0001_{d:02d}.png", b"not a png")
    with pytest.raises(ValueError, match=r"images_background.zip: A/character01/0001_01.png is "
                                         r"not a PNG image Pillow reads"):
        read_zips([path])
    (tmp_path / "images_evaluation.zip").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="images_evaluation.zip: not a readable zip file"):
        read_zips([tmp_path / "images_evaluation.zip"])
    zipfile.ZipFile(tmp_path / "images_evaluation.zip", "w").close()  # a zip, empty
    err = one_line_error(capsys, ["train", "omniglot", "--out", str(tmp_path / "run"),
                                  "--set", f"task.root={tmp_path}"])
    assert "0001_01.png is not a PNG image" in err


# -- Every read and size bounded ----------------------------------------------------------------

@pytest.mark.slow  # an `ntm` process, 5.6-6.5 s in CI
def test_init_from_a_device_is_refused_without_reading_it(tmp_path, capsys):
    """init_from=/dev/zero read until the kernel's OOM killer ended the process (23.8 GB)."""
    import resource

    def no_more_than_4_gib():  # the old code's read must fail here, not fill the machine
        resource.setrlimit(resource.RLIMIT_DATA, (4 << 30, 4 << 30))

    result = ntm(*train_argv(tmp_path / "run", "--set", "init_from=/dev/zero"), timeout=60,
                 preexec_fn=no_more_than_4_gib)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == "ntm: error: /dev/zero: not a regular file; remove it or " \
                                    "choose another directory"


def test_a_fifo_as_checkpoint_json_is_refused_without_hanging(run):
    (run / "checkpoint.json").unlink()
    os.mkfifo(run / "checkpoint.json")
    result = ntm("evaluate", str(run), timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"{run / 'checkpoint.json'}: not a regular file" in result.stderr


def test_a_huge_sparse_weights_file_is_refused_before_it_is_read(run, monkeypatch):
    """A 30 GB sparse weights file was read whole before its hash was checked."""
    from torch_ntm import checkpoint

    monkeypatch.setattr(checkpoint, "MAX_TENSOR_FILE_BYTES", 1 << 20)  # for a small sparse file
    weights = run / json.loads((run / "checkpoint.json").read_text())["weights"]
    with open(weights, "r+b") as f:
        f.truncate(2 << 20)
    with pytest.raises(CheckpointError, match=r"is 2,097,152 bytes, more than the 1,048,576 a "
                                              r"checkpoint's tensor file may hold"):
        load_checkpoint(run)


@pytest.mark.parametrize("item, message", [
    ("controller_size=200000", "parameters (596 GiB), more than the limit of 268,435,456: "
                               "lower controller_size"),
    ("task.width=100000", "the validation set of eval_sizes=40 (eval_size_sequences=100 "
                          "sequences of 81 steps x 200,001 channels) needs 6.04 GiB"),
    ("eval_sequences=100000000", "eval_sequences=100,000,000 sequences of 7 steps x 9 "
                                 "channels) needs 26.1 GiB, more than the limit of 2 GiB"),
    ("eval_size_sequences=100000000", "the validation set of eval_sizes=4 (eval_size_sequences="
                                      "100,000,000 sequences"),
])
def test_sizes_that_would_not_fit_in_memory_are_refused_before_the_run(tmp_path, capsys, item,
                                                                       message):
    """task.width=100000 reached 14.8 GB; eval_sequences, eval_size_sequences of 10^8 and
    controller_size=200000 tried to allocate hundreds of GB."""
    out = tmp_path / "run"
    extra = ["--set", "eval_sizes=4"] if item.startswith("eval_size_") else []
    err = one_line_error(capsys, train_argv(out, "--set", item, *extra))
    assert message in err
    assert not out.exists()


def test_evaluate_refuses_sequences_that_would_not_fit_in_memory(run, capsys):
    """--sequences 10^8 drew every sequence of a size at once."""
    err = one_line_error(capsys, ["evaluate", str(run), "--lengths", "2", "--sequences",
                                  "100000000"])
    assert "--lengths 2 (--sequences 100,000,000 sequences of 5 steps x 9 channels) needs " in err
    assert "more than the limit of 2 GiB: lower --sequences" in err


# -- Hand-edited records ------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"step": 10**4000}, "step must be an integer from 0 to 2**63 - 1"),
    ({"sequences": 2**63}, "sequences must be an integer from 0 to 2**63 - 1"),
    ({"best_metrics": {"bit_errors": -math.inf}}, "best_metrics must be an object of numbers "
                                                  ">= 0 (or NaN)"),
    ({"metrics": {"cost_bits": -1.0}}, "metrics must be an object of numbers >= 0"),
])
def test_hand_edited_counters_and_metrics_out_of_range_are_one_line(run, capsys, changes,
                                                                    message):
    edit_record(run, **changes)
    err = one_line_error(capsys, ["evaluate", str(run), "--sequences", "2", "--lengths", "2"])
    assert "invalid checkpoint record" in err and message in err


def test_a_step_of_5000_digits_is_one_line(run, capsys):
    """Python refuses to parse an integer of more than 4,300 digits: a ValueError traceback."""
    text = (run / "checkpoint.json").read_text()
    step = json.loads(text)["step"]
    (run / "checkpoint.json").write_text(text.replace(f'"step": {step}', '"step": ' + "9" * 5000))
    err = one_line_error(capsys, ["evaluate", str(run)])
    assert "not a readable checkpoint JSON file (Exceeds the limit" in err


@pytest.mark.parametrize("key, value", [("lr", math.nan), ("lr", -0.1), ("eps", math.inf),
                                        ("betas", [0.9, 1.5])])
def test_a_nan_or_negative_optimizer_setting_is_one_line_at_resume(run, capsys, key, value):
    """A NaN or negative learning rate was accepted and trained with."""
    record = json.loads((run / "checkpoint.json").read_text())
    record["optimizer"]["param_groups"][0][key] = value
    edit_record(run, optimizer=record["optimizer"])
    err = one_line_error(capsys, ["train", "copy", "--resume", str(run), *RESUME])
    assert f"optimizer state does not fit this configuration (param_groups {key} is" in err


@pytest.mark.parametrize("name, shape, dtype", [("rng.torch", (3,), "uint8"),
                                                ("rng.torch", (5056,), "float32"),
                                                ("rng.data", (7,), "uint8")])
def test_a_malformed_rng_state_is_one_line_at_resume(run, capsys, name, shape, dtype):
    import torch
    from safetensors.torch import load, save

    record = json.loads((run / "checkpoint.json").read_text())
    path = run / record["train_state"]
    tensors = load(path.read_bytes())
    tensors[name] = torch.zeros(shape, dtype=getattr(torch, dtype))
    data = save(tensors)
    path.write_bytes(data)
    edit_record(run, train_state_sha256=hashlib.sha256(data).hexdigest())
    err = one_line_error(capsys, ["train", "copy", "--resume", str(run), *RESUME])
    assert "the training state's RNG state is not one torch can restore" in err


# -- Concurrent sweeps, SIGHUP, a dead Ray address, TensorBoard's thread -----------------------

def test_a_second_sweep_into_the_same_folder_is_refused_and_truncates_nothing(tmp_path, capsys):
    """Two sweeps into one --out: the second truncated the first's train.log."""
    import fcntl

    out = tmp_path / "sweep"
    (out / "seed-0").mkdir(parents=True)
    (out / "seed-0" / "train.log").write_text("the first sweep's log\n")
    sets = [arg for item in TINY if not item.startswith("max_sequences")
            for arg in ("--set", item)]
    for holder in ("running a sweep into this folder", "training into this run directory"):
        with open(out / ".lock", "a") as held:  # the first sweep's, or a training's
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.truncate(0)
            held.write(f"{holder} (process 1)")
            held.flush()
            err = one_line_error(capsys, ["sweep", "copy", "--seeds", "1", "--sequences", "4",
                                          "--out", str(out), *sets])
        # the refusal says what the holder does (a training was blamed on "a sweep")
        assert f"another process is {holder} (process 1)" in err
    assert (out / "seed-0" / "train.log").read_text() == "the first sweep's log\n"
    assert not (out / "seed-0" / "checkpoint.json").exists()


@pytest.mark.slow
def test_ray_at_a_dead_address_is_one_line_without_hanging(tmp_path):
    """`--ray` to a dead address hung for over 200 s."""
    pytest.importorskip("ray")
    result = ntm("sweep", "copy", "--seeds", "1", "--ray", "127.0.0.1:1", "--out",
                 str(tmp_path / "sweep"), timeout=90)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()
    assert len(line) == 1 and line[0].startswith("ntm: error: --ray 127.0.0.1:1: no Ray cluster "
                                                 "answers there"), line


TENSORBOARD_CANNOT_WRITE = """
import sys
from tensorboard.summary.writer import record_writer
def write(self, data):
    raise PermissionError(13, "Permission denied", "tb/events.out.tfevents")
record_writer.RecordWriter.write = write
from torch_ntm.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_tensorboard_that_cannot_write_is_one_line_without_a_thread_traceback(tmp_path):
    """A one-line permission error was followed by the traceback of TensorBoard's writer
    thread."""
    pytest.importorskip("tensorboard")
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", TENSORBOARD_CANNOT_WRITE,
                             *train_argv(tmp_path / "run")], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == (
        "ntm: error: tb/events.out.tfevents: Permission denied (no permission to write there: "
        "write the run elsewhere (--out))")


@pytest.mark.parametrize("code, fix", [(errno.ENOSPC, "the disk is full: free space, or write "
                                        "the run elsewhere (--out)"),
                                       (errno.EFBIG, "the file size limit (ulimit -f)")])
def test_a_machine_error_in_a_command_is_one_line_naming_the_file_and_the_fix(
        tmp_path, monkeypatch, capsys, code, fix):
    """A write that fails inside a command (here the checkpoint's atomic write, as a full disk
    fails it) names the file it was writing, what failed and what to do."""
    from torch_ntm import runfiles

    def full(fd, *args):
        raise OSError(code, os.strerror(code))  # as os.fsync raises it: no file name

    monkeypatch.setattr(runfiles.os, "fsync", full)
    out = tmp_path / "run"
    assert main(train_argv(out, "--set", "max_sequences=2")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ntm: error: {out}/"), err
    assert f": {os.strerror(code)} ({fix}" in err[0]
    assert not list(out.glob("*.tmp"))
