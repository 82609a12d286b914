"""What is particular to the native engine (the equivalence with the eager step, which every
engine shares, is test_engines.py): vector widths and tails, its AVX2 build, memories in
separate blocks, a large batch in chunks, the reuse of freed memory, and errors from C++."""

import ctypes

import pytest
import torch
from test_engines import (
    CONFIGS,
    NATIVE,
    SMALL,
    WHY_NOT,
    _assert_same,
    _eager,
    _model_and_input,
    _run,
)

from torch_ntm import NTM
from torch_ntm.engines import library
from torch_ntm.engines import ntm as native

pytestmark = pytest.mark.skipif(not NATIVE, reason=f"native library not built: {WHY_NOT}")


def _native(model):
    model.engine = "native"
    return model


def test_matches_eager_at_unequal_sizes_past_the_vector_width():
    # 37 rows: vector loops of one and of four vectors (8 or 16 lanes) with a tail; batch 5 and 3
    # heads of each kind.
    torch.manual_seed(0)
    model = NTM(6, 4, controller_size=11, memory_size=37, memory_width=5, read_heads=3,
                write_heads=3, shift_range=3, dtype=torch.float64)
    x = torch.randn(6, 5, 6, dtype=torch.float64)
    _assert_same(_run(_eager(model), model, x), _run(_native(model), model, x),
                 rtol=1e-10, atol=1e-12)


_NARROWER_BUILD_CHECK = """
import sys
import torch
from torch_ntm import MANN, NTM
from torch_ntm.engines import library
torch.manual_seed(0)
for name, model, x in (
    ("ntm", NTM(6, 4, controller_size=11, memory_size=37, memory_width=5, read_heads=2,
                write_heads=2, dtype=torch.float64), torch.randn(6, 5, 6, dtype=torch.float64)),
    ("mann", MANN(6, 4, controller_size=11, memory_size=37, memory_width=5, read_heads=3,
                  dtype=torch.float64), torch.randn(6, 5, 6, dtype=torch.float64)),
):
    x.requires_grad_(True)
    out = []
    for engine in ("eager", "native"):
        model.engine = engine
        logits, _ = model(x)
        grads = torch.autograd.grad(logits.square().sum(), [x, *model.parameters()])
        out.append(torch.cat([logits.flatten(), *(g.flatten() for g in grads)]))
    print(library.library(name, torch.float64)._name, float((out[0] - out[1]).abs().max()))
"""

_CAPABILITIES = ["avx512", "avx2", "default"]


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_narrower_builds_match_eager(capability):
    # The library takes the CPU's widest vectors (csrc/vec.h); the narrower forms, which other
    # CPUs run (AVX2; none: 32 bytes of scalars), are built and checked here too, for both
    # models (ATEN_CPU_CAPABILITY lowers torch's choice).
    import os
    import subprocess
    import sys
    from pathlib import Path

    widest = torch.backends.cpu.get_cpu_capability().lower()
    order = _CAPABILITIES.index
    if widest not in _CAPABILITIES or order(capability) <= order(widest):
        pytest.skip(f"{capability} is not narrower than this CPU's {widest}")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    result = subprocess.run([sys.executable, "-c", _NARROWER_BUILD_CHECK], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert [Path(path).stem.rsplit("_", 1)[0] for path, _ in lines] == [
        f"torch_ntm_{model}_{capability}_f64" for model in ("ntm", "mann")], result.stdout
    assert all(float(diff) < 1e-10 for _, diff in lines), result.stdout


def test_large_memories_in_separate_blocks_match_eager():
    # 8 x 20 x 1024 float64 rows: 1.3 MB per step, so each step's memory is a tensor of its own.
    torch.manual_seed(0)
    model = NTM(6, 4, controller_size=11, memory_size=1024, memory_width=20,
                dtype=torch.float64)
    x = torch.randn(3, 8, 6, dtype=torch.float64)
    cfg = native._plan(model, x.device).cfg
    buffers = library.allocate(native._call(cfg, 1e-300, 3, 8, 1024, True), x)
    assert isinstance(buffers.mem, tuple) and len(buffers.mem) == 4
    assert isinstance(buffers.addr, torch.Tensor)  # 2 heads' similarities: 131 KB per step
    small = library.allocate(native._call(cfg, 1e-300, 3, 8, 64, True), x)
    assert isinstance(small.mem, torch.Tensor) and small.mem.shape == (4, 8, 20, 64)
    _assert_same(_run(_eager(model), model, x), _run(_native(model), model, x),
                 rtol=1e-10, atol=1e-12)


def test_chunks_cover_the_batch_in_equal_pieces_only_when_its_memories_are_large():
    kb = 1 << 10
    assert native._chunks(64, 10 * kb) == [slice(0, 64)]  # 128 x 20 float32: 640 KB in all
    assert native._chunks(64, 40 * kb) == [slice(0, 64)]  # 512 rows: 2.5 MB
    assert native._chunks(64, 80 * kb) == [slice(b, b + 16) for b in range(0, 64, 16)]
    assert native._chunks(1, 8 << 20) == [slice(0, 1)]  # one memory over the limit: whole
    parts = native._chunks(53, 80 * kb)
    sizes = [p.stop - p.start for p in parts]
    assert parts[0].start == 0 and parts[-1].stop == 53 and sum(sizes) == 53
    assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))
    assert max(sizes) * 80 * kb <= native._CHUNK_BYTES and max(sizes) - min(sizes) <= 3


@pytest.mark.parametrize("name", ["deep-lstm", "feedforward"])
def test_a_batch_run_in_chunks_matches_eager(name, monkeypatch):
    # Chunks of 2 of a batch of 5 (the last of 1): outputs, final state and gradients, and the
    # inference path, as the eager loop; one library call per chunk.
    model, x = _model_and_input(CONFIGS[name], torch.float64, 5, 4)
    memory_bytes = SMALL["memory_size"] * SMALL["memory_width"] * 8
    monkeypatch.setattr(native, "_SPLIT_BYTES", 0)
    monkeypatch.setattr(native, "_CHUNK_BYTES", 2 * memory_bytes)
    calls = []
    call = library.call
    monkeypatch.setattr(library, "call", lambda name, *a: (calls.append(name), call(name, *a)))
    eager = _run(_eager(model), model, x)
    _assert_same(eager, _run(_native(model), model, x), rtol=1e-10, atol=1e-12)
    assert calls == ["torch_ntm_forward"] * 3 + ["torch_ntm_backward"] * 3
    with torch.no_grad():
        logits, state = model(x)
    torch.testing.assert_close(logits, eager[1])
    for field in ("memory", "read_weights", "write_weights", "reads"):
        torch.testing.assert_close(getattr(state, field), getattr(eager[2], field).detach())
    for u, v in zip(state.controller, eager[2].controller):
        torch.testing.assert_close(u, v.detach())


_MAPPED = """
import ctypes
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                 "usmblks", "fsmblks", "uordblks", "fordblks",
                                                 "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def mapped(size):  # bytes of a malloc(size) served by mmap
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(size)
    after = libc.mallinfo2().hblkhd
    libc.free(block)
    return after - before
first = mapped(8 << 20)  # which raises glibc's own (dynamic) threshold to 8 MB
from torch_ntm.engines.library import keep_freed_memory
print(first, keep_freed_memory(), mapped(24 << 20))
"""


def test_keep_freed_memory_serves_large_blocks_from_the_heap(monkeypatch):
    """What the setting is for: a block above glibc's threshold (8 MB, then 24 MB above the
    threshold its first free raised) is mapped afresh, and unmapped when freed; after the setting
    a 24 MB block comes from the heap, where a freed block is reused."""
    import ctypes
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc" or not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("glibc >= 2.33 (mallinfo2) only")
    out = subprocess.run([sys.executable, "-c", _MAPPED], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert int(out[0]) >= 8 << 20 and out[1] == "True" and int(out[2]) == 0, out

    def no_libc(*args, **kwargs):
        raise OSError("no C library here")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert library.keep_freed_memory() is False


@pytest.mark.parametrize("env,calls", [(None, 1), ("1", 1), ("0", 0)])
def test_first_native_call_keeps_freed_memory_unless_told_not_to(monkeypatch, env, calls):
    # A library user's own loop gets the reuse of freed buffers that `ntm` commands set up: once
    # per process, whichever model's native engine runs first.
    from torch_ntm import DNC, MANN

    seen = []
    monkeypatch.setattr(library, "keep_freed_memory", lambda: seen.append(1) or True)
    monkeypatch.setattr(library, "_FREED", {})
    if env is None:
        monkeypatch.delenv("TORCH_NTM_KEEP_FREED_MEMORY", raising=False)
    else:
        monkeypatch.setenv("TORCH_NTM_KEEP_FREED_MEMORY", env)
    small = {"controller_size": 4, "memory_size": 5, "memory_width": 2, "engine": "native"}
    for model in (NTM(3, 2, **small), MANN(3, 2, **small), DNC(3, 2, **small)):
        assert model.runs_on(torch.randn(2, 1, 3)) == "native"
        for _ in range(2):
            model(torch.randn(2, 1, 3))
    assert len(seen) == calls


def test_an_error_in_cpp_reaches_python_with_its_message():
    # A description the kernels reject (a negative layer count), before a pointer is read.
    model = NTM(3, 2, controller_size=4, memory_size=5, memory_width=2)
    x = torch.zeros(2, 1, 3)
    description = native._call(native._plan(model, x.device).cfg, 1e-38, 2, 1, 5, True)
    description.layers = -5
    with pytest.raises(RuntimeError, match="torch_ntm_forward failed: sizes out of range .*L -5"):
        library.call("torch_ntm_forward", torch.float32, description, [0] * 40)


def test_a_call_in_another_dtype_than_the_library_s_is_refused_by_it():
    # One library per dtype: a float64 call that reached the float32 library would read its
    # buffers with the wrong width.
    model = NTM(3, 2, controller_size=4, memory_size=5, memory_width=2)
    x = torch.zeros(2, 1, 3)
    cfg = native._plan(model, x.device).cfg
    lib = library.library("ntm", torch.float32)
    kernel = lib.torch_ntm_forward
    kernel.argtypes, kernel.restype = library._KERNEL_ARGS, ctypes.c_int
    description = native._call(cfg, 1e-38, 2, 1, 5, True)
    assert kernel(1, ctypes.byref(description), None) == 1
    assert lib.torch_ntm_last_error().decode() == ("a call in dtype code 1 to the library built "
                                                   "for code 0")


def test_the_generated_header_declares_each_description_as_its_ctypes_structure():
    text = library.header()
    assert "struct NTMCall {" in text and "int64_t field_start[14];" in text
    assert "enum HeadField : int { KEY = 0, BETA = 1, GATE = 2, SHIFT = 3, GAMMA = 4, " in text
    for field, _ in native.NTMCall._fields_:  # each field's offset is checked by the compiler
        assert f"offsetof(NTMCall, {field}) == {getattr(native.NTMCall, field).offset}" in text


def test_the_header_shares_the_constants_and_reads_the_buffers_by_the_table():
    from torch_ntm import functional
    from torch_ntm.engines.calls import MANNCall

    text = library.header()
    assert f"constexpr double kEps = {functional.EPS!r};" in text
    assert f"constexpr double kSoftplusThreshold = {functional.SOFTPLUS_THRESHOLD!r};" in text
    # each buffer read in the table's order, with its size from the call's fields
    take = text[text.index("size_t take(const MANNCall& d"):]
    names = [b.name for b in MANNCall.buffers]
    assert [take.index(f"    {n}_ = ") for n in names] == sorted(take.index(f"    {n}_ = ")
                                                             for n in names)
    assert "z_size = d.batch * ((d.heads * d.width) + d.controller);" in take
    assert "link_.push_back" in text[text.index("size_t take(const DNCCall& d"):]
    assert "struct DNCCallBackward { enum : size_t { wih, whh, wp, dhs," in text


def test_buffers_are_allocated_and_passed_in_the_tables_order():
    from torch_ntm.engines.calls import DNCCall

    call = DNCCall(steps=3, batch=2, controller=5, read_heads=2, width=4, rows=6, fields=9,
                   keep_all=1)
    like = torch.zeros(1, dtype=torch.float64)
    buf = library.allocate(call, like)
    assert buf._fields == tuple(b.name for b in DNCCall.buffers)
    assert buf.z.shape == (3, 2, 2 * 4 + 5) and buf.cell.shape == (4, 2, 5)
    assert len(buf.link) == 4 and buf.link[0].shape == (2, 6, 6)  # a block per slot
    assert library.allocate(DNCCall(steps=3, batch=2, controller=5, read_heads=2, width=4,
                                    rows=6, fields=9, keep_all=0), like).fwd.shape[0] == 1
    flat = library.flat(buf)
    assert len(flat) == len(DNCCall.buffers) - 1 + 4
    assert all(a is b for a, b in zip(library.flat(library.unflat(call, flat)), flat))
    inputs = {name: torch.zeros(1, dtype=torch.float64) for name in DNCCall.forward_args}
    pointers = library.arguments(call, "forward", dict(reversed(inputs.items())), buf)
    assert pointers == [*(inputs[n].data_ptr() for n in DNCCall.forward_args),
                        *(t.data_ptr() for t in flat)]
    with pytest.raises(TypeError, match="takes"):
        library.arguments(call, "forward", {"xpre": like}, buf)
    with pytest.raises(ValueError, match="only sums, differences and products"):
        library._size("rows // 2", call)


@pytest.mark.parametrize("lstm", [1, 0])
def test_the_ntm_s_table_gives_each_layer_its_buffers_and_the_lists_follow_the_buffers(lstm):
    from torch_ntm.engines.calls import NTMCall

    # 3 layers of C = 5, 2 read heads of M = 4, 1 write head, N = 6, P = 11 head outputs
    call = NTMCall(steps=3, batch=2, layers=3, hidden=5, read_heads=2, write_heads=1, width=4,
                   rows=6, shifts=3, lstm=lstm, keep_all=1, block_end=(4, 7, 9, 11))
    like = torch.zeros(1, dtype=torch.float64)
    buf = library.allocate(call, like)
    gates = 4 * 5 if lstm else 5
    assert [z.shape for z in buf.z] == [(3, 2, 2 * 4 + 5 * lstm), (3, 2, 5 + 5 * lstm),
                                        (3, 2, 5 + 5 * lstm)]
    assert [a.shape for a in buf.act] == [(3, 2, gates)] * 3
    assert buf.cell.shape == (4, 3 * lstm, 2, 5) and buf.raw.shape == (3, 2, 11)
    assert buf.mem.shape == (4, 2, 4, 6)  # small: one allocation, one address per slot passed
    assert all(a is b for a, b in zip(library.flat(library.unflat(call, library.flat(buf))),
                                      library.flat(buf)))
    named = {n: torch.zeros(1, dtype=torch.float64) for n in NTMCall.forward_args}
    weights = [torch.zeros(1, dtype=torch.float64) for _ in range(3)]
    pointers = library.arguments(call, "forward", named, buf, (weights, weights[1:]))
    mem = buf.mem.data_ptr()
    slot = buf.mem.stride(0) * 8
    assert pointers[4 + 8 : 4 + 8 + 4] == [mem, mem + slot, mem + 2 * slot, mem + 3 * slot]
    assert pointers[-5:] == [w.data_ptr() for w in (*weights, *weights[1:])]
    text = library.header()
    take = text[text.index("size_t take(const NTMCall& d"):]
    assert ("z_size.push_back(d.batch * (((layer == 0) ? (d.read_heads * d.width) : d.hidden) + "
            "(d.lstm * d.hidden)));") in take
    assert "raw_size = d.batch * d.block_end[3];" in take


def test_prepare_builds_in_the_background_once_and_the_first_call_waits_for_it(monkeypatch):
    import threading
    import time

    calls, started = [], threading.Event()

    def slow_build(source, dtype):
        started.set()
        time.sleep(0.2)
        calls.append((threading.current_thread().name, source, dtype))
        return {"lib": f"the {source} {dtype} library"}

    monkeypatch.setattr(library, "_LIBRARY", {})
    monkeypatch.setattr(library, "_build", slow_build)
    library.prepare("ntm")
    assert started.wait(5)
    # waited for the background build
    assert library.library("ntm", torch.float32) == "the ntm torch.float32 library"
    library.prepare("ntm")  # built: nothing more
    assert calls == [("torch_ntm library", "ntm", torch.float32)]
    assert library.library("mann", torch.float64) == "the mann torch.float64 library"


def test_a_changed_header_is_a_new_build(monkeypatch, tmp_path):
    # torch's loader hashes the .cpp files only: the library's name for its code covers the
    # headers (and the generated one) too.
    for name in ("a.cpp", "b.h"):
        (tmp_path / name).write_text("// 1")
    monkeypatch.setattr(library, "_CSRC", tmp_path)
    before = library._sources_hash("calls")
    (tmp_path / "b.h").write_text("// 2")
    assert library._sources_hash("calls") != before
    assert library._sources_hash("other calls") != library._sources_hash("calls")
