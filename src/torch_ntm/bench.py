"""Throughput benchmark: training and inference sequences per second, fast path vs eager.

The training step is the real one: forward over ``T = 2L + 1`` steps of a fixed random copy-like
batch, BCE on the answer steps only, backward, gradient-norm clipping and an RMSProp step.
Inference is a forward pass under `torch.inference_mode`. Paths are measured interleaved (one
repeat of each path in turn) and reported as medians, so that load from other processes affects
them alike; compare paths by their ratio, not across runs. Warm-up (including any compilation) is
excluded from the timings and reported separately as ``compile_s``.

Example::

    from torch_ntm.bench import run_bench, format_table
    print(format_table(run_bench(batch_sizes=(16,), memory_sizes=(128,))))
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from torch_ntm.model import NTM

__all__ = ["run_bench", "format_table", "PATHS"]

PATHS = ("fast", "eager")
# Also measurable on request: the fast path without torch.compile.
_EXTRA_PATHS = ("fast-uncompiled",)

# The copy task of the paper: 8 data bits plus a delimiter channel in, 8 bits out.
_INPUT_SIZE, _OUTPUT_SIZE = 9, 8


def _copy_batch(batch_size: int, seq_len: int, device, generator: torch.Generator):
    """A copy-task-like batch of fixed length: ``x (T, B, 9)``, ``y (T, B, 8)``, ``mask (T, B)``.

    ::

        step:      0 .. L-1     L        L+1 .. 2L
        x[:8]      bits         0        0
        x[8]       0            1        0
        y          -            -        bits (mask 1)
    """
    t, b, L = 2 * seq_len + 1, batch_size, seq_len
    bits = torch.randint(0, 2, (L, b, _OUTPUT_SIZE), generator=generator).float()
    x = torch.zeros(t, b, _INPUT_SIZE)
    x[:L, :, :_OUTPUT_SIZE] = bits
    x[L, :, _OUTPUT_SIZE] = 1.0
    y = torch.zeros(t, b, _OUTPUT_SIZE)
    y[L + 1 :] = bits
    mask = torch.zeros(t, b)
    mask[L + 1 :] = 1.0
    return x.to(device), y.to(device), mask.to(device)


def _masked_bce(logits, targets, mask):
    loss = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1)
    return (loss * mask).sum() / mask.sum()


def _eager_forward(model: NTM):
    """The plain eager path: `NTM._step` looped over time, whatever `NTM.forward` dispatches to."""

    def forward(x, state=None):
        x, state = model._prepare(x, state)
        outputs = []
        for x_t in x:
            y, state = model._step(x_t, state)
            outputs.append(y)
        return model._finish(outputs), state

    return forward


def _forward_fn(path: str, model: NTM):
    if path == "eager":
        return _eager_forward(model)
    from torch_ntm.fast import make_fast

    return make_fast(model, compile=path == "fast")


def _compiled_graphs() -> int:
    """How many graphs torch.compile has built in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Runner:
    """One path's model, optimizer and step functions for one configuration."""

    def __init__(self, path, memory_size, x, y, mask, device, seed):
        torch.manual_seed(seed)  # every path starts from the same parameters
        self.model = NTM(_INPUT_SIZE, _OUTPUT_SIZE, memory_size=memory_size, device=device)
        self.forward = _forward_fn(path, self.model)
        self.optimizer = torch.optim.RMSprop(self.model.parameters(), lr=1e-4, momentum=0.9)
        self.x, self.y, self.mask, self.device = x, y, mask, device

    def train_step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        logits, _ = self.forward(self.x)
        loss = _masked_bce(logits, self.y, self.mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 10.0)
        self.optimizer.step()
        return loss

    def infer_step(self) -> torch.Tensor:
        with torch.inference_mode():
            return self.forward(self.x)[0]

    def time(self, fn, steps: int) -> float:
        """Seconds per call of ``fn``, averaged over ``steps`` calls."""
        _sync(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        _sync(self.device)
        return (time.perf_counter() - start) / steps


def run_bench(
    batch_sizes=(1, 16, 64),
    seq_len: int = 20,
    memory_sizes=(128, 1024),
    steps: int = 5,
    device="cpu",
    paths=PATHS,
    threads: int | None = None,
    repeats: int = 5,
    seed: int = 0,
) -> list[dict]:
    """Measure training and inference throughput of each path for each batch and memory size.

    Args:
        batch_sizes: batch sizes B to measure.
        seq_len: copy length L; every sequence has ``T = 2L + 1`` steps.
        memory_sizes: memory rows N to measure (memory width 20, the paper's copy model).
        steps: timed calls per repeat (training steps, and inference passes).
        device: where the model and data live.
        paths: any of ``"fast"`` (compiled), ``"eager"``, ``"fast-uncompiled"``.
        threads: ``torch.set_num_threads`` for the run (restored after); None keeps the current.
        repeats: interleaved repeats; the reported figures are medians over them.
        seed: seed of the parameters and of the data.

    Returns:
        One dict per (memory size, batch size, path) with keys ``path, device, batch_size,
        seq_len, memory_size, train_seq_per_s, infer_seq_per_s``, plus ``compile_s`` (warm-up
        time beyond a steady-state step, i.e. compilation), ``threads``, ``steps`` and
        ``graphs_compiled_while_timing`` (0 unless something recompiled after warm-up).
    """
    device = torch.device(device)
    for path in paths:
        if path not in PATHS + _EXTRA_PATHS:
            valid = ", ".join(sorted(PATHS + _EXTRA_PATHS))
            raise ValueError(f"unknown path {path!r}; valid choices: {valid}")
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    records = []
    try:
        for n in memory_sizes:
            for b in batch_sizes:
                gen = torch.Generator().manual_seed(seed)
                x, y, mask = _copy_batch(b, seq_len, device, gen)
                runners = {p: _Runner(p, n, x, y, mask, device, seed) for p in paths}
                warmup = {}
                for p, r in runners.items():
                    # The first calls compile (if the path compiles); the third is steady state.
                    t_train = r.time(r.train_step, 1) + r.time(r.train_step, 1)
                    t_infer = r.time(r.infer_step, 1) + r.time(r.infer_step, 1)
                    warmup[p] = (t_train, t_infer)
                graphs_before = _compiled_graphs()
                train = {p: [] for p in paths}
                infer = {p: [] for p in paths}
                for _ in range(repeats):
                    for p, r in runners.items():
                        train[p].append(r.time(r.train_step, steps))
                        infer[p].append(r.time(r.infer_step, steps))
                new_graphs = _compiled_graphs() - graphs_before  # should be 0: no recompiles
                for p in paths:
                    t_train, t_infer = statistics.median(train[p]), statistics.median(infer[p])
                    w_train, w_infer = warmup[p]
                    records.append(
                        {
                            "path": p,
                            "device": str(device),
                            "batch_size": b,
                            "seq_len": seq_len,
                            "memory_size": n,
                            "train_seq_per_s": b / t_train,
                            "infer_seq_per_s": b / t_infer,
                            "compile_s": max(0.0, w_train - 2 * t_train)
                            + max(0.0, w_infer - 2 * t_infer),
                            "threads": torch.get_num_threads(),
                            "graphs_compiled_while_timing": new_graphs,
                            "steps": steps,
                        }
                    )
    finally:
        torch.set_num_threads(old_threads)
    return records


def format_table(records: list[dict]) -> str:
    """A plain-text table of the records, with fast/eager ratios where both were measured."""
    header = (
        f"{'path':<15} {'device':<6} {'batch':>5} {'L':>3} {'N':>5} "
        f"{'train seq/s':>11} {'infer seq/s':>11} {'compile s':>9}"
    )
    lines = [header, "-" * len(header)]
    by_key = {}
    for r in records:
        lines.append(
            f"{r['path']:<15} {r['device']:<6} {r['batch_size']:>5} {r['seq_len']:>3} "
            f"{r['memory_size']:>5} {r['train_seq_per_s']:>11.1f} {r['infer_seq_per_s']:>11.1f} "
            f"{r.get('compile_s', 0.0):>9.1f}"
        )
        key = (r["device"], r["batch_size"], r["seq_len"], r["memory_size"])
        by_key.setdefault(key, {})[r["path"]] = r
    ratios = []
    for (dev, b, L, n), rs in by_key.items():
        for path in ("fast",) + _EXTRA_PATHS:
            if path in rs and "eager" in rs:
                tr = rs[path]["train_seq_per_s"] / rs["eager"]["train_seq_per_s"]
                inf = rs[path]["infer_seq_per_s"] / rs["eager"]["infer_seq_per_s"]
                ratios.append(
                    f"{path}/eager {dev} batch {b} L {L} N {n}: "
                    f"train x{tr:.2f}, infer x{inf:.2f}"
                )
    return "\n".join(lines + ratios)
