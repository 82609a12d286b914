"""Tests of torch_ntm.metrics against hand-computed values."""

import math

import pytest
import torch

from torch_ntm.metrics import bit_errors, cost_bits, masked_bce


def _random_case(T=5, B=3, C=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, B, C, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(0, 2, (T, B, C), generator=g).double()
    mask = torch.rand(T, B, generator=g) < 0.6
    return logits, targets, mask


def test_zero_logits_cost_one_bit_per_scored_bit():
    T, B, C = 4, 3, 5
    targets = torch.randint(0, 2, (T, B, C), generator=torch.Generator().manual_seed(1)).float()
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]], dtype=torch.bool)
    logits = torch.zeros(T, B, C)
    scored_bits = torch.tensor([3.0, 3.0, 0.0]) * C
    torch.testing.assert_close(masked_bce(logits, targets, mask), scored_bits * math.log(2))
    torch.testing.assert_close(cost_bits(logits, targets, mask), scored_bits)


def test_hand_computed_values():
    # one sequence, two steps, two channels; step 1 is masked out
    logits = torch.tensor([[[2.0, -1.0]], [[5.0, 5.0]]])
    targets = torch.tensor([[[1.0, 0.0]], [[0.0, 0.0]]])
    mask = torch.tensor([[True], [False]])
    sig = lambda x: 1.0 / (1.0 + math.exp(-x))  # noqa: E731
    nats = -math.log(sig(2.0)) - math.log(1.0 - sig(-1.0))  # 0.126928 + 0.313262
    assert masked_bce(logits, targets, mask).item() == pytest.approx(nats, rel=1e-6)
    assert masked_bce(logits, targets, mask).item() == pytest.approx(0.4401897, rel=1e-6)
    assert cost_bits(logits, targets, mask).item() == pytest.approx(nats / math.log(2), rel=1e-6)
    assert bit_errors(logits, targets, mask).item() == 0.0
    assert bit_errors(logits, targets, mask.logical_not()).item() == 2.0


def test_matches_numpy_style_oracle():
    logits, targets, mask = _random_case()
    T, B, C = logits.shape
    expected = torch.zeros(B, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            if mask[t, b]:
                for c in range(C):
                    p = 1.0 / (1.0 + math.exp(-logits[t, b, c].item()))
                    y = targets[t, b, c].item()
                    expected[b] -= y * math.log(p) + (1 - y) * math.log(1 - p)
    torch.testing.assert_close(masked_bce(logits, targets, mask), expected)
    torch.testing.assert_close(cost_bits(logits, targets, mask), expected / math.log(2))


def test_masked_steps_are_excluded_even_if_inf_or_nan():
    logits, targets, mask = _random_case()
    reference = masked_bce(logits, targets, mask)
    spoiled = logits.clone().masked_fill(~mask.unsqueeze(-1), float("nan"))
    spoiled[~mask] = float("inf")
    spoiled.requires_grad_(True)
    loss = masked_bce(spoiled, targets, mask)
    torch.testing.assert_close(loss, reference)
    loss.sum().backward()
    assert torch.isfinite(spoiled.grad).all()
    assert (spoiled.grad[~mask] == 0).all()


def test_gradient_is_sigmoid_minus_target_on_masked_steps():
    logits, targets, mask = _random_case(seed=3)
    logits.requires_grad_(True)
    masked_bce(logits, targets, mask).sum().backward()
    expected = (torch.sigmoid(logits.detach()) - targets) * mask.unsqueeze(-1)
    torch.testing.assert_close(logits.grad, expected)


def test_stable_for_large_logits():
    logits = torch.tensor([[[100.0, -100.0]]])
    targets = torch.tensor([[[0.0, 1.0]]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    assert masked_bce(logits, targets, mask).item() == pytest.approx(200.0, rel=1e-6)


def test_bit_errors_threshold_at_zero_logit():
    logits = torch.tensor([[[0.0, 1e-3, -1e-3, 7.0, -7.0]]])  # predicts 0, 1, 0, 1, 0
    mask = torch.ones(1, 1, dtype=torch.bool)
    assert bit_errors(logits, torch.tensor([[[0.0, 1.0, 0.0, 1.0, 0.0]]]), mask).item() == 0.0
    assert bit_errors(logits, torch.tensor([[[1.0, 0.0, 1.0, 0.0, 1.0]]]), mask).item() == 5.0
    assert bit_errors(logits, torch.tensor([[[1.0, 1.0, 0.0, 1.0, 0.0]]]), mask).item() == 1.0


def test_bit_errors_counts_per_sequence_over_masked_steps():
    logits, targets, mask = _random_case(T=6, B=4, C=3, seed=5)
    errors = bit_errors(logits, targets, mask)
    assert errors.dtype == logits.dtype
    for b in range(4):
        wrong = sum(
            int((logits[t, b, c] > 0).item() != bool(targets[t, b, c] > 0.5))
            for t in range(6)
            if mask[t, b]
            for c in range(3)
        )
        assert errors[b].item() == wrong


@pytest.mark.parametrize("fn", [masked_bce, cost_bits, bit_errors])
def test_batch_first_equals_time_major(fn):
    logits, targets, mask = _random_case(T=7, B=3, C=2, seed=7)
    expected = fn(logits, targets, mask)
    got = fn(logits.transpose(0, 1), targets.transpose(0, 1), mask.T, batch_first=True)
    torch.testing.assert_close(got, expected)
    assert got.shape == (3,)


def test_float_mask_is_treated_as_nonzero():
    # Values other than 0 and 1 (and a negative one) tell "nonzero scores the step" from "the
    # mask weighs the step", which a 0/1 mask cannot: as weights they would scale each step.
    logits, targets, mask = _random_case(seed=9)
    weights = torch.tensor([0.25, 3.0, -2.0]).repeat(mask.shape[0], 1)
    float_mask = mask.double() * weights
    assert (float_mask != 0).equal(mask) and float_mask.abs().ne(1).any()
    for fn in (masked_bce, cost_bits, bit_errors):
        torch.testing.assert_close(fn(logits, targets, float_mask), fn(logits, targets, mask))


@pytest.mark.parametrize("fn", [masked_bce, cost_bits, bit_errors])
def test_shape_errors_name_expected_and_actual(fn):
    logits = torch.zeros(5, 3, 4)
    with pytest.raises(ValueError, match=r"targets.*\[5, 3, 4\].*\[5, 3, 2\]"):
        fn(logits, torch.zeros(5, 3, 2), torch.ones(5, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask.*\[T, B\].*\[5, 3\].*\[3, 5\]"):
        fn(logits, torch.zeros(5, 3, 4), torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask.*\[B, T\].*\[5, 3\].*\[3, 5\]"):
        fn(logits, torch.zeros(5, 3, 4), torch.ones(3, 5, dtype=torch.bool), batch_first=True)
    with pytest.raises(ValueError, match=r"logits.*\[5, 3\]"):
        fn(torch.zeros(5, 3), torch.zeros(5, 3), torch.ones(5, 3, dtype=torch.bool))
