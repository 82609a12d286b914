"""The scratch patch these runs trained under (not part of the package; `ntm train --set
eval_repeats=15,20` now scores the same kind of sets, and ranks on them): `ntm train`, with
every validation that has the training distribution solved also scoring the weights at L = 10
with R = 15 and 20 (100 sequences each, seed 4242; wrong data bits per sequence), appended to
RUN.probe.jsonl; weights with fewer than 40 at R = 20 saved beside it.

    python watch.py train repeat_copy --preset ntm-lstm-paper --seed S \
        --set max_sequences=200000 --out RUN
"""
import json
import sys
from pathlib import Path

import torch

from torch_ntm import train as T
from torch_ntm.cli import main
from torch_ntm.evaluate import evaluate_batches, fixed_batches

flag = "--out" if "--out" in sys.argv else "--resume"
out = Path(sys.argv[sys.argv.index(flag) + 1])
probe = {}
orig = T._Run._evaluate

def _evaluate(self):
    metrics, worst = orig(self)
    if "general_bit_errors" in metrics:
        if not probe:
            held = self.task.held_out().with_size(10)
            for r in (15, 20):
                probe[r] = fixed_batches(held.with_repeats(r), 100, 50, seed=4242)
        row = {"seq": self.state.sequences, "val": metrics["bit_errors"],
               "gen": metrics["general_bit_errors"]}
        for r, b in probe.items():
            m = evaluate_batches(self.model, b)
            row[f"R{r}"] = m["data_bit_errors"]
        with open(out.with_suffix(".probe.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        if row["R20"] < 40:
            torch.save(self.model.state_dict(), f"{out}.w{self.state.sequences}.pt")
    return metrics, worst

T._Run._evaluate = _evaluate
sys.exit(main(sys.argv[1:]))
