"""torch.export of NTM with a dynamic sequence length (and batch size): the exported program is
the eager function at lengths and batch sizes it was not traced at."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim
from torch.utils._pytree import tree_map

from torch_ntm import NTM


def _check_agrees(program, model, x, *state):
    logits, after = program.module()(x, *state)
    expected, expected_after = model(x, *state)
    assert logits.shape == expected.shape
    torch.testing.assert_close(logits, expected, rtol=1e-10, atol=1e-10)
    for got, want in zip(after[1:], expected_after[1:]):  # memory, weightings, reads
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for got, want in zip(after[0], expected_after[0]):  # controller (h, c)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.slow
def test_exported_ntm_is_the_eager_function_at_new_lengths_and_batch_sizes():
    # A dynamic batch after other exports in this process (the DNC's, at a fixed batch): torch
    # carries a guard on an earlier program's batch size over, so reset first (docs/guide.md).
    torch.compiler.reset()
    torch.manual_seed(0)
    model = NTM(9, 8, memory_size=16, controller_layers=2, read_heads=2, write_heads=2,
                shift_range=2, dtype=torch.float64).eval()
    traced = torch.rand(5, 2, 9, dtype=torch.float64)
    program = torch.export.export(model, (traced,),
                                  dynamic_shapes={"x": {0: Dim("T"), 1: Dim("B")}})
    for steps, batch in ((13, 3), (2, 1), (30, 4)):
        _check_agrees(program, model, torch.rand(steps, batch, 9, dtype=torch.float64))


@pytest.mark.slow
def test_exported_batch_first_ntm_takes_a_state_and_carries_it_on():
    torch.manual_seed(1)
    model = NTM(9, 8, memory_size=16, controller="feedforward", batch_first=True,
                dtype=torch.float64).eval()
    x = torch.rand(2, 6, 9, dtype=torch.float64)
    _, state = model(x)
    program = torch.export.export(model, (x, state), dynamic_shapes={
        "x": {1: Dim("T")}, "state": tree_map(lambda _: None, state)})
    for steps in (11, 3):
        _check_agrees(program, model, torch.rand(2, steps, 9, dtype=torch.float64), state)


@pytest.mark.slow
def test_a_program_exported_with_a_state_takes_one_of_another_batch_size():
    """What the README says to pass for a state at batch sizes other than the traced one: the
    batch dimension named in an `NTMState` of dynamic shapes (dim 1 of the LSTM's h and c)."""
    from torch_ntm import NTMState

    # Alone it passes; after the exports above (batch 2 traced, in the same process) torch
    # carried a guard "B != 2" into this one and refused the dynamic batch.
    torch.compiler.reset()
    torch.manual_seed(2)
    model = NTM(9, 8, memory_size=16, dtype=torch.float64).eval()
    x = torch.rand(5, 3, 9, dtype=torch.float64)
    _, state = model(x)
    batch = Dim("B")
    shapes = NTMState(({1: batch}, {1: batch}), {0: batch}, {0: batch}, {0: batch}, {0: batch})
    program = torch.export.export(model, (x, state),
                                  dynamic_shapes={"x": {0: Dim("T"), 1: batch}, "state": shapes})
    _, other = model(torch.rand(2, 4, 9, dtype=torch.float64))
    _check_agrees(program, model, torch.rand(7, 4, 9, dtype=torch.float64), other)


def test_torch_jit_trace_is_refused_with_the_way_to_export():
    """It failed with "batch_size must be an integer >= 1, got tensor(4)", a batch size the
    user never gave."""
    with pytest.raises(RuntimeError, match=r"torch.jit.trace .* use torch.export.export"):
        torch.jit.trace(NTM(4, 3), (torch.rand(5, 2, 4),))


@pytest.mark.slow
def test_exported_mann_is_the_eager_function_at_new_lengths():
    from torch_ntm import MANN

    torch.manual_seed(2)
    model = MANN(7, 5, controller_size=12, memory_size=10, memory_width=6, read_heads=2,
                 learned_beta=True, dtype=torch.float64).eval()
    program = torch.export.export(model, (torch.rand(6, 3, 7, dtype=torch.float64),),
                                  dynamic_shapes={"x": {0: Dim("T")}})
    for steps in (11, 2):
        _check_agrees(program, model, torch.rand(steps, 3, 7, dtype=torch.float64))
