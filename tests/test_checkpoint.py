"""Checkpoints: round trip, exact resume, and clear errors for corrupt or foreign files."""

import json

import pytest
import torch

from torch_ntm.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from torch_ntm.factories import build_model, build_task
from torch_ntm.presets import resolve_config
from torch_ntm.runlog import read_metrics
from torch_ntm.train import train

TINY = ["task.max_length=3", "task.width=4", "memory_size=8", "memory_width=4",
        "controller_size=8", "log_every=2", "eval_sequences=16", "engine=auto"]


def tiny_config(*extra, seed=0):
    return resolve_config("copy", overrides=[*TINY, *extra], seed=seed)


def params_of(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_round_trip_restores_identical_outputs(tmp_path):
    config = tiny_config("max_sequences=32", "eval_every=2")
    train(config, tmp_path / "run", progress=False)
    ckpt = load_checkpoint(tmp_path / "run")
    assert ckpt.config == config and ckpt.step == 2 and ckpt.sequences == 32
    model = ckpt.model()
    again = load_checkpoint(tmp_path / "run" / "checkpoint.json").model()
    x = torch.rand(7, 3, model.input_size)
    assert torch.equal(model(x)[0], again(x)[0])
    assert {p.name for p in (tmp_path / "run").glob("*.safetensors")} == {
        "weights-00000002.safetensors", "train-state-00000002.safetensors",
        "best-00000002.safetensors"}
    assert not list((tmp_path / "run").glob("*.tmp"))  # no temporary file left behind


@pytest.mark.parametrize("preset_args", [
    ["optimizer=adam"],
    ["optimizer=adam", "amsgrad=true", "lr_decay_bit_errors=1e9"],
    ["optimizer=rmsprop", "clip_value=10", "memory_init=random"],
    ["optimizer=adam", "clip_spikes=1.5", "clip_norm=10"],  # the recent norms are resumed
    ["optimizer=adam", "log_every=3"],  # a resume between two training rows keeps the sums
    # ... and the curriculum's size (raised at steps 3 and 6, on either side of the resume)
    ["optimizer=adam", "log_every=3", "curriculum_start=1", "curriculum_bit_errors=1e9"],
    ["optimizer=adam", "ema_decay=0.9"],  # the average of the weights is resumed
    # ... and where the input cap's ramp started (the resume is halfway down it)
    ["optimizer=adam", "input_max_norm=0.5", "input_max_norm_ramp=64"],
])
def test_resume_is_bit_identical(tmp_path, preset_args):
    steps = 8
    config = tiny_config(*preset_args, "batch_size=4", f"max_sequences={4 * steps}", "eval_every=2")
    train(config, tmp_path / "full", progress=False)

    half = tiny_config(*preset_args, "batch_size=4", f"max_sequences={4 * steps // 2}",
                       "eval_every=2")
    train(half, tmp_path / "split", progress=False)
    # Resuming with a larger budget: the budget is one of the keys a resume may change.
    train(config, tmp_path / "split", resume=True, progress=False)

    a = load_checkpoint(tmp_path / "full")
    b = load_checkpoint(tmp_path / "split")
    assert a.step == b.step == steps
    for key, value in a.state_dict.items():
        assert torch.equal(value, b.state_dict[key]), key
    assert a.metrics == b.metrics
    if "ema_decay=0.9" in preset_args:
        averaged = b.averaged()
        assert averaged is not None and averaged.keys() == a.averaged().keys()
        for key, value in a.averaged().items():
            assert torch.equal(value, averaged[key]), key
    # The resumed run's metrics log equals the uninterrupted one's (but for wall-clock times).
    assert _rows_without_time(tmp_path / "split") == _rows_without_time(tmp_path / "full")


def test_the_run_keeps_its_best_validation_and_resumes_with_it(tmp_path, monkeypatch):
    """The model of a run (`Checkpoint.model`) is its best validation's, saved beside the latest
    state; a resume starts from the latest state and still knows the best."""
    import torch_ntm.train as module

    script = iter([(5.0, 2.0), (3.0, 1.0), (9.0, 4.0), (8.0, 3.0), (2.0, 0.0), (7.0, 2.0)])
    seen = []

    def scripted(model, batches):
        seen.append(params_of(model))
        cost, errors = next(script)
        return {"cost_bits": cost, "bit_errors": errors, "perfect": float(errors == 0)}

    monkeypatch.setattr(module, "evaluate_batches", scripted)
    train(tiny_config("max_sequences=48", "eval_every=1", "batch_size=16", "eval_sizes=",
                      "rollback_bit_errors=-1"), tmp_path / "run", progress=False)
    ckpt = load_checkpoint(tmp_path / "run")
    assert ckpt.best().metrics["bit_errors"] == 1.0 and ckpt.metrics["bit_errors"] == 4.0
    for key, value in ckpt.model().state_dict().items():  # the best (2nd validation) ...
        assert torch.equal(value, seen[1][key]), key
    for key, value in ckpt.model(latest=True).state_dict().items():  # ... and the latest
        assert torch.equal(value, seen[2][key]), key
    # Resumed: validations 4-6 (3 bits, then 0, then 2): the best becomes the 5th.
    train(tiny_config("max_sequences=96", "eval_every=1", "batch_size=16", "eval_sizes=",
                      "rollback_bit_errors=-1"), tmp_path / "run", resume=True, progress=False)
    ckpt = load_checkpoint(tmp_path / "run")
    assert ckpt.best().metrics["bit_errors"] == 0.0
    for key, value in ckpt.model().state_dict().items():
        assert torch.equal(value, seen[4][key]), key
    assert [p.name for p in (tmp_path / "run").glob("best-*")] == ["best-00000006.safetensors"]


def _rows_without_time(run):
    return [{k: v for k, v in r.items() if k != "elapsed_s"}
            for r in read_metrics(run / "metrics.csv")]


def test_resume_continues_from_the_saved_step_not_from_scratch(tmp_path):
    config = tiny_config("max_sequences=64", "eval_every=2")
    train(tiny_config("max_sequences=32", "eval_every=2"), tmp_path / "run", progress=False)
    result = train(config, tmp_path / "run", resume=True, progress=False)
    assert result.step == 4 and result.sequences == 64


@pytest.fixture
def run_dir(tmp_path):
    train(tiny_config("max_sequences=16", "eval_every=1"), tmp_path / "run", progress=False)
    return tmp_path / "run"


def test_corrupt_weights_give_a_clear_error_naming_the_file(run_dir):
    weights = next(run_dir.glob("weights-*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{weights.name}: file is corrupt or was modified"):
        load_checkpoint(run_dir)


def test_truncated_weights_with_a_matching_hash_are_reported_as_invalid_safetensors(run_dir):
    import hashlib

    record = json.loads((run_dir / "checkpoint.json").read_text())
    weights = run_dir / record["weights"]
    weights.write_bytes(weights.read_bytes()[:40])
    record["weights_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    (run_dir / "checkpoint.json").write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        load_checkpoint(run_dir)


def test_bad_json_and_foreign_json_and_missing_run(run_dir, tmp_path):
    (run_dir / "checkpoint.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match="checkpoint.json: not a readable checkpoint JSON"):
        load_checkpoint(run_dir)
    (run_dir / "checkpoint.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(CheckpointError, match="not a torch-ntm checkpoint"):
        load_checkpoint(run_dir)
    with pytest.raises(CheckpointError, match="no such checkpoint") as error:
        load_checkpoint(tmp_path / "nowhere")
    assert "pretrained" not in str(error.value)


def test_a_shipped_models_name_given_as_a_path_points_to_pretrained(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no run directory called "copy" here
    with pytest.raises(CheckpointError, match=r"copy: no such checkpoint .*; for the shipped "
                                              r"model, pretrained.path\('copy'\)"):
        load_checkpoint("copy")


def test_weights_from_another_configuration_are_rejected(run_dir, tmp_path):
    other = tiny_config("controller_size=12")
    ckpt = load_checkpoint(run_dir)
    from torch_ntm.factories import build_model

    model = build_model(other, ckpt.task())
    save_checkpoint(tmp_path / "other", ckpt.config, model)  # record says size 8, weights are 12
    with pytest.raises(CheckpointError, match="weights do not fit this model configuration"):
        load_checkpoint(tmp_path / "other").model()


def test_memory_size_override_loads_the_same_weights(run_dir):
    ckpt = load_checkpoint(run_dir)
    big = ckpt.model(memory_size=64)
    assert big.memory_size == 64
    small = ckpt.model()
    for key, value in small.state_dict().items():
        assert torch.equal(value, big.state_dict()[key])


def test_evaluation_builds_the_model_with_eval_memory_size_and_overrides_win(tmp_path):
    config = tiny_config("eval_memory_size=32")
    save_checkpoint(tmp_path, config, build_model(config, build_task(config)), step=0)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.model().memory_size == 8
    assert ckpt.model(evaluation=True).memory_size == 32
    assert ckpt.model(evaluation=True, memory_size=16).memory_size == 16


def test_a_failed_write_leaves_the_previous_checkpoint_intact(run_dir, monkeypatch):
    before = (run_dir / "checkpoint.json").read_text()
    ckpt = load_checkpoint(run_dir)
    model = ckpt.model()

    import torch_ntm.checkpoint as module

    def exploding_save(tensors):
        raise OSError("disk full")

    monkeypatch.setattr(module, "st_save", exploding_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(run_dir, ckpt.config, model, step=99)
    assert (run_dir / "checkpoint.json").read_text() == before
    assert load_checkpoint(run_dir).step == ckpt.step
    assert not list(run_dir.glob("*.tmp"))


def test_checkpoint_files_get_the_usual_permissions(run_dir):
    import os

    from torch_ntm.runfiles import _UMASK

    for path in run_dir.iterdir():
        if path.suffix in (".json", ".safetensors"):
            assert path.stat().st_mode & 0o777 == 0o666 & ~_UMASK, path
    assert _UMASK == os.umask(_UMASK)  # read at import without changing it


def test_a_refused_process_waits_a_moment_for_the_holder_to_say_what_it_does(tmp_path):
    # The holder writes what it does just after taking the lock: a second process that came in
    # between read an empty lock and said "writing it" (a race two real trainings hit in CI).
    import fcntl
    import threading

    from torch_ntm.checkpoint import LOCK, lock_run

    run = tmp_path / "run"
    run.mkdir()
    with open(run / LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        say = threading.Timer(0.05, lambda: (held.write("training into this run directory"),
                                             held.flush()))
        say.start()
        with pytest.raises(CheckpointError, match="another process is training into this run"):
            with lock_run(run):
                pass
        say.join()
