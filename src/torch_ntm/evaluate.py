"""Evaluation: the paper's metrics on fixed, seeded sets of sequences, at any task size; for
label tasks (Omniglot), accuracy by instance on held-out episodes (`evaluate_episodes`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

import torch
from torch import nn

from torch_ntm.metrics import objective

__all__ = ["evaluate_batches", "evaluate_sizes", "evaluate_episodes", "format_table",
           "summarise_sets", "task_objective"]

EVAL_SEED = 2014  # evaluation sets are drawn from their own generator, never the training one
# Held-out episodes a label task is scored on (`ntm evaluate`, the end of `ntm train`, `ntm plot`)
HELD_OUT_EPISODES = 1000


def task_objective(task):
    """`torch_ntm.metrics.objective` for ``task`` (None: the bit tasks' BCE)."""
    if task is None:
        return objective()
    return objective(task.loss, task.label_groups)


@torch.no_grad()
def evaluate_batches(model: nn.Module, batches: Iterable[tuple]) -> dict:
    """Mean cost (bits/sequence), bit errors/sequence and fraction of perfect sequences.

    For a label task (``task.loss == "cross_entropy"``) the same keys hold its scores: the
    cross-entropy in bits per sequence, wrong labels per sequence and the fraction of sequences
    without one; the task's `extra_scores` (Omniglot: ``accuracy_k``) are added, averaged over
    the sequences.

    Args:
        model: maps inputs to ``(logits, state)``: time-major ``[T, B, I]`` to ``[T, B, O]``,
            or batch first if it has ``batch_first`` set (an NTM, a MANN or the LSTM
            baseline built so); the batches are turned to its layout and back.
        batches: ``(batch, task)`` pairs, as `fixed_batches` makes them: a time-major
            `torch_ntm.tasks.Batch` and the task that drew it, which says how to score it and
            gives its reference cost beside the model's.

    Raises:
        ValueError: ``batches`` is empty.
    """
    was_training = model.training
    model.eval()
    costs, errors, refs, extras = [], [], [], {}
    device = next(model.parameters()).device
    for batch, task in batches:
        inputs, targets, mask = (t.to(device) for t in batch)
        if getattr(model, "batch_first", False):  # it read a [T, B, I] batch as [B, T, I]
            logits = model(inputs.transpose(0, 1))[0].transpose(0, 1)
        else:
            logits, _ = model(inputs)
        score = task_objective(task)
        costs.append(score.loss(logits, targets, mask).cpu() / math.log(2))
        errors.append(score.errors(logits, targets, mask).cpu())
        ref = task.reference_cost(batch)
        if ref is not None:
            refs.append(ref.cpu())
        for key, value in task.extra_scores(logits, targets, mask).items():
            extras.setdefault(key, []).append((value, targets.shape[1]))
    model.train(was_training)
    if not costs:
        raise ValueError("evaluate_batches: no batches to evaluate")
    cost, err = torch.cat(costs), torch.cat(errors)
    out = {
        "sequences": int(cost.numel()),
        "cost_bits": float(cost.mean()),
        "bit_errors": float(err.mean()),
        "perfect": float((err == 0).float().mean()),
    }
    if refs:
        out["reference_cost_bits"] = float(torch.cat(refs).mean())
    for key, parts in extras.items():  # weighted by the sequences of each batch
        out[key] = sum(v * n for v, n in parts) / sum(n for _, n in parts)
    return out


def fixed_batches(task, num_sequences: int, batch_size: int, seed: int = EVAL_SEED) -> list:
    """``num_sequences`` sequences from ``task`` in batches, the same for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    batches, left = [], num_sequences
    while left > 0:
        n = min(batch_size, left)
        batches.append((task.sample(n, generator=generator), task))
        left -= n
    return batches


def evaluate_sizes(model: nn.Module, task, sizes, num_sequences: int = 100,
                   batch_size: int = 50, seed: int = EVAL_SEED) -> list[dict]:
    """Evaluate at each task size (e.g. copy lengths) on the task's held-out data
    (`Task.held_out`); one row per size."""
    rows = []
    held_out = task.held_out()
    for size in sizes:
        sized = held_out.with_size(int(size))
        row = evaluate_batches(model, fixed_batches(sized, num_sequences, batch_size, seed))
        rows.append({task.size_name: int(size), **row})
    return rows


def evaluate_episodes(model: nn.Module, task, num_sequences: int = HELD_OUT_EPISODES,
                      batch_size: int = 100, seed: int = EVAL_SEED) -> dict:
    """A label task's scores on ``num_sequences`` held-out episodes (`Task.held_out`: Omniglot's
    test split) drawn from ``seed``: `evaluate_batches`' keys, and ``accuracy_by_instance``,
    ``{k: accuracy at the k-th instance of a class}`` for k = 1 .. instances."""
    held_out = task.held_out()
    row = evaluate_batches(model, fixed_batches(held_out, num_sequences, batch_size, seed))
    names = held_out.extra_metrics
    accuracy = {int(name.rpartition("_")[2]): row.pop(name) for name in names}
    return {**row, "accuracy_by_instance": accuracy}


def summarise_sets(sets: list[dict], keys: Iterable[str]) -> dict[str, dict]:
    """The mean, min and max of each of ``keys`` over ``sets`` (rows scored on independent
    held-out sets, one per seed): ``{"mean": {key: value}, "min": ..., "max": ...}``."""
    keys = list(keys)
    return {name: {k: fold([s[k] for s in sets]) for k in keys}
            for name, fold in (("mean", statistics.fmean), ("min", min), ("max", max))}


def format_table(rows: list[dict]) -> str:
    """A plain-text table of rows (dicts with the keys of the first, e.g. `evaluate_sizes`'),
    one column per key."""
    if not rows:
        return ""
    keys = list(rows[0])
    cells = [[_fmt(row.get(k)) for k in keys] for row in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return str(value)
