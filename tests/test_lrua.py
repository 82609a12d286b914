"""Tests of Least Recently Used Access (LRUA) in `torch_ntm.functional` (Santoro et al. 2016).

Each op is checked against an independent float64 NumPy oracle written from the paper's equations
with explicit loops, against small cases computed by hand, for its invariants (non-negative
weightings and usage, reads summing to one, exactly n least-used rows), with `gradcheck` for the
differentiable parts, and at the edges (zero memory, zero keys, one-hot weightings). Sizes are
unequal (B=3, H=2, N=7, M=5) so that a swapped axis fails.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torch_ntm import functional as F
from torch_ntm.functional import EPS, USAGE_DECAY

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
