"""The interface every task shares: `Batch` and `Task` (the tasks are in `torch_ntm.tasks`,
`torch_ntm.omniglot` and `torch_ntm.graph_tasks`, which build on this module, so that
`torch_ntm.tasks` can register the others without an import circle)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor

__all__ = ["Batch", "Task", "LOSSES", "check_int"]

# How a task's targets are scored (`torch_ntm.metrics.objective`): "bce", independent bits (the
# algorithmic tasks); "cross_entropy", labels, one softmax per group of units (Omniglot, the
# graph tasks).
LOSSES = ("bce", "cross_entropy")


class Batch(NamedTuple):
    """One batch of a task (time-major unless sampled with ``batch_first=True``)."""

    inputs: Tensor  # (T, B, input_size) float32
    targets: Tensor  # (T, B, output_size) float32, zero where mask is false
    mask: Tensor  # (T, B) bool


class Task:
    """Interface shared by the tasks; subclasses are dataclasses of their size parameters."""

    name: ClassVar[str]  # key in `TASKS`
    size_name: ClassVar[str]  # what `with_size` sets, e.g. "length"
    eval_sizes: ClassVar[tuple[int, ...]]  # default sizes for generalisation tests
    loss: ClassVar[str] = "bce"  # how targets are scored: one of `LOSSES`
    # The fields (low, high) of the training range of the main size knob, for tasks that draw it
    # from a range; `up_to` lowers the high end.
    size_range: ClassVar[tuple[str, str] | None] = None

    @property
    def label_task(self) -> bool:
        """A label task (scored by wrong labels, accuracy by instance on held-out episodes), not
        a task with sizes to generalise to. By default, a task with the ``"cross_entropy"`` loss;
        the graph tasks are scored by labels but have sizes, and say False. (Not ``labels``:
        that is Omniglot's field for how labels are encoded.)"""
        return self.loss == "cross_entropy"

    @property
    def input_size(self) -> int:
        raise NotImplementedError

    @property
    def output_size(self) -> int:
        raise NotImplementedError

    @property
    def train_size(self) -> int:
        """The largest value of the main size knob this task generates (by default the high end
        of ``size_range``)."""
        if self.size_range is None:
            raise NotImplementedError
        return getattr(self, self.size_range[1])

    def with_size(self, size: int) -> Task:
        """A copy of this task that generates exactly ``size`` of its main size knob (by default
        both ends of ``size_range`` set to it)."""
        if self.size_range is None:
            raise NotImplementedError
        low, high = self.size_range
        return dataclasses.replace(self, **{low: size, high: size})

    def up_to(self, size: int) -> Task:
        """A copy of this task whose sizes go up to ``size`` at most: a step of a curriculum.

        A task that draws its size from a range keeps the low end (lowered to ``size`` if above
        it) and the rest of its distribution; one with a fixed size generates exactly ``size``.
        ``up_to(train_size)`` is the task itself.
        """
        check_int("size", size, 1)
        if self.size_range is None:
            return self if size == self.train_size else self.with_size(size)
        low, high = self.size_range
        return dataclasses.replace(self, **{low: min(getattr(self, low), size), high: size})

    def _sample(self, batch_size: int, generator: torch.Generator | None) -> Batch:
        raise NotImplementedError

    def sample(
        self,
        batch_size: int,
        generator: torch.Generator | None = None,
        batch_first: bool = False,
    ) -> Batch:
        """Draw a batch of ``batch_size`` sequences.

        Args:
            batch_size: B.
            generator: CPU `torch.Generator` supplying all randomness (None: the global one).
            batch_first: return ``[B, T, ...]`` tensors instead of ``[T, B, ...]``.

        Returns:
            `Batch` of inputs ``[T, B, input_size]`` and targets ``[T, B, output_size]``,
            float32, and mask ``[T, B]``, bool (batch and time swapped if ``batch_first``).
        """
        check_int("batch_size", batch_size, 1)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator (or None), got "
                            f"{type(generator).__name__}; for a seed, pass "
                            f"torch.Generator().manual_seed({generator!r})")
        if generator is not None and generator.device.type != "cpu":
            raise ValueError(f"tasks sample on the CPU; got a generator on {generator.device}")
        batch = self._sample(batch_size, generator)
        if batch_first:
            batch = Batch(*(x.transpose(0, 1).contiguous() for x in batch))
        return batch

    def reference_cost(self, batch: Batch, batch_first: bool = False) -> Tensor | None:
        """Cost in bits per sequence ``[B]`` of a reference predictor, or None if there is none."""
        return None

    @property
    def label_groups(self) -> int:
        """With ``loss == "cross_entropy"``: the number of softmax groups of equal width that
        the output units split into (each target has one 1 per group)."""
        return 1

    def held_out(self) -> Task:
        """The task that evaluation draws from: this one (fresh random sequences of the training
        distribution), or data never trained on (Omniglot's test split)."""
        return self

    def validation(self) -> Task:
        """The task that validation (the choice of the weights a run keeps) draws from: by
        default `held_out`; data kept apart from both training and evaluation where the task has
        some (Omniglot's validation split)."""
        return self.held_out()

    @property
    def extra_metrics(self) -> tuple[str, ...]:
        """The names of `extra_scores`' values (columns of ``metrics.csv``)."""
        return ()

    def extra_scores(self, logits: Tensor, targets: Tensor, mask: Tensor) -> dict[str, float]:
        """Task-specific means over a batch (time-major ``[T, B, O]``), by `extra_metrics` name;
        every sequence weighs the same, so batches of equal size average to the whole set's."""
        return {}

    def _check(self, **minimums: int) -> None:
        for field, minimum in minimums.items():
            check_int(f"{type(self).__name__}.{field}", getattr(self, field), minimum)

    def _check_range(self, low: str, high: str) -> None:
        if getattr(self, low) > getattr(self, high):
            raise ValueError(
                f"{type(self).__name__}: {low}={getattr(self, low)} must be <= "
                f"{high}={getattr(self, high)}"
            )


def check_int(name: str, value, minimum: int) -> None:
    """A `ValueError` naming ``name`` unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


