"""Plot the diagnostics of `plain_loop.py` runs over a window of sequences, one column per run.

    python scripts/stability_figure.py RUN_A/seed-1.csv RUN_B/seed-1.csv --labels "clip 10;clip 1" \
        --window 11000:13600 --out docs/figures/stability-collapse.png
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [
    ("cost_bits", "training cost (bits/seq)", True),
    ("grad_norm", "gradient norm (before clipping)", True),
    ("update_ratio", "|update| / |weights|", True),
    ("read_gamma_max", "largest gamma (read, write)", False),
]


def _rows(path: Path, window: tuple[int, int]) -> tuple[list[dict], list[dict]]:
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if window[0] <= int(r["sequences"]) <= window[1]]
    return [r for r in rows if r["split"] == "train"], [r for r in rows if r["split"] == "val"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("csv", type=Path, nargs="+")
    p.add_argument("--labels", default=None, help="one per CSV, separated by ;")
    p.add_argument("--window", default="0:1000000000")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    window = tuple(int(v) for v in args.window.split(":"))
    labels = args.labels.split(";") if args.labels else [str(c) for c in args.csv]
    fig, axes = plt.subplots(len(PANELS), len(args.csv), figsize=(5 * len(args.csv), 9),
                             sharex="col", sharey="row", squeeze=False)
    for col, (path, label) in enumerate(zip(args.csv, labels)):
        train, val = _rows(path, window)
        x = [int(r["sequences"]) for r in train]
        for row, (key, title, log) in enumerate(PANELS):
            ax = axes[row][col]
            ax.plot(x, [float(r[key]) for r in train], ".-", ms=2, lw=0.6)
            if key == "read_gamma_max":
                ax.plot(x, [float(r["write_gamma_max"]) for r in train], ".-", ms=2, lw=0.6)
            if key == "cost_bits":
                ax.plot([int(r["sequences"]) for r in val], [float(r["bit_errors"]) for r in val],
                        "o", color="C3", label="validation wrong bits/seq")
                ax.legend(fontsize=7)
            if log:
                ax.set_yscale("log")
            ax.set_ylabel(title, fontsize=8)
            if row == 0:
                ax.set_title(label, fontsize=9)
        axes[-1][col].set_xlabel("sequences")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
