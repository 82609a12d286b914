"""Memory access of the Differentiable Neural Computer, as pure functions.

Graves, Wayne, Reynolds et al. (2016), "Hybrid computing using a neural network with dynamic
external memory", Nature 538, Methods ("Memory addressing"). Every function is batched and holds
no weights. Shapes use

    B batch, N memory rows, W row width, R read heads, Hw write heads.

The paper has one write head; several are allowed here, generalised as DeepMind's reference
implementation (github.com/deepmind/dnc, ``addressing.py``) does: each write head has its own
content key, gates, precedence and link matrix; usage counts a row written by any of them; the heads
allocate one after another. With ``Hw = 1`` every function is the paper's equation.

One step of the memory access (`torch_ntm.dnc.DNC` runs it; M_{t-1} is the memory before it):

    psi_t  = retention(f_t, w^r_{t-1})                         # memory retention vector
    u_t    = usage(u_{t-1}, w^w_{t-1}, psi_t)                  # usage vector
    c^w_t  = content_weights(M_{t-1}, k^w_t, beta^w_t)         # write content weighting
    a_t    = write_allocations(u_t, g^a_t g^w_t)               # allocation weighting, eq. (1)
    w^w_t  = write_weights(a_t, c^w_t, g^a_t, g^w_t)           # write weighting, eq. (2)
    M_t    = write(M_{t-1}, w^w_t, e_t, v_t)                   # erase and write
    L_t    = link(L_{t-1}, w^w_t, p_{t-1})                     # temporal link matrix
    p_t    = precedence(p_{t-1}, w^w_t)                        # precedence weighting
    f_t, b_t = directional_weights(L_t, w^r_{t-1})             # forward and backward weightings
    c^r_t  = content_weights(M_t, k^r_t, beta^r_t)             # read content weighting
    w^r_t  = read_weights(c^r_t, f_t, b_t, pi_t)               # read modes
    r_t    = read(M_t, w^r_t)                                  # read vectors

Content lookup ``C(M, k, beta)`` (cosine similarity times the key strength, softmax over rows) is
`torch_ntm.functional.content_weights`, shared with the NTM; erase-and-write and reading are its
`torch_ntm.functional.write` and `torch_ntm.functional.read` (re-exported here under the same
names). `sparse_link` is the paper's sparse approximation of `link` ("Sparse link matrix") on
dense matrices; `sparse_link_update` and `sparse_directional_weights` compute the same on
matrices stored K entries per row (`SparseLink`), in the paper's O(N K) memory.

A weighting here is in the paper's Delta_N: non-negative, summing to at most one; the functions keep
that invariant when their inputs have it, and stay finite, with finite gradients, at the edges
(empty memory, all usage 1, zero keys, one-hot weightings).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from torch_ntm.functional import content_weights, product, read, stable_order, write

__all__ = [
    "content_weights",
    "retention",
    "usage",
    "allocation",
    "exclusive_cumprod",
    "write_allocations",
    "write_weights",
    "write",
    "precedence",
    "link",
    "sparse_link",
    "SparseLink",
    "empty_sparse_link",
    "sparse_link_update",
    "sparse_link_dense",
    "sparse_directional_weights",
    "directional_weights",
    "read_mode_width",
    "read_weights",
    "read",
]


def retention(free_gates: Tensor, w_read_prev: Tensor) -> Tensor:
    """Memory retention vector ``psi_t = prod_i (1 - f^i_t w^{r,i}_{t-1})``.

    How much each row is kept from being freed: a read head whose free gate is 1 frees the rows it
    read last step.

    Args:
        free_gates: ``[B, R]`` free gates f^i_t in [0, 1], one per read head.
        w_read_prev: ``[B, R, N]`` read weightings w^r_{t-1}.

    Returns:
        ``[B, N]`` psi_t, in [0, 1] when the inputs are in their ranges.
    """
    return product(1.0 - free_gates.unsqueeze(-1) * w_read_prev, dim=1)


def usage(usage_prev: Tensor, w_write_prev: Tensor, psi: Tensor) -> Tensor:
    """Usage vector ``u_t = (u_{t-1} + w^w_{t-1} - u_{t-1} w^w_{t-1}) psi_t``.

    With several write heads, ``w^w_{t-1}`` is the weight with which any head wrote a row,
    ``1 - prod_h (1 - w^w_{t-1,h})`` (DeepMind's generalisation; the paper's term for one head).
    Unlike DeepMind's reference, which stops the gradient through the previous write weighting
    here, the gradient flows through it as the paper's equation implies.

    Args:
        usage_prev: ``[B, N]`` usage u_{t-1} in [0, 1] (u_0 = 0).
        w_write_prev: ``[B, Hw, N]`` write weightings w^w_{t-1}.
        psi: ``[B, N]`` retention psi_t (`retention`).

    Returns:
        ``[B, N]`` usage u_t, in [0, 1] when the inputs are in their ranges.
    """
    written = 1.0 - product(1.0 - w_write_prev, dim=1)  # (B, N)
    return (usage_prev + written - usage_prev * written) * psi


def allocation(usage: Tensor) -> Tensor:
    """Allocation weighting, eq. (1): ``a[phi_j] = (1 - u[phi_j]) prod_{i<j} u[phi_i]``.

    ``phi`` is the free list: the rows sorted by ascending usage (ties by row index, a stable
    sort, so the same on every run and device). As in the paper, the gradient ignores the sort
    order's discontinuities: it flows through the usage values at their sorted places, the order
    itself is a constant. All usages 1 give ``a = 0``: nothing can be allocated.

    Args:
        usage: ``[B, N]`` usage u_t in [0, 1].

    Returns:
        ``[B, N]`` allocation weighting a_t, non-negative, summing to at most one.
    """
    order = stable_order(usage.detach())  # (B, N): phi, least used first (ties: row order)
    sorted_usage = usage.gather(-1, order)
    before = exclusive_cumprod(sorted_usage)  # prod_{i<j} u[phi_i], 1 for j = 1
    return torch.zeros_like(usage).scatter(-1, order, (1.0 - sorted_usage) * before)


def exclusive_cumprod(x: Tensor) -> Tensor:
    """The exclusive cumulative product over the last dimension, ``out[..., j] = prod_{i<j}
    x[..., i]`` (1 for j = 0): `torch.cumprod`'s values, with a backward that never asks the
    host anything. torch's backward of ``cumprod`` checks on the host whether an entry is
    zero, which a CUDA graph cannot capture (`torch_ntm.engines.graphs`); this one is exact
    through zeros too (`_ExclusiveCumprod`).

    Args:
        x: ``[..., N]``, N >= 1.

    Returns:
        ``[..., N]``.
    """
    shifted = torch.cat([torch.ones_like(x[..., :1]), x[..., :-1]], -1)
    if torch.compiler.is_exporting():  # torch.export (ONNX too) traces plain multiplications
        return _multiplied_scan(shifted)
    if torch.compiler.is_compiling():  # torch.compile traces torch's own
        return torch.cumprod(shifted, -1)
    return _ExclusiveCumprod.apply(x)


def _multiplied_scan(x: Tensor) -> Tensor:
    """The cumulative product over the last dimension as ``ceil(log2 N)`` multiplications of
    shifted copies (Hillis and Steele): `torch.cumprod`'s values up to rounding, in ops every
    exporter has (ONNX's decomposition of cumprod goes through a product without a
    derivative)."""
    span = 1
    while span < x.shape[-1]:
        x = torch.cat([x[..., :span], x[..., span:] * x[..., :-span]], -1)
        span *= 2
    return x


def _affine_scan(a: Tensor, b: Tensor) -> Tensor:
    """``s`` with ``s[..., 0] = a[..., 0]`` and ``s[..., m] = a[..., m] + b[..., m] s[..., m-1]``
    over the last dimension, as a scan of ``ceil(log2 N)`` steps of multiplications and
    additions (Hillis and Steele), each composing every affine map with the one ``span``
    entries before it."""
    n, span = a.shape[-1], 1
    while span < n:
        a = torch.cat([a[..., :span], a[..., span:] + b[..., span:] * a[..., :-span]], -1)
        b = torch.cat([b[..., :span], b[..., span:] * b[..., :-span]], -1)
        span *= 2
    return a


class _ExclusiveCumprod(torch.autograd.Function):
    """``y_j = prod_{i<j} x_i`` with the gradient ``dL/dx_i = y_i S_i``, where
    ``S_i = sum_{j>i} g_j prod_{i<k<j} x_k`` obeys ``S_i = g_{i+1} + x_{i+1} S_{i+1}``
    (``S_{N-1} = 0``): a linear recurrence, run as a scan backwards over the row
    (`_affine_scan`). No division, so zeros need no branch; the backward is made of
    differentiable ops, so a second derivative goes through it; `torch.func` transforms
    (``vmap`` included) see it as plain ops."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return torch.cumprod(torch.cat([torch.ones_like(x[..., :1]), x[..., :-1]], -1), -1)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: Tensor) -> None:
        ctx.save_for_backward(inputs[0], output)
        ctx.save_for_forward(inputs[0], output)

    @staticmethod
    def jvp(ctx, dx: Tensor) -> Tensor:
        # dy_{j+1} = x_j dy_j + y_j dx_j, dy_0 = 0: the same recurrence, forwards
        x, y = ctx.saved_tensors
        zero = torch.zeros_like(dx[..., :1])
        return _affine_scan(torch.cat([zero, (y * dx)[..., :-1]], -1),
                            torch.cat([zero, x[..., :-1]], -1))

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        x, y = ctx.saved_tensors
        zero = torch.zeros_like(g[..., :1])
        # reversed, S'_m = S_{N-1-m} = a_m + b_m S'_{m-1}, a_m = g_{N-m}, b_m = x_{N-m}, S'_0 = 0
        a = torch.cat([zero, g[..., 1:].flip(-1)], -1)
        b = torch.cat([zero, x[..., 1:].flip(-1)], -1)
        return y * _affine_scan(a, b).flip(-1)


def write_allocations(usage: Tensor, gates: Tensor) -> Tensor:
    """The allocation weightings of Hw write heads, one head after another.

    Head h allocates (`allocation`) from the usage after heads 1..h-1 have written to their
    allocations: ``u <- u + (1 - u) g_h a_h``, with ``g_h = g^a_h g^w_h`` the share of head h's
    write that goes to its allocation, so two heads do not allocate the same free row (DeepMind's
    reference). For one head this is `allocation`.

    Args:
        usage: ``[B, N]`` usage u_t (`usage`).
        gates: ``[B, Hw]`` allocation gate times write gate of each write head, in [0, 1].

    Returns:
        ``[B, Hw, N]`` allocation weightings a_t.
    """
    weights = []
    for h in range(gates.shape[1]):
        a = allocation(usage)
        weights.append(a)
        usage = usage + (1.0 - usage) * gates[:, h : h + 1] * a
    return torch.stack(weights, dim=1)


def write_weights(alloc: Tensor, content: Tensor, allocation_gate: Tensor,
                  write_gate: Tensor) -> Tensor:
    """Write weighting, eq. (2): ``w^w_t = g^w_t [g^a_t a_t + (1 - g^a_t) c^w_t]``.

    Args:
        alloc: ``[B, Hw, N]`` allocation weightings a_t (`write_allocations`).
        content: ``[B, Hw, N]`` write content weightings c^w_t = C(M_{t-1}, k^w_t, beta^w_t).
        allocation_gate: ``[B, Hw, 1]`` g^a_t in [0, 1].
        write_gate: ``[B, Hw, 1]`` g^w_t in [0, 1]; 0 writes nothing.

    Returns:
        ``[B, Hw, N]`` write weightings w^w_t, non-negative, summing to at most one.
    """
    return write_gate * (allocation_gate * alloc + (1.0 - allocation_gate) * content)


def precedence(p_prev: Tensor, w_write: Tensor) -> Tensor:
    """Precedence weighting ``p_t = (1 - sum_i w^w_t[i]) p_{t-1} + w^w_t`` (p_0 = 0), per head.

    Args:
        p_prev: ``[B, Hw, N]`` precedence p_{t-1}.
        w_write: ``[B, Hw, N]`` write weightings w^w_t.

    Returns:
        ``[B, Hw, N]`` p_t: how much each row was the last one each write head wrote to.
    """
    return (1.0 - w_write.sum(-1, keepdim=True)) * p_prev + w_write


def link(link_prev: Tensor, w_write: Tensor, p_prev: Tensor) -> Tensor:
    """Temporal link matrix, per write head, ``L_t[i, i] = 0`` and for i != j
    ``L_t[i, j] = (1 - w^w_t[i] - w^w_t[j]) L_{t-1}[i, j] + w^w_t[i] p_{t-1}[j]``.

    ``L_t[i, j]`` is how much row i was written right after row j (L_0 = 0). Each row and column
    is a weighting when w^w_t and p_{t-1} are.

    Args:
        link_prev: ``[B, Hw, N, N]`` link matrices L_{t-1}.
        w_write: ``[B, Hw, N]`` write weightings w^w_t.
        p_prev: ``[B, Hw, N]`` precedence p_{t-1} (before this step's `precedence`).

    Returns:
        ``[B, Hw, N, N]`` L_t, with a zero diagonal.
    """
    n = w_write.shape[-1]
    w_i, w_j = w_write.unsqueeze(-1), w_write.unsqueeze(-2)  # (B, Hw, N, 1), (B, Hw, 1, N)
    new = (1.0 - w_i - w_j) * link_prev + w_i * p_prev.unsqueeze(-2)
    # no self-links: it is unclear how to follow a transition from a row to itself
    off_diagonal = 1.0 - torch.eye(n, dtype=new.dtype, device=new.device)
    return new * off_diagonal


def _largest(w: Tensor, k: int) -> Tensor:
    """The indices ``[..., min(k, N)]`` of the k largest entries of ``w`` ``[..., N]``, largest
    first (ties: the lower row)."""
    return torch.argsort(w.detach(), dim=-1, descending=True, stable=True)[..., :k]


def _keep_largest(w: Tensor, k: int) -> Tensor:
    """``w`` ``[..., N]`` with all but its k largest entries (ties: the lower row) set to 0."""
    if k >= w.shape[-1]:
        return w
    return w * torch.zeros_like(w).scatter(-1, _largest(w, k), 1.0)


def _check_k(function: str, k: object) -> None:
    """A clear error unless ``k``, the sparse link's K, is an integer >= 1."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{function} keeps k >= 1 entries, got k={k!r}")


def sparse_link(link_prev: Tensor, w_write: Tensor, p_prev: Tensor, k: int) -> Tensor:
    """The sparse approximation of `link` (Methods, "Sparse link matrix"), with K = ``k``.

    The write weighting and the precedence keep only their K largest entries (the others set to
    0), the link update of `link` runs with them, and then every entry of L_t below 1/K is set to
    0, which leaves at most K non-zero entries in each row and column (each sums to at most 1).

    Two choices where the paper is not this code:
      * The paper also rescales the K kept entries of each vector to sum to 1. Here they keep
        their values: a write gate of 0.01 stays a weak write in the link matrix, as in the dense
        update, instead of becoming a full one, and a zero write weighting stays finite.
      * The threshold of 1/K applies only for K < N, so that ``k >= N`` is exactly `link` (with
        nothing dropped there is nothing to bound).

    The matrices are stored dense here, ``[B, Hw, N, N]``: this is the sparse update's function;
    `sparse_link_update` computes the same with O(N K) memory and time.

    Args:
        link_prev: ``[B, Hw, N, N]`` L_{t-1}.
        w_write: ``[B, Hw, N]`` write weightings w^w_t.
        p_prev: ``[B, Hw, N]`` precedence p_{t-1}.
        k: K >= 1, the entries kept (the paper: K = 8 suffices whatever N).

    Returns:
        ``[B, Hw, N, N]`` L^_t, zero diagonal, at most K non-zero entries per row and column.
    """
    _check_k("sparse_link", k)
    n = w_write.shape[-1]
    new = link(link_prev, _keep_largest(w_write, k), _keep_largest(p_prev, k))
    if k >= n:
        return new
    return new * (new.detach() >= 1.0 / k)


class SparseLink(NamedTuple):
    """Link matrices with at most S non-zero entries per row, stored row by row: row i of write
    head h holds ``values[b, h, i, s]`` at column ``columns[b, h, i, s]`` for each slot s (a slot
    of value 0 is empty). O(N S) memory where the dense matrix takes O(N^2)."""

    values: Tensor  # (B, Hw, N, S)
    columns: Tensor  # (B, Hw, N, S), int64


def empty_sparse_link(batch: int, heads: int, n: int, k: int, dtype: torch.dtype | None = None,
                      device: torch.device | str | None = None) -> SparseLink:
    """L_0 = 0 as a `SparseLink` of ``S = min(k, N)`` slots per row.

    Args:
        batch: B.
        heads: Hw.
        n: N.
        k: K >= 1, the paper's K.
        dtype: of the values.
        device: of the values and columns.

    Returns:
        `SparseLink` of zeros, ``[B, Hw, N, S]``.
    """
    _check_k("empty_sparse_link", k)
    slots = min(k, n)
    return SparseLink(torch.zeros(batch, heads, n, slots, dtype=dtype, device=device),
                      torch.zeros(batch, heads, n, slots, dtype=torch.int64, device=device))


def sparse_link_dense(link: SparseLink, n: int) -> Tensor:
    """The ``[B, Hw, N, N]`` matrices that ``link`` stores (differentiable in its values)."""
    dense = link.values.new_zeros(*link.values.shape[:-1], n)
    return dense.scatter_add(-1, link.columns, link.values)


def sparse_link_from_dense(link: Tensor, k: int) -> SparseLink:
    """Dense link matrices ``[B, Hw, N, N]`` as a `SparseLink` of ``S = min(k, N)`` slots: each
    row's S largest entries (`torch.topk`: O(N^2) for all rows). Exact, so that
    `sparse_link_dense` gives ``link`` back, for every matrix with at most S non-zero entries a
    row, which includes all that `sparse_link` and `sparse_link_update` make; differentiable in
    the kept entries.

    Args:
        link: ``[B, Hw, N, N]``.
        k: K >= 1.

    Returns:
        `SparseLink` ``[B, Hw, N, S]``.
    """
    _check_k("sparse_link_from_dense", k)
    columns = link.detach().topk(min(k, link.shape[-1]), dim=-1).indices
    return SparseLink(link.gather(-1, columns), columns)


def sparse_link_update(link: SparseLink, w_write: Tensor, p_prev: Tensor, k: int) -> SparseLink:
    """`sparse_link` on matrices stored as `SparseLink`: the same function in O(N K) memory and
    O(N log N + N K) time per step (the paper's costs), without forming an N x N matrix.

    Every stored entry decays by ``1 - w^[i] - w^[j]``; only the K rows where w^ is non-zero gain
    new links ``w^[i] p^[j]``, so only those K rows are rebuilt (densely, K x N); then entries
    below 1/K are dropped (for K < N), which leaves at most K per row.

    Args:
        link: `SparseLink` L^_{t-1}, ``S = min(k, N)`` slots per row (`empty_sparse_link`).
        w_write: ``[B, Hw, N]`` write weightings w^w_t.
        p_prev: ``[B, Hw, N]`` precedence p_{t-1}.
        k: K >= 1.

    Returns:
        `SparseLink` L^_t, equal (as `sparse_link_dense`) to ``sparse_link`` of the dense L^_{t-1}.
    """
    _check_k("sparse_link_update", k)
    n, slots = w_write.shape[-1], link.values.shape[-1]
    if slots != min(k, n):
        raise ValueError(f"a SparseLink for k={k} and N={n} has {min(k, n)} slots per row, "
                         f"got {slots}")
    rows = _largest(w_write, k)  # (B, Hw, m): the rows of w^, m = min(k, N)
    w_hat, p_hat = _keep_largest(w_write, k), _keep_largest(p_prev, k)
    columns = link.columns
    w_at_columns = w_hat.gather(-1, columns.flatten(-2)).view_as(link.values)  # w^[j]
    values = (1.0 - w_hat.unsqueeze(-1) - w_at_columns) * link.values
    # the rows that gain links, rebuilt densely: decayed entries + w^[i] p^[j], no self-link
    at_rows = rows.unsqueeze(-1).expand(*rows.shape, slots)  # (B, Hw, m, S)
    dense = values.new_zeros(*rows.shape, n).scatter_add(
        -1, columns.gather(-2, at_rows), values.gather(-2, at_rows))  # (B, Hw, m, N)
    dense = dense + w_hat.gather(-1, rows).unsqueeze(-1) * p_hat.unsqueeze(-2)
    dense = dense * torch.ones_like(dense).scatter(-1, rows.unsqueeze(-1), 0.0)
    if k < n:
        dense = dense * (dense.detach() >= 1.0 / k)
    kept = _largest(dense, slots)  # (B, Hw, m, S)
    values = values.scatter(-2, at_rows, dense.gather(-1, kept))
    columns = columns.scatter(-2, at_rows, kept)
    if k < n:
        values = values * (values.detach() >= 1.0 / k)
    return SparseLink(values, columns)


def sparse_directional_weights(link: SparseLink, w_read_prev: Tensor) -> tuple[Tensor, Tensor]:
    """`directional_weights` of a `SparseLink`, in O(R Hw N S) time and memory.

    Args:
        link: `SparseLink` L^_t, ``[B, Hw, N, S]``.
        w_read_prev: ``[B, R, N]`` read weightings w^r_{t-1}.

    Returns:
        ``(forward, backward)``, each ``[B, R, Hw, N]``, as `directional_weights` of the dense
        matrices.
    """
    b, hw, n, slots = link.values.shape
    r = w_read_prev.shape[1]
    flat = link.columns.flatten(-2).unsqueeze(1).expand(b, r, hw, n * slots)
    w = w_read_prev.unsqueeze(2).expand(b, r, hw, n)  # (B, R, Hw, N)
    values = link.values.unsqueeze(1)  # (B, 1, Hw, N, S)
    # forward[i] = sum_j L[i, j] w[j]: each stored entry times w at its column
    forward = (values * w.gather(-1, flat).view(b, r, hw, n, slots)).sum(-1)
    # backward[j] = sum_i L[i, j] w[i]: each stored entry times w at its row, added at its column
    backward = w.new_zeros(b, r, hw, n).scatter_add(
        -1, flat, (values * w.unsqueeze(-1)).flatten(-2))
    return forward, backward


def directional_weights(link: Tensor, w_read_prev: Tensor) -> tuple[Tensor, Tensor]:
    """Forward ``f_t = L_t w^r_{t-1}`` and backward ``b_t = L_t^T w^r_{t-1}`` weightings.

    Every read head follows every write head's link matrix.

    Args:
        link: ``[B, Hw, N, N]`` link matrices L_t.
        w_read_prev: ``[B, R, N]`` read weightings w^r_{t-1}.

    Returns:
        ``(forward, backward)``, each ``[B, R, Hw, N]``: ``forward[b, i, h]`` is read head i's
        weighting one write of head h later than where it read, ``backward`` one earlier.
    """
    w = w_read_prev.unsqueeze(1)  # (B, 1, R, N)
    # (w L^T)[r, i] = sum_j L[i, j] w[r, j] = (L w)[i]
    forward = torch.matmul(w, link.transpose(-1, -2)).transpose(1, 2)  # (B, R, Hw, N)
    backward = torch.matmul(w, link).transpose(1, 2)
    return forward, backward


def read_mode_width(write_heads: int) -> int:
    """Entries of one read head's read mode pi: ``2 Hw + 1`` (3 for the paper's one write head)."""
    return 2 * write_heads + 1


def read_weights(content: Tensor, forward: Tensor, backward: Tensor, modes: Tensor) -> Tensor:
    """Read weighting ``w^r_t = pi[1] b_t + pi[2] c^r_t + pi[3] f_t``, per read head.

    The read mode pi of a read head (a softmax) is laid out as the paper's (backward, content,
    forward), with one backward and one forward entry per write head:
    ``pi = (b_1 .. b_Hw, c, f_1 .. f_Hw)``, `read_mode_width` entries. (DeepMind's reference
    orders them (b_1 .. b_Hw, f_1 .. f_Hw, c): the same function of differently ordered logits.)

    Args:
        content: ``[B, R, N]`` read content weightings c^r_t = C(M_t, k^r_t, beta^r_t).
        forward: ``[B, R, Hw, N]`` forward weightings f_t (`directional_weights`).
        backward: ``[B, R, Hw, N]`` backward weightings b_t.
        modes: ``[B, R, 2 Hw + 1]`` read modes pi_t, non-negative, summing to one.

    Returns:
        ``[B, R, N]`` read weightings w^r_t.
    """
    hw = forward.shape[2]
    if modes.shape[-1] != read_mode_width(hw):
        raise ValueError(f"read modes for {hw} write head(s) have {read_mode_width(hw)} entries, "
                         f"got {modes.shape[-1]}")
    back, cont, fwd = modes[..., :hw], modes[..., hw : hw + 1], modes[..., hw + 1 :]
    return (cont * content + torch.matmul(back.unsqueeze(-2), backward).squeeze(-2)
            + torch.matmul(fwd.unsqueeze(-2), forward).squeeze(-2))
