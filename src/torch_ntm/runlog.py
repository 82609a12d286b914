"""A run's ``metrics.csv``: the one writer (training) and the one reader (plots, sweeps, tests).

Columns (`FIELDS`): ``step`` (optimizer steps), ``sequences`` (training sequences seen),
``elapsed_s`` (training seconds), ``split``, ``cost_bits``, ``bit_errors`` (both per sequence)
and ``perfect`` (fraction of sequences without a wrong bit). The splits:

- ``train``: averages over the training batches since the previous ``train`` row;
- ``val``: the fixed validation set from the training distribution;
- ``val@SIZE``: a generalisation set at task size ``SIZE`` (``eval_sizes``);
- ``val@rR``: one at ``R`` repeats and the longest training length (``eval_repeats``);
- ``val@LrR``: one at length ``L`` and ``R`` repeats (``eval_pairs``);
- ``rollback``: the best validation's metrics, put back after a later one fell apart.
- ``curriculum@SIZE``: no values; from this step on the curriculum trains on sizes up to
  ``SIZE`` (``curriculum_start``).

A task with `extra_metrics` (Omniglot: ``accuracy_1`` .. ``accuracy_10``, accuracy at the k-th
instance of a class) adds them as columns after these, filled on its validation rows.

TensorBoard gets the same numbers (``SPLIT/KEY`` against sequences) under ``tb/``.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

__all__ = ["FIELDS", "MetricsLog", "read_metrics"]

FIELDS = ["step", "sequences", "elapsed_s", "split", "cost_bits", "bit_errors", "perfect"]
# The most a metrics.csv may hold (a row is about 80 bytes: millions of rows)
MAX_METRICS_BYTES = 1 << 30
_VALUES = FIELDS[4:]


def read_metrics(path: str | os.PathLike, split: str | None = None) -> list[dict]:
    """The rows of a ``metrics.csv`` as dicts of strings ([] if the file does not exist), only
    those of ``split`` if given.

    Raises:
        CheckpointError: the file is not UTF-8 text with a header naming ``step`` and ``split``,
            or a row's ``step`` or ``sequences`` is not an integer, or another of its numbers
            not a number (an empty cell is none).
    """
    from torch_ntm.runfiles import CheckpointError, read_own

    path = Path(path)
    try:  # a regular file of the run's, not a link, of a bounded size
        text = read_own(path, MAX_METRICS_BYTES, "metrics.csv").decode("utf-8")
    except FileNotFoundError:
        return []
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not a readable metrics file ({e})") from None
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        rows = list(reader)
    except csv.Error as e:
        raise CheckpointError(f"{path}: not a readable metrics file ({e})") from None
    if reader.fieldnames is None:
        return []  # empty: not a row written yet
    if not {"step", "split"} <= set(reader.fieldnames):
        raise CheckpointError(f"{path}: not a metrics file (no step and split columns)")
    numbers = [k for k in reader.fieldnames if k not in ("step", "sequences", "split")]
    for number, row in enumerate(rows, 2):
        for key in ("step", "sequences"):
            if key in row and not (row[key] or "").isdigit():
                raise CheckpointError(f"{path}: row {number} has {key} {row[key]!r}, not an "
                                      f"integer; correct or delete that row")
        for key in numbers:
            if row[key] and not _is_number(row[key]):
                raise CheckpointError(f"{path}: row {number} has {key} {row[key]!r}, not a "
                                      f"number; correct or delete that row")
    return rows if split is None else [r for r in rows if r["split"] == split]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _quiet_tensorboard_threads() -> None:
    """Leave the errors of TensorBoard's writer thread (a folder it may not write, a full disk)
    to the main thread, which TensorBoard raises them in at its next write or flush (the
    command line's one line), instead of also printing the thread's traceback."""
    import threading

    previous = threading.excepthook
    if getattr(previous, "tensorboard_quiet", False):
        return

    def hook(args) -> None:
        if type(args.thread).__name__ != "_AsyncWriterThread":
            previous(args)

    hook.tensorboard_quiet = True
    threading.excepthook = hook


class MetricsLog:
    """Appends rows to ``run_dir/metrics.csv`` and TensorBoard.

    Opened for a resume (``resume_at``: the step and the sequences of the checkpoint it resumes
    from), it first drops the rows after that step (written after the checkpoint), rewriting the
    file atomically: a kill keeps the old rows; and TensorBoard drops its points after those
    sequences (its x axis). TensorBoard is optional at run time; the CSV is always written.
    """

    def __init__(self, run_dir: Path, extra_fields: tuple[str, ...] = (),
                 resume_at: tuple[int, int] | None = None):
        from torch_ntm.runfiles import atomic_write, own_folder

        self.path = run_dir / "metrics.csv"
        self.fields = [*FIELDS, *extra_fields]
        self.values = [*_VALUES, *extra_fields]
        rows = []
        if resume_at is not None:
            rows = [r for r in read_metrics(self.path) if int(r["step"]) <= resume_at[0]]
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, self.fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(self.path, text.getvalue().encode())
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            # Points are logged at their sequence count, so the purge counts sequences (by the
            # step, every resume wiped the points from that many sequences on: most of them).
            purge = None if resume_at is None else resume_at[1] + 1
            _quiet_tensorboard_threads()
            self.tb = SummaryWriter(str(own_folder(run_dir / "tb")), purge_step=purge)
        except ImportError:
            pass

    def write(self, step: int, sequences: int, elapsed: float, split: str, values: dict) -> None:
        """One row; ``values`` holds some of ``cost_bits``, ``bit_errors``, ``perfect`` (and of
        the extra fields)."""
        row = {"step": step, "sequences": sequences, "elapsed_s": f"{elapsed:.3f}",
               "split": split, **{k: f"{values[k]:.6g}" for k in self.values if k in values}}
        from torch_ntm.runfiles import open_own

        text = io.StringIO(newline="")
        csv.DictWriter(text, self.fields).writerow(row)
        with open_own(self.path) as f:
            f.write(text.getvalue().encode())
        if self.tb is not None:
            for key in self.values:
                if key in values:
                    self.tb.add_scalar(f"{split}/{key}", values[key], sequences)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
