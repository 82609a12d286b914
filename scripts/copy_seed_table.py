r"""The per-seed table of `ntm train copy --seed S` (docs/results/copy.md, "Time to solve").

    for s in 0 1 2 3 4; do
      TORCH_EXTENSIONS_DIR=$(mktemp -d) /usr/bin/time -f "%e s wall" \
        ntm train copy --seed $s --out runs/copy-s$s > runs/copy-s$s.log 2>&1
    done
    python scripts/copy_seed_table.py runs/copy-s{0,1,2,3,4}

(An empty ``TORCH_EXTENSIONS_DIR``: each run builds the native engine's library, as on a fresh
machine. The table of the compiled engine was made with an empty ``TORCHINDUCTOR_CACHE_DIR``.)

Reads each run's log (the `ntm train` summary line and `/usr/bin/time`'s last line) and
checkpoint, and evaluates the run's model at L = 20 and 120 on the sequences of `ntm evaluate`
and on 100 more drawn from another seed (7), with the run's ``eval_memory_size``. Below the
table, each model's L = 120 score over ten sets of 100 that no validation saw (seeds 2014, 7 and
100-107).
"""

import re
from pathlib import Path

import torch

from torch_ntm.checkpoint import load_checkpoint
from torch_ntm.evaluate import evaluate_sizes


def main(runs: list[str]) -> None:
    torch.set_num_threads(1)
    print("| seed | sequences | training (s) | whole command (s) | L = 20 perfect | L = 120 "
          "perfect | other sequences: L = 20, 120 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    models = []
    for run in map(Path, runs):
        log = Path(f"{run}.log").read_text()
        summary = re.search(r"(converged|stopped \(budget\)) after (\d+) sequences.*?"
                            r"\(([\d.]+) s training in total\)", log)
        wall = re.findall(r"^([\d.]+) s wall$", log, re.M)[-1]
        ckpt = load_checkpoint(run)
        model = ckpt.model(evaluation=True).eval()
        task = ckpt.task()
        own, other = ({r["length"]: round(100 * r["perfect"]) for r in
                       evaluate_sizes(model, task, [20, 120], seed=seed)} for seed in (2014, 7))
        stop = "" if summary.group(1) == "converged" else " (budget)"
        print(f"| {ckpt.config.seed} | {int(summary.group(2)):,}{stop} | {summary.group(3)} | "
              f"{float(wall):.1f} | {own[20]}/100 | {own[120]}/100 | "
              f"{other[20]}/100, {other[120]}/100 |")
        models.append((ckpt.config.seed, model, task))
    print()
    for seed, model, task in models:
        sets = [round(100 * r["perfect"]) for s in (2014, 7, *range(100, 108))
                for r in evaluate_sizes(model, task, [120], seed=s)]
        print(f"seed {seed}: L = 120 perfect on ten sets of 100 (seeds 2014, 7, 100-107): "
              f"{sum(sets)}/1000, lowest set {min(sets)}/100")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run directories, one per seed, each with RUN.log beside it")
    main(parser.parse_args().runs)
