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
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from torch_ntm import engines
from torch_ntm.base import Cell, MemoryModule
from torch_ntm.checks import bound, choice, finite, positive_fields
from torch_ntm.controllers import CONTROLLERS
from torch_ntm.layout import HeadLayout, HeadParameters
from torch_ntm.sequence import SequenceModel
from torch_ntm.states import NTMState

__all__ = ["NTM", "NTMCell", "NTMOptions", "NTMState", "NTMTrace", "CONTROLLERS", "MEMORY_INITS",
           "WRITE_INITS", "ENGINES"]

# Constant memory initialisation: small but non-zero, as recommended in the NTM literature
# (Collier & Beel 2018, "Implementing Neural Turing Machines").
MEMORY_INIT_CONSTANT = 1e-6
MEMORY_INITS = ("constant", "learned", "random")
# How the write heads' addressing starts (`NTM`'s ``write_init``): as the head layer's weights
# are drawn, or stepping one row a step.
WRITE_INITS = ("default", "sequential")
# The head layer's biases of a write head under write_init="sequential": the gate keeps 95% of
# the previous weighting (sigmoid(-3)), the shift's +1 logit is 3 against 0 for the others (91%
# on +1 with shift_range 1, 83% with 2), and gamma = 1 + softplus(2) = 3.1 sharpens that back
# to one row (> 99.9% of the weight for the first N steps of a fresh model, whatever the
# controller's output; tests/test_model.py checks shift ranges 1 and 2).
_SEQUENTIAL_GATE, _SEQUENTIAL_SHIFT, _SEQUENTIAL_GAMMA = -3.0, 3.0, 2.0
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
    write_init: str = "default"
    read_beta_bias: float | None = None
    max_beta: float | None = None
    max_gamma: float | None = None

    def checked(self) -> NTMOptions:
        """These options, with the caps and ``read_beta_bias`` as floats.

        Raises:
            ValueError: naming the first invalid option and what it must be.
        """
        choice("controller", self.controller, CONTROLLERS)
        positive_fields(self, "controller_size", "controller_layers", "memory_size",
                        "memory_width", "read_heads")
        positive_fields(self, "write_heads", "shift_range", minimum=0)
        choice("memory_init", self.memory_init, MEMORY_INITS)
        choice("write_init", self.write_init, WRITE_INITS)
        if self.write_init == "sequential" and not (self.write_heads and self.shift_range):
            raise ValueError(
                f"write_init='sequential' steps the write heads by one row, which needs "
                f"write_heads >= 1 and shift_range >= 1, got write_heads={self.write_heads}, "
                f"shift_range={self.shift_range}: use write_init='default'")
        numbers = {"max_beta": bound("max_beta", self.max_beta, 0.0),
                   "max_gamma": bound("max_gamma", self.max_gamma, 1.0),
                   "read_beta_bias": finite("read_beta_bias", self.read_beta_bias)}
        if 2 * self.shift_range + 1 > self.memory_size:
            raise ValueError(
                f"shift_range={self.shift_range} needs 2*shift_range+1 <= memory_size, "
                f"got memory_size={self.memory_size}"
            )
        return dataclasses.replace(self, **numbers)

    @property
    def caps(self) -> tuple[float, float]:
        """Soft caps of beta and of gamma - 1 for `HeadLayout.activate` (0: unbounded)."""
        return (self.max_beta or 0.0, (self.max_gamma or 1.0) - 1.0)


class _NTMBase(MemoryModule):
    """The NTM's options, state, layout and step on `torch_ntm.base.MemoryModule`: `NTMCell` and
    `NTM` build exactly these parameters, so their `state_dict`s are interchangeable."""

    Options = NTMOptions
    State = NTMState

    def _layout(self) -> HeadLayout:
        opt = self.options
        return HeadLayout(opt.read_heads, opt.write_heads, opt.memory_width,
                          2 * opt.shift_range + 1)

    def _build_own(self, factory: dict) -> None:
        # Learned initial read vectors, and the learned logit of row 0 in the initial weightings
        # (all other rows have logit 0): N-independent, focused on row 0 after initialisation.
        opt, m = self.options, self.options.memory_width
        self.reads0 = nn.Parameter(torch.empty(opt.read_heads, m, **factory))
        self.read_focus0 = nn.Parameter(torch.empty(opt.read_heads, 1, **factory))
        self.write_focus0 = nn.Parameter(torch.empty(opt.write_heads, 1, **factory))
        if opt.memory_init == "learned":
            self.memory0 = nn.Parameter(torch.empty(m, **factory))  # one row, shared by all rows
        else:
            self.register_parameter("memory0", None)

    def _reset_own(self) -> None:
        nn.init.normal_(self.reads0, std=0.01)
        # softmax([10, 0, ..., 0]) puts > 99% of the weight on row 0 for N <= 128.
        nn.init.constant_(self.read_focus0, 10.0)
        nn.init.constant_(self.write_focus0, 10.0)
        if self.memory0 is not None:
            nn.init.constant_(self.memory0, MEMORY_INIT_CONSTANT)
        layout, bias, options = self.head_layout, self.head_params.bias, self.options
        with torch.no_grad():
            if options.write_init == "sequential":
                shifts = layout.rows("write", "shift")  # -R..+R, head by head
                bias[layout.rows("write", "gate")] = _SEQUENTIAL_GATE
                bias[shifts] = 0.0
                bias[shifts[options.shift_range + 1 :: layout.shifts]] = _SEQUENTIAL_SHIFT
                bias[layout.rows("write", "gamma")] = _SEQUENTIAL_GAMMA
            if options.read_beta_bias is not None:
                bias[layout.rows("read", "beta")] = options.read_beta_bias

    def _initial_state(self, batch_size: int, controller: tuple, device, dtype) -> NTMState:
        """Memory by ``memory_init``; the weightings focused on row 0 by the learned logits
        ``read_focus0``, ``write_focus0``; the learned read vectors ``reads0``."""
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

        return NTMState(controller=controller, memory=memory,
                        read_weights=focus(self.read_focus0),
                        write_weights=focus(self.write_focus0),
                        reads=self.reads0.to(device, dtype).expand(b, -1, -1))

    def _state_shapes(self, batch_size: int) -> dict[str, tuple[int, ...]]:
        b, n, m = batch_size, self.memory_size, self.memory_width
        return {"memory": (b, n, m), "read_weights": (b, self.read_heads, n),
                "write_weights": (b, self.write_heads, n), "reads": (b, self.read_heads, m)}

    def _advance(self, x: Tensor, state: NTMState, record: bool = False):
        """One time step up to the output layer. x: ``[B, input_size]``. Returns ``(h [B,
        controller_size], state)``, plus the activated `HeadParameters` ``(write, read)`` when
        ``record`` (write is None without write heads)."""
        b = x.shape[0]
        ctrl_in = torch.cat([x, state.reads.reshape(b, -1)], dim=-1)
        h, ctrl = self.controller(ctrl_in, state.controller)
        raw = self.head_params(h)  # (B, P): every head's parameters at once
        memory, w_read, w_write, reads, (wp, rp) = self.head_layout.heads_step(
            raw, state.memory, state.read_weights, state.write_weights, *self.options.caps)
        new_state = NTMState(ctrl, memory, w_read, w_write, reads)
        return (h, new_state, (wp, rp)) if record else (h, new_state)


class NTMCell(Cell, _NTMBase):
    """One step of a Neural Turing Machine (`torch_ntm.base.Cell`): `NTM`'s constructor arguments
    (but ``batch_first`` and ``engine``) and parameter names, so ``cell.load_state_dict(
    ntm.state_dict())`` steps a model trained as a sequence."""


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
        write_init: ``"default"``: the head layer's biases are drawn as its weights are
            (``nn.Linear``'s initialisation); ``"sequential"``: the write heads' gate, shift and
            sharpening biases are set so that a fresh model's write heads step one row a step
            from row 0 (location-based addressing), content addressing left to be learned. For
            tasks that store each step in a row of its own (dynamic n-grams: it takes every
            seed off the plateau early, docs/results/ngrams.md). Needs a write head and
            ``shift_range >= 1``.
        read_beta_bias: None (default): the read heads' key-strength biases are drawn as the
            head layer's are; a number sets them to it, so that a fresh model's read heads start
            with key strength ``softplus(read_beta_bias)`` (5 gives 5.0: content lookups that
            pick a row from the first steps rather than blur over all of them; with the write
            start, every dynamic n-grams seed of five within 1% of the optimum,
            docs/results/ngrams.md).
        max_beta: None (default) for the paper's unbounded key strength ``softplus``; a number
            bounds it smoothly, ``beta = max_beta tanh(softplus / max_beta)``.
        max_gamma: None (default) for the paper's unbounded sharpening ``1 + softplus``; a number
            bounds gamma - 1 likewise below max_gamma - 1. For ablations: bounding gamma did not
            prevent the collapses of the Stability page (gradient-norm clipping at 1 did).
        batch_first: inputs and outputs are ``[B, T, ...]`` instead of ``[T, B, ...]``.
        engine: how `forward` runs, the same function on each (`torch_ntm.engines`):
            ``"auto"`` (default) the fastest engine that can serve the call: on the CPU
            ``"native"`` (the whole sequence, forward and backward, as one C++ call each, in
            float32 and float64; built once per machine in seconds), on a CUDA GPU ``"graphs"``
            (the step below captured over the sequence as CUDA graphs and replayed), else
            ``"eager"`` (the loop over the step with plain autograd, which also serves
            `torch.func`, forward-mode AD, `torch.autocast`, other dtypes and devices), saying
            once why. `trace` is always eager. May be changed on a built module by assigning
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

    _native = "ntm"
    _trace_type = NTMTrace

    def _trace_row(self, state: NTMState, heads) -> tuple:
        wp, rp = heads
        if wp is None:  # no write heads: empty write fields
            empty = state.memory.new_zeros(state.memory.shape[0], 0, self.memory_width)
            wp = HeadParameters(empty, empty[..., :1], None, None, empty[..., :1], empty, empty)
        return (state.read_weights, state.write_weights, wp.erase, wp.add, state.memory,
                rp.beta[..., 0], rp.gamma[..., 0], wp.beta[..., 0], wp.gamma[..., 0])
