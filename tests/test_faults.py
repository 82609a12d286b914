"""Faults and bad input: crafted records, bad values, concurrent writers, signals.

Each user mistake or hostile file ends in one line (``ntm: error: ...`` from the command line, a
`CheckpointError` or `ConfigError` from the API), a nonzero exit, and nothing written or removed
outside what the run owns.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_ntm.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from torch_ntm.cli import main
from torch_ntm.config import resolve_config
from torch_ntm.train import train

SRC = os.environ.get("FAULTS_SRC") or str(Path(__file__).resolve().parents[1] / "src")
TINY = ["controller_size=8", "memory_size=8", "memory_width=4", "batch_size=2",
        "max_sequences=4", "eval_every=1", "eval_sequences=2", "engine=fast",
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


@pytest.mark.parametrize("key", ["weights", "train_state"])
def test_a_record_naming_a_file_outside_the_run_is_refused(run, tmp_path, key):
    victim, names = hostile_names(tmp_path)
    for name in names:
        edit_record(run, **{key: name})
        with pytest.raises(CheckpointError, match=f"invalid checkpoint record \\({key} must be"):
            ckpt = load_checkpoint(run)
            ckpt.restore_train_state(_optimizer(ckpt))
    assert victim.read_bytes() == b"the user's own file"


def _optimizer(ckpt):
    from torch_ntm.train import make_optimizer

    return make_optimizer(ckpt.config, ckpt.model().parameters())


def test_saving_over_a_crafted_record_removes_nothing_outside_the_run(run, tmp_path):
    victim, names = hostile_names(tmp_path)
    ckpt = load_checkpoint(run)
    for name in names:
        edit_record(run, weights=name, train_state=name)
        save_checkpoint(run, ckpt.config, ckpt.model(), step=5)
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
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_checkpoint(run)


@pytest.mark.parametrize("changes, message", [
    ({"step": "abc"}, "step must be an integer >= 0"),
    ({"step": -1}, "step must be an integer >= 0"),
    ({"sequences": 1.5}, "sequences must be an integer >= 0"),
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
