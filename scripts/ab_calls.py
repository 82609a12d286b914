"""Two or more source trees of torch-ntm against each other, call by call, on a machine whose
timings move between processes (a shared VM): each tree's models timed in a process of its own,
the trees in turn, round after round, and each figure the 10th percentile of one process's calls
(the least disturbed), then the median over rounds.

    python scripts/ab_calls.py NAME=SRC [NAME=SRC ...] [--rounds 12] [--core 0]

SRC is a tree's ``src`` folder (a ``git worktree`` of a commit, or this checkout's own). Each
process runs ``NTM``, ``MANN`` and ``DNC`` at ``(9, 8, memory_size=128)`` on the copy task's 41
steps of random input, one thread: a training step (forward, ``sum().backward()``) and an
inference call (``no_grad``), at batch 1 (50 and 100 calls after 5 of warm-up) and 16 (20 and
30). Prints milliseconds a call per tree, and the first tree's time over each other's (above 1:
that tree is faster). docs/speed.md quotes it."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# What each tree's process runs (the tree's torch_ntm first on its path).
_MEASURE = r"""
import json, time, torch
torch.set_num_threads(1)
from torch_ntm import DNC, MANN, NTM

def p10(f, n):
    for _ in range(5):
        f()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 10] * 1e3

def step(model, x):
    y, _ = model(x)
    y.sum().backward()

torch.manual_seed(0)
out = {}
for name, cls in (("NTM", NTM), ("MANN", MANN), ("DNC", DNC)):
    model = cls(9, 8, memory_size=128)
    for batch, (n_train, n_infer) in ((1, (50, 100)), (16, (20, 30))):
        x = torch.rand(41, batch, 9)
        train = p10(lambda: step(model, x), n_train)
        with torch.no_grad():
            infer = p10(lambda: model(x), n_infer)
        out[f"{name} {batch}"] = (train, infer)
print(json.dumps(out))
"""


def _measure(src: str, core: int | None) -> dict:
    env = {**os.environ, "PYTHONPATH": src}
    command = [sys.executable, "-c", _MEASURE]
    if core is not None:
        command = ["taskset", "-c", str(core), *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", metavar="NAME=SRC")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--core", type=int, default=0, help="the core to pin to (-1: none)")
    args = parser.parse_args(argv)
    trees = dict(tree.split("=", 1) for tree in args.trees)
    if len(trees) < 2 or any(not os.path.isdir(src) for src in trees.values()):
        parser.error("give two or more NAME=SRC, each SRC a tree's src folder")
    core = None if args.core < 0 else args.core
    rounds: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, src in trees.items():
            rounds[name].append(_measure(src, core))
    names = list(trees)
    first = names[0]
    print(f"ms a call, training step (inference), the 10th percentile of a process's calls, "
          f"median of {args.rounds} rounds; ratio: {first}'s time over each other tree's")
    print("| model | batch | " + " | ".join(names) + " | "
          + " | ".join(f"{first} / {n}" for n in names[1:]) + " |")
    print("|---|---:|" + "---:|" * (2 * len(names) - 1))
    for key in rounds[first][0]:
        model, batch = key.split()
        med = {n: [statistics.median(r[key][i] for r in rounds[n]) for i in (0, 1)]
               for n in names}
        cells = [f"{med[n][0]:.2f} ({med[n][1]:.2f})" for n in names]
        ratios = [f"{med[first][0] / med[n][0]:.2f} ({med[first][1] / med[n][1]:.2f})"
                  for n in names[1:]]
        print(f"| {model} | {batch} | " + " | ".join(cells + ratios) + " |")


if __name__ == "__main__":
    main()
