"""Tests of Least Recently Used Access (LRUA) in `torch_ntm.functional` and of the `MANN` module
built on it (Santoro et al. 2016).

Each op is checked against an independent float64 NumPy oracle written from the paper's equations
with explicit loops, against small cases computed by hand, for its invariants (non-negative
weightings and usage, reads summing to one, exactly n least-used rows), with `gradcheck` for the
differentiable parts, and at the edges (zero memory, zero keys, one-hot weightings). Sizes are
unequal (B=3, H=2, N=7, M=5) so that a swapped axis fails. The module is checked against a step
composed by hand from its parameters, for the recurrent contract (cell = sequence, carried state =
one pass, batch_first), with gradcheck, and for its errors.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
import torch

from torch_ntm import MANN, MANNCell, MANNState
from torch_ntm import functional as F
from torch_ntm.functional import EPS, USAGE_DECAY
from torch_ntm.mann import MANNOptions

B, H, N, M = 3, 2, 7, 5
TOL = {"rtol": 1e-12, "atol": 1e-12}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rand(*shape, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=gen(seed), dtype=dtype)


def weights(*shape, seed: int = 0) -> torch.Tensor:
    return torch.softmax(2 * rand(*shape, seed=seed), -1)


# --------------------------------------------------------------------------------------------
# The NumPy oracle: float64, explicit loops, written from the paper's equations.
# --------------------------------------------------------------------------------------------


def np_update_usage(usage, w_read, w_write, gamma):
    out = np.zeros_like(usage)
    for b in range(usage.shape[0]):
        for i in range(usage.shape[1]):
            total = gamma * usage[b, i]
            for h in range(w_read.shape[1]):
                total += w_read[b, h, i]
            for h in range(w_write.shape[1]):
                total += w_write[b, h, i]
            out[b, i] = total
    return out


def np_least_used(usage, n):
    out = np.zeros_like(usage)
    for b in range(usage.shape[0]):
        # Rows by increasing usage, lower index first among ties; the first n are marked.
        rows = sorted(range(usage.shape[1]), key=lambda i: (usage[b, i], i))
        for i in rows[:n]:
            out[b, i] = 1.0
    return out


def np_lrua_write_weights(w_read_prev, w_lu_prev, alpha):
    out = np.zeros_like(w_read_prev)
    for b in range(out.shape[0]):
        for h in range(out.shape[1]):
            s = 1.0 / (1.0 + math.exp(-alpha[b, h, 0]))
            for i in range(out.shape[2]):
                out[b, h, i] = s * w_read_prev[b, h, i] + (1.0 - s) * w_lu_prev[b, i]
    return out


def np_lrua_write(memory, usage_prev, w_write, add):
    out = memory.copy()
    for b in range(memory.shape[0]):
        row = min(range(memory.shape[1]), key=lambda i: (usage_prev[b, i], i))
        out[b, row, :] = 0.0
        for i in range(memory.shape[1]):
            for h in range(w_write.shape[1]):
                for m in range(memory.shape[2]):
                    out[b, i, m] += w_write[b, h, i] * add[b, h, m]
    return out


def np_read_weights(memory, key):
    """Cosine similarity (with EPS in the norms) and a softmax: beta = 1, the paper's form."""
    out = np.zeros((key.shape[0], key.shape[1], memory.shape[1]))
    for b in range(key.shape[0]):
        for h in range(key.shape[1]):
            scores = []
            for i in range(memory.shape[1]):
                dot = float(np.dot(key[b, h], memory[b, i]))
                kk, mm = float(np.dot(key[b, h], key[b, h])), float(np.dot(memory[b, i],
                                                                             memory[b, i]))
                scores.append(dot / math.sqrt((kk + EPS) * (mm + EPS)))
            e = np.exp(np.array(scores) - max(scores))
            out[b, h] = e / e.sum()
    return out


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


# --------------------------------------------------------------------------------------------
# Against the oracle.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [0.0, USAGE_DECAY, 0.99, 1.0])
def test_update_usage_matches_oracle(gamma):
    usage = rand(B, N, seed=1).abs()
    w_r, w_w = weights(B, H, N, seed=2), weights(B, H + 1, N, seed=3)
    out = F.update_usage(usage, w_r, w_w, gamma)
    np.testing.assert_allclose(np_(out), np_update_usage(np_(usage), np_(w_r), np_(w_w), gamma),
                               **TOL)


@pytest.mark.parametrize("n", [1, 2, 4, N])
def test_least_used_matches_oracle(n):
    usage = rand(B, N, seed=4).abs()
    usage[0, 2] = usage[0, 5] = usage[0, 1]  # a three-way tie
    usage[1] = 0.0  # all tied, as at the start
    out = F.least_used(usage, n)
    assert out.dtype == usage.dtype
    np.testing.assert_array_equal(np_(out), np_least_used(np_(usage), n))


def test_lrua_write_weights_matches_oracle():
    w_r = weights(B, H, N, seed=5)
    w_lu = F.least_used(rand(B, N, seed=6).abs(), H)
    alpha = 3 * rand(B, H, 1, seed=7)
    out = F.lrua_write_weights(w_r, w_lu, alpha)
    np.testing.assert_allclose(
        np_(out), np_lrua_write_weights(np_(w_r), np_(w_lu), np_(alpha)), **TOL
    )


def test_lrua_write_matches_oracle():
    memory, usage = rand(B, N, M, seed=8), rand(B, N, seed=9).abs()
    usage[2] = 0.5  # ties: row 0 is the one zeroed
    w_w, add = weights(B, H, N, seed=10), rand(B, H, M, seed=11)
    out = F.lrua_write(memory, usage, w_w, add)
    np.testing.assert_allclose(
        np_(out), np_lrua_write(np_(memory), np_(usage), np_(w_w), np_(add)), **TOL
    )


def test_read_weights_with_beta_one_match_oracle():
    memory, key = rand(B, N, M, seed=12), rand(B, H, M, seed=13)
    out = F.content_weights(memory, key, torch.ones(B, H, 1, dtype=torch.float64))
    np.testing.assert_allclose(np_(out), np_read_weights(np_(memory), np_(key)), **TOL)


# --------------------------------------------------------------------------------------------
# Small cases by hand.
# --------------------------------------------------------------------------------------------


def test_hand_computed_step():
    """N=4, M=2, one head, usage [0.3, 0.1, 0.5, 0.2] (least used: row 1; then row 3)."""
    t = torch.tensor
    usage = t([[0.3, 0.1, 0.5, 0.2]], dtype=torch.float64)
    w_lu = F.least_used(usage, 1)
    assert w_lu.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert F.least_used(usage, 2).tolist() == [[0.0, 1.0, 0.0, 1.0]]

    w_r_prev = t([[[0.0, 0.0, 1.0, 0.0]]], dtype=torch.float64)
    w_w = F.lrua_write_weights(w_r_prev, w_lu, t([[[0.0]]], dtype=torch.float64))  # sigmoid 1/2
    assert w_w.tolist() == [[[0.0, 0.5, 0.5, 0.0]]]

    memory = t([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]], dtype=torch.float64)
    add = t([[[2.0, -2.0]]], dtype=torch.float64)
    new = F.lrua_write(memory, usage, w_w, add)
    # Row 1 zeroed, then rows 1 and 2 get half of the add vector.
    assert new.tolist() == [[[1.0, 2.0], [1.0, -1.0], [6.0, 5.0], [7.0, 8.0]]]

    w_r = t([[[0.25, 0.25, 0.25, 0.25]]], dtype=torch.float64)
    u = F.update_usage(usage, w_r, w_w, gamma=0.5)
    torch.testing.assert_close(u, t([[0.4, 0.8, 1.0, 0.35]], dtype=torch.float64))


def test_one_hot_alpha_limits():
    """alpha -> +inf writes where read head h last read; alpha -> -inf to the least-used rows."""
    w_r, w_lu = weights(B, H, N, seed=14), F.least_used(rand(B, N, seed=15).abs(), H)
    big = torch.full((B, H, 1), 50.0, dtype=torch.float64)
    torch.testing.assert_close(F.lrua_write_weights(w_r, w_lu, big), w_r, rtol=0, atol=1e-15)
    torch.testing.assert_close(
        F.lrua_write_weights(w_r, w_lu, -big), w_lu.unsqueeze(1).expand(B, H, N), rtol=0,
        atol=1e-15,
    )


def test_gamma_one_keeps_usage_and_zero_accesses_change_nothing():
    usage = rand(B, N, seed=16).abs()
    zeros = torch.zeros(B, H, N, dtype=torch.float64)
    assert torch.equal(F.update_usage(usage, zeros, zeros, gamma=1.0), usage)
    torch.testing.assert_close(F.update_usage(usage, zeros, zeros, gamma=0.5), usage / 2)


def test_least_used_ties_pick_the_lowest_rows():
    usage = torch.zeros(2, N)
    assert F.least_used(usage, 3).tolist() == [[1, 1, 1, 0, 0, 0, 0]] * 2
    usage[1, 4] = -1.0  # strictly least used comes first, then the lowest tied rows
    assert F.least_used(usage, 2)[1].tolist() == [1, 0, 0, 0, 1, 0, 0]


# --------------------------------------------------------------------------------------------
# Invariants.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_invariants_over_a_few_steps(seed):
    """Run the LRUA recurrence (without a controller) and check every weighting and the usage."""
    g = gen(seed)
    memory = torch.full((B, N, M), 1e-6, dtype=torch.float64)
    usage = torch.zeros(B, N, dtype=torch.float64)
    w_r = torch.softmax(torch.randn(B, H, N, generator=g, dtype=torch.float64), -1)
    w_lu = F.least_used(usage, H)
    for _ in range(6):
        alpha = torch.randn(B, H, 1, generator=g, dtype=torch.float64)
        key, add = (torch.randn(B, H, M, generator=g, dtype=torch.float64) for _ in range(2))
        w_w = F.lrua_write_weights(w_r, w_lu, alpha)
        assert (w_w >= 0).all()
        memory = F.lrua_write(memory, usage, w_w, add)
        w_r = F.content_weights(memory, key, torch.ones(B, H, 1, dtype=torch.float64))
        assert (w_r >= 0).all()
        torch.testing.assert_close(w_r.sum(-1), torch.ones(B, H, dtype=torch.float64))
        usage = F.update_usage(usage, w_r, w_w)
        assert (usage >= 0).all()
        w_lu = F.least_used(usage, H)
        assert set(w_lu.unique().tolist()) <= {0.0, 1.0}
        assert (w_lu.sum(-1) == H).all()
        # The marked rows are those of the smallest usage.
        marked_max = torch.where(w_lu.bool(), usage, -math.inf).amax(-1)
        unmarked_min = torch.where(w_lu.bool(), math.inf, usage).amin(-1)
        assert (marked_max <= unmarked_min).all()


def test_least_used_carries_no_gradient():
    usage = rand(B, N, seed=17).abs().requires_grad_()
    assert not F.least_used(usage, 2).requires_grad


def test_the_zeroed_row_is_the_first_least_used_row():
    usage = rand(B, N, seed=18).abs()
    usage[0] = 0.0
    w_w, add = torch.zeros(B, H, N, dtype=torch.float64), rand(B, H, M, seed=19)
    memory = rand(B, N, M, seed=20)
    out = F.lrua_write(memory, usage, w_w, add)
    first = F.least_used(usage, 1).bool()  # (B, N)
    assert (out[first] == 0).all()
    assert torch.equal(out[~first], memory[~first])


def test_invalid_arguments_name_the_problem():
    with pytest.raises(ValueError, match=r"1 <= n <= N=7"):
        F.least_used(torch.zeros(B, N), N + 1)
    with pytest.raises(ValueError, match=r"1 <= n <= N=7"):
        F.least_used(torch.zeros(B, N), 0)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        F.update_usage(torch.zeros(B, N), torch.zeros(B, H, N), torch.zeros(B, H, N), 1.5)


# --------------------------------------------------------------------------------------------
# Gradients and the numerical edges.
# --------------------------------------------------------------------------------------------


def test_gradcheck_differentiable_parts():
    usage = rand(B, N, seed=21).abs()
    w_lu = F.least_used(usage, H)
    args = [rand(B, N, M, seed=22), usage, weights(B, H, N, seed=23), rand(B, H, M, seed=24)]
    for i in (0, 2, 3):
        args[i].requires_grad_()
    assert torch.autograd.gradcheck(F.lrua_write, args)
    ww_args = (weights(B, H, N, seed=25).requires_grad_(), w_lu,
               rand(B, H, 1, seed=26).requires_grad_())
    assert torch.autograd.gradcheck(F.lrua_write_weights, ww_args)
    u_args = (usage.clone().requires_grad_(), weights(B, H, N, seed=27).requires_grad_(),
              weights(B, 1, N, seed=28).requires_grad_())
    assert torch.autograd.gradcheck(lambda u, r, w: F.update_usage(u, r, w, 0.95), u_args)
    ones = torch.ones(B, H, 1, dtype=torch.float64)
    c_args = (rand(B, N, M, seed=29).requires_grad_(), rand(B, H, M, seed=30).requires_grad_())
    assert torch.autograd.gradcheck(lambda m, k: F.content_weights(m, k, ones), c_args)


def one_step(memory, key, add, alpha, w_r_prev, usage):
    """One LRUA step; returns everything a caller would use, summed into a scalar loss."""
    w_w = F.lrua_write_weights(w_r_prev, F.least_used(usage, H), alpha)
    memory = F.lrua_write(memory, usage, w_w, add)
    w_r = F.content_weights(memory, key, torch.ones_like(alpha))
    reads = F.read(memory, w_r)
    usage = F.update_usage(usage, w_r, w_w)
    return w_w, memory, w_r, reads, usage


@pytest.mark.parametrize("edge", ["zero_memory", "zero_key", "one_hot", "zero_everything"])
def test_no_nan_in_values_or_gradients_at_the_edges(edge):
    memory, key, add = rand(B, N, M, seed=31), rand(B, H, M, seed=32), rand(B, H, M, seed=33)
    alpha, w_r, usage = rand(B, H, 1, seed=34), weights(B, H, N, seed=35), rand(B, N, seed=36).abs()
    if edge in ("zero_memory", "zero_everything"):
        memory = torch.zeros_like(memory)
    if edge in ("zero_key", "zero_everything"):
        key = torch.zeros_like(key)
    if edge in ("one_hot", "zero_everything"):
        w_r = torch.nn.functional.one_hot(torch.arange(B * H) % N, N).view(B, H, N).double()
        alpha = torch.full_like(alpha, 40.0)
    if edge == "zero_everything":
        add, usage = torch.zeros_like(add), torch.zeros_like(usage)
    leaves = [t.clone().requires_grad_() for t in (memory, key, add, alpha, w_r, usage)]
    outs = one_step(*leaves)
    for out in outs:
        assert torch.isfinite(out).all()
    sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
    for leaf in leaves:
        assert leaf.grad is not None and torch.isfinite(leaf.grad).all()
    if edge in ("zero_key", "zero_everything"):  # a zero key reads uniformly
        torch.testing.assert_close(outs[2], torch.full_like(outs[2], 1.0 / N))


def test_float32_agrees_with_float64():
    args64 = (rand(B, N, M, seed=37), rand(B, H, M, seed=38), rand(B, H, M, seed=39),
              rand(B, H, 1, seed=40), weights(B, H, N, seed=41), rand(B, N, seed=42).abs())
    out64 = one_step(*args64)
    out32 = one_step(*(a.float() for a in args64))
    for a, b in zip(out32, out64):
        torch.testing.assert_close(a, b.float(), rtol=1e-4, atol=1e-5)


# ============================================================================================
# The MANN module (torch_ntm.mann).
# ============================================================================================

IN, OUT, T = 6, 4, 5
SMALL = {"controller_size": 8, "memory_size": N, "memory_width": M, "read_heads": H}
CONFIGS = [{}, {"write_vector": "key"}, {"learned_beta": True, "usage_decay": 0.5}]
config_params = pytest.mark.parametrize("cfg", CONFIGS, ids=["add", "key", "beta_decay"])


def build(cls=MANN, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    return cls(IN, OUT, **{**SMALL, "dtype": torch.float64, **kwargs})


def inputs(shape=(T, B, IN), seed: int = 1) -> torch.Tensor:
    return rand(*shape, seed=seed)


def assert_states_close(a: MANNState, b: MANNState, **tol) -> None:
    for name, x, y in zip(MANNState._fields, a, b):
        if name == "controller":
            for xi, yi in zip(x, y):
                torch.testing.assert_close(xi, yi, **tol)
        else:
            torch.testing.assert_close(x, y, **tol, msg=lambda s, n=name: f"{n}: {s}")


def reference_step(model, x, state: MANNState):
    """One step from the parameters and the functional ops, as section 3 of the paper reads."""
    p = dict(model.named_parameters())
    b, m, h = x.shape[0], model.memory_width, model.read_heads
    inp = torch.cat([x, state.reads.reshape(b, h * m)], -1)  # [x_t, r_{t-1}]
    gates = (inp @ p["controller.cells.0.weight_ih"].T + p["controller.cells.0.bias_ih"]
             + state.controller[0][0] @ p["controller.cells.0.weight_hh"].T
             + p["controller.cells.0.bias_hh"])
    i, f, g, o = gates.chunk(4, -1)
    c = torch.sigmoid(f) * state.controller[1][0] + torch.sigmoid(i) * torch.tanh(g)
    hid = torch.sigmoid(o) * torch.tanh(c)
    raw = (hid @ p["head_params.weight"].T + p["head_params.bias"]).view(b, h, -1)
    key, alpha = torch.tanh(raw[..., :m]), raw[..., m : m + 1]
    add = torch.tanh(raw[..., m + 1 : 2 * m + 1]) if model.write_vector == "add" else key
    beta = (torch.nn.functional.softplus(raw[..., -1:]) if model.learned_beta
            else torch.ones_like(alpha))
    w_w = F.lrua_write_weights(state.read_weights, state.least_used, alpha)
    memory = F.lrua_write(state.memory, state.usage, w_w, add)
    w_r = F.content_weights(memory, key, beta)
    usage = F.update_usage(state.usage, w_r, w_w, model.usage_decay)
    reads = F.read(memory, w_r)
    logits = torch.cat([hid, reads.reshape(b, -1)], -1) @ p["output.weight"].T + p["output.bias"]
    return logits, MANNState((hid[None], c[None]), memory, usage, w_r, F.least_used(usage, h),
                             reads)


@config_params
def test_cell_step_matches_a_reference_composed_from_parameters(cfg):
    cell = build(MANNCell, **cfg)
    x = inputs((B, IN))
    state = cell.initial_state(B)
    for _ in range(3):  # the initial state, then states with memory, usage and reads
        logits, new_state = cell(x, state)
        ref_logits, ref_state = reference_step(cell, x, state)
        torch.testing.assert_close(logits, ref_logits, **TOL)
        assert_states_close(new_state, ref_state, **TOL)
        state = new_state


def test_shapes_and_initial_state():
    mann = build()
    logits, state = mann(inputs())
    assert logits.shape == (T, B, OUT)
    assert [list(t.shape) for t in state.controller] == [[1, B, 8]] * 2
    shapes = {"memory": (B, N, M), "usage": (B, N), "read_weights": (B, H, N),
              "least_used": (B, N), "reads": (B, H, M)}
    for name, shape in shapes.items():
        assert getattr(state, name).shape == shape, name
    s0 = mann.initial_state(B)
    assert (s0.memory == 1e-6).all() and (s0.usage == 0).all() and (s0.reads == 0).all()
    assert (s0.read_weights == 0).all()
    assert s0.least_used.tolist() == [[1.0] * H + [0.0] * (N - H)] * B


def test_defaults_are_the_papers_sizes():
    mann = MANN(IN, OUT)
    assert (mann.controller_size, mann.memory_size, mann.memory_width, mann.read_heads) == (
        200, 128, 40, 4)
    assert mann.usage_decay == USAGE_DECAY and not mann.batch_first


@config_params
def test_stepping_the_cell_equals_the_sequence_module(cfg):
    mann = build(**cfg)
    cell = build(MANNCell, seed=9, **cfg)
    cell.load_state_dict(mann.state_dict())
    x = inputs()
    logits, state = mann(x)
    cell_state, steps = None, []
    for x_t in x:
        y, cell_state = cell(x_t, cell_state)
        steps.append(y)
    torch.testing.assert_close(torch.stack(steps), logits, **TOL)
    assert_states_close(cell_state, state, **TOL)


@config_params
def test_two_halves_with_carried_state_equal_one_pass(cfg):
    mann = build(**cfg)
    x = inputs((2 * T, B, IN))
    logits, state = mann(x)
    y1, s1 = mann(x[:T])
    y2, s2 = mann(x[T:], s1)
    torch.testing.assert_close(torch.cat([y1, y2]), logits, **TOL)
    assert_states_close(s2, state, **TOL)


def test_the_state_detaches_and_maps_as_the_ntms_does():
    """Truncated backpropagation through time on a MANN (its state had no ``detach``)."""
    mann = build()
    x = inputs((2 * T, B, IN))
    _, state = mann(x[:T])
    detached = state.detach()
    assert isinstance(detached, MANNState)
    assert list(detached.tensors()) == ["controller[0]", "controller[1]", "memory", "usage",
                                        "read_weights", "least_used", "reads"]
    recorded = {k for k, t in state.tensors().items() if t.requires_grad}
    assert recorded == set(state.tensors()) - {"least_used"}  # it carries no gradient
    assert not any(t.requires_grad for t in detached.tensors().values())
    for name, t in state.tensors().items():
        assert torch.equal(detached.tensors()[name], t), name
    doubled = state.map(lambda t: 2 * t)
    assert torch.equal(doubled.usage, 2 * state.usage)
    assert torch.equal(doubled.controller[1], 2 * state.controller[1])
    second, _ = mann(x[T:], detached)
    second.sum().backward()  # reaches the parameters through the second chunk only
    torch.testing.assert_close(second, mann(x)[0][T:], **TOL)


def test_torch_func_grad_and_vmap_run_on_the_default_engine():
    """Under torch.func's transforms the eager loop runs (the native engine's backward is one
    C++ call, which they cannot see through)."""
    from torch.func import functional_call, grad, vmap

    mann = build(engine="auto")
    x = inputs()
    params = {k: p.detach() for k, p in mann.named_parameters()}

    def loss(p, x):
        return functional_call(mann, p, (x,))[0].square().sum()

    grads = grad(loss)(params, x)
    mann(x)[0].square().sum().backward()
    for name, p in mann.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, **TOL, msg=name)
    per_sample = vmap(grad(loss), in_dims=(None, 1))(params, x[:, :, None])
    mann.zero_grad()
    mann(x[:, :1])[0].square().sum().backward()
    for name, p in mann.named_parameters():
        torch.testing.assert_close(per_sample[name][0], p.grad, **TOL, msg=name)


def test_engine_names_and_the_default():
    mann = build()
    assert mann.engine == "auto" and "engine" not in repr(mann) and "engine" not in mann.config()
    assert "engine='eager'" in repr(build(engine="eager"))
    assert build(engine="compiled").engine == "auto"  # a name of an earlier version
    with pytest.raises(ValueError, match="unknown engine 'turbo'; valid choices: auto, native, "
                                         "graphs, eager"):
        mann.engine = "turbo"


def test_batch_first_equals_time_major_transposed():
    mann, mann_bf = build(), build(batch_first=True)
    x = inputs()
    y, s = mann(x)
    y_bf, s_bf = mann_bf(x.transpose(0, 1).contiguous())
    torch.testing.assert_close(y_bf, y.transpose(0, 1), **TOL)
    assert_states_close(s_bf, s, **TOL)


def test_the_memory_is_reset_per_call_without_a_state():
    mann = build()
    x = inputs()
    y1, _ = mann(x)
    y2, _ = mann(x)
    assert torch.equal(y1, y2)


@config_params
def test_invariants_along_a_sequence(cfg):
    cell = build(MANNCell, **cfg)
    state = None
    for x_t in inputs((12, B, IN)):
        _, state = cell(x_t, state)
        assert (state.read_weights >= 0).all() and (state.usage >= 0).all()
        torch.testing.assert_close(state.read_weights.sum(-1),
                                   torch.ones(B, H, dtype=torch.float64))
        assert (state.least_used.sum(-1) == H).all()


def test_gradcheck_tiny_mann():
    mann = MANN(3, 2, controller_size=3, memory_size=4, memory_width=2, read_heads=2,
                dtype=torch.float64)
    torch.manual_seed(0)
    x = rand(3, 2, 3, seed=43).requires_grad_()
    names = ["head_params.weight", "output.weight", "controller.cells.0.weight_ih"]
    params = {n: p.detach().clone().requires_grad_() for n, p in mann.named_parameters()
              if n in names}

    def run(x, *ps):
        out, state = torch.func.functional_call(mann, dict(zip(names, ps)), (x,))
        return out, state.memory, state.usage

    assert torch.autograd.gradcheck(run, (x, *(params[n] for n in names)))


@config_params
def test_no_nan_with_zero_inputs(cfg):
    mann = build(**cfg)
    x = torch.zeros(T, B, IN, dtype=torch.float64, requires_grad=True)
    logits, state = mann(x)
    assert torch.isfinite(logits).all()
    (logits.sum() + state.memory.sum() + state.usage.sum()).backward()
    assert torch.isfinite(x.grad).all()
    for name, p in mann.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_every_parameter_gets_a_gradient():
    mann = build(learned_beta=True)
    logits, _ = mann(inputs())
    logits.pow(2).sum().backward()
    for name, p in mann.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_memory_size_does_not_change_parameter_shapes():
    small, big = build(memory_size=N), build(memory_size=64)
    assert {n: p.shape for n, p in small.named_parameters()} == {
        n: p.shape for n, p in big.named_parameters()}
    big.load_state_dict(small.state_dict())
    logits, state = big(inputs())
    assert logits.shape == (T, B, OUT) and state.memory.shape == (B, 64, M)


def test_wrong_input_shapes_name_expected_and_actual():
    mann, cell = build(), build(MANNCell)
    with pytest.raises(ValueError, match=r"\[time, batch, 6\], got \[5, 3, 7\]"):
        mann(inputs((T, B, IN + 1)))
    with pytest.raises(ValueError, match=r"got \[3, 6\]; for one step .* use MANNCell"):
        mann(inputs((B, IN)))
    with pytest.raises(ValueError, match=r"\[batch, time, 6\]"):
        build(batch_first=True)(inputs((B, IN)))
    with pytest.raises(ValueError, match=r"length 0"):
        mann(inputs((0, B, IN)))
    with pytest.raises(ValueError, match=r"MANN got a batch of 0 sequences"):
        mann(inputs((T, 0, IN)))
    with pytest.raises(ValueError, match=r"\[batch, 6\], got \[5, 3, 6\]; .* use MANN"):
        cell(inputs())
    with pytest.raises(ValueError, match=r"dtype torch.float64 .* got torch.float32"):
        mann(inputs().float())
    with pytest.raises(ValueError, match=r"got torch.int64; convert with "
                                         r"x.to\(torch.float64\)$"):  # not the model to int64
        mann(inputs().long())


def test_a_state_from_another_batch_size_or_model_is_rejected():
    mann = build()
    _, state = mann(inputs())
    with pytest.raises(ValueError, match=r"state.memory has shape .* another batch size"):
        mann(inputs((T, B + 1, IN)), state)
    with pytest.raises(ValueError, match=r"state.memory has shape \[3, 7, 5\], expected"):
        build(memory_size=N + 1)(inputs(), state)
    with pytest.raises(TypeError, match="MANNState"):
        mann(inputs(), tuple(state))


@pytest.mark.parametrize("field", ["controller[1]", "memory", "usage", "read_weights",
                                   "least_used", "reads"])
def test_every_state_tensor_is_checked_against_the_inputs_dtype(field):
    """Only the memory's dtype and device were checked: a float32 usage or reads in a float64
    state ran on."""
    mann = build()
    _, state = mann(inputs())
    if field == "controller[1]":
        bad = state._replace(controller=(state.controller[0], state.controller[1].float()))
    else:
        bad = state._replace(**{field: getattr(state, field).float()})
    with pytest.raises(ValueError, match=rf"state\.{re.escape(field)} has dtype torch.float32 "
                                         r"but the input torch.float64: .*state.map"):
        mann(inputs(), bad)


def test_autocast_returns_a_state_of_one_dtype_that_can_be_passed_back():
    """Under bfloat16 autocast the state came back mixed (reads in bfloat16, the rest float32),
    and passing it on outside autocast then failed the dtype check."""
    mann, cell = build(dtype=torch.float32), build(MANNCell, dtype=torch.float32)
    x = inputs().float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, state = mann(x)
        _, cell_state = cell(x[0])
    for s in (state, cell_state):
        assert {t.dtype for t in s.tensors().values()} == {torch.float32}
    assert mann(x, state)[0].dtype == torch.float32


@pytest.mark.parametrize("bad, message", [
    ({"read_heads": N + 1}, r"memory_size must be >= read_heads"),
    ({"usage_decay": 1.5}, r"usage_decay must be a number in \[0, 1\]"),
    ({"write_vector": "erase"}, r"unknown write_vector 'erase'; valid choices: add, key"),
    ({"memory_width": 0}, r"memory_width must be an integer >= 1"),
])
def test_invalid_options_name_the_problem(bad, message):
    with pytest.raises(ValueError, match=message):
        build(**bad)


def test_options_are_one_list():
    """The keyword arguments, `MANNOptions`, the attributes and `config()` name the same things."""
    import inspect

    fields = [f.name for f in dataclasses.fields(MANNOptions)]
    for cls in (MANN, MANNCell):
        params = inspect.signature(cls).parameters
        kw = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]
        assert kw[: len(fields)] == fields
    mann = build(write_vector="key")
    assert mann.config() == {"input_size": IN, "output_size": OUT, **SMALL,
                             "usage_decay": USAGE_DECAY, "write_vector": "key",
                             "learned_beta": False, "encoder": "none", "image_size": 20,
                             "batch_first": False}
    assert MANN(**mann.config(), dtype=torch.float64).config() == mann.config()
    assert all(getattr(mann, name) == getattr(mann.options, name) for name in fields)
    with pytest.raises(AttributeError, match=r"MANN.usage_decay is fixed when the module is "
                                             r"built; build a new one with usage_decay=0.5"):
        mann.usage_decay = 0.5
