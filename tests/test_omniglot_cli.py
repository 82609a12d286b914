"""Omniglot in the harness: label scoring, the MANN and its presets, and the command line."""

import json
import math

import pytest
import torch

from torch_ntm.checkpoint import load_checkpoint
from torch_ntm.cli import main
from torch_ntm.config import ConfigError
from torch_ntm.evaluate import evaluate_batches
from torch_ntm.factories import build_model, build_task
from torch_ntm.mann import MANN
from torch_ntm.metrics import label_errors, masked_cross_entropy, objective
from torch_ntm.omniglot import OmniglotTask
from torch_ntm.presets import PRESETS, default_preset, resolve_config
from torch_ntm.runlog import read_metrics
from torch_ntm.tasks import TASKS, make_task
from torch_ntm.train import _score, train

# Small models and few episodes, so that each training takes a second or two.
TINY = ["memory_size=16", "memory_width=8", "controller_size=16", "max_sequences=32",
        "batch_size=8", "eval_every=2", "eval_sequences=32", "log_every=2"]


# ---------------------------------------------------------------------------------------------
# Scoring against hand-computed values


def test_cross_entropy_and_label_errors_one_hot():
    # T=2, B=1, C=3. Step 0: logits (0, ln 2, 0), target class 1: p = 2/4, loss ln 2, right.
    # Step 1: logits (ln 3, 0, 0), target class 2: p = 1/5, loss ln 5, wrong (argmax 0).
    logits = torch.tensor([[[0.0, math.log(2), 0.0]], [[math.log(3), 0.0, 0.0]]])
    targets = torch.tensor([[[0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]]])
    mask = torch.ones(2, 1, dtype=torch.bool)
    loss = masked_cross_entropy(logits, targets, mask)
    assert torch.allclose(loss, torch.tensor([math.log(2) + math.log(5)]))
    assert label_errors(logits, targets, mask).tolist() == [1.0]
    mask[1] = False  # the wrong step is not scored
    assert torch.allclose(masked_cross_entropy(logits, targets, mask), torch.tensor([math.log(2)]))
    assert label_errors(logits, targets, mask).tolist() == [0.0]


def test_cross_entropy_and_label_errors_strings():
    # One step, 2 groups of 2 units: group 0 logits (0, 0) target 0 -> ln 2 (argmax 0: right);
    # group 1 logits (ln 4, 0) target 1 -> ln 5, wrong: the label is wrong, once.
    logits = torch.tensor([[[0.0, 0.0, math.log(4), 0.0]]])
    targets = torch.tensor([[[1.0, 0.0, 0.0, 1.0]]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss = masked_cross_entropy(logits, targets, mask, groups=2)
    assert torch.allclose(loss, torch.tensor([math.log(2) + math.log(5)]))
    assert label_errors(logits, targets, mask, groups=2).tolist() == [1.0]
    right = torch.tensor([[[1.0, 0.0, 0.0, 2.0]]])
    assert label_errors(right, targets, mask, groups=2).tolist() == [0.0]
    with pytest.raises(ValueError, match="do not split into 3 groups"):
        masked_cross_entropy(logits, targets, mask, groups=3)


def test_objective_is_chosen_by_the_task():
    assert make_task("copy").loss == "bce" and make_task("omniglot").loss == "cross_entropy"
    with pytest.raises(ValueError, match="unknown loss 'mse'; valid losses: bce, cross_entropy"):
        objective("mse")
    probs = objective("cross_entropy", 5).probabilities(torch.zeros(3, 25))
    assert torch.allclose(probs, torch.full((3, 25), 0.2))


def test_evaluate_batches_reports_labels_in_the_harness_fields():
    task = OmniglotTask(classes=2, instances=2, split="test")
    batch = task.sample(3, torch.Generator().manual_seed(0))

    class Oracle(torch.nn.Module):  # logits that put ln 3 on the right label of every step
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return batch.targets * math.log(3), None

    row = evaluate_batches(Oracle(), [(batch, task)])
    # p(right) = 3 / (3 + 1) at each of the 4 steps: 4 log2(4/3) bits per episode.
    assert row["cost_bits"] == pytest.approx(4 * math.log2(4 / 3))
    assert row["bit_errors"] == 0.0 and row["perfect"] == 1.0
    assert [row[f"accuracy_{k}"] for k in (1, 2)] == [1.0, 1.0]


def test_validations_are_ordered_by_wrong_labels_then_cost():
    rows = [{"bit_errors": 3.0, "cost_bits": 10.0}, {"bit_errors": 2.0, "cost_bits": 50.0},
            {"bit_errors": 2.0, "cost_bits": 40.0}]
    assert min(rows, key=_score) is rows[2]


# ---------------------------------------------------------------------------------------------
# Registration, presets, models


def test_registered_with_typed_parameters():
    assert "omniglot" in TASKS and "omniglot" in PRESETS
    assert default_preset("omniglot") == "mann" and default_preset("copy") == "ntm-lstm"
    config = resolve_config("omniglot", overrides=["task.classes=15", "task.labels=string"])
    assert config.task_params == OmniglotTask(classes=15, labels="string", reflections=True,
                                              max_angle=20.0, max_shift=2.5, max_scale=0.2,
                                              max_shear=0.3)
    assert config.preset == "mann" and config.model == "mann"
    model = build_model(config, build_task(config))
    assert isinstance(model, MANN) and (model.input_size, model.output_size) == (425, 25)
    assert (model.controller_size, model.memory_size, model.memory_width,
            model.read_heads) == (200, 128, 40, 4)
    # the preset's one departure from the paper (docs/results/omniglot.md)
    assert model.learned_beta
    assert model.engine == "auto"


@pytest.mark.parametrize("preset, kind", [("mann", "MANN"), ("mann-ntm", "NTM"),
                                          ("lstm", "LSTMBaseline")])
def test_presets_build_their_models(preset, kind):
    config = resolve_config("omniglot", preset, ["task.classes=3"])
    model = build_model(config, build_task(config))
    assert type(model).__name__ == kind
    x = config.task_params.sample(2, torch.Generator().manual_seed(0)).inputs
    with torch.no_grad():
        assert model(x[:3])[0].shape == (3, 2, 3)


def test_the_15_class_preset_is_the_papers_episodes_with_string_labels():
    config = resolve_config("omniglot", "mann-15")
    task = build_task(config)
    assert (task.classes, task.instances, task.labels) == (15, 10, "string")
    model = build_model(config, task)
    assert isinstance(model, MANN) and (model.input_size, model.output_size) == (425, 25)
    mann = resolve_config("omniglot", "mann")  # otherwise the mann preset, at its own budget
    differs = {f for f in ("max_sequences", "lr_milestones", "task_params")
               if config.value(f) != mann.value(f)}
    assert differs == {"max_sequences", "lr_milestones", "task_params"}
    assert all(config.value(f) == mann.value(f) for f in (
        "model", "controller_size", "memory_size", "memory_width", "read_heads", "learned_beta",
        "lr", "lr_decay", "weight_decay", "ema_decay", "batch_size"))
    x = task.sample(2, torch.Generator().manual_seed(0)).inputs
    assert x.shape == (150, 2, 425)


@pytest.mark.parametrize("overrides, message", [
    (["task.colour=red"], "--set task.colour: unknown key; valid keys: task.classes"),
    (["task.labels=words"], "unknown labels 'words'; valid labels: one_hot, string"),
    (["task.classes=100"], "held-out data .* cannot be drawn: .*classes=100 is more than the 63"),
    (["model=gru"], "model='gru' is not valid; valid choices: ntm, lstm, mann"),
    (["engine=turbo"], "engine='turbo' is not valid; valid choices: auto, native, graphs, eager"),
    (["write_vector=value"], "unknown write_vector 'value'; valid choices: add, key"),
    (["read_heads=20", "memory_size=16"], "memory_size must be >= read_heads"),
])
def test_bad_options_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config("omniglot", None, overrides)


# ---------------------------------------------------------------------------------------------
# The command line


def _one_line_error(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ntm: error: ") and message in err and err.count("\n") == 1, err


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["mann", "mann-ntm", "lstm"])
def test_train_evaluate_plot(tmp_path, capsys, preset, monkeypatch):
    run = tmp_path / preset
    # the LSTM baseline has no memory: its keys are refused for it
    tiny = [kv for kv in TINY if preset != "lstm" or not kv.startswith("memory_")]
    sets = [arg for kv in tiny for arg in ("--set", kv)]
    assert main(["train", "omniglot", "--preset", preset, *sets,
                 "--out", str(run), "--no-progress", "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "held-out episodes (test split)" in out and "instance  accuracy" in out
    rows = read_metrics(run / "metrics.csv", "val")
    assert len(rows) == 2 and all(0 <= float(r["accuracy_10"]) <= 1 for r in rows)
    assert load_checkpoint(run).config.preset == preset

    sequences = [] if preset == "mann" else ["--sequences", "100"]  # the default: 1,000
    assert main(["evaluate", str(run), "--json", *sequences]) == 0
    report = json.loads(capsys.readouterr().out)
    accuracy = report["accuracy_by_instance"]
    assert list(accuracy) == [str(k) for k in range(1, 11)]
    assert all(0 <= v <= 1 for v in accuracy.values())
    assert report["sequences"] == (1000 if preset == "mann" else 100)
    assert report["split"] == "test"

    from torch_ntm import plot

    figures, save = {}, plot._save
    monkeypatch.setattr(plot, "_save", lambda fig, path: figures.setdefault(path.name, fig)
                        and save(fig, path))
    assert main(["plot", str(run)]) == 0
    listed = capsys.readouterr().out.split()
    assert str(run / "figures" / "accuracy.png") in listed
    assert str(run / "figures" / "learning_curve.png") in listed
    # The accuracy figure: one point per instance, the held-out episodes `ntm evaluate` scores
    # by default (1,000 of the test split), so the mann run's line is its report's figures.
    (line,) = figures["accuracy.png"].axes[0].get_lines()
    assert list(line.get_xdata()) == list(range(1, 11))
    assert figures["accuracy.png"].axes[0].get_title() == "1000 held-out episodes"
    if preset == "mann":
        assert list(line.get_ydata()) == pytest.approx(list(accuracy.values()), abs=1e-12)
    assert all(0 <= y <= 1 for y in line.get_ydata())
    import matplotlib.image

    assert matplotlib.image.imread(run / "figures" / "accuracy.png").shape[:2] == (440, 660)


def test_command_line_errors_are_one_line(tmp_path, capsys):
    _one_line_error(capsys, ["train", "omniglot", "--set", "task.classes=0"],
                    "OmniglotTask.classes must be an integer >= 1")
    _one_line_error(capsys, ["train", "omniglot", "--preset", "ntm-ff"],
                    "unknown preset 'ntm-ff' for task 'omniglot'; valid presets: mann, "
                    "mann-15, mann-ntm, lstm")
    run = tmp_path / "run"
    sets = [arg for kv in TINY for arg in ("--set", kv)]
    assert main(["train", "omniglot", *sets, "--out", str(run), "--no-progress",
                 "--no-plots"]) == 0
    capsys.readouterr()
    _one_line_error(capsys, ["evaluate", str(run), "--lengths", "5"],
                    "--lengths does not apply to omniglot")
    _one_line_error(capsys, ["evaluate", str(run), "--task-set", "classes=3"],
                    "alters the task's input or output width")
    _one_line_error(capsys, ["evaluate", str(run), "--sequences", "0"],
                    "--sequences must be >= 1")


# ---------------------------------------------------------------------------------------------
# Training


@pytest.mark.parametrize("extra", ["engine=eager", "encoder=conv+pixels"])
def test_cross_entropy_falls(tmp_path, extra):
    """100 steps of a small MANN on 2-class episodes: the training cross-entropy falls (the
    paper's controller on the eager loop; the convolutions in front of it on the default
    engine)."""
    config = resolve_config("omniglot", None, [
        "task.classes=2", "task.instances=5", "memory_size=16", "memory_width=8",
        "controller_size=32", "lr=3e-3", "max_sequences=1600", "eval_every=50",
        "eval_sequences=64", "log_every=10", extra])
    train(config, tmp_path / "run", progress=False)
    costs = [float(r["cost_bits"]) for r in read_metrics(tmp_path / "run" / "metrics.csv",
                                                          "train")]
    assert len(costs) == 10
    assert costs[0] == pytest.approx(10.0, abs=0.3)  # chance: 1 bit at each of 10 steps
    assert sum(costs[-3:]) / 3 < costs[0] - 0.4


def test_mann_resume_is_bit_identical(tmp_path):
    def config(sequences):
        return resolve_config("omniglot", None, [*TINY, "batch_size=4", "log_every=3",
                                                 f"max_sequences={sequences}"])

    train(config(32), tmp_path / "full", progress=False)
    train(config(16), tmp_path / "split", progress=False)
    train(config(32), tmp_path / "split", resume=True, progress=False)
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "split")
    assert a.step == b.step == 8
    for key, value in a.state_dict.items():
        assert torch.equal(value, b.state_dict[key]), key
    assert a.metrics == b.metrics and "accuracy_1" in a.metrics

    def rows(run):
        return [{k: v for k, v in r.items() if k != "elapsed_s"}
                for r in read_metrics(run / "metrics.csv")]

    assert rows(tmp_path / "split") == rows(tmp_path / "full")
