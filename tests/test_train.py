"""Training must learn: a tiny copy task is solved within a CI-sized budget."""

import math
import re

import pytest
import torch

from torch_ntm.presets import resolve_config
from torch_ntm.runlog import read_metrics
from torch_ntm.train import train


@pytest.mark.slow
def test_tiny_copy_is_solved(tmp_path):
    # Copy with L <= 3, 4-bit vectors, a 16x8 memory and a 32-unit LSTM: solved in ~10 s here
    # (seeds 0-3 converged after 8,000-12,800 sequences); the budget leaves room for slower seeds.
    config = resolve_config("copy", overrides=[
        "task.max_length=3", "task.width=4", "memory_size=16", "memory_width=8",
        "controller_size=32", "lr=1e-2", "batch_size=16", "eval_every=50",
        "max_sequences=32000", "stop_bit_errors=0", "patience_evals=2", "engine=auto",
        "lr_decay_bit_errors=-1", "eval_sizes="], seed=0)
    result = train(config, tmp_path / "run", progress=False)
    assert result.converged, result.metrics
    assert result.metrics["bit_errors"] == 0 and result.metrics["perfect"] == 1.0
    assert result.nan_steps == 0
    # The learning curve fell: validation cost at the end is far below the first validation's.
    val_costs = [float(r["cost_bits"]) for r in read_metrics(tmp_path / "run" / "metrics.csv",
                                                            "val")]
    assert val_costs[-1] < 0.05 * val_costs[0]


@pytest.mark.parametrize("preset", ["ntm-ff", "lstm"])
def test_other_presets_train_and_reduce_the_loss(tmp_path, preset):
    memory = [] if preset == "lstm" else ["memory_size=8", "memory_width=4"]  # none: refused
    config = resolve_config("copy", preset, overrides=[
        "task.max_length=2", "task.width=3", *memory,
        "controller_size=16", "controller_layers=1", "lr=1e-2", "batch_size=16",
        "eval_every=60", "max_sequences=960", "log_every=10", "engine=auto"], seed=0)
    result = train(config, tmp_path / "run", progress=False)
    train_costs = _train_costs(tmp_path / "run")
    assert train_costs[-1] < 0.7 * train_costs[0]
    assert math.isfinite(result.metrics["cost_bits"])


def test_a_non_finite_loss_skips_the_update(tmp_path, monkeypatch):
    import torch_ntm.metrics as module  # training takes its loss from `metrics.objective`

    real = module.masked_bce
    calls = {"n": 0}

    def sometimes_nan(logits, targets, mask):
        calls["n"] += 1
        out = real(logits, targets, mask)
        return out * float("nan") if calls["n"] == 2 else out

    monkeypatch.setattr(module, "masked_bce", sometimes_nan)
    config = resolve_config("copy", overrides=[
        "task.max_length=2", "task.width=3", "memory_size=8", "memory_width=4",
        "controller_size=8", "batch_size=2", "max_sequences=8", "eval_every=100", "engine=auto"])
    result = train(config, tmp_path / "run", progress=False)
    assert result.nan_steps == 1
    from torch_ntm.checkpoint import load_checkpoint

    state = load_checkpoint(tmp_path / "run").state_dict
    assert all(torch.isfinite(v).all() for v in state.values())


def _train_costs(run_dir):
    return [float(r["cost_bits"]) for r in read_metrics(run_dir / "metrics.csv", "train")]


def test_the_default_engine_trains_like_the_eager_one(tmp_path):
    args = ["task.max_length=3", "task.width=4", "memory_size=10", "memory_width=6",
            "controller_size=12", "batch_size=4", "max_sequences=24", "log_every=1",
            "eval_every=100", "eval_sequences=8"]
    assert resolve_config("copy").engine == "auto"  # what `ntm train` uses by default
    costs = {}
    for engine in ("auto", "native", "eager"):
        config = resolve_config("copy", overrides=[*args, f"engine={engine}"], seed=3)
        train(config, tmp_path / engine, progress=False)
        costs[engine] = _train_costs(tmp_path / engine)
    assert len(costs["eager"]) == 6
    # Same function, same data: the six per-step costs agree to float32 rounding (after Adam
    # steps whose updates depend on those gradients).
    assert costs["auto"] == costs["native"]
    assert costs["native"] == pytest.approx(costs["eager"], rel=1e-3)


# A copy model small enough that a few steps take well under a second, learning at lr 0.01.
_TINY_LR = ["task.max_length=2", "task.width=3", "memory_size=8", "memory_width=4",
            "controller_size=8", "batch_size=2", "eval_every=2", "eval_sequences=4",
            "engine=auto", "lr=0.01"]


def _lr_of(run):
    """The learning rate a run's checkpoint saved with its optimizer."""
    import json

    record = json.loads((run / "checkpoint.json").read_text())
    return record["optimizer"]["param_groups"][0]["lr"]


def test_the_learning_rate_decays_once_when_validation_first_meets_the_threshold(tmp_path):
    tiny, lr_of = [*_TINY_LR, "lr_decay=0.25"], _lr_of

    # A threshold every validation meets: decayed at the first one, and never again (also not
    # after a resume, which restores the decayed rate with the optimizer state).
    met = resolve_config("copy", overrides=[*tiny, "lr_decay_bit_errors=1e9", "max_sequences=8"])
    train(met, tmp_path / "met", progress=False)
    assert lr_of(tmp_path / "met") == pytest.approx(0.0025)
    longer = resolve_config("copy",
                            overrides=[*tiny, "lr_decay_bit_errors=1e9", "max_sequences=16"])
    train(longer, tmp_path / "met", resume=True, progress=False)
    assert lr_of(tmp_path / "met") == pytest.approx(0.0025)
    # Resumed with a new lr: it replaces the current (decayed) rate.
    slower = longer.replaced(max_sequences=24, lr=0.001)
    train(slower, tmp_path / "met", resume=True, progress=False)
    assert lr_of(tmp_path / "met") == pytest.approx(0.001)
    # A threshold no validation of an untrained model meets, and the default (off).
    never = resolve_config("copy", overrides=[*tiny, "lr_decay_bit_errors=0", "max_sequences=8"])
    train(never, tmp_path / "never", progress=False)
    assert lr_of(tmp_path / "never") == pytest.approx(0.01)
    assert resolve_config("copy", "ntm-lstm-paper").stabilise.lr_decay_bit_errors < 0


def test_train_refuses_to_resume_a_run_with_a_setting_it_cannot_change(tmp_path):
    """`train(..., resume=True)` checks the config against the run's, as ``ntm train --resume``
    does: a changed batch size or seed would train on state made for another run."""
    from torch_ntm.config import ConfigError

    config = resolve_config("copy", overrides=[*_TINY_LR, "max_sequences=8"])
    train(config, tmp_path / "run", progress=False)
    before = (tmp_path / "run" / "config.json").read_text()
    for change in ({"batch_size": 4}, {"seed": 1}, {"controller_size": 16}):
        other = config.replaced(max_sequences=16, **change)
        with pytest.raises(ConfigError, match=f"cannot change {next(iter(change))}; only "):
            train(other, tmp_path / "run", resume=True, progress=False)
    assert (tmp_path / "run" / "config.json").read_text() == before
    longer = config.replaced(max_sequences=16, lr=0.001)  # resumable keys
    assert train(longer, tmp_path / "run", resume=True, progress=False).sequences == 16


def test_lr_milestones_decay_the_rate_as_training_passes_them(tmp_path):
    tiny, lr_of = [*_TINY_LR, "lr_decay=0.5", "log_every=1"], _lr_of

    # Batches of 2: 5 is passed by the step that reaches 6; 8 by the step that reaches 8.
    config = resolve_config("copy", overrides=[*tiny, "lr_milestones=5,8", "max_sequences=6"])
    train(config, tmp_path / "run", progress=False)
    assert lr_of(tmp_path / "run") == pytest.approx(0.005)
    # Resumed: a milestone already passed does not fire again; the next one does.
    train(config.replaced(max_sequences=10), tmp_path / "run", resume=True,
          progress=False)
    assert lr_of(tmp_path / "run") == pytest.approx(0.0025)
    with pytest.raises(ValueError, match=r"lr_milestones=\[8, 5\] must increase"):
        resolve_config("copy", overrides=[*tiny, "lr_milestones=8,5"])


def test_a_rate_given_on_resume_replaces_a_decayed_one_even_if_it_is_the_runs_own(tmp_path):
    """``--resume RUN --set lr=X`` was ignored when X was the run's configured lr, though its
    milestones had lowered the rate: 'a new lr' was read as 'another value than the config's'."""
    from torch_ntm.cli import main

    tiny = [*_TINY_LR, "lr_decay=0.5", "log_every=1"]
    config = resolve_config("copy", overrides=[*tiny, "lr_milestones=5", "max_sequences=6"])
    train(config, tmp_path / "run", progress=False)
    assert _lr_of(tmp_path / "run") == pytest.approx(0.005)
    longer = config.replaced(max_sequences=8)
    train(longer, tmp_path / "run", resume=True, progress=False)  # no rate given: kept
    assert _lr_of(tmp_path / "run") == pytest.approx(0.005)
    assert main(["train", "copy", "--resume", str(tmp_path / "run"), "--set", "lr=0.01",
                 "--set", "max_sequences=10", "--no-plots", "--no-progress"]) == 0
    assert _lr_of(tmp_path / "run") == pytest.approx(0.01)


def test_a_rollback_after_a_resume_with_a_new_rate_decays_that_rate(tmp_path, monkeypatch):
    """The rollback restored the best weights' optimizer state, and with it the rate from
    before the resume: resumed at 0.1, it went on at 0.01 x 0.25, not 0.1 x 0.25."""
    _scripted_validations(monkeypatch, [(5.0, 0.0), (4.0, 0.0), (40.0, 9.0)])
    config = resolve_config("copy", overrides=[*ROLLBACK_TINY, "max_sequences=4",
                                               "stop_bit_errors=-1"])
    train(config, tmp_path / "run", progress=False)
    assert _lr_of(tmp_path / "run") == pytest.approx(0.01)
    faster = config.replaced(max_sequences=6, lr=0.1)
    train(faster, tmp_path / "run", resume=True, progress=False)  # falls apart, rolls back
    assert _lr_of(tmp_path / "run") == pytest.approx(0.1 * 0.25)


def test_a_run_from_init_from_validates_the_weights_it_starts_from(tmp_path, monkeypatch):
    """They were never validated, so a fine-tuning that only made them worse kept the least bad
    of its later weights (one step from a shipped copy model: 72% perfect at L = 20, from
    100%)."""
    from torch_ntm.checkpoint import load_checkpoint

    tiny = [*_TINY_LR, "eval_sizes=", "stop_bit_errors=-1"]
    train(resolve_config("copy", overrides=[*tiny, "max_sequences=4"]), tmp_path / "start",
          progress=False)
    start = load_checkpoint(tmp_path / "start").model().state_dict()
    seen = _scripted_validations(monkeypatch, [(1.0, 0.0), (5.0, 0.5), (4.0, 0.5)])
    config = resolve_config("copy", overrides=[*tiny, "max_sequences=8",
                                               f"init_from={tmp_path / 'start'}"])
    train(config, tmp_path / "tuned", progress=False)
    assert len(seen) == 3 and all(torch.equal(seen[0][k], v) for k, v in start.items())
    rows = read_metrics(tmp_path / "tuned" / "metrics.csv", "val")
    assert [r["step"] for r in rows] == ["0", "2", "4"]
    ckpt = load_checkpoint(tmp_path / "tuned")
    assert ckpt.best_metrics["cost_bits"] == 1.0
    assert all(torch.equal(ckpt.model().state_dict()[k], v) for k, v in start.items())


def _scripted_validations(monkeypatch, script, **extra):
    """Make the trainer's validations return ``script``'s (cost, bit errors) in turn, with the
    ``extra`` metrics, and record the weights each one saw."""
    import torch_ntm.train as module

    seen = []

    def scripted(model, batches):
        seen.append({k: v.clone() for k, v in model.state_dict().items()})
        cost, errors = script[len(seen) - 1]
        return {"cost_bits": cost, "bit_errors": errors, "perfect": float(errors == 0), **extra}

    monkeypatch.setattr(module, "evaluate_batches", scripted)
    return seen


def test_a_task_with_a_reference_cost_keeps_the_weights_of_the_lowest_cost(tmp_path,
                                                                           monkeypatch):
    # N-grams' targets are random: the run keeps the lowest cost, not the fewest wrong bits.
    from torch_ntm.checkpoint import load_checkpoint

    _scripted_validations(monkeypatch, [(130.0, 45.0), (129.0, 46.0), (131.0, 44.0)],
                          reference_cost_bits=128.0)
    config = resolve_config("ngrams", overrides=[
        "task.length=10", "memory_size=8", "memory_width=4", "controller_size=8", "batch_size=2",
        "eval_every=1", "max_sequences=6", "engine=auto", "eval_sequences=2"])
    train(config, tmp_path / "run", progress=False)
    _, _, kept = load_checkpoint(tmp_path / "run").best()
    assert kept["cost_bits"] == 129.0 and kept["bit_errors"] == 46.0


ROLLBACK_TINY = ["task.max_length=2", "task.width=3", "memory_size=8", "memory_width=4",
                 "controller_size=8", "batch_size=2", "eval_every=1", "max_sequences=8",
                 "engine=auto", "lr=0.01", "lr_decay=0.25", "lr_decay_bit_errors=-1",
                 "rollback_bit_errors=1", "eval_sizes=", "finetune="]  # one stage


def test_a_converged_model_that_falls_apart_is_rolled_back_to_its_best(tmp_path, monkeypatch):
    import json

    from torch_ntm.checkpoint import load_checkpoint

    # Validations: not armed yet, best and armed (no wrong bit), fallen apart (9 > 1), NaN.
    seen = _scripted_validations(monkeypatch, [(5.0, 0.5), (4.0, 0.0), (40.0, 9.0),
                                               (float("nan"), float("nan"))])
    result = train(resolve_config("copy", overrides=ROLLBACK_TINY), tmp_path / "run",
                   progress=False)
    best = seen[1]
    assert any(not torch.equal(seen[2][k], best[k]) for k in best)  # it did train on
    # The second fall came one step after the first rollback, from the restored weights.
    ckpt = load_checkpoint(tmp_path / "run")
    for key, value in ckpt.state_dict.items():
        assert torch.equal(value, best[key]), key
    assert ckpt.extra["rollbacks"] == 2 and result.metrics["bit_errors"] == 0.0
    assert ckpt.metrics == result.metrics == {"cost_bits": 4.0, "bit_errors": 0.0, "perfect": 1.0}
    lr = json.loads((tmp_path / "run" / "checkpoint.json").read_text())
    assert lr["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.01 * 0.25 ** 2)
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    assert [(r["step"], r["split"], r["bit_errors"]) for r in rows if r["split"] != "train"] == [
        ("1", "val", "0.5"), ("2", "val", "0"), ("3", "val", "9"), ("3", "rollback", "0"),
        ("4", "val", "nan"), ("4", "rollback", "0")]


@pytest.mark.parametrize("overrides, script", [
    (["rollback_bit_errors=-1"], [(4.0, 0.0), (40.0, 9.0)]),  # off
    ([], [(9.0, 0.5), (40.0, 9.0)]),  # never without a wrong bit: not armed
    ([], [(4.0, 0.0), (4.5, 1.0)]),  # within the margin
])
def test_no_rollback_when_off_unarmed_or_within_the_margin(tmp_path, monkeypatch, overrides,
                                                           script):
    _scripted_validations(monkeypatch, script)
    config = resolve_config("copy", overrides=[*ROLLBACK_TINY, "max_sequences=4", *overrides])
    result = train(config, tmp_path / "run", progress=False)
    assert result.metrics["bit_errors"] == script[-1][1]
    assert not read_metrics(tmp_path / "run" / "metrics.csv", "rollback")


def _weights_after_each_step(monkeypatch):
    """Record the trainer's weights (name -> float64 copy) when its optimizer is made and after
    each of its steps."""
    import torch_ntm.train as module

    built, made = module.build_model, module.make_optimizer
    models, history = [], []

    def building(*args, **kwargs):
        models.append(built(*args, **kwargs))
        return models[-1]

    def recording(config, params):
        optimizer = made(config, params)
        named = {n: p for n, p in models[0].named_parameters() if p.requires_grad}

        def record(*_):
            history.append({n: p.detach().double().clone() for n, p in named.items()})

        record()
        optimizer.register_step_post_hook(record)
        return optimizer

    monkeypatch.setattr(module, "build_model", building)
    monkeypatch.setattr(module, "make_optimizer", recording)
    return history


def test_ema_decay_validates_and_keeps_the_average_and_trains_on_the_weights(tmp_path,
                                                                            monkeypatch):
    from torch_ntm.checkpoint import load_checkpoint

    history = _weights_after_each_step(monkeypatch)
    # Validations after steps 1, 2, 3: the second is the best, the third not (no rollback).
    seen = _scripted_validations(monkeypatch, [(5.0, 0.5), (4.0, 0.25), (6.0, 0.75)])
    config = resolve_config("copy", overrides=[*ROLLBACK_TINY, "max_sequences=6",
                                               "rollback_bit_errors=-1", "ema_decay=0.75"])
    train(config, tmp_path / "run", progress=False)
    assert len(history) == 4  # the initial weights and three steps
    average = dict(history[0])  # the float64 reference: it starts from the initial weights
    for step in (1, 2, 3):
        average = {k: 0.75 * v + 0.25 * history[step][k] for k, v in average.items()}
        for key, value in average.items():  # each validation saw the average, not the weights
            torch.testing.assert_close(seen[step - 1][key].double(), value, rtol=1e-6,
                                       atol=1e-7)
        if step == 2:
            kept_reference = dict(average)
    assert any(not torch.allclose(average[k], history[3][k]) for k in average)
    ckpt = load_checkpoint(tmp_path / "run")
    for key, value in ckpt.state_dict.items():  # the latest weights are the weights themselves
        assert torch.equal(value.double(), history[3][key]), key
    kept, _, metrics = ckpt.best()
    assert metrics["cost_bits"] == 4.0
    for key, value in kept.items():  # what the run keeps (and `ntm evaluate` uses): the average
        torch.testing.assert_close(value.double(), kept_reference[key], rtol=1e-6, atol=1e-7)
    for key, value in ckpt.averaged().items():
        torch.testing.assert_close(value.double(), average[key], rtol=1e-6, atol=1e-7)


def test_ema_decay_with_a_rollback_trains_on_from_the_kept_average(tmp_path, monkeypatch):
    from torch_ntm.checkpoint import load_checkpoint

    seen = _scripted_validations(monkeypatch, [(4.0, 0.0), (40.0, 9.0)])
    config = resolve_config("copy", overrides=[*ROLLBACK_TINY, "max_sequences=4",
                                               "ema_decay=0.5"])
    train(config, tmp_path / "run", progress=False)
    ckpt = load_checkpoint(tmp_path / "run")
    assert ckpt.extra["rollbacks"] == 1
    averaged = ckpt.averaged()
    for key, value in ckpt.state_dict.items():  # weights and average both the kept average
        assert torch.equal(value, seen[0][key]), key
        assert torch.equal(averaged[key], seen[0][key]), key


def test_ema_decay_given_on_resume_starts_the_average_from_the_resumed_weights(tmp_path,
                                                                              monkeypatch):
    from torch_ntm.checkpoint import load_checkpoint
    from torch_ntm.cli import main

    run = tmp_path / "run"
    train(resolve_config("copy", overrides=[*ROLLBACK_TINY, "max_sequences=4",
                                            "rollback_bit_errors=-1"]), run, progress=False)
    assert load_checkpoint(run).averaged() is None
    average = {k: v.double() for k, v in load_checkpoint(run).state_dict.items()}
    history = _weights_after_each_step(monkeypatch)
    assert main(["train", "copy", "--resume", str(run), "--set", "ema_decay=0.5", "--set",
                 "max_sequences=8", "--no-plots", "--no-progress"]) == 0
    assert len(history) == 3  # when the optimizer was made, and two steps after the resume
    for weights in history[1:]:
        average = {k: 0.5 * v + 0.5 * weights[k] for k, v in average.items()}
    ckpt = load_checkpoint(run)
    assert ckpt.config.optim.ema_decay == 0.5
    for key, value in ckpt.averaged().items():
        torch.testing.assert_close(value.double(), average[key], rtol=1e-6, atol=1e-7)


def test_init_from_starts_a_new_run_from_the_kept_weights_of_another(tmp_path, monkeypatch):
    from torch_ntm.checkpoint import load_checkpoint

    tiny = [*ROLLBACK_TINY, "max_sequences=4", "rollback_bit_errors=-1"]
    # Validations after steps 1 and 2 of each run (and of b's starting weights first): the
    # first is the better, so run a keeps the weights after its step 1.
    _scripted_validations(monkeypatch, [(4.0, 0.0), (5.0, 0.5), (6.0, 0.5), (4.0, 0.0),
                                        (5.0, 0.5)])
    train(resolve_config("copy", overrides=tiny), tmp_path / "a", progress=False)
    kept, _, metrics = load_checkpoint(tmp_path / "a").best()
    latest = load_checkpoint(tmp_path / "a").state_dict
    assert metrics["cost_bits"] == 4.0 and any(not torch.equal(kept[k], latest[k]) for k in kept)
    history = _weights_after_each_step(monkeypatch)
    config = resolve_config("copy", overrides=[*tiny, f"init_from={tmp_path / 'a'}",
                                               "ema_decay=0.5", "seed=3"])
    train(config, tmp_path / "b", progress=False)
    for key, value in kept.items():  # the optimizer was made for the loaded weights
        assert torch.equal(history[0][key], value.double()), key
    ckpt = load_checkpoint(tmp_path / "b")
    assert ckpt.step == 2 and ckpt.config.init_from == str(tmp_path / "a")
    average = {k: v.double() for k, v in kept.items()}  # the average starts from them too
    for weights in history[1:]:
        average = {k: 0.5 * v + 0.5 * weights[k] for k, v in average.items()}
    for key, value in ckpt.averaged().items():
        torch.testing.assert_close(value.double(), average[key], rtol=1e-6, atol=1e-7)


def test_init_from_that_does_not_fit_is_refused_before_a_run_directory_is_made(tmp_path,
                                                                               capsys):
    from torch_ntm.cli import main

    tiny = [*ROLLBACK_TINY, "max_sequences=2"]
    train(resolve_config("copy", overrides=tiny), tmp_path / "a", progress=False)
    sets = [a for o in tiny for a in ("--set", o)]
    size = resolve_config("copy", overrides=tiny).model_params.controller_size
    cases = [
        (["--set", "controller_size=9", "--set", f"init_from={tmp_path / 'a'}"],
         f"{tmp_path / 'a'}/checkpoint.json: weights do not fit this model configuration"),
        (["--set", "controller_size=9", "--set", f"init_from={tmp_path / 'a'}"],  # and why
         f"has controller_size={size} (here 9): set those to its values"),
        # only what changes the weights: not max_beta, and the task's keys as task.KEY
        (["--set", "max_beta=5", "--set", "task.width=5", "--set", f"init_from={tmp_path / 'a'}"],
         f"has task.width={resolve_config('copy', overrides=tiny).task_params.width} (here 5): "
         f"set those"),
        (["--set", f"init_from={tmp_path / 'none'}"], "no such checkpoint"),
        (["--set", "init_from=pretrained:nothing"], "unknown pretrained model 'nothing'"),
    ]
    for extra, message in cases:
        out = tmp_path / "b"
        assert main(["train", "copy", *sets, *extra, "--out", str(out), "--no-plots"]) == 2
        assert message in capsys.readouterr().err
        assert not out.exists()


def test_ema_decay_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"ema_decay=1\.0 is out of range; it must be a number "
                                         r"in \[0, 1\)"):
        resolve_config("copy", overrides=["ema_decay=1"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("engine", ["auto"])
def test_training_on_cuda_reduces_the_loss_and_resumes(tmp_path, engine):
    from torch_ntm.checkpoint import load_checkpoint

    config = resolve_config("copy", overrides=[
        "task.max_length=3", "task.width=4", "memory_size=16", "memory_width=8",
        "controller_size=32", "lr=1e-2", "batch_size=16", "eval_every=50", "log_every=10",
        "max_sequences=3200", f"engine={engine}", "device=cuda"], seed=0)
    result = train(config, tmp_path / "run", progress=False)
    train_costs = _train_costs(tmp_path / "run")
    assert train_costs[-1] < 0.7 * train_costs[0] and math.isfinite(result.metrics["cost_bits"])
    longer = config.replaced(max_sequences=4800)
    assert train(longer, tmp_path / "run", resume=True, progress=False).sequences == 4800
    assert load_checkpoint(tmp_path / "run").model().memory_size == 16  # loads on the CPU


def _script_validations(monkeypatch, errors_at):
    """Validations score what ``errors_at(copy length of the set)`` says, wrong bits per
    sequence (the training distribution's sets have length <= 2 in these tests)."""
    import torch_ntm.train as module

    def scripted(model, batches):
        errors = errors_at(int(batches[0][0].mask.sum(0).max()))  # answer steps: the length
        return {"cost_bits": 1.0, "bit_errors": errors, "perfect": float(errors == 0)}

    monkeypatch.setattr(module, "evaluate_batches", scripted)


def test_stopping_needs_the_generalisation_sizes_clean_and_they_are_logged(tmp_path,
                                                                          monkeypatch):
    """Validations at eval_sizes run only once the training distribution has no wrong bit, and
    the run stops when patience_evals validations were clean there too: one with a wrong bit only
    at an eval_size does not count, one with a wrong bit in the training distribution starts the
    count again."""

    calls = []
    # (training distribution, length 5, length 9) wrong bits per validation; None: not run.
    script = [(2.0, None, None), (0.0, 3.0, 7.0), (0.0, 0.0, 0.0), (0.5, None, None),
              (0.0, 0.0, 1.0), (0.0, 0.0, 0.0), (0.0, 2.0, 0.0), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)]

    def errors_at(length):
        kind = "train" if length <= 2 else length
        calls.append(kind)
        return script[calls.count("train") - 1][{"train": 0, 5: 1, 9: 2}[kind]]

    _script_validations(monkeypatch, errors_at)
    config = resolve_config("copy", overrides=[*ROLLBACK_TINY, "eval_sizes=5,9",
                                               "stop_bit_errors=0", "patience_evals=2",
                                               "rollback_bit_errors=-1", "max_sequences=40"])
    result = train(config, tmp_path / "run", progress=False)
    assert result.converged and result.step == 8  # clean at 3 (then reset at 4), 6 and 8
    assert calls == ["train", "train", 5, 9, "train", 5, 9, "train", "train", 5, 9, "train", 5, 9,
                     "train", 5, 9, "train", 5, 9]
    logged = [(r["step"], r["split"], r["bit_errors"])
              for r in read_metrics(tmp_path / "run" / "metrics.csv") if r["split"] != "train"]
    assert logged[:4] == [("1", "val", "2"), ("2", "val", "0"), ("2", "val@5", "3"),
                          ("2", "val@9", "7")]
    assert result.metrics["general_bit_errors"] == 0.0


def test_stop_bit_errors_holds_at_each_generalisation_size_not_for_their_sum(tmp_path,
                                                                            monkeypatch):
    """stop_bit_errors is per sequence at every eval_size: two sizes at 0.4 meet 0.5 (their
    sum, which ranks validations, would not)."""
    _script_validations(monkeypatch, lambda length: 0.0 if length <= 2 else 0.4)
    config = resolve_config("copy", overrides=[*ROLLBACK_TINY, "eval_sizes=5,9",
                                               "stop_bit_errors=0.5", "patience_evals=1",
                                               "rollback_bit_errors=-1", "max_sequences=40"])
    result = train(config, tmp_path / "run", progress=False)
    assert result.converged and result.step == 1
    assert result.metrics["general_bit_errors"] == pytest.approx(0.8)


def test_generalisation_is_validated_with_eval_memory_size_rows_and_the_same_weights(
        tmp_path, monkeypatch):
    """eval_memory_size: the eval_sizes validations run the model's weights with more rows;
    the training distribution's validation keeps memory_size."""
    import torch_ntm.train as module

    seen = []

    def recording(model, batches):
        seen.append((model.memory_size, {k: v.clone() for k, v in model.state_dict().items()}))
        return {"cost_bits": 1.0, "bit_errors": 0.0, "perfect": 1.0}

    monkeypatch.setattr(module, "evaluate_batches", recording)
    config = resolve_config("copy", overrides=[*ROLLBACK_TINY, "eval_sizes=5", "max_sequences=4",
                                               "eval_memory_size=32", "rollback_bit_errors=-1"])
    train(config, tmp_path / "run", progress=False)
    assert [rows for rows, _ in seen] == [8, 32, 8, 32]
    for (_, trained), (_, general) in zip(seen[::2], seen[1::2]):  # the same weights each time
        assert trained.keys() == general.keys()
        for key, value in trained.items():
            assert torch.equal(value, general[key]), key
    assert seen[0][1]["reads0"].ne(seen[2][1]["reads0"]).any()  # and they did train in between


def test_eval_repeats_validates_repeat_copy_at_more_repeats_with_the_sizes(tmp_path,
                                                                          monkeypatch):
    """eval_repeats: sets at the longest training length with exactly R repeats, validated with
    eval_sizes' (once the training distribution is solved), logged as val@rR, and ranked with
    them (their sum)."""
    import torch_ntm.train as module

    seen = []

    def recording(model, batches):
        task = batches[0][1]
        seen.append((task.min_length, task.max_length, task.min_repeats, task.max_repeats))
        errors = 0.0 if task.max_repeats <= 2 else 0.25 * task.max_repeats
        return {"cost_bits": 1.0, "bit_errors": errors, "perfect": float(errors == 0)}

    monkeypatch.setattr(module, "evaluate_batches", recording)
    config = resolve_config("repeat_copy", overrides=[
        *ROLLBACK_TINY, "task.max_repeats=2", "eval_sizes=3", "eval_repeats=4,6",
        "max_sequences=2", "rollback_bit_errors=-1"])
    result = train(config, tmp_path / "run", progress=False)
    # Per validation: the training distribution (L <= 2, R <= 2), L = 3, then L = 2 at R = 4, 6.
    assert seen == [(1, 2, 1, 2), (3, 3, 1, 2), (2, 2, 4, 4), (2, 2, 6, 6)]
    splits = [r["split"] for r in read_metrics(tmp_path / "run" / "metrics.csv")
              if r["split"] != "train"]
    assert splits == ["val", "val@3", "val@r4", "val@r6"]
    assert result.metrics["general_bit_errors"] == pytest.approx(1.0 + 1.5)


def test_eval_repeats_needs_a_task_with_a_repeat_count():
    from torch_ntm.config import ConfigError

    with pytest.raises(ConfigError, match="eval_repeats applies to a task with a repeat count"):
        resolve_config("copy", overrides=["eval_repeats=20"])
    with pytest.raises(ConfigError, match="eval_repeats=2000"):
        resolve_config("repeat_copy", overrides=["eval_repeats=2000"])  # 20,000 steps
    assert resolve_config("repeat_copy",
                          overrides=["eval_repeats=15,20"]).evaluation.eval_repeats == [15, 20]


# Per validation of the test below: (sequences of 200 perfect at L = 4, R = 3; wrong data bits
# per sequence at R = 6).
_KEEP_PLAN = [(199, 5.0), (190, 1.0), (192, 3.0), (180, 0.5)]


def _keep_run(tmp_path, monkeypatch, extra: list[str]):
    """Train with four validations whose sets give `_KEEP_PLAN`; the run's kept metrics and the
    tasks validated."""
    import torch_ntm.train as module
    from torch_ntm.checkpoint import load_checkpoint

    seen, count = [], [-1]

    def recording(model, batches):
        task = batches[0][1]
        seen.append((task.min_length, task.max_length, task.min_repeats, task.max_repeats))
        row = {"cost_bits": 1.0, "bit_errors": 0.0, "perfect": 1.0, "data_bit_errors": 0.0,
               "end_marker_wrong": 0.0}
        if task.max_repeats == 2:  # the training distribution's: a new validation
            count[0] += 1
        perfect, data_bits = _KEEP_PLAN[count[0]]
        if (task.max_length, task.max_repeats) == (4, 3):  # a float32 share, as evaluated
            row["perfect"] = float((torch.arange(200) < perfect).float().mean())
        elif task.max_repeats == 6:
            row["data_bit_errors"] = data_bits
        return row

    monkeypatch.setattr(module, "evaluate_batches", recording)
    config = resolve_config("repeat_copy", overrides=[
        *ROLLBACK_TINY, "task.max_repeats=2", "eval_repeats=6", "eval_pairs=4x3",
        "eval_size_sequences=200", "max_sequences=8", "rollback_bit_errors=-1", *extra])
    run_dir = tmp_path / "run"
    train(config, run_dir, progress=False)
    return load_checkpoint(run_dir).best_metrics, seen, run_dir


def test_eval_pairs_validate_at_a_length_and_count(tmp_path, monkeypatch):
    """eval_pairs: a set at (L, R), after eval_repeats' (logged as val@LrR, in the sum)."""
    kept, seen, run_dir = _keep_run(tmp_path, monkeypatch, [])
    assert seen[:3] == [(1, 2, 1, 2), (2, 2, 6, 6), (4, 4, 3, 3)]
    splits = [r["split"] for r in read_metrics(run_dir / "metrics.csv") if r["split"] != "train"]
    assert splits == ["val", "val@r6", "val@4r3"] * 4
    # Without keep_by, the sum of wrong bits over the sets ranks: all 0, so the first is kept.
    assert kept["general_bit_errors"] == 0 and "selection_value" not in kept
    assert resolve_config("repeat_copy", overrides=["eval_pairs=20x10, 15X12"]
                          ).eval_pair_values() == [(20, 10), (15, 12)]


@pytest.mark.parametrize("extra, value, shortfall", [
    # the fewest data bits at R = 6 among those with more than 95% perfect at (4, 3): the
    # third (192 of 200); the second's 190 of 200 is not more than 0.95
    (["keep_by=r6:data_bit_errors", "keep_perfect_above=4r3:0.95"], 3.0, 0.0),
    # without the floor: the fewest data bits
    (["keep_by=r6:data_bit_errors"], 0.5, 0.0),
    # the floor alone: the sum of wrong bits over the sets (all 0) after it; the first
    (["keep_perfect_above=4r3:0.95"], 0.0, 0.0),
    # none above 0.995 (199 of 200 is not more): the nearest, 1 sequence short
    (["keep_by=r6:data_bit_errors", "keep_perfect_above=4r3:0.995"], 5.0, 1 / 200),
])
def test_keep_by_and_keep_perfect_above_choose_the_kept_weights(tmp_path, monkeypatch, extra,
                                                               value, shortfall):
    kept, _, _ = _keep_run(tmp_path, monkeypatch, extra)
    assert kept["selection_value"] == value
    assert kept["selection_shortfall"] == pytest.approx(shortfall)
    assert kept["general_bit_errors"] == 0  # still the sum over the sets


@pytest.mark.parametrize("overrides, message", [
    (["eval_pairs=20"], "'20' is not LENGTHxCOUNT"),
    (["eval_pairs=20x0"], "'20x0' is not LENGTHxCOUNT"),
    (["eval_pairs=200x200"], "eval_pairs=200x200"),  # too many steps
    (["eval_sizes=", "keep_by=r20:data_bit_errors"], "generalisation sets: none"),
    (["eval_repeats=20", "keep_by=r15:data_bit_errors"], "generalisation sets: 15, 20, r20$"),
    (["eval_repeats=20", "keep_by=r20:perfect"], "'perfect' is not a metric of repeat_copy"),
    (["eval_repeats=20", "keep_by=r20"], "must be SET:METRIC"),
    (["eval_pairs=20x10", "keep_perfect_above=20r10:1"], "a number in \\[0, 1\\)"),
    (["eval_pairs=20x10", "keep_perfect_above=20r10:most"], "a number in \\[0, 1\\)"),
    (["input_max_norm=1", "input_max_norm_channels=10"], "has input channels 0 to 9"),
    (["input_max_norm_channels=9"], "act only with a cap: set input_max_norm"),
    (["input_max_norm=1", "input_max_norm_channels=-1"], "comma-separated integers >= 0"),
    (["input_max_norm=-1"], "input_max_norm=-1.0 is out of range"),
    (["input_max_norm=1", "input_max_norm_ramp=-5"], "input_max_norm_ramp=-5 is out of range"),
])
def test_the_keeping_and_input_cap_keys_are_checked(overrides, message):
    from torch_ntm.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        resolve_config("repeat_copy", overrides=overrides)


def test_eval_pairs_needs_a_task_with_a_repeat_count():
    from torch_ntm.config import ConfigError

    with pytest.raises(ConfigError, match="eval_pairs applies to a task with a repeat count"):
        resolve_config("copy", overrides=["eval_pairs=20x10"])
    capped = resolve_config("repeat_copy", overrides=["input_max_norm=2",
                                                      "input_max_norm_channels=0,9"])
    assert capped.optim.input_max_norm_channels == [0, 9]


def test_input_max_norm_caps_the_chosen_channels_on_a_ramp():
    """After each update each chosen channel's input column is scaled down to the cap; the cap
    falls linearly from the columns' largest norm at the first update to input_max_norm."""
    from torch_ntm.factories import build_model, build_task
    from torch_ntm.train import _Run, _State, input_weights

    config = resolve_config("repeat_copy", overrides=[
        "controller_size=8", "memory_size=8", "memory_width=4", "input_max_norm=1",
        "input_max_norm_channels=3,9", "input_max_norm_ramp=100"])
    run = _Run.__new__(_Run)  # the parts `_cap_input_weights` uses
    run.config, run.state, run.task = config, _State(), build_task(config)
    run.model = build_model(config, run.task)
    weights = input_weights(run.model)
    assert weights is run.model.controller.cells[0].weight_ih
    with torch.no_grad():
        for channel, norm in ((3, 2.0), (9, 4.0), (5, 7.0)):
            weights[:, channel] *= norm / weights[:, channel].norm()
    untouched = weights[:, [0, 5, 10]].clone()

    def norms():
        return [round(float(weights[:, c].detach().norm()), 5) for c in (3, 9)]

    run._cap_input_weights(50)  # the start is 4 (channel 9's); halfway to 1: 2.5
    assert run.state.input_norm_start == pytest.approx(4.0)
    assert norms() == [2.0, 2.5]
    run._cap_input_weights(75)  # 1.75
    assert norms() == [1.75, 1.75]
    with torch.no_grad():
        weights[:, 3] *= 10  # an update that grew it
    run._cap_input_weights(100)
    assert norms() == [1.0, 1.0]
    run._cap_input_weights(400)  # the cap stays at input_max_norm
    assert norms() == [1.0, 1.0]
    assert run.state.input_norm_start == pytest.approx(4.0)  # kept for an exact resume
    assert torch.equal(weights[:, [0, 5, 10]], untouched)  # other inputs and the reads: not
    # Without a ramp, the cap at once, on every input channel if none is chosen.
    run.config = config.replaced(input_max_norm_ramp=0, input_max_norm_channels=[])
    run.state = _State()
    run._cap_input_weights(1)
    assert float(weights[:, :10].detach().norm(dim=0).max()) == pytest.approx(1.0)
    assert torch.equal(weights[:, 10], untouched[:, 2])


def test_eval_memory_size_is_checked_and_ignored_by_the_lstm_baseline():
    from torch_ntm.config import ConfigError

    with pytest.raises(ConfigError, match="eval_memory_size=1000000000 x memory_width=20"):
        resolve_config("copy", overrides=["eval_memory_size=1000000000"])
    with pytest.raises(ConfigError, match="eval_memory_size=-1 is out of range"):
        resolve_config("copy", overrides=["eval_memory_size=-1"])
    assert resolve_config("copy").eval_overrides() == {"memory_size": 256}
    assert resolve_config("copy", "lstm", ["eval_memory_size=64"]).eval_overrides() == {}


@pytest.mark.parametrize("threshold, expected", [
    (1e9, [1, 1, 2, 2, 3, 3, 4, 4]),  # met at every training row: one size up each time
    (0.0, [2] * 8),  # an untrained model has wrong bits: it stays at the start
])
def test_a_curriculum_raises_the_training_size_when_the_training_rows_meet_it(
        tmp_path, monkeypatch, threshold, expected):
    from torch_ntm.tasks import CopyTask

    drawn = []
    real = CopyTask._sample

    def recording(self, batch_size, generator):
        drawn.append(self.max_length)
        return real(self, batch_size, generator)

    monkeypatch.setattr(CopyTask, "_sample", recording)
    start = expected[0]
    config = resolve_config("copy", overrides=[
        "task.max_length=4", "task.width=3", "memory_size=8", "memory_width=4",
        "controller_size=8", "batch_size=2", "max_sequences=16", "eval_every=100", "log_every=2",
        "engine=auto", "eval_sizes=", f"curriculum_start={start}",
        f"curriculum_bit_errors={threshold}"])
    drawn.clear()  # the config's checks draw sequences too
    train(config, tmp_path / "run", progress=False)
    assert drawn[-8:] == expected  # the 8 training batches, after the validation sets
    assert drawn[:-8] and all(size == 4 for size in drawn[:-8])  # validation: the task's own sizes
    rows = [r["split"] for r in read_metrics(tmp_path / "run" / "metrics.csv")]
    assert [s for s in rows if s.startswith("curriculum")] == [
        f"curriculum@{n}" for n in sorted(set(expected[1:]) - {start})]


def test_priority_sort_close_pairs_train_but_validate_on_the_papers_task():
    from torch_ntm.evaluate import fixed_batches
    from torch_ntm.tasks import PrioritySortTask
    from torch_ntm.train import HELD_OUT_SEED, validation_batches

    config = resolve_config("priority_sort", None, ["task.close_pairs=3", "eval_sequences=40"])
    assert config.task_params == PrioritySortTask(close_pairs=3)
    batches = validation_batches(config, config.task_params)
    expected = fixed_batches(PrioritySortTask(), 40, max(config.batch_size, 64), HELD_OUT_SEED)
    assert len(batches) == len(expected)
    for (got, task), (want, _) in zip(batches, expected):
        assert task == PrioritySortTask()
        assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("clip_norm", [0.0, 1.0])
def test_clip_returns_the_global_norm_and_clips_only_when_asked(clip_norm):
    from torch_ntm.config import TrainConfig
    from torch_ntm.train import _clip

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5))]
    for p in params:
        p.grad = torch.randn_like(p) * 3
    before = [p.grad.clone() for p in params]
    expected = torch.cat([g.flatten() for g in before]).norm()
    config = TrainConfig().replaced(clip_value=0.0, clip_norm=clip_norm)
    norm = _clip(config, params, None)
    torch.testing.assert_close(norm, expected)
    scale = 1.0 if clip_norm == 0 else min(1.0, clip_norm / (float(expected) + 1e-6))
    for p, g in zip(params, before):
        torch.testing.assert_close(p.grad, g * scale)
    params[1].grad[0] = float("inf")
    assert not torch.isfinite(_clip(config, params, None))


def test_a_run_out_of_time_just_after_a_save_records_its_clock_as_spent(tmp_path, monkeypatch):
    """Its checkpoint kept the clock of the save before the time ran out, below max_seconds, so
    resuming it with the same budget trained a step more (and rewrote the run directory)."""
    import torch_ntm.train as module

    class Clock:  # each reading one second on, so the run runs out of time at a known call
        now = -1.0

        @classmethod
        def perf_counter(cls):
            cls.now += 1.0
            return cls.now

    monkeypatch.setattr(module, "time", Clock)
    config = resolve_config("copy", overrides=[
        "task.max_length=2", "task.width=3", "memory_size=8", "memory_width=4",
        "controller_size=8", "batch_size=2", "max_sequences=1000", "eval_every=1",
        "eval_sizes=", "max_seconds=3", "engine=auto"])
    # The clock: 0 the start, 1 the check before step 1, 2 its validation and save, 3 the check
    # before step 2: out of time right after a save.
    first = train(config, tmp_path / "run", progress=False)
    assert first.step == 1 and first.elapsed_s >= 3
    again = train(config, tmp_path / "run", resume=True, progress=False)
    assert not again.trained and again.step == 1


def test_a_resume_keeps_the_tensorboard_points_before_it(tmp_path):
    """TensorBoard's points are at their sequence count, but the resume purged from its step
    count on: resumed at step 6 (48 sequences), every point from 6 sequences on was dropped."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides = ["task.max_length=2", "task.width=3", "memory_size=8", "memory_width=4",
                 "controller_size=8", "batch_size=8", "log_every=2", "eval_every=6",
                 "eval_sizes=", "engine=auto"]
    run = tmp_path / "run"
    train(resolve_config("copy", overrides=[*overrides, "max_sequences=48"]), run,
          progress=False)
    train(resolve_config("copy", overrides=[*overrides, "max_sequences=96"]), run,
          resume=True, progress=False)
    logged = [int(r["sequences"]) for r in read_metrics(run / "metrics.csv", "train")]
    assert logged == list(range(16, 97, 16))
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/cost_bits")] == logged


def test_a_run_saved_with_the_flat_config_of_earlier_versions_resumes_as_if_uninterrupted(
        tmp_path):
    """Before the model's options and the sections were nested (``model_params``, ``optim``,
    ``stabilise``, ``evaluation``), checkpoint.json and config.json held every key at the top
    level, every model's, the caps as 0: such a run resumes and ends where one that never
    stopped ends."""
    import json

    from torch_ntm.checkpoint import CHECKPOINT_JSON, load_checkpoint
    from torch_ntm.config import MODEL_DEFAULTS

    config = resolve_config("copy", overrides=[*ROLLBACK_TINY, "max_sequences=4"])
    train(config, tmp_path / "old", progress=False)
    for name in (CHECKPOINT_JSON, "config.json"):
        path = tmp_path / "old" / name
        record = json.loads(path.read_text())
        data = record["config"] if name == CHECKPOINT_JSON else record
        nested = data.pop("model_params")
        data.update({**MODEL_DEFAULTS, "sparse_link": 0, **nested, "max_beta": 0.0,
                     "max_gamma": 0.0})
        for section in ("optim", "stabilise", "evaluation"):
            data.update(data.pop(section))
        path.write_text(json.dumps(record))
    flat = json.loads((tmp_path / "old" / "config.json").read_text())
    assert "memory_size" in flat and "lr" in flat and "optim" not in flat
    assert load_checkpoint(tmp_path / "old").config == config
    longer = config.replaced(max_sequences=8)
    train(longer, tmp_path / "old", resume=True, progress=False)
    train(longer, tmp_path / "straight", progress=False)
    old, straight = (load_checkpoint(tmp_path / run) for run in ("old", "straight"))
    assert old.sequences == straight.sequences == 8
    resumed = old.model(latest=True).state_dict()
    for name, weight in straight.model(latest=True).state_dict().items():
        torch.testing.assert_close(resumed[name], weight, rtol=0, atol=0)


_STARTS = [*_TINY_LR, "starts=3", "start_sequences=4", "max_sequences=8", "eval_sizes=",
           "log_every=1"]


def _same_tensors(a: dict, b: dict) -> bool:
    """Whether two state dicts hold the same names and tensors, to the bit."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _kept(run_dir):
    from torch_ntm.checkpoint import load_checkpoint

    return load_checkpoint(run_dir).kept_weights()


def test_several_starts_go_on_from_the_one_whose_validation_is_best(tmp_path):
    """``starts=K``: K runs of start_sequences from seeds seed + 1,000,000 k, then the best by
    the run's own ranking goes on, as the same start resumed to max_sequences would."""
    import shutil

    from torch_ntm.checkpoint import load_checkpoint, start_dir
    from torch_ntm.train import _score, start_config

    config = resolve_config("copy", overrides=_STARTS, seed=5)
    result = train(config, tmp_path / "run", progress=False)
    starts = [load_checkpoint(start_dir(tmp_path / "run", k)) for k in range(3)]
    assert [c.config.seed for c in starts] == [5, 1_000_005, 2_000_005]
    assert {c.sequences for c in starts} == {4}
    scores = [_score(c.metrics) for c in starts]  # the last validation: what goes on
    assert len(set(scores)) == 3  # the starts differ, so the choice means something
    assert result.start == min(range(3), key=scores.__getitem__)
    assert result.sequences == 8
    # Start 0 is the run of the seed itself, with start_sequences for its budget.
    plain = config.replaced(starts=1, start_sequences=0, max_sequences=4)
    train(plain, tmp_path / "plain", progress=False)
    assert _same_tensors(_kept(tmp_path / "plain"), _kept(start_dir(tmp_path / "run", 0)))
    # The run goes on as the chosen start resumed would, its log carried over.
    chosen = start_dir(tmp_path / "run", result.start)
    shutil.copytree(chosen, tmp_path / "alone")
    alone = start_config(config, result.start).replaced(max_sequences=8)
    train(alone, tmp_path / "alone", resume=True, progress=False)
    ours, theirs = load_checkpoint(tmp_path / "run"), load_checkpoint(tmp_path / "alone")
    assert _same_tensors(ours.state_dict, theirs.state_dict)
    assert _same_tensors(ours.kept_weights(), theirs.kept_weights())
    def rows(run_dir):  # the clock apart
        return [{k: v for k, v in r.items() if k != "elapsed_s"}
                for r in read_metrics(run_dir / "metrics.csv")]

    assert rows(tmp_path / "run") == rows(tmp_path / "alone")
    assert len(rows(tmp_path / "run")) > 4  # the start's rows and the continuation's
    assert ours.config == config  # the run's own config, not its start's


def test_a_run_stopped_in_its_starts_resumes_them_and_ends_as_if_never_stopped(tmp_path):
    from torch_ntm.checkpoint import load_checkpoint, start_dir
    from torch_ntm.cli import main
    from torch_ntm.train import _train, start_config

    config = resolve_config("copy", overrides=_STARTS, seed=2)
    whole = train(config, tmp_path / "whole", progress=False)
    # Stopped half-way through start 1: start 0 done, start 1 at 2 of its 4 sequences.
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(config.to_json() + "\n")
    _train(start_config(config, 0), start_dir(run, 0), resume=False, progress=False)
    _train(start_config(config, 1).replaced(max_sequences=2), start_dir(run, 1), resume=False,
           progress=False)
    assert main(["train", "copy", "--resume", str(run), "--no-plots", "--no-progress"]) == 0
    ours, theirs = load_checkpoint(run), load_checkpoint(tmp_path / "whole")
    assert ours.sequences == theirs.sequences == whole.sequences
    assert _same_tensors(ours.state_dict, theirs.state_dict)
    for k in range(3):
        assert _same_tensors(_kept(start_dir(run, k)), _kept(start_dir(tmp_path / "whole", k)))


def test_overwrite_removes_the_starts_runs_too(tmp_path, capsys):
    from torch_ntm.cli import main

    args = ["train", "copy", "--out", str(tmp_path / "run"), "--no-plots", "--no-progress",
            *[a for key in _STARTS for a in ("--set", key)]]
    assert main(args) == 0
    assert "went on from start" in capsys.readouterr().out
    (tmp_path / "run" / "starts" / "1" / "mine.txt").write_text("not the run's")
    assert main([*args, "--overwrite", "--set", "starts=2"]) == 0
    assert not (tmp_path / "run" / "starts" / "2" / "checkpoint.json").exists()
    assert (tmp_path / "run" / "starts" / "1" / "mine.txt").exists()  # not a run's: kept
    assert (tmp_path / "run" / "starts" / "1" / "checkpoint.json").exists()  # trained again


def test_a_rate_given_on_resume_reaches_a_start_or_first_stage_that_resumes(tmp_path):
    """``--resume RUN --set lr=X`` with X the run's own rate, in a run still training its
    starts or its first stage: the resumed start or stage went on at its decayed rate, as the
    flag did not reach past the run's own folder."""
    from torch_ntm.checkpoint import stage_dir, start_dir
    from torch_ntm.train import _train, first_stage_config, start_config

    decay = ["lr_decay=0.5", "lr_milestones=1"]
    config = resolve_config("copy", overrides=[*_STARTS, *decay], seed=2)
    run = tmp_path / "starts"
    run.mkdir()
    (run / "config.json").write_text(config.to_json() + "\n")
    _train(start_config(config, 0).replaced(max_sequences=2), start_dir(run, 0), resume=False,
           progress=False)
    assert _lr_of(start_dir(run, 0)) == pytest.approx(0.005)
    train(config, run, resume=True, progress=False, new_lr=True)
    assert _lr_of(start_dir(run, 0)) == pytest.approx(0.01)  # resumed, at the rate given
    assert _lr_of(start_dir(run, 1)) == pytest.approx(0.005)  # trained from its first step

    config = resolve_config("copy", overrides=[*_STAGED, *decay], seed=4)
    run = tmp_path / "staged"
    (run / "stages").mkdir(parents=True)
    for path in (run / "config.json", run / "stages" / "config.json"):
        path.write_text(config.to_json() + "\n")
    _train(first_stage_config(config).replaced(max_sequences=4), stage_dir(run), resume=False,
           progress=False)
    assert _lr_of(stage_dir(run)) == pytest.approx(0.005)
    train(config, run, resume=True, progress=False, new_lr=True)
    assert _lr_of(stage_dir(run)) == pytest.approx(0.01)


@pytest.mark.parametrize("overrides, message", [
    (["starts=2"], r"starts=2 needs start_sequences, each start's budget, above 0 and below "
                   r"max_sequences \(8\); got 0"),
    (["starts=2", "start_sequences=8"], "needs start_sequences"),
    (["starts=0"], r"starts=0 is out of range; it must be an integer from 1 to 100"),
])
def test_starts_are_checked(overrides, message):
    from torch_ntm.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        resolve_config("copy", overrides=[*_TINY_LR, "max_sequences=8", *overrides])


_STAGED = [*_TINY_LR, "max_sequences=8", "eval_sizes=", "log_every=1",
           "finetune=lr=0.001 max_sequences=6 memory_size=6 eval_every=3"]


def test_a_fine_tune_trains_as_the_first_stage_and_then_init_from_it_would(tmp_path):
    """``finetune``: the first stage in RUN/stages/0 is the run without it; the fine-tune in
    RUN is the run with its settings from the weights that stage kept, to the bit."""
    from torch_ntm.checkpoint import load_checkpoint, stage_dir

    config = resolve_config("copy", overrides=_STAGED, seed=3)
    result = train(config, tmp_path / "run", progress=False)
    assert result.first_stage.sequences == 8 and result.sequences == 6
    first = config.replaced(finetune="")
    train(first, tmp_path / "first", progress=False)
    assert _same_tensors(_kept(stage_dir(tmp_path / "run")), _kept(tmp_path / "first"))
    second = first.replaced(init_from=str(tmp_path / "first"), lr=0.001, max_sequences=6,
                            memory_size=6, eval_every=3)
    train(second, tmp_path / "second", progress=False)
    ours, theirs = load_checkpoint(tmp_path / "run"), load_checkpoint(tmp_path / "second")
    assert _same_tensors(ours.state_dict, theirs.state_dict)
    assert _same_tensors(ours.kept_weights(), theirs.kept_weights())
    assert not _same_tensors(ours.state_dict, load_checkpoint(tmp_path / "first").state_dict)
    assert ours.config.finetune == "" and ours.config.model_params.memory_size == 6
    assert ours.config.init_from == str(stage_dir(tmp_path / "run"))


def test_a_run_stopped_in_its_first_stage_resumes_it_then_fine_tunes(tmp_path, capsys):
    from torch_ntm.checkpoint import load_checkpoint, stage_dir
    from torch_ntm.cli import main
    from torch_ntm.train import _train

    config = resolve_config("copy", overrides=_STAGED, seed=4)
    train(config, tmp_path / "whole", progress=False)
    # Stopped half-way through the first stage, as `_train_stages` leaves it.
    run = tmp_path / "run"
    (run / "stages").mkdir(parents=True)
    for path in (run / "config.json", run / "stages" / "config.json"):
        path.write_text(config.to_json() + "\n")
    _train(config.replaced(finetune="", max_sequences=4), stage_dir(run), resume=False,
           progress=False)
    assert main(["train", "copy", "--resume", str(run), "--no-plots", "--no-progress"]) == 0
    assert "first stage: " in capsys.readouterr().out
    ours, theirs = load_checkpoint(run), load_checkpoint(tmp_path / "whole")
    assert ours.sequences == theirs.sequences == 6
    assert _same_tensors(ours.state_dict, theirs.state_dict)
    assert _same_tensors(_kept(stage_dir(run)), _kept(stage_dir(tmp_path / "whole")))
    # Done: a sweep finds it complete under the config that trained it.
    from torch_ntm.sweep import _existing_run

    assert _existing_run(run, config) == "complete"


def test_overwrite_removes_the_first_stage_and_an_empty_finetune_trains_one_stage(tmp_path):
    from torch_ntm.cli import main

    args = ["train", "copy", "--out", str(tmp_path / "run"), "--no-plots", "--no-progress",
            *[a for key in _STAGED for a in ("--set", key)]]
    assert main(args) == 0
    assert (tmp_path / "run" / "stages" / "0" / "checkpoint.json").exists()
    assert main([*args, "--overwrite", "--set", "finetune="]) == 0
    assert not (tmp_path / "run" / "stages" / "0" / "checkpoint.json").exists()
    assert not (tmp_path / "run" / "stages" / "config.json").exists()
    from torch_ntm.checkpoint import load_checkpoint

    assert load_checkpoint(tmp_path / "run").sequences == 8  # the first stage's budget alone


@pytest.mark.parametrize("finetune, message", [
    ("lr", r"finetune='lr': 'lr' is not KEY=VALUE"),
    ("init_from=runs/x", r"finetune sets init_from: a fine-tune starts from the run's first"),
    ("lr=0.1 colour=red", r"finetune colour: unknown key; valid keys:"),
    ("lr=fast", r"finetune lr=fast: expected a value of type float"),
    ("controller_size=16", r"changes the model's weights \(controller_size=16 \(here 8\)\)"),
])
def test_fine_tune_settings_are_checked_before_any_run_folder(tmp_path, capsys, finetune,
                                                              message):
    from torch_ntm.cli import main

    out = tmp_path / "run"
    args = ["train", "copy", "--out", str(out), "--no-plots",
            *[a for key in [*_TINY_LR, f"finetune={finetune}"] for a in ("--set", key)]]
    assert main(args) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists()


def test_the_repeat_copy_preset_fine_tunes_as_the_shipped_model_was():
    """The default preset's second stage is the shipped model's fine-tune, key for key."""
    import json

    from torch_ntm.config import TrainConfig, differing_keys
    from torch_ntm.overrides import finetune_config
    from torch_ntm.pretrained import path

    shipped = json.loads(path("repeat_copy").read_text())["config"]
    shipped = TrainConfig.from_dict(shipped)
    ours = finetune_config(resolve_config("repeat_copy"), shipped.init_from)
    assert differing_keys(ours, shipped) == ["engine"]  # "auto", the native engine on a CPU
    assert shipped.engine == "native"


@pytest.mark.parametrize("folder, overrides", [("stages", _STAGED), ("starts", _STARTS)])
def test_a_link_planted_for_the_runs_inside_a_run_is_refused(tmp_path, folder, overrides):
    """A resumed run with a fine-tune or several starts writes its inner runs in RUN/stages or
    RUN/starts: a link planted there is refused, and nothing is written through it."""
    from torch_ntm.checkpoint import CheckpointError

    config = resolve_config("copy", overrides=overrides)
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (run / "config.json").write_text(config.to_json() + "\n")
    (run / folder).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        train(config, run, resume=True, progress=False)
    assert list(elsewhere.iterdir()) == []
