"""Configs: presets, ``--set key=value`` parsing and its errors."""

import dataclasses

import pytest

from torch_ntm.config import PRESETS, ConfigError, TrainConfig, apply_overrides, resolve_config
from torch_ntm.model import NTMOptions
from torch_ntm.tasks import TASKS


def test_every_task_has_the_four_presets_and_they_resolve():
    assert set(PRESETS) == set(TASKS)
    for task in TASKS:
        assert {"ntm-lstm", "ntm-lstm-paper", "ntm-ff", "lstm"} <= set(PRESETS[task])
        for preset in PRESETS[task]:
            config = resolve_config(task, preset)
            assert config.task == task and config.preset == preset


def test_paper_presets_follow_the_papers_tables():
    paper = resolve_config("copy", "ntm-lstm-paper")
    assert (paper.optimizer, paper.lr, paper.momentum, paper.batch_size) == (
        "rmsprop", 1e-4, 0.9, 1)
    assert (paper.controller_size, paper.memory_size, paper.memory_width) == (100, 128, 20)
    assert paper.clip_value == 10.0
    lstm = resolve_config("copy", "lstm")
    assert (lstm.model, lstm.controller_layers, lstm.controller_size) == ("lstm", 3, 256)
    ff = resolve_config("associative_recall", "ntm-ff")
    assert (ff.controller, ff.read_heads, ff.write_heads) == ("feedforward", 4, 4)


def test_overrides_are_parsed_to_the_fields_types():
    config = resolve_config("copy", overrides=["lr=3e-4", "batch_size=8", "memory_init=learned",
                                               "task.max_length=5", "max_seconds=1.5"], seed=7)
    assert config.lr == 3e-4 and isinstance(config.lr, float)
    assert config.batch_size == 8 and isinstance(config.batch_size, int)
    assert config.memory_init == "learned"
    assert config.task_params == {"max_length": 5}
    assert config.max_seconds == 1.5
    assert config.seed == 7


def test_override_with_wrong_type_names_key_and_type():
    with pytest.raises(ConfigError, match=r"batch_size=abc: expected a value of type int"):
        resolve_config("copy", overrides=["batch_size=abc"])
    with pytest.raises(ConfigError, match=r"task.max_length=1.5: expected a value of type int"):
        resolve_config("copy", overrides=["task.max_length=1.5"])


def test_unknown_key_is_rejected_with_the_valid_keys():
    with pytest.raises(ConfigError,
                       match=r"--set learning_rate: unknown key; valid keys: .*\blr\b"):
        resolve_config("copy", overrides=["learning_rate=1"])
    with pytest.raises(ConfigError,
                       match=r"task 'copy' has no parameter 'items'; valid: .*task.max_length"):
        resolve_config("copy", overrides=["task.items=3"])
    with pytest.raises(ConfigError, match="expects key=value"):
        resolve_config("copy", overrides=["lr"])


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
    import json

    assert TrainConfig.from_dict(json.loads(config.to_json())) == config


def test_apply_overrides_does_not_mutate_its_input():
    config = resolve_config("copy")
    before = dataclasses.asdict(config)
    apply_overrides(config, ["task.max_length=4", "lr=1"])
    assert dataclasses.asdict(config) == before


def test_model_options_come_from_ntm_options_with_0_for_an_unbounded_cap():
    config = resolve_config("copy", overrides=["controller_size=7", "max_gamma=3"])
    assert config.model_options() == NTMOptions(controller_size=7, max_gamma=3.0)
    assert isinstance(config, NTMOptions)
    with pytest.raises(ConfigError, match=r"the model cannot be built from this config: "
                                          r"read_heads must be an integer >= 1, got 0"):
        resolve_config("copy", overrides=["read_heads=0"])
