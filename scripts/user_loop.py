"""A user's own training loop around the library's modules, timed as a newcomer runs it: the module
with no engine argument (what ``NTM(...)``, ``MANN(...)`` and ``DNC(...)`` give by default)
against the same module on ``engine="eager"`` and against a plain eager NTM written from the
paper here (per-head linear layers, batched addressing, a Python loop over time; the kind of NTM
other libraries ship).

    python scripts/user_loop.py [--batch-size 16] [--repeats 7] [--models ntm,mann,dnc]

NTM: the copy task (`torch_ntm.tasks.CopyTask`, L = 20, so 41 steps), ``NTM(9, 8)``, the task's
masked binary cross-entropy, Adam at 3e-3, ``clip_grad_norm_`` at 10. MANN: ``MANN(405, 5)`` on
random episodes of 50 steps (400 image features and a 5-way one-hot of the previous label),
cross-entropy at every step, Adam. DNC: ``DNC(9, 8)`` (DeepMind's reference sizes: an LSTM of
64, 16 x 16 memory, 4 read heads) on the NTM's copy batches and loss, Adam at 1e-3. One thread.
Each loop runs a warm-up (the native library's build included, the first time on a machine),
then ``--repeats`` interleaved blocks of ``--steps`` training steps; the table gives each loop's
median sequences per second and its ratio to the plain loop (NTM) or to the eager engine (MANN,
DNC), all measured in this one process. For the MANN it also times the matmuls its step must make
on any engine (`mann_matmuls`), alone: the ratio a step made of nothing else would reach."""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from torch_ntm import DNC, MANN, NTM
from torch_ntm.metrics import masked_bce
from torch_ntm.tasks import CopyTask


class PlainNTM(nn.Module):
    """The copy NTM of the paper, plainly: an LSTM cell of 100, memory 128 x 20, one read and one
    write head, each with its own linear layer per parameter, and a loop over time."""

    def __init__(self, inputs: int, outputs: int, hidden=100, rows=128, width=20) -> None:
        super().__init__()
        self.rows, self.width = rows, width
        self.cell = nn.LSTMCell(inputs + width, hidden)
        self.heads = nn.ModuleDict({kind: nn.ModuleDict({
            "key": nn.Linear(hidden, width), "beta": nn.Linear(hidden, 1),
            "gate": nn.Linear(hidden, 1), "shift": nn.Linear(hidden, 3),
            "gamma": nn.Linear(hidden, 1), **({"erase": nn.Linear(hidden, width),
                                               "add": nn.Linear(hidden, width)}
                                              if kind == "write" else {})})
            for kind in ("read", "write")})
        self.out = nn.Linear(hidden + width, outputs)

    def address(self, head, h, memory, w_prev):
        key = torch.tanh(head["key"](h))
        beta = F.softplus(head["beta"](h))
        gate = torch.sigmoid(head["gate"](h))
        shift = torch.softmax(head["shift"](h), -1)
        gamma = 1 + F.softplus(head["gamma"](h))
        cos = F.cosine_similarity(memory, key.unsqueeze(1), dim=-1, eps=1e-8)  # eq. (6)
        w = torch.softmax(beta * cos, -1)  # eq. (5)
        w = gate * w + (1 - gate) * w_prev  # eq. (7)
        w = sum(shift[:, i : i + 1] * torch.roll(w, i - 1, -1) for i in range(3))  # eq. (8)
        w = w ** gamma  # eq. (9)
        return w / w.sum(-1, keepdim=True)

    def forward(self, x):
        batch = x.shape[1]
        h = c = x.new_zeros(batch, self.cell.hidden_size)
        memory = x.new_full((batch, self.rows, self.width), 1e-6)
        w_read = w_write = torch.softmax(x.new_zeros(batch, self.rows).index_fill(1, x.new_zeros(
            1, dtype=torch.long), 10.0), -1)
        read = x.new_zeros(batch, self.width)
        outputs = []
        for x_t in x:
            h, c = self.cell(torch.cat([x_t, read], -1), (h, c))
            write = self.heads["write"]
            w_write = self.address(write, h, memory, w_write)
            erase, add = torch.sigmoid(write["erase"](h)), torch.tanh(write["add"](h))
            memory = memory * (1 - w_write.unsqueeze(-1) * erase.unsqueeze(1))  # eq. (3)
            memory = memory + w_write.unsqueeze(-1) * add.unsqueeze(1)  # eq. (4)
            w_read = self.address(self.heads["read"], h, memory, w_read)
            read = torch.bmm(w_read.unsqueeze(1), memory).squeeze(1)  # eq. (2)
            outputs.append(self.out(torch.cat([h, read], -1)))
        return torch.stack(outputs)


def ntm_loops(batch: int):
    task = CopyTask().with_size(20)
    data = task.sample(batch, torch.Generator().manual_seed(0))

    def loop(model):
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

        def step():
            logits = model(data.inputs)
            logits = logits[0] if isinstance(logits, tuple) else logits
            loss = masked_bce(logits, data.targets, data.mask).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            optimizer.step()
        return step

    torch.manual_seed(0)
    return {"NTM(9, 8)": loop(NTM(9, 8)),
            'NTM(9, 8, engine="eager")': loop(NTM(9, 8, engine="eager")),
            "plain eager NTM": loop(PlainNTM(9, 8))}, "plain eager NTM"


def dnc_loops(batch: int):
    task = CopyTask().with_size(20)
    data = task.sample(batch, torch.Generator().manual_seed(0))

    def loop(model):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            logits, _ = model(data.inputs)
            loss = masked_bce(logits, data.targets, data.mask).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return step

    torch.manual_seed(0)
    return {"DNC(9, 8)": loop(DNC(9, 8)),
            'DNC(9, 8, engine="eager")': loop(DNC(9, 8, engine="eager"))}, \
        'DNC(9, 8, engine="eager")'


def mann_loops(batch: int):
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (50, batch), generator=g)
    previous = F.one_hot(torch.cat([labels.new_zeros(1, batch), labels[:-1]]), 5).float()
    x = torch.cat([torch.rand(50, batch, 400, generator=g), previous], -1)

    def loop(model):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            logits, _ = model(x)
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return step

    torch.manual_seed(0)
    return {"MANN(405, 5)": loop(MANN(405, 5)),
            'MANN(405, 5, engine="eager")': loop(MANN(405, 5, engine="eager"))}, \
        'MANN(405, 5, engine="eager")'


def mann_matmuls(batch: int, steps: int = 50) -> dict:
    """The matmuls a training step of `MANN(405, 5)` must make on any engine, as callables at
    its sizes: the LSTM's input side over all steps and its weight gradient, the recurrent and
    head-layer products of each step forward and backward (``batch`` rows each, ``steps`` times),
    the weight gradients of both over all steps, the output layer. Timed alone, their sum is a
    floor under the step's time (every other part of the step taken as free)."""
    model = MANN(405, 5)
    c, p = model.controller_size, model.head_params.out_features
    z = model.read_heads * model.memory_width + c  # [reads, h], the recurrent matmul's input
    rows, out = steps * batch, model.output.in_features
    r = torch.rand

    def mm(a, b, times=1):
        x, y = r(*a), r(*b)

        def run():
            for _ in range(times):
                x @ y
        return run
    return {"input side": mm((rows, 405), (405, 4 * c)),
            "input side, weight gradient": mm((4 * c, rows), (rows, 405)),
            "recurrent, per step": mm((batch, z), (z, 4 * c), steps),
            "recurrent, input gradient per step": mm((batch, 4 * c), (4 * c, z), steps),
            "recurrent, weight gradient": mm((4 * c, rows), (rows, z)),
            "head layer, per step": mm((batch, c), (c, p), steps),
            "head layer, input gradient per step": mm((batch, p), (p, c), steps),
            "head layer, weight gradient": mm((p, rows), (rows, c)),
            "output layer and its gradients": mm((rows, out), (out, 5), 3)}


def main() -> None:
    p = argparse.ArgumentParser(prog="user_loop.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=5, help="training steps per timed block")
    p.add_argument("--repeats", type=int, default=7, help="interleaved blocks per loop")
    p.add_argument("--models", default="ntm,mann,dnc", help="comma-separated: ntm, mann, dnc")
    args = p.parse_args()
    torch.set_num_threads(1)
    for name in args.models.split(","):
        loops, reference = {"ntm": ntm_loops, "mann": mann_loops,
                            "dnc": dnc_loops}[name](args.batch_size)
        warmup = {}
        for label, step in loops.items():
            start = time.perf_counter()
            step()
            step()
            warmup[label] = time.perf_counter() - start
        times = {label: [] for label in loops}
        for _ in range(args.repeats):
            for label, step in loops.items():
                start = time.perf_counter()
                for _ in range(args.steps):
                    step()
                times[label].append((time.perf_counter() - start) / args.steps)
        rates = {label: args.batch_size / statistics.median(t) for label, t in times.items()}
        print(f"{'loop':<30} {'seq/s':>8} {'min-max':>15} {'ratio':>7} {'warm-up s':>9}")
        for label, t in times.items():
            spread = f"{args.batch_size / max(t):.0f}-{args.batch_size / min(t):.0f}"
            print(f"{label:<30} {rates[label]:>8.1f} {spread:>15} "
                  f"{rates[label] / rates[reference]:>6.2f}x {warmup[label]:>9.1f}")
        print(f"(batch {args.batch_size}, one thread, medians of {args.repeats} blocks of "
              f"{args.steps} steps; ratio to the {reference})")
        if name == "mann":
            floor = sum(statistics.median(_timed(f) for _ in range(args.repeats))
                        for f in mann_matmuls(args.batch_size).values())
            print(f"its matmuls alone: {floor * 1e3:.1f} ms a step, {args.batch_size / floor:.0f} "
                  f"episodes/s: a step with nothing else would be "
                  f"{args.batch_size / floor / rates[reference]:.2f}x the {reference}")
        print()


def _timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
