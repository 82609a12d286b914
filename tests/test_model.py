"""Tests of the `NTMCell` and `NTM` modules.

A hand-composed step (the controller, head split and activations computed from the parameters,
then the functional ops in write-then-read order) pins what one step computes; equivalences pin
the recurrent contract (cell == sequence, two halves with carried state == one pass,
batch_first == time-major, float32 ~ float64, CUDA ~ CPU); the rest pins initial state,
checkpoint portability (including to a larger memory), gradients, the trace and error messages.
Models are tiny and sizes unequal (B=3, T=6, N=7, M=5) so that a swapped axis fails.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import pydoc

import pytest
import torch
import torch.nn.functional as tnf

from torch_ntm import NTM, NTMCell, NTMState, NTMTrace
from torch_ntm import functional as F
from torch_ntm.model import NTMOptions

IN, OUT, B, T = 4, 3, 3, 6
SMALL = {"controller_size": 8, "memory_size": 7, "memory_width": 5}
N, M = SMALL["memory_size"], SMALL["memory_width"]

CONFIGS = {
    "lstm": {},
    "heads_3r_2w": {"read_heads": 3, "write_heads": 2},
    "lstm_2_layers": {"controller_layers": 2},
    "feedforward": {"controller": "feedforward", "controller_layers": 2},
    "shift_range_2": {"shift_range": 2},
    "shift_range_3": {"shift_range": 3},  # 2R+1 == N
    "memory_learned": {"memory_init": "learned", "read_heads": 2},
    "memory_random": {"memory_init": "random"},
    "read_only": {"write_heads": 0},
}
config_params = pytest.mark.parametrize("cfg", list(CONFIGS.values()), ids=list(CONFIGS))


def build(cls=NTM, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    return cls(IN, OUT, **{**SMALL, **kwargs})


def inputs(seed: int = 1, shape=(T, B, IN), dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def assert_states_close(a: NTMState, b: NTMState, **tol) -> None:
    assert len(a.controller) == len(b.controller)
    for x, y in zip(a.controller, b.controller):
        torch.testing.assert_close(x, y, **tol)
    for name in ("memory", "read_weights", "write_weights", "reads"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), **tol, msg=name)


def random_state(model, batch: int, seed: int) -> NTMState:
    """A state far from the initial one: random memory, spread weightings, random reads."""
    g = torch.Generator().manual_seed(seed)
    dt = model.reads0.dtype

    def randn(*shape):
        return torch.randn(shape, generator=g, dtype=dt)

    n, m = model.memory_size, model.memory_width
    controller = ()
    if model.controller_type == "lstm":
        shape = (model.controller_layers, batch, model.controller_size)
        controller = (randn(*shape), randn(*shape))
    return NTMState(
        controller=controller,
        memory=randn(batch, n, m),
        read_weights=torch.softmax(2 * randn(batch, model.read_heads, n), -1),
        write_weights=torch.softmax(2 * randn(batch, model.write_heads, n), -1),
        reads=randn(batch, model.read_heads, m),
    )


# --------------------------------------------------------------------------------------------
# What one step computes: a reference composed by hand from the parameters.
# --------------------------------------------------------------------------------------------


def reference_step(model, x: torch.Tensor, state: NTMState):
    """One NTM step from the parameters and the functional ops (section 3 of the paper)."""
    p = dict(model.named_parameters())
    b, m, r = x.shape[0], model.memory_width, model.shift_range
    hr, hw = model.read_heads, model.write_heads

    # Controller input is [x_t, r_{t-1}].
    inp = torch.cat([x, state.reads.reshape(b, hr * m)], dim=-1)
    new_ctrl = ()
    if model.controller_type == "lstm":
        h_prev, c_prev = state.controller
        hs, cs = [], []
        for layer in range(model.controller_layers):
            pre = f"controller.cells.{layer}."
            gates = (
                inp @ p[pre + "weight_ih"].T
                + p[pre + "bias_ih"]
                + h_prev[layer] @ p[pre + "weight_hh"].T
                + p[pre + "bias_hh"]
            )
            i, f, g, o = gates.chunk(4, dim=-1)  # PyTorch's gate order
            c = torch.sigmoid(f) * c_prev[layer] + torch.sigmoid(i) * torch.tanh(g)
            inp = torch.sigmoid(o) * torch.tanh(c)
            hs.append(inp)
            cs.append(c)
        new_ctrl = (torch.stack(hs), torch.stack(cs))
    else:
        for layer in range(model.controller_layers):
            pre = f"controller.layers.{layer}."
            inp = torch.tanh(inp @ p[pre + "weight"].T + p[pre + "bias"])
    h = inp

    # One linear layer emits all head parameters: read heads first, then write heads; each head's
    # fields are key (M), beta, gate, shift (2R+1), gamma[, erase (M), add (M)].
    raw = h @ p["head_params.weight"].T + p["head_params.bias"]
    fields_read = m + 3 + (2 * r + 1)
    read_raw = raw[:, : hr * fields_read].reshape(b, hr, fields_read)
    write_raw = raw[:, hr * fields_read :].reshape(b, hw, fields_read + 2 * m)

    def capped(x, cap):  # cap * tanh(x / cap), or x itself when unbounded
        return x if cap is None else cap * torch.tanh(x / cap)

    gamma_cap = None if model.max_gamma is None else model.max_gamma - 1.0

    def head(raw_h):
        s_end = m + 2 + 2 * r + 1
        return {
            "key": torch.tanh(raw_h[..., :m]),
            "beta": capped(tnf.softplus(raw_h[..., m : m + 1]), model.max_beta),
            "gate": torch.sigmoid(raw_h[..., m + 1 : m + 2]),
            "s": torch.softmax(raw_h[..., m + 2 : s_end], dim=-1),
            "gamma": 1.0 + capped(tnf.softplus(raw_h[..., s_end : s_end + 1]), gamma_cap),
            "erase": torch.sigmoid(raw_h[..., s_end + 1 : s_end + 1 + m]),
            "add": torch.tanh(raw_h[..., s_end + 1 + m :]),
        }

    def address(memory, w_prev, hp):
        return F.address(memory, w_prev, hp["key"], hp["beta"], hp["gate"], hp["s"], hp["gamma"])

    # Write heads address M_{t-1} and write; read heads address M_t and read it.
    memory, w_write = state.memory, state.write_weights
    if hw:
        wp = head(write_raw)
        w_write = address(memory, w_write, wp)
        memory = F.write(memory, w_write, wp["erase"], wp["add"])
    w_read = address(memory, state.read_weights, head(read_raw))
    reads = F.read(memory, w_read)
    logits = torch.cat([h, reads.reshape(b, hr * m)], -1) @ p["output.weight"].T + p["output.bias"]
    return logits, NTMState(new_ctrl, memory, w_read, w_write, reads)


@pytest.mark.parametrize(
    "cfg",
    [
        {"read_heads": 2, "write_heads": 2},
        {"controller_layers": 2, "shift_range": 2},
        {"controller": "feedforward"},
        {"write_heads": 0},
        {"max_beta": 1.5, "max_gamma": 1.2},
    ],
    ids=["heads_2r_2w", "lstm_2_layers_shift_2", "feedforward", "read_only", "capped"],
)
def test_cell_step_matches_a_reference_composed_from_parameters(cfg):
    cell = build(NTMCell, dtype=torch.float64, **cfg)
    x = inputs(shape=(B, IN))
    for state in (random_state(cell, B, seed=2), cell.initial_state(B)):
        logits, new_state = cell(x, state)
        ref_logits, ref_state = reference_step(cell, x, state)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-10, atol=1e-12)
        assert_states_close(new_state, ref_state, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------------
# The recurrent contract.
# --------------------------------------------------------------------------------------------


@config_params
def test_stepping_the_cell_equals_the_sequence_module(cfg):
    ntm = build(NTM, dtype=torch.float64, **cfg)
    cell = build(NTMCell, seed=99, dtype=torch.float64, **cfg)  # other weights until loaded
    cell.load_state_dict(ntm.state_dict())
    x = inputs()
    state0 = ntm.initial_state(B)  # shared, so that a random memory init is the same draw
    logits, state = ntm(x, state0)
    cell_state, steps = state0, []
    for x_t in x:
        y, cell_state = cell(x_t, cell_state)
        steps.append(y)
    torch.testing.assert_close(torch.stack(steps), logits, rtol=1e-12, atol=1e-12)
    assert_states_close(cell_state, state, rtol=1e-12, atol=1e-12)
    # And back: an NTM loads a cell's state_dict.
    ntm2 = build(NTM, seed=98, dtype=torch.float64, **cfg)
    ntm2.load_state_dict(cell.state_dict())
    torch.testing.assert_close(ntm2(x, state0)[0], logits, rtol=0.0, atol=0.0)


@config_params
def test_two_halves_with_carried_state_equal_one_pass(cfg):
    ntm = build(NTM, dtype=torch.float64, **cfg)
    x = inputs()
    state0 = ntm.initial_state(B)
    full, full_state = ntm(x, state0)
    # state0 is built from parameters and shared by both runs: keep its graph for the second.
    named = [(n, p) for n, p in ntm.named_parameters() if p.numel()]  # skip (0, 1) focus
    params = [p for _, p in named]
    full_grads = torch.autograd.grad(full.square().sum(), params, retain_graph=True)
    first, mid_state = ntm(x[:2], state0)
    second, end_state = ntm(x[2:], mid_state)
    halves = torch.cat([first, second])
    torch.testing.assert_close(halves, full, rtol=1e-12, atol=1e-12)
    assert_states_close(end_state, full_state, rtol=1e-12, atol=1e-12)
    # The carried state keeps the graph: gradients of the whole sequence are the same.
    half_grads = torch.autograd.grad(halves.square().sum(), params)
    for (name, _), g1, g2 in zip(named, full_grads, half_grads):
        torch.testing.assert_close(g2, g1, rtol=1e-10, atol=1e-12, msg=name)


def test_batch_first_equals_time_major_transposed():
    ntm = build(NTM, dtype=torch.float64, read_heads=2)
    ntm_bf = build(NTM, seed=5, dtype=torch.float64, read_heads=2, batch_first=True)
    ntm_bf.load_state_dict(ntm.state_dict())
    x = inputs()  # (T, B, IN)
    logits, state = ntm(x)
    logits_bf, state_bf = ntm_bf(x.transpose(0, 1).contiguous())
    assert logits_bf.shape == (B, T, OUT)
    torch.testing.assert_close(logits_bf, logits.transpose(0, 1), rtol=1e-12, atol=1e-12)
    assert_states_close(state_bf, state, rtol=1e-12, atol=1e-12)


def test_the_module_holds_no_sequence_state():
    # Running twice gives the same answer, and two interleaved sequences do not interfere.
    cell = build(NTMCell, dtype=torch.float64)
    xa, xb = inputs(seed=1), inputs(seed=2)
    separate = []
    for x in (xa, xb):
        state, ys = None, []
        for x_t in x:
            y, state = cell(x_t, state)
            ys.append(y)
        separate.append(torch.stack(ys))
    sa = sb = None
    ya, yb = [], []
    for xa_t, xb_t in zip(xa, xb):
        y, sa = cell(xa_t, sa)
        ya.append(y)
        y, sb = cell(xb_t, sb)
        yb.append(y)
    torch.testing.assert_close(torch.stack(ya), separate[0], rtol=0.0, atol=0.0)
    torch.testing.assert_close(torch.stack(yb), separate[1], rtol=0.0, atol=0.0)
    assert not torch.allclose(separate[0], separate[1])


@pytest.mark.parametrize("controller", ["lstm", "feedforward"])
def test_float32_and_float64_models_agree(controller):
    ntm64 = build(NTM, dtype=torch.float64, controller=controller, write_heads=2)
    ntm32 = build(NTM, seed=7, controller=controller, write_heads=2)
    ntm32.load_state_dict(ntm64.state_dict())  # copy_ casts to float32
    assert all(p.dtype == torch.float32 for p in ntm32.parameters())
    assert all(p.dtype == torch.float64 for p in ntm64.parameters())
    x = inputs()
    logits64, state64 = ntm64(x)
    logits32, state32 = ntm32(x.float())
    assert logits64.dtype == torch.float64 and logits32.dtype == torch.float32
    assert state32.memory.dtype == torch.float32
    torch.testing.assert_close(logits32, logits64.float(), rtol=1e-4, atol=1e-5)
    state64_as_32 = NTMState(
        tuple(t.float() for t in state64.controller), *(t.float() for t in state64[1:])
    )
    assert_states_close(state32, state64_as_32, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu(dtype):
    cpu = build(NTM, dtype=torch.float64, read_heads=2, write_heads=2)
    gpu = build(NTM, seed=3, device="cuda", dtype=dtype, read_heads=2, write_heads=2)
    gpu.load_state_dict(cpu.state_dict())
    assert all(p.device.type == "cuda" for p in gpu.parameters())
    x = inputs()
    logits, state = gpu(x.to("cuda", dtype))
    assert logits.device.type == "cuda" and state.memory.device.type == "cuda"
    assert gpu.initial_state(B).memory.device.type == "cuda"
    expected, _ = cpu(x)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}
    torch.testing.assert_close(logits.cpu(), expected.to(dtype), **tol)
    logits.square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in gpu.parameters())


# --------------------------------------------------------------------------------------------
# Parameters, initial state, checkpoints.
# --------------------------------------------------------------------------------------------


def test_a_state_dict_loads_into_a_larger_memory_unchanged_and_runs():
    small = build(NTM, memory_size=128, controller_size=6)
    large = build(NTM, seed=4, memory_size=1024, controller_size=6)
    large.load_state_dict(small.state_dict())  # strict: same names, same shapes
    for (name, p_small), (_, p_large) in zip(small.named_parameters(), large.named_parameters()):
        torch.testing.assert_close(p_large, p_small, rtol=0.0, atol=0.0, msg=name)
    x = inputs(shape=(3, 2, IN), dtype=torch.float32)
    logits, state = large(x)
    assert state.memory.shape == (2, 1024, M)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(state.read_weights.sum(-1), torch.ones(2, 1))


@config_params
def test_every_parameter_gets_a_finite_nonzero_gradient(cfg):
    # Default float32 and, for the constant init, the default 1e-6 memory: no NaN anywhere.
    ntm = build(NTM, **cfg)
    logits, state = ntm(inputs(dtype=torch.float32))
    loss = logits.square().sum() + state.memory.square().sum() + state.reads.sum()
    loss.backward()
    assert torch.isfinite(logits).all()
    for name, p in ntm.named_parameters():
        if p.numel() == 0:  # write_focus0 of a model without write heads
            continue
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
        # in the parameter's own layout, as DistributedDataParallel expects (it warned of the
        # focus logits' gradient, a [H, 1] slice of an [H, N] one)
        assert p.grad.stride() == p.stride(), name


@pytest.mark.parametrize("memory_size", [7, 128])
@config_params
def test_initial_state(cfg, memory_size):
    ntm = build(NTM, memory_size=memory_size, **cfg)
    state = ntm.initial_state(B)
    hr, hw = ntm.read_heads, ntm.write_heads
    assert state.memory.shape == (B, memory_size, M)
    assert state.read_weights.shape == (B, hr, memory_size)
    assert state.write_weights.shape == (B, hw, memory_size)
    assert state.reads.shape == (B, hr, M)
    for w in (state.read_weights, state.write_weights):
        assert (w >= 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(B, w.shape[1]))
        assert (w[..., 0] > 0.99).all()  # focused on row 0 after initialisation
    if ntm.memory_init == "constant":
        expected = torch.full_like(state.memory, 1e-6)
        torch.testing.assert_close(state.memory, expected, rtol=0.0, atol=0.0)
    elif ntm.memory_init == "learned":
        expected = ntm.memory0.expand_as(state.memory)  # one learned row, shared by all rows
        torch.testing.assert_close(state.memory, expected, rtol=0.0, atol=0.0)
    else:  # random: small, and drawn anew for every sequence
        again = ntm.initial_state(B).memory
        assert not torch.allclose(again, state.memory)
        assert state.memory.abs().max() <= 1.0 / (memory_size + M) ** 0.5
    if ntm.controller_type == "lstm":
        h, c = state.controller
        assert h.shape == c.shape == (ntm.controller_layers, B, ntm.controller_size)
    else:
        assert state.controller == ()


def test_initial_state_follows_the_requested_dtype():
    ntm = build(NTM)
    state = ntm.initial_state(2, dtype=torch.float64)
    assert all(t.dtype == torch.float64 for t in (*state.controller, *state[1:]))
    torch.testing.assert_close(state.reads, ntm.reads0.double().expand(2, -1, -1))
    # And an NTM of float64 parameters (dtype=) starts from a float64 state by default.
    ntm64 = build(NTM, dtype=torch.float64)
    assert ntm64.initial_state(2).memory.dtype == torch.float64


def test_lstm_forget_gate_bias_is_one():
    ntm = build(NTM, controller_layers=2)
    c = ntm.controller_size
    biases = {n: p for n, p in ntm.named_parameters() if "bias_ih" in n or "bias_hh" in n}
    assert len(biases) == 4
    for layer in range(2):
        pre = f"controller.cells.{layer}."
        total = biases[pre + "bias_ih"] + biases[pre + "bias_hh"]
        torch.testing.assert_close(total[c : 2 * c], torch.ones(c), rtol=0.0, atol=0.0)
        assert not torch.allclose(total[:c], torch.ones(c))  # the other gates keep their init


# --------------------------------------------------------------------------------------------
# The trace.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [{"read_heads": 3, "write_heads": 2}, {"write_heads": 0}])
def test_trace_records_every_step_and_matches_forward(cfg):
    ntm = build(NTM, dtype=torch.float64, batch_first=True, engine="eager", **cfg)
    x = inputs(shape=(B, T, IN))
    state0 = ntm.initial_state(B)
    logits, state = ntm(x, state0)
    t_logits, t_state, trace = ntm.trace(x, state0)
    assert isinstance(trace, NTMTrace)
    # The trace runs the eager step: bit for bit the eager engine's forward ...
    torch.testing.assert_close(t_logits, logits, rtol=0.0, atol=0.0)
    assert_states_close(t_state, state, rtol=0.0, atol=0.0)
    # ... and the default engine's to float64 rounding.
    ntm.engine = "auto"
    f_logits, f_state = ntm(x, state0)
    torch.testing.assert_close(f_logits, logits, rtol=1e-10, atol=1e-12)
    assert_states_close(f_state, state, rtol=1e-10, atol=1e-12)
    hr, hw = ntm.read_heads, ntm.write_heads
    assert trace.read_weights.shape == (T, B, hr, N)
    assert trace.write_weights.shape == (T, B, hw, N)
    assert trace.erase.shape == trace.add.shape == (T, B, hw, M)
    assert trace.memory.shape == (T, B, N, M)
    # The last step is the returned state, and each recorded memory is the previous one with the
    # recorded weighting, erase and add written into it.
    torch.testing.assert_close(trace.memory[-1], state.memory, rtol=0.0, atol=0.0)
    torch.testing.assert_close(trace.read_weights[-1], state.read_weights, rtol=0.0, atol=0.0)
    torch.testing.assert_close(trace.write_weights[-1], state.write_weights, rtol=0.0, atol=0.0)
    previous = state0.memory
    for t in range(T):
        expected = F.write(previous, trace.write_weights[t], trace.erase[t], trace.add[t])
        torch.testing.assert_close(trace.memory[t], expected, rtol=1e-12, atol=1e-12)
        previous = trace.memory[t]
    for w in (trace.read_weights, trace.write_weights):
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1], dtype=torch.float64))
    assert ((trace.erase >= 0) & (trace.erase <= 1)).all()


# --------------------------------------------------------------------------------------------
# Errors that say what was expected and what was given.
# --------------------------------------------------------------------------------------------


def test_wrong_input_width_or_rank_names_expected_and_actual_shape():
    ntm, cell = build(NTM), build(NTMCell)
    ntm_bf = build(NTM, batch_first=True)
    with pytest.raises(ValueError, match=r"\[time, batch, 4\], got \[6, 3, 5\]"):
        ntm(torch.zeros(T, B, IN + 1))
    with pytest.raises(ValueError, match=r"\[time, batch, 4\], got \[3, 4\]"):
        ntm(torch.zeros(B, IN))
    with pytest.raises(ValueError, match=r"\[batch, time, 4\], got \[3, 6, 2\]"):
        ntm_bf(torch.zeros(B, T, 2))
    with pytest.raises(ValueError, match=r"\[batch, 4\], got \[3, 5\]"):
        cell(torch.zeros(B, IN + 1))
    with pytest.raises(ValueError, match=r"\[batch, 4\], got \[6, 3, 4\]"):
        cell(torch.zeros(T, B, IN))


def test_state_from_another_batch_size_is_rejected():
    ntm, cell = build(NTM), build(NTMCell)
    pattern = r"state\.memory has shape \[2, 7, 5\], expected \[3, 7, 5\]"
    with pytest.raises(ValueError, match=pattern):
        ntm(torch.zeros(T, B, IN), ntm.initial_state(2))
    with pytest.raises(ValueError, match=pattern):
        cell(torch.zeros(B, IN), cell.initial_state(2))
    _, state = ntm(torch.zeros(T, 2, IN))  # a state returned by forward, too
    with pytest.raises(ValueError, match=pattern):
        ntm(torch.zeros(T, B, IN), state)


def test_a_state_field_of_another_dtype_is_named():
    """Only the memory's dtype was checked: reads of another dtype met the native engine's bare
    assertion, or a matmul's dtype error."""
    ntm, cell = build(NTM), build(NTMCell)
    _, state = ntm(torch.zeros(T, B, IN))
    bad = state._replace(reads=state.reads.double())
    for engine in ("eager", "auto", "native"):
        ntm.engine = engine
        with pytest.raises(ValueError, match=r"state\.reads has dtype torch\.float64 .*state\.map"):
            ntm(torch.zeros(T, B, IN), bad)
    h, c = state.controller
    with pytest.raises(ValueError, match=r"state\.controller\[1\] has dtype torch\.float64"):
        cell(torch.zeros(B, IN), state._replace(controller=(h, c.double())))


def test_detach_cuts_the_state_from_its_graph():
    """Truncated backpropagation through time: the state's values carry on, its graph does not
    (``NTMState(*(t.detach() for t in state))`` fails on the controller's tuple)."""
    ntm = build(NTM)
    x = torch.rand(2 * T, B, IN)
    first, state = ntm(x[:T])
    detached = state.detach()
    assert all(t.requires_grad for t in state.tensors().values())
    assert not any(t.requires_grad for t in detached.tensors().values())
    for name, t in state.tensors().items():
        assert torch.equal(detached.tensors()[name], t), name
    second, _ = ntm(x[T:], detached)
    second.sum().backward()  # reaches the parameters through the second chunk only
    torch.testing.assert_close(second, ntm(x)[0][T:])


@pytest.mark.parametrize("engine", ["auto", "native"])
def test_torch_func_grad_runs_on_every_engine(engine):
    """The native engine's backward is an autograd Function without ``setup_context``:
    torch.func refuses it, so under such transforms the eager loop runs."""
    from torch.func import functional_call, grad

    ntm = build(engine=engine, read_heads=2).double()
    x = inputs()
    params = {k: p.detach() for k, p in ntm.named_parameters()}
    grads = grad(lambda p: functional_call(ntm, p, (x,))[0].square().sum())(params)
    ntm(x)[0].square().sum().backward()
    for name, p in ntm.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("engine", ["auto", "native"])
@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no_grad"])
def test_forward_mode_ad_runs_on_every_engine(engine, grad_mode):
    """Dual tensors (torch.autograd.forward_ad) run the eager loop: the native engine's
    inference path dropped their tangents without a word, and with gradients on, it would raise
    for want of a forward derivative."""
    import torch.autograd.forward_ad as fwad
    from torch.func import functional_call

    ntm = build(engine=engine).double()
    x, vx = inputs(), torch.randn(T, B, IN, dtype=torch.float64)
    weight = ntm.head_params.weight.detach()
    vw = torch.randn_like(weight)

    def output(x, weight):
        return functional_call(ntm, {"head_params.weight": weight}, (x,))[0]

    with torch.set_grad_enabled(grad_mode), fwad.dual_level():
        dual = output(fwad.make_dual(x, vx), fwad.make_dual(weight, vw))
        tangent = fwad.unpack_dual(dual).tangent
    eps = 1e-6
    with torch.no_grad():
        central = (output(x + eps * vx, weight + eps * vw)
                   - output(x - eps * vx, weight - eps * vw)) / (2 * eps)
    assert tangent is not None
    torch.testing.assert_close(tangent, central, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("cfg", [{}, {"controller_layers": 2},
                                 {"controller": "feedforward"}], ids=["lstm", "2", "ff"])
def test_per_sample_gradients_by_vmap(cfg):
    """vmap(grad(...)) over the batch: torch has no batching rule for nn.LSTMCell's fused op,
    so under torch.func the controller's cell runs as plain ops."""
    from torch.func import functional_call, grad, vmap

    ntm = build(**cfg).double()
    x = inputs()
    params = {k: p.detach() for k, p in ntm.named_parameters()}

    def loss(p, sequence):  # [T, IN]: a batch of one
        return functional_call(ntm, p, (sequence[:, None],))[0].square().sum()

    per_sample = vmap(grad(loss), in_dims=(None, 1))(params, x)
    for b in range(B):
        ntm.zero_grad()
        ntm(x[:, b : b + 1])[0].square().sum().backward()
        for name, p in ntm.named_parameters():
            torch.testing.assert_close(per_sample[name][b], p.grad, rtol=1e-10, atol=1e-12,
                                       msg=f"{name}, sequence {b}")


@pytest.mark.parametrize("engine, per_step", [("eager", True), ("auto", False),
                                              ("native", False)])
def test_forward_hooks_fire_as_the_readme_says(engine, per_step):
    ntm = build(engine=engine)
    calls = dict.fromkeys(["controller", "head_params", "output", "ntm"], 0)

    def count(name):
        return lambda *_: calls.__setitem__(name, calls[name] + 1)

    for name in ("controller", "head_params", "output"):
        getattr(ntm, name).register_forward_hook(count(name))
    ntm.register_forward_hook(count("ntm"))
    ntm(inputs().float())
    if per_step:
        assert calls == {"controller": T, "head_params": T, "output": T, "ntm": 1}
    else:
        assert calls == {"controller": 0, "head_params": 0, "output": 1, "ntm": 1}
    ntm.trace(inputs().float())  # every step's modules, on any engine
    assert calls["controller"] == (2 if per_step else 1) * T


def test_trace_refuses_what_is_not_a_tensor():
    with pytest.raises(TypeError, match=r"NTM expects a tensor .* got ndarray"):
        build(NTM).trace(torch.zeros(T, B, IN).numpy())


def test_unknown_names_list_the_valid_choices():
    with pytest.raises(
        ValueError, match=r"unknown controller 'gru'; valid choices: feedforward, lstm"
    ):
        build(NTM, controller="gru")
    with pytest.raises(
        ValueError, match=r"unknown memory_init 'zeros'; valid choices: constant, learned, random"
    ):
        build(NTMCell, memory_init="zeros")


@pytest.mark.parametrize("shift_range", [1, 2])
def test_a_sequential_write_init_steps_the_write_heads_one_row_a_step(shift_range):
    # Before any training, whatever the inputs: row t + 1 at step t (row 0 is the initial
    # weighting's), around the memory and back to row 0 after N steps, nearly one-hot. The
    # default initialisation does not (its gate and shift are the head layer's draws).
    x = inputs(shape=(2 * N + 1, B, IN), dtype=torch.float32)
    w = build(NTM, write_heads=2, shift_range=shift_range, write_init="sequential").trace(x)[2]
    rows = (torch.arange(1, 2 * N + 2) % N).view(-1, 1, 1).expand(-1, B, 2)
    assert torch.equal(w.write_weights.argmax(-1), rows)
    assert w.write_weights.amax(-1).min() > 0.999
    default = build(NTM, write_heads=2, shift_range=shift_range).trace(x)[2]
    assert not torch.equal(default.write_weights.argmax(-1), rows)
    # The read heads and every other parameter keep the default initialisation's draws.
    a, b = (build(NTM, write_heads=2, write_init=init).state_dict()
            for init in ("default", "sequential"))
    layout = build(NTM, write_heads=2).head_layout
    set_rows = {r for f in ("gate", "shift", "gamma") for r in layout.rows("write", f)}
    assert all(torch.equal(a[k], b[k]) for k in a if k != "head_params.bias")
    same = [i for i in range(a["head_params.bias"].numel()) if i not in set_rows]
    assert torch.equal(a["head_params.bias"][same], b["head_params.bias"][same])


def test_a_sequential_write_init_needs_a_write_head_and_a_shift():
    for bad in ({"write_heads": 0}, {"shift_range": 0}):
        with pytest.raises(ValueError, match=r"write_init='sequential' .* needs write_heads >= 1 "
                                             r"and shift_range >= 1.*use write_init='default'"):
            build(NTM, write_init="sequential", **bad)
    with pytest.raises(ValueError, match=r"unknown write_init 'shift'; valid choices: default"):
        build(NTMCell, write_init="shift")


def test_a_read_beta_bias_starts_the_read_heads_at_that_key_strength():
    # Before any training, whatever the inputs: softplus(5) = 5.007, give or take the head
    # layer's small weights times the controller's output; the default draws start near
    # softplus(0) = 0.69. Only the read heads' beta biases differ from the default's draws.
    x = inputs(shape=(12, B, IN), dtype=torch.float32)
    sharp = build(NTM, read_heads=2, write_heads=2, read_beta_bias=5).trace(x)[2]
    assert sharp.read_beta.shape == (12, B, 2)
    assert (sharp.read_beta - tnf.softplus(torch.tensor(5.0))).abs().max() < 0.5
    assert build(NTM, read_heads=2, write_heads=2).trace(x)[2].read_beta.max() < 2.0
    a, b = (build(NTM, read_heads=2, write_heads=2, read_beta_bias=bias).state_dict()
            for bias in (None, 5.0))
    rows = build(NTM, read_heads=2, write_heads=2).head_layout.rows("read", "beta")
    assert all(torch.equal(a[k], b[k]) for k in a if k != "head_params.bias")
    assert torch.equal(b["head_params.bias"][rows], torch.full((2,), 5.0))
    same = [i for i in range(a["head_params.bias"].numel()) if i not in rows]
    assert torch.equal(a["head_params.bias"][same], b["head_params.bias"][same])


@pytest.mark.parametrize("bad", [math.nan, math.inf, "5", True])
def test_a_read_beta_bias_must_be_a_finite_number(bad):
    with pytest.raises(ValueError, match=r"read_beta_bias must be None \(not set\) or a finite "
                                         r"number, got "):
        build(NTMCell, read_beta_bias=bad)


def test_shift_range_must_fit_in_memory():
    with pytest.raises(ValueError, match=r"shift_range=4 needs 2\*shift_range\+1 <= memory_size"):
        build(NTM, shift_range=4)  # 9 > N = 7


@pytest.mark.parametrize("cls", [NTM, NTMCell])
def test_the_options_are_keyword_arguments_in_the_signature_and_help(cls):
    params = inspect.signature(cls).parameters
    assert list(params)[:2] == ["input_size", "output_size"]
    for f in dataclasses.fields(NTMOptions):
        assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[f.name].default == f.default
    assert {"device", "dtype"} <= set(params)
    assert ({"batch_first", "engine"} <= set(params)) == (cls is NTM)
    assert "memory_size: 'int' = 128" in pydoc.render_doc(cls)


def test_the_options_give_the_attributes_repr_and_config():
    ntm = build(NTM, controller="feedforward", max_gamma=3)
    options = NTMOptions(**{**SMALL, "controller": "feedforward", "max_gamma": 3.0})
    assert ntm.options == options and isinstance(ntm.max_gamma, float)
    assert ntm.config() == {"input_size": IN, "output_size": OUT, **dataclasses.asdict(options),
                            "batch_first": False}
    assert ntm.memory_size == N and ntm.controller_type == "feedforward"
    assert repr(ntm).startswith(
        "NTM(\n  4, 3, controller='feedforward', controller_size=8, controller_layers=1, "
        "memory_size=7, memory_width=5, read_heads=1, write_heads=1, shift_range=1, "
        "memory_init='constant', write_init='default', read_beta_bias=None, max_beta=None, "
        "max_gamma=3.0\n")


@pytest.mark.parametrize("cls", [NTM, NTMCell])
def test_the_option_attributes_are_read_only(cls):
    # An assigned cap reached the eager engine but not the fast and native ones, whose layout is
    # cached on the options (and then handed to other models of the same options).
    ntm = build(cls)
    for field in dataclasses.fields(NTMOptions):
        name = "controller_type" if field.name == "controller" else field.name
        assert getattr(ntm, name) == getattr(ntm.options, field.name)
    with pytest.raises(AttributeError, match=rf"{cls.__name__}.max_beta is fixed when the module "
                                             r"is built; build a new one with max_beta=1.0"):
        ntm.max_beta = 1.0
    with pytest.raises(AttributeError, match=r"controller_type is fixed .* with controller="):
        ntm.controller_type = "feedforward"
    assert ntm.max_beta is None and ntm.options.max_beta is None


def test_an_unknown_keyword_argument_lists_the_valid_ones():
    with pytest.raises(TypeError, match=r"NTMCell got unexpected keyword argument\(s\) "
                                        r"memory_sise; valid: controller, controller_size, "):
        build(NTMCell, memory_sise=9)
    # NTM's own keywords among them: the list left out batch_first, engine, device and dtype,
    # and so read as if engine were not one
    with pytest.raises(TypeError, match=r"NTM got unexpected keyword argument\(s\) engin; "
                                        r"valid: .*max_gamma, batch_first, engine, device, "
                                        r"dtype$"):
        build(NTM, engin="fast")
