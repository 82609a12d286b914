"""Keeping what training found, for `ntm train` and for users' own loops.

`BestWeights` holds a copy of the weights (and optimizer state) of the best validation so far and
puts them back on request: the run keeps the model that validated best, and a model that falls
apart after learning can be rolled back. docs/stability.md explains when NTMs fall apart and what
prevents it: `SpikeClip`, gradient-norm clipping at 1 and at twice the recent median norm).

Example (a user's loop, the README's; ``validate`` returns wrong bits per sequence, lower is
better):

    clip = SpikeClip(ntm.parameters())
    keeper = BestWeights(ntm, optimizer)
    for step in range(steps):
        ...
        clip()                          # between backward and the optimizer's step
        optimizer.step()
        if step % 100 == 0:
            keeper.update(validate(ntm))
    keeper.restore()                    # end on the best weights, not the last ones
"""

from __future__ import annotations

import copy
import math
import statistics
from collections import deque
from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["BestWeights", "SpikeClip"]


class BestWeights:
    """The weights and optimizer state of the best score seen so far (lower is better).

    Args:
        model: the module whose ``state_dict`` is kept.
        optimizer: optional; its state is kept and restored with the weights, so that training
            continues from the best point exactly as it would have from there.

    A score is anything ordered: a number, or a tuple compared item by item (e.g. ``(wrong bits,
    cost)``). NaN never counts as better.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.score = None
        self._weights: dict | None = None
        self._optimizer_state: dict | None = None

    def update(self, score) -> bool:
        """Keep a copy of the current weights if ``score`` beats the best so far; returns whether
        it did."""
        if _has_nan(score) or (self.score is not None and not score < self.score):
            return False
        self.score = score
        self._weights = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._optimizer_state = copy.deepcopy(self.optimizer.state_dict())
        return True

    def restore(self):
        """Load the best weights (and optimizer state) back; returns their score.

        Raises:
            RuntimeError: `update` has not kept anything yet.
        """
        if self._weights is None:
            raise RuntimeError("BestWeights.restore: no weights kept yet; call update(score) first")
        self.model.load_state_dict(self._weights)
        if self.optimizer is not None and self._optimizer_state is not None:
            # a copy: optimizers keep the tensors they are given and advance them in place
            self.optimizer.load_state_dict(copy.deepcopy(self._optimizer_state))
        return self.score

    def set_lr(self, lr: float) -> None:
        """Give the kept optimizer state the rate ``lr`` (a resume with a new rate: a rollback
        must not return to the old one)."""
        if self._optimizer_state is not None:
            for group in self._optimizer_state["param_groups"]:
                group["lr"] = lr

    def state_dict(self) -> dict:
        """The kept weights and optimizer state with their score, to save with a checkpoint."""
        return {"score": self.score, "weights": self._weights,
                "optimizer": self._optimizer_state}

    def load_state_dict(self, state: dict) -> None:
        self.score = state["score"]
        self._weights = state["weights"]
        self._optimizer_state = state["optimizer"]


def _has_nan(score) -> bool:
    values = score if isinstance(score, (tuple, list)) else (score,)
    return any(isinstance(v, float) and math.isnan(v) for v in values)


class SpikeClip:
    """Gradient-norm clipping at ``factor`` times the median norm of the last ``window`` steps.

    Call it where ``torch.nn.utils.clip_grad_norm_`` would go, between ``backward`` and the
    optimizer's step. A solved NTM still meets rare sequences whose gradient is 30-1,000 times a
    typical one; Adam turns such a spike into a step of several learning rates in every
    coordinate it touches, in the direction of that one sequence, and a few of them undo the
    solution (docs/stability.md). A fixed ``max_norm`` cannot tell a spike from an ordinary step,
    because the typical norm falls by orders of magnitude as training converges (copy: ~10 at
    the start, ~0.05 when solved; associative recall down to ~0.005); relative to the recent
    median it can, on every task.

    Args:
        parameters: the parameters whose gradients are clipped (a list is kept; a generator is
            consumed once).
        factor: clip at this multiple of the median recent norm.
        window: how many recent norms the median is taken over.
        max_norm: an absolute clip as well, and the only one during the first ``warmup`` steps
            (1: a typical gradient of a solved copy model; Adam is indifferent to the scale).
        warmup: steps before the relative clip starts (the median needs a few norms).

    Returns (on call): the total gradient norm before clipping (a tensor, as
    ``clip_grad_norm_``); a non-finite norm is returned and not recorded, so that a caller can
    skip the step.
    """

    def __init__(self, parameters: Iterable[torch.Tensor], factor: float = 2.0,
                 window: int = 100, max_norm: float = 1.0, warmup: int = 10) -> None:
        if not factor >= 1.0 or not max_norm > 0 or window < 1 or warmup < 1:
            raise ValueError("SpikeClip needs factor >= 1, max_norm > 0, window >= 1 and "
                             f"warmup >= 1; got factor={factor}, max_norm={max_norm}, "
                             f"window={window}, warmup={warmup}")
        self.parameters = list(parameters)
        self.factor, self.max_norm, self.warmup = float(factor), float(max_norm), int(warmup)
        self.norms: deque[float] = deque(maxlen=int(window))

    @property
    def threshold(self) -> float:
        """The norm the next call clips at."""
        if len(self.norms) < self.warmup:
            return self.max_norm
        return min(self.max_norm, self.factor * statistics.median(self.norms))

    def __call__(self) -> torch.Tensor:
        norm = nn.utils.clip_grad_norm_(self.parameters, self.threshold)
        if torch.isfinite(norm):
            self.norms.append(float(norm))
        return norm

    def state_dict(self) -> dict:
        return {"norms": list(self.norms)}

    def load_state_dict(self, state: dict) -> None:
        self.norms.clear()
        self.norms.extend(float(v) for v in state["norms"])
