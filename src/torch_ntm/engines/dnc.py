"""The DNC's "native" engine: a whole sequence of `torch_ntm.DNC`, forward and backward, as one
C++ call each (``csrc/dnc.cpp``, built into the library of `torch_ntm.engines.library`).

The eager step of a DNC is some 60 tensor ops (the allocation's sort, the link matrix, three read
modes per head), so at its usual sizes (batch 16, a 64-unit LSTM, memory 16 to 128 rows) a step's
time goes to per-op overhead, forward and backward. Here the time loop is C++: the LSTM's
recurrent matmul and the interface layer are matmuls over the batch, and the memory access of a
step (`torch_ntm.dnc_functional`'s equations) is loops over each batch element's memory; its
backward recomputes a step's intermediates from the state kept for every step. What is one matmul
over all steps stays in torch, under autograd: the LSTM's input side, the output layer, and, after
the backward call, the weight gradients of the recurrent and interface layers (the driver the
MANN's engine shares, `torch_ntm.engines.lstm_memory`).

It serves the DNC of the paper's shape: a one-layer LSTM controller, one write head and the exact
link matrix. Any other (`DNCCall.why_not`) runs on the eager engine, the reason logged once.

The same function as the eager loop, to float rounding; the free list is the same stable sort
(ties by row index). A sequence gets the same bits alone as in any batch (the matmuls of the steps
and of the input side are the library's batch-invariant one), so usages that tie in exact
arithmetic cannot send its write to another row in a batch than alone.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor, nn

from torch_ntm.engines.calls import DNCCall
from torch_ntm.engines.lstm_memory import Spec, controller_inputs, run
from torch_ntm.layout import DNC_FIELDS
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
    inputs: int  # X, the controller's input width besides the reads
    fields: int
    starts: tuple  # where each of `_FIELDS` starts

    def call(self, steps: int, batch: int, keep: bool) -> DNCCall:
        return DNCCall(steps, batch, self.controller, self.read_heads, self.width, self.rows,
                       self.inputs, self.fields, *self.starts, int(keep))


def _config(model: nn.Module) -> _Config:
    layout = model.head_layout
    starts, start = [], 0
    for heads, width in layout.fields.values():  # DNC_FIELDS' order, as _FIELDS
        starts.append(start)
        start += heads * width
    return _Config(model.controller_size, model.read_heads, model.memory_width,
                   model.memory_size, controller_inputs(model), start, tuple(starts))


# One write head's link, precedence and write weighting, without their head axis.
_SPEC = Spec("dnc", ("mem", "usage", "link", "prec", "wr", "ww"), lambda state: (
    state.memory, state.usage, state.link[:, 0], state.precedence[:, 0], state.read_weights,
    state.write_weights[:, 0]))


def forward(model: nn.Module, x: Tensor, state: DNCState) -> tuple[Tensor, DNCState]:
    """``model``'s sequence by the native engine (`lstm_memory.run`): ``(logits [T, B,
    output_size], final state)``, for a `torch_ntm.DNC` the kernels serve (`DNCCall.why_not`),
    ``x`` ``[T, B, input_size]`` and ``state`` a `torch_ntm.DNCState`, both checked by
    `DNC.forward`."""
    logits, controller, (memory, usage, link, precedence, w_read, w_write), reads = run(
        _SPEC, _config(model), model, x, state)
    return logits, type(state)(controller, memory, usage, link.unsqueeze(1),  # a DNCState
                               precedence.unsqueeze(1), w_read, w_write.unsqueeze(1), reads)
