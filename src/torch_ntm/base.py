"""What the memory models share as modules: `MemoryModule` and `Cell`.

`torch_ntm.NTM`, `torch_ntm.MANN` and `torch_ntm.DNC` (and their cells) are each a model spec on
top of `MemoryModule`: an options dataclass (``Options``: its fields are the keyword arguments,
checked by its ``checked()``), a state (``State``, in `torch_ntm.states`), a head layout
(`torch_ntm.layout`) and one time step (``_step``). The base does the rest, once for all three:

- the constructor (sizes checked, options checked and shown in the class's signature, unknown
  keywords refused by name), each option a read-only attribute (``ntm.memory_size``);
- the parameters every model has, built and reset in one order: the controller reading
  ``[x_t, r_{t-1}]`` (`torch_ntm.controllers`), the head layer (``head_params``, one linear layer
  whose output the layout splits) and the read-out (``output`` of ``[h_t, r_t]``), then what the
  model adds (``_build_own``, ``_reset_own``);
- ``initial_state``'s frame (batch size checked, device and dtype, the controller's state), the
  checks of an input's dtype and of a state passed in (driven by the model's shape table,
  ``_state_shapes``), ``extra_repr`` and ``config``.

`Cell` makes one of them a one-step module; `torch_ntm.sequence.SequenceModel` a module over
sequences.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from torch_ntm.checks import (
    cell_step,
    check_input_dtype,
    check_state_tensors,
    describe_shapes,
    positive_int,
    read_only_options,
)
from torch_ntm.controllers import CONTROLLERS, LSTMController

__all__ = ["Cell", "MAX_STATE_ELEMENTS", "MemoryModule"]

# One sequence's state with more elements than this (8 GiB of float32) is a typo, not a model:
# refused when the model is built, before a forward asks for it.
MAX_STATE_ELEMENTS = 1 << 31


class MemoryModule(nn.Module):
    """Parameters, initial state, checks and the frame of one step, shared by every memory
    model; a subclass is its spec (the class attributes and methods below marked "the model's").

    Args:
        input_size: width of each input step.
        output_size: width of each output step (logits).
        device: of the parameters.
        dtype: of the parameters.
        **options: the fields of the model's ``Options`` (its signature lists them).
    """

    Options: ClassVar[type]  # the model's: a dataclass of its options, with ``checked()``
    State: ClassVar[type]  # the model's: its `torch_ntm.states` NamedTuple
    # option -> attribute name where they differ (``ntm.controller`` is the controller module)
    _renamed_options: ClassVar[dict[str, str]] = {"controller": "controller_type"}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        options = cls.__dict__.get("Options")
        if options is not None:  # a model's spec: its options as attributes
            read_only_options(options, cls._renamed_options)(cls)
        if getattr(cls, "Options", None) is not None:  # its constructor's signature shows them
            cls.__signature__ = _signature(cls)

    def __init__(self, input_size: int, output_size: int, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 **options: object) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.input_size = positive_int("input_size", input_size)
        self.output_size = positive_int("output_size", output_size)
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(self.Options)})
        if unknown:  # valid: every keyword of the class's own signature (engine, batch_first)
            valid = list(inspect.signature(type(self)).parameters)[2:]
            raise TypeError(f"{type(self).__name__} got unexpected keyword argument(s) "
                            f"{', '.join(unknown)}; valid: {', '.join(valid)}")
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point
                                      and not dtype.is_complex):
            raise ValueError(f"{type(self).__name__} computes in a real floating dtype (float32, "
                             f"float64, bfloat16), got dtype={dtype!r}")
        self.options = self.Options(**options).checked()
        opt = self.options
        sizes = self._state_shapes(1)
        elements = sum(math.prod(shape) for shape in sizes.values())
        if elements > MAX_STATE_ELEMENTS:
            largest = max(sizes, key=lambda name: math.prod(sizes[name]))
            fix = ("memory_size or write_heads (the link matrices grow with the square of the "
                   "rows)" if largest == "link" else "memory_size or memory_width")
            raise ValueError(f"{type(self).__name__} with memory_size={opt.memory_size} holds "
                             f"{elements:,} numbers in one sequence's state ({largest} "
                             f"{list(sizes[largest])} the largest), more than "
                             f"{MAX_STATE_ELEMENTS:,}: lower {fix}")
        features = self._build_encoder(factory)  # what the controller reads of a step
        self.head_layout = self._layout()
        reads = opt.read_heads * opt.memory_width
        self.controller = CONTROLLERS[getattr(opt, "controller", "lstm")](
            features + reads, opt.controller_size, getattr(opt, "controller_layers", 1),
            **factory)
        # every head's parameters at once, laid out as `torch_ntm.layout` describes
        self.head_params = nn.Linear(opt.controller_size, self.head_layout.size, **factory)
        self.output = nn.Linear(opt.controller_size + reads, output_size, **factory)
        self._build_own(factory)
        self.reset_parameters()

    # --- the model's spec ------------------------------------------------------------------------

    def _build_encoder(self, factory: dict) -> int:
        """The model's modules that come before the controller (built first); returns the width
        of what the controller reads of an input step (default: the step itself)."""
        return self.input_size

    def _layout(self):
        """The model's head layout (`torch_ntm.layout`), with ``size``: the head layer's
        width."""
        raise NotImplementedError

    def _build_own(self, factory: dict) -> None:
        """The model's own parameters beyond the controller, head layer and read-out."""

    def _reset_own(self) -> None:
        """Re-initialises the model's own parameters (`_build_own`'s, `_build_encoder`'s)."""

    def _initial_state(self, batch_size: int, controller: tuple, device, dtype):
        """The model's initial state for a batch, given its controller's."""
        raise NotImplementedError

    def _state_shapes(self, batch_size: int) -> dict[str, tuple[int, ...]]:
        """The shape of each tensor of the model's state but the controller's, by field."""
        raise NotImplementedError

    def _advance(self, x: Tensor, state, record: bool = False):
        """One time step up to the output layer, the model's specification: ``x [B,
        input_size]`` -> ``(h [B, controller_size], state)``, the controller's output and the
        state after the step (and what it records, with ``record``). The native engines'
        second derivatives run it (`torch_ntm.engines.common.own_sequence`)."""
        raise NotImplementedError

    # --- what the base does ---------------------------------------------------------------------

    def _step(self, x: Tensor, state, record: bool = False):
        """One time step: ``x [B, input_size]`` -> ``(logits [B, output_size], state)`` (and
        what it records, with ``record``), the output layer reading the controller's output and
        the step's reads (`_advance`)."""
        h, new, *recorded = self._advance(x, state, record)
        logits = self.output(torch.cat([h, new.reads.reshape(h.shape[0], -1)], -1))
        return (logits, new, *recorded)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter (called last in ``__init__``)."""
        self.controller.reset_parameters()
        self.head_params.reset_parameters()
        self.output.reset_parameters()
        self._reset_own()

    def extra_repr(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in dataclasses.asdict(self.options).items())
        return f"{self.input_size}, {self.output_size}, {options}"

    def config(self) -> dict:
        """The constructor arguments (sizes and options) that rebuild this module's shape."""
        return {"input_size": self.input_size, "output_size": self.output_size,
                **dataclasses.asdict(self.options)}

    def initial_state(self, batch_size: int, device: torch.device | str | None = None,
                      dtype: torch.dtype | None = None) -> tuple:
        """The state a sequence starts from, for a batch (what each part starts at: the
        model's state's documentation).

        Args:
            batch_size: B.
            device: defaults to the module parameters' device.
            dtype: defaults to the module parameters' dtype.

        Returns:
            The model's ``State`` (`torch_ntm.states`).
        """
        positive_int("batch_size", batch_size)
        ref = self.output.weight
        device = ref.device if device is None else device
        dtype = ref.dtype if dtype is None else dtype
        controller = tuple(t.to(device, dtype) for t in self.controller.initial_state(batch_size))
        return self._initial_state(batch_size, controller, device, dtype)

    def _loop_state(self, state):
        """The state as the eager loop carries it from step to step (`_step` takes either form;
        the same here, but the sparse link of `torch_ntm.DNC`)."""
        return state

    def _public_state(self, state):
        """The state a `forward` returns from the loop's form (`_loop_state`)."""
        return state

    def _check_dtype(self, x: Tensor) -> None:
        """Inputs must have the parameters' dtype (no engine converts them), which must not be
        float16."""
        dtype = self.output.weight.dtype
        if dtype == torch.float16:  # measured: non-finite gradients (NTM) or outputs (MANN, DNC)
            raise ValueError(
                f"{type(self).__name__} does not run in float16 (its gradients overflow); use "
                f"bfloat16 parameters, or float32 ones under torch.autocast(dtype=torch.float16)"
            )
        check_input_dtype(self, x, dtype)

    def _check_state(self, state, batch_size: int, ref: Tensor) -> None:
        """A clear error unless ``state`` is this model's for ``batch_size`` sequences, in
        ``ref``'s dtype and on its device."""
        kind = self.State.__name__
        if not isinstance(state, self.State):
            raise TypeError(f"state must be {'an' if kind[0] in 'AEIMNO' else 'a'} {kind}, got "
                            f"{type(state).__name__}")
        b, opt = batch_size, self.options
        heads = f"{opt.read_heads} read and {getattr(opt, 'write_heads', opt.read_heads)} write"
        for name, shape in self._state_shapes(b).items():
            part = getattr(state, name)
            if not (isinstance(part, Tensor) and tuple(part.shape) == shape):
                found = (f"has shape {list(part.shape)}" if isinstance(part, Tensor)
                         else f"is {describe_shapes(part)}")
                raise ValueError(
                    f"state.{name} {found}, expected {list(shape)} (batch {b}, memory "
                    f"{opt.memory_size}x{opt.memory_width}, {heads} heads); was the state made "
                    f"for another batch size or model?")
        got = state.controller
        want = [list(t.shape) for t in self.controller.initial_state(b)]
        if not (isinstance(got, tuple) and len(got) == len(want) and all(
                isinstance(t, Tensor) and list(t.shape) == s for t, s in zip(got, want))):
            if isinstance(self.controller, LSTMController):
                expected = f"(h, c), each of shape {want[0]}, for this LSTM controller"
            else:
                expected = f"{len(want)} tensors of shapes {want}" if want else \
                    "() for a feed-forward controller"
            raise ValueError(f"state.controller must be {expected}; got {describe_shapes(got)}: "
                             f"was the state made for another controller or batch size?")
        check_state_tensors(state, ref)


def _signature(cls) -> inspect.Signature:
    """``cls``'s constructor's signature with ``**options`` replaced by the fields of
    ``cls.Options`` as keyword arguments with their defaults, for ``help`` and ``inspect``."""
    signature = inspect.signature(cls.__init__)
    _, *params = signature.parameters.values()  # without self
    kept = [p for p in params if p.kind != inspect.Parameter.VAR_KEYWORD]
    options = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                 annotation=f.type) for f in dataclasses.fields(cls.Options)]
    return signature.replace(parameters=kept[:2] + options + kept[2:])


class Cell:
    """Makes a `MemoryModule` a module of one step (``NTMCell``, ``MANNCell``, ``DNCCell``): the
    same constructor (but ``batch_first`` and ``engine``) and parameter names as the model over
    sequences, so ``cell.load_state_dict(model.state_dict())`` steps a trained model one input at
    a time.

    Example:

        cell = NTMCell(9, 8)                # or MANNCell, DNCCell
        state = None
        for x_t in xs:                      # x_t: (B, 9)
            logits, state = cell(x_t, state)
    """

    def forward(self, x: Tensor, state: tuple | None = None) -> tuple[Tensor, tuple]:
        """Args:
            x: ``[B, input_size]`` input of one step.
            state: the model's state after the previous step, or None for `initial_state`.

        Returns:
            ``(logits [B, output_size], state)``.
        """
        return cell_step(self, x, state)
