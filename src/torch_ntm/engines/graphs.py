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

What the engine guarantees about a capture:

- It does not depend on what ran before: it differentiates fresh leaves on the parameters'
  storage, not the parameters, so an earlier eager pass whose graph is still alive (a ``loss``
  kept for logging), a fused or foreach optimizer, a model moved between devices or given new
  parameters change nothing.
- No step synchronises with the host (tests/test_sync_ops.py checks every model's step on the
  CPU), and the first of the passes before a capture runs under
  ``torch.cuda.set_sync_debug_mode("error")``: an op that would synchronise fails there, before
  any capture began.
- A capture that fails anyway leaves the process as it was: the caller's stream current, the
  graph's memory pool released, the CUDA generator out of capture mode with the state it had
  (so the next ``torch.randn`` gives what it would have given), said once (logger
  ``torch_ntm.engines``); that shape (bucket, batch size, dtype, device) runs eager from then
  on, and ``runs_on`` says so.

The backward is a replay, which autograd cannot differentiate: under ``create_graph=True`` (a
second derivative may follow) it is computed again through the eager loop instead
(`common.first_order_only`), as for the native engine.
"""

from __future__ import annotations

import contextlib
import gc
import math
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from torch_ntm.engines import common

__all__ = ["BUCKET_SIZES", "CaptureError", "bucket", "masked_loop", "forward", "why_not"]

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
    """Why the graphs engine cannot run ``model`` on ``x`` (time-major), or None if it can (as
    far as is known before a capture: a shape whose capture failed is known after it)."""
    failed = _FAILED.get(model, {}).get(_shape(x)) if x.dim() == 3 and x.shape[0] else None
    if failed is not None:
        return _failed_reason(bucket(x.shape[0]), x, failed)
    if x.device.type != common.DEVICES["graphs"]:
        return f"the graphs engine runs on a CUDA GPU, not {x.device.type}"
    if common.eager_only():
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


class CaptureError(RuntimeError):
    """A sequence that the graphs engine could not capture (the process is left as it was)."""


def _capture(fn, inputs: list[Tensor], params: list[Tensor], grad: bool) -> _Graphs:
    """``fn(*inputs, *weights) -> list of outputs`` (``weights`` standing for ``params``)
    captured as a forward graph and, if ``grad``, the backward of its outputs with respect to
    the inputs that require a gradient and the weights.

    The capture is isolated from whatever ran before it: it differentiates fresh leaves that
    share the parameters' storage (a replay reads the parameters' current values), not the
    parameters themselves, so that no autograd node of an earlier graph still alive (a ``loss``
    kept for logging) takes part. Before it, two passes run on a side stream (allocations and
    lazy initialisation happen outside the capture, as CUDA graphs require), the first with
    `torch.cuda.set_sync_debug_mode` at ``"error"``: an op that synchronises fails there, before
    any capture began.

    Raises:
        CaptureError: naming why; the process is then as it was (`_captured`).
    """
    static = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    weights = [p.detach().requires_grad_(grad) for p in params]
    wrt = [t for t in static if t.requires_grad] + weights if grad else []

    def backward(outputs: list[Tensor], grad_outputs: list[Tensor | None]):
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if g is not None]
        return torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                   allow_unused=True)

    side = _stream("rehearsal")
    side.wait_stream(torch.cuda.current_stream())
    mode = torch.cuda.get_sync_debug_mode()
    try:
        with torch.cuda.stream(side), torch.set_grad_enabled(grad):
            for rehearsal in range(2):
                torch.cuda.set_sync_debug_mode("error" if rehearsal == 0 else mode)
                outputs = fn(*static, *weights)
                if grad:
                    backward(outputs, [torch.ones_like(o) if o.requires_grad else None
                                       for o in outputs])
    except RuntimeError as e:  # before any capture: nothing to undo
        # (a synchronising op says "called a synchronizing CUDA operation")
        raise CaptureError(f"{type(e).__name__} before the capture: {e}".splitlines()[0]) \
            from None
    finally:
        torch.cuda.set_sync_debug_mode(mode)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    del outputs
    pool = torch.cuda.graph_pool_handle()
    graphs = _Graphs(static, [], torch.cuda.CUDAGraph())
    with _captured(graphs.forward, pool), torch.set_grad_enabled(grad):
        graphs.outputs = fn(*static, *weights)
    if grad:
        graphs.grad_outputs = [torch.zeros_like(o) if o.requires_grad else None
                               for o in graphs.outputs]
        graphs.backward = torch.cuda.CUDAGraph()
        with _captured(graphs.backward, pool):
            graphs.grads = list(backward(graphs.outputs, graphs.grad_outputs))
    return graphs


@contextlib.contextmanager
def _captured(graph: torch.cuda.CUDAGraph, pool):
    """Captures what runs inside into ``graph`` on a stream of its own, or, if that fails,
    raises `CaptureError` with the process as it was before: the caller's stream current again,
    the graph's memory pool released, and the CUDA generator out of capture mode and at the
    state it had (torch leaves it in capture mode after a capture that did not end, and every
    later random number on the device then fails), so that the eager engine and the user's next
    line run as if no capture had been tried."""
    device = torch.cuda.current_device()
    rng = torch.cuda.get_rng_state(device)
    begun = ended = False
    try:
        with torch.cuda.stream(_stream("capture")):
            graph.capture_begin(pool=pool)
            begun = True
            try:
                yield
            finally:
                graph.capture_end()
                ended = True
    except Exception as e:
        why = f"{type(e).__name__}: {e}".splitlines()[0]
    else:
        return
    if begun and not ended:
        # A graph whose capture did not end neither stops recording into its memory pool nor
        # releases it when deleted (torch does both only for a capture that ended).
        for name in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
            with contextlib.suppress(RuntimeError, AttributeError):  # what torch did already
                getattr(torch._C, name)(device, pool)
    _end_generator_capture(device)
    torch.cuda.set_rng_state(rng, device)
    raise CaptureError(why)


_STREAMS: dict = {}


def _stream(use: str) -> torch.cuda.Stream:
    """The current device's side stream for ``use`` ("rehearsal" or "capture"), one each,
    made once: each new stream that runs a matmul gets a cuBLAS workspace that torch keeps."""
    key = (torch.cuda.current_device(), use)
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream()
    return _STREAMS[key]


def _end_generator_capture(device: int) -> None:
    """Takes the default CUDA generator out of capture mode with a capture that ends (one
    kernel, no random number), after a capture that did not."""
    scratch = torch.zeros(1, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(_stream("capture")):
        graph.capture_begin()
        scratch.add_(1.0)
        graph.capture_end()
    del graph
    torch.cuda.synchronize(device)


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
    @common.first_order_only
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


# Each model's graphs by key (beside the model, not in it: a deep copy of the model, such as
# weight averaging makes, copies no graph).
_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Each model's shapes whose capture failed (`_shape`), with why: they run eager from then on.
_FAILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _shape(x: Tensor) -> tuple:
    """What a failed capture is remembered by: bucket, batch size, dtype and device of a
    time-major input."""
    return bucket(x.shape[0]), x.shape[1], x.dtype, x.device


def _failed_reason(size: int, x: Tensor, why: str) -> str:
    return (f"the graphs engine could not capture a sequence of {size} steps at batch "
            f"{x.shape[1]} in {x.dtype} ({why}); that shape runs eager")


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

    def sequence(xs: Tensor, mask: Tensor, *rest: Tensor) -> list[Tensor]:
        """`run` with the parameters given (``rest``: the state's leaves, then a tensor for
        each of ``params``): what the graphs capture (with fresh leaves on the parameters'
        storage, `_capture`), and what a second derivative recomputes (`first_order_only`,
        with the aliases passed below, through which alone the Function's gradients reach the
        parameters; the state's leaves may depend on them too, outside)."""
        flat, weights = rest[: len(leaves)], rest[len(leaves):]
        return torch.func.functional_call(
            common.ModelFunction(model, run),
            {f"model.{name}": w for (name, _), w in zip(named, weights)}, (xs, mask, *flat))

    key = (size, B, x.dtype, x.device, grad, model.training, str(spec),
           tuple(t.requires_grad for t in leaves), tuple(p.data_ptr() for p in params))
    cache = _GRAPHS.setdefault(model, {})
    if key not in cache:
        for old in [k for k in cache if k[-1] != key[-1]]:  # parameters moved: stale graphs
            del cache[old]
        try:
            cache[key] = _capture(sequence, [padded, active, *leaves], params, grad)
        except Exception as e:  # an op that cannot be captured, no memory for the graphs
            why = f"{type(e).__name__}: {e}" if not isinstance(e, CaptureError) else str(e)
            cache[key] = None
        if cache[key] is None:
            gc.collect()  # the failed capture's graphs and tensors, held by its traceback
            _FAILED.setdefault(model, {})[_shape(x)] = why
            common.say_eager(model, _failed_reason(size, x, why))
    graphs = cache[key]
    if graphs is None:
        y, final = masked_loop(step, x, torch.ones(T, dtype=torch.bool, device=x.device), state)
        return y, final
    aliases = [p.view_as(p) for p in params]
    out = _Replay.apply(graphs, sequence, padded, active, *leaves, *aliases)
    final = pytree.tree_unflatten(list(out[1:]), spec)
    return out[0][:T], final
