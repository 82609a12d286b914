"""Where a training step of `ntm bench` goes (docs/speed.md; the speed issue's closing notes).

    python scripts/profile_step.py [--engine native] [--batch-size 1,16,64] [--memory-size 128]

For each batch and memory size: the bench's training step (its model, data, loss, clipping and
RMSProp; one thread) timed without a profiler (median ms per step over ``--repeats`` blocks of
``--steps``), then under `torch.profiler` for one more block, split by phase (forward, loss,
backward, clipping, optimizer; each phase's CPU time per step), and within the forward and
backward the native library's own calls (the `NativeSequence` autograd function's self time)
and the matmuls torch runs around them (``aten::mm``/``aten::addmm`` self time). The profiler
adds its own cost per op, so its phases add up to more than the plain median; compare shares,
not sums. Set ``OMP_NUM_THREADS=1`` and leave the other core idle (or pause what runs there) for
figures worth quoting.
"""

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from torch_ntm.bench import _Runner
from torch_ntm.engines import library
from torch_ntm.tasks import CopyTask


def profile_one(engine: str, batch: int, rows: int, length: int, steps: int, repeats: int):
    task = CopyTask().with_size(length)
    data = task.sample(batch, torch.Generator().manual_seed(0))
    runner = _Runner(engine, rows, data, task, torch.device("cpu"), 0)
    for _ in range(3):
        runner.train_step()
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            runner.train_step()
        blocks.append((time.perf_counter() - start) / steps * 1e3)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            runner.train_step(phase=record_function)
    events = {e.key: e for e in prof.key_averages()}

    def ms(key: str, total: bool = True) -> float:
        e = events.get(key)
        if e is None:
            return 0.0
        return (e.cpu_time_total if total else e.self_cpu_time_total) / steps / 1e3

    phases = {p: ms(p) for p in _Runner.PHASES}
    calls = {"native forward call": ms("NativeSequence", total=False),
             "native backward call": ms("NativeSequenceBackward", total=False),
             "matmuls (mm, addmm)": ms("aten::mm", total=False) + ms("aten::addmm", total=False)}
    print(f"{engine}, batch {batch}, {rows} rows, L = {length}: "
          f"{statistics.median(blocks):.2f} ms per step (median of {repeats} x {steps}; "
          f"{batch / statistics.median(blocks) * 1e3:.0f} sequences/s)")
    print("  under the profiler, ms per step: "
          + ", ".join(f"{p} {v:.2f}" for p, v in phases.items()))
    print("  of which: " + ", ".join(f"{k} {v:.2f}" for k, v in calls.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="native")
    parser.add_argument("--batch-size", default="1,16,64")
    parser.add_argument("--memory-size", default="128")
    parser.add_argument("--seq-len", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    library.keep_freed_memory()  # as `ntm` commands
    for rows in (int(n) for n in args.memory_size.split(",")):
        for batch in (int(b) for b in args.batch_size.split(",")):
            profile_one(args.engine, batch, rows, args.seq_len, args.steps, args.repeats)


if __name__ == "__main__":
    main()
