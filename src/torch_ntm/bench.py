"""Throughput benchmark: training and inference sequences per second of each engine of a model
(`NTM` by default; `MANN` and `DNC` too, ``model=``).

The training step is the one `ntm train` takes: a batch of the copy task (`torch_ntm.tasks.CopyTask`
at a fixed length L, ``T = 2L + 1`` steps), ``model(x)`` on the engine measured, the task's loss
(`torch_ntm.metrics.masked_bce`, averaged over the batch), backward, gradient-norm clipping and
an RMSProp step. Inference is ``model(x)`` under `torch.no_grad` in eval mode, as `ntm evaluate`
runs it. Engines are measured interleaved (one repeat of each in turn) and reported as medians,
so that load from other processes affects them alike; compare engines by their ratio, not across
runs. Warm-up (including the native library's build, the first time on a machine) is excluded
from the timings and reported separately as ``warmup_s``.

Example:

    from torch_ntm.bench import run_bench, format_table
    print(format_table(run_bench(batch_sizes=(16,), memory_sizes=(128,))))
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext

import torch

from torch_ntm.engines import DEVICES
from torch_ntm.evaluate import task_objective
from torch_ntm.flat_optim import FlatOptimizer
from torch_ntm.model import ENGINES
from torch_ntm.registry import MEMORY_MODELS
from torch_ntm.registry import MODELS as REGISTRY
from torch_ntm.tasks import CopyTask

__all__ = ["run_bench", "check_engines", "format_table", "DEFAULT_ENGINES", "DEFAULT_SIZES",
           "MODELS"]

# The models the bench builds, each at its defaults but the memory rows.
MODELS = MEMORY_MODELS  # "ntm", "mann", "dnc"

# Measured unless asked otherwise: what a model runs by default, and the plain loop.
DEFAULT_ENGINES = ("auto", "eager")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _model(task, memory_size: int, engine: str = "auto", device="cpu", model: str = "ntm"):
    """The bench's model for the task with ``memory_size`` rows, otherwise at its defaults:
    ``"ntm"`` the paper's copy NTM (`NTM`), ``"mann"`` `MANN` (LSTM 200, rows of 40, 4 heads),
    ``"dnc"`` `DNC` (LSTM 64, rows of 16, 4 read heads)."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; valid choices: {', '.join(MODELS)}")
    return REGISTRY[model].cls(task.input_size, task.output_size, memory_size=memory_size,
                               engine=engine, device=device)


def check_memory_size(rows: int, model: str = "ntm", batch_size: int = 1) -> None:
    """Raise the model's own `ValueError` if the bench's model cannot have ``rows`` memory rows
    (too few for its shifts or heads), or a `torch_ntm.config.ConfigError` if its state for
    ``batch_size`` sequences (at least 64) is too large (`torch_ntm.config.check_state_size`),
    before any timing: built on the meta device, no memory used."""
    from torch_ntm.config import check_state_size

    check_state_size(_model(CopyTask(), rows, device="meta", model=model), batch_size,
                     "ntm bench", "--memory-size")


def check_engines(engines, device: torch.device) -> None:
    """Raise `ValueError` for an engine that is not one, or that ``device`` has not: it would
    time the eager loop again under its name (``graphs`` on the CPU took minutes)."""
    for engine in engines:
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; valid choices: {', '.join(ENGINES)}")
        there = DEVICES.get(engine, device.type)
        if there != device.type:
            raise ValueError(f"engine {engine!r} runs on {there.upper()}, not on "
                             f"{device.type.upper()}: drop it, or measure with --device {there}")


class _Runner:
    """One engine's model, optimizer and step functions for one configuration."""

    PHASES = ("forward", "loss", "backward", "clip", "optimizer")  # of `train_step`, in order

    def __init__(self, engine, memory_size, batch, task, device, seed, model="ntm"):
        torch.manual_seed(seed)  # every engine starts from the same parameters
        self.model = _model(task, memory_size, engine, device, model)
        self.optimizer = FlatOptimizer(  # as `ntm train` (train.make_optimizer, FlatOptimizer)
            self.model.parameters(),
            lambda flat: torch.optim.RMSprop(flat, lr=1e-4, momentum=0.9, foreach=True))
        self.loss = task_objective(task).loss
        self.batch = [t.to(device) for t in batch]
        self.device = device

    def train_step(self, phase=lambda name: nullcontext()) -> torch.Tensor:
        """One training step; ``phase(name)`` is a context around each of its `PHASES`, e.g.
        `torch.profiler.record_function` (scripts/profile_step.py); by default nothing."""
        x, y, mask = self.batch
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with phase("forward"):
            logits, _ = self.model(x)
        with phase("loss"):
            loss = self.loss(logits, y, mask).mean()
        with phase("backward"):
            loss.backward()
        with phase("clip"):
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 10.0)
        with phase("optimizer"):
            self.optimizer.step()
        return loss.detach()

    @torch.no_grad()
    def infer_step(self) -> torch.Tensor:
        self.model.eval()
        return self.model(self.batch[0])[0]

    def time(self, fn, steps: int) -> float:
        """Seconds per call of ``fn``, averaged over ``steps`` calls."""
        _sync(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        _sync(self.device)
        return (time.perf_counter() - start) / steps


# The batch and memory sizes measured unless asked otherwise, by device type: on the CPU the sizes
# a CPU trains at; on a GPU those where it pays (its engine's replay costs about the same from
# batch 16 to 1,024), sized so that the whole bench, eager included, takes a few minutes.
DEFAULT_SIZES = {"cpu": ((1, 16, 64), (128, 1024)), "cuda": ((16, 256, 1024), (128,))}


def run_bench(
    batch_sizes=None,
    seq_len: int = 20,
    memory_sizes=None,
    steps: int = 5,
    device="cpu",
    engines=DEFAULT_ENGINES,
    threads: int | None = None,
    repeats: int = 5,
    seed: int = 0,
    model: str = "ntm",
) -> list[dict]:
    """Measure training and inference throughput of each engine for each batch and memory size.

    Args:
        batch_sizes: batch sizes B to measure (None: `DEFAULT_SIZES` for the device).
        seq_len: copy length L; every sequence has ``T = 2L + 1`` steps.
        memory_sizes: memory rows N to measure (memory width 20, the paper's copy model; None:
            `DEFAULT_SIZES` for the device).
        steps: timed calls per repeat (training steps, and inference passes).
        device: where the model and data live.
        engines: any of `torch_ntm.engines.ENGINES` (``"auto"``, ``"native"``, ``"graphs"``,
            ``"eager"``).
        threads: ``torch.set_num_threads`` for the run (restored after); None keeps the current.
        repeats: interleaved repeats; the reported figures are medians over them.
        seed: seed of the parameters and of the data.
        model: one of `MODELS`, the model measured (`_model`), on the same copy batches.

    Returns:
        One dict per (memory size, batch size, engine) with keys ``model, engine, device,
        batch_size, seq_len, memory_size, train_seq_per_s, infer_seq_per_s``, plus ``runs_as`` (the
        engine that served the calls: ``"auto"`` runs as ``"native"``, ``"graphs"`` or ``"eager"``),
        ``warmup_s`` (warm-up time beyond two steady-state steps: the library's build, first
        allocations), ``threads`` and ``steps``.
    """
    device = torch.device(device)
    default_batches, default_rows = DEFAULT_SIZES.get(device.type, DEFAULT_SIZES["cpu"])
    batch_sizes = default_batches if batch_sizes is None else batch_sizes
    memory_sizes = default_rows if memory_sizes is None else memory_sizes
    check_memory_size(min(memory_sizes), model)  # and the model's name
    check_memory_size(max(memory_sizes), model, max(batch_sizes))
    check_engines(engines, device)
    task = CopyTask().with_size(seq_len)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    records = []
    try:
        for n in memory_sizes:
            for b in batch_sizes:
                batch = task.sample(b, torch.Generator().manual_seed(seed))
                runners = {e: _Runner(e, n, batch, task, device, seed, model) for e in engines}
                warmup = {}
                for p, r in runners.items():
                    # The first calls may build the native library; the third is steady state.
                    t_train = r.time(r.train_step, 1) + r.time(r.train_step, 1)
                    t_infer = r.time(r.infer_step, 1) + r.time(r.infer_step, 1)
                    warmup[p] = (t_train, t_infer)
                train = {p: [] for p in engines}
                infer = {p: [] for p in engines}
                for _ in range(repeats):
                    for p, r in runners.items():
                        train[p].append(r.time(r.train_step, steps))
                        infer[p].append(r.time(r.infer_step, steps))
                for p in engines:
                    t_train, t_infer = statistics.median(train[p]), statistics.median(infer[p])
                    w_train, w_infer = warmup[p]
                    records.append(
                        {
                            "model": model,
                            "engine": p,
                            "device": str(device),
                            "batch_size": b,
                            "seq_len": seq_len,
                            "memory_size": n,
                            "train_seq_per_s": b / t_train,
                            "infer_seq_per_s": b / t_infer,
                            "runs_as": runners[p].model.runs_on(batch[0].to(device)),
                            "warmup_s": max(0.0, w_train - 2 * t_train)
                            + max(0.0, w_infer - 2 * t_infer),
                            "threads": torch.get_num_threads(),
                            "steps": steps,
                        }
                    )
    finally:
        torch.set_num_threads(old_threads)
    return records


def format_table(records: list[dict]) -> str:
    """A plain-text table of the records, with each engine's ratio to the eager one where both
    were measured."""
    header = (
        f"{'model':<5} {'engine':<15} {'device':<6} {'batch':>5} {'L':>3} {'N':>5} "
        f"{'train seq/s':>11} {'infer seq/s':>11} {'warm-up s':>9}"
    )
    lines = [header, "-" * len(header)]
    by_key = {}
    for r in records:
        name = r["engine"] if r["engine"] == r["runs_as"] else f"{r['engine']} ({r['runs_as']})"
        lines.append(
            f"{r.get('model', 'ntm'):<5} {name:<15} {r['device']:<6} {r['batch_size']:>5} "
            f"{r['seq_len']:>3} {r['memory_size']:>5} {r['train_seq_per_s']:>11.1f} "
            f"{r['infer_seq_per_s']:>11.1f} {r['warmup_s']:>9.1f}"
        )
        key = (r.get("model", "ntm"), r["device"], r["batch_size"], r["seq_len"],
               r["memory_size"])
        by_key.setdefault(key, {})[r["engine"]] = r
    ratios = []
    for (model, dev, b, L, n), rs in by_key.items():
        for engine in ENGINES:
            if engine != "eager" and engine in rs and "eager" in rs:
                tr = rs[engine]["train_seq_per_s"] / rs["eager"]["train_seq_per_s"]
                inf = rs[engine]["infer_seq_per_s"] / rs["eager"]["infer_seq_per_s"]
                ratios.append(
                    f"{model} {engine}/eager {dev} batch {b} L {L} N {n}: "
                    f"train x{tr:.2f}, infer x{inf:.2f}"
                )
    return "\n".join(lines + ratios)
