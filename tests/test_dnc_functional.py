"""Tests of the DNC's memory access functions in `torch_ntm.dnc_functional`.

Each function is checked against a float64 oracle written here from the paper's equations
(Graves et al. 2016, Methods) with plain Python loops over indices, against small cases worked out
by hand, for the invariants the paper states (usage in [0, 1]; link matrices non-negative with a
zero diagonal and rows and columns summing to at most one; precedence and weightings in Delta_N),
for finite values and gradients at the edges (empty memory, zero keys, all usage 1, one-hot
weightings), and with `gradcheck`. Sizes are unequal (B=3, R=2, Hw=2, N=7, W=5) so that a swapped
axis fails; each test seeds its own generator.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torch_ntm import dnc_functional as D
from torch_ntm.functional import EPS

B, R, HW, N, W = 3, 2, 2, 7, 5
F64 = {"rtol": 1e-10, "atol": 1e-12}


# --------------------------------------------------------------------------------------------
# The oracle: float64 NumPy arrays, loops over indices, written from the equations.
# --------------------------------------------------------------------------------------------


def np_content(memory, key, beta):  # C(M, k, beta): softmax over rows of beta * cosine
    b_, h_, n_, w_ = key.shape[0], key.shape[1], memory.shape[1], memory.shape[2]
    out = np.zeros((b_, h_, n_))
    for b in range(b_):
        for h in range(h_):
            scores = []
            for i in range(n_):
                dot = sum(key[b, h, m] * memory[b, i, m] for m in range(w_))
                kk = sum(key[b, h, m] ** 2 for m in range(w_))
                mm = sum(memory[b, i, m] ** 2 for m in range(w_))
                scores.append(beta[b, h, 0] * dot / math.sqrt((kk + EPS) * (mm + EPS)))
            top = max(scores)
            total = sum(math.exp(s - top) for s in scores)
            for i in range(n_):
                out[b, h, i] = math.exp(scores[i] - top) / total
    return out


def np_retention(free, w_read_prev):  # psi[i] = prod_r (1 - f_r w^r_{t-1}[r, i])
    out = np.ones((w_read_prev.shape[0], w_read_prev.shape[2]))
    for b in range(out.shape[0]):
        for i in range(out.shape[1]):
            for r in range(w_read_prev.shape[1]):
                out[b, i] *= 1.0 - free[b, r] * w_read_prev[b, r, i]
    return out


def np_usage(usage_prev, w_write_prev, psi):  # (u + w - u w) psi, w = 1 - prod_h (1 - w_h)
    out = np.zeros_like(usage_prev)
    for b in range(out.shape[0]):
        for i in range(out.shape[1]):
            kept = 1.0
            for h in range(w_write_prev.shape[1]):
                kept *= 1.0 - w_write_prev[b, h, i]
            w = 1.0 - kept
            u = usage_prev[b, i]
            out[b, i] = (u + w - u * w) * psi[b, i]
    return out


def np_allocation_one(u):  # a[phi[j]] = (1 - u[phi[j]]) prod_{i<j} u[phi[i]], one batch element
    phi = sorted(range(len(u)), key=lambda i: (u[i], i))  # free list: ascending usage
    a = np.zeros(len(u))
    for j in range(len(u)):
        product = 1.0
        for i in range(j):
            product *= u[phi[i]]
        a[phi[j]] = (1.0 - u[phi[j]]) * product
    return a


def np_write_allocations(usage, gates):
    out = np.zeros((usage.shape[0], gates.shape[1], usage.shape[1]))
    for b in range(usage.shape[0]):
        u = usage[b].copy()
        for h in range(gates.shape[1]):
            a = np_allocation_one(u)
            out[b, h] = a
            for i in range(len(u)):
                u[i] = u[i] + (1.0 - u[i]) * gates[b, h] * a[i]
    return out


def np_write_weights(alloc, content, g_alloc, g_write):
    out = np.zeros_like(alloc)
    for b in range(alloc.shape[0]):
        for h in range(alloc.shape[1]):
            ga, gw = g_alloc[b, h, 0], g_write[b, h, 0]
            for i in range(alloc.shape[2]):
                out[b, h, i] = gw * (ga * alloc[b, h, i] + (1.0 - ga) * content[b, h, i])
    return out


def np_write(memory, w, erase, values):  # M * prod_h (1 - w_h e_h^T) + sum_h w_h v_h^T
    out = np.zeros_like(memory)
    for b in range(memory.shape[0]):
        for i in range(memory.shape[1]):
            for m in range(memory.shape[2]):
                keep, add = 1.0, 0.0
                for h in range(w.shape[1]):
                    keep *= 1.0 - w[b, h, i] * erase[b, h, m]
                    add += w[b, h, i] * values[b, h, m]
                out[b, i, m] = memory[b, i, m] * keep + add
    return out


def np_precedence(p_prev, w):
    out = np.zeros_like(p_prev)
    for b in range(p_prev.shape[0]):
        for h in range(p_prev.shape[1]):
            total = sum(w[b, h, i] for i in range(p_prev.shape[2]))
            for i in range(p_prev.shape[2]):
                out[b, h, i] = (1.0 - total) * p_prev[b, h, i] + w[b, h, i]
    return out


def np_link(link_prev, w, p_prev):
    out = np.zeros_like(link_prev)
    for b in range(link_prev.shape[0]):
        for h in range(link_prev.shape[1]):
            for i in range(link_prev.shape[2]):
                for j in range(link_prev.shape[3]):
                    if i == j:
                        continue  # L[i, i] = 0
                    out[b, h, i, j] = ((1.0 - w[b, h, i] - w[b, h, j]) * link_prev[b, h, i, j]
                                       + w[b, h, i] * p_prev[b, h, j])
    return out


def np_keep_largest(v, k):  # all but the k largest entries (ties: the lower index) set to 0
    out = np.zeros_like(v)
    for index in np.ndindex(*v.shape[:-1]):
        row = v[index]
        keep = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
        for i in keep:
            out[index + (i,)] = row[i]
    return out


def np_sparse_link(link_prev, w, p_prev, k):
    n_ = w.shape[-1]
    out = np_link(link_prev, np_keep_largest(w, k), np_keep_largest(p_prev, k))
    if k < n_:
        out[out < 1.0 / k] = 0.0
    return out


def np_directional(link, w_read_prev):  # f = L w, b = L^T w, for each (read head, write head)
    b_, hw_, n_ = link.shape[0], link.shape[1], link.shape[2]
    r_ = w_read_prev.shape[1]
    fwd, bwd = np.zeros((b_, r_, hw_, n_)), np.zeros((b_, r_, hw_, n_))
    for b in range(b_):
        for r in range(r_):
            for h in range(hw_):
                for i in range(n_):
                    for j in range(n_):
                        fwd[b, r, h, i] += link[b, h, i, j] * w_read_prev[b, r, j]
                        bwd[b, r, h, i] += link[b, h, j, i] * w_read_prev[b, r, j]
    return fwd, bwd


def np_read_weights(content, fwd, bwd, modes):  # pi = (b_1..b_Hw, c, f_1..f_Hw)
    hw_ = fwd.shape[2]
    out = np.zeros_like(content)
    for b in range(content.shape[0]):
        for r in range(content.shape[1]):
            for i in range(content.shape[2]):
                value = modes[b, r, hw_] * content[b, r, i]
                for h in range(hw_):
                    value += modes[b, r, h] * bwd[b, r, h, i]
                    value += modes[b, r, hw_ + 1 + h] * fwd[b, r, h, i]
                out[b, r, i] = value
    return out


def np_read(memory, w):  # r[h, m] = sum_i w[h, i] M[i, m]
    out = np.zeros((w.shape[0], w.shape[1], memory.shape[2]))
    for b in range(w.shape[0]):
        for h in range(w.shape[1]):
            for m in range(memory.shape[2]):
                out[b, h, m] = sum(w[b, h, i] * memory[b, i, m] for i in range(w.shape[2]))
    return out


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def gen(seed):
    return torch.Generator().manual_seed(seed)


def unit(g, *shape, dtype=torch.float64):
    return torch.rand(*shape, generator=g, dtype=dtype)


def weighting(g, *shape, dtype=torch.float64, total=None):
    """Random weightings in Delta_N: softmax scaled by a total in (0, 1] (random if None)."""
    w = torch.softmax(3 * torch.randn(*shape, generator=g, dtype=dtype), -1)
    scale = unit(g, *shape[:-1], 1, dtype=dtype) if total is None else total
    return w * scale


def valid_link(g, b=B, hw=HW, n=N, steps=6, dtype=torch.float64):
    """A link matrix and precedence reached by random writes, so both obey the invariants."""
    link = torch.zeros(b, hw, n, n, dtype=dtype)
    p = torch.zeros(b, hw, n, dtype=dtype)
    for _ in range(steps):
        w = weighting(g, b, hw, n, dtype=dtype)
        link, p = D.link(link, w, p), D.precedence(p, w)
    return link, p


def np_(*tensors):
    return [t.detach().numpy() for t in tensors]


def close(got, want):
    torch.testing.assert_close(got, torch.as_tensor(want, dtype=got.dtype), **F64)


# --------------------------------------------------------------------------------------------
# Each function against the oracle
# --------------------------------------------------------------------------------------------


def test_retention_matches_the_oracle():
    g = gen(0)
    free, w_read = unit(g, B, R), weighting(g, B, R, N)
    close(D.retention(free, w_read), np_retention(*np_(free, w_read)))


@pytest.mark.parametrize("hw", [1, HW])
def test_usage_matches_the_oracle(hw):
    g = gen(1)
    u, w_write, psi = unit(g, B, N), weighting(g, B, hw, N), unit(g, B, N)
    close(D.usage(u, w_write, psi), np_usage(*np_(u, w_write, psi)))


def test_allocation_matches_the_oracle():
    g = gen(2)
    u = unit(g, B, N)
    u[0, 3] = u[0, 5]  # a tie: the lower row comes first in the free list
    want = np.stack([np_allocation_one(row) for row in u.numpy()])
    close(D.allocation(u), want)


@pytest.mark.parametrize("hw", [1, 3])
def test_write_allocations_match_the_oracle(hw):
    g = gen(3)
    u, gates = unit(g, B, N), unit(g, B, hw)
    close(D.write_allocations(u, gates), np_write_allocations(*np_(u, gates)))


def test_write_weights_match_the_oracle():
    g = gen(4)
    alloc, content = weighting(g, B, HW, N), weighting(g, B, HW, N, total=1.0)
    ga, gw = unit(g, B, HW, 1), unit(g, B, HW, 1)
    close(D.write_weights(alloc, content, ga, gw), np_write_weights(*np_(alloc, content, ga, gw)))


@pytest.mark.parametrize("hw", [1, HW])
def test_write_matches_the_oracle(hw):
    g = gen(5)
    memory, w = torch.randn(B, N, W, generator=g, dtype=torch.float64), weighting(g, B, hw, N)
    erase, values = unit(g, B, hw, W), torch.randn(B, hw, W, generator=g, dtype=torch.float64)
    close(D.write(memory, w, erase, values), np_write(*np_(memory, w, erase, values)))


def test_precedence_and_link_match_the_oracle():
    g = gen(6)
    link, p = valid_link(g)
    w = weighting(g, B, HW, N)
    close(D.precedence(p, w), np_precedence(*np_(p, w)))
    close(D.link(link, w, p), np_link(*np_(link, w, p)))


def test_directional_weights_match_the_oracle():
    g = gen(7)
    link, _ = valid_link(g)
    w_read = weighting(g, B, R, N)
    fwd, bwd = D.directional_weights(link, w_read)
    want_f, want_b = np_directional(*np_(link, w_read))
    close(fwd, want_f)
    close(bwd, want_b)


@pytest.mark.parametrize("hw", [1, HW])
def test_read_weights_match_the_oracle(hw):
    g = gen(8)
    content = weighting(g, B, R, N, total=1.0)
    fwd, bwd = weighting(g, B, R, hw, N), weighting(g, B, R, hw, N)
    modes = torch.softmax(torch.randn(B, R, 2 * hw + 1, generator=g, dtype=torch.float64), -1)
    close(D.read_weights(content, fwd, bwd, modes), np_read_weights(*np_(content, fwd, bwd, modes)))


def test_content_lookup_and_read_match_the_oracle():
    g = gen(9)
    memory = torch.randn(B, N, W, generator=g, dtype=torch.float64)
    key, beta = torch.randn(B, R, W, generator=g, dtype=torch.float64), 1 + 5 * unit(g, B, R, 1)
    close(D.content_weights(memory, key, beta), np_content(*np_(memory, key, beta)))
    w = weighting(g, B, R, N)
    close(D.read(memory, w), np_read(*np_(memory, w)))


@pytest.mark.parametrize("k", [1, 2, 3, N - 1])
def test_sparse_link_matches_the_oracle(k):
    g = gen(10)
    link, p = valid_link(g)
    w = weighting(g, B, HW, N)
    close(D.sparse_link(link, w, p, k), np_sparse_link(*np_(link, w, p), k))


# --------------------------------------------------------------------------------------------
# Small cases worked out by hand
# --------------------------------------------------------------------------------------------


def t(values):
    return torch.tensor(values, dtype=torch.float64)


def test_allocation_by_hand():
    # free list: row 1 (0.2), row 3 (0.4), row 0 (0.5), row 2 (0.9)
    a = D.allocation(t([[0.5, 0.2, 0.9, 0.4]]))
    close(a, [[0.5 * 0.2 * 0.4, 0.8, 0.1 * 0.2 * 0.4 * 0.5, 0.6 * 0.2]])
    close(a.sum(), 1 - 0.5 * 0.2 * 0.9 * 0.4)  # telescopes to 1 - prod(u)


def test_allocation_of_empty_and_full_memory():
    close(D.allocation(torch.zeros(1, 4, dtype=torch.float64)), [[1.0, 0, 0, 0]])  # row 0 first
    close(D.allocation(torch.ones(1, 4, dtype=torch.float64)), [[0.0, 0, 0, 0]])  # nothing free


def test_two_write_heads_allocate_different_rows_unless_the_first_does_not_write():
    u = torch.zeros(1, 4, dtype=torch.float64)
    close(D.write_allocations(u, t([[1.0, 1.0]])), [[[1.0, 0, 0, 0], [0, 1.0, 0, 0]]])
    close(D.write_allocations(u, t([[0.0, 1.0]])), [[[1.0, 0, 0, 0], [1.0, 0, 0, 0]]])


def test_usage_by_hand_a_write_raises_it_and_a_free_gate_frees_what_was_read():
    u, w_write = t([[0.5, 0.0, 0.2]]), t([[[0.5, 1.0, 0.0]]])
    close(D.usage(u, w_write, torch.ones(1, 3, dtype=torch.float64)), [[0.75, 1.0, 0.2]])
    psi = D.retention(t([[1.0]]), t([[[0.0, 1.0, 0.0]]]))  # free the row read last step
    close(psi, [[1.0, 0.0, 1.0]])
    close(D.usage(u, w_write, psi), [[0.75, 0.0, 0.2]])
    # a free gate of 0 frees nothing
    close(D.retention(t([[0.0]]), t([[[0.0, 1.0, 0.0]]])), [[1.0, 1.0, 1.0]])


def test_write_weights_gates_by_hand():
    a, c = t([[[1.0, 0, 0]]]), t([[[0, 0.5, 0.5]]])
    one, zero = t([[[1.0]]]), t([[[0.0]]])
    close(D.write_weights(a, c, one, one), a)  # allocation gate 1: the allocation
    close(D.write_weights(a, c, zero, one), c)  # allocation gate 0: the content weighting
    close(D.write_weights(a, c, one, zero), torch.zeros(1, 1, 3, dtype=torch.float64))  # no write


def test_a_one_hot_write_with_full_erase_replaces_the_row():
    memory = torch.arange(12, dtype=torch.float64).view(1, 4, 3)
    new = D.write(memory, t([[[0, 0, 1.0, 0]]]), t([[[1.0, 1.0, 1.0]]]), t([[[7.0, 8.0, 9.0]]]))
    want = memory.clone()
    want[0, 2] = t([7.0, 8.0, 9.0])
    close(new, want)


def _one_hot_writes(rows, n=4):
    """Link and precedence after one-hot writes to ``rows`` in order (one write head)."""
    link = torch.zeros(1, 1, n, n, dtype=torch.float64)
    p = torch.zeros(1, 1, n, dtype=torch.float64)
    for row in rows:
        w = torch.zeros(1, 1, n, dtype=torch.float64)
        w[0, 0, row] = 1.0
        link, p = D.link(link, w, p), D.precedence(p, w)
    return link, p


def test_link_records_the_order_of_writes_and_forward_backward_follow_it():
    link, p = _one_hot_writes([2, 0, 3])
    want = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    want[0, 0, 0, 2] = 1.0  # 0 was written after 2
    want[0, 0, 3, 0] = 1.0  # 3 after 0
    close(link, want)
    close(p, [[[0, 0, 0, 1.0]]])  # 3 was written last
    at_2 = t([[[0, 0, 1.0, 0]]])
    fwd, bwd = D.directional_weights(link, at_2)
    close(fwd[0, 0, 0], [1.0, 0, 0, 0])  # forward from 2: row 0
    close(bwd[0, 0, 0], [0.0, 0, 0, 0])  # nothing was written before 2
    fwd, bwd = D.directional_weights(link, t([[[1.0, 0, 0, 0]]]))
    close(fwd[0, 0, 0], [0, 0, 0, 1.0])  # forward from 0: row 3
    close(bwd[0, 0, 0], [0, 0, 1.0, 0])  # backward from 0: row 2


def test_rewriting_a_row_removes_its_old_links():
    link, p = _one_hot_writes([2, 0, 3, 2])
    want = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    want[0, 0, 3, 0] = 1.0  # 3 after 0 stays
    want[0, 0, 2, 3] = 1.0  # 2 after 3 is new; 0 after 2 is gone (2 was overwritten)
    close(link, want)


def test_precedence_by_hand():
    p = D.precedence(t([[[0.0, 1.0, 0.0]]]), t([[[0.25, 0.0, 0.5]]]))
    close(p, [[[0.25, 0.25, 0.5]]])  # (1 - 0.75) * p + w


def test_read_modes_pick_content_forward_or_backward():
    g = gen(11)
    content = weighting(g, 1, 1, N, total=1.0)
    fwd, bwd = weighting(g, 1, 1, 2, N), weighting(g, 1, 1, 2, N)

    def mode(index):  # one-hot read mode over (b_1, b_2, c, f_1, f_2)
        m = torch.zeros(1, 1, 5, dtype=torch.float64)
        m[..., index] = 1.0
        return m

    close(D.read_weights(content, fwd, bwd, mode(2)), content)
    close(D.read_weights(content, fwd, bwd, mode(0)), bwd[:, :, 0])
    close(D.read_weights(content, fwd, bwd, mode(1)), bwd[:, :, 1])
    close(D.read_weights(content, fwd, bwd, mode(3)), fwd[:, :, 0])
    close(D.read_weights(content, fwd, bwd, mode(4)), fwd[:, :, 1])
    assert D.read_mode_width(1) == 3  # the paper's (backward, content, forward)
    with pytest.raises(ValueError, match="5 entries, got 3"):
        D.read_weights(content, fwd, bwd, mode(2)[..., :3])


def test_sparse_link_keeps_k_entries_and_equals_dense_when_k_is_n():
    g = gen(12)
    dense = sparse = torch.zeros(B, HW, N, N, dtype=torch.float64)
    p = torch.zeros(B, HW, N, dtype=torch.float64)
    for _ in range(8):
        w = weighting(g, B, HW, N)
        dense, sparse = D.link(dense, w, p), D.sparse_link(sparse, w, p, N)
        p = D.precedence(p, w)
        torch.testing.assert_close(sparse, dense, rtol=0, atol=0)
    for k in (1, 2):
        link, p = valid_link(g, steps=3)
        for _ in range(5):
            w = weighting(g, B, HW, N)
            link, p = D.sparse_link(link, w, p, k), D.precedence(p, w)
            nonzero = link > 0
            assert nonzero.sum(-1).max() <= k and nonzero.sum(-2).max() <= k
            assert (link[nonzero] >= 1.0 / k).all()
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="k >= 1"):
            D.sparse_link(link, w, p, bad)


def test_one_hot_writes_give_the_same_sparse_and_dense_links():
    """With one-hot writes the link matrix is 0/1, so the K = 1 approximation is exact."""
    dense, p = _one_hot_writes([2, 0, 3, 1])
    sparse, q = torch.zeros_like(dense), torch.zeros(1, 1, 4, dtype=torch.float64)
    stored = D.empty_sparse_link(1, 1, 4, 1, dtype=torch.float64)
    for row in [2, 0, 3, 1]:
        w = torch.zeros(1, 1, 4, dtype=torch.float64)
        w[0, 0, row] = 1.0
        stored = D.sparse_link_update(stored, w, q, 1)
        sparse, q = D.sparse_link(sparse, w, q, 1), D.precedence(q, w)
    close(sparse, dense)
    close(D.sparse_link_dense(stored, 4), dense)
    assert dense.sum() == 3  # three links: 0 after 2, 3 after 0, 1 after 3


def _dense_and_stored_links(k, steps, g, n=N, sharp=False):
    """The link matrices of `sparse_link` (dense) and `sparse_link_update` (stored) after the
    same random writes, step by step."""
    dense = torch.zeros(B, HW, n, n, dtype=torch.float64)
    stored = D.empty_sparse_link(B, HW, n, k, dtype=torch.float64)
    p = torch.zeros(B, HW, n, dtype=torch.float64)
    for _ in range(steps):
        w = weighting(g, B, HW, n, total=1.0 if sharp else None)
        if sharp:  # near one-hot writes, so links above 1/K survive the threshold
            w = torch.softmax(30 * w, -1) * unit(g, B, HW, 1).clamp_min(0.5)
        dense, stored = D.sparse_link(dense, w, p, k), D.sparse_link_update(stored, w, p, k)
        p = D.precedence(p, w)
        yield dense, stored


@pytest.mark.parametrize("k", [1, 2, 3, N])
@pytest.mark.parametrize("sharp", [False, True], ids=["soft", "sharp"])
def test_stored_sparse_link_equals_the_dense_sparse_link(k, sharp):
    g = gen(20)
    nonzero = 0
    for dense, stored in _dense_and_stored_links(k, 8, g, sharp=sharp):
        assert stored.values.shape == (B, HW, N, min(k, N))
        torch.testing.assert_close(D.sparse_link_dense(stored, N), dense, **F64)
        w_read = weighting(g, B, R, N)
        for got, want in zip(D.sparse_directional_weights(stored, w_read),
                             D.directional_weights(dense, w_read)):
            torch.testing.assert_close(got, want, **F64)
        nonzero += int((dense > 0).sum())
    # the comparison was not between two zero matrices (with K = 1 only links of exactly 1
    # survive the threshold: one-hot writes, tested below)
    assert nonzero > 0 or k == 1


def test_stored_sparse_link_with_k_equal_to_n_is_the_exact_link():
    g = gen(21)
    exact = torch.zeros(B, HW, N, N, dtype=torch.float64)
    stored = D.empty_sparse_link(B, HW, N, N, dtype=torch.float64)
    p = torch.zeros(B, HW, N, dtype=torch.float64)
    for _ in range(6):
        w = weighting(g, B, HW, N)
        exact, stored = D.link(exact, w, p), D.sparse_link_update(stored, w, p, N)
        p = D.precedence(p, w)
    torch.testing.assert_close(D.sparse_link_dense(stored, N), exact, **F64)


@pytest.mark.parametrize("k", [1, 2, N, N + 3])
def test_sparse_link_from_dense_round_trips_rows_of_at_most_k_entries(k):
    """A dense matrix with at most min(k, N) non-zero entries a row comes back whole from its
    stored form (values and gradient), each stored value at its own column; a row with more keeps
    its k largest."""
    g = gen(23)
    slots = min(k, N)
    full = torch.rand(B, HW, N, N, generator=g, dtype=torch.float64)
    keep = torch.zeros_like(full).scatter(-1, torch.rand(B, HW, N, N, generator=g).argsort(-1)[
        ..., :slots], 1.0)
    dense = (full * keep).requires_grad_()
    stored = D.sparse_link_from_dense(dense, k)
    assert stored.values.shape == stored.columns.shape == (B, HW, N, slots)
    torch.testing.assert_close(stored.values, dense.gather(-1, stored.columns), rtol=0, atol=0)
    torch.testing.assert_close(D.sparse_link_dense(stored, N), dense, rtol=0, atol=0)
    weight = torch.rand(B, HW, N, N, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad((D.sparse_link_dense(stored, N) * weight).sum(), dense)
    torch.testing.assert_close(grad, weight * keep, rtol=0, atol=0)
    if k < N:  # a full row: its k largest entries
        top = D.sparse_link_dense(D.sparse_link_from_dense(full, k), N)
        assert torch.equal((top > 0).sum(-1), torch.full((B, HW, N), k))
        assert (top.amax(-1) == full.amax(-1)).all()
        assert (full * (top == 0)).amax(-1).le(top.where(top > 0, 2.0).amin(-1)).all()
    with pytest.raises(ValueError, match="k >= 1"):
        D.sparse_link_from_dense(dense, 0)


def test_stored_sparse_link_refuses_a_store_of_another_k():
    g = gen(22)
    stored = D.empty_sparse_link(1, 1, N, 2)
    w = weighting(g, 1, 1, N, dtype=torch.float32)
    with pytest.raises(ValueError, match="k=3 and N=7 has 3 slots per row, got 2"):
        D.sparse_link_update(stored, w, w, 3)
    with pytest.raises(ValueError, match="k >= 1"):
        D.sparse_link_update(stored, w, w, 0)


def test_gradcheck_stored_sparse_link():
    g = gen(23)
    for k in (2, 5):
        *_, (_, stored) = _dense_and_stored_links(k, 4, g, n=5)
        values = stored.values.detach()
        w, p, w_read = weighting(g, B, HW, 5), weighting(g, B, HW, 5), weighting(g, B, R, 5)

        def update(values, w, p, k=k, columns=stored.columns):
            return D.sparse_link_update(D.SparseLink(values, columns), w, p, k).values

        def directional(values, w_read, columns=stored.columns):
            return D.sparse_directional_weights(D.SparseLink(values, columns), w_read)

        assert torch.autograd.gradcheck(update, _req(values, w, p))
        assert torch.autograd.gradcheck(directional, _req(values, w_read))


# --------------------------------------------------------------------------------------------
# Invariants over a run of random steps
# --------------------------------------------------------------------------------------------


def random_parameters(g, b=B, r=R, hw=HW, w=W, dtype=torch.float64):
    """One step's activated interface, as the controller would emit it."""
    return dict(
        read_key=torch.randn(b, r, w, generator=g, dtype=dtype),
        read_strength=1 + 4 * unit(g, b, r, 1, dtype=dtype),
        write_key=torch.randn(b, hw, w, generator=g, dtype=dtype),
        write_strength=1 + 4 * unit(g, b, hw, 1, dtype=dtype),
        erase=unit(g, b, hw, w, dtype=dtype),
        write_vector=torch.randn(b, hw, w, generator=g, dtype=dtype),
        free_gate=unit(g, b, r, dtype=dtype),
        allocation_gate=unit(g, b, hw, 1, dtype=dtype),
        write_gate=unit(g, b, hw, 1, dtype=dtype),
        read_mode=torch.softmax(torch.randn(b, r, 2 * hw + 1, generator=g, dtype=dtype), -1),
    )


def empty_state(b=B, r=R, hw=HW, n=N, w=W, dtype=torch.float64):
    z = dict(dtype=dtype)
    return dict(memory=torch.zeros(b, n, w, **z), usage=torch.zeros(b, n, **z),
                link=torch.zeros(b, hw, n, n, **z), precedence=torch.zeros(b, hw, n, **z),
                read_weights=torch.zeros(b, r, n, **z), write_weights=torch.zeros(b, hw, n, **z))


def access_step(s, q):
    """One step of the memory access, composed from the functions as the module docstring says."""
    u = D.usage(s["usage"], s["write_weights"], D.retention(q["free_gate"], s["read_weights"]))
    content_w = D.content_weights(s["memory"], q["write_key"], q["write_strength"])
    alloc = D.write_allocations(u, (q["allocation_gate"] * q["write_gate"])[..., 0])
    w_write = D.write_weights(alloc, content_w, q["allocation_gate"], q["write_gate"])
    memory = D.write(s["memory"], w_write, q["erase"], q["write_vector"])
    link = D.link(s["link"], w_write, s["precedence"])
    fwd, bwd = D.directional_weights(link, s["read_weights"])
    content_r = D.content_weights(memory, q["read_key"], q["read_strength"])
    w_read = D.read_weights(content_r, fwd, bwd, q["read_mode"])
    new = dict(memory=memory, usage=u, link=link,
               precedence=D.precedence(s["precedence"], w_write), read_weights=w_read,
               write_weights=w_write)
    return new, D.read(memory, w_read), alloc


def assert_in_delta(w, name, tol=1e-12):
    assert (w >= 0).all(), f"{name} has a negative entry"
    assert (w.sum(-1) <= 1 + tol).all(), f"{name} sums to more than 1"


@pytest.mark.parametrize("hw", [1, HW])
def test_the_invariants_hold_over_random_steps(hw):
    g = gen(13)
    s = empty_state(hw=hw)
    for _ in range(12):
        s, reads, alloc = access_step(s, random_parameters(g, hw=hw))
        assert ((s["usage"] >= 0) & (s["usage"] <= 1)).all()
        link = s["link"]
        assert (link >= 0).all()
        assert (torch.diagonal(link, dim1=-2, dim2=-1) == 0).all()
        assert (link.sum(-1) <= 1 + 1e-12).all() and (link.sum(-2) <= 1 + 1e-12).all()
        for name in ("precedence", "read_weights", "write_weights"):
            assert_in_delta(s[name], name)
        assert_in_delta(alloc, "allocation")
        assert torch.isfinite(reads).all()


def test_usage_stays_in_range_at_its_bounds():
    """Writes on full rows, free gates on unread rows and the reverse keep u in [0, 1]."""
    g = gen(14)
    for u in (torch.zeros(B, N, dtype=torch.float64), torch.ones(B, N, dtype=torch.float64)):
        w_write = weighting(g, B, HW, N, total=1.0)
        for free in (torch.zeros(B, R), torch.ones(B, R)):
            psi = D.retention(free.double(), weighting(g, B, R, N, total=1.0))
            new = D.usage(u, w_write, psi)
            assert ((new >= 0) & (new <= 1)).all()


# --------------------------------------------------------------------------------------------
# The edges: finite values and gradients
# --------------------------------------------------------------------------------------------


def _grads_finite(outputs, inputs):
    total = sum(o.sum() * (1 + i) for i, o in enumerate(outputs))
    grads = torch.autograd.grad(total, inputs, allow_unused=True)
    for grad in grads:
        assert grad is None or torch.isfinite(grad).all()


@pytest.mark.parametrize("edge", ["empty memory", "zero keys", "all usage 1", "one-hot",
                                  "gates at 0", "gates at 1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_step_at_the_edges_is_finite_with_finite_gradients(edge, dtype):
    g = gen(15)
    q = random_parameters(g, dtype=dtype)
    s = empty_state(dtype=dtype)
    if edge != "empty memory":
        s["memory"] = torch.randn(B, N, W, generator=g, dtype=dtype)
    if edge == "zero keys":
        q["read_key"].zero_()
        q["write_key"].zero_()
    if edge == "all usage 1":
        s["usage"] = torch.ones(B, N, dtype=dtype)
    if edge == "one-hot":
        for name, heads in (("read_weights", R), ("write_weights", HW)):
            s[name] = torch.zeros(B, heads, N, dtype=dtype)
            s[name][..., 3] = 1.0
        s["link"], s["precedence"] = valid_link(g, dtype=dtype)
        s["usage"] = (torch.arange(N) % 2).to(dtype).expand(B, N).clone()  # exact 0s and 1s
    if edge.startswith("gates"):
        value = 0.0 if edge.endswith("0") else 1.0
        for name in ("free_gate", "allocation_gate", "write_gate", "erase"):
            q[name] = torch.full_like(q[name], value)
    leaves = [t.requires_grad_() for t in (*s.values(), *q.values())]
    new, reads, alloc = access_step(s, q)
    outputs = [*new.values(), reads, alloc]
    for o in outputs:
        assert torch.isfinite(o).all()
    _grads_finite(outputs, leaves)
    if edge == "all usage 1":
        assert (alloc == 0).all()  # nothing to allocate until something is freed
    if edge == "empty memory":  # the write content weighting of an empty memory is uniform
        content = D.content_weights(s["memory"], q["write_key"], q["write_strength"])
        torch.testing.assert_close(content, torch.full_like(content, 1.0 / N))


def test_allocation_gradient_is_finite_with_ties_zeros_and_ones():
    u = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.0]], dtype=torch.float64,
                     requires_grad=True)
    a = D.allocation(u)
    (grad,) = torch.autograd.grad((a * torch.arange(7.0, dtype=torch.float64)).sum(), u)
    assert torch.isfinite(grad).all()
    close(a, [[1.0, 0, 0, 0, 0, 0, 0]])


# --------------------------------------------------------------------------------------------
# gradcheck (float64)
# --------------------------------------------------------------------------------------------


def _req(*tensors):
    return tuple(t.detach().clone().requires_grad_() for t in tensors)


def test_gradcheck_retention_usage_precedence_link_directional():
    g = gen(16)
    link, p = valid_link(g, b=2, n=5)
    w_write, w_read = weighting(g, 2, HW, 5), weighting(g, 2, R, 5)
    free, u, psi = unit(g, 2, R), unit(g, 2, 5), unit(g, 2, 5)
    assert torch.autograd.gradcheck(D.retention, _req(free, w_read))
    assert torch.autograd.gradcheck(D.usage, _req(u, w_write, psi))
    assert torch.autograd.gradcheck(D.precedence, _req(p, w_write))
    assert torch.autograd.gradcheck(D.link, _req(link, w_write, p))
    assert torch.autograd.gradcheck(D.directional_weights, _req(link, w_read))


def test_gradcheck_allocation_write_weights_read_weights():
    g = gen(17)
    # distinct usages (the sort order is locally constant) including an exact 0 and an exact 1
    u = torch.tensor([[0.3, 0.0, 0.8, 1.0, 0.55], [0.9, 0.2, 0.45, 0.6, 0.1]],
                     dtype=torch.float64)
    assert torch.autograd.gradcheck(D.allocation, _req(u))
    assert torch.autograd.gradcheck(D.write_allocations, _req(u, unit(g, 2, 3)))
    alloc, content = weighting(g, 2, HW, 5), weighting(g, 2, HW, 5, total=1.0)
    assert torch.autograd.gradcheck(
        D.write_weights, _req(alloc, content, unit(g, 2, HW, 1), unit(g, 2, HW, 1)))
    modes = torch.softmax(torch.randn(2, R, 2 * HW + 1, generator=g, dtype=torch.float64), -1)
    fwd, bwd = weighting(g, 2, R, HW, 5), weighting(g, 2, R, HW, 5)
    assert torch.autograd.gradcheck(D.read_weights,
                                    _req(weighting(g, 2, R, 5), fwd, bwd, modes))


def test_gradcheck_sparse_link_away_from_its_thresholds():
    g = gen(18)
    link, p = valid_link(g, b=2, n=5)
    w = weighting(g, 2, HW, 5)
    for k in (2, 5):
        assert torch.autograd.gradcheck(lambda a, b, c, k=k: D.sparse_link(a, b, c, k),
                                        _req(link, w, p))


def test_gradcheck_a_whole_access_step_from_used_memory():
    """From a memory used by a few random steps: distinct usages, so the free list's order is
    locally constant (at the empty memory's tied usages a finite difference would reorder it)."""
    g = gen(19)
    s = empty_state(b=1)
    for _ in range(3):
        s, _, _ = access_step(s, random_parameters(g, b=1))
    q = random_parameters(g, b=1)
    state_names, names = list(s), list(q)

    def step(*flat):
        new, reads, alloc = access_step(dict(zip(state_names, flat[: len(s)])),
                                        dict(zip(names, flat[len(s):])))
        return (*new.values(), reads, alloc)

    assert torch.autograd.gradcheck(step, _req(*s.values(), *q.values()))
