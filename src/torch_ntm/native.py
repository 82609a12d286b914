"""The "native" engine: the whole sequence, forward and backward, as one C++ call each.

`torch_ntm.fast` runs a step as a few dozen tensor ops and loops over the steps in Python;
compiled, it still calls two graphs per step, with their guards. At the sizes NTMs train at, that
per-call cost, not arithmetic, is where the time goes. Here the time loop itself is C++
(``csrc/kernels.cpp``): the controller's and head layer's matmuls are BLAS calls over the batch,
and the rest of a step (activations, addressing, erase and add, reads, the LSTM's gates, and their
backward) is vectorised loops over each batch element's memory. torch allocates every buffer
(`_buffers`) and the C functions fill them; an `autograd.Function` with the inputs of
`fast._Sequence` wraps the two calls, so the input projection, the output layer and the weight
gradients (one matmul each over all steps) are the fast engine's.

The library is built on first use with `torch.utils.cpp_extension` (a C++ compiler and ninja,
which ``pip install ninja`` provides; one source file with no torch header but ATen's vector
type: 5-10 s on a 2-core CPU) and cached on disk (``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``): one build serves every batch size, memory size, sequence length
and float dtype. Where it cannot be built, or for another dtype, `NTM` runs the fast engine
instead, and on a GPU the compiled one, logging one line saying why.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from torch_ntm import fast
from torch_ntm.layout import NTMState

if TYPE_CHECKING:
    from torch_ntm.model import NTM

__all__ = ["available", "native_forward", "keep_freed_memory", "runs_as"]

_log = logging.getLogger(__name__)

_CSRC = Path(__file__).parent / "csrc"
_LIBRARY: dict = {}  # "lib": the ctypes library, or "error": why there is none
_DTYPES = {torch.float32: 0, torch.float64: 1}

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_FREED: dict = {}  # "asked": the native engine's first call has called `keep_freed_memory`


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 1 << 30) -> bool:
    """Let glibc's malloc keep and reuse freed blocks instead of returning them to the system.

    A training step allocates its buffers (the memories and addressing of every step, for the
    backward) afresh and frees them at the end. glibc serves blocks above its mmap threshold
    with ``mmap`` and gives them back with ``munmap``, and trims the heap's free top, so each
    step pays page faults and the zeroing of fresh pages: measured ~12% of a batch-64 bench's
    samples in the kernel's page-fault path. With both thresholds raised, freed blocks are reused:
    native training rates 1.1-1.3x at 128 rows and 1.3-1.9x at 1,024 rows on this 2-core CPU
    (`ntm bench`, 2026-11-25). The cost: up to ``trim_threshold`` bytes of freed memory stay with
    the process. ``ntm`` commands call this at start, and the native engine on its first call
    (`native_forward`) unless ``TORCH_NTM_KEEP_FREED_MEMORY=0`` is in the environment.

    Returns:
        True if both settings took (glibc), False where there is no glibc ``mallopt``.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold))


def _flags() -> list[str]:
    # omp simd pragmas only (no OpenMP runtime); errno is never read, and setting it would keep
    # the loops with a square root from vectorising.
    flags = ["-O3", "-fopenmp-simd", "-fno-math-errno"]
    # ATen's vector type takes the form of the CPU's best instruction set that torch's own kernels
    # use (torch.backends.cpu.get_cpu_capability(); ATEN_CPU_CAPABILITY=avx2 in the environment
    # lowers it), and SLEEF's exp, log and tanh of that width with it. AVX-512 against AVX2,
    # 2026-11-25 (docs/speed.md): 1.1-1.6x inference, ~1.1x training with 1,024 rows.
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512":
        flags += ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
                  "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"]
    elif capability == "AVX2":
        flags += ["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
    return flags


def _library():
    """The ctypes library, building it first if needed (once per process); None if it cannot
    be built, with the reason in ``_LIBRARY["error"]``."""
    if not _LIBRARY:
        try:
            from torch.utils import cpp_extension

            capability = torch.backends.cpu.get_cpu_capability().lower()
            path = cpp_extension.load(
                name=f"torch_ntm_native_{capability}", sources=[str(_CSRC / "kernels.cpp")],
                extra_cflags=_flags(), extra_include_paths=[str(_CSRC)],
                is_python_module=False, verbose=False)
            lib = ctypes.CDLL(path)
            for fn in (lib.torch_ntm_forward, lib.torch_ntm_backward):
                fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
                fn.restype = ctypes.c_int
            _LIBRARY["lib"] = lib
        except Exception as error:  # no compiler, no ninja, a failed build
            _LIBRARY["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[-1]}"
    return _LIBRARY.get("lib")


def available() -> bool:
    """Whether the native library is built and loaded (building it first if needed)."""
    return _library() is not None


class _Buffers(NamedTuple):
    """What the forward writes and the backward reads (csrc/sequence.h's `View`): every step's,
    or for inference two slots of state and one step of intermediates (``hs`` and ``reads``
    always every step's)."""

    h: Tensor  # [T+1, L, B, C] controller outputs per layer (slot 0: initial)
    c: Tensor  # [T+1, L, B, C] LSTM cells ([T+1, 0, B, C] feed-forward)
    msq: Tensor  # [T+1, B, N] squared row norms
    wr: Tensor  # [T+1, B, Hr, N]
    ww: Tensor  # [T+1, B, Hw, N]
    hs: Tensor  # [T, B, C] the top layer's output
    reads: Tensor  # [T, B, Hr, M]
    raw: Tensor  # [T, B, P] the head layer's output
    # The two largest, in blocks per slot or step (`_blocks`; csrc/sequence.h's View):
    mem: Tensor | tuple  # T+1 of [B, M, N] memory, transposed
    addr: Tensor | tuple  # T of [B, H, N] the heads' cosine similarities
    z: tuple  # per layer [T, B, in + C | in] the layer's matmul input
    act: tuple  # per layer [T, B, 4C] the LSTM's activated gates (i, f, o, g), or [T, B, C] h


_SINGLE = _Buffers._fields.index("mem")  # the buffers before the blocks: one tensor each


def _buffers(cfg: fast._Config, steps: int, batch: int, rows: int, like: Tensor, keep: bool):
    hr, hw, m, c, layers = cfg.read_heads, cfg.write_heads, cfg.width, cfg.hidden, cfg.layers
    slots, kept = (steps + 1, steps) if keep else (2, 1)
    shapes = [
        (slots, layers, batch, c), (slots, layers * cfg.lstm, batch, c), (slots, batch, rows),
        (slots, batch, hr, rows), (slots, batch, hw, rows), (steps, batch, c),
        (steps, batch, hr, m), (kept, batch, sum(cfg.blocks)),
        *((kept, batch, (hr * m if layer == 0 else c) + c * cfg.lstm) for layer in range(layers)),
        *((kept, batch, 4 * c if cfg.lstm else c) for _ in range(layers)),
    ]  # fmt: skip
    # All but the memories and addressing intermediates in one allocation, cut into views.
    sizes = [math.prod(shape) for shape in shapes]
    views = [v.view(shape) for v, shape in zip(like.new_empty(sum(sizes)).split(sizes), shapes)]
    z, act = tuple(views[_SINGLE : _SINGLE + layers]), tuple(views[_SINGLE + layers :])
    mem = _blocks(like, slots, (batch, m, rows))
    addr = _blocks(like, kept, (batch, hr + hw, rows))
    return _Buffers(*views[:_SINGLE], mem, addr, z, act)


def _blocks(like: Tensor, count: int, shape: tuple) -> tuple:
    """``count`` tensors of ``shape``: views of one allocation, or, from 1 MB each, separate
    tensors, which the heap reuses between calls (one allocation of them all would be mapped, and
    page-faulted, afresh on every call)."""
    if math.prod(shape) * like.element_size() < 1 << 20:
        return like.new_empty(count, *shape)
    return tuple(like.new_empty(shape) for _ in range(count))


def _saved(buf: _Buffers) -> list[Tensor]:
    """The buffers as a flat list of tensors, for `save_for_backward`."""
    blocks = [[b] if isinstance(b, Tensor) else list(b) for b in (buf.mem, buf.addr)]
    return [*buf[:_SINGLE], *blocks[0], *blocks[1], *buf.z, *buf.act]


def _unsaved(tensors: list[Tensor], layers: int, stacked: tuple[bool, bool]) -> _Buffers:
    """`_saved`'s inverse (the per-step blocks' count follows from the others' shapes)."""
    steps = tensors[_Buffers._fields.index("hs")].shape[0]
    rest, blocks = list(tensors[_SINGLE:]), []
    for is_tensor, count in zip(stacked, (steps + 1, steps)):
        n = 1 if is_tensor else count
        blocks.append(rest[0] if is_tensor else tuple(rest[:n]))
        rest = rest[n:]
    return _Buffers(*tensors[:_SINGLE], *blocks, tuple(rest[:layers]), tuple(rest[layers:]))


def _data(*tensors: Tensor) -> list[int]:
    """The data addresses of contiguous tensors of one dtype."""
    for t in tensors:
        assert t.is_contiguous() and t.dtype == tensors[0].dtype, (t.shape, t.dtype)
    return [t.data_ptr() for t in tensors]


def _pointers(buf: _Buffers) -> list[int]:
    """The addresses of the buffers in the order csrc/kernels.cpp's `take_view` reads them."""

    def blocks(b):  # one address per slot or step
        if isinstance(b, Tensor):
            size = b.stride(0) * b.element_size()
            return range(b.data_ptr(), b.data_ptr() + size * b.shape[0], size)
        return _data(*b)

    return [*_data(*buf[:_SINGLE]), *blocks(buf.mem), *blocks(buf.addr),
            *_data(*buf.z, *buf.act)]


def _sizes(cfg: fast._Config, steps: int, buf: _Buffers, keep: bool):
    batch, m, n = buf.mem[0].shape
    n_tanh, n_sig, n_sp, _ = cfg.blocks
    return [steps, batch, cfg.layers, cfg.hidden, cfg.read_heads, cfg.write_heads, m, n,
            cfg.shifts, n_tanh, n_sig, n_sp, int(cfg.lstm), int(keep)]


def _call(name: str, dtype: torch.dtype, sizes: list[int], reals: list[float],
          pointers: list[int]) -> None:
    sizes_c = (ctypes.c_int64 * len(sizes))(*sizes)
    reals_c = (ctypes.c_double * len(reals))(*reals)
    ptrs = (ctypes.c_void_p * len(pointers))(*pointers)
    if getattr(_library(), name)(_DTYPES[dtype], sizes_c, reals_c, ptrs) != 0:
        raise RuntimeError(f"torch_ntm native {name} failed")


def _run_forward(cfg, tiny, xpre, weights, biases, wp, bp, memory, w_read, w_write, reads, h0,
                 c0, keep: bool) -> _Buffers:
    """All steps; the state tensors as `_Sequence.forward` takes them (memory ``[B, M, N]``,
    ``h0, c0 [L, B, C]`` or empty)."""
    steps, batch = xpre.shape[:2]
    buf = _buffers(cfg, steps, batch, memory.shape[2], xpre, keep)
    with torch.no_grad():
        if cfg.lstm:
            buf.h[0].copy_(h0)
            buf.c[0].copy_(c0)
        buf.mem[0].copy_(memory)
        buf.msq[0].copy_(memory.square().sum(1))
        buf.wr[0].copy_(w_read)
        buf.ww[0].copy_(w_write)
    _call("torch_ntm_forward", xpre.dtype, _sizes(cfg, steps, buf, keep),
          [cfg.beta_cap, cfg.gamma_cap, tiny],
          [*_data(xpre, wp, bp, reads, *weights, *biases), *_pointers(buf)])
    return buf


class _NativeSequence(torch.autograd.Function):
    """`fast._Sequence` computed by the native library: same inputs, outputs and gradients."""

    @staticmethod
    def forward(ctx, cfg: fast._Config, tiny: float, xpre, wp, bp, memory, w_read, w_write,
                reads, *rest):
        n = cfg.layers
        weights, biases = list(rest[:n]), list(rest[n : 2 * n - 1])
        h0, c0 = _initial_controller(cfg, rest[2 * n - 1 :], memory)
        buf = _run_forward(cfg, tiny, xpre, weights, biases, wp, bp, memory, w_read, w_write,
                           reads, h0, c0, keep=True)
        ctx.set_materialize_grads(False)
        ctx.cfg, ctx.tiny = cfg, tiny
        ctx.stacked = (isinstance(buf.mem, Tensor), isinstance(buf.addr, Tensor))
        ctx.save_for_backward(wp, *weights, *_saved(buf))
        out = [buf.hs, buf.reads, buf.mem[-1], buf.wr[-1], buf.ww[-1]]
        if cfg.lstm:
            out += [buf.h[-1], buf.c[-1]]
        return tuple(t.clone() for t in out)  # no output is a view of what backward keeps

    @staticmethod
    @fast.first_order_only
    def backward(ctx, dhs_out, dreads_out, dmem, dwr, dww, dh_last=None, dc_last=None):
        cfg, n = ctx.cfg, ctx.cfg.layers
        wp, *rest = ctx.saved_tensors
        weights, buf = rest[:n], _unsaved(rest[n:], n, ctx.stacked)
        steps, batch = buf.hs.shape[:2]

        def carried(g, like):  # a fresh contiguous copy: the library updates it in place
            return torch.zeros_like(like) if g is None else g.clone(
                memory_format=torch.contiguous_format)

        grads = [
            torch.zeros_like(buf.hs) if dhs_out is None else dhs_out.contiguous(),
            torch.zeros_like(buf.reads) if dreads_out is None else dreads_out.contiguous(),
            carried(dmem, buf.mem[-1]), carried(dwr, buf.wr[-1]), carried(dww, buf.ww[-1]),
            torch.zeros_like(buf.reads[0]), carried(dh_last, buf.h[-1][: n * cfg.lstm]),
            carried(dc_last, buf.c[-1]),
        ]  # fmt: skip
        dpres = [wp.new_empty(steps, batch, w.shape[0]) for w in weights]
        draw = wp.new_empty(steps, batch, wp.shape[0])
        _call("torch_ntm_backward", wp.dtype, _sizes(cfg, steps, buf, True),
              [cfg.beta_cap, cfg.gamma_cap, ctx.tiny],
              [*_data(wp, *weights), *_pointers(buf), *_data(*grads, *dpres, draw)])
        dmem0, dwr0, dww0, dreads0, dh0, dc0 = grads[2:]
        # Weight gradients: one matmul over all T*B rows each.
        dwp = draw.flatten(0, 1).t() @ buf.hs.flatten(0, 1)
        dweights = [d.flatten(0, 1).t() @ z.flatten(0, 1) for d, z in zip(dpres, buf.z)]
        dbiases = [d.sum((0, 1)) for d in dpres[1:]]
        controller = (*dh0.unbind(0), *dc0.unbind(0)) if cfg.lstm else ()
        return (None, None, dpres[0], dwp, draw.sum((0, 1)), dmem0, dwr0, dww0, dreads0,
                *dweights, *dbiases, *controller)


def _initial_controller(cfg: fast._Config, hc: tuple, like: Tensor) -> tuple[Tensor, Tensor]:
    """The LSTM's initial ``h, c [L, B, C]`` from their per-layer list; empty for feed-forward."""
    if cfg.lstm:
        n = cfg.layers
        return torch.stack(hc[:n]).detach(), torch.stack(hc[n:]).detach()
    empty = like.new_zeros(0, like.shape[0], cfg.hidden)
    return empty, empty


_WARNED: set = set()


def runs_as(x: Tensor) -> str:
    """The engine that runs ``engine="native"`` for input ``x``: "native", or where it cannot,
    "compiled" on a GPU and "fast" otherwise, logged once per reason."""
    if x.device.type != "cpu":  # torch.compile generates GPU kernels there
        fallback = "compiled", f"it runs on the CPU only, not {x.device.type}"
    elif x.dtype not in _DTYPES:
        fallback = "fast", f"it computes in float32 or float64, not {x.dtype}"
    elif not available():  # then torch.compile, which needs a compiler too, may not work either
        fallback = "fast", f"its C++ library could not be built ({_LIBRARY['error']})"
    else:
        return "native"
    if fallback not in _WARNED:
        _WARNED.add(fallback)
        _log.warning("engine 'native' runs as '%s': %s", *fallback)
    return fallback[0]


# A batch whose memories together take more than this many bytes runs in chunks of at most
# `_CHUNK_BYTES` of memory each, one library call each (`_chunks`).
_SPLIT_BYTES = 4 << 20
_CHUNK_BYTES = 3 << 19


def _chunks(batch: int, memory_bytes: int) -> list[slice]:
    """The batch in equal chunks whose memories take at most `_CHUNK_BYTES` each, or whole
    where all of them take at most `_SPLIT_BYTES`. A step walks every batch element's memory
    (and writes the next): when that no longer stays in cache from one step to the next, the
    batch runs faster in pieces. Measured on a 2-core EPYC (the bench's training step, the
    copy model, one process alternating the two ways 12 times, medians, 2026-11-26): with 1,024
    rows (80 KB a memory) batch 64 trained at 415-421 sequences/s in four chunks of 16 against
    365-368 whole on the idle machine (1.13x; 1.08x with a training on the other core); with 128
    and 512 rows (10 and 40 KB), `ntm bench` had chunks of 16 or 32 slower than the whole batch
    of 64 (1,154-1,219 against 1,464-1,544 sequences/s at 128 rows)."""
    if batch * memory_bytes <= _SPLIT_BYTES:
        return [slice(0, batch)]
    pieces = -(-batch // max(1, _CHUNK_BYTES // memory_bytes))
    size = -(-batch // pieces)
    return [slice(b, min(b + size, batch)) for b in range(0, batch, size)]


def _sequence(cfg: fast._Config, tiny: float, xpre, wp, bp, memory, w_read, w_write, reads,
              weights, biases, h0, c0) -> tuple:
    """One library call over a batch: ``(hs, reads, memory, w_read, w_write, *controller)``,
    differentiable where gradients are enabled and some input requires them."""
    inputs = (xpre, wp, bp, memory, w_read, w_write, reads, *weights, *biases, *h0, *c0)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return _NativeSequence.apply(cfg, tiny, *inputs)
    h, c = _initial_controller(cfg, (*h0, *c0), memory)
    buf = _run_forward(cfg, tiny, xpre, weights, biases, wp, bp, memory, w_read, w_write, reads,
                       h, c, keep=False)
    last = xpre.shape[0] % 2  # two slots of state: the final one in slot T % 2
    controller = (buf.h[last], buf.c[last]) if cfg.lstm else ()
    return (buf.hs, buf.reads, buf.mem[last], buf.wr[last], buf.ww[last], *controller)


def native_forward(model: NTM, x: Tensor, state: NTMState | None = None
                   ) -> tuple[Tensor, NTMState]:
    """``model(x, state)`` by the native engine (`NTM.forward` dispatches here for
    ``engine="native"`` where `runs_as` says it can run). Inputs are made contiguous here, once,
    as the library reads them by address. The first call in a process also calls
    `keep_freed_memory`, without which a training loop of this engine ran at 0.6-0.9 times the
    speed (three paired runs at batch 16 and 64, 128 rows, 2026-11-26)."""
    if not _FREED:
        _FREED["asked"] = os.environ.get("TORCH_NTM_KEEP_FREED_MEMORY", "1") != "0"
        if _FREED["asked"]:
            keep_freed_memory()
    layout = fast._layout(model, x.device, False)
    cfg = layout.cfg
    x, state = model._prepare(x, state)
    xpre, weights, biases, wp, bp = fast._parameters(layout, model, x)
    wp, bp = wp.contiguous(), bp.contiguous()
    weights, biases = [w.contiguous() for w in weights], [b.contiguous() for b in biases]
    tiny = torch.finfo(x.dtype).tiny
    memory = state.memory.transpose(1, 2)  # [B, M, N], as the fast engine keeps it
    pieces = []
    for part in _chunks(x.shape[1], memory[0].numel() * memory.element_size()):
        h0 = list(state.controller[0][:, part].unbind(0)) if cfg.lstm else []
        c0 = list(state.controller[1][:, part].unbind(0)) if cfg.lstm else []
        pieces.append(_sequence(
            cfg, tiny, xpre[:, part].contiguous(), wp, bp, memory[part],
            state.read_weights[part], state.write_weights[part],
            state.reads[part].contiguous(), weights, biases, h0, c0))
    if len(pieces) == 1:
        out = pieces[0]
    else:  # batch is dim 1 of the steps' outputs and the controller's state, else dim 0
        dims = (1, 1, 0, 0, 0, 1, 1)
        out = [torch.cat(parts, dim) for parts, dim in zip(zip(*pieces), dims)]
    hs, reads, memory, w_read, w_write = out[:5]
    controller = tuple(out[5:])
    logits = model.output(torch.cat([hs, reads.flatten(2)], dim=-1))
    final = NTMState(controller, memory.transpose(1, 2), w_read, w_write, reads[-1])
    return (logits.transpose(0, 1) if model.batch_first else logits), final
