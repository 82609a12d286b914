"""The DNC's "native" engine: a whole sequence of `torch_ntm.DNC`, forward and backward, as one
C++ call each (``csrc/dnc.cpp``, built into the library of `torch_ntm.engines.library`).

The eager step of a DNC is some 60 tensor ops (the allocation's sort, the link matrix, three read
modes per head), so at its usual sizes (batch 16, a 64-unit LSTM, memory 16 to 128 rows) a step's
time goes to per-op overhead, forward and backward. Here the time loop is C++: the LSTM's
recurrent matmul and the interface layer are BLAS calls over the batch, and the memory access of a
step (`torch_ntm.dnc_functional`'s equations) is loops over each batch element's memory; its
backward recomputes a step's intermediates from the state kept for every step. What is one matmul
over all steps stays in torch, under autograd: the LSTM's input side, the output layer, and, after
the backward call, the weight gradients of the recurrent and interface layers (the driver the
MANN's engine shares, `torch_ntm.engines.lstm_memory`).

It serves the DNC of the paper's shape: a one-layer LSTM controller, one write head and the exact
link matrix. Any other (`DNCCall.why_not`) runs on the eager engine, the reason logged once.

The same function as the eager loop, to float rounding; the free list is the same stable sort
(ties by row index).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from torch_ntm.engines import library
from torch_ntm.engines.calls import DNCCall
from torch_ntm.engines.common import lstm_input_side
from torch_ntm.engines.lstm_memory import Spec, eager, sequence
from torch_ntm.layout import DNC_FIELDS, DNCLayout
from torch_ntm.states import DNCState

__all__ = ["DNCCall", "forward"]

# The interface fields' names, in `torch_ntm.layout.DNC_FIELDS` order: `DNCCall` has where each
# starts.
_FIELDS = tuple(field.name for field in DNC_FIELDS)


class _Config(NamedTuple):
    """A model's static sizes (`DNCCall` without a call's steps and batch)."""

    controller: int
    read_heads: int
    width: int
    rows: int
    fields: int
    starts: tuple  # where each of `_FIELDS` starts
    layout: DNCLayout  # the model's interface, for `step`

    def call(self, steps: int, batch: int, keep: bool) -> DNCCall:
        return DNCCall(steps, batch, self.controller, self.read_heads, self.width, self.rows,
                       self.fields, *self.starts, int(keep))

    def eager(self, *inputs: Tensor) -> list:
        """The sequence in plain ops (`lstm_memory.eager`)."""
        return eager(self.step, *inputs)

    def step(self, raw: Tensor, memory, usage, link, precedence, w_read, w_write) -> tuple:
        """The memory access of the specification (`DNCLayout.access_step`) for one write head
        whose link, precedence and write weighting come without their head axis."""
        memory, usage, link, precedence, w_read, w_write, reads = self.layout.access_step(
            raw, memory, usage, link.unsqueeze(1), precedence.unsqueeze(1), w_read,
            w_write.unsqueeze(1))[:7]
        return memory, usage, link[:, 0], precedence[:, 0], w_read, w_write[:, 0], reads


def _config(model: nn.Module) -> _Config:
    layout = model.head_layout
    starts, start = [], 0
    for heads, width in layout.fields.values():  # DNC_FIELDS' order, as _FIELDS
        starts.append(start)
        start += heads * width
    return _Config(model.controller_size, model.read_heads, model.memory_width,
                   model.memory_size, start, tuple(starts), layout)


# One write head's link, precedence and write weighting, without their head axis.
_SPEC = Spec("dnc", ("mem", "usage", "link", "prec", "wr", "ww"))


def forward(model: nn.Module, x: Tensor, state: DNCState) -> tuple[Tensor, DNCState]:
    """``model``'s sequence by the native engine.

    Args:
        model: the `torch_ntm.DNC` (only its public attributes are read), one the kernels serve
            (`DNCCall.why_not`).
        x: ``[T, B, input_size]``, time-major, already checked by `DNC.forward`.
        state: the `torch_ntm.DNCState` to start from (checked).

    Returns:
        ``(logits [T, B, output_size], final state)``, differentiable to every parameter, to
        ``x`` and to the state's tensors where gradients are enabled; without them, a forward
        that keeps two slots of state instead of every step's.
    """
    library.keep_freed_memory_once()
    cfg = _config(model)
    xpre, wrh = lstm_input_side(model, x)
    hs, reads, c, (memory, usage, link, precedence, w_read, w_write) = sequence(
        _SPEC, cfg, xpre, wrh, model.head_params.weight.contiguous(),
        model.head_params.bias.contiguous(), state.controller[0][0].contiguous(),
        state.controller[1][0].contiguous(),
        (state.memory.contiguous(), state.usage.contiguous(), state.link[:, 0].contiguous(),
         state.precedence[:, 0].contiguous(), state.read_weights.contiguous(),
         state.write_weights[:, 0].contiguous()),
        state.reads.contiguous())
    logits = model.output(torch.cat([hs, reads.flatten(2)], -1))
    final = type(state)((hs[-1].unsqueeze(0), c.unsqueeze(0)), memory, usage, link.unsqueeze(1),
                        precedence.unsqueeze(1), w_read, w_write.unsqueeze(1),
                        reads[-1])  # a DNCState (the engines import no model)
    return logits, final
