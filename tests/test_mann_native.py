"""What is particular to the MANN's native engine (`torch_ntm.engines.mann`, csrc/mann.cpp; what
every model's native engine shares, the equivalence with the eager loop among it, is
test_native_models.py): more heads than its register-blocked kernels take, usages that tie and the
least-used rows chosen by index, and a paper-sized memory, as the eager loop computes them."""

from __future__ import annotations

import pytest
import torch
from test_native_models import (
    IN,
    MANN_SPEC,
    TOL,
    assert_states_close,
    by_usage,
    rand,
    run,
)

from torch_ntm.engines import library

pytestmark = pytest.mark.skipif(
    not (library.available("mann", torch.float32) and library.available("mann",
                                                                            torch.float64)),
    reason=f"native library not built: {library.error('mann', torch.float64)}")

build = MANN_SPEC.build


def test_more_heads_than_the_register_blocked_kernels():
    """Five heads take the kernels' general path (the state compared `by_usage`)."""
    mann = build(6, read_heads=5, memory_size=20, learned_beta=True)
    x = rand(6, 3, IN, seed=16)
    (y, state, grads), (y_e, state_e, grads_e) = run(mann, "native", x), run(mann, "eager", x)
    torch.testing.assert_close(y, y_e, **TOL)
    for g, g_e in zip(grads, grads_e):
        torch.testing.assert_close(g, g_e, **TOL)
    assert_states_close(by_usage(state), by_usage(state_e), **TOL)


def test_least_used_ties_and_the_zeroed_row():
    """Usages with ties, and a NaN-free exact rule: the H rows of a stable sort (lower rows
    first among equal usages), the zeroed row the first minimum."""
    mann = build(7, read_heads=3, memory_size=9)
    state = mann.initial_state(4)
    usage = torch.tensor([[0.5, 0.1, 0.1, 0.3, 0.1, 0.2, 0.1, 0.9, 0.0],
                          [0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2],
                          [0.3, 0.3, 0.1, 0.4, 0.1, 0.3, 0.5, 0.0, 0.0],
                          [0.0] * 9], dtype=torch.float64)
    state = state._replace(usage=usage, memory=rand(4, 9, 5, seed=8))
    x = rand(3, 4, IN, seed=9)
    mann.engine = "eager"
    y_e, s_e = mann(x[:1], state)
    mann.engine = "native"
    y, s = mann(x[:1], state)
    torch.testing.assert_close(y, y_e, **TOL)
    assert_states_close(s.detach(), s_e.detach(), **TOL)
    # the rows written: the least-used ones passed in (all rows of the read weightings, which
    # are zero); the zeroed row: the first minimum, which keeps none of its old value
    for b, row in enumerate([8, 0, 7, 0]):
        kept = state.memory[b, row] * 0  # zeroed, then written
        written = s.memory[b, row] - kept
        torch.testing.assert_close(written, s_e.memory[b, row].detach(), **TOL)
    with torch.no_grad():  # and over more steps, the least-used rows as the eager loop's
        mann.engine = "eager"
        _, s_e = mann(x, state)
        mann.engine = "native"
        _, s = mann(x, state)
    assert torch.equal(s.least_used, s_e.least_used)


def test_paper_sized_memory():
    """128 x 40 memory, 4 heads, 50 units: outputs and gradients of every parameter (the state
    compared `by_usage`)."""
    mann = build(13, controller_size=50, memory_size=128, memory_width=40, read_heads=4)
    x = rand(12, 4, IN, seed=25)
    (y, state, grads), (y_e, state_e, grads_e) = run(mann, "native", x), run(mann, "eager", x)
    torch.testing.assert_close(y, y_e, **TOL)
    for g, g_e in zip(grads, grads_e):
        torch.testing.assert_close(g, g_e, **TOL)
    assert_states_close(by_usage(state), by_usage(state_e), **TOL)
