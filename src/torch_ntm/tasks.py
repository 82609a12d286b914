"""The five algorithmic tasks of the paper (Graves, Wayne & Danihelka 2014, section 4), and the
registry `TASKS` of every task (with Omniglot episodes, `torch_ntm.omniglot`, and the DNC
paper's graph tasks, `torch_ntm.graph_tasks`).

Each task is a dataclass of its size parameters (defaults: the paper's training distribution) whose
`sample` draws a `Batch` of ``(inputs, targets, mask)``:

    inputs   [T, B, input_size]   float32
    targets  [T, B, output_size]  float32, zero where mask is false
    mask     [T, B]               bool, true on the steps whose output is scored

time-major (``batch_first=True`` gives ``[B, T, ...]``). Lengths vary inside a batch; a shorter
sequence is padded at the end with zero inputs, zero targets and a false mask, so ``T`` is the
longest sequence of the batch. Every channel a layout below does not show is 0 at that step
(the data channels on a delimiter, count or marker step, and every input channel while the output
is written). Every data bit is an independent fair coin flip, so a vector can be all zeros and two
vectors of a sequence can be equal; a batch's sizes (length, repeats, items) are drawn for each
sequence independently of each other. All randomness comes from the ``generator`` argument (a CPU
`torch.Generator`; None uses torch's global one), so a fixed seed gives fixed tensors. Sampling
is vectorised over the batch (n-grams alone loops over time, as a Markov chain must).

For generalisation tests every task has one main size knob: ``with_size(n)`` returns a copy that
generates exactly ``n`` of it, ``train_size`` is its largest value in training and
``eval_sizes`` the default sizes to evaluate. Score a model with `torch_ntm.metrics`;
``reference_cost`` gives the cost of a reference predictor where one exists (n-grams).

    task = make_task("copy")                 # CopyTask(width=8, min_length=1, max_length=20)
    inputs, targets, mask = task.sample(16, torch.Generator().manual_seed(0))
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from torch_ntm.graph_tasks import ShortestPathTask, TraversalTask
from torch_ntm.metrics import bit_errors
from torch_ntm.omniglot import OmniglotTask
from torch_ntm.task_base import Batch, Task, check_int

__all__ = [
    "Batch",
    "Task",
    "CopyTask",
    "RepeatCopyTask",
    "AssociativeRecallTask",
    "NGramsTask",
    "PrioritySortTask",
    "OmniglotTask",
    "TraversalTask",
    "ShortestPathTask",
    "TASKS",
    "make_task",
]


def _gather_steps(steps: Tensor, index: Tensor) -> Tensor:
    """``out[t, b] = steps[index[t, b], b]``: pick a stored step per output step and sequence.

    Args:
        steps: ``[S, B, W]``.
        index: ``[T, B]`` long in ``[0, S)``.

    Returns:
        ``[T, B, W]``.
    """
    return steps.gather(0, index.unsqueeze(-1).expand(-1, -1, steps.shape[-1]))


def _random_bits(shape: tuple[int, ...], generator: torch.Generator | None) -> Tensor:
    return torch.randint(0, 2, shape, generator=generator, dtype=torch.float32)


def _randint(low: int, high: int, batch_size: int, generator: torch.Generator | None) -> Tensor:
    """``[B]`` long, uniform on ``low..high`` inclusive."""
    return torch.randint(low, high + 1, (batch_size,), generator=generator)


@dataclass
class CopyTask(Task):
    """Copy (section 4.1): read a sequence of random bit vectors, then write it back.

    A sequence of length L (uniform on ``min_length..max_length``) takes ``T = 2L + 1`` steps:

        step      0 .. L-1      L        L+1 .. 2L
        input    [x_1 .. x_L]  [delim]  [0 ....  0]      channels 0..width-1: data bits
                                                         channel  width:      delimiter
        target   [0  ..  0 ]   [0]      [x_1 .. x_L]     channels 0..width-1
        mask      0  ..  0      0        1  ..  1

    e.g. width 2, L 2, x_1 = (1, 0), x_2 = (1, 1): inputs ``[[1,0,0], [1,1,0], [0,0,1], [0,0,0],
    [0,0,0]]``, targets ``[[0,0], [0,0], [0,0], [1,0], [1,1]]``, mask ``[0, 0, 0, 1, 1]``.
    The size knob is the length L; the paper trains on L <= 20 and tests up to 120.
    """

    width: int = 8
    min_length: int = 1
    max_length: int = 20

    name: ClassVar[str] = "copy"
    size_name: ClassVar[str] = "length"
    size_range: ClassVar[tuple[str, str]] = ("min_length", "max_length")
    eval_sizes: ClassVar[tuple[int, ...]] = (20, 30, 50, 80, 120)

    def __post_init__(self) -> None:
        self._check(width=1, min_length=1, max_length=1)
        self._check_range("min_length", "max_length")

    @property
    def input_size(self) -> int:
        return self.width + 1

    @property
    def output_size(self) -> int:
        return self.width

    def _sample(self, batch_size: int, generator: torch.Generator | None) -> Batch:
        W, B = self.width, batch_size
        length = _randint(self.min_length, self.max_length, B, generator)  # L, (B,)
        max_len = int(length.max())
        T = 2 * max_len + 1
        bits = _random_bits((max_len, B, W), generator)  # x_1..x_L, (Lmax, B, W)
        t = torch.arange(T).unsqueeze(1)  # (T, 1)
        mask = (t > length) & (t <= 2 * length)  # (T, B)

        inputs = torch.zeros(T, B, W + 1)
        inputs[:max_len, :, :W] = bits * (t[:max_len] < length).unsqueeze(-1)
        inputs[:, :, W] = (t == length).float()
        # answer step t reproduces data step t - L - 1
        source = (t - length - 1).clamp(0, max_len - 1)  # (T, B)
        targets = _gather_steps(bits, source) * mask.unsqueeze(-1)
        return Batch(inputs, targets, mask)


@dataclass
class RepeatCopyTask(Task):
    """Repeat copy (section 4.2): copy a sequence a given number of times, then emit an end marker.

    Length L is uniform on ``min_length..max_length``, repeats R on ``min_repeats..max_repeats``;
    a sequence takes ``T = (R + 1) L + 3`` steps:

        step     0        1 .. L         L+1       L+2 .. L+1+RL             L+2+RL
        input   [start]  [x_1 .. x_L]   [count]   [0 ............... 0]     [0]
        target  [0]      [0  ..  0 ]    [0]       [x_1..x_L ... x_1..x_L]   [end]
        mask     0        0  ..  0       0         1 ...............  1      1

        input  channels 0..width-1 data, width: start delimiter, width+1: count = R / repeats_norm
        target channels 0..width-1 data, width: end-of-sequence marker

    The count is R divided by the fixed ``repeats_norm`` (default 10, the paper's largest number
    of repeats in training), not by ``max_repeats``, so a given R is encoded the same way when
    evaluating at more repeats than in training (`with_repeats`). The size knob of `with_size` is
    the length L; repeats keep their distribution.
    """

    width: int = 8
    min_length: int = 1
    max_length: int = 10
    min_repeats: int = 1
    max_repeats: int = 10
    repeats_norm: float = 10.0

    name: ClassVar[str] = "repeat_copy"
    size_name: ClassVar[str] = "length"
    size_range: ClassVar[tuple[str, str]] = ("min_length", "max_length")
    eval_sizes: ClassVar[tuple[int, ...]] = (10, 15, 20)
    eval_repeats: ClassVar[tuple[int, ...]] = (10, 15, 20)  # for `with_repeats`

    def __post_init__(self) -> None:
        self._check(width=1, min_length=1, max_length=1, min_repeats=1, max_repeats=1)
        self._check_range("min_length", "max_length")
        self._check_range("min_repeats", "max_repeats")
        norm = self.repeats_norm
        if isinstance(norm, bool) or not isinstance(norm, (int, float)) or not norm > 0:
            raise ValueError(f"RepeatCopyTask.repeats_norm must be a number > 0, got {norm!r}")

    @property
    def input_size(self) -> int:
        return self.width + 2

    @property
    def output_size(self) -> int:
        return self.width + 1

    def with_repeats(self, repeats: int) -> RepeatCopyTask:
        """A copy that always asks for exactly ``repeats`` copies (``repeats_norm`` unchanged)."""
        return dataclasses.replace(self, min_repeats=repeats, max_repeats=repeats)

    @property
    def extra_metrics(self) -> tuple[str, ...]:
        """``data_bit_errors``: wrong data bits per sequence (channels 0..width-1);
        ``end_marker_wrong``: the fraction of sequences whose end-marker channel is wrong on
        some scored step (not raised exactly on the step after the last copy, or raised early).
        The paper's model failed on the marker first at more repeats than trained on, so the
        two are counted apart; their bit errors add up to ``bit_errors``."""
        return ("data_bit_errors", "end_marker_wrong")

    def extra_scores(self, logits: Tensor, targets: Tensor, mask: Tensor) -> dict[str, float]:
        """`extra_metrics`' means over the batch (time-major ``[T, B, width + 1]``)."""
        W = self.width
        data = bit_errors(logits[..., :W], targets[..., :W], mask)  # (B,)
        marker = bit_errors(logits[..., W:], targets[..., W:], mask) > 0  # (B,)
        return {"data_bit_errors": float(data.double().mean()),
                "end_marker_wrong": float(marker.double().mean())}

    def _sample(self, batch_size: int, generator: torch.Generator | None) -> Batch:
        W, B = self.width, batch_size
        length = _randint(self.min_length, self.max_length, B, generator)  # L, (B,)
        repeats = _randint(self.min_repeats, self.max_repeats, B, generator)  # R, (B,)
        max_len = int(length.max())
        T = int(((repeats + 1) * length).max()) + 3
        bits = _random_bits((max_len, B, W), generator)  # (Lmax, B, W)
        t = torch.arange(T).unsqueeze(1)  # (T, 1)
        first = length + 2  # first answer step, (B,)
        end = first + repeats * length  # end-marker step, (B,)
        mask = (t >= first) & (t <= end)  # (T, B)

        inputs = torch.zeros(T, B, W + 2)
        inputs[1 : max_len + 1, :, :W] = bits * (t[1 : max_len + 1] <= length).unsqueeze(-1)
        inputs[0, :, W] = 1.0
        inputs[:, :, W + 1] = (t == length + 1) * (repeats / self.repeats_norm)
        targets = torch.zeros(T, B, W + 1)
        copying = mask & (t < end)
        source = (t - first).clamp(min=0) % length  # data step to reproduce, (T, B)
        targets[:, :, :W] = _gather_steps(bits, source) * copying.unsqueeze(-1)
        targets[:, :, W] = (t == end).float()
        return Batch(inputs, targets, mask)


@dataclass
class AssociativeRecallTask(Task):
    """Associative recall (section 4.3): given one item of a list, return the item after it.

    An item is ``item_length`` random bit vectors; a sequence has n items (uniform on
    ``min_items..max_items``). The query is a copy of item q, q uniform on ``0..n-2`` (never the
    last item); the answer is item q+1. With k = item_length a sequence takes ``T = (n+2)(k+1)``
    steps, in blocks of k+1 (k = 3 shown):

        block     0               ...  n-1              n                n+1
        input    [i][a1 a2 a3]    ...  [i][z1 z2 z3]    [q][c1 c2 c3]    [q][0  0  0 ]
        target   [0][0  0  0 ]    ...  [0][0  0  0 ]    [0][0  0  0 ]    [0][d1 d2 d3]
        mask      0  0  0  0      ...   0  0  0  0       0  0  0  0       0  1  1  1

        input  channels 0..width-1 data, width: item delimiter [i], width+1: query delimiter [q]
        target channels 0..width-1: item q+1 (d) where the query (c) is item q

    Items are drawn independently, so two items of a sequence can coincide (probability about
    n^2 / 2^(width * item_length + 1), under 1e-4 at the defaults). The size knob is the number of
    items n; the paper trains on 2..6 items and tests up to 15.
    """

    width: int = 6
    item_length: int = 3
    min_items: int = 2
    max_items: int = 6

    name: ClassVar[str] = "associative_recall"
    size_name: ClassVar[str] = "items"
    size_range: ClassVar[tuple[str, str]] = ("min_items", "max_items")
    eval_sizes: ClassVar[tuple[int, ...]] = (6, 8, 10, 12, 15)

    def __post_init__(self) -> None:
        self._check(width=1, item_length=1, min_items=2, max_items=2)
        self._check_range("min_items", "max_items")

    @property
    def input_size(self) -> int:
        return self.width + 2

    @property
    def output_size(self) -> int:
        return self.width

    def _sample(self, batch_size: int, generator: torch.Generator | None) -> Batch:
        W, B, k = self.width, batch_size, self.item_length
        items = _randint(self.min_items, self.max_items, B, generator)  # n, (B,)
        max_items = int(items.max())
        # vector j of item i is row i * k + j
        bits = _random_bits((max_items * k, B, W), generator)  # (nmax * k, B, W)
        u = torch.rand(B, generator=generator, dtype=torch.float64)
        query = torch.minimum((u * (items - 1)).long(), items - 2)  # q uniform on 0..n-2, (B,)

        T = (max_items + 2) * (k + 1)
        t = torch.arange(T).unsqueeze(1)  # (T, 1)
        block, pos = t // (k + 1), t % (k + 1)  # (T, 1) each; pos 0 is the delimiter
        is_vector = pos > 0
        shows_item = is_vector & (block <= items)  # the n items, then the query; (T, B)
        mask = is_vector & (block == items + 1)  # (T, B)

        inputs = torch.zeros(T, B, W + 2)
        item = torch.where(block < items, block, query)  # which item an input step shows
        source = (item * k + pos - 1).clamp(0, max_items * k - 1)
        inputs[:, :, :W] = _gather_steps(bits, source) * shows_item.unsqueeze(-1)
        inputs[:, :, W] = ((pos == 0) & (block < items)).float()
        inputs[:, :, W + 1] = ((pos == 0) & ((block == items) | (block == items + 1))).float()
        answer = ((query + 1) * k + pos - 1).clamp(0, max_items * k - 1)  # (T, B)
        targets = _gather_steps(bits, answer) * mask.unsqueeze(-1)
        return Batch(inputs, targets, mask)


def _ngram_table(batch_size: int, contexts: int, generator: torch.Generator | None) -> Tensor:
    """``[B, contexts]`` probabilities P(next bit = 1 | context), each ~ Beta(1/2, 1/2).

    Beta(1/2, 1/2) is the arcsine distribution, CDF ``(2 / pi) asin(sqrt(p))``; inverting it
    gives ``p = sin^2(pi u / 2)`` with u ~ U(0, 1), which draws from ``generator`` directly.
    """
    u = torch.rand(batch_size, contexts, generator=generator, dtype=torch.float64)
    return torch.sin(0.5 * math.pi * u).pow(2)


def _ngram_sequences(table: Tensor, uniforms: Tensor, order: int) -> Tensor:
    """Run the (order-1)-bit Markov chain of each sequence.

    Bit t is ``uniforms[t] < p`` with p = 1/2 for the first order-1 bits and
    ``p = table[b, c_t]`` after, where the context ``c_t = sum_{j=1}^{order-1} x_{t-j} 2^(j-1)``
    (the most recent bit is the least significant).

    Args:
        table: ``[B, 2^(order-1)]`` float64, on the CPU.
        uniforms: ``[length, B]`` float64 in [0, 1), on the CPU.

    Returns:
        ``[length, B]`` float32 bits.
    """
    length, batch_size = uniforms.shape
    contexts = table.shape[1]
    warmup = min(order - 1, length)
    u = uniforms.numpy()
    bits = np.empty((length, batch_size), dtype=np.int64)
    bits[:warmup] = u[:warmup] < 0.5
    context = np.zeros(batch_size, dtype=np.int64)
    for j in range(warmup):
        context = context * 2 + bits[j]
    # A Markov chain is sequential in time; vectorise what can be: the outcome of every step for
    # every possible context, so that the loop only follows the context index. The loop runs in
    # NumPy, whose per-call overhead is a few times lower than torch's (0.75 vs 3.2 ms a batch).
    draws = (u[warmup:, :, None] < table.numpy()).reshape(length - warmup, -1)  # (., B * C)
    offset = np.arange(batch_size) * contexts
    for t in range(warmup, length):
        bits[t] = draws[t - warmup].take(offset + context)
        context = (context * 2 + bits[t]) % contexts
    return torch.from_numpy(bits).float()


@dataclass
class NGramsTask(Task):
    """Dynamic n-grams (section 4.4): predict the next bit of a sequence from a random n-gram model.

    For each sequence a fresh table gives, for every context of ``order - 1`` bits,
    P(next bit = 1) ~ Beta(1/2, 1/2). The first ``order - 1`` bits are uniform; every later bit is
    drawn from the table given the ``order - 1`` bits before it (the table's index for bit t is
    ``sum_{j=1}^{order-1} x_{t-j} 2^(j-1)``, the most recent bit least significant; its entries
    are independent, so the order of the index does not change the sequences' distribution,
    only which numbers of a generator's stream a sequence takes). A sequence of ``length`` bits
    x_0..x_{length-1} takes ``T = length - 1`` steps; the input at step t is x_t and the target is
    x_{t+1}:

        step      0     1    ...  order-3      order-2    ...  length-2
        input    [x_0] [x_1] ...  [x_{o-3}]    [x_{o-2}]  ...  [x_{length-2}]   1 channel
        target   [0]   [0]   ...  [0]          [x_{o-1}]  ...  [x_{length-1}]   1 channel
        mask      0     0    ...   0            1         ...   1

    The mask skips the ``order - 2`` steps whose target has an incomplete context (those bits are
    fair coin flips no predictor can beat), so ``length - order + 1`` bits are scored, 195 at the
    defaults. All sequences of a batch have the same length. `reference_cost` gives the cost of
    the Bayes-optimal predictor. The size knob is ``length``.
    """

    order: int = 6
    length: int = 200

    name: ClassVar[str] = "ngrams"
    size_name: ClassVar[str] = "length"
    eval_sizes: ClassVar[tuple[int, ...]] = (200, 500, 1000)

    def __post_init__(self) -> None:
        self._check(order=2)  # at least one bit of context; the paper's order is 6
        # at least one scored step: length - order + 1 >= 1, and T = length - 1 >= 1
        self._check(length=max(2, self.order))

    @property
    def input_size(self) -> int:
        return 1

    @property
    def output_size(self) -> int:
        return 1

    @property
    def train_size(self) -> int:
        return self.length

    def with_size(self, size: int) -> NGramsTask:
        return dataclasses.replace(self, length=size)

    def _sample(self, batch_size: int, generator: torch.Generator | None) -> Batch:
        table = _ngram_table(batch_size, 2 ** (self.order - 1), generator)
        uniforms = torch.rand(self.length, batch_size, generator=generator, dtype=torch.float64)
        bits = _ngram_sequences(table, uniforms, self.order)  # (length, B)
        T = self.length - 1
        mask = (torch.arange(T) >= self.order - 2).unsqueeze(1).expand(T, batch_size)
        inputs = bits[:-1].unsqueeze(-1)
        targets = (bits[1:] * mask).unsqueeze(-1)
        return Batch(inputs.contiguous(), targets, mask.contiguous())

    def reference_cost(self, batch: Batch, batch_first: bool = False) -> Tensor:
        """Cost in bits per sequence ``[B]`` of the Bayes-optimal predictor (section 4.4).

        Given the context c of the next bit, it predicts
        ``P(1) = (N_1(c) + 1/2) / (N_0(c) + N_1(c) + 1)``, where N_0(c), N_1(c) count the earlier
        scored steps of the same sequence with context c whose bit was 0, 1: the posterior mean
        under the Beta(1/2, 1/2) prior.

        Args:
            batch: a `Batch` of this task (inputs/targets ``[T, B, 1]``, mask ``[T, B]``).
            batch_first: the batch is ``[B, T, ...]``.
        """
        bits, _ = self.reference_steps(batch, batch_first)
        return bits.sum(0).float()

    def reference_steps(self, batch: Batch, batch_first: bool = False) -> tuple[Tensor, Tensor]:
        """The Bayes-optimal predictor step by step (`reference_cost`, time-major): its cost in
        bits at each step ``[T, B]`` (float64, 0 where the mask is), and how many earlier scored
        steps had the step's context, ``N_0(c) + N_1(c)`` ``[T, B]``."""
        inputs, targets, mask = batch
        if batch_first:
            inputs, targets, mask = (x.transpose(0, 1) for x in (inputs, targets, mask))
        if inputs.dim() != 3 or inputs.shape[2] != 1 or targets.shape != inputs.shape:
            raise ValueError(
                f"expected inputs and targets of shape [T, B, 1], got {list(inputs.shape)} "
                f"and {list(targets.shape)}"
            )
        y = targets[..., 0].double()  # x_{t+1}, (T, B)
        context = self.contexts(inputs[..., 0])  # of x_{t+1}, (T, B)
        scored = torch.nn.functional.one_hot(context, 2 ** (self.order - 1)).double()
        scored = scored * mask.unsqueeze(-1)  # (T, B, contexts)
        # counts over the steps strictly before t (exclusive cumulative sums)
        seen = scored.cumsum(0) - scored
        ones = (scored * y.unsqueeze(-1)).cumsum(0) - scored * y.unsqueeze(-1)
        n_all = seen.gather(-1, context.unsqueeze(-1)).squeeze(-1)  # N_0 + N_1, (T, B)
        n_one = ones.gather(-1, context.unsqueeze(-1)).squeeze(-1)  # N_1, (T, B)
        p_one = (n_one + 0.5) / (n_all + 1.0)
        p_target = torch.where(y > 0.5, p_one, 1.0 - p_one)
        return -torch.log2(p_target).masked_fill(~mask, 0.0), n_all

    def contexts(self, bits: Tensor) -> Tensor:
        """The context of each step's target ``[T, B]`` (long), from the input bits ``[T, B]``
        (time-major): x_t, x_{t-1}, ..., x_{t-order+2}, the newest least significant, as in
        `_ngram_sequences`."""
        bits = bits.long()
        context = torch.zeros(bits.shape, dtype=torch.long)
        for j in range(self.order - 1):
            context[j:] += bits[: bits.shape[0] - j] << j
        return context


@dataclass
class PrioritySortTask(Task):
    """Priority sort (section 4.5): output the highest-priority vectors, sorted by priority.

    ``num_inputs`` random bit vectors each come with a priority ~ U[-1, 1]; after a delimiter the
    target is the ``num_outputs`` vectors of highest priority, highest first. With n = num_inputs
    and m = num_outputs a sequence takes ``T = n + 1 + m`` steps:

        step      0 .. n-1       n        n+1 .. n+m
        input    [x_1 .. x_n]   [0]      [0 ..... 0]     channels 0..width-1: data
                 [p_1 .. p_n]   [0]      [0 ..... 0]     channel  width:      priority
                 [0   ..  0 ]   [delim]  [0 ..... 0]     channel  width+1:    delimiter
        target   [0   ..  0 ]   [0]      [y_1 .. y_m]    y: the x sorted by decreasing priority
        mask      0   ..  0      0        1  ..  1

    Targets follow the priorities as they are on the input channel (float32); equal priorities
    keep their input order (a stable sort). All sequences of a batch have the same length. The
    size knob is ``num_inputs``: `with_size` scales ``num_outputs`` in proportion, ``round(size *
    num_outputs / num_inputs)`` (halves up, at least 1), so the default 16 of 20 becomes 24 of 30.

    ``close_pairs`` (training only; default 0, the paper's task) makes near-ties common: in each
    training sequence that many inputs, chosen at random, take the priority of another input
    (each its own, also chosen at random) plus an offset drawn log-uniformly from
    ``CLOSE_GAPS`` = [1e-4, 1e-2] with a random sign (the other sign where that would leave
    [-1, 1]). Under U[-1, 1] two priorities closer than 0.001 are rare (16% of sequences of 20
    have such a pair), and they are where a trained model errs. Validation and evaluation draw
    from `held_out`, the task without them.
    """

    width: int = 8
    num_inputs: int = 20
    num_outputs: int = 16
    close_pairs: int = 0

    name: ClassVar[str] = "priority_sort"
    size_name: ClassVar[str] = "inputs"
    eval_sizes: ClassVar[tuple[int, ...]] = (20, 25, 30, 40)

    CLOSE_GAPS: ClassVar[tuple[float, float]] = (1e-4, 1e-2)

    def __post_init__(self) -> None:
        self._check(width=1, num_inputs=1, num_outputs=1, close_pairs=0)
        self._check_range("num_outputs", "num_inputs")
        if 2 * self.close_pairs > self.num_inputs:
            raise ValueError(f"PrioritySortTask.close_pairs={self.close_pairs} needs "
                             f"2 x {self.close_pairs} inputs, more than num_inputs="
                             f"{self.num_inputs}; set close_pairs <= {self.num_inputs // 2}")

    @property
    def input_size(self) -> int:
        return self.width + 2

    @property
    def output_size(self) -> int:
        return self.width

    @property
    def train_size(self) -> int:
        return self.num_inputs

    def with_size(self, size: int) -> PrioritySortTask:
        check_int("size", size, 1)
        outputs = math.floor(size * self.num_outputs / self.num_inputs + 0.5)
        close = min(self.close_pairs, size // 2)
        return dataclasses.replace(self, num_inputs=size, num_outputs=min(size, max(1, outputs)),
                                   close_pairs=close)

    def held_out(self) -> PrioritySortTask:
        """The paper's task: this one without ``close_pairs``."""
        return dataclasses.replace(self, close_pairs=0) if self.close_pairs else self

    def _sample(self, batch_size: int, generator: torch.Generator | None) -> Batch:
        W, B, n, m = self.width, batch_size, self.num_inputs, self.num_outputs
        bits = _random_bits((n, B, W), generator)  # (n, B, W)
        priority = torch.rand(n, B, generator=generator) * 2.0 - 1.0  # U[-1, 1), (n, B)
        if self.close_pairs:
            priority = self._close_pairs(priority, generator)
        T = n + 1 + m
        inputs = torch.zeros(T, B, W + 2)
        inputs[:n, :, :W] = bits
        inputs[:n, :, W] = priority
        inputs[n, :, W + 1] = 1.0
        ranked = priority.argsort(dim=0, descending=True, stable=True)[:m]  # (m, B)
        targets = torch.zeros(T, B, W)
        targets[n + 1 :] = _gather_steps(bits, ranked)
        mask = torch.zeros(T, B, dtype=torch.bool)
        mask[n + 1 :] = True
        return Batch(inputs, targets, mask)

    def _close_pairs(self, priority: Tensor, generator: torch.Generator | None) -> Tensor:
        """``priority`` ``[n, B]`` with ``close_pairs`` inputs per sequence moved next to others."""
        k, B = self.close_pairs, priority.shape[1]
        order = torch.rand(priority.shape, generator=generator).argsort(dim=0)  # a shuffle each
        moved, source = order[:k], order[k : 2 * k]  # (k, B), disjoint
        low, high = (math.log(g) for g in self.CLOSE_GAPS)
        gap = (torch.rand(k, B, generator=generator) * (high - low) + low).exp()
        sign = torch.randint(0, 2, (k, B), generator=generator) * 2.0 - 1.0
        near = priority.gather(0, source)
        sign = torch.where((near + sign * gap).abs() > 1.0, -sign, sign)
        return priority.scatter(0, moved, near + sign * gap)


# The paper's five tasks, then Omniglot episodes (Santoro et al. 2016; `torch_ntm.omniglot`),
# then the DNC paper's graph tasks (Graves et al. 2016; `torch_ntm.graph_tasks`).
TASKS: dict[str, type[Task]] = {
    task.name: task
    for task in (CopyTask, RepeatCopyTask, AssociativeRecallTask, NGramsTask, PrioritySortTask,
                 OmniglotTask, TraversalTask, ShortestPathTask)
}


def make_task(name: str, **params) -> Task:
    """Build a task by its `TASKS` name, e.g. ``make_task("copy", max_length=10)``.

    Raises:
        ValueError: for an unknown name or parameter, or an invalid parameter value.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}")
    cls = TASKS[name]
    valid = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for task {name!r}; "
            f"valid parameters: {', '.join(valid)}"
        )
    return cls(**params)
