"""The Differentiable Neural Computer as PyTorch modules: `DNCCell` (one step) and `DNC`.

Graves, Wayne, Reynolds et al. (2016), "Hybrid computing using a neural network with dynamic
external memory", Nature 538, Methods. One time step (R read heads, Hw write heads):

    h_t, ctrl_t = controller([x_t, r_{t-1}], ctrl_{t-1})
    xi_t        = one linear layer of h_t: the interface vector, split and activated
                  (`torch_ntm.layout.DNCLayout`, fields in `torch_ntm.layout.DNC_FIELDS` order)
    free, allocate, write, link, read    (`torch_ntm.dnc_functional`; reads see M_t)
    y_t         = linear([h_t, r_t])      (logits: the paper's W_y h_t + W_r [r_t^1..r_t^R])

All state is explicit (`DNCState`, in `torch_ntm.layout`); modules hold parameters only. No
parameter's shape depends on the number of memory rows N, so a trained model can be rebuilt with
a larger memory.

How it differs from the paper, on purpose:

- The controller is `torch_ntm.controllers`' (an LSTM stack with a learned initial state and
  forget-gate bias 1, or feed-forward layers). With one layer (the default) it is the paper's
  controller; with more, the paper also feeds the input to every layer and the interface and
  output every layer's h, which this stack does not (only the top layer's h is used).
- The initial read vectors are learned (zero at initialisation, the paper's r_0 = 0); memory,
  usage, link, precedence and weightings start at zero, as in the paper.
- Several write heads are allowed, as in DeepMind's reference implementation
  (`torch_ntm.dnc_functional` says how).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from torch_ntm import dnc_functional as dncf
from torch_ntm import engines
from torch_ntm.base import Cell, MemoryModule
from torch_ntm.checks import choice, positive_fields, positive_int
from torch_ntm.controllers import CONTROLLERS
from torch_ntm.layout import DNCLayout
from torch_ntm.sequence import SequenceModel
from torch_ntm.states import DNCState

__all__ = ["DNC", "DNCCell", "DNCOptions", "DNCState", "DNCTrace", "ENGINES"]

# How `DNC.forward` computes a sequence (`torch_ntm.engines`): "auto" is the native engine on the
# CPU (`torch_ntm.engines.dnc`) and the graphs engine on CUDA.
ENGINES = engines.ENGINES


class DNCTrace(NamedTuple):
    """What `DNC.trace` records at each step, stacked over time (T first)."""

    read_weights: Tensor  # (T, B, R, N)
    write_weights: Tensor  # (T, B, Hw, N)
    usage: Tensor  # (T, B, N), before this step's write (the usage allocation saw)
    allocation: Tensor  # (T, B, Hw, N) allocation weightings
    link: Tensor  # (T, B, Hw, N, N) after the step's write
    precedence: Tensor  # (T, B, Hw, N)
    memory: Tensor  # (T, B, N, W), after the step's write
    read_modes: Tensor  # (T, B, R, 2 Hw + 1): (backward_1..Hw, content, forward_1..Hw)
    free_gates: Tensor  # (T, B, R)
    allocation_gates: Tensor  # (T, B, Hw)
    write_gates: Tensor  # (T, B, Hw)


@dataclass
class DNCOptions:
    """The architecture of a DNC: the keyword arguments of `DNC` and `DNCCell` but
    ``batch_first``, ``engine``, ``device`` and ``dtype`` (what each means is documented in
    `DNC`). The defaults are those of DeepMind's reference training script (a 64-unit LSTM,
    16 x 16 memory, 4 read heads, 1 write head)."""

    controller: str = "lstm"
    controller_size: int = 64
    controller_layers: int = 1
    memory_size: int = 16
    memory_width: int = 16
    read_heads: int = 4
    write_heads: int = 1
    sparse_link: int | None = None

    def checked(self) -> DNCOptions:
        """These options, unchanged if valid; else a `ValueError` naming the first invalid one
        and what it must be."""
        choice("controller", self.controller, CONTROLLERS)
        positive_fields(self, "controller_size", "controller_layers", "memory_size",
                        "memory_width", "read_heads", "write_heads")
        if self.sparse_link is not None:
            positive_int("sparse_link (K, or None for the exact link matrix)", self.sparse_link)
        return self


class _DNCBase(MemoryModule):
    """The DNC on `torch_ntm.base.MemoryModule`: what `DNCCell` and `DNC` share."""

    Options = DNCOptions
    State = DNCState

    def _layout(self) -> DNCLayout:
        # the interface vector's fields and the memory access (torch_ntm.layout)
        opt = self.options
        return DNCLayout(opt.read_heads, opt.write_heads, opt.memory_width, opt.sparse_link)

    def _build_own(self, factory: dict) -> None:
        self.reads0 = nn.Parameter(torch.empty(self.read_heads, self.memory_width, **factory))

    def _reset_own(self) -> None:
        nn.init.zeros_(self.reads0)  # the paper's r_0 = 0

    def _initial_state(self, batch_size: int, controller: tuple, device, dtype) -> DNCState:
        """An empty memory, nothing read or written yet: memory, usage, link matrices,
        precedence and weightings zero (the paper's u_0 = 0, p_0 = 0, L_0 = 0); the read
        vectors (``reads0``) and the LSTM's ``(h, c)`` learned."""
        b, n, w = batch_size, self.memory_size, self.memory_width
        r, hw = self.read_heads, self.write_heads

        def zeros(*shape: int) -> Tensor:
            return torch.zeros(*shape, device=device, dtype=dtype)

        return DNCState(controller=controller, memory=zeros(b, n, w), usage=zeros(b, n),
                        link=zeros(b, hw, n, n), precedence=zeros(b, hw, n),
                        read_weights=zeros(b, r, n), write_weights=zeros(b, hw, n),
                        reads=self.reads0.to(device, dtype).expand(b, -1, -1))

    def _state_shapes(self, batch_size: int) -> dict[str, tuple[int, ...]]:
        b, n, w = batch_size, self.memory_size, self.memory_width
        r, hw = self.read_heads, self.write_heads
        return {"memory": (b, n, w), "usage": (b, n), "link": (b, hw, n, n),
                "precedence": (b, hw, n), "read_weights": (b, r, n),
                "write_weights": (b, hw, n), "reads": (b, r, w)}

    def _loop_state(self, state: DNCState) -> DNCState:
        """With ``sparse_link``, the state with its link stored as a
        `torch_ntm.dnc_functional.SparseLink` (each row's K largest entries: all of a sparse
        model's), as the sequence loop carries it; else ``state``."""
        if self.sparse_link is None or isinstance(state.link, dncf.SparseLink):
            return state
        return state._replace(link=dncf.sparse_link_from_dense(state.link, self.sparse_link))

    def _public_state(self, state: DNCState) -> DNCState:
        """``state`` with its link as ``[B, Hw, N, N]`` matrices (`DNCState`'s form)."""
        if isinstance(state.link, dncf.SparseLink):
            return state._replace(
                link=dncf.sparse_link_dense(state.link, state.memory.shape[-2]))
        return state

    def _advance(self, x: Tensor, state: DNCState, record: bool = False):
        """One time step up to the output layer. x: ``[B, input_size]``. Returns ``(h [B,
        controller_size], state)``, plus the step's `torch_ntm.layout.DNCAccess` when
        ``record``. The state's link comes back in the form it came in (with ``sparse_link``,
        dense matrices or the sequence loop's `torch_ntm.dnc_functional.SparseLink`,
        `_loop_state`)."""
        b = x.shape[0]
        dense_link = isinstance(state.link, Tensor)
        state = self._loop_state(state)
        h, ctrl = self.controller(torch.cat([x, state.reads.reshape(b, -1)], -1),
                                  state.controller)
        access = self.head_layout.access_step(
            self.head_params(h), state.memory, state.usage, state.link, state.precedence,
            state.read_weights, state.write_weights)
        new = DNCState(ctrl, *access[:7])
        if dense_link:
            new = self._public_state(new)
        return (h, new, access) if record else (h, new)


class DNCCell(Cell, _DNCBase):
    """One step of a Differentiable Neural Computer (`torch_ntm.base.Cell`): `DNC`'s constructor
    arguments (but ``batch_first`` and ``engine``) and parameter names."""


class DNC(SequenceModel, _DNCBase):
    """A Differentiable Neural Computer (Graves et al. 2016) over sequences, with an
    `nn.LSTM`-like interface (as `torch_ntm.NTM`).

    Args:
        input_size: width of each input step.
        output_size: width of each output step (logits).
        controller: ``"lstm"`` (default) or ``"feedforward"``.
        controller_size: hidden units per controller layer (default 64).
        controller_layers: number of controller layers (default 1).
        memory_size: N, rows of memory (default 16).
        memory_width: W, width of a memory row (default 16).
        read_heads: R, read heads (default 4); each has a key, a strength, a free gate and a
            read mode.
        write_heads: Hw, write heads (default 1, as in the paper); each has its own key,
            strength, erase and write vectors, allocation and write gates, precedence and link
            matrix.
        sparse_link: None (default) for the exact N x N link matrix; K for the paper's sparse
            approximation, keeping the K largest entries of the write weighting and precedence
            (`torch_ntm.dnc_functional.sparse_link`). A sequence carries the link K entries a
            row from step to step (`torch_ntm.dnc_functional.sparse_link_update`: O(N K) memory
            and time a step, not O(N^2)); the state passed in and returned keeps
            `DNCState`'s dense ``[B, Hw, N, N]``, converted once a call (its link read as each
            row's K largest entries, all that a sparse model's state holds).
        batch_first: inputs and outputs are ``[B, T, ...]`` instead of ``[T, B, ...]``.
        engine: as for `torch_ntm.NTM`. On the CPU "auto" picks the native engine
            (`torch_ntm.engines.dnc`: the sequence forward and backward in C++) where it
            serves: a one-layer LSTM controller, one write head and the exact link matrix (the
            paper's DNC, the default), else the eager loop over the step, saying once why; on a
            CUDA GPU the graphs engine. ``dnc.engine = ...`` changes it on a built module.
        device: of the parameters.
        dtype: of the parameters.

    ``dnc.options`` (a `DNCOptions`) holds the arguments from ``controller`` to
    ``sparse_link``; each is a read-only attribute too (``dnc.memory_size``, and
    ``dnc.controller_type`` for ``controller``).

    Example:

        dnc = DNC(9, 8)
        logits, state = dnc(x)              # x: (T, B, 9) -> logits (T, B, 8)
        more, state = dnc(x_next, state)    # the same sequence, carried on
    """

    _native = "dnc"
    _trace_type = DNCTrace

    def _trace_row(self, state: DNCState, access) -> tuple:
        xi = access.interface
        return (state.read_weights, state.write_weights, state.usage, access.allocation,
                self._public_state(state).link, state.precedence, state.memory, xi.read_mode,
                xi.free_gate, xi.allocation_gate[..., 0], xi.write_gate[..., 0])
