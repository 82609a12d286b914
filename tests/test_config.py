"""Configs: presets, ``--set key=value`` parsing and its errors."""

import dataclasses
import json

import pytest

from torch_ntm.config import MODEL_KEYS, ConfigError, TrainConfig
from torch_ntm.dnc import DNCOptions
from torch_ntm.model import NTMOptions
from torch_ntm.overrides import apply_overrides
from torch_ntm.presets import PRESETS, resolve_config
from torch_ntm.tasks import TASKS, CopyTask, RepeatCopyTask


def test_every_task_has_the_four_presets_and_they_resolve():
    assert set(PRESETS) == set(TASKS)
    for task in TASKS:
        expected = ({"mann", "mann-ntm", "lstm"} if task == "omniglot"  # Santoro et al.'s three
                    else {"dnc", "ntm", "lstm"} if task in ("traversal", "shortest_path")
                    else {"ntm-lstm", "ntm-lstm-paper", "ntm-ff", "lstm"})
        assert expected <= set(PRESETS[task])
        for preset in PRESETS[task]:
            config = resolve_config(task, preset)
            assert config.task == task and config.preset == preset


def test_paper_presets_follow_the_papers_tables():
    paper = resolve_config("copy", "ntm-lstm-paper")
    assert (paper.optim.optimizer, paper.optim.lr, paper.optim.momentum, paper.batch_size) == (
        "rmsprop", 1e-4, 0.9, 1)
    model = paper.model_params
    assert (model.controller_size, model.memory_size, model.memory_width) == (100, 128, 20)
    assert paper.optim.clip_value == 10.0
    lstm = resolve_config("copy", "lstm")
    assert lstm.model == "lstm"
    assert (lstm.model_params.controller_layers, lstm.model_params.controller_size) == (3, 256)
    # Table 2 (feed-forward controller): heads and controller size per task.
    table2 = {"copy": (1, 100), "repeat_copy": (1, 100), "associative_recall": (4, 256),
              "ngrams": (1, 100), "priority_sort": (8, 512)}
    for task, (heads, size) in table2.items():
        ff = resolve_config(task, "ntm-ff").model_params
        assert (ff.controller, ff.controller_layers) == ("feedforward", 1), task
        assert (ff.read_heads, ff.write_heads, ff.controller_size) == (heads, heads, size), task


def test_the_recall_ntm_lstm_preset_has_rows_of_40_and_the_paper_presets_20():
    # rows of 40 converged 9 of 10 seeds within 150,000 sequences, rows of 20 7 of 10
    # (docs/sweeps/sweep-recall-m40); the paper's table keeps 20
    assert resolve_config("associative_recall").model_params.memory_width == 40
    for preset in ("ntm-lstm-paper", "ntm-ff"):
        assert resolve_config("associative_recall", preset).model_params.memory_width == 20


def test_priority_sort_trains_by_default_with_the_papers_optimiser_and_budget():
    # Adam in batches (the GPU's recipe, `ntm-lstm`) stayed on the plateau on a CPU; the paper's
    # RMSProp at batch 1 with spikes clipped left it and ended under 18 bits per sequence at a
    # million sequences (docs/results/priority-sort.md)
    config = resolve_config("priority_sort")
    assert config.preset == "ntm-lstm-paper"
    optim = config.optim
    assert (optim.optimizer, optim.lr, optim.momentum, config.batch_size, optim.clip_value,
            optim.clip_spikes) == ("rmsprop", 3e-5, 0.9, 1, 10.0, 2.0)
    assert (config.max_sequences, config.evaluation.eval_every) == (1_000_000, 5000)
    model = config.model_params
    assert (model.controller_layers, model.read_heads, model.write_heads) == (2, 5, 5)
    assert resolve_config("priority_sort", "ntm-lstm").batch_size == 256


def test_overrides_are_parsed_to_the_fields_types():
    config = resolve_config("copy", overrides=["lr=3e-4", "batch_size=8", "memory_init=learned",
                                               "task.max_length=5", "max_seconds=1.5"], seed=7)
    assert config.optim.lr == 3e-4 and isinstance(config.optim.lr, float)
    assert config.batch_size == 8 and isinstance(config.batch_size, int)
    assert config.model_params.memory_init == "learned" and config.value("memory_init") == "learned"
    assert config.task_params == CopyTask(max_length=5)
    assert config.max_seconds == 1.5
    assert config.seed == 7


def test_override_with_wrong_type_names_key_and_type():
    with pytest.raises(ConfigError, match=r"batch_size=abc: expected a value of type int"):
        resolve_config("copy", overrides=["batch_size=abc"])
    with pytest.raises(ConfigError, match=r"task.max_length=1.5: expected a value of type int"):
        resolve_config("copy", overrides=["task.max_length=1.5"])


def test_unknown_key_is_rejected_with_the_valid_keys():
    # The model's keys (from NTMOptions) and the task's group are listed with the others.
    with pytest.raises(ConfigError, match=r"--set learning_rate: unknown key; valid keys: .*"
                                          r"\blr\b.*\bmax_beta\b.*\btask\.<key>, threads\b"):
        resolve_config("copy", overrides=["learning_rate=1"])
    with pytest.raises(ConfigError, match="expects key=value"):
        resolve_config("copy", overrides=["lr"])


def test_a_key_given_as_config_json_nests_it_is_told_its_own_name():
    for given, own in (("optim.lr=3e-4", "lr=3e-4"), ("evaluation.eval_every=5", "eval_every=5"),
                       ("model_params.memory_size=64", "memory_size=64")):
        with pytest.raises(ConfigError, match=rf"^--set {given}: \w+'s keys are set by their "
                                              rf"own names: --set {own}$"):
            resolve_config("copy", overrides=[given])
    assert resolve_config("copy", overrides=["lr=3e-4"]).optim.lr == 3e-4


def test_unknown_task_and_preset_list_valid_choices():
    with pytest.raises(ConfigError,
                       match="unknown task 'sort'; valid tasks: associative_recall, copy"):
        resolve_config("sort")
    with pytest.raises(ConfigError,
                       match="unknown preset 'big' for task 'copy'; valid presets: ntm-lstm"):
        resolve_config("copy", "big")


def test_from_dict_rejects_unknown_keys_and_bad_types():
    with pytest.raises(ConfigError, match="unknown key.*colour"):
        TrainConfig.from_dict({"colour": 1})
    with pytest.raises(ConfigError, match="lr must be float, got 'fast'"):
        TrainConfig.from_dict({"lr": "fast"})
    with pytest.raises(ConfigError, match="batch_size must be int"):
        TrainConfig.from_dict({"batch_size": True})


def test_json_round_trip():
    config = resolve_config("repeat_copy", overrides=["task.max_repeats=4", "seed=3"])
    assert TrainConfig.from_dict(json.loads(config.to_json())) == config


def test_apply_overrides_does_not_mutate_its_input():
    config = resolve_config("copy")
    before = dataclasses.asdict(config)
    apply_overrides(config, ["task.max_length=4", "lr=1"])
    assert dataclasses.asdict(config) == before


# -- Nested keys: the task's parameters are its own dataclass, set as task.KEY ----------------


def test_nested_keys_are_parsed_to_the_tasks_field_types():
    config = resolve_config("repeat_copy", overrides=["task.max_repeats=4",
                                                      "task.repeats_norm=5", "task.width=3"])
    assert config.task_params == RepeatCopyTask(width=3, max_repeats=4, repeats_norm=5.0)
    assert isinstance(config.task_params.repeats_norm, float)
    assert isinstance(config.task_params.max_repeats, int)
    with pytest.raises(ConfigError, match=r"--set task.repeats_norm=x: expected a value of type "
                                          r"float"):
        resolve_config("repeat_copy", overrides=["task.repeats_norm=x"])


def test_a_tasks_keys_change_together_so_their_order_does_not_matter():
    # min_repeats=20 alone is above max_repeats=10; with max_repeats=30 it is valid.
    for order in (["task.min_repeats=20", "task.max_repeats=30"],
                  ["task.max_repeats=30", "task.min_repeats=20"]):
        params = resolve_config("repeat_copy", overrides=order).task_params
        assert (params.min_repeats, params.max_repeats) == (20, 30)
    with pytest.raises(ConfigError, match=r"the task cannot be built from this config: "
                                          r"RepeatCopyTask: min_repeats=20 must be <= "
                                          r"max_repeats=10"):
        resolve_config("repeat_copy", overrides=["task.min_repeats=20"])


def test_unknown_nested_key_lists_the_tasks_keys():
    with pytest.raises(ConfigError, match=r"^--set task.items: unknown key; valid keys: "
                                          r"task.max_length, task.min_length, task.width$"):
        resolve_config("copy", overrides=["task.items=3"])
    with pytest.raises(ConfigError, match=r"^--set task: holds keys, not a value; valid keys: "
                                          r"task.max_length, "):
        resolve_config("copy", overrides=["task=ngrams"])
    with pytest.raises(ConfigError, match=r"^--set lr.x: unknown key; lr has no keys$"):
        resolve_config("copy", overrides=["lr.x=1"])


def test_a_prefix_sets_the_tasks_keys_and_errors_show_them_as_given():
    config = resolve_config("copy")
    changed = apply_overrides(config, ["min_length=2", "max_length=4"], "--task-set",
                              prefix="task.")
    assert changed.task_params == CopyTask(min_length=2, max_length=4)
    with pytest.raises(ConfigError, match=r"^--task-set colour: unknown key; valid keys: "
                                          r"max_length, min_length, width$"):
        apply_overrides(config, ["colour=3"], "--task-set", prefix="task.")
    with pytest.raises(ConfigError, match=r"^--task-set width=x: expected a value of type int$"):
        apply_overrides(config, ["width=x"], "--task-set", prefix="task.")


def test_config_json_nests_the_models_options_and_the_tasks_changed_parameters():
    config = resolve_config("copy", overrides=["task.max_length=5", "task.width=8"])
    data = json.loads(config.to_json())
    assert data["task"] == "copy" and data["task_params"] == {"max_length": 5}  # 8: default
    assert data["model"] == "ntm"
    assert data["model_params"] == dataclasses.asdict(NTMOptions())  # all of them
    assert data["model_params"]["max_beta"] is None  # null: the paper's unbounded strength
    assert not set(data) & set(data["model_params"])  # the model's keys only there
    assert TrainConfig.from_dict(data) == config


def test_an_old_flat_config_loads_and_gives_the_same_model_options():
    # As torch-ntm wrote config.json before the task's parameters had a type of their own and
    # before the caps on beta and gamma existed (the shipped models' configs).
    old = {"task": "repeat_copy", "task_params": {"max_repeats": 4}, "preset": "ntm-lstm",
           "model": "ntm", "controller": "lstm", "controller_size": 50, "controller_layers": 1,
           "memory_size": 64, "memory_width": 20, "read_heads": 1, "write_heads": 1,
           "shift_range": 1, "memory_init": "constant", "engine": "compiled", "lr": 0.003}
    config = TrainConfig.from_dict(old)
    assert config.task_params == RepeatCopyTask(max_repeats=4)
    assert config.model_params == NTMOptions(controller_size=50, memory_size=64)
    assert json.loads(config.to_json())["task_params"] == {"max_repeats": 4}
    # a flat config held every model's keys: those of another model are left out, unused
    dnc = TrainConfig.from_dict({**old, "model": "dnc", "sparse_link": 0, "usage_decay": 0.9})
    assert dnc.model_params == DNCOptions(controller_size=50, memory_size=64, memory_width=20,
                                          read_heads=1)
    with pytest.raises(ConfigError, match=r"^config: model_params: unknown key\(s\) shift_range "
                                          r"for model=dnc; valid keys: controller, "):
        TrainConfig.from_dict({"model": "dnc", "model_params": {"shift_range": 1}})
    with pytest.raises(ConfigError, match=r"^config: memory_size must be int, got '8'"):
        TrainConfig.from_dict({"model_params": {"memory_size": "8"}})
    with pytest.raises(ConfigError, match=r"^config: unknown parameter\(s\) colour for task "
                                          r"'copy'; valid parameters: width, min_length"):
        TrainConfig.from_dict({"task": "copy", "task_params": {"colour": 1}})
    with pytest.raises(ConfigError, match=r"^config: CopyTask.width must be an integer >= 1, "
                                          r"got '8'"):
        TrainConfig.from_dict({"task": "copy", "task_params": {"width": "8"}})


def test_model_options_come_from_ntm_options_with_0_for_an_unbounded_cap():
    config = resolve_config("copy", overrides=["controller_size=7", "max_gamma=3"])
    assert config.model_params == NTMOptions(controller_size=7, max_gamma=3.0)
    assert resolve_config("copy", overrides=["max_gamma=0"]).model_params.max_gamma is None
    assert resolve_config("copy", overrides=["max_gamma=none"]).model_params.max_gamma is None
    with pytest.raises(ConfigError, match=r"the model cannot be built from this config: "
                                          r"read_heads must be an integer >= 1, got 0"):
        resolve_config("copy", overrides=["read_heads=0"])


def test_a_curriculum_must_start_at_a_size_of_the_task():
    assert resolve_config("associative_recall",
                          overrides=["curriculum_start=3"]).stabilise.curriculum_start
    with pytest.raises(ConfigError, match=r"curriculum_start=7 is above the task's own items"):
        resolve_config("associative_recall", overrides=["curriculum_start=7"])
    with pytest.raises(ConfigError, match="curriculum_start=1 is not a size of this task"):
        resolve_config("associative_recall", overrides=["curriculum_start=1"])  # >= 2 items
    with pytest.raises(ConfigError, match="curriculum_start=-1 is out of range"):
        resolve_config("copy", overrides=["curriculum_start=-1"])


def test_weight_decay_is_decoupled_with_adam_and_l2_with_rmsprop():
    import torch

    from torch_ntm.train import make_optimizer

    for optimizer, want in (("adam", 1 - 0.01 * 0.5), ("rmsprop", None)):
        config = resolve_config("copy", overrides=[f"optimizer={optimizer}", "lr=0.01",
                                                   "weight_decay=0.5"])
        weight = torch.nn.Parameter(torch.full((3,), 2.0))
        opt = make_optimizer(config, [weight])
        weight.grad = torch.zeros(3)  # no loss gradient: only the decay moves the weight
        opt.step()
        if want is not None:  # AdamW: w <- w (1 - lr wd) before a zero Adam step
            torch.testing.assert_close(weight.detach(), torch.full((3,), 2.0 * want))
        else:  # L2: gradient wd w = 1, RMSProp's first step moves by lr / sqrt(1 - alpha)
            assert float(weight.detach()[0]) < 2.0 - 0.01
    plain = make_optimizer(resolve_config("copy", overrides=["optimizer=adam", "weight_decay=0"]),
                           [weight])
    assert type(plain) is torch.optim.Adam  # no decay: Adam itself, as runs before the key
    with pytest.raises(ConfigError, match="weight_decay"):
        resolve_config("copy", overrides=["weight_decay=-1"])


def test_every_preset_says_why_in_one_line():
    """Presets are data: each has one line of reason; how it was found is in docs/presets.md,
    which names every preset."""
    from pathlib import Path

    history = (Path(__file__).parents[1] / "docs" / "presets.md").read_text()
    for task, presets in PRESETS.items():
        for name, preset in presets.items():
            assert preset.why and "\n" not in preset.why and len(preset.why) <= 120, (task, name)
            assert f"`{name}`" in history.split(f"## {task}", 1)[1].split("\n## ", 1)[0], (
                task, name)


def test_every_registered_model_is_built_from_its_entry_and_its_keys():
    """`torch_ntm.registry.MODELS` is the one table from a config's ``model`` to the module: the
    keys that shape it, its check, its meta-device model and `build_model` all read it."""
    from torch_ntm.factories import build_model
    from torch_ntm.registry import MODELS

    assert set(MODELS) == {"ntm", "lstm", "mann", "dnc"}
    for name, entry in MODELS.items():
        config = TrainConfig(task="copy", model=name).replaced(controller_size=7)
        if entry.memory:
            config = config.replaced(memory_size=16)
        config.check()
        assert type(config.model_params) is entry.options
        model = build_model(config, config.task_params)
        assert type(model) is entry.cls
        assert MODEL_KEYS[name] == entry.config_keys()
        if entry.memory:
            assert model.options == config.model_params
            assert type(config._meta_model(16)) is entry.cls
        else:
            assert config._meta_model(16) is None and model.hidden_size == 7
    assert MODELS["ntm"].params({"max_beta": 0.0}).max_beta is None
    assert MODELS["dnc"].params({"sparse_link": 0}).sparse_link is None
