"""The graphs engine (CUDA graphs) as far as a CPU can test it: the buckets, the masked loop that
pads a sequence to its bucket, and the replay's plumbing (static inputs in, outputs and gradients
out, the cache of graphs, a second derivative, a failed capture) with a stand-in for CUDA's
capture that runs the same function; the engine's choice. The capture itself runs on a GPU
(scripts/gpu_check.sh)."""

import gc
import importlib.util
import logging
from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree

from torch_ntm import DNC, MANN, NTM, engines
from torch_ntm.baseline import LSTMBaseline
from torch_ntm.engines import graphs


def test_buckets_hold_the_length_in_multiples_of_8_growing_by_half():
    sizes = [graphs.bucket(n) for n in range(1, 400)]
    assert all(size >= n and size % 8 == 0 for n, size in zip(range(1, 400), sizes))
    assert sizes == sorted(sizes)
    assert sorted(set(sizes)) == [8, 16, 24, 32, 48, 72, 112, 168, 256, 384, 576]
    assert [graphs.bucket(n) for n in (4, 42)] == [8, 48]  # the copy task's shortest, longest
    # past 32 steps a bucket is at most 1.6 times the length it runs
    assert all(size <= 1.6 * n for n, size in zip(range(1, 400), sizes) if n > 32)
    with pytest.raises(ValueError, match="at least one step"):
        graphs.bucket(0)


def _models():
    torch.manual_seed(0)
    return [
        NTM(5, 4, controller_size=11, memory_size=7, memory_width=5, read_heads=2,
            write_heads=2, dtype=torch.float64, engine="eager"),
        NTM(5, 4, controller="feedforward", controller_size=11, memory_size=7, memory_width=5,
            dtype=torch.float64, engine="eager"),
        MANN(5, 4, controller_size=11, memory_size=7, memory_width=5, read_heads=3,
             dtype=torch.float64, engine="eager"),
        DNC(5, 4, controller_size=11, memory_size=7, memory_width=5, read_heads=2, write_heads=2,
            dtype=torch.float64, engine="eager"),
        DNC(5, 4, controller_size=11, memory_size=7, memory_width=5, read_heads=2, write_heads=2,
            sparse_link=3, dtype=torch.float64, engine="eager"),
        LSTMBaseline(5, 4, hidden_size=11, num_layers=2, dtype=torch.float64, engine="eager"),
    ]


MODEL_IDS = ["ntm", "ntm-feedforward", "mann", "dnc", "dnc-sparse", "lstm-baseline"]


def _loss(y, state):
    """Reaches every output of the sequence's own steps and every part of the final state."""
    leaves = pytree.tree_leaves(state)
    return y.square().sum() + sum((t * (i + 1)).sin().sum() for i, t in enumerate(leaves)
                                  if t.is_floating_point())


def _grads(model, x, run):
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    y, state = run(x, model.initial_state(x.shape[1], dtype=x.dtype))
    loss = _loss(y, state)
    names = [n for n, p in model.named_parameters()]
    found = torch.autograd.grad(loss, [x, *model.parameters()], allow_unused=True)
    return y.detach(), pytree.tree_map(lambda t: t.detach(), state), dict(zip(["x", *names], found))


def _eager(model):
    def run(x, state):
        outputs = []
        for x_t in x:
            y, state = model._step(x_t, state)
            outputs.append(y)
        return torch.stack(outputs), state

    return run


def _assert_same(a, b):
    (ya, sa, ga), (yb, sb, gb) = a, b
    torch.testing.assert_close(yb, ya, rtol=1e-12, atol=1e-13)
    for ta, tb in zip(pytree.tree_leaves(sa), pytree.tree_leaves(sb)):
        torch.testing.assert_close(tb, ta, rtol=1e-12, atol=1e-13)
    assert ga.keys() == gb.keys()
    for name in ga:
        assert (ga[name] is None) == (gb[name] is None), name
        if ga[name] is not None:
            torch.testing.assert_close(gb[name], ga[name], rtol=1e-12, atol=1e-13, msg=name)


@pytest.mark.parametrize("which", range(6), ids=MODEL_IDS)
def test_masked_padding_leaves_outputs_state_and_gradients_as_unpadded(which):
    # The padded steps hold garbage, not zeros: the mask alone must keep them out.
    model = _models()[which]
    x = torch.randn(6, 3, 5, dtype=torch.float64)

    def padded(x, state):
        garbage = torch.randn(5, *x.shape[1:], dtype=x.dtype) * 3
        active = torch.arange(11) < 6
        y, final = graphs.masked_loop(model._step, torch.cat([x, garbage]), active, state)
        return y[:6], final

    _assert_same(_grads(model, x, _eager(model)), _grads(model, x, padded))


class _Replayed:
    """A CPU stand-in for a captured CUDA graph: `replay` runs what the capture recorded."""

    def __init__(self, run):
        self.replay = run


def _cpu_capture(captures):
    """`graphs._capture` as the CPU can: the forward replay runs the function on the static
    inputs into the static outputs, the backward replay autograd's gradients into static ones
    (what the captured graphs compute); ``captures`` counts the captures."""

    def capture(fn, inputs, params, grad):
        captures.append(len(inputs))
        static = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        weights = [p.detach().requires_grad_(grad) for p in params]  # on the parameters' storage
        wrt = [t for t in static if t.requires_grad] + weights if grad else []
        box = graphs._Graphs(static, [], None)

        def forward():  # what the forward graph computes: fn's outputs from the static inputs
            with torch.set_grad_enabled(grad):
                box.live = fn(*static, *weights)
            for o, new in zip(box.outputs, box.live):
                o.copy_(new)

        def backward():  # and the backward graph: their gradients, given the static ones
            pairs = [(o, g) for o, g in zip(box.live, box.grad_outputs) if g is not None]
            found = torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                        allow_unused=True)
            if box.grads is None:
                box.grads = [None if g is None else torch.empty_like(g) for g in found]
            for slot, g in zip(box.grads, found):
                if slot is not None:
                    slot.copy_(g)

        with torch.set_grad_enabled(grad):
            box.live = fn(*static, *weights)
        box.outputs = [o.detach().clone() for o in box.live]
        box.forward = _Replayed(forward)
        if grad:
            box.grad_outputs = [torch.zeros_like(o) if o.requires_grad else None
                                for o in box.live]
            backward()
            box.backward = _Replayed(backward)
        return box

    return capture


@pytest.mark.parametrize("which", [0, 2, 3, 4, 5], ids=[MODEL_IDS[i] for i in (0, 2, 3, 4, 5)])
def test_replayed_sequence_matches_eager_and_captures_once_per_bucket(which, monkeypatch):
    model = _models()[which]
    captures = []
    monkeypatch.setattr(graphs, "_capture", _cpu_capture(captures))

    def on_graphs(x, state):
        loop = getattr(model, "_loop_state", lambda s: s)  # the DNC's sparse link, as forward
        y, final = graphs.forward(model, x, loop(state), model._step)
        return y, getattr(model, "_public_state", lambda s: s)(final)

    for T in (6, 7, 3):  # buckets 8, 8, 8: one capture
        x = torch.randn(T, 3, 5, dtype=torch.float64)
        _assert_same(_grads(model, x, _eager(model)), _grads(model, x, on_graphs))
    assert len(captures) == 1
    x = torch.randn(9, 3, 5, dtype=torch.float64)  # bucket 16: a second
    _assert_same(_grads(model, x, _eager(model)), _grads(model, x, on_graphs))
    with torch.no_grad():  # inference: a graph without a backward
        y, _ = on_graphs(x, model.initial_state(3, dtype=x.dtype))
    torch.testing.assert_close(y, _eager(model)(x, model.initial_state(3, dtype=x.dtype))[0])
    assert len(captures) == 3
    with torch.no_grad():  # parameters given new storage: captured again, the stale ones go
        for p in model.parameters():
            p.data = p.data.clone()
    _assert_same(_grads(model, x, _eager(model)), _grads(model, x, on_graphs))
    assert len(captures) == 4 and len(graphs._GRAPHS[model]) == 1


def test_second_derivative_through_a_replay_is_the_eager_one(monkeypatch, caplog):
    # The backward is a replay autograd cannot record: under create_graph=True it is computed
    # again through the eager loop. A gradient penalty's gradient, both ways.
    model = _models()[0]
    monkeypatch.setattr(graphs, "_capture", _cpu_capture([]))
    x = torch.randn(5, 2, 5, dtype=torch.float64)

    def penalty_grads(run):
        state = model.initial_state(2, dtype=x.dtype)
        y, final = run(x, state)
        params = list(model.parameters())
        first = torch.autograd.grad(_loss(y, final), params, create_graph=True,
                                    allow_unused=True)
        penalty = sum(g.square().sum() for g in first if g is not None)
        return torch.autograd.grad(penalty, params, allow_unused=True)

    eager = penalty_grads(_eager(model))
    with caplog.at_level(logging.WARNING, logger="torch_ntm.engines"):
        replayed = penalty_grads(lambda x, s: graphs.forward(model, x, s, model._step))
    assert "a second derivative through the graphs engine" in caplog.text
    for a, b in zip(eager, replayed):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def test_a_failed_capture_is_said_once_and_that_shape_runs_eager(monkeypatch, caplog):
    model = _models()[0]
    calls = []

    def failing(*args):
        calls.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "_capture", failing)
    model.engine = "graphs"
    x = torch.randn(6, 3, 5, dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger="torch_ntm.engines"):
        for _ in range(2):
            _assert_same(_grads(model, x, _eager(model)),
                         _grads(model, x, lambda x, s: graphs.forward(model, x, s, model._step)))
        assert "could not capture a sequence of 8 steps at batch 3" in graphs.why_not(model, x)
        # another batch size is another shape
        assert "could not capture" not in graphs.why_not(model, x[:, :2])
        engines.choose(model, x, None)  # what runs_on asks: said already, not again
    assert len(calls) == 1  # not tried again for that shape
    said = [r.getMessage() for r in caplog.records if "could not capture" in r.getMessage()]
    assert len(said) == 1 and "8 steps" in said[0] and "operation not permitted" in said[0]


def test_the_lstm_baselines_step_is_nn_lstms():
    """The graphs engine runs `LSTMBaseline._step` (torch.lstm_cell with nn.LSTM's weights);
    eager runs nn.LSTM itself: the same outputs, final state and gradients in float64."""
    model = _models()[5]
    x = torch.randn(6, 3, 5, dtype=torch.float64)

    def lstm(x, state):
        return model(x, state)

    _assert_same(_grads(model, x, _eager(model)), _grads(model, x, lstm))


def test_graphs_engine_serves_cuda_inputs_only_and_says_why_not(caplog):
    model = _models()[0]
    assert engines.check_engine("graphs") == "graphs"
    model.engine = "graphs"
    x = torch.randn(4, 2, 5, dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger="torch_ntm.engines"):
        assert model.runs_on(x) == "eager"
        y, _ = model(x)
    assert any("runs on a CUDA GPU, not cpu" in r.getMessage() for r in caplog.records)
    model.engine = "eager"
    torch.testing.assert_close(y, model(x)[0])
    assert graphs.why_not(model, x.to("meta")) == "the graphs engine runs on a CUDA GPU, not meta"
    model.engine = "auto"  # on the CPU, auto is never graphs
    assert model.runs_on(x) in ("native", "eager")


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


@cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("which", range(6), ids=MODEL_IDS)
def test_cuda_graphs_match_eager_and_capture_once_per_bucket(which, dtype):
    # The real capture (scripts/gpu_check.sh runs this on a GPU): two lengths of one bucket and
    # one of another, gradients included, from the initial state and from one passed in; then
    # the same shapes replay, no capture.
    model = _models()[which].to("cuda", dtype)
    model.engine = "graphs"
    for T in (6, 7, 9, 6):
        x = torch.randn(T, 3, 5, dtype=dtype, device="cuda")
        assert model.runs_on(x) == "graphs"
        got = _grads(model, x, lambda x, s: model(x, s))
        expected = _grads(model, x, _eager(model))
        if dtype == torch.float64:
            _assert_same(expected, got)
        else:
            torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-5)
        assert model.runs_on(x) == "graphs", graphs.why_not(model, x)
    assert len(graphs._GRAPHS[model]) == 2


def _forward_backward(model, x):
    y, _ = model(x)
    y.square().sum().backward()
    return y


@cuda
def test_cuda_capture_with_an_earlier_eager_graph_alive_and_a_fused_optimizer():
    # A loss kept from an eager pass (its autograd graph alive: the parameters' gradient
    # accumulators on the default stream) used to fail the capture; then a fused Adam, a model
    # moved to the CPU and back, and parameters replaced.
    model = _models()[0].to("cuda")
    x = torch.randn(6, 3, 5, dtype=torch.float64, device="cuda")
    model.engine = "eager"
    kept, _ = model(x)  # not backward: its graph stays
    model.engine = "graphs"
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    for _ in range(3):
        optimizer.zero_grad()
        _forward_backward(model, x)
        optimizer.step()
        assert model.runs_on(x) == "graphs" and graphs._GRAPHS[model]
    assert kept.grad_fn is not None  # alive all along
    del kept
    model.cpu().cuda()
    with torch.no_grad():
        model.output.weight = torch.nn.Parameter(model.output.weight.clone())
    got = _grads(model, x, lambda x, s: model(x, s))
    _assert_same(_grads(model, x, _eager(model)), got)
    assert model.runs_on(x) == "graphs" and len(graphs._GRAPHS[model]) == 1


def _fails_under_capture():
    """scripts/gpu_check.py's NTM whose step reads a value on the host while a CUDA graph is
    captured (``how = "sync"``: a real capture failure) or raises there (``"raise"``)."""
    path = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._FailsUnderCapture


@cuda
@pytest.mark.parametrize("how", ["sync", "raise"])
def test_cuda_failed_capture_leaves_the_process_as_it_was(how, caplog):
    torch.manual_seed(0)
    warm = _models()[0].cuda()  # the engine's side streams made, with their workspaces
    warm.engine = "graphs"
    _forward_backward(warm, torch.randn(6, 3, 5, dtype=torch.float64, device="cuda"))
    model = _fails_under_capture()(5, 4, controller_size=11, memory_size=7, memory_width=5,
                                     dtype=torch.float64, device="cuda")
    model.how = how
    x = torch.randn(6, 3, 5, dtype=torch.float64, device="cuda")
    torch.cuda.manual_seed(7)
    expected_random = torch.randn(4, device="cuda")
    gc.collect()  # an earlier test's garbage, which the failure's own collection would free
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    torch.cuda.manual_seed(7)
    stream = torch.cuda.current_stream()
    with caplog.at_level(logging.WARNING, logger="torch_ntm.engines"):
        assert model.runs_on(x) == "graphs"
        got = _grads(model, x, lambda x, s: model(x, s))
        assert model.runs_on(x) == "eager"
        again = _grads(model, x, lambda x, s: model(x, s))
    said = [r.getMessage() for r in caplog.records if "could not capture" in r.getMessage()]
    assert len(said) == 1
    assert torch.cuda.current_stream() == stream
    # the RNG as before the capture: the same numbers as without it, and nn.init works
    torch.testing.assert_close(torch.randn(4, device="cuda"), expected_random)
    torch.nn.init.normal_(torch.empty(3, device="cuda"))
    model.engine = "eager"
    _assert_same(_grads(model, x, _eager(model)), got)
    _assert_same(got, again)
    del got, again
    graphs._GRAPHS.pop(model, None)
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated


def test_hooks_inside_the_model_keep_it_off_the_graphs_engine():
    # A replay calls none of the model's modules, so their hooks would silently not run; the
    # model's own hooks run around forward as ever and do not count.
    model = _models()[0]
    assert not graphs._hooked_inside(model)
    handle = model.register_forward_hook(lambda *args: None)
    assert not graphs._hooked_inside(model)
    handle.remove()
    handle = model.controller.register_forward_hook(lambda *args: None)
    assert graphs._hooked_inside(model)
    handle.remove()
    handle = model.head_params.register_full_backward_hook(lambda *args: None)
    assert graphs._hooked_inside(model)
    handle.remove()
    assert not graphs._hooked_inside(model)
