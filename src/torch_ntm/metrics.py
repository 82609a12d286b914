"""The masked loss and the paper's evaluation metrics.

Every task gives ``(inputs, targets, mask)``; a model gives logits. The one loss used everywhere is

    loss = masked_bce(logits, targets, mask).mean()

i.e. binary cross-entropy summed over the output channels and the masked time steps of each
sequence (nats per sequence), averaged over the batch. The paper reports the same sum in bits
(`cost_bits`, "cost per sequence") and we also count wrong output bits (`bit_errors`).

Label tasks (Omniglot, ``Task.loss == "cross_entropy"``) are scored with `masked_cross_entropy`
(a softmax over each group of label units) and `label_errors` (wrong labels) instead; `objective`
picks the pair for a task, and the harness reports them under the same names: ``cost_bits`` is
then the cross-entropy in bits per sequence and ``bit_errors`` the wrong labels per sequence.

Shapes are time-major, logits/targets ``[T, B, C]`` and mask ``[T, B]``, or with
``batch_first=True`` logits/targets ``[B, T, C]`` and mask ``[B, T]``. Every function returns one
value per sequence, ``[B]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["masked_bce", "cost_bits", "bit_errors", "masked_cross_entropy", "label_errors",
           "Objective", "objective"]

_LN2 = math.log(2.0)


def _check(logits: Tensor, targets: Tensor, mask: Tensor, batch_first: bool) -> Tensor:
    """Validate shapes; return the mask as bool."""
    layout = "[B, T, C]" if batch_first else "[T, B, C]"
    if logits.dim() != 3:
        raise ValueError(f"logits must have shape {layout}, got {list(logits.shape)}")
    if targets.shape != logits.shape:
        raise ValueError(
            f"targets must have the shape of logits {list(logits.shape)}, got {list(targets.shape)}"
        )
    if mask.shape != logits.shape[:2]:
        mask_layout = "[B, T]" if batch_first else "[T, B]"
        raise ValueError(
            f"mask must have shape {mask_layout} = {list(logits.shape[:2])}, "
            f"got {list(mask.shape)}"
        )
    return mask if mask.dtype == torch.bool else mask != 0


def _per_sequence(per_step: Tensor, mask: Tensor, batch_first: bool) -> Tensor:
    """Sum a ``[T, B]`` (or ``[B, T]``) per-step value over the masked steps -> ``[B]``.

    ``masked_fill`` rather than multiplying by the mask, so that an inf or NaN at a padded step
    (where the model's output is meaningless) cannot leak into the sum or its gradient.
    """
    return per_step.masked_fill(~mask, 0.0).sum(dim=1 if batch_first else 0)


def masked_bce(
    logits: Tensor, targets: Tensor, mask: Tensor, *, batch_first: bool = False
) -> Tensor:
    """Binary cross-entropy with logits, in nats, summed over channels and masked steps.

    ``sum_{t: mask[t,b]} sum_c -(y log sigmoid(x) + (1 - y) log(1 - sigmoid(x)))`` computed with
    `F.binary_cross_entropy_with_logits` (stable for large ``|x|``).

    Args:
        logits: ``[T, B, C]`` model outputs before the sigmoid.
        targets: ``[T, B, C]`` in [0, 1] (binary for the tasks here).
        mask: ``[T, B]`` bool, true on the steps that are scored (non-bool: nonzero is true).
        batch_first: all three tensors have batch and time swapped.

    Returns:
        ``[B]`` loss per sequence, in nats.
    """
    mask = _check(logits, targets, mask, batch_first)
    per_bit = F.binary_cross_entropy_with_logits(
        logits, targets.to(logits.dtype), reduction="none"
    )  # (T, B, C)
    return _per_sequence(per_bit.sum(-1), mask, batch_first)


def cost_bits(
    logits: Tensor, targets: Tensor, mask: Tensor, *, batch_first: bool = False
) -> Tensor:
    """The paper's cost per sequence: `masked_bce` in bits (divided by ln 2).

    Args and shapes as in `masked_bce`.

    Returns:
        ``[B]`` cost per sequence, in bits.
    """
    return masked_bce(logits, targets, mask, batch_first=batch_first) / _LN2


def bit_errors(
    logits: Tensor, targets: Tensor, mask: Tensor, *, batch_first: bool = False
) -> Tensor:
    """Number of wrong output bits per sequence, thresholding the sigmoid at 1/2.

    A bit is predicted 1 where ``logits > 0`` (sigmoid > 1/2) and 0 otherwise (a logit of exactly
    0 predicts 0); it is wrong where that differs from ``targets > 1/2``. Only masked steps count.

    Args and shapes as in `masked_bce`.

    Returns:
        ``[B]`` float count of wrong bits per sequence.
    """
    mask = _check(logits, targets, mask, batch_first)
    wrong = (logits > 0) != (targets > 0.5)  # (T, B, C)
    dtype = logits.dtype if logits.is_floating_point() else torch.get_default_dtype()
    return _per_sequence(wrong.sum(-1).to(dtype), mask, batch_first)


def _groups(logits: Tensor, groups: int) -> Tensor:
    """``[..., C]`` -> ``[..., groups, C // groups]``, or a ValueError if C does not split."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be an integer >= 1, got {groups!r}")
    if logits.shape[-1] % groups:
        raise ValueError(f"{logits.shape[-1]} output units do not split into {groups} groups")
    return logits.unflatten(-1, (groups, logits.shape[-1] // groups))


def masked_cross_entropy(
    logits: Tensor, targets: Tensor, mask: Tensor, *, groups: int = 1, batch_first: bool = False
) -> Tensor:
    """Softmax cross-entropy of labels, in nats, summed over groups and masked steps.

    The C output units split into ``groups`` groups of ``C / groups`` (one-hot labels: 1 group
    of C; Omniglot's string labels: 5 characters of 5 symbols); each group is one softmax and
    its target a distribution over the group (one-hot for the tasks here):
    ``sum_{t: mask[t,b]} sum_g -sum_j y_{t,g,j} log softmax(x_{t,g})_j``.

    Args:
        logits: ``[T, B, C]`` model outputs before the softmax.
        targets: ``[T, B, C]``, each group summing to 1 on the masked steps.
        mask: ``[T, B]`` bool, true on the steps that are scored.
        groups: the number of softmax groups; C must be a multiple of it.
        batch_first: all three tensors have batch and time swapped.

    Returns:
        ``[B]`` loss per sequence, in nats.
    """
    mask = _check(logits, targets, mask, batch_first)
    log_p = F.log_softmax(_groups(logits, groups), dim=-1)  # (T, B, G, C/G)
    per_step = -(_groups(targets.to(logits.dtype), groups) * log_p).sum((-2, -1))  # (T, B)
    return _per_sequence(per_step, mask, batch_first)


def label_errors(
    logits: Tensor, targets: Tensor, mask: Tensor, *, groups: int = 1, batch_first: bool = False
) -> Tensor:
    """Number of wrong labels per sequence: steps where any group's argmax differs from the
    target's (for string labels: any wrong character). Only masked steps count.

    Args and shapes as in `masked_cross_entropy`.

    Returns:
        ``[B]`` float count of wrong labels per sequence.
    """
    mask = _check(logits, targets, mask, batch_first)
    wrong = (_groups(logits, groups).argmax(-1) != _groups(targets, groups).argmax(-1)).any(-1)
    dtype = logits.dtype if logits.is_floating_point() else torch.get_default_dtype()
    return _per_sequence(wrong.to(dtype), mask, batch_first)


class Objective(NamedTuple):
    """How a task is scored; each function maps ``(logits, targets, mask)`` (time-major) to one
    value per sequence ``[B]``, or for ``probabilities`` to ``[T, B, C]``."""

    loss: Callable[..., Tensor]  # nats per sequence, what training minimises
    errors: Callable[..., Tensor]  # wrong bits (or wrong labels) per sequence
    probabilities: Callable[[Tensor], Tensor]  # what the model predicts, from logits


def objective(loss: str = "bce", groups: int = 1) -> Objective:
    """The loss, error count and output probabilities for a task's ``loss`` and
    ``label_groups`` (`torch_ntm.tasks.Task`): ``"bce"`` (`masked_bce`, `bit_errors`, sigmoid)
    or ``"cross_entropy"`` (`masked_cross_entropy`, `label_errors`, a softmax per group).

    Raises:
        ValueError: an unknown ``loss``, listing the valid ones.
    """
    if loss == "bce":
        return Objective(masked_bce, bit_errors, torch.sigmoid)
    if loss == "cross_entropy":
        _groups(torch.zeros(groups), groups)  # checks groups

        def probabilities(logits: Tensor) -> Tensor:
            return F.softmax(_groups(logits, groups), dim=-1).flatten(-2)

        return Objective(
            lambda x, y, m: masked_cross_entropy(x, y, m, groups=groups),
            lambda x, y, m: label_errors(x, y, m, groups=groups), probabilities)
    raise ValueError(f"unknown loss {loss!r}; valid losses: bce, cross_entropy")
