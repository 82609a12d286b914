"""Every engine computes exactly the model's eager step (`NTM._step`, the specification): outputs,
final state and every gradient, in float64, in every configuration, with and without gradients,
with a state passed in and carried over, batch first and packed. One suite, parametrised by the
engines this machine runs (`FAST_ENGINES`); what is particular to one engine is tested beside it
(test_native.py); what the native engines of the NTM, the MANN and the DNC share, beside one
another (test_native_models.py: there the gradients of a state passed in and of the input)."""

import logging
import math
import os

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from torch_ntm import NTM, engines
from torch_ntm.engines import library

CONFIGS = {
    "paper": {},
    "multi-head": {"read_heads": 2, "write_heads": 2},
    "deep-lstm": {"controller_layers": 2, "shift_range": 2, "write_heads": 3,
                  "memory_init": "learned"},
    "feedforward": {"controller": "feedforward", "controller_layers": 2, "read_heads": 2},
    "read-only": {"write_heads": 0, "shift_range": 0},
    "random-memory": {"memory_init": "random", "batch_first": True},
    "capped": {"max_beta": 2.0, "max_gamma": 1.5, "write_heads": 2},
    "gamma-capped": {"max_gamma": 3.0, "controller": "feedforward"},
}
SMALL = {"controller_size": 11, "memory_size": 7, "memory_width": 5}

# The engines other than eager that run here ("auto" is native on this CPU).
KERNELS = [(source, dtype) for source in ("ntm", "mann", "dnc") for dtype in library.DTYPES]
NATIVE = all(library.available(*kernels) for kernels in KERNELS)
FAST_ENGINES = ["native"] if NATIVE else []
WHY_NOT = next((library.error(*kernels) for kernels in KERNELS if library.error(*kernels)), None)
needs_native = pytest.mark.skipif(not NATIVE, reason=f"native library not built: {WHY_NOT}")


def _eager(model):
    """The reference: `NTM._step` looped over time (independent of what `NTM.forward` runs)."""

    def forward(x, state=None):
        x, state = model._prepare(x, state)
        outputs = []
        for x_t in x:
            y, state = model._step(x_t, state)
            outputs.append(y)
        return model._finish(torch.stack(outputs)), state

    return forward


def _on(model, engine):
    model.engine = engine
    return model


def _loss(logits, state):
    """A loss that reaches every output and every part of the final state."""
    loss = logits.square().sum() + state.memory.sum() + state.reads.square().sum()
    loss = loss + (state.read_weights * 1.5).sum() + state.write_weights.square().sum()
    for t in state.controller:
        loss = loss + t.sin().sum()
    return loss


def _run(fn, model, x, state=None, seed=0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # "random" memory init draws the same memory on both paths
    logits, final = fn(x, state)
    loss = _loss(logits, final)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), logits.detach(), final, grads


def _assert_same(a, b, **tol):
    loss_a, logits_a, state_a, grads_a = a
    loss_b, logits_b, state_b, grads_b = b
    torch.testing.assert_close(loss_b, loss_a, **tol)
    torch.testing.assert_close(logits_b, logits_a, **tol)
    for name in ("memory", "read_weights", "write_weights", "reads"):
        torch.testing.assert_close(getattr(state_b, name), getattr(state_a, name), **tol)
    assert len(state_a.controller) == len(state_b.controller)
    for u, v in zip(state_a.controller, state_b.controller):
        torch.testing.assert_close(v, u, **tol)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], **tol, msg=name)


def _model_and_input(config, dtype, batch, steps, seed=0):
    torch.manual_seed(seed)
    model = NTM(6, 4, **SMALL, **config, dtype=dtype)
    shape = (batch, steps, 6) if model.batch_first else (steps, batch, 6)
    return model, torch.randn(shape, dtype=dtype)


def _in_two(forward, split=4):
    """``forward`` over a sequence in two calls, the state of the first carried into the second."""

    def run(x, state):
        y1, s1 = forward(x[:split], state)
        y2, s2 = forward(x[split:], s1)
        return torch.cat([y1, y2]), s2

    return run


F64 = {"rtol": 1e-10, "atol": 1e-12}
engine_param = pytest.mark.parametrize("engine", FAST_ENGINES)


@engine_param
@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("batch,steps", [(1, 4), (3, 7)])
def test_matches_eager_float64(engine, name, batch, steps):
    model, x = _model_and_input(CONFIGS[name], torch.float64, batch, steps)
    eager = _run(_eager(model), model, x)
    _assert_same(eager, _run(_on(model, engine), model, x), **F64)


@engine_param
def test_matches_eager_float32_paper_model(engine):
    torch.manual_seed(1)
    model = NTM(9, 8)  # the copy model of the paper: LSTM 100, memory 128 x 20
    x = torch.randint(0, 2, (41, 3, 9)).float()
    eager = _run(_eager(model), model, x)
    _assert_same(eager, _run(_on(model, engine), model, x), rtol=1e-4, atol=1e-5)


@engine_param
@pytest.mark.parametrize("name", ["multi-head", "deep-lstm"])
def test_carried_state_equals_one_pass(engine, name):
    model, x = _model_and_input(CONFIGS[name], torch.float64, 3, 9)
    whole = _run(_eager(model), model, x)
    _assert_same(whole, _run(_in_two(_on(model, engine)), model, x), **F64)


@engine_param
@pytest.mark.parametrize("steps", [4, 5])  # the final state in either of the two slots
@pytest.mark.parametrize("name", ["deep-lstm", "feedforward"])
def test_no_grad_and_inference_mode(engine, name, steps):
    model, x = _model_and_input(CONFIGS[name], torch.float64, 2, steps)
    expected, expected_state = _eager(model)(x)
    _on(model, engine)
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            logits, state = model(x)
        torch.testing.assert_close(logits, expected.detach())
        torch.testing.assert_close(state.memory, expected_state.memory.detach())
        for u, v in zip(state.controller, expected_state.controller):
            torch.testing.assert_close(u, v.detach())


@engine_param
def test_packed_input_matches_eager(engine):
    model, x = _model_and_input(CONFIGS["multi-head"], torch.float64, 4, 6)
    lengths = torch.tensor([6, 2, 5, 2])
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    results = []
    for name in ("eager", engine):
        model.engine = name
        model.zero_grad(set_to_none=True)
        y, state = model(packed)
        padded, _ = pad_packed_sequence(y)
        (padded.square().sum() + _loss(padded[:0], state)).backward()
        results.append((padded.detach(), state, [p.grad.clone() for p in model.parameters()]))
    (y0, s0, g0), (y1, s1, g1) = results
    torch.testing.assert_close(y1, y0, **F64)
    for name in ("memory", "read_weights", "write_weights", "reads"):
        torch.testing.assert_close(getattr(s1, name), getattr(s0, name), **F64)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, **F64)


@engine_param
def test_gradcheck_through_input_and_memory(engine):
    model, x = _model_and_input(CONFIGS["multi-head"], torch.float64, 2, 3)
    _on(model, engine)
    state = model.initial_state(2)
    memory = (state.memory + 0.3 * torch.randn_like(state.memory)).requires_grad_()
    x = x.requires_grad_()

    def fn(x, memory):
        logits, final = model(x, state._replace(memory=memory))
        return logits, final.memory, final.read_weights

    assert torch.autograd.gradcheck(fn, (x, memory))


@engine_param
def test_no_nan_with_one_hot_weightings(engine):
    model, x = _model_and_input({}, torch.float64, 2, 6)
    with torch.no_grad():
        model.head_params.bias.fill_(60.0)  # huge beta and gamma: exactly one-hot weightings
    result = _run(_on(model, engine), model, x)
    assert all(torch.isfinite(g).all() for g in result[3].values())
    _assert_same(_run(_eager(model), model, x), result, rtol=1e-8, atol=1e-10)


@engine_param
def test_zero_memory_and_zero_keys_stay_finite(engine):
    model, x = _model_and_input({}, torch.float64, 2, 4)
    with torch.no_grad():
        model.head_params.weight.zero_()
        model.head_params.bias.zero_()  # keys tanh(0) = 0, gamma = 1 + softplus(0)

    def from_zero_memory(fn):
        def run(x, state=None):
            state = model.initial_state(2)
            return fn(x, state._replace(memory=torch.zeros_like(state.memory)))
        return run

    result = _run(from_zero_memory(_on(model, engine)), model, x)
    assert torch.isfinite(result[1]).all()
    assert all(torch.isfinite(g).all() for g in result[3].values())
    _assert_same(_run(from_zero_memory(_eager(model)), model, x), result, **F64)


@engine_param
def test_gamma_one_at_zero_weights_gives_eager_gradients(engine):
    """At gamma = 1 (in float32, 1 + softplus(raw) for raw below ~-16.6) sharpening is w /
    sum(w), whose derivative at a zero weight is not 0: a hand-written backward that gave 0
    there lost a given initial weighting's gradient in its zero rows."""
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
        assert expected[..., 1:].abs().amax() > 1  # the zero rows' part
        torch.testing.assert_close(got, expected, **F64)


@engine_param
def test_softplus_above_its_threshold_gives_eager_gradients(engine):
    # F.softplus is the identity above 20, so its derivative is 1 there, not sigmoid(raw)
    # (1.25e-9 off at 20.5 in float64).
    model, x = _model_and_input({}, torch.float64, 2, 5)
    with torch.no_grad():
        for kind in ("read", "write"):
            for field in ("beta", "gamma"):
                model.head_params.weight[model.head_layout.rows(kind, field)] = 0
                model.head_params.bias[model.head_layout.rows(kind, field)] = 20.5
    eager = _run(_eager(model), model, x)
    _assert_same(eager, _run(_on(model, engine), model, x), **F64)


@engine_param
def test_parameters_changed_in_place_are_seen(engine):
    """The engine caches a model's plan (sizes, row permutations), never its weights."""
    model, x = _model_and_input(CONFIGS["multi-head"], torch.float64, 3, 5)
    _assert_same(_run(_eager(model), model, x), _run(_on(model, engine), model, x), **F64)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    _assert_same(_run(_eager(model), model, x), _run(model, model, x), **F64)


# ------------------------------------------------------------------------------------------------
# Which engine serves which call.
# ------------------------------------------------------------------------------------------------


def _served_by(model, x, monkeypatch) -> str:
    """The engine that ran ``model(x)``: native if its library was called."""
    calls = []
    real = library.call
    monkeypatch.setattr(library, "call", lambda *a: calls.append(a[0]) or real(*a))
    model(x)
    return "native" if calls else "eager"


@needs_native
def test_default_is_auto_and_runs_native_on_the_cpu(monkeypatch):
    model = NTM(9, 8, memory_size=16)
    assert model.engine == "auto" and "engine" not in repr(model)
    assert _served_by(model, torch.rand(5, 2, 9), monkeypatch) == "native"
    model.engine = "eager"
    assert _served_by(model, torch.rand(5, 2, 9), monkeypatch) == "eager"


@needs_native
@pytest.mark.parametrize("engine", ["auto", "native"])
def test_calls_native_cannot_serve_run_eager_and_say_so_once(engine, monkeypatch, caplog):
    monkeypatch.setattr(engines.common, "_SAID", set())
    model = NTM(9, 8, memory_size=16, engine=engine)
    x = torch.rand(5, 2, 9)
    with caplog.at_level(logging.WARNING, logger="torch_ntm.engines"):
        for _ in range(2):  # said once
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert _served_by(model, x, monkeypatch) == "eager"
        bf16 = NTM(9, 8, memory_size=16, engine=engine, dtype=torch.bfloat16)
        assert _served_by(bf16, x.bfloat16(), monkeypatch) == "eager"
        params = dict(model.named_parameters())
        torch.func.functional_call(model, params, (x,))  # a torch.func transform's kind of call
        torch.func.grad(lambda p: torch.func.functional_call(model, p, (x,))[0].sum())(params)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert "torch.autocast" in messages[0] and "not torch.bfloat16" in messages[1]
    assert "torch.func" in messages[2]
    assert all(m.startswith(f"NTM engine {engine!r} runs this call on the eager engine") for m in
               messages)


@needs_native
def test_library_that_cannot_be_built_runs_eager_with_one_line(monkeypatch, caplog):
    model, x = _model_and_input({}, torch.float64, 2, 4)
    expected = _run(_eager(model), model, x)
    monkeypatch.setattr(library, "_LIBRARY", {kernels: {"error": "CalledProcessError: no compiler"}
                                              for kernels in KERNELS})
    monkeypatch.setattr(engines.common, "_SAID", set())
    with caplog.at_level(logging.WARNING, logger="torch_ntm.engines"):
        first = _run(model, model, x)
        _run(model, model, x)
    assert [r.getMessage() for r in caplog.records] == [
        "NTM engine 'auto' runs this call on the eager engine: the native library could not be "
        "built (CalledProcessError: no compiler)"]
    _assert_same(expected, first, **F64)


def test_unknown_and_legacy_engine_names():
    with pytest.raises(ValueError, match="unknown engine 'turbo'; valid choices: auto, native, "
                                         "graphs, eager"):
        NTM(3, 2, engine="turbo")
    for old in engines.LEGACY_ENGINES:  # configs of earlier versions: the default now
        assert NTM(3, 2, engine=old).engine == "auto"


# ------------------------------------------------------------------------------------------------
# Second derivatives: the eager engine's; the native one raises naming it.
# ------------------------------------------------------------------------------------------------


def _second_derivative_parts(engine: str):
    """A float64 model on ``engine`` with the eager one's weights, and an input needing grad."""
    torch.manual_seed(0)
    reference = NTM(9, 8, dtype=torch.float64, memory_size=16, engine="eager")
    model = NTM(9, 8, dtype=torch.float64, memory_size=16, engine=engine)
    model.load_state_dict(reference.state_dict())
    return reference, model, torch.rand(4, 2, 9, dtype=torch.float64)


@engine_param
@pytest.mark.parametrize("name", ["paper", "deep-lstm", "feedforward", "capped"])
def test_second_derivatives_equal_the_eager_engines(engine, name, monkeypatch, caplog):
    """A backward autograd cannot record (one C++ call) would give a wrong or zero second
    derivative: under create_graph=True the engine's backward is computed again through the
    eager step, so double backward, a gradient penalty on the parameters and a Jacobian-vector
    product by double backward equal the eager engine's (said once)."""
    monkeypatch.setattr(engines.common, "_SAID", set())
    torch.manual_seed(0)
    config = {k: v for k, v in CONFIGS[name].items() if k != "batch_first"}
    reference = NTM(9, 8, dtype=torch.float64, memory_size=16, engine="eager", **config)
    model = NTM(9, 8, dtype=torch.float64, memory_size=16, engine=engine, **config)
    model.load_state_dict(reference.state_dict())
    x0, direction = torch.rand(4, 2, 9, dtype=torch.float64), torch.randn(4, 2, 9).double()

    def second_derivatives(ntm):
        x = x0.clone().requires_grad_()
        (grad,) = torch.autograd.grad(ntm(x)[0].pow(2).sum(), x, create_graph=True)
        (double,) = torch.autograd.grad(grad.sum(), x)  # double backward
        ntm.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        (grad,) = torch.autograd.grad(ntm(x)[0].sum(), x, create_graph=True)
        grad.pow(2).sum().backward()  # a gradient penalty on the parameters
        penalty = {n: p.grad for n, p in ntm.named_parameters() if p.grad is not None}
        jvp = torch.autograd.functional.jvp(lambda x: ntm(x)[0], x0, direction)[1]
        return double, penalty, jvp

    with caplog.at_level(logging.WARNING, logger="torch_ntm.engines"):
        got, expected = second_derivatives(model), second_derivatives(reference)
    torch.testing.assert_close(got[0], expected[0], **F64)
    assert got[1].keys() == expected[1].keys()
    for key in expected[1]:
        torch.testing.assert_close(got[1][key], expected[1][key], **F64, msg=key)
    torch.testing.assert_close(got[2], expected[2], **F64)
    assert [r.getMessage() for r in caplog.records] == [
        "a second derivative through the native engine: its backward is computed again through "
        "the eager step (create_graph=True)"]


def test_the_eager_engine_gives_second_derivatives():
    """What the message points to: the eager loop's second derivative against central
    differences of its first."""
    reference, _, x0 = _second_derivative_parts("eager")
    direction = torch.randn_like(x0)

    def first(x):
        x = x.clone().requires_grad_()
        (grad,) = torch.autograd.grad(reference(x)[0].pow(2).sum(), x, create_graph=True)
        return x, grad

    x, grad = first(x0)
    (second,) = torch.autograd.grad(grad.sum(), x)
    eps = 1e-6
    plus, minus = (first(x0 + sign * eps * direction)[1].sum() for sign in (1, -1))
    numeric = (plus - minus) / (2 * eps)
    torch.testing.assert_close((second * direction).sum(), numeric, rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------------------------------------------
# The bench times what users run.
# ------------------------------------------------------------------------------------------------


def test_bench_rates_are_the_batch_over_the_median_time(monkeypatch):
    """A record's rates are its batch over the median of the timed repeats (each timing
    scripted here), and warm-up is what the first steps took beyond two steady ones."""
    from torch_ntm import bench

    seconds = iter([0.3, 0.5, 0.2, 0.4] + [0.1, 0.2, 0.05, 0.1, 0.4, 0.8])
    monkeypatch.setattr(bench._Runner, "time", lambda self, fn, steps: next(seconds))
    (record,) = bench.run_bench(batch_sizes=(4,), seq_len=2, memory_sizes=(8,), steps=1,
                                repeats=3, engines=("eager",), threads=1)
    # warm-up: train 0.3 + 0.5, infer 0.2 + 0.4; then each repeat a train and an infer timing
    assert record["train_seq_per_s"] == 4 / 0.1  # the median of 0.1, 0.05, 0.4
    assert record["infer_seq_per_s"] == 4 / 0.2  # of 0.2, 0.1, 0.8
    assert record["warmup_s"] == pytest.approx((0.8 - 2 * 0.1) + (0.6 - 2 * 0.2))


def test_bench_records_and_table():
    from torch_ntm.bench import format_table, run_bench

    records = run_bench(batch_sizes=(2,), seq_len=2, memory_sizes=(8,), steps=1, repeats=1,
                        engines=("auto", "eager"), threads=1)
    keys = {"engine", "runs_as", "device", "batch_size", "seq_len", "memory_size",
            "train_seq_per_s", "infer_seq_per_s", "warmup_s"}
    assert [r["engine"] for r in records] == ["auto", "eager"]
    assert [r["runs_as"] for r in records] == [FAST_ENGINES[0] if FAST_ENGINES else "eager",
                                               "eager"]
    for r in records:
        assert keys <= r.keys() and math.isfinite(r["train_seq_per_s"])
        assert (r["batch_size"], r["seq_len"], r["memory_size"]) == (2, 2, 8)
    table = format_table(records)
    assert "auto/eager" in table and f"auto ({records[0]['runs_as']})" in table
    with pytest.raises(ValueError, match="unknown engine 'turbo'; valid choices: auto, native"):
        run_bench(engines=("turbo",))


@pytest.mark.parametrize("model, kind", [("mann", "MANN"), ("dnc", "DNC")])
def test_bench_measures_the_mann_and_the_dnc(model, kind):
    # `ntm bench --model`: the model named, on the engine a user's model runs by default
    # (native where it is built), its rows as asked.
    from torch_ntm import bench

    records = bench.run_bench(batch_sizes=(2,), seq_len=2, memory_sizes=(8,), steps=1,
                              repeats=1, threads=1, model=model)
    assert [(r["model"], r["engine"]) for r in records] == [(model, "auto"), (model, "eager")]
    assert records[0]["runs_as"] == ("native" if FAST_ENGINES else "eager")
    assert all(r["train_seq_per_s"] > 0 and r["memory_size"] == 8 for r in records)
    task = bench.CopyTask().with_size(2)
    built = bench._Runner("auto", 8, task.sample(2), task, "cpu", 0, model).model
    assert type(built).__name__ == kind and built.memory_size == 8
    assert f"{model} auto/eager" in bench.format_table(records)
    with pytest.raises(ValueError, match="unknown model 'ntn'; valid choices: ntm, mann, dnc"):
        bench.run_bench(model="ntn")


@needs_native
def test_bench_trains_through_the_native_library(monkeypatch):
    from torch_ntm import bench

    calls = []
    real = library.call
    monkeypatch.setattr(library, "call", lambda *a: calls.append(a[0]) or real(*a))
    task = bench.CopyTask().with_size(3)
    batch = task.sample(2, torch.Generator().manual_seed(0))
    runners = {e: bench._Runner(e, 8, batch, task, "cpu", 0) for e in ("auto", "eager")}
    losses = {engine: float(runner.train_step()) for engine, runner in runners.items()}
    runners["auto"].infer_step()
    assert calls == ["torch_ntm_forward", "torch_ntm_backward", "torch_ntm_forward"]
    assert losses["auto"] == pytest.approx(losses["eager"], rel=1e-5)
    for a, b in zip(runners["auto"].model.parameters(), runners["eager"].model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_two_processes_build_the_library_at_once_without_a_lock(tmp_path):
    """Builds take no lock: two processes building the same library into an empty cache each
    load a complete one, and leave the library alone (no objects, no temporary files, no lock
    that a killed build could leave for the next to wait on)."""
    import subprocess
    import sys

    code = ("import torch; from torch_ntm.engines import library; "
            "print(library.available('mann', torch.float32), library.error('mann', "
            "torch.float32))")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    runs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [r.communicate(timeout=300)[0] for r in runs]
    assert [o.strip().splitlines()[-1] for o in outputs] == ["True None"] * 2, outputs
    (build,) = [p for p in tmp_path.iterdir() if p.name.startswith("torch_ntm_mann_")]
    assert [p.name for p in build.iterdir()] == [f"{build.name}.so"]


def test_a_failed_compile_names_the_file_and_the_first_error(tmp_path):
    source = tmp_path / "broken.cpp"
    source.write_text("int f() { return undeclared; }\n")
    with pytest.raises(RuntimeError, match=r"failed \(1\) on broken.cpp: .*error.*undeclared"):
        library._run({"broken.cpp": ["c++", "-c", str(source), "-o", str(tmp_path / "b.o")]})
