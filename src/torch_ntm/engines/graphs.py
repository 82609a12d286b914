"""The GPU engine: a whole sequence's forward and backward as two CUDA graphs.

On a GPU the eager loop is bound by launching kernels, not by arithmetic: a step of the copy
model is a few hundred small kernels, a sequence ~10^4, each launched from Python, so that a batch
of 1,024 takes about as long as a batch of 4,096. This engine runs the model's own eager step,
unrolled over the sequence, once under CUDA graph capture (the forward, and autograd's backward of
it), and from then on replays the two graphs: one launch each for the whole sequence. It computes
what the eager loop computes, with the same kernels, in the same order.

A graph has fixed shapes, so graphs are kept per *bucket* of sequence lengths (`bucket`: 8, 16,
24, 32, 48, 72, 112, ... steps): a sequence shorter than its bucket is padded with zero steps, and
a mask (`masked_loop`) makes each padded step keep the state as it was, so that the outputs of the
sequence's own steps, the final state and every gradient are the unpadded loop's exactly; the
padded steps' outputs are dropped. One pair of graphs serves one (bucket, batch size, dtype,
device, gradient mode) and the model's parameters where they are (a model moved or given new
parameter tensors is captured again); capturing costs a few eager passes over the sequence, once.
A capture that fails (an op that cannot be captured) is said once, and that shape runs eager.

The backward is a replay, which autograd cannot differentiate: under ``create_graph=True`` (a
second derivative may follow) it is computed again through the eager loop instead
(`engines.first_order_only`), as for the native engine.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from torch_ntm import engines

__all__ = ["BUCKET_SIZES", "bucket", "masked_loop", "forward", "why_not"]

# Bucket lengths: multiples of 8 up to 32, then growing by half (past 32 steps a bucket is at
# most 1.6 times the length it runs), so that the copy task's lengths (4 to 42 steps) take 5.
BUCKET_SIZES = (8, 16, 24, 32)


def bucket(length: int) -> int:
    """The number of steps of the graph that runs a sequence of ``length`` steps: the smallest of
    8, 16, 24, 32 and then each one and a half times the one before, rounded up to a multiple of
    8 (48, 72, 112, 168, 256, ...), that holds it."""
    if length < 1:
        raise ValueError(f"a sequence has at least one step, got {length}")
    for size in BUCKET_SIZES:
        if length <= size:
            return size
    size = BUCKET_SIZES[-1]
    while size < length:
        size = 8 * math.ceil(size * 1.5 / 8)
    return size


def masked_loop(step, x: Tensor, active: Tensor, state):
    """The eager loop over ``x [T, B, I]`` where step t counts only if ``active[t]`` (a bool
    tensor ``[T]``; steps past the sequence's end are inactive): an inactive step's state is the
    state before it (``torch.where``, so with the gradient of a kept state too). ``step(x_t,
    state) -> (y_t, state)`` is the model's eager step; ``state`` any pytree of tensors.

    Returns:
        ``(y [T, B, O], state after the last active step)``; an inactive step's output is what
        the step computed (to be dropped).
    """
    outputs = []
    for x_t, keep in zip(x, active):
        y, new = step(x_t, state)
        state = pytree.tree_map(lambda n, o, k=keep: torch.where(k, n, o), new, state)
        outputs.append(y)
    return torch.stack(outputs), state


def why_not(model: torch.nn.Module, x: Tensor) -> str | None:
    """Why the graphs engine cannot run ``model`` on ``x``, or None if it can."""
    if x.device.type != "cuda":
        return f"the graphs engine runs on a CUDA GPU, not {x.device.type}"
    if engines.eager_only():
        return "a torch.func transform or forward-mode AD is active"
    if torch.is_autocast_enabled(x.device.type):
        return "torch.autocast is enabled (a graph keeps the dtypes it was captured with)"
    if torch.cuda.is_current_stream_capturing():
        return "a CUDA graph is being captured around the call"
    if _hooked_inside(model):
        return "a module inside the model has hooks (a replay would not call them)"
    return None


def _hooked_inside(model: torch.nn.Module) -> bool:
    """Whether a module inside ``model`` has forward or backward hooks: the replay of a captured
    sequence calls none of its modules (the model's own hooks run around `forward` as ever)."""
    return any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
               or m._backward_pre_hooks for m in model.modules() if m is not model)


@dataclass
class _Graphs:
    """One bucket's captured forward and backward: static inputs copied in before a replay,
    static outputs read after it."""

    inputs: list[Tensor]  # x, active, then the state's leaves
    outputs: list[Tensor]  # y, then the final state's leaves
    forward: torch.cuda.CUDAGraph
    # The backward's: a gradient per output that has one (others: None), and the gradients of
    # the inputs that require one, then of the parameters (None where unused).
    grad_outputs: list[Tensor | None] | None = None
    grads: list[Tensor | None] | None = None
    backward: torch.cuda.CUDAGraph | None = None


def _capture(fn, inputs: list[Tensor], params: list[Tensor], grad: bool) -> _Graphs:
    """``fn(*inputs) -> list of outputs`` captured as a forward graph and, if ``grad``, the
    backward of its outputs with respect to the inputs that require a gradient and ``params``;
    after warm-up passes on a side stream (allocations and lazy initialisation happen outside
    the capture, as torch.cuda.graphs requires)."""
    static = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    wrt = [t for t in static if t.requires_grad] + params if grad else []

    def backward(outputs: list[Tensor], grad_outputs: list[Tensor | None]):
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if g is not None]
        return torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                   allow_unused=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.set_grad_enabled(grad):
        for _ in range(2):
            outputs = fn(*static)
            if grad:
                backward(outputs, [torch.ones_like(o) if o.requires_grad else None
                                   for o in outputs])
    torch.cuda.current_stream().wait_stream(side)
    pool = torch.cuda.graph_pool_handle()
    forward_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(forward_graph, pool=pool), torch.set_grad_enabled(grad):
        outputs = fn(*static)
    graphs = _Graphs(static, outputs, forward_graph)
    if grad:
        graphs.grad_outputs = [torch.zeros_like(o) if o.requires_grad else None for o in outputs]
        graphs.backward = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs.backward, pool=pool):
            graphs.grads = list(backward(outputs, graphs.grad_outputs))
    return graphs


class _Replay(torch.autograd.Function):
    """The captured sequence as one autograd node: forward and backward are replays."""

    @staticmethod
    def forward(ctx, graphs: _Graphs, recompute, *args: Tensor):
        n = len(graphs.inputs)
        for static, t in zip(graphs.inputs, args[:n]):
            static.copy_(t)
        graphs.forward.replay()
        ctx.graphs, ctx.n = graphs, n
        ctx.recompute, ctx.inputs, ctx.leading, ctx.engine = recompute, args, 2, "graphs"
        # copies: the next replay overwrites the static outputs
        return tuple(o.detach().clone() for o in graphs.outputs)

    @staticmethod
    @engines.first_order_only
    def backward(ctx, *grads: Tensor):
        graphs = ctx.graphs
        for static, g in zip(graphs.grad_outputs, grads):
            if static is None:  # an output without a gradient (an index, a one-hot choice)
                continue
            if g is None:
                static.zero_()
            else:
                static.copy_(g)
        graphs.backward.replay()
        found = iter(graphs.grads)
        needs = ctx.needs_input_grad[ctx.leading:]
        result = []
        for i, needed in enumerate(needs):
            # the captured gradients are of the inputs that required one, then the parameters
            differentiable = graphs.inputs[i].requires_grad if i < ctx.n else True
            g = next(found) if differentiable else None
            result.append(g.clone() if needed and g is not None else None)
        return (None, None, *result)


class _Sequence(torch.nn.Module):
    """A function of the model (``run(*args)``) as a module holding it, so that
    `torch.func.functional_call` can run it with other tensors for the model's parameters."""

    def __init__(self, model: torch.nn.Module, run) -> None:
        super().__init__()
        self.model, self.run = model, run

    def forward(self, *args: Tensor) -> list[Tensor]:
        return self.run(*args)


# Each model's graphs by key (beside the model, not in it: a deep copy of the model, such as
# weight averaging makes, copies no graph).
_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def forward(model: torch.nn.Module, x: Tensor, state, step):
    """``model``'s sequence ``x [T, B, I]`` (time-major, checked) from ``state`` on the graphs
    engine: ``step(x_t, state) -> (y_t, state)`` is the model's eager step, which the graphs run.

    Returns:
        ``(y [T, B, O], final state)``, as the eager loop's.
    """
    T, B = x.shape[:2]
    size = bucket(T)
    padded = torch.cat([x, x.new_zeros(size - T, *x.shape[1:])]) if size > T else x
    active = torch.arange(size, device=x.device) < T
    leaves, spec = pytree.tree_flatten(state)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    grad = torch.is_grad_enabled() and (bool(params) or any(t.requires_grad for t in leaves))

    def run(xs: Tensor, mask: Tensor, *flat: Tensor) -> list[Tensor]:
        y, final = masked_loop(step, xs, mask, pytree.tree_unflatten(list(flat), spec))
        return [y, *pytree.tree_leaves(final)]

    def recompute(xs: Tensor, mask: Tensor, *rest: Tensor) -> list[Tensor]:
        """`run` with the parameters given (for a second derivative, `first_order_only`): the
        aliases passed below, through which alone the Function's gradients reach the
        parameters (the state's leaves may depend on them too, outside)."""
        flat, weights = rest[: len(leaves)], rest[len(leaves):]
        return torch.func.functional_call(
            _Sequence(model, run), {f"model.{name}": w for (name, _), w in zip(named, weights)},
            (xs, mask, *flat))

    key = (size, B, x.dtype, x.device, grad, model.training, str(spec),
           tuple(t.requires_grad for t in leaves), tuple(p.data_ptr() for p in params))
    cache = _GRAPHS.setdefault(model, {})
    if key not in cache:
        for old in [k for k in cache if k[-1] != key[-1]]:  # parameters moved: stale graphs
            del cache[old]
        try:
            cache[key] = _capture(run, [padded, active, *leaves], params, grad)
        except Exception as e:  # an op that cannot be captured, no memory for the graphs
            engines.say_once(f"{type(model).__name__}: the graphs engine could not capture a "
                             f"sequence of {size} steps ({type(e).__name__}: {e}); that shape "
                             f"runs on the eager engine")
            cache[key] = None
    graphs = cache[key]
    if graphs is None:
        y, final = masked_loop(step, x, torch.ones(T, dtype=torch.bool, device=x.device), state)
        return y, final
    aliases = [p.view_as(p) for p in params]
    out = _Replay.apply(graphs, recompute, padded, active, *leaves, *aliases)
    final = pytree.tree_unflatten(list(out[1:]), spec)
    return out[0][:T], final
