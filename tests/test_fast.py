"""The fast path computes exactly `NTM.forward`: outputs, final state and every gradient."""

import functools

import pytest
import torch

from torch_ntm import NTM
from torch_ntm import fast as fast_engine
from torch_ntm.fast import FastNTM, make_fast

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


def _eager(model):
    """The reference: `NTM._step` looped over time (independent of what `NTM.forward` runs)."""

    def forward(x, state=None):
        x, state = model._prepare(x, state)
        outputs = []
        for x_t in x:
            y, state = model._step(x_t, state)
            outputs.append(y)
        return model._finish(outputs), state

    return forward


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


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("batch,steps", [(1, 4), (3, 7)])
@pytest.mark.parametrize("keep", [True, False], ids=["keep", "recompute"])
def test_matches_eager_float64(name, batch, steps, keep):
    model, x = _model_and_input(CONFIGS[name], torch.float64, batch, steps)
    eager = _run(_eager(model), model, x)
    # The compiled path recomputes the addressing intermediates: test that uncompiled too.
    layout = fast_engine._layout(model, x.device, compile=False)
    layout = layout._replace(cfg=layout.cfg._replace(keep=keep))
    fast = functools.partial(fast_engine._forward, layout, model)
    _assert_same(eager, _run(fast, model, x), rtol=1e-10, atol=1e-12)


def test_matches_eager_float32_paper_model():
    torch.manual_seed(1)
    model = NTM(9, 8)  # the copy model of the paper: LSTM 100, memory 128 x 20
    x = torch.randint(0, 2, (41, 3, 9)).float()
    eager = _run(_eager(model), model, x)
    fast = _run(make_fast(model), model, x)
    _assert_same(eager, fast, rtol=1e-4, atol=1e-5)


def _in_two(forward, split=4):
    """``forward`` over a sequence in two calls, the state of the first carried into the second."""

    def run(x, state):
        y1, s1 = forward(x[:split], state)
        y2, s2 = forward(x[split:], s1)
        return torch.cat([y1, y2]), s2

    return run


def test_carried_state_equals_one_pass():
    model, x = _model_and_input(CONFIGS["multi-head"], torch.float64, 3, 9)
    whole = _run(_eager(model), model, x)
    _assert_same(whole, _run(_in_two(make_fast(model)), model, x), rtol=1e-10, atol=1e-12)


def test_given_state_gets_gradients():
    model, x = _model_and_input({}, torch.float64, 2, 5)
    state = model.initial_state(2)
    memory = (state.memory + 0.1 * torch.randn_like(state.memory)).requires_grad_()
    grads = []
    for fn in (_eager(model), make_fast(model)):
        logits, final = fn(x, state._replace(memory=memory))
        (g,) = torch.autograd.grad(_loss(logits, final), memory)
        grads.append(g)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-12)


def test_no_grad_and_inference_mode():
    model, x = _model_and_input(CONFIGS["deep-lstm"], torch.float64, 2, 5)
    expected, _ = _eager(model)(x)
    fast = make_fast(model)
    with torch.no_grad():
        torch.testing.assert_close(fast(x)[0], expected.detach())
    with torch.inference_mode():
        torch.testing.assert_close(fast(x)[0], expected.detach())


def test_no_nan_with_one_hot_weightings():
    # Very large key strengths and sharpening make the weightings exactly one-hot (zeros in w).
    model, x = _model_and_input({}, torch.float64, 2, 6)
    with torch.no_grad():
        model.head_params.bias.fill_(60.0)
    fast = _run(make_fast(model), model, x)
    assert all(torch.isfinite(g).all() for g in fast[3].values())
    _assert_same(_run(_eager(model), model, x), fast, rtol=1e-8, atol=1e-10)


def test_rejects_other_modules():
    with pytest.raises(TypeError, match="NTM"):
        FastNTM(torch.nn.LSTM(3, 4))


def test_compiled_matches_and_does_not_recompile():
    """One compiled graph per direction, reused for every sequence length (slowest test here)."""
    pytest.importorskip("torch._dynamo")
    from torch._dynamo.utils import counters

    model, x = _model_and_input({}, torch.float32, 2, 6)
    compiled = make_fast(model, compile=True)
    before = counters["stats"]["unique_graphs"]
    _assert_same(_run(_eager(model), model, x), _run(compiled, model, x), rtol=1e-4, atol=1e-5)
    graphs = counters["stats"]["unique_graphs"]
    for steps in (3, 9):
        x = torch.randn(steps, 2, 6)
        _assert_same(_run(_eager(model), model, x), _run(compiled, model, x), rtol=1e-4, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == graphs  # no recompilation for a new length
    with torch.no_grad():  # inference runs a leaner graph of its own
        torch.testing.assert_close(compiled(x)[0], _eager(model)(x)[0], rtol=1e-4, atol=1e-5)
    assert graphs - before <= 2  # one forward and one backward graph, the first step included


def test_fast_forward_function_matches_eager():
    model, x = _model_and_input(CONFIGS["multi-head"], torch.float64, 3, 5)
    from torch_ntm.fast import fast_forward

    eager = _run(_eager(model), model, x)
    fast = _run(lambda x, s: fast_forward(model, x, s), model, x)
    _assert_same(eager, fast, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # parameters changed in place: the cached layout still sees them
        for p in model.parameters():
            p.add_(0.01)
    fast = _run(lambda x, s: fast_forward(model, x, s), model, x)
    _assert_same(_run(_eager(model), model, x), fast, rtol=1e-10, atol=1e-12)


def test_bench_records_and_table():
    from torch_ntm.bench import format_table, run_bench

    records = run_bench(
        batch_sizes=(2,), seq_len=2, memory_sizes=(8,), steps=1, repeats=1,
        engines=("fast", "eager"), threads=1,
    )  # fmt: skip
    keys = {"engine", "device", "batch_size", "seq_len", "memory_size", "train_seq_per_s",
            "infer_seq_per_s"}  # fmt: skip
    assert [r["engine"] for r in records] == ["fast", "eager"]
    for r in records:
        assert keys <= r.keys() and r["train_seq_per_s"] > 0 and r["infer_seq_per_s"] > 0
        assert (r["batch_size"], r["seq_len"], r["memory_size"]) == (2, 2, 8)
    assert "fast/eager" in format_table(records)
    with pytest.raises(ValueError, match="unknown engine 'turbo'; valid choices: fast, compiled"):
        run_bench(engines=("turbo",))


def test_bench_trains_the_engine_it_names(monkeypatch):
    """The bench's training step runs the model's own dispatch (`NTM.forward`) with the task's
    loss: the fast engine's step goes through `fast_forward`, the eager one's does not, and both
    move the parameters alike."""
    import torch_ntm.model
    from torch_ntm import bench

    calls = []
    real = torch_ntm.model.fast_forward
    monkeypatch.setattr(torch_ntm.model, "fast_forward",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    task = bench.CopyTask().with_size(3)
    batch = task.sample(2, torch.Generator().manual_seed(0))
    runners = {e: bench._Runner(e, 8, batch, task, "cpu", 0) for e in ("fast", "eager")}
    losses = {}
    for engine, runner in runners.items():
        losses[engine] = float(runner.train_step())
        assert len(calls) == 1  # the fast step called it; the eager one did not
    assert losses["fast"] == pytest.approx(losses["eager"], rel=1e-5)
    for a, b in zip(runners["fast"].model.parameters(), runners["eager"].model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


@CUDA
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cuda_fast_path_matches_eager_float64(name):
    model, x = _model_and_input(CONFIGS[name], torch.float64, 3, 7)
    model, x = model.cuda(), x.cuda()
    eager = _run(_eager(model), model, x)
    fast = _run(make_fast(model), model, x)
    assert fast[1].device.type == "cuda" and all(g.is_cuda for g in fast[3].values())
    _assert_same(eager, fast, rtol=1e-10, atol=1e-12)


@CUDA
def test_cuda_compiled_matches_eager_float32():
    pytest.importorskip("torch._dynamo")
    model, x = _model_and_input(CONFIGS["multi-head"], torch.float32, 4, 9)
    model, x = model.cuda(), x.cuda()
    _assert_same(_run(_eager(model), model, x), _run(make_fast(model, compile=True), model, x),
                 rtol=1e-4, atol=1e-5)


def _second_derivative_parts(engine: str):
    """A float64 model on ``engine`` with the eager one's weights, and an input needing grad."""
    torch.manual_seed(0)
    reference = NTM(9, 8, dtype=torch.float64, memory_size=16, engine="eager")
    model = NTM(9, 8, dtype=torch.float64, memory_size=16, engine=engine)
    model.load_state_dict(reference.state_dict())
    return reference, model, torch.rand(4, 2, 9, dtype=torch.float64)


@pytest.mark.parametrize("engine", ["fast", "native"])
def test_a_second_derivative_raises_naming_the_eager_engine(engine):
    """The hand-written backward treats what it saved as constants: differentiating its result
    again gave a wrong second derivative without a word (12% off for a gradient penalty). Now
    both ways of asking for one raise, naming the fix; first derivatives with create_graph=True
    are unchanged."""
    from torch_ntm import native

    if engine == "native" and not native.available():
        pytest.skip("native library not built")
    reference, model, x0 = _second_derivative_parts(engine)
    x = x0.clone().requires_grad_()
    (grad,) = torch.autograd.grad(model(x)[0].pow(2).sum(), x, create_graph=True)
    x_ref = x0.clone().requires_grad_()
    (expected,) = torch.autograd.grad(reference(x_ref)[0].pow(2).sum(), x_ref, create_graph=True)
    torch.testing.assert_close(grad, expected)  # the first derivative itself is right
    with pytest.raises(RuntimeError, match='engine="eager"'):
        torch.autograd.grad(grad.sum(), x)  # double backward
    x = x0.clone().requires_grad_()
    (grad,) = torch.autograd.grad(model(x)[0].sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match='engine="eager"'):
        grad.pow(2).sum().backward()  # a gradient penalty on the parameters


def test_second_derivatives_only_through_the_incoming_gradients_stay_exact_on_fast():
    """The fast engine's backward, recorded under create_graph=True, is linear in the gradients
    it receives, and those derivatives were right before the guard: a Jacobian-vector product by
    double backward, and a penalty differentiated only through a layer after the NTM. They
    still are (against the eager loop); the native engine, whose backward autograd cannot
    record, raises for them instead of returning zeros."""
    from torch_ntm import native

    reference, model, x0 = _second_derivative_parts("fast")
    head = torch.nn.Linear(8, 1, dtype=torch.float64)
    direction = torch.randn_like(x0)

    def both(ntm):
        jvp = torch.autograd.functional.jvp(lambda x: ntm(x)[0], x0, direction)[1]
        x = x0.clone().requires_grad_()
        (grad,) = torch.autograd.grad(head(ntm(x)[0]).sum(), x, create_graph=True)
        return jvp, torch.autograd.grad(grad.pow(2).sum(), head.weight)[0]

    for got, want in zip(both(model), both(reference)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    if native.available():
        model.engine = "native"
        with pytest.raises(RuntimeError, match="'native' engine computes first derivatives only"):
            both(model)


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
