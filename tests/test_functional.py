"""Tests of the addressing and memory-access functions in `torch_ntm.functional`.

Each op is checked against an independent float64 NumPy oracle written from the paper's equations
with explicit loops, against one-hot scenarios whose answer is known by hand, for the invariants
of a weighting (non-negative, sums to one), with `gradcheck`, and at the numerical edges (zero
rows and keys, gamma = 1, one-hot weightings, huge beta and gamma). Sizes are unequal
(B=3, H=2, N=7, M=5) so that a swapped axis fails.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torch_ntm import functional as F
from torch_ntm.functional import EPS

B, H, N, M = 3, 2, 7, 5
SHIFT_RANGES = [0, 1, 2, 3]  # 3: 2R+1 == N
ADDRESS_ARGS = ["memory", "w_prev", "key", "beta", "gate", "s", "gamma"]

TOL = {
    torch.float64: {"rtol": 1e-10, "atol": 1e-12},
    torch.float32: {"rtol": 1e-4, "atol": 1e-5},
}


# --------------------------------------------------------------------------------------------
# The NumPy oracle: float64, explicit loops, written from the equations (not from the code).
# --------------------------------------------------------------------------------------------


def np_content_weights(memory, key, beta):
    b_, h_, n_ = key.shape[0], key.shape[1], memory.shape[1]
    out = np.zeros((b_, h_, n_))
    for b in range(b_):
        for h in range(h_):
            scores = np.zeros(n_)
            for i in range(n_):
                dot = sum(key[b, h, m] * memory[b, i, m] for m in range(key.shape[2]))
                kk = sum(key[b, h, m] ** 2 for m in range(key.shape[2]))
                mm = sum(memory[b, i, m] ** 2 for m in range(key.shape[2]))
                scores[i] = beta[b, h, 0] * dot / math.sqrt((kk + EPS) * (mm + EPS))
            e = np.exp(scores - scores.max())
            out[b, h] = e / e.sum()
    return out


def np_interpolate(w_content, w_prev, gate):
    out = np.zeros_like(w_content)
    for b in range(w_content.shape[0]):
        for h in range(w_content.shape[1]):
            g = gate[b, h, 0]
            for i in range(w_content.shape[2]):
                out[b, h, i] = g * w_content[b, h, i] + (1.0 - g) * w_prev[b, h, i]
    return out


def np_shift(w, s):
    n_, r = w.shape[2], (s.shape[2] - 1) // 2
    out = np.zeros_like(w)
    for b in range(w.shape[0]):
        for h in range(w.shape[1]):
            for i in range(n_):
                for k in range(s.shape[2]):
                    out[b, h, i] += s[b, h, k] * w[b, h, (i - (k - r)) % n_]
    return out


def np_sharpen(w, gamma):
    out = np.zeros_like(w)
    for b in range(w.shape[0]):
        for h in range(w.shape[1]):
            powered = [w[b, h, i] ** gamma[b, h, 0] for i in range(w.shape[2])]
            total = sum(powered)
            for i in range(w.shape[2]):
                out[b, h, i] = powered[i] / total
    return out


def np_sharpen_jacobians(w, gamma):
    """d out_i / d w_j = g w_j^(g-1) (delta_ij - out_i) / S and
    d out_i / d g = out_i (log w_i - sum_j out_j log w_j), with 0^0 = 1 and 0 log 0 = 0."""
    out = np_sharpen(w, gamma)
    n_ = w.shape[2]
    jw = np.zeros(w.shape + (n_,))
    jg = np.zeros(w.shape)
    for b in range(w.shape[0]):
        for h in range(w.shape[1]):
            g = gamma[b, h, 0]
            total = sum(w[b, h, j] ** g for j in range(n_))
            logs = [math.log(x) if x > 0 else 0.0 for x in w[b, h]]
            mean_log = sum(out[b, h, j] * logs[j] for j in range(n_))
            for i in range(n_):
                jg[b, h, i] = out[b, h, i] * (logs[i] - mean_log) if out[b, h, i] > 0 else 0.0
                for j in range(n_):
                    delta = 1.0 if i == j else 0.0
                    jw[b, h, i, j] = g * w[b, h, j] ** (g - 1) * (delta - out[b, h, i]) / total
    return jw, jg


def np_address(memory, w_prev, key, beta, gate, s, gamma):
    w = np_content_weights(memory, key, beta)
    w = np_interpolate(w, w_prev, gate)
    w = np_shift(w, s)
    return np_sharpen(w, gamma)


def np_read(memory, w):
    out = np.zeros((w.shape[0], w.shape[1], memory.shape[2]))
    for b in range(w.shape[0]):
        for h in range(w.shape[1]):
            for m in range(memory.shape[2]):
                out[b, h, m] = sum(w[b, h, i] * memory[b, i, m] for i in range(memory.shape[1]))
    return out


def np_write(memory, w, erase, add):
    out = np.zeros_like(memory)
    for b in range(memory.shape[0]):
        for i in range(memory.shape[1]):
            for m in range(memory.shape[2]):
                keep = 1.0
                for h in range(w.shape[1]):
                    keep *= 1.0 - w[b, h, i] * erase[b, h, m]
                added = sum(w[b, h, i] * add[b, h, m] for h in range(w.shape[1]))
                out[b, i, m] = memory[b, i, m] * keep + added
    return out


# --------------------------------------------------------------------------------------------
# Random inputs in the valid domain.
# --------------------------------------------------------------------------------------------


def random_inputs(seed: int, r: int = 1, h: int = H) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    memory = rng.normal(size=(B, N, M))
    memory[0, 2] = 1e-4 * rng.normal(size=M)  # |row|^2 ~ EPS: pins where EPS enters the cosine
    memory[1, 4] = 0.0  # an empty row
    return {
        "memory": memory,
        "w_prev": rng.dirichlet(np.ones(N), size=(B, h)),
        "key": rng.normal(size=(B, h, M)),
        "beta": rng.uniform(0.0, 10.0, size=(B, h, 1)),
        "gate": rng.uniform(0.0, 1.0, size=(B, h, 1)),
        "s": rng.dirichlet(np.ones(2 * r + 1), size=(B, h)),
        "gamma": 1.0 + rng.exponential(2.0, size=(B, h, 1)),
        "w": rng.dirichlet(np.ones(N), size=(B, h)),
        "erase": rng.uniform(0.0, 1.0, size=(B, h, M)),
        "add": rng.normal(size=(B, h, M)),
    }


def as_torch(arrays: dict, dtype=torch.float64, requires_grad=False) -> dict[str, torch.Tensor]:
    return {
        k: torch.tensor(v, dtype=dtype).requires_grad_(requires_grad) for k, v in arrays.items()
    }


def one_hot(index: list[list[int]], n: int = N, dtype=torch.float64) -> torch.Tensor:
    """``[B, H, n]`` one-hot weightings with the peak of (b, h) at ``index[b][h]``."""
    return torch.nn.functional.one_hot(torch.tensor(index), n).to(dtype)


def shift_weighting(shifts: list[list[int]], r: int, dtype=torch.float64) -> torch.Tensor:
    """``[B, H, 2R+1]`` one-hot shift weightings: all weight on a shift by ``shifts[b][h]``."""
    return one_hot([[k + r for k in row] for row in shifts], 2 * r + 1, dtype)


# --------------------------------------------------------------------------------------------
# 1. Values against the NumPy oracle, in float64 (tight) and float32 (loose).
# --------------------------------------------------------------------------------------------

DTYPES = [torch.float64, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
def test_content_weights_matches_oracle(dtype):
    a = random_inputs(0)
    t = as_torch(a, dtype)
    got = F.content_weights(t["memory"], t["key"], t["beta"])
    expected = np_content_weights(a["memory"], a["key"], a["beta"])
    torch.testing.assert_close(got, torch.tensor(expected, dtype=dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_interpolate_matches_oracle(dtype):
    a = random_inputs(1)
    a["w_content"] = np.random.default_rng(11).dirichlet(np.ones(N), size=(B, H))
    t = as_torch(a, dtype)
    got = F.interpolate(t["w_content"], t["w_prev"], t["gate"])
    expected = np_interpolate(a["w_content"], a["w_prev"], a["gate"])
    torch.testing.assert_close(got, torch.tensor(expected, dtype=dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("r", SHIFT_RANGES)
def test_shift_matches_oracle(r, dtype):
    a = random_inputs(2, r)
    # Shift is linear in s: scaling each s away from sum 1 also pins that s multiplies w (for R=0,
    # a distribution over one shift is always [1]).
    a["s"] *= np.random.default_rng(12).uniform(0.5, 1.5, size=(B, H, 1))
    t = as_torch(a, dtype)
    got = F.shift(t["w"], t["s"])
    expected = np_shift(a["w"], a["s"])
    torch.testing.assert_close(got, torch.tensor(expected, dtype=dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_sharpen_matches_oracle(dtype):
    a = random_inputs(3)
    t = as_torch(a, dtype)
    got = F.sharpen(t["w"], t["gamma"])
    expected = np_sharpen(a["w"], a["gamma"])
    torch.testing.assert_close(got, torch.tensor(expected, dtype=dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("r", SHIFT_RANGES)
def test_address_matches_oracle(r, dtype):
    a = random_inputs(4, r)
    t = as_torch(a, dtype)
    got = F.address(*(t[k] for k in ADDRESS_ARGS))
    expected = np_address(*(a[k] for k in ADDRESS_ARGS))
    torch.testing.assert_close(got, torch.tensor(expected, dtype=dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_read_matches_oracle(dtype):
    a = random_inputs(5)
    t = as_torch(a, dtype)
    got = F.read(t["memory"], t["w"])
    expected = np_read(a["memory"], a["w"])
    torch.testing.assert_close(got, torch.tensor(expected, dtype=dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [1, 2, 3])
def test_write_matches_oracle(heads, dtype):
    a = random_inputs(6, h=heads)
    t = as_torch(a, dtype)
    got = F.write(t["memory"], t["w"], t["erase"], t["add"])
    expected = np_write(a["memory"], a["w"], a["erase"], a["add"])
    torch.testing.assert_close(got, torch.tensor(expected, dtype=dtype), **TOL[dtype])


def test_content_weights_uses_eps_inside_each_squared_norm():
    # A key and a row of norm 1e-4 (squared norm = EPS): the exact cosine is 1, the EPS-regularised
    # one is 1e-8 / sqrt((2e-8)(2e-8)) = 1/2. With beta = ln(3) the row's score is e^(ln3 / 2).
    key = torch.zeros(1, 1, M, dtype=torch.float64)
    key[0, 0, 0] = 1e-4
    memory = torch.zeros(1, N, M, dtype=torch.float64)
    memory[0, 3, 0] = 1e-4
    beta = torch.full((1, 1, 1), math.log(3.0), dtype=torch.float64)
    w = F.content_weights(memory, key, beta)
    peak = math.sqrt(3.0)
    expected = torch.full((1, 1, N), 1.0 / (peak + N - 1), dtype=torch.float64)
    expected[0, 0, 3] = peak / (peak + N - 1)
    torch.testing.assert_close(w, expected, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("width", [2, 4, 9])
def test_shift_rejects_even_or_too_wide_shift_weighting(width):
    w = torch.full((B, H, N), 1.0 / N)
    s = torch.full((B, H, width), 1.0 / width)
    with pytest.raises(ValueError, match=rf"2R\+1 <= N={N}, got width {width}"):
        F.shift(w, s)


# --------------------------------------------------------------------------------------------
# 2. One-hot scenarios.
# --------------------------------------------------------------------------------------------

PEAKS = [[0, 6], [3, 5], [6, 1]]  # [B][H]; includes the wrap-around rows 0 and N-1


@pytest.mark.parametrize("r", [1, 2, 3])
@pytest.mark.parametrize("by", [+1, -1])
def test_shift_moves_a_one_hot_peak_by_one_row_circularly(by, r):
    w = one_hot(PEAKS)
    s = shift_weighting([[by] * H] * B, r)
    expected = one_hot([[(j + by) % N for j in row] for row in PEAKS])
    torch.testing.assert_close(F.shift(w, s), expected, rtol=0.0, atol=0.0)


def test_shift_by_different_amounts_per_batch_and_head():
    r = 2
    shifts = [[2, -2], [0, 1], [-1, 2]]
    got = F.shift(one_hot(PEAKS), shift_weighting(shifts, r))
    expected = one_hot([[(j + k) % N for j, k in zip(pr, sr)] for pr, sr in zip(PEAKS, shifts)])
    torch.testing.assert_close(got, expected, rtol=0.0, atol=0.0)


def test_interpolate_gate_zero_returns_previous_and_gate_one_returns_content():
    a = as_torch(random_inputs(7))
    w_content = torch.tensor(np.random.default_rng(8).dirichlet(np.ones(N), size=(B, H)))
    w_prev = a["w_prev"]
    gate = torch.zeros(B, H, 1, dtype=torch.float64)
    gate[:, 1] = 1.0  # head 0 keeps w_prev, head 1 takes w_content
    got = F.interpolate(w_content, w_prev, gate)
    torch.testing.assert_close(got[:, 0], w_prev[:, 0], rtol=0.0, atol=1e-15)
    torch.testing.assert_close(got[:, 1], w_content[:, 1], rtol=0.0, atol=1e-15)


def test_sharpen_with_gamma_one_leaves_a_weighting_unchanged():
    w = as_torch(random_inputs(9))["w"]
    got = F.sharpen(w, torch.ones(B, H, 1, dtype=torch.float64))
    torch.testing.assert_close(got, w, rtol=1e-14, atol=1e-15)


def test_sharpen_keeps_a_one_hot_weighting_for_any_gamma():
    w = one_hot(PEAKS)
    gamma = torch.tensor([1.0, 3.0, 50.0], dtype=torch.float64).view(B, 1, 1).expand(B, H, 1)
    torch.testing.assert_close(F.sharpen(w, gamma), w, rtol=0.0, atol=0.0)


def test_content_weights_with_huge_beta_picks_the_best_matching_row():
    rng = np.random.default_rng(10)
    memory = torch.tensor(rng.normal(size=(B, N, M)))
    best = torch.tensor(PEAKS)
    key = torch.stack([memory[b, best[b]] for b in range(B)])  # (B, H, M): copies of rows
    key = key + 1e-3 * torch.tensor(rng.normal(size=(B, H, M)))
    w = F.content_weights(memory, key, torch.full((B, H, 1), 1e4, dtype=torch.float64))
    torch.testing.assert_close(w, one_hot(PEAKS), rtol=0.0, atol=1e-6)


def test_write_with_one_hot_weighting_and_full_erase_replaces_that_row():
    a = as_torch(random_inputs(12))
    memory, add = a["memory"], a["add"]
    w = one_hot(PEAKS)  # the two heads of each batch entry write different rows
    got = F.write(memory, w, torch.ones(B, H, M, dtype=torch.float64), add)
    expected = memory.clone()
    for b in range(B):
        for h in range(H):
            expected[b, PEAKS[b][h]] = add[b, h]
    torch.testing.assert_close(got, expected, rtol=0.0, atol=0.0)


def test_write_applies_all_erasures_before_all_adds():
    # Two heads fully erase and add to the same row: both adds survive, whatever the head order.
    a = as_torch(random_inputs(13))
    w = one_hot([[4, 4]] * B)
    got = F.write(a["memory"], w, torch.ones(B, H, M, dtype=torch.float64), a["add"])
    torch.testing.assert_close(got[:, 4], a["add"].sum(1), rtol=1e-15, atol=1e-15)
    swapped = F.write(a["memory"], w, torch.ones(B, H, M, dtype=torch.float64), a["add"].flip(1))
    torch.testing.assert_close(swapped, got, rtol=1e-15, atol=1e-15)


def test_read_with_one_hot_weighting_returns_that_row():
    memory = as_torch(random_inputs(14))["memory"]
    got = F.read(memory, one_hot(PEAKS))
    for b in range(B):
        for h in range(H):
            torch.testing.assert_close(got[b, h], memory[b, PEAKS[b][h]], rtol=0.0, atol=0.0)


# --------------------------------------------------------------------------------------------
# 3. Invariants: every weighting is non-negative and sums to one.
# --------------------------------------------------------------------------------------------


def _weightings(seed: int, r: int, dtype) -> dict[str, torch.Tensor]:
    t = as_torch(random_inputs(seed, r), dtype)
    wc = F.content_weights(t["memory"], t["key"], t["beta"])
    wg = F.interpolate(wc, t["w_prev"], t["gate"])
    ws = F.shift(wg, t["s"])
    return {
        "content": wc,
        "interpolate": wg,
        "shift": ws,
        "sharpen": F.sharpen(ws, t["gamma"]),
        "address": F.address(*(t[k] for k in ADDRESS_ARGS)),
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("r", SHIFT_RANGES)
@pytest.mark.parametrize("seed", [20, 21, 22])
def test_weightings_are_distributions(seed, r, dtype):
    for name, w in _weightings(seed, r, dtype).items():
        assert w.shape == (B, H, N), name
        assert (w >= 0).all(), name
        torch.testing.assert_close(
            w.sum(-1), torch.ones(B, H, dtype=dtype), **TOL[dtype], msg=lambda m: f"{name}: {m}"
        )


# --------------------------------------------------------------------------------------------
# 4. gradcheck in float64, inside the valid domain.
# --------------------------------------------------------------------------------------------


def _grad_inputs(seed: int, r: int = 1) -> dict[str, torch.Tensor]:
    a = random_inputs(seed, r)
    rng = np.random.default_rng(seed + 1000)
    # Keep away from the domain's boundaries, which finite differences would cross.
    a["gate"] = rng.uniform(0.1, 0.9, size=(B, H, 1))
    a["gamma"] = rng.uniform(1.1, 4.0, size=(B, H, 1))
    a["erase"] = rng.uniform(0.1, 0.9, size=(B, H, M))
    a["w_content"] = rng.dirichlet(np.ones(N), size=(B, H))
    a["w"] = rng.dirichlet(np.ones(N) * 2, size=(B, H)) + 0.01  # strictly positive
    a["w"] /= a["w"].sum(-1, keepdims=True)
    return as_torch(a, torch.float64, requires_grad=True)


def test_gradcheck_content_weights():
    t = _grad_inputs(30)
    assert torch.autograd.gradcheck(F.content_weights, (t["memory"], t["key"], t["beta"]))


def test_gradcheck_interpolate():
    t = _grad_inputs(31)
    assert torch.autograd.gradcheck(F.interpolate, (t["w_content"], t["w_prev"], t["gate"]))


@pytest.mark.parametrize("r", SHIFT_RANGES)
def test_gradcheck_shift(r):
    t = _grad_inputs(32, r)
    assert torch.autograd.gradcheck(F.shift, (t["w"], t["s"]))


def test_gradcheck_sharpen():
    t = _grad_inputs(33)
    assert torch.autograd.gradcheck(F.sharpen, (t["w"], t["gamma"]))


@pytest.mark.parametrize("r", [1, 2])
def test_gradcheck_address(r):
    t = _grad_inputs(34, r)
    assert torch.autograd.gradcheck(F.address, tuple(t[k] for k in ADDRESS_ARGS))


def test_gradcheck_read():
    t = _grad_inputs(35)
    assert torch.autograd.gradcheck(F.read, (t["memory"], t["w"]))


@pytest.mark.parametrize("heads", [1, 2])
def test_gradcheck_write(heads):
    t = _grad_inputs(36)
    w, erase, add = (t[k][:, :heads].detach().requires_grad_() for k in ("w", "erase", "add"))
    assert torch.autograd.gradcheck(F.write, (t["memory"], w, erase, add))


# --------------------------------------------------------------------------------------------
# 5. Numerical edges: finite values and gradients.
# --------------------------------------------------------------------------------------------


def _assert_finite_grads(out: torch.Tensor, inputs: dict[str, torch.Tensor], seed: int = 0):
    assert torch.isfinite(out).all()
    # A random cotangent, so no gradient is zero merely because the outputs sum to one.
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    grads = torch.autograd.grad(
        out, list(inputs.values()), g, allow_unused=True, retain_graph=True
    )
    for name, grad in zip(inputs, grads):
        assert grad is not None, name
        assert torch.isfinite(grad).all(), name


@pytest.mark.parametrize("dtype", DTYPES)
def test_content_weights_with_zero_memory_and_zero_key_is_uniform_and_finite(dtype):
    t = as_torch(random_inputs(40), dtype, requires_grad=True)
    cases = {
        "zero memory": (torch.zeros(B, N, M, dtype=dtype, requires_grad=True), t["key"]),
        "zero key": (t["memory"], torch.zeros(B, H, M, dtype=dtype, requires_grad=True)),
        "both zero": (
            torch.zeros(B, N, M, dtype=dtype, requires_grad=True),
            torch.zeros(B, H, M, dtype=dtype, requires_grad=True),
        ),
    }
    for name, (memory, key) in cases.items():
        w = F.content_weights(memory, key, t["beta"])
        torch.testing.assert_close(
            w, torch.full((B, H, N), 1.0 / N, dtype=dtype), **TOL[dtype], msg=name
        )
        _assert_finite_grads(w, {"memory": memory, "key": key, "beta": t["beta"]})


@pytest.mark.parametrize("dtype", DTYPES)
def test_content_weights_with_huge_beta_is_finite(dtype):
    t = as_torch(random_inputs(41), dtype, requires_grad=True)
    beta = torch.full((B, H, 1), 1e6, dtype=dtype, requires_grad=True)
    w = F.content_weights(t["memory"], t["key"], beta)
    _assert_finite_grads(w, {"memory": t["memory"], "key": t["key"], "beta": beta})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma", [1.0, 1.5, 2.0, 50.0])
def test_sharpen_gradients_with_exact_zeros_match_the_closed_form(gamma, dtype):
    # w with exact zeros (as after shifting a one-hot weighting). At gamma = 1 sharpen is w/sum(w),
    # so the zero entries still carry gradient; for gamma > 1 they carry none.
    wn = np.array([[0.0, 0.3, 0.0, 0.0, 0.7, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    wn = np.stack([wn, wn[::-1], wn[:, ::-1]])  # (B, H, N)
    gn = np.full((B, H, 1), gamma)
    w = torch.tensor(wn, dtype=dtype, requires_grad=True)
    g = torch.tensor(gn, dtype=dtype, requires_grad=True)
    out = F.sharpen(w, g)
    torch.testing.assert_close(out, torch.tensor(np_sharpen(wn, gn), dtype=dtype), **TOL[dtype])
    jw, jg = np_sharpen_jacobians(wn, gn)
    for i in range(N):
        dw, dg = torch.autograd.grad(out[..., i].sum(), (w, g), retain_graph=True)
        # Gradients of distinct (b, h) are independent, so summing over (b, h) loses nothing.
        torch.testing.assert_close(dw, torch.tensor(jw[:, :, i, :], dtype=dtype), **TOL[dtype])
        torch.testing.assert_close(
            dg[..., 0], torch.tensor(jg[:, :, i], dtype=dtype), **TOL[dtype]
        )


def test_sharpen_with_huge_gamma_does_not_underflow_in_float32():
    # 1/7^50 ~ 1e-42 underflows float32; the result must still be the uniform weighting.
    w = torch.full((B, H, N), 1.0 / N, requires_grad=True)
    gamma = torch.full((B, H, 1), 50.0, requires_grad=True)
    out = F.sharpen(w, gamma)
    torch.testing.assert_close(out, torch.full((B, H, N), 1.0 / N))
    _assert_finite_grads(out, {"w": w, "gamma": gamma})


@pytest.mark.parametrize("dtype", DTYPES)
def test_sharpen_with_huge_gamma_concentrates_on_the_maximum(dtype):
    # The peak is 1.5 times every other entry: the others end up (1/1.5)^50 ~ 2e-9 of the peak.
    w = torch.softmax(math.log(1.5) * one_hot(PEAKS, dtype=dtype), dim=-1)
    out = F.sharpen(w, torch.full((B, H, 1), 50.0, dtype=dtype))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, one_hot(PEAKS, dtype=dtype), rtol=0.0, atol=1e-7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma", [1.0, 50.0])
def test_address_at_the_edges_is_finite(gamma, dtype):
    # Zero memory, one-hot previous weighting, one-hot shift, gate 0 (so zeros reach sharpen),
    # huge beta, gamma exactly 1 or huge.
    memory = torch.zeros(B, N, M, dtype=dtype, requires_grad=True)
    inputs = {
        "memory": memory,
        "w_prev": one_hot(PEAKS, dtype=dtype).requires_grad_(),
        "key": torch.zeros(B, H, M, dtype=dtype, requires_grad=True),
        "beta": torch.full((B, H, 1), 1e6, dtype=dtype, requires_grad=True),
        "gate": torch.zeros(B, H, 1, dtype=dtype, requires_grad=True),
        "s": shift_weighting([[1] * H] * B, 1, dtype).requires_grad_(),
        "gamma": torch.full((B, H, 1), gamma, dtype=dtype, requires_grad=True),
    }
    w = F.address(*inputs.values())
    expected = one_hot([[(j + 1) % N for j in row] for row in PEAKS], dtype=dtype)
    torch.testing.assert_close(w, expected, rtol=0.0, atol=0.0)
    _assert_finite_grads(w, inputs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_address_on_the_initial_constant_memory_is_finite(dtype):
    # The modules start from memory 1e-6 everywhere: squared row norms ~5e-12, far below EPS.
    t = as_torch(random_inputs(43), dtype, requires_grad=True)
    memory = torch.full((B, N, M), 1e-6, dtype=dtype, requires_grad=True)
    inputs = {"memory": memory, **{k: t[k] for k in ADDRESS_ARGS[1:]}}
    w = F.address(*inputs.values())
    _assert_finite_grads(w, inputs)
    new = F.write(memory, w, t["erase"], t["add"])
    _assert_finite_grads(F.read(new, w), {"memory": memory, "erase": t["erase"], "add": t["add"]})
