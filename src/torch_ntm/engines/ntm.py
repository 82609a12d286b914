"""The NTM's native engine: the whole sequence, forward and backward, as one C++ call each.

At the sizes NTMs train at, an eager step is hundreds of tiny tensor operations, and their
dispatch, not arithmetic, is where the time goes. Here the time loop is C++ (``csrc/ntm.h``,
compiled as ``ntm_forward.cpp`` and ``ntm_backward.cpp`` by `torch_ntm.engines.library`): the
controller's and head layer's matmuls are BLAS calls over the batch, and the rest of a step
(activations, addressing, erase and add, reads, the LSTM's gates, and their backward) vectorised
loops over each batch element's memory. torch allocates every buffer of the call's table
(`NTMCall.buffers`, by `torch_ntm.engines.library.allocate`) and the C functions fill them; an
`autograd.Function` wraps the two calls. The input projection of every
step, the output layer and the weight gradients are one matmul each over all steps, through
ordinary autograd.

The kernels read the head layer's rows permuted into one block per activation (`head_blocks`), so
that one loop activates a kind of field of every head (the LSTMs' gates in `nn.LSTMCell`'s own
order, i, f, g, o). Where each field of each head lies in those blocks is
derived here from `torch_ntm.layout.HEAD_FIELDS` and handed to the kernels in the call's
description (`NTMCall`), so the layout is described once. The model's eager step (`NTM._step`)
is the specification: the same function, to float rounding. Shapes: B batch, C controller size,
N memory rows, M row width, S = 2R + 1 shifts, Hr / Hw read / write heads, P head-layer outputs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torch_ntm.engines import driver, library
from torch_ntm.engines.calls import NTM_BLOCKS as _BLOCKS
from torch_ntm.engines.calls import NTMCall
from torch_ntm.engines.common import OwnSteps, carried
from torch_ntm.layout import HEAD_FIELDS, HeadLayout
from torch_ntm.states import NTMState

__all__ = ["NTMCall", "forward", "head_blocks"]

# The kernels' blocks of the head layer's rows, by activation, in `_BLOCKS` order; in each block
# the fields of that activation in `HEAD_FIELDS` order, each the write heads' before the read
# heads'.
_KINDS = ("write", "read")




class _Blocks(NamedTuple):
    """The permuted head layer of one model's layout."""

    perm: Tensor  # the head layer's rows in the kernels' order
    block_end: tuple  # per block of `_BLOCKS`, where it ends
    field_start: tuple  # per field and kind, where head 0's field starts (-1: none)
    field_width: tuple  # per field, its width


def head_blocks(layout: HeadLayout) -> _Blocks:
    """The head layer's rows in the kernels' order (`_BLOCKS`) and where each field lies."""
    perm, block_end = [], []
    start = {}
    for block in _BLOCKS:
        for field in HEAD_FIELDS:
            if field.activation != block:
                continue
            for kind in _KINDS:
                if field.name in layout.fields(kind) and layout.heads(kind):
                    start[field.name, kind] = len(perm)
                    perm += layout.rows(kind, field.name)
        block_end.append(len(perm))
    assert sorted(perm) == list(range(layout.size)), "every head output in exactly one block"
    sizes = layout.fields("write")
    return _Blocks(torch.tensor(perm, dtype=torch.long), tuple(block_end),
                   tuple(start.get((f.name, kind), -1) for f in HEAD_FIELDS for kind in _KINDS),
                   tuple(sizes[f.name] for f in HEAD_FIELDS))


class _Config(NamedTuple):
    """The static sizes of a model that the kernels depend on."""

    lstm: bool
    layers: int
    hidden: int  # C
    read_heads: int  # Hr
    write_heads: int  # Hw
    width: int  # M
    shifts: int  # S = 2R + 1
    blocks: _Blocks  # where the kernels find each head's fields (`head_blocks`)
    beta_cap: float  # soft caps of beta and of gamma - 1 (`layout.soft_cap`; 0: none)
    gamma_cap: float


class _Rows(NamedTuple):
    """A permutation of a tensor's rows and its inverse."""

    perm: Tensor
    inverse: Tensor

    @classmethod
    def of(cls, perm: Tensor) -> _Rows:
        return cls(perm, torch.argsort(perm))

    def __call__(self, x: Tensor) -> Tensor:
        """``x[perm]``, differentiably."""
        return _PermuteRows.apply(x, self)


class _PermuteRows(torch.autograd.Function):
    """``x[perm]`` for a permutation of x's rows, a gather both ways (its gradient is the inverse
    permutation's gather), where indexing's backward scatters with accumulation (slower at
    batch 1)."""

    @staticmethod
    def forward(ctx, x: Tensor, rows: _Rows) -> Tensor:
        ctx.inverse = rows.inverse
        return x.index_select(0, rows.perm)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad.index_select(0, ctx.inverse), None


class _Plan(NamedTuple):
    """What the engine needs of a model's shape: the static config and the row permutations."""

    cfg: _Config
    head_rows: _Rows  # rows of the head layer in `_BLOCKS` order


_PLANS: dict = {}


def _plan(model: nn.Module, device: torch.device) -> _Plan:
    """The `_Plan` of ``model`` on ``device``, cached on its options."""
    opt = model.options
    key = (tuple(vars(opt).values()), str(device))
    plan = _PLANS.get(key)
    if plan is None:
        blocks = head_blocks(model.head_layout)
        c = opt.controller_size
        beta_cap, gamma_cap = opt.caps
        cfg = _Config(lstm=opt.controller == "lstm", layers=opt.controller_layers, hidden=c,
                      read_heads=opt.read_heads, write_heads=opt.write_heads,
                      width=opt.memory_width, shifts=2 * opt.shift_range + 1, blocks=blocks,
                      beta_cap=beta_cap, gamma_cap=gamma_cap)
        plan = _Plan(cfg, _Rows.of(blocks.perm.to(device)))
        _PLANS[key] = plan
    return plan


def _parameters(plan: _Plan, model: nn.Module, x: Tensor):
    """The weights in the kernels' layout (differentiably, contiguous), and ``xpre [T, B, G]``,
    layer 0's input projection of every step (bias included)."""
    cfg = plan.cfg
    n_in = model.input_size
    weights, biases = [], []
    if cfg.lstm:
        for layer, cell in enumerate(model.controller.cells):
            w_ih, w_hh, bias = cell.weight_ih, cell.weight_hh, cell.bias_ih + cell.bias_hh
            if layer == 0:
                xpre = F.linear(x, w_ih[:, :n_in], bias)
                weights.append(torch.cat([w_ih[:, n_in:], w_hh], dim=1))
            else:
                weights.append(torch.cat([w_ih, w_hh], dim=1))
                biases.append(bias)
    else:
        for layer, lin in enumerate(model.controller.layers):
            if layer == 0:
                xpre = F.linear(x, lin.weight[:, :n_in], lin.bias)
                weights.append(lin.weight[:, n_in:].contiguous())
            else:
                weights.append(lin.weight)
                biases.append(lin.bias)
    heads = plan.head_rows
    wp, bp = heads(model.head_params.weight), heads(model.head_params.bias)
    return xpre, weights, biases, wp, bp


def _call(cfg: _Config, tiny: float, steps: int, batch: int, rows: int, keep: bool) -> NTMCall:
    blocks = cfg.blocks
    return NTMCall(steps, batch, cfg.layers, cfg.hidden, cfg.read_heads, cfg.write_heads,
                   cfg.width, rows, cfg.shifts, int(cfg.lstm), int(keep), blocks.block_end,
                   blocks.field_start, blocks.field_width, cfg.beta_cap, cfg.gamma_cap, tiny)


def _run_forward(cfg, tiny, xpre, weights, biases, wp, bp, memory, w_read, w_write, reads, h0,
                 c0, keep: bool):
    """All steps; the state tensors as `_Driver.forward` takes them (memory
    ``[B, M, N]``, ``h0, c0 [L, B, C]`` or empty): the call and its buffers (`NTMCall.buffers`),
    filled."""
    steps, batch = xpre.shape[:2]
    call = _call(cfg, tiny, steps, batch, memory.shape[2], keep)
    buf = library.allocate(call, xpre)
    with torch.no_grad():
        if cfg.lstm:
            buf.h[0].copy_(h0)
            buf.cell[0].copy_(c0)
        buf.mem[0].copy_(memory)
        buf.msq[0].copy_(memory.square().sum(1))
        buf.wr[0].copy_(w_read)
        buf.ww[0].copy_(w_write)
    library.call("torch_ntm_forward", xpre.dtype, call, library.arguments(
        call, "forward", dict(xpre=xpre, wp=wp, bp=bp, reads0=reads), buf, (weights, biases)))
    return call, buf


class _Driver(NamedTuple):
    """The recurrent part of `NTM.forward` over a whole sequence by the native library, for
    `torch_ntm.engines.driver.NativeSequence`.

    Inputs: ``xpre [T, B, G]``, ``wp``, ``bp``, the initial state ``memory [B, M, N]``
    (transposed), ``w_read, w_write, reads``, then ``L`` weights, ``L - 1`` biases and, for an
    LSTM, ``L`` initial h and ``L`` initial c. Outputs: ``hs [T, B, C]``, ``reads [T, B, Hr,
    M]``, the final ``memory, w_read, w_write`` and, for an LSTM, final ``h, c [L, B, C]``.
    """

    cfg: _Config
    tiny: float

    def forward(self, xpre, wp, bp, memory, w_read, w_write, reads, *rest):
        cfg, n = self.cfg, self.cfg.layers
        weights, biases = list(rest[:n]), list(rest[n : 2 * n - 1])
        h0, c0 = _initial_controller(cfg, rest[2 * n - 1 :], memory)
        call, buf = _run_forward(cfg, self.tiny, xpre, weights, biases, wp, bp, memory, w_read,
                                 w_write, reads, h0, c0, keep=True)
        out = [buf.hs, buf.reads, buf.mem[-1], buf.wr[-1], buf.ww[-1]]
        if cfg.lstm:
            out += [buf.h[-1], buf.cell[-1]]
        # no output is a view of what backward keeps
        return call, buf, (wp, *weights), tuple(t.clone() for t in out), ()

    def backward(self, call, buf, kept, grads):
        cfg, n = self.cfg, self.cfg.layers
        (wp, *weights), (dhs, dreads, dmem, dwr, dww, *dhc) = kept, grads
        dh_last, dc_last = dhc if dhc else (None, None)
        steps, batch = buf.hs.shape[:2]
        grads = dict(
            dhs=torch.zeros_like(buf.hs) if dhs is None else dhs.contiguous(),
            dreads=torch.zeros_like(buf.reads) if dreads is None else dreads.contiguous(),
            dmem=carried(dmem, buf.mem[-1]), dwr=carried(dwr, buf.wr[-1]),
            dww=carried(dww, buf.ww[-1]), dreads0=torch.zeros_like(buf.reads[0]),
            dh=carried(dh_last, buf.h[-1][: n * cfg.lstm]), dc=carried(dc_last, buf.cell[-1]),
            draw=wp.new_empty(steps, batch, wp.shape[0]))
        dpres = [wp.new_empty(steps, batch, w.shape[0]) for w in weights]
        library.call("torch_ntm_backward", wp.dtype, call, library.arguments(
            call, "backward", dict(wp=wp, **grads), buf, (weights, dpres)))
        draw, dh0, dc0 = grads["draw"], grads["dh"], grads["dc"]
        # Weight gradients: one matmul over all T*B rows each.
        dwp = draw.flatten(0, 1).t() @ buf.hs.flatten(0, 1)
        dweights = [d.flatten(0, 1).t() @ z.flatten(0, 1) for d, z in zip(dpres, buf.z)]
        dbiases = [d.sum((0, 1)) for d in dpres[1:]]
        controller = (*dh0.unbind(0), *dc0.unbind(0)) if cfg.lstm else ()
        return (dpres[0], dwp, draw.sum((0, 1)), grads["dmem"], grads["dwr"], grads["dww"],
                grads["dreads0"], *dweights, *dbiases, *controller)


def _initial_controller(cfg: _Config, hc: tuple, like: Tensor) -> tuple[Tensor, Tensor]:
    """The LSTM's initial ``h, c [L, B, C]`` from their per-layer list; empty for feed-forward."""
    if cfg.lstm:
        n = cfg.layers
        return torch.stack(hc[:n]).detach(), torch.stack(hc[n:]).detach()
    empty = like.new_zeros(0, like.shape[0], cfg.hidden)
    return empty, empty


# A batch whose memories together take more than this many bytes runs in chunks of at most
# `_CHUNK_BYTES` of memory each, one library call each (`_chunks`).
_SPLIT_BYTES = 4 << 20
_CHUNK_BYTES = 3 << 19


def _chunks(batch: int, memory_bytes: int) -> list[slice]:
    """The batch in equal chunks whose memories take at most `_CHUNK_BYTES` each, or whole
    where all of them take at most `_SPLIT_BYTES`. A step walks every batch element's memory
    (and writes the next): when that no longer stays in cache from one step to the next, the
    batch runs faster in pieces (docs/speed.md has the measurements that set the sizes)."""
    if batch * memory_bytes <= _SPLIT_BYTES:
        return [slice(0, batch)]
    pieces = -(-batch // max(1, _CHUNK_BYTES // memory_bytes))
    size = -(-batch // pieces)
    return [slice(b, min(b + size, batch)) for b in range(0, batch, size)]


def _sequence(cfg: _Config, tiny: float, own, xpre, wp, bp, memory, w_read, w_write, reads,
              weights, biases, h0, c0) -> tuple:
    """One library call over a batch: ``(hs, reads, memory, w_read, w_write, *controller)``,
    differentiable where gradients are enabled and some input requires them (``own()``: the
    `OwnSteps` a second derivative runs)."""
    inputs = (xpre, wp, bp, memory, w_read, w_write, reads, *weights, *biases, *h0, *c0)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return driver.differentiable(_Driver(cfg, tiny), own, *inputs)
    h, c = _initial_controller(cfg, (*h0, *c0), memory)
    _, buf = _run_forward(cfg, tiny, xpre, weights, biases, wp, bp, memory, w_read, w_write,
                          reads, h, c, keep=False)
    last = xpre.shape[0] % 2  # two slots of state: the final one in slot T % 2
    controller = (buf.h[last], buf.cell[last]) if cfg.lstm else ()
    return (buf.hs, buf.reads, buf.mem[last], buf.wr[last], buf.ww[last], *controller)


def _own_steps(model: nn.Module, x: Tensor, state: NTMState, part: slice) -> OwnSteps:
    """What a second derivative of the batch's elements ``part`` runs (`OwnSteps`): made only
    for a differentiable call (`_sequence`), and for the whole batch without slicing it."""
    if part != slice(0, x.shape[1]):
        x, state = x[:, part], NTMState(
            tuple(t[:, part] for t in state.controller), state.memory[part],
            state.read_weights[part], state.write_weights[part], state.reads[part])
    return OwnSteps(model, x, state, _outputs)


def _outputs(hs: Tensor, reads: Tensor, final: NTMState) -> list:
    """`_Driver`'s outputs from the model's own steps (`OwnSteps`)."""
    return [hs, reads, final.memory.transpose(1, 2), final.read_weights, final.write_weights,
            *final.controller]


def forward(model: nn.Module, x: Tensor, state: NTMState) -> tuple[Tensor, NTMState]:
    """``model(x, state)`` by the native engine, time-major: ``x [T, B, input_size]`` (checked
    by the model) -> ``(logits [T, B, output_size], final state)``. Inputs are made contiguous
    here, once, as the library reads them by address. The first call in a process also calls
    `keep_freed_memory` unless ``TORCH_NTM_KEEP_FREED_MEMORY=0``."""
    library.keep_freed_memory_once()
    plan = _plan(model, x.device)
    cfg = plan.cfg
    xpre, weights, biases, wp, bp = _parameters(plan, model, x)
    wp, bp = wp.contiguous(), bp.contiguous()
    weights, biases = [w.contiguous() for w in weights], [b.contiguous() for b in biases]
    tiny = torch.finfo(x.dtype).tiny
    memory = state.memory.transpose(1, 2)  # [B, M, N]: a row's M entries strided by N
    pieces = []
    for part in _chunks(x.shape[1], memory[0].numel() * memory.element_size()):
        h0 = list(state.controller[0][:, part].unbind(0)) if cfg.lstm else []
        c0 = list(state.controller[1][:, part].unbind(0)) if cfg.lstm else []
        pieces.append(_sequence(
            cfg, tiny, functools.partial(_own_steps, model, x, state, part),
            xpre[:, part].contiguous(), wp, bp, memory[part],
            state.read_weights[part], state.write_weights[part],
            state.reads[part].contiguous(), weights, biases, h0, c0))
    if len(pieces) == 1:
        out = pieces[0]
    else:  # batch is dim 1 of the steps' outputs and the controller's state, else dim 0
        dims = (1, 1, 0, 0, 0, 1, 1)
        out = [torch.cat(parts, dim) for parts, dim in zip(zip(*pieces), dims)]
    hs, reads, memory, w_read, w_write = out[:5]
    logits = model.output(torch.cat([hs, reads.flatten(2)], dim=-1))
    return logits, NTMState(tuple(out[5:]), memory.transpose(1, 2), w_read, w_write, reads[-1])
