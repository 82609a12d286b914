"""The ``--set key=value`` parser: strings from the command line to a checked `TrainConfig`.

Each value is parsed to its key's type (``list[int]`` from comma-separated integers, ``bool`` from
true/false/yes/no/on/off/1/0, an optional key's None from ``none``); a dotted key sets a key of a
nested dataclass (``task.max_length``, the task's); unknown keys are refused with the valid ones
listed.
"""

from __future__ import annotations

import dataclasses
import os
import typing

from torch_ntm.config import (
    KEY_TYPES,
    MODEL_KEY_TYPES,
    MODEL_KEYS,
    SECTIONS,
    ConfigError,
    TrainConfig,
    list_kind,
    optional_type,
    type_hints,
)

__all__ = ["apply_overrides", "finetune_config", "override_keys"]


def _parse_value(text: str, expected, name: str, option: str = "--set"):
    """Parse a command-line string into ``expected`` (bool, int, float, str, or one of these
    or None: ``none`` or nothing gives None), or raise."""
    inner = optional_type(expected)
    if inner is not None:
        if text.strip().lower() in ("", "none"):
            return None
        try:
            return _parse_value(text, inner, name, option)
        except ConfigError:
            raise ConfigError(f"{option} {name}={text}: expected a value of type "
                              f"{inner.__name__}, or none") from None
    try:
        if typing.get_origin(expected) is list:  # comma-separated integers
            values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
            if all(v >= list_kind(name)[0] for v in values):
                return values
            raise ValueError
        if expected is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if expected is int:
            return int(text.replace("_", ""))
        if expected is float:
            return float(text)
        if expected is str:
            return text
    except ValueError:
        pass
    kind = f"comma-separated {list_kind(name)[1]}" if typing.get_origin(expected) is list else (
        f"a value of type {expected.__name__}")
    raise ConfigError(f"{option} {name}={text}: expected {kind}")


def _split(item: str, option: str) -> tuple[str, str]:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"{option} expects key=value, got {item!r}")
    return key, text


def override_keys(overrides: list[str], option: str = "--set") -> set[str]:
    """The keys that ``key=value`` strings set (as given: ``task.max_length``)."""
    return {_split(item, option)[0] for item in overrides}


def _keys(obj) -> dict[str, str]:
    """The keys of a `TrainConfig` or a task that ``--set`` may give, and the field of each:
    every field, but a config's ``task`` names its task's parameters (``task.max_length``), its
    task and preset themselves are chosen on the command line, and its model's options are keys
    of their own (``memory_size``: every model's, refused afterwards where they do not apply),
    as are its sections' (``lr``)."""
    keys = {f.name: f.name for f in dataclasses.fields(obj)}
    if isinstance(obj, TrainConfig):
        for name in ("task_params", "preset", "model_params", *SECTIONS):
            del keys[name]
        keys["task"] = "task_params"
        keys.update({key: key for key in KEY_TYPES})
    return keys


def _valid_keys(obj, group: str) -> str:
    """The keys of ``obj`` as ``--set`` gives them, inside ``group`` (e.g. ``"task."``)."""
    keys = _keys(obj)
    nested = {key for key, name in keys.items()
              if dataclasses.is_dataclass(getattr(obj, name, None))}
    return ", ".join(group + key + (".<key>" if key in nested else "") for key in sorted(keys))


def _parse(config: TrainConfig, key: str, text: str, option: str, prefix: str,
           changes: dict) -> None:
    """Parse ``prefix + key = text`` to the type of the field that the dotted key names and put
    it in ``changes``, a dict of the config's changes by key (a nested dict for a nested
    dataclass). Errors show keys as given, without ``prefix``."""
    obj, names = config, (prefix + key).split(".")
    for depth, name in enumerate(names):
        path = ".".join(names[: depth + 1])[len(prefix) :]  # as given
        keys = _keys(obj)
        if obj is config and name in (*SECTIONS, "model_params"):  # as config.json nests them
            own = ".".join(names[depth + 1 :]) or "KEY"
            raise ConfigError(f"{option} {key}={text}: {name}'s keys are set by their own "
                              f"names: {option} {own}={text}")
        if name not in keys:
            raise ConfigError(f"{option} {path}: unknown key; valid keys: "
                              f"{_valid_keys(obj, path[: len(path) - len(name)])}")
        last = depth == len(names) - 1
        if obj is config and name in KEY_TYPES:  # a section's key or one of the model's options
            if not last:
                raise ConfigError(f"{option} {key}: unknown key; {path} has no keys")
            changes[name] = _parse_value(text, KEY_TYPES[name], path, option)
            return
        value = getattr(obj, keys[name])
        if dataclasses.is_dataclass(value):
            if last:
                raise ConfigError(f"{option} {path}: holds keys, not a value; valid keys: "
                                  f"{_valid_keys(value, path + '.')}")
            obj, changes = value, changes.setdefault(name, {})
        elif not last:
            raise ConfigError(f"{option} {key}: unknown key; {path} has no keys")
        else:
            hint = type_hints(type(obj))[keys[name]]
            changes[name] = _parse_value(text, hint, path, option)


def _replace(obj, changes: dict, name: str = "config"):
    """``obj`` with the ``changes`` that `_parse` gave made to it; a nested dataclass (a task)
    is rebuilt once with all of its changes, and checks them together; a config's model options
    by `TrainConfig.replaced`."""
    keys = _keys(obj)
    values = {keys[key]: _replace(getattr(obj, keys[key]), change, key)
              if isinstance(change, dict) else change for key, change in changes.items()}
    try:
        if isinstance(obj, TrainConfig):
            return obj.replaced(**values)
        return dataclasses.replace(obj, **values)
    except ValueError as e:  # a task rejects its parameters
        raise ConfigError(f"the {name} cannot be built from this config: {e}") from None


def apply_overrides(config: TrainConfig, overrides: list[str], option: str = "--set",
                    prefix: str = "") -> TrainConfig:
    """Apply ``key=value`` strings, each parsed to its key's type, then check the config.

    A dotted key sets a key of a nested dataclass: ``task.max_length=30`` the task's. ``prefix``
    goes before every key (``ntm evaluate --task-set max_length=30`` is ``prefix="task."``);
    errors name ``option`` and the keys as given. All changes are made at once, so that a task's
    ``min_length`` and ``max_length`` may be raised together.
    """
    changes: dict = {}
    for item in overrides:
        key, text = _split(item, option)
        _parse(config, key, text, option, prefix, changes)
    config = _replace(config, changes)
    _check_applies(config, changes, option)
    config.check(option)
    return config


def _check_applies(config: TrainConfig, changes: dict, option: str) -> None:
    """A `ConfigError` for a key set that shapes another model than the config's only (``--set
    sparse_link=4`` on an NTM), which would be ignored and written to config.json."""
    shaping = MODEL_KEY_TYPES.keys()
    for key in changes:
        if key in shaping and key not in MODEL_KEYS.get(config.model, shaping):
            others = [name for name, keys in MODEL_KEYS.items() if key in keys]
            raise ConfigError(f"{option} {key}: applies to model={' or '.join(others)}, not "
                              f"{config.model}; drop it, or set model too")


def finetune_config(config: TrainConfig, first: str | os.PathLike) -> TrainConfig:
    """The config of the fine-tune of a run with one (``finetune``): the run's own with the
    fine-tune's settings, one start, starting from the weights the run in ``first`` keeps.

    Raises:
        ConfigError: a setting of the fine-tune names an unknown key or an invalid value.
    """
    base = config.replaced(finetune="", init_from=str(first), starts=1, start_sequences=0)
    return apply_overrides(base, config.finetune_settings(), option="finetune")
