"""The argument and state checks the models share (`torch_ntm.NTM`, `torch_ntm.MANN`,
`torch_ntm.DNC` and their cells, through `torch_ntm.base.MemoryModule`): each raises a clear
error naming the problem and the fix, never a bare traceback from deep inside a step.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor, nn

__all__ = ["bound", "cell_step", "check_cell_input", "check_input_dtype", "check_state_tensors",
           "choice", "describe_shapes", "finite", "one_dtype", "positive_fields", "positive_int",
           "read_only_options", "sequence_layout", "time_major"]


def choice(kind: str, value: str, valid) -> str:
    """``value``, or a `ValueError` listing the ``valid`` choices of ``kind``."""
    if value not in valid:
        raise ValueError(f"unknown {kind} {value!r}; valid choices: {', '.join(sorted(valid))}")
    return value


def positive_int(name: str, value, minimum: int = 1) -> int:
    """``value``, or a `ValueError` unless it is an integer >= ``minimum``."""
    # (a SymInt is a size that torch.export keeps symbolic, such as a dynamic batch size)
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def positive_fields(options, *names: str, minimum: int = 1) -> None:
    """Checks each of the ``names`` fields of ``options`` with `positive_int`."""
    for name in names:
        positive_int(name, getattr(options, name), minimum)


def bound(name: str, value, above: float) -> float | None:
    """``value`` as a float (None stays None: unbounded), or a `ValueError` unless it is a
    finite number above ``above``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        above < value < math.inf
    ):
        raise ValueError(f"{name} must be None (unbounded) or a number > {above}, got {value!r}")
    return float(value)


def finite(name: str, value) -> float | None:
    """``value`` as a float (None stays None: not set), or a `ValueError` unless it is a finite
    number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be None (not set) or a finite number, got {value!r}")
    return float(value)


def describe_shapes(value):
    """A short description of a state part for an error message: shapes, not values."""
    if isinstance(value, Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, tuple):
        return "(" + ", ".join(describe_shapes(v) for v in value) + ")"
    return type(value).__name__


def read_only_options(options_type, renamed: dict[str, str] | None = None):
    """A class decorator: each field of the dataclass ``options_type`` becomes a read-only
    attribute of the module class that reads ``self.options`` (``ntm.memory_size``), under its
    name in ``renamed`` if there. Read-only, because the options shape the parameters and the
    engines' cached layouts: an option assigned afterwards would reach some engines and not
    others."""

    def attribute(field: str, name: str) -> property:
        def get(self):
            return getattr(self.options, field)

        def refuse(self, value):
            raise AttributeError(
                f"{type(self).__name__}.{name} is fixed when the module is built; build a new one "
                f"with {field}={value!r} (load_state_dict copies the weights where the shapes "
                f"agree)")

        return property(get, refuse, doc=f"``options.{field}`` (read-only)")

    def install(cls):
        for f in dataclasses.fields(options_type):
            name = (renamed or {}).get(f.name, f.name)
            setattr(cls, name, attribute(f.name, name))
        return cls

    return install


def cell_step(cell: nn.Module, x: object, state):
    """A cell's forward (`torch_ntm.base.Cell`: ``NTMCell``, ``MANNCell``, ``DNCCell``): one
    step from ``state`` (None: the initial state), after a clear error unless ``x`` is one
    step's input ``[batch, cell.input_size]`` in the parameters' dtype and ``state`` fits it."""
    check_cell_input(cell, x)
    cell._check_dtype(x)
    if state is None:
        state = cell.initial_state(x.shape[0], x.device, x.dtype)
    else:
        cell._check_state(state, x.shape[0], x)
    return one_dtype(*cell._step(x, state), x)


def one_dtype(y: Tensor, state, x: Tensor):
    """``(y, state)`` with the state in ``x``'s dtype throughout: under `torch.autocast` a step
    leaves it mixed (the linear layers' outputs, so the weightings and reads, in the low
    precision; the memory and LSTM cells in the parameters'), and a state passed back is
    checked against the input's dtype."""
    if torch.is_autocast_enabled(x.device.type):  # any model's state
        state = state.map(lambda t: t.to(x.dtype))
    return y, state


def check_input_dtype(module: nn.Module, x: Tensor, dtype: torch.dtype) -> None:
    """A clear error unless ``x`` has the parameters' ``dtype`` (no engine converts it), with
    the fix (the model's conversion only for a floating input: an NTM of int64 cannot run)."""
    if x.dtype != dtype:
        fix = f"convert with x.to({dtype})"
        if x.dtype.is_floating_point:
            fix += f" or the model with .to({x.dtype})"
        raise ValueError(f"{type(module).__name__} expects input of dtype {dtype} (its "
                         f"parameters'), got {x.dtype}; {fix}")


def check_state_tensors(state, ref: Tensor) -> None:
    """Every tensor of ``state`` (a `torch_ntm.states` state) in the dtype and on the
    device of the input ``ref``, or a clear error naming the first that is not."""
    for name, t in state.tensors().items():
        if t.dtype != ref.dtype:
            raise ValueError(f"state.{name} has dtype {t.dtype} but the input {ref.dtype}: "
                             f"pass a state of the input's dtype, e.g. "
                             f"state.map(lambda t: t.to({ref.dtype}))")
        if t.device != ref.device:
            raise ValueError(f"state.{name} is on {t.device} but the input is on "
                             f"{ref.device}: move it, e.g. state.map(lambda t: "
                             f"t.to('{ref.device}'))")


def check_cell_input(cell: nn.Module, x: object) -> None:
    """Raise a clear error unless ``x`` is a tensor ``[batch, cell.input_size]`` (a sequence
    belongs to the module without "Cell")."""
    name = type(cell).__name__
    shape = f"[batch, {cell.input_size}]"
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} expects a tensor of shape {shape}, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[1] != cell.input_size:
        raise ValueError(f"{name} expects input of shape {shape}, got {list(x.shape)}; for a "
                         f"sequence [time, batch, {cell.input_size}] use "
                         f"{name.removesuffix('Cell')}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} got a batch of 0 inputs")


def sequence_layout(module: nn.Module) -> str:
    """The input shape a sequence module's ``forward`` takes, for error messages:
    ``[time, batch, I]``, or ``[batch, time, I]`` if ``module.batch_first``."""
    axes = "batch, time" if module.batch_first else "time, batch"
    return f"[{axes}, {module.input_size}]"


def time_major(module: nn.Module, x: object) -> Tensor:
    """``x``, a sequence module's padded input (`sequence_layout`), checked and time-major
    ``[T, B, I]``.

    Raises:
        TypeError: ``x`` is not a tensor.
        ValueError: ``x`` has another shape (a 2-d input is one step: the hint names the
            module's cell), no step or no sequence.
    """
    name, layout = type(module).__name__, sequence_layout(module)
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} expects a tensor of shape {layout}, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[2] != module.input_size:
        hint = (f"; for one step [batch, {module.input_size}] use {name}Cell"
                if x.dim() == 2 else "")
        raise ValueError(f"{name} expects input of shape {layout}, got {list(x.shape)}{hint}")
    if module.batch_first:
        x = x.transpose(0, 1)
    if x.shape[0] == 0:
        raise ValueError(f"{name} got an input sequence of length 0")
    if x.shape[1] == 0:
        raise ValueError(f"{name} got a batch of 0 sequences")
    return x
