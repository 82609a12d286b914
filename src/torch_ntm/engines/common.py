"""What the engines share: saying things once, when only the eager loop can serve a call, a
second derivative through a hand-written backward (by the model's own steps: `OwnSteps`), and
an incoming gradient as a native backward takes it (`carried`).

The chooser (`torch_ntm.engines`) and every engine (``ntm``, ``mann``, ``dnc``, ``graphs``)
import it; it imports none of them.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable

import torch
from torch import Tensor

__all__ = ["DEVICES", "ModelFunction", "OwnSteps", "carried", "eager_only", "first_order_only",
           "own_sequence", "say_eager", "say_once"]

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
    engine's C++ call, a graph's replay): it runs without a graph, and gives None for the
    Function's inputs from ``ctx.leading`` on that it returns no gradient for. Where autograd
    asks for a graph (``create_graph=True``: a second derivative may follow), the gradients are
    computed instead by autograd through ``ctx.recompute(*ctx.inputs)``, the same function as
    the forward by the model's own eager step, which the forward leaves on ``ctx`` with its
    inputs, the Function's last ones (said once, naming ``ctx.engine``: "native" unless the
    forward says otherwise)."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if torch.is_grad_enabled():
            engine = getattr(ctx, "engine", "native")
            say_once(f"a second derivative through the {engine} engine: its backward is "
                     f"computed again through the eager step (create_graph=True)")
            return _recomputed(ctx, grads)
        result = backward(ctx, *grads)
        return result + (None,) * (ctx.leading + len(ctx.inputs) - len(result))

    return wrapper


def _recomputed(ctx, grads: tuple) -> tuple:
    """The backward of ``ctx``'s Function by autograd through ``ctx.recompute``, recorded: the
    gradient of each of ``ctx.inputs`` (None where it needs none), after a None for each of the
    Function's ``ctx.leading`` inputs before them (what they are made from reaches its gradient
    through ``ctx.inputs``). The recompute runs on an alias of each input: one input may be made
    from another (a state from the parameters of its initial value), and each must get the
    gradient of its own uses only, or autograd would count the other's path twice."""
    inputs = [t.view_as(t) if t.requires_grad else t for t in ctx.inputs]
    wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
    outputs = ctx.recompute(*inputs)
    pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
    found = torch.autograd.grad([o for o, _ in pairs], [inputs[i] for i in wanted],
                                [g for _, g in pairs], create_graph=True, allow_unused=True)
    result = [None] * len(inputs)
    for i, g in zip(wanted, found):
        result[i] = g
    return (None,) * ctx.leading + tuple(result)


class ModelFunction(torch.nn.Module):
    """A function of a model (``run(*args)``) as a module holding it, so that
    `torch.func.functional_call` can run it with other tensors for the model's parameters."""

    def __init__(self, model: torch.nn.Module, run: Callable) -> None:
        super().__init__()
        self.model, self.run = model, run

    def forward(self, *args):
        return self.run(*args)


def own_sequence(model: torch.nn.Module, x: Tensor, state) -> tuple:
    """``model``'s own steps (its ``_advance``, the specification) over ``x [T, B, I]`` from
    ``state``: ``(hs [T, B, C], reads [T, B, R, M], final state)``, the controller's outputs and
    the reads of every step (what the output layer reads) and the state after the last."""
    state = model._loop_state(state)
    hs, reads = [], []
    for x_t in x:
        h, state = model._advance(x_t, state)
        hs.append(h)
        reads.append(state.reads)
    return torch.stack(hs), torch.stack(reads), model._public_state(state)


class OwnSteps:
    """What a native engine's second derivative differentiates (`first_order_only`): its
    Function's outputs as a function of the model's own inputs, ``(x, *state's tensors,
    *parameters)`` (`inputs`, which the Function takes last), by the model's own steps
    (`own_sequence`) on those parameters (`torch.func.functional_call`) and ``outputs(hs,
    reads, final state)``, the Function's outputs in its layout. Made on every differentiable
    native call, so it reads the state and the parameters directly (~2 and ~30 us here, where
    `named_parameters` and a pytree flatten take ~100 and ~70)."""

    def __init__(self, model: torch.nn.Module, x: Tensor, state, outputs: Callable) -> None:
        named = _trainable(model, "model.", [], set())
        self.names = [name for name, _ in named]
        # a state is its controller's tensors, then its other fields
        self.kind, self.layers = type(state), len(state.controller)
        self.inputs = (x, *state.controller, *state[1:], *(p for _, p in named))
        self.model, self.outputs, self.leaves = model, outputs, self.layers + len(state) - 1

    def __call__(self, x: Tensor, *rest: Tensor) -> list:
        leaves, weights = rest[: self.leaves], rest[self.leaves:]
        state = self.kind(tuple(leaves[: self.layers]), *leaves[self.layers:])
        run = ModelFunction(self.model, lambda x, state: self.outputs(
            *own_sequence(self.model, x, state)))
        return torch.func.functional_call(run, dict(zip(self.names, weights)), (x, state))


def _trainable(module: torch.nn.Module, prefix: str, found: list, seen: set) -> list:
    """``module``'s parameters that require a gradient, as `named_parameters` lists them
    (each once), by name after ``prefix``: appended to ``found``."""
    for name, p in module._parameters.items():
        if p is not None and p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            found.append((prefix + name, p))
    for name, child in module._modules.items():
        if child is not None:
            _trainable(child, f"{prefix}{name}.", found, seen)
    return found


def carried(grad: Tensor | None, like: Tensor) -> Tensor:
    """An incoming gradient as a native backward takes it: a fresh contiguous copy (the library
    updates it in place), zeros of ``like``'s shape where autograd gave None."""
    if grad is None:
        return torch.zeros_like(like)
    return grad.clone(memory_format=torch.contiguous_format)

