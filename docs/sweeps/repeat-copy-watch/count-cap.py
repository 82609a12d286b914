"""Scratch patch of the trainer (not part of the package): a cap on the norm of the count's
input weights (docs/results.md, "Capping the count's input weights").

    COLCAP=6 COLCAP_RAMP=1 COLCAP_COLS=9 python count-cap.py train repeat_copy ...   # ntm's arguments

After every optimizer step, each listed column of the LSTM controller's first-layer input
weights (`controller.cells[0].weight_ih`; columns 0-9 are repeat copy's input channels, 9 the
count, 10-29 the read vector) is scaled down to norm COLCAP where it is above it. The cap starts
at the columns' largest norm and falls linearly to COLCAP over COLCAP_RAMP training sequences
(1: at once). COLCAP_COLS defaults to 9, the count.
"""
import os, sys, torch
from torch_ntm import train as T
from torch_ntm.cli import main
CAP, RAMP = float(os.environ["COLCAP"]), float(os.environ["COLCAP_RAMP"])
COLS = [int(c) for c in os.environ.get("COLCAP_COLS", "9").split(",")]
orig = T._Run.train_step
def step(self):
    orig(self)
    W = self.model.controller.cells[0].weight_ih
    with torch.no_grad():
        if not hasattr(self, "_n0"):
            self._n0 = float(W[:, COLS].norm(dim=0).max())
            print(f"colcap: columns {COLS}, initial largest norm {self._n0:.2f}, cap {CAP} over {RAMP:.0f} sequences", flush=True)
        frac = min(1.0, self.state.sequences / RAMP)
        cap = max(CAP, self._n0 + (CAP - self._n0) * frac)
        for c in COLS:
            col = W[:, c]
            n = float(col.norm())
            if n > cap:
                col.mul_(cap / n)
T._Run.train_step = step
sys.exit(main(sys.argv[1:]))
