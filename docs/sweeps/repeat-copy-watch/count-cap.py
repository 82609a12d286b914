"""Scratch patch of the trainer (not part of the package): a cap on the norm of the count's
input weights, and the validation that chose the shipped repeat copy model (docs/results.md,
"Capping the count's input weights" and "The write head's wrap, and the model shipped since").
Its cap, extra set and ranking are now options of `ntm train` (input_max_norm, eval_pairs,
keep_by, keep_perfect_above), which give the shipped model's weights bitwise (docs/results.md);
it stays here for the runs it made (COLCAP_WARM and COLCAP_FREEZE have no option).

    COLCAP=10.5 COLCAP_RAMP=15000 COLCAP_EXTRA=1 COLCAP_SCORE=len \
        python count-cap.py train repeat_copy ...                 # ntm's own arguments

Each variable is optional; without any, this is `ntm`.

- ``COLCAP``, ``COLCAP_RAMP``, ``COLCAP_COLS``: after every optimizer step, each listed column
  of the LSTM controller's first-layer input weights (`controller.cells[0].weight_ih`; columns
  0-9 are repeat copy's input channels, 9 the count, 10-29 the read vector) is scaled down to
  norm COLCAP where it is above it. The cap starts at the columns' largest norm and falls
  linearly to COLCAP over COLCAP_RAMP training sequences (1: at once; counted after
  COLCAP_WARM). COLCAP_COLS defaults to 9, the count.
- ``COLCAP_WARM``: the first N optimizer steps at rate 0, so that RMSProp's averages fill
  before a fine-tune moves a weight.
- ``COLCAP_FREEZE``: ``NAME:A:B,...``: rows A..B-1 of parameter NAME are put back to their
  first values after every step (e.g. ``head_params.weight:26:92`` the write head's rows).
- ``COLCAP_EXTRA=1``: a generalisation set more, ``val@20r10``: L = 20 with exactly 10 repeats
  (``eval_size_sequences`` sequences of the generalisation seed, ``eval_memory_size`` rows).
- ``COLCAP_SCORE=len`` (with COLCAP_EXTRA): validations are ranked, after the training
  distribution's wrong bits as always, by the wrong data bits at R = 20 (``val@r20``) among
  those at least COLCAP_L20 (0.95) perfect at L = 20, R = 10; below that, 1000 x (1 + the
  shortfall) more. The rank goes in the metrics' ``general_bit_errors``. (The share perfect is
  a float32: 190 of 200 is 0.9499999, just short of 0.95, so in effect more than 190.)
"""
import math
import os
import sys

import torch

from torch_ntm import train as T
from torch_ntm.cli import main

CAP = float(os.environ.get("COLCAP", "inf"))
RAMP = float(os.environ.get("COLCAP_RAMP", "1"))
WARM = int(os.environ.get("COLCAP_WARM", "0"))
COLS = [int(c) for c in os.environ.get("COLCAP_COLS", "9").split(",")]
FREEZE = os.environ.get("COLCAP_FREEZE", "")
SCORE = os.environ.get("COLCAP_SCORE", "")
L20 = float(os.environ.get("COLCAP_L20", "0.95"))

_step = T._Run.train_step


def train_step(self):
    warm = self.state.step < WARM
    if warm:
        rates = [g["lr"] for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"] = 0.0
    _step(self)
    if warm:
        for g, lr in zip(self.optimizer.param_groups, rates):
            g["lr"] = lr
    with torch.no_grad():
        if FREEZE:
            named = dict(self.model.named_parameters())
            if not hasattr(self, "_frozen"):
                self._frozen = {}
                for spec in FREEZE.split(","):
                    name, a, b = spec.split(":")
                    self._frozen[name, int(a), int(b)] = named[name][int(a):int(b)].clone()
                print(f"colcap: frozen {list(self._frozen)}", flush=True)
            for (name, a, b), rows in self._frozen.items():
                named[name][a:b] = rows
        if math.isinf(CAP):
            return
        W = self.model.controller.cells[0].weight_ih
        if not hasattr(self, "_n0"):
            self._n0 = float(W[:, COLS].norm(dim=0).max())
            print(f"colcap: columns {COLS}, initial largest norm {self._n0:.2f}, cap {CAP} "
                  f"over {RAMP:.0f} sequences, warm {WARM}", flush=True)
        frac = min(1.0, max(0, self.state.sequences - WARM) / RAMP)
        cap = max(CAP, self._n0 + (CAP - self._n0) * frac)
        for c in COLS:
            n = float(W[:, c].norm())
            if n > cap:
                W[:, c].mul_(cap / n)


T._Run.train_step = train_step

if os.environ.get("COLCAP_EXTRA"):
    _init = T._Run.__init__

    def init(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        task = self.task.held_out().with_size(20).with_repeats(10)
        self.general_batches["20r10"] = T.fixed_batches(
            task, self.config.eval_size_sequences, 50, seed=T.GENERAL_SEED)

    T._Run.__init__ = init

if SCORE == "len":
    _write, _evaluate = T._Run._write, T._Run._evaluate

    def write(self, split, row):
        _write(self, split, row)
        self._rows[split] = dict(row)

    def evaluate(self):
        self._rows = {}
        metrics, worst = _evaluate(self)
        rows = self._rows
        if "val@20r10" in rows and "val@r20" in rows:
            short = L20 - rows["val@20r10"]["perfect"]
            metrics["general_bit_errors"] = ((0.0 if short <= 0 else 1000.0 * (1 + short))
                                             + rows["val@r20"]["data_bit_errors"])
        return metrics, worst

    T._Run._write, T._Run._evaluate = write, evaluate

sys.exit(main(sys.argv[1:]))
