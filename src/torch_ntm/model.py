"""The Neural Turing Machine as PyTorch modules: `NTMCell` (one step) and `NTM` (a sequence).

One time step (section 3 of the paper; r are read vectors, w weightings, M memory):

    h_t, ctrl_t  = controller([x_t, r_{t-1}], ctrl_{t-1})
    heads        = one linear layer of h_t, split into named, activated head parameters
    w^w_t        = address(M_{t-1}, w^w_{t-1}, write-head parameters)
    M_t          = write(M_{t-1}, w^w_t, erase, add)
    w^r_t        = address(M_t, w^r_{t-1}, read-head parameters)
    r_t          = read(M_t, w^r_t)
    y_t          = linear([h_t, r_t])                      (logits)

Reads see the memory after this step's write, as in eq. (2)-(4), where r_t and the write both
refer to M_t. All state is explicit (`NTMState`); modules hold parameters only. No parameter's shape
depends on the number of memory rows N, so a trained model can be rebuilt with a larger memory.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from torch_ntm import engines
from torch_ntm.checks import (
    bound,
    cell_step,
    check_input_dtype,
    check_state_tensors,
    choice,
    describe_shapes,
    one_dtype,
    positive_int,
    read_only_options,
)
from torch_ntm.controllers import CONTROLLERS, LSTMController
from torch_ntm.engines import ntm as native
from torch_ntm.layout import HeadLayout, HeadParameters, NTMState
from torch_ntm.sequence import SequenceModel

__all__ = ["NTM", "NTMCell", "NTMOptions", "NTMState", "NTMTrace", "CONTROLLERS", "MEMORY_INITS",
           "ENGINES"]

# Constant memory initialisation: small but non-zero, as recommended in the NTM literature
# (Collier & Beel 2018, "Implementing Neural Turing Machines").
MEMORY_INIT_CONSTANT = 1e-6
MEMORY_INITS = ("constant", "learned", "random")
# How `NTM.forward` computes the sequence (the same function, to float rounding, on every engine):
# `torch_ntm.engines` says what each is and which serves which call.
ENGINES = engines.ENGINES


class NTMTrace(NamedTuple):
    """What `NTM.trace` records at each step, stacked over time (T first)."""

    read_weights: Tensor  # (T, B, Hr, N)
    write_weights: Tensor  # (T, B, Hw, N)
    erase: Tensor  # (T, B, Hw, M)
    add: Tensor  # (T, B, Hw, M)
    memory: Tensor  # (T, B, N, M), after the step's write
    read_beta: Tensor  # (T, B, Hr) key strengths of the read heads
    read_gamma: Tensor  # (T, B, Hr) sharpening exponents of the read heads
    write_beta: Tensor  # (T, B, Hw)
    write_gamma: Tensor  # (T, B, Hw)


@dataclass
class NTMOptions:
    """The architecture of an NTM: the keyword arguments of `NTM` and `NTMCell` but
    ``batch_first``, ``engine``, ``device`` and ``dtype``, with their types and defaults (what
    each means is documented in `NTM`).

    The one list of them: the modules' signatures, checks, ``repr`` and ``config()`` read it,
    `torch_ntm.config.TrainConfig` inherits its fields as config keys, and
    `torch_ntm.factories.model_config` records it in checkpoints.
    """

    controller: str = "lstm"
    controller_size: int = 100
    controller_layers: int = 1
    memory_size: int = 128
    memory_width: int = 20
    read_heads: int = 1
    write_heads: int = 1
    shift_range: int = 1
    memory_init: str = "constant"
    max_beta: float | None = None
    max_gamma: float | None = None

    def checked(self) -> NTMOptions:
        """These options, with the caps as floats.

        Raises:
            ValueError: naming the first invalid option and what it must be.
        """
        choice("controller", self.controller, CONTROLLERS)
        for name in ("controller_size", "controller_layers", "memory_size", "memory_width",
                     "read_heads"):
            positive_int(name, getattr(self, name))
        for name in ("write_heads", "shift_range"):
            positive_int(name, getattr(self, name), minimum=0)
        choice("memory_init", self.memory_init, MEMORY_INITS)
        caps = {"max_beta": bound("max_beta", self.max_beta, 0.0),
                "max_gamma": bound("max_gamma", self.max_gamma, 1.0)}
        if 2 * self.shift_range + 1 > self.memory_size:
            raise ValueError(
                f"shift_range={self.shift_range} needs 2*shift_range+1 <= memory_size, "
                f"got memory_size={self.memory_size}"
            )
        return dataclasses.replace(self, **caps)

    @property
    def caps(self) -> tuple[float, float]:
        """Soft caps of beta and of gamma - 1 for `HeadLayout.activate` (0: unbounded)."""
        return (self.max_beta or 0.0, (self.max_gamma or 1.0) - 1.0)


def _options_in_signature(init):
    """Show the `NTMOptions` as keyword arguments in the signature of ``init``, an
    ``__init__(self, input_size, output_size, *, ..., **options)``, for ``help`` and ``inspect``."""
    signature = inspect.signature(init)
    *params, _ = signature.parameters.values()  # without **options
    options = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                 annotation=f.type) for f in dataclasses.fields(NTMOptions)]
    init.__signature__ = signature.replace(parameters=params[:3] + options + params[3:])
    return init


# The controller's name is controller_type: ntm.controller is the controller module.
@read_only_options(NTMOptions, renamed={"controller": "controller_type"})
class _NTMBase(nn.Module):
    """Parameters, initial state and the one-step update shared by `NTMCell` and `NTM`.

    Both subclasses build exactly these submodules, so their `state_dict`s are interchangeable.
    """

    @_options_in_signature
    def __init__(self, input_size: int, output_size: int, *, device=None, dtype=None,
                 **options) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.input_size = positive_int("input_size", input_size)
        self.output_size = positive_int("output_size", output_size)
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(NTMOptions)})
        if unknown:  # valid: every keyword of the class's own signature (NTM's engine too)
            valid = list(inspect.signature(type(self)).parameters)[2:]
            raise TypeError(f"{type(self).__name__} got unexpected keyword argument(s) "
                            f"{', '.join(unknown)}; valid: {', '.join(valid)}")
        self.options = NTMOptions(**options).checked()  # each an attribute: `read_only_options`

        opt = self.options
        m, shifts = opt.memory_width, 2 * opt.shift_range + 1
        self.head_layout = HeadLayout(opt.read_heads, opt.write_heads, m, shifts)

        self.controller = CONTROLLERS[opt.controller](
            input_size + opt.read_heads * m, opt.controller_size, opt.controller_layers, **factory
        )
        # all heads at once, laid out as `torch_ntm.layout` describes
        self.head_params = nn.Linear(opt.controller_size, self.head_layout.size, **factory)
        self.output = nn.Linear(opt.controller_size + opt.read_heads * m, output_size, **factory)
        # Learned initial read vectors, and the learned logit of row 0 in the initial weightings
        # (all other rows have logit 0): N-independent, focused on row 0 after initialisation.
        self.reads0 = nn.Parameter(torch.empty(opt.read_heads, m, **factory))
        self.read_focus0 = nn.Parameter(torch.empty(opt.read_heads, 1, **factory))
        self.write_focus0 = nn.Parameter(torch.empty(opt.write_heads, 1, **factory))
        if opt.memory_init == "learned":
            self.memory0 = nn.Parameter(torch.empty(m, **factory))  # one row, shared by all rows
        else:
            self.register_parameter("memory0", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise every parameter (called last in ``__init__``)."""
        self.controller.reset_parameters()
        self.head_params.reset_parameters()
        self.output.reset_parameters()
        nn.init.normal_(self.reads0, std=0.01)
        # softmax([10, 0, ..., 0]) puts > 99% of the weight on row 0 for N <= 128.
        nn.init.constant_(self.read_focus0, 10.0)
        nn.init.constant_(self.write_focus0, 10.0)
        if self.memory0 is not None:
            nn.init.constant_(self.memory0, MEMORY_INIT_CONSTANT)

    def extra_repr(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in dataclasses.asdict(self.options).items())
        return f"{self.input_size}, {self.output_size}, {options}"

    def config(self) -> dict:
        """The constructor arguments (sizes and options) that rebuild this module's shape."""
        return {"input_size": self.input_size, "output_size": self.output_size,
                **dataclasses.asdict(self.options)}

    def initial_state(self, batch_size: int, device=None, dtype=None) -> NTMState:
        """The learned initial state for a batch.

        Args:
            batch_size: B.
            device: defaults to the module parameters' device.
            dtype: defaults to the module parameters' dtype.

        Returns:
            `NTMState` with memory ``[B, N, M]``, weightings ``[B, H, N]``, reads ``[B, Hr, M]``.
        """
        positive_int("batch_size", batch_size)
        ref = self.reads0
        device = ref.device if device is None else device
        dtype = ref.dtype if dtype is None else dtype
        b, n, m = batch_size, self.memory_size, self.memory_width
        if self.memory_init == "constant":
            memory = torch.full((b, n, m), MEMORY_INIT_CONSTANT, device=device, dtype=dtype)
        elif self.memory_init == "learned":
            memory = self.memory0.to(device, dtype).expand(b, n, m)
        else:  # random: a fresh small memory per sequence
            bound = 1.0 / math.sqrt(n + m)
            memory = torch.empty(b, n, m, device=device, dtype=dtype).uniform_(-bound, bound)

        def focus(logit: Tensor) -> Tensor:  # (H, 1) -> (B, H, N)
            # The logit on row 0, zeros elsewhere. A product with a one-hot row rather than a
            # concatenation, whose backward would hand the logit a [H, 1] slice of an [H, N]
            # gradient (strides (N, 1)), which DistributedDataParallel warns about.
            first = torch.zeros(1, n, device=device, dtype=dtype)
            first[0, 0] = 1
            logits = logit.to(device, dtype) * first
            return torch.softmax(logits, dim=-1).expand(b, -1, -1)

        controller = tuple(t.to(device, dtype) for t in self.controller.initial_state(b))
        return NTMState(
            controller=controller,
            memory=memory,
            read_weights=focus(self.read_focus0),
            write_weights=focus(self.write_focus0),
            reads=self.reads0.to(device, dtype).expand(b, -1, -1),
        )

    def _check_dtype(self, x: Tensor) -> None:
        """Inputs must have the parameters' dtype (no engine converts them)."""
        if self.reads0.dtype == torch.float16:  # measured: non-finite gradients in a few steps
            raise ValueError(
                f"{type(self).__name__} does not run in float16 (its gradients overflow); use "
                f"bfloat16 parameters, or float32 ones under torch.autocast(dtype=torch.float16)"
            )
        check_input_dtype(self, x, self.reads0.dtype)

    def _check_state(self, state: NTMState, batch_size: int, ref: Tensor) -> None:
        if not isinstance(state, NTMState):
            raise TypeError(f"state must be an NTMState, got {type(state).__name__}")
        b, n, m = batch_size, self.memory_size, self.memory_width
        expected = {
            "memory": (b, n, m),
            "read_weights": (b, self.read_heads, n),
            "write_weights": (b, self.write_heads, n),
            "reads": (b, self.read_heads, m),
        }
        for name, shape in expected.items():
            actual = tuple(getattr(state, name).shape)
            if actual != shape:
                raise ValueError(
                    f"state.{name} has shape {list(actual)}, expected {list(shape)} "
                    f"(batch {b}, memory {n}x{m}); was the state made for another batch size "
                    f"or model?"
                )
        ctrl, got = self.controller, state.controller
        if isinstance(ctrl, LSTMController):  # (h, c), each (L, B, C)
            shape = [ctrl.num_layers, b, ctrl.hidden_size]
            if not (isinstance(got, tuple) and len(got) == 2 and all(
                    isinstance(t, Tensor) and list(t.shape) == shape for t in got)):
                raise ValueError(
                    f"state.controller must be (h, c), each of shape {shape}, for this LSTM "
                    f"controller; got {describe_shapes(got)}: was the state made for another "
                    f"controller?"
                )
        elif not (isinstance(got, tuple) and not got):
            raise ValueError(f"state.controller must be () for a feed-forward controller; got "
                             f"{describe_shapes(got)}: was the state made for another controller?")
        check_state_tensors(state, ref)

    def _step(self, x: Tensor, state: NTMState, record: bool = False):
        """One time step. x: ``[B, input_size]``. Returns ``(logits [B, output_size], state)``,
        plus the activated `HeadParameters` ``(write, read)`` when ``record`` (write is None
        without write heads)."""
        b = x.shape[0]
        ctrl_in = torch.cat([x, state.reads.reshape(b, -1)], dim=-1)
        h, ctrl = self.controller(ctrl_in, state.controller)
        raw = self.head_params(h)  # (B, P): every head's parameters at once
        memory, w_read, w_write, reads, (wp, rp) = self.head_layout.heads_step(
            raw, state.memory, state.read_weights, state.write_weights, *self.options.caps)
        logits = self.output(torch.cat([h, reads.reshape(b, -1)], dim=-1))
        new_state = NTMState(ctrl, memory, w_read, w_write, reads)
        if record:
            return logits, new_state, (wp, rp)
        return logits, new_state


class NTMCell(_NTMBase):
    """One step of a Neural Turing Machine.

    Same constructor arguments as `NTM` (except ``batch_first``) and the same parameter names, so
    ``cell.load_state_dict(ntm.state_dict())`` steps a model trained as a sequence.

    Example:

        cell = NTMCell(9, 8)
        state = None
        for x_t in xs:                      # x_t: (B, 9)
            logits, state = cell(x_t, state)
    """

    def forward(self, x: Tensor, state: NTMState | None = None) -> tuple[Tensor, NTMState]:
        """Args:
            x: ``[B, input_size]`` input of one step.
            state: `NTMState` of the previous step, or None for `initial_state`.

        Returns:
            ``(logits [B, output_size], state)``.
        """
        return cell_step(self, x, state)


class NTM(SequenceModel, _NTMBase):
    """A Neural Turing Machine over sequences, with an `nn.LSTM`-like interface.

    Args:
        input_size: width of each input step.
        output_size: width of each output step (logits).
        controller: ``"lstm"`` or ``"feedforward"``.
        controller_size: hidden units per controller layer.
        controller_layers: number of controller layers.
        memory_size: N, rows of memory.
        memory_width: M, width of a memory row.
        read_heads: number of read heads.
        write_heads: number of write heads.
        shift_range: R; the heads can shift by -R..+R rows per step (2R+1 <= N).
        memory_init: ``"constant"`` (1e-6 everywhere), ``"learned"`` (one learned row repeated N
            times) or ``"random"`` (small uniform noise, drawn anew for each sequence).
        max_beta: None (default) for the paper's unbounded key strength ``softplus``; a number
            bounds it smoothly, ``beta = max_beta tanh(softplus / max_beta)``.
        max_gamma: None (default) for the paper's unbounded sharpening ``1 + softplus``; a number
            bounds gamma - 1 likewise below max_gamma - 1. For ablations: bounding gamma did not
            prevent the collapses of the Stability page (gradient-norm clipping at 1 did).
        batch_first: inputs and outputs are ``[B, T, ...]`` instead of ``[T, B, ...]``.
        engine: how `forward` runs, the same function on each (`torch_ntm.engines`):
            ``"auto"`` (default) the fastest engine that can serve the call: ``"native"`` (the
            whole sequence, forward and backward, as one C++ call each, on the CPU in float32
            and float64; built once per machine in seconds) where it can, else ``"eager"`` (the
            loop over the step with plain autograd, which also serves `torch.func`,
            forward-mode AD, `torch.autocast`, other dtypes and devices), saying once why.
            `trace` is always eager. May be changed on a built module by assigning
            ``ntm.engine``.
        device: of the parameters.
        dtype: of the parameters.

    The arguments from ``controller`` to ``max_gamma`` are the fields of `NTMOptions`:
    ``ntm.options`` holds them, and each is a read-only attribute too (``ntm.memory_size``; the
    controller's name is ``ntm.controller_type``).

    Example:

        ntm = NTM(9, 8)
        logits, state = ntm(x)              # x: (T, B, 9) -> logits (T, B, 8)
    """

    _state_type = NTMState
    _native_engine = native
    _native_call = native.NTMCall

    @_options_in_signature
    def __init__(self, input_size: int, output_size: int, *, batch_first: bool = False,
                 engine: str = "auto", device=None, dtype=None, **options):
        super().__init__(input_size, output_size, device=device, dtype=dtype, **options)
        self._init_sequence(batch_first, engine)

    def trace(self, x: Tensor, state: NTMState | None = None) -> tuple[Tensor, NTMState, NTMTrace]:
        """Like `forward`, and also records every step's weightings, erase/add vectors and memory.

        Returns:
            ``(logits, state, NTMTrace)``; the trace's tensors are time-major ``[T, B, ...]``.
        """
        x, state = self._prepare(x, state)
        outputs, rows = [], []
        for x_t in x:
            y, state, (wp, rp) = self._step(x_t, state, record=True)
            outputs.append(y)
            if wp is None:  # no write heads: empty write fields
                empty = state.memory.new_zeros(x.shape[1], 0, self.memory_width)
                wp = HeadParameters(empty, empty[..., :1], None, None, empty[..., :1], empty, empty)
            rows.append((state.read_weights, state.write_weights, wp.erase, wp.add, state.memory,
                         rp.beta[..., 0], rp.gamma[..., 0], wp.beta[..., 0], wp.gamma[..., 0]))
        trace = NTMTrace(*(torch.stack(col) for col in zip(*rows)))
        y, state = one_dtype(self._finish(torch.stack(outputs)), state, x)
        return y, state, trace
