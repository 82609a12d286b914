"""The one `autograd.Function` of the native engines: a model's whole sequence as one autograd
node, whose forward and backward are one library call each.

A model's engine gives a driver (`Driver`): what its kernels take, how they are called forward
with every step's state kept, and how the backward call's results become the gradients of what
they took. This module does the rest for every model: the node (`NativeSequence`), what it saves for
the backward (the driver's tensors and the call's buffers, `torch_ntm.engines.library.flat`),
and the second derivative, which runs the model's own steps on the model's own inputs
(`torch_ntm.engines.common.OwnSteps`, taken last).
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
from torch import Tensor

from torch_ntm.engines import library
from torch_ntm.engines.common import OwnSteps, first_order_only

__all__ = ["Driver", "NativeSequence", "differentiable"]


class Driver(Protocol):
    """What a model's engine gives `NativeSequence`."""

    def forward(self, *inputs: Tensor) -> tuple:
        """All steps from ``inputs`` (what the kernels take), every step's state kept for the
        backward: ``(call, buffers, kept, outputs, fixed)``, the call's description and its
        filled buffers (`library.allocate`), the tensors the backward needs besides the buffers,
        the outputs (none a view of what is kept) and those of them with no gradient."""

    def backward(self, call, buffers, kept: tuple, grads: tuple) -> tuple:
        """The gradients of ``forward``'s inputs from those of its outputs (``grads``, None
        where autograd gives none), by the backward call on the forward's ``buffers``."""


class NativeSequence(torch.autograd.Function):
    """A native sequence: ``driver``'s kernels on ``inputs``, then, last, ``own.inputs``,
    through which alone a second derivative reaches the model (`first_order_only`)."""

    @staticmethod
    def forward(ctx, driver: Driver, own: OwnSteps, *inputs: Tensor):
        inputs = inputs[: len(inputs) - len(own.inputs)]
        call, buffers, kept, outputs, fixed = driver.forward(*inputs)
        ctx.driver, ctx.call, ctx.kept = driver, call, len(kept)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*kept, *library.flat(buffers))
        # For a second derivative (`first_order_only`): the model's own steps.
        ctx.recompute, ctx.inputs, ctx.leading = own, own.inputs, 2 + len(inputs)
        ctx.mark_non_differentiable(*fixed)
        return outputs

    @staticmethod
    @first_order_only
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        buffers = library.unflat(ctx.call, saved[ctx.kept:])
        return (None, None, *ctx.driver.backward(ctx.call, buffers, saved[: ctx.kept], grads))


def differentiable(driver: Driver, own: Callable, *inputs: Tensor) -> tuple:
    """`NativeSequence` on ``inputs``, ``own()`` giving the model's own (`OwnSteps`)."""
    own = own()
    return NativeSequence.apply(driver, own, *inputs, *own.inputs)
