"""Figures of a trained run: what goes in and out, where the heads look, memory, learning curves.

`plot_run` writes PNG files (matplotlib's Agg backend, no display needed):

- ``io.png``: input, target and output (sigmoid of the logits) of one sequence;
- ``attention.png``: write and read weightings over time (rows the heads visit);
- ``memory.png``: the memory contents at several moments of that sequence;
- ``learning_curve.png``: training and validation cost and bit errors against sequences seen;
- ``generalisation.png``: bit errors and perfect sequences against task size;
- for a label task (Omniglot) instead: ``accuracy.png``, accuracy against the instance of a
  class (1st .. 10th) on held-out episodes (`torch_ntm.evaluate.evaluate_episodes`);
- for a `DNC`, also ``usage.png`` (memory usage over time, with the write, allocation and free
  gates), ``link.png`` (the temporal link matrix after the last step) and ``read_modes.png`` (each
  read head's backward, content and forward modes over time).

Attention and memory figures are drawn for an `NTM` and a `DNC`; ``io.png`` shows the output as
the task scores it (a sigmoid per bit, or a softmax per label).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from torch_ntm.evaluate import HELD_OUT_EPISODES
from torch_ntm.runlog import read_metrics

__all__ = ["plot_run", "plot_learning_curves"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _visited_rows(weights: torch.Tensor, margin: int = 2, threshold: float = 1e-2) -> torch.Tensor:
    """Indices of the memory rows that receive noticeable weight, as one circular block.

    Heads move circularly, so the visited rows may wrap from N-1 to 0; the block starts after the
    longest circular run of unvisited rows. ``weights``: ``[T, N]``; returns row indices in order.
    """
    n = weights.shape[1]
    visited = (weights > threshold).any(0).tolist()
    if not any(visited) or all(visited):
        return torch.arange(n)
    # The longest circular run of unvisited rows, found on the doubled sequence.
    best_len = best_end = run = 0
    for i, hit in enumerate(visited + visited):
        run = 0 if hit else run + 1
        if run > best_len:
            best_len, best_end = min(run, n), i
    start = (best_end + 1) % n  # first visited row after the gap
    count = n - best_len
    lo = max(0, min(margin, best_len // 2))
    length = min(n, count + 2 * lo)
    return (torch.arange(length) + start - lo) % n


def _used_rows(weights: torch.Tensor, threshold: float = 1e-2) -> torch.Tensor:
    """Indices of the memory rows that ``weights`` (``[..., N]``) ever puts more than
    ``threshold`` on, in order; every row when none. A DNC allocates rows anywhere, so unlike
    `_visited_rows` they need not form one block."""
    hit = (weights.detach().reshape(-1, weights.shape[-1]) > threshold).any(0)
    return hit.nonzero()[:, 0] if hit.any() else torch.arange(weights.shape[-1])


def _integer_axis(axis) -> None:
    """Ticks at whole numbers only (time steps)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _row_axis(ax, rows: torch.Tensor, label: str = "memory row", axis: str = "y") -> None:
    """Label an axis (``"y"`` or ``"x"``) with real memory-row indices (rows may wrap around or
    skip)."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    labels = rows.tolist()
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(MaxNLocator(integer=True, nbins=8))
    target.set_major_formatter(
        FuncFormatter(lambda v, _: str(labels[int(v)]) if 0 <= int(v) < len(labels) else ""))
    target.set_label_text(label)


def _array(t: torch.Tensor):
    """What matplotlib draws: ``t`` as a NumPy array, whether or not it needs a gradient (a
    trace made outside ``no_grad`` does)."""
    return t.detach().cpu().numpy()


def _save(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` as a run's files are written (`atomic_write`: never through a
    link), in the format its suffix names."""
    import io

    from torch_ntm.checkpoint import atomic_write

    path, data = Path(path), io.BytesIO()  # a str too, as the docs pass it
    try:
        fig.savefig(data, dpi=110, format=path.suffix.lstrip(".") or None)
    finally:
        _pyplot().close(fig)
    atomic_write(path, data.getvalue())
    return path


def plot_io(inputs, targets, outputs, mask, path: Path) -> Path:
    """Input, target and output of one sequence (time on the x axis)."""
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(10, 6), sharex=True, layout="constrained")
    masked_out = outputs * mask[:, None]
    for ax, data, title in zip(axes, (inputs, targets, masked_out),
                               ("input", "target", "output (where scored)")):
        ax.imshow(_array(data.T), aspect="auto", cmap="gray_r", vmin=0, vmax=1,
                  interpolation="nearest")
        ax.set_ylabel("channel")
        ax.set_title(title, fontsize=10)
    axes[-1].set_xlabel("time step")
    return _save(fig, path)


def plot_attention(trace, path: Path) -> Path:
    """Write and read weightings of every head over time (the first sequence of the batch)."""
    plt = _pyplot()
    w_write, w_read = trace.write_weights[:, 0], trace.read_weights[:, 0]  # (T, Hw|Hr, N)
    lines = [[(f"{kind} weighting (head {h})", w[:, h]) for h in range(w.shape[1])]
             for kind, w in (("write", w_write), ("read", w_read)) if w.shape[1]]
    panels = sum(lines, [])
    rows = _visited_rows(torch.cat([w for _, w in panels]))
    # One head per panel: beside each other while they fit, else writes above reads.
    grid = [panels] if len(panels) <= 4 else lines
    cols = max(map(len, grid))
    size = 5 if len(grid) == 1 else 3.5
    fig, axes = plt.subplots(len(grid), cols, figsize=(size * cols, size * len(grid)),
                             squeeze=False, layout="constrained")
    for ax_line, line in zip(axes, grid):
        for ax in ax_line[len(line):]:
            ax.axis("off")
        for ax, (title, w) in zip(ax_line, line):
            im = ax.imshow(_array(w[:, rows].T), aspect="auto", cmap="viridis", vmin=0,
                           vmax=1, origin="lower", interpolation="nearest")
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("time step")
            _row_axis(ax, rows)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="weight")
    return _save(fig, path)


def plot_memory(trace, path: Path, snapshots: int = 4) -> Path:
    """Memory rows in use at ``snapshots`` evenly spaced time steps."""
    plt = _pyplot()
    memory = trace.memory[:, 0]  # (T, N, M)
    weights = (trace.write_weights[:, 0, 0] if trace.write_weights.shape[2]
               else trace.read_weights[:, 0, 0])
    rows = _visited_rows(weights)
    steps = sorted({round(i * (memory.shape[0] - 1) / (snapshots - 1)) for i in range(snapshots)})
    lim = float(memory[:, rows].detach().abs().max()) or 1.0
    fig, axes = plt.subplots(1, len(steps), figsize=(3.2 * len(steps), 4.5), squeeze=False,
                             layout="constrained")
    for ax, t in zip(axes[0], steps):
        im = ax.imshow(_array(memory[t, rows]), aspect="auto", cmap="RdBu_r", vmin=-lim,
                       vmax=lim, origin="lower", interpolation="nearest")
        ax.set_title(f"memory after step {t}", fontsize=10)
        ax.set_xlabel("column")
        _row_axis(ax, rows)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="value")
    return _save(fig, path)


def plot_usage(trace, path: Path) -> Path:
    """A `DNC`'s memory usage over time (the rows ever in use or written; the usage each step's
    allocation saw, before its write) above its gates: each write head's write and allocation
    gates and each read head's free gate (the first sequence of the batch)."""
    plt = _pyplot()
    usage, writes = trace.usage[:, 0], trace.write_weights[:, 0]  # (T, N), (T, Hw, N)
    rows = _used_rows(torch.cat([usage, writes.flatten(0, 1)]))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=(2, 1),
                                      layout="constrained")
    im = top.imshow(_array(usage[:, rows].T), aspect="auto", cmap="viridis", vmin=0, vmax=1,
                    origin="lower", interpolation="nearest")
    top.set_title("usage (before each step's write)", fontsize=10)
    _row_axis(top, rows)
    fig.colorbar(im, ax=top, shrink=0.8, label="usage")
    gates = [(f"write gate (write head {h})", trace.write_gates[:, 0, h])
             for h in range(trace.write_gates.shape[2])]
    gates += [(f"allocation gate (write head {h})", trace.allocation_gates[:, 0, h])
              for h in range(trace.allocation_gates.shape[2])]
    gates += [(f"free gate (read head {r})", trace.free_gates[:, 0, r])
              for r in range(trace.free_gates.shape[2])]
    for label, gate in gates:
        bottom.plot(_array(gate), label=label, linewidth=1.2)
    bottom.set_ylim(-0.02, 1.02)
    bottom.set_ylabel("gate")
    bottom.set_xlabel("time step")
    _integer_axis(bottom.xaxis)
    bottom.legend(fontsize=7, ncol=2, loc="upper right")
    return _save(fig, path)


def plot_link(trace, path: Path) -> Path:
    """A `DNC`'s temporal link matrix after the last step, one panel per write head, over the
    rows it wrote: entry (i, j) is how much row i was written right after row j."""
    plt = _pyplot()
    link = trace.link[-1, 0]  # (Hw, N, N)
    heads, last = link.shape[0], trace.link.shape[0] - 1
    fig, axes = plt.subplots(1, heads, figsize=(5.5 * heads, 5), squeeze=False,
                             layout="constrained")
    for h, ax in enumerate(axes[0]):
        rows = _used_rows(trace.write_weights[:, 0, h])
        im = ax.imshow(_array(link[h][rows][:, rows]), cmap="viridis", vmin=0, vmax=1,
                       origin="lower", interpolation="nearest")
        ax.set_title(f"link matrix after step {last} (write head {h})", fontsize=10)
        _row_axis(ax, rows, "row i, written after")
        _row_axis(ax, rows, "row j, written before", axis="x")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="link")
    return _save(fig, path)


def _read_mode_names(write_heads: int) -> list[str]:
    """The names of a `DNC` read head's modes, in `DNCTrace.read_modes`' order: backward per
    write head, content, forward per write head."""
    if write_heads == 1:
        return ["backward", "content", "forward"]
    return ([f"backward {h}" for h in range(write_heads)] + ["content"]
            + [f"forward {h}" for h in range(write_heads)])


def plot_read_modes(trace, path: Path) -> Path:
    """Each `DNC` read head's modes over time (the first sequence of the batch): how much of its
    weighting follows the link matrix backward or forward, and how much is content lookup."""
    plt = _pyplot()
    modes = trace.read_modes[:, 0]  # (T, R, 2 Hw + 1)
    heads, names = modes.shape[1], _read_mode_names((modes.shape[2] - 1) // 2)
    fig, axes = plt.subplots(heads, 1, figsize=(9, 1.2 + 0.45 * len(names) * heads),
                             sharex=True, squeeze=False, layout="constrained")
    for r, ax in enumerate(axes[:, 0]):
        im = ax.imshow(_array(modes[:, r].T), aspect="auto", cmap="viridis", vmin=0, vmax=1,
                       interpolation="nearest")
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_title(f"read modes (read head {r})", fontsize=10)
    axes[-1, 0].set_xlabel("time step")
    _integer_axis(axes[-1, 0].xaxis)
    fig.colorbar(im, ax=axes[:, 0].tolist(), shrink=0.8, label="weight")
    return _save(fig, path)


_BIT_LABELS = ("cost (bits per sequence)", "bit errors per sequence")
_LABEL_LABELS = ("cross-entropy (bits per episode)", "wrong labels per episode")


def _curve_axes(curves, path: Path, ylabels: tuple[str, str] = _BIT_LABELS) -> Path:
    """Cost and bit errors against sequences seen; ``curves``: ``(label, style, rows)``."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for label, style, rows in curves:
        part = [r for r in rows if r["cost_bits"]]
        seqs = [int(r["sequences"]) for r in part]
        for ax, key in zip(axes, ("cost_bits", "bit_errors")):
            ax.plot(seqs, [float(r[key]) for r in part], style, label=label, markersize=3)
    for ax, label in zip(axes, ylabels):
        ax.set_xlabel("sequences seen")
        ax.set_ylabel(label)
        ax.set_yscale("symlog", linthresh=0.1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_learning_curve(metrics_csv: Path, path: Path, labels: bool = False) -> Path | None:
    """Training and validation curves of one run (``labels``: of a label task)."""
    rows = read_metrics(metrics_csv)
    if not rows:
        return None
    return _curve_axes([(split, style, [r for r in rows if r["split"] == split])
                        for split, style in (("train", "-"), ("val", "o-"))], path,
                       _LABEL_LABELS if labels else _BIT_LABELS)


def plot_learning_curves(runs: dict, path: str | os.PathLike, split: str = "val") -> Path:
    """Several runs' ``split`` curves on the same axes (e.g. NTM against the LSTM baseline).

    Args:
        runs: label -> run directory.
        path: the PNG file to write.
        split: ``"val"`` (fixed validation set) or ``"train"`` (running training averages).
    """
    curves = []
    for label, run_dir in runs.items():
        rows = read_metrics(Path(run_dir) / "metrics.csv", split)
        if not rows:
            from torch_ntm.checkpoint import CheckpointError

            why = ("not a run directory?" if not (Path(run_dir) / "metrics.csv").exists() else
                   "none logged yet: a run writes its first at eval_every (val) or log_every "
                   "(train) steps")
            raise CheckpointError(f"{run_dir}: no {split} rows in metrics.csv ({why})")
        curves.append((label, "-" if split == "train" else ".-", rows))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)  # the user's own choice of file
    return _curve_axes(curves, path)


def plot_generalisation(rows: list[dict], size_name: str, train_size: int, path: Path) -> Path:
    plt = _pyplot()
    sizes = [r[size_name] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    errors = [r["bit_errors"] for r in rows]
    ax.plot(sizes, errors, "o-", label="bit errors per sequence")
    # At least 0-1 bits (none at all is not a scale of +-0.04), zero level with the right axis's
    top = max(1.0, max(errors, default=0.0))
    ax.set_ylim(-0.05 * top, 1.05 * top)
    ax2 = ax.twinx()
    ax2.plot(sizes, [r["perfect"] for r in rows], "s--", color="tab:green",
             label="perfect sequences (fraction)")
    ax2.set_ylim(-0.05, 1.05)
    ax.axvline(train_size, color="gray", linestyle=":", label=f"largest training {size_name}")
    ax.set_xlabel(size_name)
    ax.set_ylabel("bit errors per sequence")
    ax2.set_ylabel("perfect fraction")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    # below the axes, where no line runs
    fig.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, ncols=2,
               loc="outside lower center")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_accuracy(accuracy: dict[int, float], episodes: int, path: Path) -> Path:
    """Accuracy against the instance of a class (Santoro et al. 2016, figure 3)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    instances = sorted(accuracy)
    ax.plot(instances, [accuracy[k] for k in instances], "o-")
    ax.set_xticks(instances)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("instance of the class in the episode")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{episodes} held-out episodes", fontsize=10)
    ax.grid(alpha=0.3)
    return _save(fig, path)


@torch.no_grad()
def plot_run(run_or_checkpoint: str | os.PathLike, out_dir: str | os.PathLike | None = None,
             size: int | None = None, memory_size: int | None = None, seed: int = 0,
             episodes: int = HELD_OUT_EPISODES) -> list[Path]:
    """Write the figures of a run (or checkpoint) into ``out_dir`` (default ``RUN/figures``; for
    a shipped model, ``figures-NAME`` in the working directory, never the installed package):
    one example sequence (drawn with ``seed`` from the task's held-out data, `Task.held_out`, as
    evaluation's are), and a label task's accuracy figure scores ``episodes`` held-out episodes."""
    from torch_ntm import pretrained
    from torch_ntm.checkpoint import find_checkpoint, load_checkpoint, own_folder
    from torch_ntm.dnc import DNC
    from torch_ntm.evaluate import (
        EVAL_SEED,
        evaluate_episodes,
        evaluate_sizes,
        task_objective,
    )
    from torch_ntm.model import NTM

    json_path = find_checkpoint(run_or_checkpoint)
    ckpt = load_checkpoint(json_path)
    task = ckpt.task()
    size = size or task.train_size
    # The rows it runs with: those asked for; beyond the training size the run's generalisation
    # memory (eval_memory_size), as `ntm evaluate` has it (a repeat copy model trained with 64
    # rows holds L = 20 only with its 128); else those it trained with. Built before the
    # folder is made: a model that cannot be built leaves none.
    overrides = {} if memory_size is None else {"memory_size": memory_size}
    model = ckpt.model(evaluation=size > task.train_size, **overrides).eval()
    if out_dir is not None:  # the user's choice of folder (a link to one too)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
    elif json_path.parent.parent.resolve() == pretrained.ROOT.resolve():
        out = own_folder(f"figures-{json_path.parent.name}")
    else:
        out = own_folder(json_path.parent / "figures")  # never through a link planted in a run
    example_task = task.held_out().with_size(size)  # as evaluation draws
    batch = example_task.sample(1, generator=torch.Generator().manual_seed(seed))
    paths = []
    if isinstance(model, (NTM, DNC)):  # their traces' weightings and memory
        logits, _, trace = model.trace(batch.inputs)
        paths.append(plot_attention(trace, out / "attention.png"))
        paths.append(plot_memory(trace, out / "memory.png"))
        if isinstance(model, DNC):  # what only a DNC has: usage and gates, links, read modes
            paths.append(plot_usage(trace, out / "usage.png"))
            paths.append(plot_link(trace, out / "link.png"))
            paths.append(plot_read_modes(trace, out / "read_modes.png"))
    else:
        logits, _ = model(batch.inputs)
    probabilities = task_objective(task).probabilities(logits[:, 0])
    paths.insert(0, plot_io(batch.inputs[:, 0], batch.targets[:, 0], probabilities,
                            batch.mask[:, 0].float(), out / "io.png"))
    curve = plot_learning_curve(json_path.parent / "metrics.csv", out / "learning_curve.png",
                                labels=task.label_task)
    if curve is not None:
        paths.append(curve)
    if memory_size is None and ckpt.config.eval_overrides():  # the run's generalisation memory
        model = ckpt.model(evaluation=True).eval()
    if task.label_task:  # no sizes to generalise to: accuracy by instance, as `ntm evaluate` has it
        row = evaluate_episodes(model, task, episodes, seed=EVAL_SEED)
        paths.append(plot_accuracy(row["accuracy_by_instance"], row["sequences"],
                                   out / "accuracy.png"))
        return paths
    rows = evaluate_sizes(model, task, task.eval_sizes, num_sequences=50)
    paths.append(plot_generalisation(rows, task.size_name, task.train_size,
                                     out / "generalisation.png"))
    return paths
