"""Training speed of `MANN` in a user's own loop, per engine: episodes per second and the ratio.

The loop: ``MANN(405, 5)`` (the paper's sizes: 200 LSTM units, 128 x 40 memory, 4 heads), random
Omniglot-sized episodes ``[50, 16, 405]`` with random labels, cross-entropy over all steps,
`torch.optim.Adam`, one thread. Each engine gets ``--warmup`` steps, then ``--blocks`` timed
blocks of ``--steps`` steps each, alternating between the engines (so a slower spell of a shared
machine falls on both); the median block gives the rate.

    TORCH_EXTENSIONS_DIR=/tmp/ext python scripts/mann_speed.py
    python scripts/mann_speed.py --engines eager native --blocks 7 --dtype float64
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from torch_ntm import MANN


def make_loop(engine: str, dtype: torch.dtype, batch: int, steps: int):
    torch.manual_seed(0)
    model = MANN(405, 5, engine=engine, dtype=dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(steps, batch, 405, generator=gen, dtype=dtype)
    labels = torch.randint(0, 5, (steps, batch), generator=gen)

    def step() -> None:
        logits, _ = model(x)
        loss = F.cross_entropy(logits.reshape(-1, 5), labels.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["eager", "native"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="training steps per timed block")
    parser.add_argument("--blocks", type=int, default=5, help="timed blocks per engine")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    loops = {e: make_loop(e, dtype, args.batch, args.seq_len) for e in args.engines}
    for loop in loops.values():
        for _ in range(args.warmup):
            loop()
    times: dict[str, list[float]] = {e: [] for e in args.engines}
    for _ in range(args.blocks):
        for engine, loop in loops.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                loop()
            times[engine].append(time.perf_counter() - start)
    rates = {e: args.steps / statistics.median(t) for e, t in times.items()}
    print(f"MANN(405, 5), {args.dtype}, batch {args.batch}, {args.seq_len} steps, 1 thread, "
          f"median of {args.blocks} blocks of {args.steps} training steps")
    for engine, rate in rates.items():
        spread = ", ".join(f"{args.steps / t:.2f}" for t in times[engine])
        print(f"  {engine:>8}: {rate:7.2f} episodes/s  (blocks: {spread})")
    first = args.engines[0]
    for engine in args.engines[1:]:
        print(f"  {engine} / {first}: {rates[engine] / rates[first]:.2f}x")


if __name__ == "__main__":
    main()
