"""The native engine computes exactly `NTM.forward`: outputs, final state and every gradient, in
every configuration the fast engine is tested in, with and without gradients."""

import logging

import pytest
import torch
from test_fast import CONFIGS, SMALL, _assert_same, _eager, _in_two, _loss, _model_and_input, _run

from torch_ntm import NTM, native

pytestmark = pytest.mark.skipif(
    not native.available(), reason=f"native library not built: {native._LIBRARY.get('error')}")


def _native(model):
    model.engine = "native"
    return model


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("batch,steps", [(1, 4), (3, 7)])
def test_matches_eager_float64(name, batch, steps):
    model, x = _model_and_input(CONFIGS[name], torch.float64, batch, steps)
    eager = _run(_eager(model), model, x)
    _assert_same(eager, _run(_native(model), model, x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("engine", ["fast", "native"])
def test_gamma_one_at_zero_weights_gives_eager_gradients(engine):
    """At gamma = 1 (in float32, 1 + softplus(raw) for raw below ~-16.6) sharpening is w /
    sum(w), whose derivative at a zero weight is not 0: the hand-written backwards gave 0 there,
    so a given initial weighting's gradient lost its zero rows' part. (The compiled engine
    compiles the fast one's backward: it passed too, in 20 s, too long for this edge.)"""
    torch.manual_seed(0)
    model = NTM(4, 3, controller_size=7, memory_size=6, memory_width=4, shift_range=0,
                write_heads=2, dtype=torch.float64)
    with torch.no_grad():  # gate 0: each weighting stays its one-hot initial one; gamma = 1
        for kind in ("read", "write"):
            for field, bias in (("gate", -800.0), ("gamma", -800.0)):
                rows = model.head_layout.rows(kind, field)
                model.head_params.weight[rows] = 0
                model.head_params.bias[rows] = bias
    x = torch.randn(3, 2, 4, dtype=torch.float64)
    one_hot = torch.zeros(2, 1, 6, dtype=torch.float64)
    one_hot[..., 0] = 1
    state = model.initial_state(2)._replace(
        memory=torch.randn(2, 6, 4, dtype=torch.float64), read_weights=one_hot,
        write_weights=torch.cat([one_hot, one_hot.roll(2, -1)], 1))
    grads = []
    for name in ("eager", engine):
        model.engine = name
        given = (state.read_weights.clone().requires_grad_(),
                 state.write_weights.clone().requires_grad_())
        logits, final = model(x, state._replace(read_weights=given[0], write_weights=given[1]))
        rows = torch.arange(6, dtype=torch.float64)
        loss = (final.read_weights * rows).sum() + (final.write_weights * rows ** 2).sum()
        grads.append(torch.autograd.grad(loss + logits.square().sum(), given))
    for got, expected in zip(grads[1], grads[0]):
        assert expected[..., 1:].abs().amax() > 1  # the zero rows' part, which was lost
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("engine", ["fast", "native"])
def test_softplus_above_its_threshold_gives_eager_gradients(engine):
    # F.softplus is the identity above 20, so its derivative is 1 there; the fast engine's was
    # sigmoid(raw), 1.25e-9 off at 20.5 (float64).
    model, x = _model_and_input({}, torch.float64, 2, 5)
    with torch.no_grad():
        for kind in ("read", "write"):
            for field in ("beta", "gamma"):
                model.head_params.weight[model.head_layout.rows(kind, field)] = 0
                model.head_params.bias[model.head_layout.rows(kind, field)] = 20.5
    eager = _run(_eager(model), model, x)
    model.engine = engine
    _assert_same(eager, _run(model, model, x), rtol=1e-10, atol=1e-12)


def test_matches_eager_at_unequal_sizes_past_the_vector_width():
    # 37 rows: vector loops of one and of four vectors (8 or 16 lanes) with a tail; batch 5 and 3
    # heads of each kind.
    torch.manual_seed(0)
    model = NTM(6, 4, controller_size=11, memory_size=37, memory_width=5, read_heads=3,
                write_heads=3, shift_range=3, dtype=torch.float64)
    x = torch.randn(6, 5, 6, dtype=torch.float64)
    _assert_same(_run(_eager(model), model, x), _run(_native(model), model, x),
                 rtol=1e-10, atol=1e-12)


_AVX2_CHECK = """
import torch
from torch_ntm import NTM, native
torch.manual_seed(0)
model = NTM(6, 4, controller_size=11, memory_size=37, memory_width=5, read_heads=2,
            write_heads=2, dtype=torch.float64)
x = torch.randn(6, 5, 6, dtype=torch.float64, requires_grad=True)
out = []
for engine in ("eager", "native"):
    model.engine = engine
    logits, _ = model(x)
    grads = torch.autograd.grad(logits.square().sum(), [x, *model.parameters()])
    out.append(torch.cat([logits.flatten(), *(g.flatten() for g in grads)]))
print(native._LIBRARY["lib"]._name, float((out[0] - out[1]).abs().max()))
"""


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                    reason="the CPU has no AVX-512: the AVX2 build is the one the others test")
def test_avx2_build_matches_eager_on_an_avx512_cpu():
    # The library takes the CPU's widest vectors; the AVX2 form, which CPUs without AVX-512 run,
    # is built and checked here too (ATEN_CPU_CAPABILITY lowers torch's choice).
    import os
    import subprocess
    import sys

    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    result = subprocess.run([sys.executable, "-c", _AVX2_CHECK], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    name, diff = result.stdout.split()
    assert "torch_ntm_native_avx2" in name and float(diff) < 1e-10


def test_matches_eager_float32_paper_model():
    torch.manual_seed(1)
    model = NTM(9, 8)  # the copy model of the paper: LSTM 100, memory 128 x 20
    x = torch.randint(0, 2, (41, 3, 9)).float()
    eager = _run(_eager(model), model, x)
    _assert_same(eager, _run(_native(model), model, x), rtol=1e-4, atol=1e-5)


def test_carried_state_equals_one_pass():
    model, x = _model_and_input(CONFIGS["deep-lstm"], torch.float64, 3, 9)
    whole = _run(_eager(model), model, x)
    _assert_same(whole, _run(_in_two(_native(model)), model, x), rtol=1e-10, atol=1e-12)


def test_given_state_gets_gradients():
    model, x = _model_and_input({}, torch.float64, 2, 5)
    state = model.initial_state(2)
    memory = (state.memory + 0.1 * torch.randn_like(state.memory)).requires_grad_()
    controller = tuple(t.detach().clone().requires_grad_() for t in state.controller)
    given = state._replace(memory=memory, controller=controller)
    grads = []
    for fn in (_eager(model), _native(model)):
        logits, final = fn(x, given)
        grads.append(torch.autograd.grad(_loss(logits, final), [memory, *controller]))
    for g_native, g_eager in zip(*grads[::-1]):
        torch.testing.assert_close(g_native, g_eager, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("steps", [4, 5])  # the final state in either of the two slots
@pytest.mark.parametrize("name", ["deep-lstm", "feedforward"])
def test_inference_keeps_two_slots_and_matches(name, steps):
    model, x = _model_and_input(CONFIGS[name], torch.float64, 2, steps)
    expected, expected_state = _eager(model)(x)
    _native(model)
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            logits, state = model(x)
        torch.testing.assert_close(logits, expected.detach())
        torch.testing.assert_close(state.memory, expected_state.memory.detach())
        for u, v in zip(state.controller, expected_state.controller):
            torch.testing.assert_close(u, v.detach())


def test_gradcheck_through_input_and_memory():
    model, x = _model_and_input(CONFIGS["multi-head"], torch.float64, 2, 3)
    _native(model)
    state = model.initial_state(2)
    memory = (state.memory + 0.3 * torch.randn_like(state.memory)).requires_grad_()
    x = x.requires_grad_()

    def fn(x, memory):
        logits, final = model(x, state._replace(memory=memory))
        return logits, final.memory, final.read_weights

    assert torch.autograd.gradcheck(fn, (x, memory))


def test_no_nan_with_one_hot_weightings():
    model, x = _model_and_input({}, torch.float64, 2, 6)
    with torch.no_grad():
        model.head_params.bias.fill_(60.0)  # huge beta and gamma: exactly one-hot weightings
    result = _run(_native(model), model, x)
    assert all(torch.isfinite(g).all() for g in result[3].values())
    _assert_same(_run(_eager(model), model, x), result, rtol=1e-8, atol=1e-10)


def test_zero_memory_and_zero_keys_stay_finite():
    model, x = _model_and_input({}, torch.float64, 2, 4)
    with torch.no_grad():
        model.head_params.weight.zero_()
        model.head_params.bias.zero_()  # keys tanh(0) = 0, gamma = 1 + softplus(0)

    def from_zero_memory(fn):
        def run(x, state=None):
            state = model.initial_state(2)
            return fn(x, state._replace(memory=torch.zeros_like(state.memory)))
        return run

    result = _run(from_zero_memory(_native(model)), model, x)
    assert torch.isfinite(result[1]).all()
    assert all(torch.isfinite(g).all() for g in result[3].values())
    _assert_same(_run(from_zero_memory(_eager(model)), model, x), result,
                 rtol=1e-10, atol=1e-12)


def test_falls_back_to_fast_with_one_line_when_it_cannot_build(monkeypatch, caplog):
    model, x = _model_and_input({}, torch.float64, 2, 4)
    expected = _run(_eager(model), model, x)
    monkeypatch.setattr(native, "_LIBRARY", {"error": "CalledProcessError: no compiler"})
    monkeypatch.setattr(native, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="torch_ntm.native"):
        first = _run(_native(model), model, x)
        _run(model, model, x)
    assert [r.getMessage() for r in caplog.records] == [
        "engine 'native' runs as 'fast': its C++ library could not be built "
        "(CalledProcessError: no compiler)"]
    _assert_same(expected, first, rtol=1e-10, atol=1e-12)


def test_other_dtypes_fall_back_to_fast(monkeypatch):
    monkeypatch.setattr(native, "_WARNED", set())
    model, x = _model_and_input({}, torch.bfloat16, 2, 3)
    logits, _ = _native(model)(x)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_bench_times_the_native_library_forward_and_backward(monkeypatch):
    from torch_ntm import bench

    calls = []
    real = native._call
    monkeypatch.setattr(native, "_call", lambda name, *a: calls.append(name) or real(name, *a))
    task = bench.CopyTask().with_size(3)
    runner = bench._Runner("native", 8, task.sample(2, torch.Generator().manual_seed(0)), task,
                           "cpu", 0)
    runner.train_step()
    runner.infer_step()
    assert calls == ["torch_ntm_forward", "torch_ntm_backward", "torch_ntm_forward"]


def test_large_memories_in_separate_blocks_match_eager():
    # 8 x 20 x 1024 float64 rows: 1.3 MB per step, so each step's memory is a tensor of its own.
    torch.manual_seed(0)
    model = NTM(6, 4, controller_size=11, memory_size=1024, memory_width=20,
                dtype=torch.float64)
    x = torch.randn(3, 8, 6, dtype=torch.float64)
    buffers = native._buffers(native.fast._layout(model, x.device, False).cfg, 3, 8, 1024, x,
                              True)
    assert isinstance(buffers.mem, tuple) and len(buffers.mem) == 4
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
    call = native._call
    monkeypatch.setattr(native, "_call", lambda name, *a: (calls.append(name), call(name, *a)))
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


def test_keep_freed_memory_sets_glibc_and_is_a_no_op_without_it(monkeypatch):
    import ctypes
    import platform

    from torch_ntm import native

    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert native.keep_freed_memory() is True

    def no_libc(*args, **kwargs):
        raise OSError("no C library here")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert native.keep_freed_memory() is False


@pytest.mark.parametrize("env,calls", [(None, 1), ("1", 1), ("0", 0)])
def test_first_native_call_keeps_freed_memory_unless_told_not_to(monkeypatch, env, calls):
    # A library user's own loop gets the reuse of freed buffers that `ntm` commands set up.
    seen = []
    monkeypatch.setattr(native, "keep_freed_memory", lambda: seen.append(1) or True)
    monkeypatch.setattr(native, "_FREED", {})
    if env is None:
        monkeypatch.delenv("TORCH_NTM_KEEP_FREED_MEMORY", raising=False)
    else:
        monkeypatch.setenv("TORCH_NTM_KEEP_FREED_MEMORY", env)
    model = NTM(3, 2, controller_size=4, memory_size=5, memory_width=2, engine="native")
    for _ in range(3):
        model(torch.randn(2, 1, 3))
    assert len(seen) == calls
