"""Each task's paper-level criterion, measured on fresh held-out data: whether a run reproduces
the paper's result, as the results pages report it over seeds (``ntm sweep TASK --criterion``).

A criterion is one score (`evaluate_sizes`' columns, the task's extra scores included, or the
score relative to the Bayes-optimal cost) at one or more sizes, a bound it must meet (or none:
a figure reported beside the bounded ones), and for repeat copy the number of repeats. A run
is scored on `SETS` independent sets of `SEQUENCES` held-out sequences each
(`torch_ntm.tasks.Task.held_out`, one seed a set); at several sizes a set counts its worst
size. The report is the mean over the sets, their lowest and highest, and whether the mean
meets the bound.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CRITERIA", "Criterion", "SEQUENCES", "SETS", "format_criteria", "measure"]

SETS = (101, 102, 103)  # the seeds of the sets: never a training's or a validation's data
SEQUENCES = 1000


@dataclass(frozen=True)
class Criterion:
    """``metric`` at ``sizes`` (the worst of them) must be at least ``at_least`` or at most
    ``at_most`` (neither: reported only); ``relative_to``: the score is ``metric /
    row[relative_to] - 1`` (the excess over the Bayes-optimal cost); ``repeats``: repeat copy's
    count for the evaluation."""

    label: str
    sizes: tuple[int, ...]
    metric: str
    at_least: float | None = None
    at_most: float | None = None
    repeats: int | None = None
    relative_to: str | None = None

    def value(self, row: dict) -> float:
        """The score of one evaluation row (`evaluate_sizes`)."""
        if self.relative_to is None:
            return row[self.metric]
        return row[self.metric] / row[self.relative_to] - 1

    def worst(self, values: list[float]) -> float:
        return max(values) if self.at_most is not None else min(values)

    @property
    def bounded(self) -> bool:
        """Whether it has a bound to meet (else it is a figure reported beside the others)."""
        return self.at_least is not None or self.at_most is not None

    def met(self, value: float) -> bool | None:
        """Whether ``value`` meets the bound; None for a figure that is only reported."""
        if self.at_least is not None:
            return value >= self.at_least
        return value <= self.at_most if self.bounded else None

    @property
    def bound(self) -> str:
        if self.at_least is not None:
            return f">= {self.at_least:g}"
        return "reported" if self.at_most is None else f"<= {self.at_most:g}"


# The paper's results as bounds (issue 58); the tasks without one here are reported by cost.
CRITERIA: dict[str, tuple[Criterion, ...]] = {
    "copy": (Criterion("wrong bits per sequence at L = 120", (120,), "bit_errors", at_most=0.0),),
    "repeat_copy": (
        Criterion("perfect at L = 20, R = 10", (20,), "perfect", at_least=0.9, repeats=10),
        Criterion("wrong data bits per sequence at L = 10, R = 20", (10,), "data_bit_errors",
                  at_most=1.0, repeats=20)),
    "associative_recall": (Criterion("perfect at 12 items", (12,), "perfect", at_least=0.9),),
    "ngrams": (Criterion("cost above the Bayes-optimal, relative, at length 200", (200,),
                         "cost_bits", at_most=0.01, relative_to="reference_cost_bits"),),
    "priority_sort": (
        Criterion("cost in bits per sequence at 20 inputs", (20,), "cost_bits", at_most=18.0),
        Criterion("perfect at 20 inputs", (20,), "perfect")),
    "traversal": (Criterion("queries right at 3, 5 and 10 nodes (the worst)", (3, 5, 10),
                            "queries_right", at_least=0.9),),
}


def _evaluations(run: str | Path, criterion: Criterion, sets, sequences: int) -> list:
    """The evaluation rows (`evaluate_sizes`) of ``run``'s kept weights (with its generalisation
    memory, as `ntm evaluate` runs it) at ``criterion``'s sizes and repeats, one list per set."""
    from torch_ntm.checkpoint import load_checkpoint
    from torch_ntm.evaluate import evaluate_sizes

    ckpt = load_checkpoint(run)
    model, task = ckpt.model(evaluation=True).eval(), ckpt.task()
    if criterion.repeats is not None:
        task = task.with_repeats(criterion.repeats)
    return [evaluate_sizes(model, task, criterion.sizes, num_sequences=sequences, seed=seed)
            for seed in sets]


def measure(run: str | Path, criterion: Criterion, sets=SETS, sequences: int = SEQUENCES,
            evaluations: list | None = None) -> dict:
    """``criterion`` on the kept weights of ``run`` (with its generalisation memory, as `ntm
    evaluate` runs it): ``{"mean", "min", "max", "met", "sets"}``, ``sets`` the value of each.
    ``evaluations``: the rows `_evaluations` gives for them, if already computed."""
    if evaluations is None:
        evaluations = _evaluations(run, criterion, sets, sequences)
    values = [criterion.worst([criterion.value(row) for row in rows]) for rows in evaluations]
    mean = statistics.fmean(values)
    return {"mean": mean, "min": min(values), "max": max(values), "met": criterion.met(mean),
            "sets": values}


def format_criteria(task: str, runs: dict[int, Path], sets=SETS,
                    sequences: int = SEQUENCES) -> str:
    """The criterion table of ``task``'s runs by seed: for each criterion, each seed's mean over
    the sets (lowest-highest) and whether it meets the bound, then how many seeds do. Criteria
    at the same sizes and repeats (priority sort's cost and perfect fraction) share one
    evaluation of each run."""
    lines, evaluated = [], {}
    for criterion in CRITERIA[task]:
        lines.append(f"{criterion.label} ({criterion.bound}), mean of {len(sets)} sets of "
                     f"{sequences:,} (lowest-highest):")
        met = 0
        for seed, run in runs.items():
            key = (run, criterion.sizes, criterion.repeats)
            if key not in evaluated:
                evaluated[key] = _evaluations(run, criterion, sets, sequences)
            m = measure(run, criterion, sets, sequences, evaluated[key])
            met += bool(m["met"])
            verdict = {True: "  meets it", False: "  does not", None: ""}[m["met"]]
            lines.append(f"  seed {seed}: {m['mean']:.4g} ({m['min']:.4g}-{m['max']:.4g})"
                         f"{verdict}")
        if criterion.bounded:
            lines.append(f"  {met} of {len(runs)} seeds meet it")
    return "\n".join(lines)
