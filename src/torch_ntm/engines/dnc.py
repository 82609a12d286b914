"""The DNC's "native" engine: a whole sequence of `torch_ntm.DNC`, forward and backward, as one
C++ call each (``csrc/dnc.cpp``, built into the library of `torch_ntm.engines.library`).

The eager step of a DNC is some 60 tensor ops (the allocation's sort, the link matrix, three read
modes per head), so at its usual sizes (batch 16, a 64-unit LSTM, memory 16 to 128 rows) a step's
time goes to per-op overhead, forward and backward. Here the time loop is C++: the LSTM's
recurrent matmul and the interface layer are BLAS calls over the batch, and the memory access of a
step (`torch_ntm.dnc_functional`'s equations) is loops over each batch element's memory; its
backward recomputes a step's intermediates from the state kept for every step. What is one matmul
over all steps stays in torch, under autograd: the LSTM's input side, the output layer, and, after
the backward call, the weight gradients of the recurrent and interface layers (the MANN engine's
pattern, `torch_ntm.engines.mann`).

It serves the DNC of the paper's shape: a one-layer LSTM controller, one write head and the exact
link matrix. Any other (`DNCCall.why_not`) runs on the eager engine, the reason logged once.

The same function as the eager loop, to float rounding; the free list is the same stable sort
(ties by row index).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor, nn

from torch_ntm.engines import library
from torch_ntm.engines.calls import DNCCall
from torch_ntm.engines.common import carried, first_order_only, lstm_input_side
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
    layout: DNCLayout  # the model's interface, for `_eager_sequence`

    def call(self, steps: int, batch: int, keep: bool) -> DNCCall:
        return DNCCall(steps, batch, self.controller, self.read_heads, self.width, self.rows,
                       self.fields, *self.starts, int(keep))


def _config(model: nn.Module) -> _Config:
    layout = model.head_layout
    starts, start = [], 0
    for heads, width in layout.fields.values():  # DNC_FIELDS' order, as _FIELDS
        starts.append(start)
        start += heads * width
    return _Config(model.controller_size, model.read_heads, model.memory_width,
                   model.memory_size, start, tuple(starts), layout)


def _run_forward(cfg: _Config, xpre, wrh, wp, bp, h0, c0, memory, usage, link, precedence,
                 w_read, w_write, reads, keep: bool):
    """All steps, from the state as `_Sequence.forward` takes it (one write head's link,
    precedence and write weighting without their head axis): the buffers of `DNCCall.buffers`,
    filled."""
    steps, batch = xpre.shape[:2]
    call = cfg.call(steps, batch, keep)
    buf = library.allocate(call, xpre)
    with torch.no_grad():
        for slot, value in zip((buf.cell, buf.mem, buf.usage, buf.link, buf.prec, buf.wr, buf.ww),
                               (c0, memory, usage, link, precedence, w_read, w_write)):
            slot[0].copy_(value)
    library.call("torch_ntm_dnc_forward", xpre.dtype, call, library.arguments(
        call, "forward", dict(xpre=xpre, wrh=wrh, wp=wp, bp=bp, h0=h0, reads0=reads), buf))
    return buf


class _Sequence(torch.autograd.Function):
    """The DNC's steps after the LSTM's input side, before the output layer: from ``xpre``
    ``[T, B, 4C]`` (gates i, f, o, g, biases included), the recurrent weights ``wrh``
    ``[4C, R W + C]`` of ``[reads, h]``, the interface layer (``wp``, ``bp``) and the initial
    state, to ``(hs [T, B, C], reads [T, B, R, W], c, memory, usage, link, precedence, w_read,
    w_write)`` after the last step."""

    @staticmethod
    def forward(ctx, cfg: _Config, xpre, wrh, wp, bp, h0, c0, memory, usage, link, precedence,
                w_read, w_write, reads):
        buf = _run_forward(cfg, xpre, wrh, wp, bp, h0, c0, memory, usage, link, precedence,
                           w_read, w_write, reads, keep=True)
        ctx.cfg = cfg
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(wrh, wp, *library.flat(buf))
        # For a second derivative (`first_order_only`): the same sequence in plain ops.
        ctx.inputs = (xpre, wrh, wp, bp, h0, c0, memory, usage, link, precedence, w_read,
                      w_write, reads)
        ctx.leading, ctx.recompute = 1, functools.partial(_eager_sequence, cfg)
        # hs and reads are returned as they are (saved, not views); the rest are copies
        return (buf.hs, buf.reads, buf.cell[-1].clone(), buf.mem[-1].clone(),
                buf.usage[-1].clone(), buf.link[-1].clone(), buf.prec[-1].clone(),
                buf.wr[-1].clone(), buf.ww[-1].clone())

    @staticmethod
    @first_order_only
    def backward(ctx, dhs, dreads, dc, dmem, dusage, dlink, dprec, dwr, dww):
        cfg = ctx.cfg
        wrh, wp, *saved = ctx.saved_tensors
        steps, batch = saved[0].shape[0] - 1, saved[0].shape[1]  # cell: [T + 1, B, C]
        call = cfg.call(steps, batch, True)
        buf = library.unflat(call, saved)
        grads = dict(
            dhs=torch.zeros_like(buf.hs) if dhs is None else dhs.contiguous(),
            dreads=torch.zeros_like(buf.reads) if dreads is None else dreads.contiguous(),
            dmem=carried(dmem, buf.mem[0]), dusage=carried(dusage, buf.usage[0]),
            dlink=carried(dlink, buf.link[0]), dprec=carried(dprec, buf.prec[0]),
            dwr=carried(dwr, buf.wr[0]), dww=carried(dww, buf.ww[0]),
            dreads0=torch.zeros_like(buf.reads[0]), dh=torch.zeros_like(buf.hs[0]),
            dc=carried(dc, buf.cell[0]),
            dgates=wp.new_empty(steps, batch, 4 * cfg.controller),
            draw=wp.new_empty(steps, batch, wp.shape[0]))
        library.call("torch_ntm_dnc_backward", wp.dtype, call,
                     library.arguments(call, "backward", dict(wrh=wrh, wp=wp, **grads), buf))
        dgates, draw = grads["dgates"], grads["draw"]
        # Weight gradients: one matmul over all T B rows each.
        dwrh = dgates.flatten(0, 1).t() @ buf.z.flatten(0, 1)
        dwp = draw.flatten(0, 1).t() @ buf.hs.flatten(0, 1)
        g = grads
        return (None, dgates, dwrh, dwp, draw.sum((0, 1)), g["dh"], g["dc"], g["dmem"],
                g["dusage"], g["dlink"], g["dprec"], g["dwr"], g["dww"], g["dreads0"])


def _eager_sequence(cfg: _Config, xpre, wrh, wp, bp, h, cell, memory, usage, link, precedence,
                    w_read, w_write, reads) -> list:
    """`_Sequence`'s function in plain ops on its own inputs: the LSTM from the permuted weights
    (gates i, f, o, g), then the memory access of the model's specification
    (`DNCLayout.access_step`). What a second derivative differentiates
    (`torch_ntm.engines.first_order_only`)."""
    c = cfg.controller
    hs, all_reads = [], []
    link, precedence, w_write = link.unsqueeze(1), precedence.unsqueeze(1), w_write.unsqueeze(1)
    for t in range(xpre.shape[0]):
        gates = xpre[t] + torch.cat([reads.flatten(1), h], 1) @ wrh.t()
        i, f, o = torch.sigmoid(gates[:, : 3 * c]).chunk(3, 1)
        cell = f * cell + i * torch.tanh(gates[:, 3 * c :])
        h = o * torch.tanh(cell)
        step = cfg.layout.access_step(torch.addmm(bp, h, wp.t()), memory, usage, link,
                                      precedence, w_read, w_write)
        memory, usage, link, precedence, w_read, w_write, reads = step[:7]
        hs.append(h)
        all_reads.append(reads)
    return [torch.stack(hs), torch.stack(all_reads), cell, memory, usage, link[:, 0],
            precedence[:, 0], w_read, w_write[:, 0]]


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
    inputs = (xpre, wrh, model.head_params.weight.contiguous(),
              model.head_params.bias.contiguous(), state.controller[0][0].contiguous(),
              state.controller[1][0].contiguous(), state.memory.contiguous(),
              state.usage.contiguous(), state.link[:, 0].contiguous(),
              state.precedence[:, 0].contiguous(), state.read_weights.contiguous(),
              state.write_weights[:, 0].contiguous(), state.reads.contiguous())
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        hs, reads, c, memory, usage, link, precedence, w_read, w_write = _Sequence.apply(
            cfg, *inputs)
    else:
        buf = _run_forward(cfg, *inputs, keep=False)
        last = x.shape[0] % 2  # two slots of state: the final one in slot T % 2
        hs, reads, c = buf.hs, buf.reads, buf.cell[last]
        memory, usage, link = buf.mem[last], buf.usage[last], buf.link[last]
        precedence, w_read, w_write = buf.prec[last], buf.wr[last], buf.ww[last]
    logits = model.output(torch.cat([hs, reads.flatten(2)], -1))
    final = type(state)((hs[-1].unsqueeze(0), c.unsqueeze(0)), memory, usage, link.unsqueeze(1),
                        precedence.unsqueeze(1), w_read, w_write.unsqueeze(1),
                        reads[-1])  # a DNCState (the engines import no model)
    return logits, final
