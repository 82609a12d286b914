"""What a `TrainConfig` builds: its task and its model (an `NTM`, the LSTM baseline, a `MANN` or
a `DNC`)."""

from __future__ import annotations

import dataclasses

from torch import nn

from torch_ntm.config import (
    MAX_PARAMETERS,
    ConfigError,
    TrainConfig,
    check_memory_size,
    check_state_size,
)
from torch_ntm.registry import MODELS

__all__ = ["build_task", "model_config", "build_model"]


def build_task(config: TrainConfig, **task_overrides):
    """A copy of the task a config trains on (``config.task_params``), with ``task_overrides``.

    Raises:
        ConfigError: the task rejects the overrides (e.g. ``min_length`` > ``max_length``).
    """
    try:
        return dataclasses.replace(config.task_params, **task_overrides)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"the task cannot be built from this config: {e}") from None


def model_config(config: TrainConfig, task) -> dict:
    """Constructor arguments of the model a config describes; ``task`` (or a model) gives the
    input and output widths."""
    entry = MODELS.get(config.model)
    if entry is None:
        raise ConfigError(f"model must be one of {', '.join(MODELS)}, got {config.model!r}")
    return {"kind": entry.name, "input_size": task.input_size, "output_size": task.output_size,
            **entry.arguments(config)}


def build_model(config: TrainConfig, task, device=None, **overrides) -> nn.Module:
    """A freshly initialised model for ``config`` (``overrides``, e.g. ``memory_size=1024``).

    Raises:
        ConfigError: sizes the model rejects, or more than `MAX_PARAMETERS` parameters (counted
            on the meta device, before any memory is taken).
    """
    if str(device) != "meta":
        meta = build_model(config, task, "meta", **overrides)
        # its state for a batch (at least 64, as evaluation runs), e.g. `ntm evaluate
        # --memory-size`: refused before any memory is taken
        check_state_size(meta, config.batch_size, "the model",
                         "--memory-size" if "memory_size" in overrides else "memory_size")
        count = sum(p.numel() for p in meta.parameters())
        if count > MAX_PARAMETERS:
            raise ConfigError(f"the model has {count:,} parameters ({count * 4 / 2**30:.3g} GiB), "
                              f"more than the limit of {MAX_PARAMETERS:,}: lower controller_size "
                              f"or controller_layers (or memory_width, read_heads, the task's "
                              f"width)")
    kwargs = {**model_config(config, task), **overrides}
    entry = MODELS[kwargs.pop("kind")]
    try:
        if not entry.memory:
            unused = set(overrides) - set(entry.renamed.values())
            if unused:
                raise ConfigError(f"{entry.title} has no {', '.join(sorted(unused))}")
            return entry.cls(**kwargs, device=device)
        if isinstance(kwargs["memory_size"], int) and isinstance(kwargs["memory_width"], int):
            check_memory_size(kwargs["memory_size"], kwargs["memory_width"], config.batch_size,
                              source="the model")
        kwargs.setdefault("engine", config.engine)
        return entry.cls(**kwargs, device=device)
    except (ValueError, TypeError) as e:  # sizes the model rejects, e.g. shift_range too wide
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"the model cannot be built from this config: {e}") from None
