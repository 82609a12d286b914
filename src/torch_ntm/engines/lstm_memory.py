"""The native driver of the models whose controller is one LSTM layer reading ``[x_t,
reads_{t-1}]`` and whose memory step is one C++ kernel pair: the MANN's (``csrc/mann.cpp``) and the
DNC's (``csrc/dnc.cpp``).

What is one matmul over all steps stays under autograd: the LSTM's input side
(`_input_side`, by the library's batch-invariant matmul, as the
steps' are: a sequence gets the same bits alone as in any batch, so the models' sorted usages
cannot tie-break differently), the output layer, and, after the backward call, the weight
gradients of the recurrent and head layers. The steps between are one C++ call each way,
whose buffers the model's `Description` lists (`torch_ntm.engines.calls.Buffer`): allocated and
passed by `torch_ntm.engines.library`, read by the C++ it generates. A model's engine module
gives its `Spec` (which buffers carry its state, and how its state maps onto them) and its
``_Config`` (the call's static sizes). A second derivative differentiates the model's own steps
(`torch_ntm.engines.common.OwnSteps`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor

from torch_ntm.engines import driver, library
from torch_ntm.engines.common import OwnSteps, carried

__all__ = ["Spec", "controller_inputs", "run", "sequence"]


class Spec(NamedTuple):
    """What differs between the models the driver runs."""

    entry: str  # the kernels: torch_ntm_{entry}_forward and torch_ntm_{entry}_backward
    # The buffers of the state the steps carry, in the order the sequence takes and returns
    # them (between the LSTM's cell and the reads); each one's gradient is "d" + its name.
    state: tuple[str, ...]
    # The model's state (its own `State`) -> its tensors of those buffers, in their order and
    # the buffers' layout (the steps' state and the final one).
    kernel: Callable
    # Those of them with no gradient (a step function of the others): not differentiable as
    # outputs; the kernel writes their initial value's gradient into a fresh buffer.
    fixed: frozenset = frozenset()
    # (buffers, keep) -> the forward's addresses beyond the inputs, once the initial state is in
    # slot 0 of the buffers; None: none.
    extras: Callable | None = None


def _run_forward(spec: Spec, cfg, xpre, wih, whh, wp, bp, h0, c0, state, reads, keep: bool):
    """All steps from the initial state (in the buffers' layout): the call and its buffers,
    filled."""
    steps, batch = xpre.shape[:2]
    call = cfg.call(steps, batch, keep)
    buf = library.allocate(call, xpre)
    with torch.no_grad():
        buf.cell[0].copy_(c0)
        for name, value in zip(spec.state, state):
            getattr(buf, name)[0].copy_(value)
        extra = spec.extras(buf, keep) if spec.extras else {}
    library.call(f"torch_ntm_{spec.entry}_forward", xpre.dtype, call, library.arguments(
        call, "forward", dict(xpre=xpre, wih=wih, whh=whh, wp=wp, bp=bp, h0=h0, reads0=reads,
                              **extra), buf))
    return call, buf


class _Driver(NamedTuple):
    """The steps after the LSTM's input side, before the output layer, for
    `torch_ntm.engines.driver.NativeSequence`: from ``xpre [T, B, 4C]`` (the input side, biases
    included), the LSTM cell's weights as it holds them (``wih [4C, X + R W]``, whose last R W
    columns read the reads, ``whh [4C, C]``; gates i, f, g, o), the head layer (``wp``,
    ``bp``), the initial ``h0, c0 [B, C]``, the state (`Spec.state`) and the reads ``[B, R,
    W]``, to ``(hs [T, B, C], reads [T, B, R, W], c, *state)`` after the last step."""

    spec: Spec
    cfg: object  # the engine's call sizes

    def forward(self, xpre, wih, whh, wp, bp, h0, c0, *rest):
        spec = self.spec
        call, buf = _run_forward(spec, self.cfg, xpre, wih, whh, wp, bp, h0, c0, rest[:-1],
                                 rest[-1], keep=True)
        final = [getattr(buf, name)[-1].clone() for name in spec.state]
        fixed = [t for name, t in zip(spec.state, final) if name in spec.fixed]
        # hs and reads are returned as they are (saved, not views); the rest are copies
        return (call, buf, (wih, whh, wp), (buf.hs, buf.reads, buf.cell[-1].clone(), *final),
                fixed)

    def backward(self, call, buf, kept, grads):
        spec, cfg = self.spec, self.cfg
        (wih, whh, wp), (dhs, dreads, dc, *dstate) = kept, grads
        steps, batch = buf.hs.shape[:2]
        grads = dict(
            dhs=torch.zeros_like(buf.hs) if dhs is None else dhs.contiguous(),
            dreads=torch.zeros_like(buf.reads) if dreads is None else dreads.contiguous(),
            dreads0=torch.zeros_like(buf.reads[0]), dh=torch.zeros_like(buf.hs[0]),
            dc=carried(dc, buf.cell[0]), dgates=wp.new_empty(steps, batch, 4 * cfg.controller),
            draw=wp.new_empty(steps, batch, wp.shape[0]))
        for name, grad in zip(spec.state, dstate):
            first = getattr(buf, name)[0]
            grads["d" + name] = (torch.empty_like(first) if name in spec.fixed
                                 else carried(grad, first))
        library.call(f"torch_ntm_{spec.entry}_backward", wp.dtype, call,
                     library.arguments(call, "backward", dict(wih=wih, whh=whh, wp=wp, **grads),
                                       buf))
        dgates, draw = grads["dgates"], grads["draw"]
        # Weight gradients: one matmul over all T B rows each; the input side's columns of wih
        # have theirs from its own node (`_input_side`).
        dwrh = dgates.flatten(0, 1).t() @ buf.z.flatten(0, 1)
        reads = wih.shape[1] - cfg.inputs
        dwih = wih.new_zeros(wih.shape)
        dwih[:, cfg.inputs:] = dwrh[:, :reads]
        dwp = draw.flatten(0, 1).t() @ buf.hs.flatten(0, 1)
        return (dgates, dwih, dwrh[:, reads:], dwp, draw.sum((0, 1)), grads["dh"], grads["dc"],
                *(grads["d" + name] for name in spec.state), grads["dreads0"])


def sequence(spec: Spec, cfg, own: Callable, xpre: Tensor, wih: Tensor, whh: Tensor, wp: Tensor,
             bp: Tensor, h0: Tensor, c0: Tensor, state: tuple, reads: Tensor) -> tuple:
    """The steps (`_Driver`'s function; every input contiguous, the state in the buffers'
    layout): ``(hs, reads, c, final state)``, differentiable where gradients are enabled and an
    input requires them (``own()``: the `OwnSteps` a second derivative runs); else a forward
    that keeps two slots of state instead of every step's."""
    inputs = (xpre, wih, whh, wp, bp, h0, c0, *state, reads)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        hs, all_reads, c, *final = driver.differentiable(_Driver(spec, cfg), own, *inputs)
        return hs, all_reads, c, final
    _, buf = _run_forward(spec, cfg, xpre, wih, whh, wp, bp, h0, c0, state, reads, keep=False)
    last = xpre.shape[0] % 2  # two slots of state: the final one in slot T % 2
    return (buf.hs, buf.reads, buf.cell[last],
            [getattr(buf, name)[last] for name in spec.state])


def controller_inputs(model: torch.nn.Module) -> int:
    """X, the width of what ``model``'s one-layer LSTM controller reads besides its read heads'
    reads (the columns of its ``weight_ih`` before theirs)."""
    reads = model.read_heads * model.memory_width
    return model.controller.cells[0].weight_ih.shape[1] - reads


def _input_side(name: str, model: torch.nn.Module, x: Tensor) -> Tensor:
    """The input side of every step of ``model``'s one-layer LSTM controller, which reads
    ``[x_t, reads_{t-1}]``: ``xpre [T, B, 4C]`` (biases included), in one matmul (library
    ``name``'s batch-invariant one, `_linear_rows`) under autograd. ``x`` is what the
    controller reads of the steps (a MANN's `encode` of its input). The kernels read the rest of
    the cell's weights where it holds them, in its gates' order."""
    cell = model.controller.cells[0]
    xpre = _linear_rows(name, x, cell.weight_ih[:, :x.shape[-1]], cell.bias_ih + cell.bias_hh)
    return xpre.contiguous()


def _linear_rows(name: str, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``F.linear`` over the rows of ``x [..., k]`` by library ``name``'s batch-invariant matmul
    (`library.linear_rows`): each row's result the same bits whatever the batch, as the steps'
    matmuls are; differentiable where gradients are enabled and an input requires them
    (`_LinearRows`)."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or bias.requires_grad):
        return _LinearRows.apply(name, x, weight, bias)
    rows = library.linear_rows(name, x.reshape(-1, x.shape[-1]).contiguous(), weight, bias)
    return rows.view(*x.shape[:-1], weight.shape[0])


class _LinearRows(torch.autograd.Function):
    """`_linear_rows` under autograd: its gradients are torch's matmuls."""

    @staticmethod
    def forward(ctx, name: str, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        ctx.save_for_backward(x, weight)
        with torch.no_grad():
            return _linear_rows(name, x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        dx = grad @ weight if ctx.needs_input_grad[1] else None
        dweight = (grad.flatten(0, -2).t() @ x.flatten(0, -2) if ctx.needs_input_grad[2]
                   else None)
        dbias = grad.flatten(0, -2).sum(0) if ctx.needs_input_grad[3] else None
        return None, dx, dweight, dbias


def run(spec: Spec, cfg, model: torch.nn.Module, x: Tensor, state,
        read: Tensor | None = None) -> tuple:
    """A model's sequence by the driver: the steps (`sequence`) from its LSTM controller's input
    side, its head layer and ``state``'s controller and reads, then its output layer.

    Args:
        spec, cfg: the model's engine's `Spec` and call sizes.
        model: the MANN or DNC.
        x: ``[T, B, input_size]``, the model's input (time-major, checked).
        state: the model's state to start from (checked).
        read: what the controller reads of ``x`` where not ``x`` itself (a MANN's `encode`).

    Returns:
        ``(logits [T, B, output_size], the final (h, c), the final memory state as
        ``spec.kernel`` gives it, the final reads)``, differentiable where gradients are enabled
        (`sequence`).
    """
    library.keep_freed_memory_once()
    xpre = _input_side(spec.entry, model, x if read is None else read)
    cell = model.controller.cells[0]

    def outputs(hs: Tensor, reads: Tensor, final) -> list:  # `_Driver`'s, of its own steps
        return [hs, reads, final.controller[1][0], *spec.kernel(final)]

    hs, reads, c, final = sequence(
        spec, cfg, lambda: OwnSteps(model, x, state, outputs), xpre,
        cell.weight_ih.contiguous(), cell.weight_hh.contiguous(),
        model.head_params.weight.contiguous(), model.head_params.bias.contiguous(),
        state.controller[0][0].contiguous(), state.controller[1][0].contiguous(),
        tuple(t.contiguous() for t in spec.kernel(state)), state.reads.contiguous())
    logits = model.output(torch.cat([hs, reads.flatten(2)], -1))
    return logits, (hs[-1].unsqueeze(0), c.unsqueeze(0)), final, reads[-1]
