"""The MANN's "native" engine: a whole sequence of `torch_ntm.MANN`, forward and backward, as one
C++ call each (``csrc/mann.cpp``, built into the library of `torch_ntm.engines.library`).

The eager loop runs a step as a few dozen tensor ops, so at the paper's sizes (batch 16, 128 x 40
memory, 4 heads) its time goes to per-op overhead rather than arithmetic. Here the time loop is
C++: the LSTM's recurrent matmul and the head layer are matmuls over the batch, and the rest of
a step (the LRUA write, cosine similarities, softmax, reads, usage, the least-used rows, and all of
it backward) is vectorised loops over each batch element's memory. What is one matmul over all
steps stays under autograd: the LSTM's input side (`MANN._forward_compiled`'s trick),
the output layer, and, after the backward call, the weight gradients of the recurrent and head
layers (the driver the DNC's engine shares, `torch_ntm.engines.lstm_memory`).

The same function as the eager loop, to float rounding: the least-used rows and the zeroed row are
chosen by the same rules (a stable sort's first H rows, the first minimum), so where usages tie
(a fresh state; rows never written) the same rows are picked. A sequence gets the same bits alone
as in any batch (the matmuls of the steps and of the input side are the library's batch-invariant
one), so usages that tie in exact arithmetic pick the same rows in a batch as alone.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor, nn

from torch_ntm.engines.calls import MANNCall
from torch_ntm.engines.lstm_memory import Spec, controller_inputs, run
from torch_ntm.layout import LRUA_FIELDS
from torch_ntm.states import MANNState

__all__ = ["MANNCall", "forward"]


class _Config(NamedTuple):
    """A model's static sizes and usage decay (`MANNCall` without a call's steps and batch)."""

    controller: int
    heads: int
    width: int
    rows: int
    inputs: int  # X, the controller's input width besides the reads
    fields: int  # Fw, each head's outputs of the head layer
    starts: tuple  # where each of `_FIELDS` starts among them (-1: absent)
    decay: float

    def call(self, steps: int, batch: int, keep: bool) -> MANNCall:
        return MANNCall(steps, batch, self.controller, self.heads, self.width, self.rows,
                        self.inputs, self.fields, *self.starts, int(keep), self.decay)


# Each head's fields' names, in `torch_ntm.layout.LRUA_FIELDS` order: `MANNCall` has where each
# starts.
_FIELDS = tuple(field.name for field in LRUA_FIELDS)


def _config(model: nn.Module) -> _Config:
    starts, start = {}, 0
    for name, width in model.head_layout.fields.items():
        starts[name] = start
        start += width
    return _Config(model.controller_size, model.read_heads, model.memory_width,
                   model.memory_size, controller_inputs(model), start,
                   tuple(starts.get(name, -1) for name in _FIELDS), model.usage_decay)


def _work(buf, keep: bool) -> dict:
    """Where every step's memory is kept, the steps compute in two slots of work (mann.cpp)."""
    if not keep:
        return {"work": buf.mem}
    work = buf.mem.new_empty(2, *buf.mem.shape[1:])
    work[0].copy_(buf.mem[0])
    return {"work": work}


# The least-used rows are a step function of the usage: no gradient flows from them.
_SPEC = Spec("mann", ("mem", "usage", "wr", "lu"), lambda state: (
    state.memory.transpose(1, 2), state.usage, state.read_weights, state.least_used),
    frozenset({"lu"}), _work)


def forward(model: nn.Module, x: Tensor, state: MANNState) -> tuple[Tensor, MANNState]:
    """``model``'s sequence by the native engine (`lstm_memory.run`, on the encoded input):
    ``(logits [T, B, output_size], final state)``, for a `torch_ntm.MANN`, ``x`` ``[T, B,
    input_size]`` and ``state`` a `torch_ntm.MANNState`, both checked by `MANN.forward`."""
    logits, controller, (memory, usage, w_read, least_used), reads = run(
        _SPEC, _config(model), model, x, state, read=model.encode(x))
    return logits, type(state)(controller, memory.transpose(1, 2).contiguous(),  # a MANNState
                               usage, w_read, least_used, reads)
