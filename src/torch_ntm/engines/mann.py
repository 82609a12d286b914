"""The MANN's "native" engine: a whole sequence of `torch_ntm.MANN`, forward and backward, as one
C++ call each (``csrc/mann.cpp``, built into the library of `torch_ntm.engines.library`).

The eager loop runs a step as a few dozen tensor ops, so at the paper's sizes (batch 16, 128 x 40
memory, 4 heads) its time goes to per-op overhead rather than arithmetic. Here the time loop is
C++: the LSTM's recurrent matmul and the head layer are BLAS calls over the batch, and the rest of
a step (the LRUA write, cosine similarities, softmax, reads, usage, the least-used rows, and all of
it backward) is vectorised loops over each batch element's memory. What is one matmul over all
steps stays in torch, under autograd: the LSTM's input side (`MANN._forward_compiled`'s trick),
the output layer, and, after the backward call, the weight gradients of the recurrent and head
layers. torch allocates every buffer; one `torch.autograd.Function` wraps the two calls.

The same function as the eager loop, to float rounding: the least-used rows and the zeroed row are
chosen by the same rules (a stable sort's first H rows, the first minimum), so where usages tie
(a fresh state; rows never written) the same rows are picked.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor, nn

from torch_ntm.engines import library
from torch_ntm.engines.calls import MANNCall
from torch_ntm.engines.common import carried, first_order_only, lstm_input_side
from torch_ntm.layout import LRUALayout
from torch_ntm.states import MANNState

__all__ = ["MANNCall", "forward"]




class _Config(NamedTuple):
    """A model's static sizes and usage decay (`MANNCall` without a call's steps and batch)."""

    controller: int
    heads: int
    width: int
    rows: int
    fields: int  # Fw, each head's outputs of the head layer
    alpha: int  # offsets of alpha, add (-1: the key is written) and beta (-1: beta = 1)
    add: int
    beta: int
    decay: float
    layout: LRUALayout  # the model's heads, for `_eager_sequence`

    def call(self, steps: int, batch: int, keep: bool) -> MANNCall:
        return MANNCall(steps, batch, self.controller, self.heads, self.width, self.rows,
                        self.fields, self.alpha, self.add, self.beta, int(keep), self.decay)


def _config(model: nn.Module) -> _Config:
    fields = model.head_layout.fields
    offsets, start = {}, 0
    for name, width in fields.items():
        offsets[name] = start
        start += width
    return _Config(model.controller_size, model.read_heads, model.memory_width,
                   model.memory_size, start, offsets["alpha"], offsets.get("add", -1),
                   offsets.get("beta", -1), model.usage_decay, model.head_layout)


def _run_forward(cfg: _Config, xpre, wrh, wp, bp, h0, c0, memory, usage, w_read, least_used,
                 reads, keep: bool):
    """All steps, from the state as `_Sequence.forward` takes it (memory ``[B, N, M]``): the
    buffers of `MANNCall.buffers`, filled."""
    steps, batch = xpre.shape[:2]
    call = cfg.call(steps, batch, keep)
    buf = library.allocate(call, xpre)
    # where every step's memory is kept, the steps compute in two slots of work (mann.cpp)
    work = xpre.new_empty(2, *buf.mem.shape[1:]) if keep else buf.mem
    with torch.no_grad():
        buf.cell[0].copy_(c0)
        work[0].copy_(memory.transpose(1, 2))
        if keep:
            buf.mem[0].copy_(work[0])
        buf.usage[0].copy_(usage)
        buf.wr[0].copy_(w_read)
        buf.lu[0].copy_(least_used)
    library.call("torch_ntm_mann_forward", xpre.dtype, call, library.arguments(
        call, "forward", dict(xpre=xpre, wrh=wrh, wp=wp, bp=bp, h0=h0, reads0=reads, work=work),
        buf))
    return buf


class _Sequence(torch.autograd.Function):
    """The MANN's steps after the LSTM's input side, before the output layer: from ``xpre``
    ``[T, B, 4C]`` (gates i, f, o, g, biases included), the recurrent weights ``wrh``
    ``[4C, H M + C]`` of ``[reads, h]``, the head layer (``wp``, ``bp``) and the initial state, to
    ``(hs [T, B, C], reads [T, B, H, M], c, memory, usage, w_read, least_used)`` after the last
    step. The least-used rows are a step function of the usage: no gradient flows from them."""

    @staticmethod
    def forward(ctx, cfg: _Config, xpre, wrh, wp, bp, h0, c0, memory, usage, w_read, least_used,
                reads):
        buf = _run_forward(cfg, xpre, wrh, wp, bp, h0, c0, memory, usage, w_read, least_used,
                           reads, keep=True)
        ctx.cfg = cfg
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(wrh, wp, *library.flat(buf))
        # For a second derivative (`first_order_only`): the same sequence in plain ops.
        ctx.inputs = (xpre, wrh, wp, bp, h0, c0, memory, usage, w_read, least_used, reads)
        ctx.leading, ctx.recompute = 1, functools.partial(_eager_sequence, cfg)
        lu = buf.lu[-1].clone()
        ctx.mark_non_differentiable(lu)
        # hs and reads are returned as they are (saved, not views); the rest are copies
        return (buf.hs, buf.reads, buf.cell[-1].clone(), buf.mem[-1].transpose(1, 2).contiguous(),
                buf.usage[-1].clone(), buf.wr[-1].clone(), lu)

    @staticmethod
    @first_order_only
    def backward(ctx, dhs, dreads, dc, dmem, dusage, dwr, _dlu):
        cfg = ctx.cfg
        wrh, wp, *saved = ctx.saved_tensors
        steps, batch = saved[0].shape[0] - 1, saved[0].shape[1]  # cell: [T + 1, B, C]
        call = cfg.call(steps, batch, True)
        buf = library.unflat(call, saved)
        grads = dict(
            dhs=torch.zeros_like(buf.hs) if dhs is None else dhs.contiguous(),
            dreads=torch.zeros_like(buf.reads) if dreads is None else dreads.contiguous(),
            dmem=carried(None if dmem is None else dmem.transpose(1, 2), buf.mem[0]),
            dusage=carried(dusage, buf.usage[0]), dwr=carried(dwr, buf.wr[0]),
            dreads0=torch.zeros_like(buf.reads[0]), dh=torch.zeros_like(buf.hs[0]),
            dc=carried(dc, buf.cell[0]), dlu=torch.empty_like(buf.lu[0]),
            dgates=wp.new_empty(steps, batch, 4 * cfg.controller),
            draw=wp.new_empty(steps, batch, wp.shape[0]))
        library.call("torch_ntm_mann_backward", wp.dtype, call,
                     library.arguments(call, "backward", dict(wrh=wrh, wp=wp, **grads), buf))
        dgates, draw = grads["dgates"], grads["draw"]
        # Weight gradients: one matmul over all T B rows each.
        dwrh = dgates.flatten(0, 1).t() @ buf.z.flatten(0, 1)
        dwp = draw.flatten(0, 1).t() @ buf.hs.flatten(0, 1)
        return (None, dgates, dwrh, dwp, draw.sum((0, 1)), grads["dh"], grads["dc"],
                grads["dmem"].transpose(1, 2), grads["dusage"], grads["dwr"], grads["dlu"],
                grads["dreads0"])


def _eager_sequence(cfg: _Config, xpre, wrh, wp, bp, h, cell, memory, usage, w_read, least_used,
                    reads) -> list:
    """`_Sequence`'s function in plain ops on its own inputs: the LSTM from the permuted weights
    (gates i, f, o, g), then the heads' step of the model's specification
    (`LRUALayout.heads_step`). What a second derivative differentiates
    (`torch_ntm.engines.first_order_only`)."""
    c = cfg.controller
    hs, all_reads = [], []
    for t in range(xpre.shape[0]):
        gates = xpre[t] + torch.cat([reads.flatten(1), h], 1) @ wrh.t()
        i, f, o = torch.sigmoid(gates[:, : 3 * c]).chunk(3, 1)
        cell = f * cell + i * torch.tanh(gates[:, 3 * c :])
        h = o * torch.tanh(cell)
        memory, usage, w_read, least_used, reads = cfg.layout.heads_step(
            torch.addmm(bp, h, wp.t()), memory, usage, w_read, least_used)
        hs.append(h)
        all_reads.append(reads)
    return [torch.stack(hs), torch.stack(all_reads), cell, memory, usage, w_read, least_used]


def forward(model: nn.Module, x: Tensor, state: MANNState) -> tuple[Tensor, MANNState]:
    """``model``'s sequence by the native engine.

    Args:
        model: the `torch_ntm.MANN` (only its public attributes are read).
        x: ``[T, B, input_size]``, time-major, already checked by `MANN.forward`.
        state: the `torch_ntm.MANNState` to start from (checked).

    Returns:
        ``(logits [T, B, output_size], final state)``, differentiable to every parameter, to
        ``x`` and to the state's tensors where gradients are enabled; without them, a forward
        that keeps two slots of state instead of every step's.
    """
    library.keep_freed_memory_once()
    cfg = _config(model)
    xpre, wrh = lstm_input_side(model, model.encode(x))
    inputs = (xpre, wrh, model.head_params.weight.contiguous(),
              model.head_params.bias.contiguous(), state.controller[0][0].contiguous(),
              state.controller[1][0].contiguous(), state.memory.contiguous(),
              state.usage.contiguous(), state.read_weights.contiguous(),
              state.least_used.contiguous(), state.reads.contiguous())
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        hs, reads, c, memory, usage, w_read, least_used = _Sequence.apply(cfg, *inputs)
    else:
        buf = _run_forward(cfg, *inputs, keep=False)
        last = x.shape[0] % 2  # two slots of state: the final one in slot T % 2
        hs, reads, c = buf.hs, buf.reads, buf.cell[last]
        memory, usage = buf.mem[last].transpose(1, 2).contiguous(), buf.usage[last]
        w_read, least_used = buf.wr[last], buf.lu[last]
    logits = model.output(torch.cat([hs, reads.flatten(2)], -1))
    final = type(state)((hs[-1].unsqueeze(0), c.unsqueeze(0)), memory, usage, w_read, least_used,
                        reads[-1])  # a MANNState (the engines import no model)
    return logits, final
