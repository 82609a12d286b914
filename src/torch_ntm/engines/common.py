"""What the engines share: saying things once, when only the eager loop can serve a call, a
second derivative through a hand-written backward, and the LSTM's layout in the kernels.

The chooser (`torch_ntm.engines`) and every engine (``ntm``, ``mann``, ``dnc``, ``graphs``)
import it; it imports none of them.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import Tensor

__all__ = ["DEVICES", "carried", "eager_only", "first_order_only", "lstm_gate_order", "lstm_ifog",
           "say_eager", "say_once"]

_log = logging.getLogger("torch_ntm.engines")
# The device type of each engine that runs on one only; the others run on every device.
DEVICES = {"native": "cpu", "graphs": "cuda"}
_SAID: set = set()


def say_once(message: str) -> None:
    """Logs ``message`` (a warning of logger ``torch_ntm.engines``) the first time only."""
    if message not in _SAID:
        _SAID.add(message)
        _log.warning(message)


def eager_only() -> bool:
    """Whether only the eager loop computes what is asked: under a `torch.func` transform (grad,
    vmap, jacrev, ...), whose transforms cannot see through a hand-written backward, or with a
    forward-mode dual level open (`torch.autograd.forward_ad`), for which the native engine has no
    forward derivative."""
    return (torch._C._are_functorch_transforms_active()
            or torch.autograd.forward_ad._current_level >= 0)


def say_eager(model: torch.nn.Module, why: str) -> None:
    """Says once (`say_once`) that ``model``'s call runs on the eager engine, and ``why``."""
    say_once(f"{type(model).__name__} engine {model.engine!r} runs this call on the eager "
             f"engine: {why}")


# ------------------------------------------------------------------------------------------------
# Second derivatives: a native backward is one C++ call, which autograd cannot record.
# ------------------------------------------------------------------------------------------------


def first_order_only(backward):
    """Decorates an `autograd.Function`'s ``backward`` that autograd cannot record (a native
    engine's C++ call): it runs without a graph. Where autograd asks for one
    (``create_graph=True``: a second derivative may follow), the gradients are computed instead by
    autograd through ``ctx.recompute(*ctx.inputs)``, the same function as the forward in plain
    ops, which the forward leaves on ``ctx`` (said once, naming ``ctx.engine``: "native" unless
    the forward says otherwise)."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if torch.is_grad_enabled():
            engine = getattr(ctx, "engine", "native")
            say_once(f"a second derivative through the {engine} engine: its backward is "
                     f"computed again through the eager step (create_graph=True)")
            return _recomputed(ctx, grads)
        return backward(ctx, *grads)

    return wrapper


def _recomputed(ctx, grads: tuple) -> tuple:
    """The backward of ``ctx``'s Function by autograd through ``ctx.recompute``, recorded: the
    gradient of each of ``ctx.inputs`` (None where it needs none), after as many Nones as the
    Function's leading arguments that are not tensors (``ctx.leading``)."""
    inputs = ctx.inputs
    wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
    outputs = ctx.recompute(*inputs)
    pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
    found = torch.autograd.grad([o for o, _ in pairs], [inputs[i] for i in wanted],
                                [g for _, g in pairs], create_graph=True, allow_unused=True)
    result = [None] * len(inputs)
    for i, g in zip(wanted, found):
        result[i] = g
    return (None,) * ctx.leading + tuple(result)


def carried(grad: Tensor | None, like: Tensor) -> Tensor:
    """An incoming gradient as a native backward takes it: a fresh contiguous copy (the library
    updates it in place), zeros of ``like``'s shape where autograd gave None."""
    if grad is None:
        return torch.zeros_like(like)
    return grad.clone(memory_format=torch.contiguous_format)


@functools.lru_cache
def lstm_gate_order(hidden: int) -> Tensor:
    """The rows of nn.LSTMCell's gates (i, f, g, o), ``4 * hidden`` of them, in the native
    kernels' order (i, f, o, g: the three sigmoids one run, csrc/common.h's `lstm_gates`); one
    tensor per size, shared (not to be written)."""
    c = hidden
    return torch.cat([torch.arange(2 * c), torch.arange(3 * c, 4 * c), torch.arange(2 * c, 3 * c)])


def lstm_ifog(gates: Tensor, cell: Tensor) -> tuple[Tensor, Tensor]:
    """An LSTM step in plain ops from its gates ``[B, 4C]`` in the kernels' order (i, f, o, g:
    `lstm_gate_order`), every input and bias summed in: ``(h, cell)``. What the engines' second
    derivatives differentiate (`first_order_only`)."""
    c = cell.shape[-1]
    i, f, o = torch.sigmoid(gates[:, : 3 * c]).chunk(3, 1)
    cell = f * cell + i * torch.tanh(gates[:, 3 * c :])
    return o * torch.tanh(cell), cell
