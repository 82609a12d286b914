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

import importlib

import torch
from torch import Tensor

from torch_ntm.engines.calls import NATIVE
from torch_ntm.engines.common import (  # what the engines share, here for their users too
    DEVICES,
    carried,
    eager_only,
    first_order_only,
    say_eager,
    say_once,
)

__all__ = ["DEVICES", "ENGINES", "LEGACY_ENGINES", "carried", "check_engine", "choose",
           "eager_only", "first_order_only", "native",
           "native_call", "prepare", "say_eager", "say_once"]

ENGINES = ("auto", "native", "graphs", "eager")
# Names of engines this library no longer has, as configs and checkpoints of earlier versions
# hold them: each now means "auto".
LEGACY_ENGINES = ("fast", "compiled")

def native(name: str):
    """The native engine of model ``name`` (``"ntm"``, ``"mann"``, ``"dnc"``: a row of
    `torch_ntm.engines.calls.NATIVE`), the module whose ``forward(model, x, state)`` runs a
    time-major sequence; imported the first time a model runs natively, not with the package."""
    return importlib.import_module(NATIVE[name][0])


def native_call(name: str | None):
    """The `torch_ntm.engines.calls.Description` of model ``name``'s native kernels (None for
    None: a model without them)."""
    return None if name is None else NATIVE[name][1]


def _why_not_native(model: torch.nn.Module, x: Tensor, kernels) -> str | None:
    """Why the native engine cannot run ``model``'s call with input ``x`` on ``kernels`` (the
    model's `torch_ntm.engines.calls.Description`, which may say why it cannot run a model:
    ``why_not``), or None if it can."""
    from torch_ntm.engines import library

    why_not_model = getattr(kernels, "why_not", None)
    why = why_not_model(model) if why_not_model is not None else None
    if why is not None:
        return why
    unbiased = [name for name, layer in model.named_modules()
                if isinstance(layer, (torch.nn.Linear, torch.nn.LSTMCell))
                and (getattr(layer, "bias", 0) is None or getattr(layer, "bias_ih", 0) is None)]
    if unbiased:  # the kernels read every layer's bias
        return f"the native engine reads every layer's bias, and {unbiased[0]} has none"
    if eager_only():
        return "a torch.func transform or forward-mode AD is active"
    if torch.is_autocast_enabled(x.device.type):
        return "torch.autocast is enabled (the native engine computes in one dtype)"
    if x.device.type != DEVICES["native"]:
        return f"the native engine runs on the {DEVICES['native'].upper()}, not {x.device.type}"
    if x.dtype not in library.DTYPES:
        return f"the native engine computes in float32 or float64, not {x.dtype}"
    if not library.available(kernels.name, x.dtype):
        why = library.error(kernels.name, x.dtype)
        return f"the native library could not be built ({why})"
    return None


def choose(model: torch.nn.Module, x: Tensor, kernels) -> str:
    """The engine that runs ``model``'s call on input ``x``: ``"native"``, ``"graphs"`` or
    ``"eager"``.

    ``kernels``: the `torch_ntm.engines.calls.Description` of the native kernels that would
    serve the model (``NTMCall``, ``MANNCall``, ``DNCCall``; its ``why_not(model)``, where it has
    one, says why it cannot run a model), or None for a model that has none.
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


def prepare(model: str, dtype: torch.dtype = torch.float32) -> None:
    """Start building the native kernels of ``model`` (``"ntm"``, ``"mann"`` or ``"dnc"``, as
    `torch_ntm.config.TrainConfig` names it; another: nothing) in the background
    (`library.prepare`): ``ntm`` commands call this as soon as they know the model."""
    if model in NATIVE:
        from torch_ntm.engines import library

        library.prepare(native_call(model).name, dtype)


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
