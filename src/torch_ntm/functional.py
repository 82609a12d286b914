"""Memory addressing and access of the Neural Turing Machine, as pure functions.

Graves, Wayne & Danihelka (2014), "Neural Turing Machines", section 3. Every function is batched
over B (batch) and H (heads of one kind) and holds no weights. Shapes use

    B batch, H heads, N memory rows, M row width, R shift range (shifts -R..+R, 2R+1 of them).

The addressing pipeline of one head (figure 2 of the paper) is

    w^c = content_weights(M, k, beta)          # eq. (5), (6)
    w^g = interpolate(w^c, w_prev, g)          # eq. (7)
    w~  = shift(w^g, s)                        # eq. (8)
    w   = sharpen(w~, gamma)                   # eq. (9)

and `address` runs the four steps in that order.

Least Recently Used Access (LRUA) of Santoro et al. (2016), "Meta-Learning with Memory-Augmented
Neural Networks", section 3.2 (used by `torch_ntm.mann`), one step:

    w^w_t  = lrua_write_weights(w^r_{t-1}, w^lu_{t-1}, alpha_t)
    M_t    = lrua_write(M_{t-1}, w^u_{t-1}, w^w_t, a_t)     # zero the least-used row, then add
    w^r_t  = content_weights(M_t, k_t, beta=1)              # cosine similarity, softmax
    w^u_t  = update_usage(w^u_{t-1}, w^r_t, w^w_t, gamma)
    w^lu_t = least_used(w^u_t, n)                           # n = number of read heads

with usage ``w^u`` ``[B, N]`` and the least-used weighting ``w^lu`` ``[B, N]`` shared by all heads.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "EPS",
    "SOFTPLUS_THRESHOLD",
    "softplus",
    "content_weights",
    "interpolate",
    "shift",
    "sharpen",
    "address",
    "read",
    "write",
    "product",
    "stable_order",
    "USAGE_DECAY",
    "update_usage",
    "least_used",
    "lrua_write_weights",
    "lrua_write",
]

# The one numerical-safety constant. Cosine similarity divides by the norms of the key and of each
# memory row; memory starts at 1e-6 (squared row norm ~2e-11) and keys can be exactly zero, where
# the norm's gradient is undefined. Adding EPS to each squared norm keeps value and gradient finite
# and makes an (almost) empty row or key score ~0 similarity, i.e. a uniform content weighting.
# Relative to O(1) keys and rows its effect (~EPS/2) is below float32 rounding.
EPS = 1e-8
# Above it softplus(x) is taken as x (torch's default, which the native kernels share: both
# constants are generated into their header).
SOFTPLUS_THRESHOLD = 20.0


def softplus(x: Tensor) -> Tensor:
    """``log(1 + exp(x))``, the activation of the key strengths and sharpenings (``x`` above
    `SOFTPLUS_THRESHOLD` as it is)."""
    return torch.nn.functional.softplus(x, threshold=SOFTPLUS_THRESHOLD)


def content_weights(memory: Tensor, key: Tensor, beta: Tensor) -> Tensor:
    """Content-based weighting w^c, eq. (5)-(6).

    ``w^c[b,h,i] = softmax_i(beta[b,h] * K(key[b,h], memory[b,i]))`` with cosine similarity
    ``K(u, v) = u.v / sqrt((|u|^2 + EPS) (|v|^2 + EPS))``.

    Args:
        memory: ``[B, N, M]`` memory matrix M_t.
        key: ``[B, H, M]`` key vectors k_t.
        beta: ``[B, H, 1]`` key strengths beta_t >= 0.

    Returns:
        ``[B, H, N]`` weightings, non-negative, summing to one over N.
    """
    dot = torch.matmul(key, memory.transpose(1, 2))  # (B, H, N)
    key_sq = key.pow(2).sum(-1, keepdim=True)  # (B, H, 1)
    mem_sq = memory.pow(2).sum(-1).unsqueeze(1)  # (B, 1, N)
    cosine = dot * torch.rsqrt(_plus_eps(key_sq) * _plus_eps(mem_sq))
    return torch.softmax(beta * cosine, dim=-1)


def _plus_eps(x: Tensor) -> Tensor:
    """``x + EPS``. Under `torch.export` the constant is a one-element tensor, not a scalar: the
    ONNX exporter's optimizer (onnxscript's ``x + 0 -> x`` rule, which matches scalars within an
    absolute tolerance of 1e-8) would otherwise drop the addition, and an empty row or key would
    divide zero by zero."""
    if torch.compiler.is_exporting():
        return x + x.new_full((1,), EPS)
    return x + EPS


def interpolate(w_content: Tensor, w_prev: Tensor, gate: Tensor) -> Tensor:
    """Interpolation with the previous weighting, eq. (7): ``g w^c + (1 - g) w_{t-1}``.

    Args:
        w_content: ``[B, H, N]`` content weighting w^c_t.
        w_prev: ``[B, H, N]`` previous weighting w_{t-1}.
        gate: ``[B, H, 1]`` interpolation gate g_t in [0, 1].

    Returns:
        ``[B, H, N]`` gated weighting w^g_t.
    """
    return w_prev + gate * (w_content - w_prev)


def shift(w: Tensor, s: Tensor) -> Tensor:
    """Circular convolution with the shift weighting, eq. (8).

    ``out[i] = sum_k s[k] * w[(i - (k - R)) mod N]``: ``s[..., k]`` is the weight of a shift by
    ``k - R`` (ordered -R..+R), and a shift by +1 moves weight from row j to row j+1.

    Args:
        w: ``[B, H, N]`` weighting w^g_t.
        s: ``[B, H, 2R+1]`` shift weighting s_t (a distribution over -R..+R), with 2R+1 <= N.

    Returns:
        ``[B, H, N]`` shifted weighting w~_t.
    """
    n, width = w.shape[-1], s.shape[-1]
    r = (width - 1) // 2
    if width % 2 != 1 or width > n:
        raise ValueError(
            f"shift weighting must have odd width 2R+1 <= N={n}, got width {width}"
        )
    if r == 0:
        return w * s
    # Pad circularly by R on both sides; window i then holds w[i-R .. i+R], and the element at
    # window position p is w[i - R + p], i.e. the shift k - R = R - p, so s is applied reversed.
    padded = torch.cat([w[..., n - r :], w, w[..., :r]], dim=-1)  # (B, H, N + 2R)
    windows = padded.unfold(-1, width, 1)  # (B, H, N, 2R+1)
    return torch.matmul(windows, s.flip(-1).unsqueeze(-1)).squeeze(-1)


def sharpen(w: Tensor, gamma: Tensor) -> Tensor:
    """Sharpening, eq. (9): ``w^gamma / sum_j w_j^gamma``.

    The ratio is scale-invariant, so w is first divided by its (detached) maximum: the largest
    term is then exactly 1 and the sum cannot underflow for a large gamma. Exact zeros in w give a
    zero output and finite gradients for w and gamma: the derivative of ``x^gamma`` at ``x = 0`` is
    its one-sided value ``gamma * 0^(gamma-1)`` (0 for gamma > 1, 1 for gamma = 1, where sharpen is
    ``w / sum(w)``), and its derivative for gamma there is taken as 0 (the limit of x^g log x).

    Args:
        w: ``[B, H, N]`` shifted weighting w~_t, non-negative.
        gamma: ``[B, H, 1]`` sharpening exponent gamma_t >= 1.

    Returns:
        ``[B, H, N]`` sharpened weighting w_t.
    """
    scale = w.detach().amax(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
    u = w / scale
    positive = u > 0
    # pow's gradient for gamma is u^gamma * log(u), NaN at u = 0: route zeros through a safe base
    # for gamma, but keep u's own gradient there (gamma * 0^(gamma-1), which is 1 when gamma = 1).
    powered = torch.where(
        positive, torch.where(positive, u, 1.0).pow(gamma), u.pow(gamma.detach())
    )
    return powered / powered.sum(-1, keepdim=True)


def address(
    memory: Tensor,
    w_prev: Tensor,
    key: Tensor,
    beta: Tensor,
    gate: Tensor,
    s: Tensor,
    gamma: Tensor,
) -> Tensor:
    """The full addressing pipeline (figure 2): content, interpolation, shift, sharpening.

    Args:
        memory: ``[B, N, M]``; w_prev: ``[B, H, N]``; key: ``[B, H, M]``; beta, gate, gamma:
            ``[B, H, 1]``; s: ``[B, H, 2R+1]``.

    Returns:
        ``[B, H, N]`` weighting w_t.
    """
    w = content_weights(memory, key, beta)
    w = interpolate(w, w_prev, gate)
    w = shift(w, s)
    return sharpen(w, gamma)


def read(memory: Tensor, w: Tensor) -> Tensor:
    """Read vectors, eq. (2): ``r[b,h] = sum_i w[b,h,i] memory[b,i]``.

    Args:
        memory: ``[B, N, M]``; w: ``[B, H, N]`` read weightings.

    Returns:
        ``[B, H, M]`` read vectors r_t.
    """
    return torch.matmul(w, memory)


def write(memory: Tensor, w: Tensor, erase: Tensor, add: Tensor) -> Tensor:
    """Erase then add, eq. (3)-(4), for H write heads at once.

    All erasures apply before all adds, so the result does not depend on the order of the heads:
    ``M * prod_h(1 - w_h e_h^T) + sum_h w_h a_h^T``.

    Args:
        memory: ``[B, N, M]`` memory M_{t-1}.
        w: ``[B, H, N]`` write weightings.
        erase: ``[B, H, M]`` erase vectors e_t in [0, 1].
        add: ``[B, H, M]`` add vectors a_t.

    Returns:
        ``[B, N, M]`` memory M_t.
    """
    wt = w.transpose(1, 2)  # (B, N, H)
    if w.shape[1] == 1:
        keep = 1.0 - wt * erase  # (B, N, M): outer product w e^T
    else:
        keep = product(1.0 - wt.unsqueeze(-1) * erase.unsqueeze(1), dim=2)  # (B, N, M)
    return memory * keep + torch.matmul(wt, add)


def product(x: Tensor, dim: int) -> Tensor:
    """``torch.prod(x, dim)`` as a chain of multiplications over the (few) entries along
    ``dim``: the same values and gradients, also through exact zeros, without torch's backward
    of ``prod``, which asks the host whether an entry is zero and so cannot be captured in a CUDA
    graph (`torch_ntm.engines.graphs`). For products over heads, a handful of terms.

    Args:
        x: any tensor (no entry along ``dim``: ones, the empty product).
        dim: the dimension multiplied over (removed).
    """
    factors = x.unbind(dim)
    if not factors:
        return x.sum(dim) + 1.0
    result = factors[0]
    for factor in factors[1:]:
        result = result * factor
    return result


def stable_order(x: Tensor) -> Tensor:
    """The indices that sort ``x`` ascending along its last dimension, ties by index:
    ``torch.argsort(x, stable=True)``. Under `torch.export` (ONNX has no stable sort) the same
    order comes from each entry's rank, the entries below it plus the equal ones before it, by
    comparing every pair: O(N^2), so only there."""
    if not torch.compiler.is_exporting():
        return torch.argsort(x, dim=-1, stable=True)
    index = torch.arange(x.shape[-1], device=x.device)
    below = x.unsqueeze(-2) < x.unsqueeze(-1)  # [..., i, j]: x_j < x_i
    tied_before = (x.unsqueeze(-2) == x.unsqueeze(-1)) & (index < index.unsqueeze(-1))
    rank = (below | tied_before).sum(-1)  # [..., N], a permutation of 0..N-1
    return torch.zeros_like(rank).scatter(-1, rank, index.expand_as(rank))


# ------------------------------------------------------------------------------------------------
# Least Recently Used Access (Santoro et al. 2016, section 3.2)
# ------------------------------------------------------------------------------------------------

# The usage decay gamma of eq. (w^u_t = gamma w^u_{t-1} + w^r_t + w^w_t). 0.95 rather than 0.99: an
# access's usage halves in ~14 steps (0.95^14 = 0.49), against ~69 at 0.99. A 5-class Omniglot
# episode (10 samples per class) is 50 steps, so at 0.99 usage hardly decays within an episode and
# "least recently used" becomes "least used so far"; at 0.95 a row unread for a few dozen steps
# can be reclaimed within the episode.
USAGE_DECAY = 0.95


def update_usage(usage: Tensor, w_read: Tensor, w_write: Tensor,
                 gamma: float = USAGE_DECAY) -> Tensor:
    """Usage weights ``w^u_t = gamma w^u_{t-1} + sum_h w^r_t[h] + sum_h w^w_t[h]``.

    Args:
        usage: ``[B, N]`` previous usage w^u_{t-1}, non-negative.
        w_read: ``[B, Hr, N]`` read weightings w^r_t (this step's).
        w_write: ``[B, Hw, N]`` write weightings w^w_t (this step's).
        gamma: decay in [0, 1] (default `USAGE_DECAY`, 0.95).

    Returns:
        ``[B, N]`` usage w^u_t, non-negative when the inputs are.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"usage decay gamma must be in [0, 1], got {gamma!r}")
    return gamma * usage + w_read.sum(1) + w_write.sum(1)


def least_used(usage: Tensor, n: int) -> Tensor:
    """Least-used weighting ``w^lu_t(i) = 1 if w^u_t(i) <= m(w^u_t, n) else 0``.

    ``m(v, n)`` is the n-th smallest element of v. Exactly n entries are 1: among equal usages the
    lower row indices come first (a stable sort), so ties (e.g. the all-zero initial usage) give
    the same mask on every run and device. The mask is a step function of the usage, so it carries
    no gradient (the usage is detached).

    Args:
        usage: ``[B, N]`` usage w^u_t.
        n: how many rows to mark, 1 <= n <= N (the number of read heads in the paper).

    Returns:
        ``[B, N]`` float mask (usage's dtype) with exactly n ones per batch element.
    """
    size = usage.shape[-1]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= size:
        raise ValueError(f"least_used needs 1 <= n <= N={size} rows to mark, got n={n!r}")
    order = stable_order(usage.detach())[..., :n]  # (B, n)
    return torch.zeros_like(usage).scatter_(-1, order, 1.0)


def lrua_write_weights(w_read_prev: Tensor, w_lu_prev: Tensor, alpha: Tensor) -> Tensor:
    """LRUA write weighting ``w^w_t = sigmoid(alpha) w^r_{t-1} + (1 - sigmoid(alpha)) w^lu_{t-1}``.

    Write head h interpolates between read head h's previous weighting (update a row just read)
    and the least-used rows (write somewhere fresh). ``w^lu`` has n ones, so w^w sums to
    ``sigmoid(alpha) + n (1 - sigmoid(alpha))``, not to one, as in the paper.

    Args:
        w_read_prev: ``[B, H, N]`` read weightings w^r_{t-1}.
        w_lu_prev: ``[B, N]`` least-used weighting w^lu_{t-1} (`least_used`), shared by the heads.
        alpha: ``[B, H, 1]`` gate logits alpha_t (any real; sigmoid is applied here).

    Returns:
        ``[B, H, N]`` write weightings w^w_t, non-negative.
    """
    g = torch.sigmoid(alpha)  # (B, H, 1)
    return w_lu_prev.unsqueeze(1) + g * (w_read_prev - w_lu_prev.unsqueeze(1))


def lrua_write(memory: Tensor, usage_prev: Tensor, w_write: Tensor, add: Tensor) -> Tensor:
    """LRUA memory update: zero the least-used row, then ``M_t = M_{t-1} + sum_h w^w_h a_h^T``.

    The zeroed row is the single least-used row of w^u_{t-1}, ``argmin_i w^u_{t-1}(i)`` (the
    lowest index among ties, i.e. the first row `least_used` marks), one per batch element.

    Args:
        memory: ``[B, N, M]`` memory M_{t-1}.
        usage_prev: ``[B, N]`` usage w^u_{t-1}.
        w_write: ``[B, H, N]`` write weightings w^w_t.
        add: ``[B, H, M]`` vectors written, one per write head (the paper writes the key k_t).

    Returns:
        ``[B, N, M]`` memory M_t.
    """
    row = torch.argmin(usage_prev.detach(), dim=-1, keepdim=True)  # (B, 1), first minimum
    keep = torch.ones_like(usage_prev).scatter_(-1, row, 0.0)  # (B, N): 0 at the zeroed row
    return memory * keep.unsqueeze(-1) + torch.matmul(w_write.transpose(1, 2), add)
