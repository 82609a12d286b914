"""How the models compute a sequence: the engines, behind one interface.

Every model (`torch_ntm.NTM`, `torch_ntm.MANN`, `torch_ntm.DNC`) has the same engines, chosen by
its ``engine`` argument:

- ``"eager"``: the model's own loop over its step (``model._step``), with autograd recording every
  op: the specification the other engines are tested against, and the engine for everything the
  others cannot do: `torch.func` transforms, forward-mode AD, `torch.autocast`, dtypes other than
  float32 and float64, devices without a native engine.
- ``"native"``: the whole sequence, forward and backward, as one C++ call each (`ntm`, `mann`,
  `dnc` here; kernels in ``csrc/``, built on first use by `library`), on the CPU, in float32 and
  float64.
- ``"graphs"``: on a CUDA GPU, the eager step unrolled over the sequence and captured as CUDA
  graphs, forward and backward, one pair per bucket of sequence lengths (`graphs`), replayed.
- ``"auto"`` (the default): the fastest engine that can serve the call: native on the CPU,
  graphs on a CUDA GPU, else eager.

A model hands an engine its input, time-major and checked, and its state; the engine reads what
it needs of the model through public attributes (``model.options``, ``model.head_layout``, the
parameters of ``model.controller``, ``model.head_params`` and ``model.output``) and returns the
logits and the final state. Where ``"native"`` or ``"auto"`` cannot serve a call, the eager loop
runs it and the reason is logged once (logger ``torch_ntm.engines``).
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from torch_ntm.engines import library

__all__ = ["ENGINES", "LEGACY_ENGINES", "carried", "check_engine", "choose", "eager_only",
           "first_order_only", "lstm_gate_order", "lstm_input_side", "prepare", "say_eager",
           "say_once"]

ENGINES = ("auto", "native", "graphs", "eager")
# Names of engines this library no longer has, as configs and checkpoints of earlier versions
# hold them: each now means "auto".
LEGACY_ENGINES = ("fast", "compiled")

_log = logging.getLogger(__name__)
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


def _why_not_native(model: torch.nn.Module, x: Tensor, kernels) -> str | None:
    """Why the native engine cannot run ``model``'s call with input ``x`` on ``kernels`` (the
    model's `library.Description`, which may say why it cannot run a model: ``why_not``), or None
    if it can."""
    why_not_model = getattr(kernels, "why_not", None)
    why = why_not_model(model) if why_not_model is not None else None
    if why is not None:
        return why
    if eager_only():
        return "a torch.func transform or forward-mode AD is active"
    if torch.is_autocast_enabled(x.device.type):
        return "torch.autocast is enabled (the native engine computes in one dtype)"
    if x.device.type != "cpu":
        return f"the native engine runs on the CPU, not {x.device.type}"
    if x.dtype not in library.DTYPES:
        return f"the native engine computes in float32 or float64, not {x.dtype}"
    if not library.available(kernels.name, x.dtype):
        why = library.error(kernels.name, x.dtype)
        return f"the native library could not be built ({why})"
    return None


def choose(model: torch.nn.Module, x: Tensor, kernels) -> str:
    """The engine that runs ``model``'s call on input ``x``: ``"native"``, ``"graphs"`` or
    ``"eager"``.

    ``kernels``: the `library.Description` of the native kernels that would serve the model
    (``NTMCall``, ``MANNCall``, ``DNCCall``; its ``why_not(model)``, where it has one, says why
    it cannot run a model), or None for a model that has none.
    ``model.engine`` ``"eager"`` is eager; ``"native"`` and ``"graphs"`` are that engine where
    it can serve the call; ``"auto"`` is graphs for a CUDA input, else native, where it can (for
    a model without native kernels, eager on the CPU without a word: there is nothing faster). A
    call the engine cannot serve runs eager, with the reason logged once per reason and model
    class."""
    from torch_ntm.engines import graphs

    if model.engine == "eager":
        return "eager"
    wanted = model.engine
    if wanted == "auto":
        wanted = "graphs" if x.device.type == "cuda" else "native"
    if wanted == "native" and kernels is None:
        if model.engine == "native":
            say_once(f"{type(model).__name__} has no native engine yet: engine 'native' runs on "
                     f"the eager engine")
        return "eager"
    why = graphs.why_not(model, x) if wanted == "graphs" else _why_not_native(model, x, kernels)
    if why is None:
        return wanted
    say_eager(model, why)
    return "eager"


def say_eager(model: torch.nn.Module, why: str) -> None:
    """Says once (`say_once`) that ``model``'s call runs on the eager engine, and ``why``."""
    say_once(f"{type(model).__name__} engine {model.engine!r} runs this call on the eager "
             f"engine: {why}")


def prepare(model: str, dtype: torch.dtype = torch.float32) -> None:
    """Start building the native kernels of ``model`` (``"ntm"``, ``"mann"`` or ``"dnc"``, as
    `torch_ntm.config.TrainConfig` names it; another: nothing) in the background
    (`library.prepare`): ``ntm`` commands call this as soon as they know the model."""
    from torch_ntm.engines import dnc, mann, ntm

    kernels = {"ntm": ntm.NTMCall, "mann": mann.MANNCall, "dnc": dnc.DNCCall}.get(model)
    if kernels is not None:
        library.prepare(kernels.name, dtype)


def check_engine(value: str) -> str:
    """``value`` as a model's ``engine``: one of `ENGINES` (a `LEGACY_ENGINES` name is "auto").

    Raises:
        ValueError: naming the valid choices.
    """
    if value in LEGACY_ENGINES:
        say_once(f"engine {value!r} no longer exists; it runs as 'auto' (the fastest engine "
                  f"for the call)")
        return "auto"
    if value not in ENGINES:
        raise ValueError(f"unknown engine {value!r}; valid choices: {', '.join(ENGINES)}")
    return value


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


def lstm_input_side(model: torch.nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """For a model whose one-layer LSTM controller reads ``[x_t, reads_{t-1}]`` (the MANN's and
    the DNC's): the input side of every step in one matmul, ``xpre [T, B, 4C]`` (biases
    included), and the weights of the rest, ``[4C, R W + C]`` over ``[reads, h]``, both with the
    gates in the kernels' order (`lstm_gate_order`), under autograd. ``x`` is what the
    controller reads of the steps (a MANN's `encode` of its input)."""
    cell = model.controller.cells[0]
    order = lstm_gate_order(model.controller_size)
    n = x.shape[-1]
    weight_ih = cell.weight_ih[order]
    xpre = F.linear(x, weight_ih[:, :n], (cell.bias_ih + cell.bias_hh)[order])
    return xpre.contiguous(), torch.cat([weight_ih[:, n:], cell.weight_hh[order]], 1)
