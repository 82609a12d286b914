"""The training loop: one straight line from a `TrainConfig` to a run directory.

A run directory holds the checkpoint (see `torch_ntm.checkpoint`), ``config.json`` (the resolved
config), ``metrics.csv`` (training rows every ``log_every`` steps, validation rows every
``eval_every``; a ``rollback`` row with the restored metrics when ``rollback_bit_errors`` puts the
best weights back) and TensorBoard event files under ``tb/``. ``train(..., resume=True)``
continues a run exactly: model, optimizer, RNG states and counters are restored, so N steps equal
N/2 steps, a resume, and N/2 more, bit for bit on the CPU.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from torch_ntm.checkpoint import (
    _atomic_write,
    build_model,
    build_task,
    load_checkpoint,
    lock_run,
    read_metrics,
    save_checkpoint,
)
from torch_ntm.config import ConfigError, TrainConfig, resolve_device
from torch_ntm.evaluate import evaluate_batches, fixed_batches
from torch_ntm.metrics import bit_errors, masked_bce
from torch_ntm.stability import BestWeights, SpikeClip

__all__ = ["train", "TrainResult", "Interrupted", "make_optimizer", "validation_batches"]

GENERAL_SEED = 1410  # the generalisation validation sets (eval_sizes)
CSV_FIELDS = ["step", "sequences", "elapsed_s", "split", "cost_bits", "bit_errors", "perfect"]


@dataclass
class TrainResult:
    run_dir: Path
    converged: bool
    step: int
    sequences: int
    elapsed_s: float
    metrics: dict  # last validation (after a rollback: the restored best's)
    nan_steps: int


class Interrupted(KeyboardInterrupt):
    """`train` was stopped by SIGINT or SIGTERM and saved a checkpoint at ``step`` first."""

    def __init__(self, signum: int, step: int, run_dir: Path):
        super().__init__(f"interrupted by signal {signum} at step {step}")
        self.signum, self.step, self.run_dir = signum, step, run_dir


class _StopSignals:
    """While installed, SIGINT and SIGTERM only ask the loop to stop (``signum``), so that it
    stops between steps with a checkpoint; a second signal stops at once (KeyboardInterrupt)."""

    def __init__(self, enabled: bool):
        self.signum = None
        self.previous = {}
        if enabled and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def make_optimizer(config: TrainConfig, params) -> torch.optim.Optimizer:
    if config.optimizer == "rmsprop":
        return torch.optim.RMSprop(params, lr=config.lr, alpha=config.rmsprop_alpha,
                                   momentum=config.momentum)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, amsgrad=config.amsgrad)
    raise ConfigError(f"unknown optimizer {config.optimizer!r}; valid choices: adam, rmsprop")


def validation_batches(config: TrainConfig, task) -> list:
    """The fixed validation set of a run: the same sequences at every validation and resume."""
    return fixed_batches(task, config.eval_sequences, max(config.batch_size, 64))


def _spike_clip(config: TrainConfig, params) -> SpikeClip | None:
    """With ``clip_spikes``, the norm clip relative to the recent median (`SpikeClip`)."""
    if config.clip_spikes <= 0:
        return None
    max_norm = config.clip_norm if config.clip_norm > 0 else math.inf
    return SpikeClip(params, factor=config.clip_spikes, max_norm=max_norm)


def _clip(config: TrainConfig, params, spikes: SpikeClip | None) -> torch.Tensor:
    """Clip by value and/or by global norm (``clip_norm``, and spikes if ``spikes``); returns the
    global gradient norm (after value clipping), non-finite exactly when some gradient is."""
    if config.clip_value > 0:
        nn.utils.clip_grad_value_(params, config.clip_value)
    if spikes is not None:
        return spikes()
    return nn.utils.clip_grad_norm_(params, config.clip_norm if config.clip_norm > 0 else math.inf)


class _World:
    """Data parallelism under ``torchrun`` (gloo on CPU, NCCL on CUDA); one process otherwise.

    Every rank draws the same global batch from the same generator and trains on its own slice;
    DDP averages the gradients, so the update equals one process's on the global batch.
    """

    def __init__(self, device: torch.device):
        self.size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.device = device
        if self.size > 1:
            import torch.distributed as dist

            if device.type == "cuda":
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
                torch.cuda.set_device(self.device)
            if not dist.is_initialized():
                dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def local_batch(self, batch_size: int) -> slice:
        if batch_size % self.size:
            raise ConfigError(f"batch_size={batch_size} must be divisible by the number of "
                              f"processes ({self.size})")
        n = batch_size // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)

    def sum(self, values: list[float]) -> list[float]:
        if self.size == 1:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()


class _MetricsLog:
    """metrics.csv (appended; rows after a resumed step are dropped) and TensorBoard."""

    def __init__(self, run_dir: Path, resume_step: int | None):
        self.path = run_dir / "metrics.csv"
        rows = []
        if resume_step is not None:
            rows = [r for r in read_metrics(self.path) if int(r["step"]) <= resume_step]
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        _atomic_write(self.path, text.getvalue().encode())  # a kill keeps the old rows
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=resume_step)
        except ImportError:  # TensorBoard is optional at run time; CSV always works
            pass

    def write(self, step: int, sequences: int, elapsed: float, split: str, values: dict):
        row = {"step": step, "sequences": sequences, "elapsed_s": f"{elapsed:.3f}",
               "split": split, **{k: f"{values[k]:.6g}" for k in CSV_FIELDS[4:] if k in values}}
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, CSV_FIELDS).writerow(row)
        if self.tb is not None:
            for key in CSV_FIELDS[4:]:
                if key in values:
                    self.tb.add_scalar(f"{split}/{key}", values[key], sequences)

    def close(self):
        if self.tb is not None:
            self.tb.close()


def _scale_lr(optimizer: torch.optim.Optimizer, factor: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] *= factor


def _score(metrics: dict) -> tuple:
    """Order of validations, best first: fewest wrong bits in the training distribution, then
    fewest at the generalisation sizes (``eval_sizes``; none validated counts as infinitely
    many), then the lowest cost."""
    general = metrics.get("general_bit_errors")
    return (metrics["bit_errors"], math.inf if general is None else general, metrics["cost_bits"])


class _Best(BestWeights):
    """`BestWeights` ordered by `_score`, which also remembers the best validation's metrics.

    Saved with every checkpoint, so that a resumed run keeps (and rolls back to) the same best.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        super().__init__(model, optimizer)
        self.metrics: dict = {}

    def offer(self, metrics: dict, replace: bool = False) -> None:
        """Keep the current weights if ``metrics`` is the best validation (or if ``replace``)."""
        if replace:
            self.score = None
        if self.update(_score(metrics)):
            self.metrics = dict(metrics)

    def fell_apart(self, metrics: dict, margin: float) -> bool:
        """Whether ``metrics`` (a later validation) calls for a rollback: the best had no wrong
        bit and ``metrics`` has more than ``margin`` (>= 0) per sequence, or NaN."""
        return self.metrics.get("bit_errors") == 0 and not metrics["bit_errors"] <= margin

    def restore(self) -> dict:
        super().restore()
        return dict(self.metrics)

    def saved(self) -> tuple[dict, dict | None, dict] | None:
        """What `save_checkpoint` keeps of it (None before the first validation)."""
        state = self.state_dict()
        if state["weights"] is None:
            return None
        return state["weights"], state["optimizer"], self.metrics


def _progress(total: int, initial: int, enabled: bool | None):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="seq", disable=None if enabled is None
                else not enabled, dynamic_ncols=True, smoothing=0.1)


def train(config: TrainConfig, run_dir: str | os.PathLike, *, resume: bool = False,
          progress: bool | None = None) -> TrainResult:
    """Train ``config`` into ``run_dir`` (or continue the run there when ``resume``).

    Stops when validation bit errors per sequence stay <= ``config.stop_bit_errors`` for
    ``config.patience_evals`` validations, or when ``max_sequences``/``max_seconds`` is spent.
    Under ``torchrun`` the processes share the global batch and rank 0 writes the run directory,
    holding its lock (`torch_ntm.checkpoint.lock_run`): a second training into it is refused.
    """
    config.check()  # a config built in Python: the checks the command line's parser makes
    main = int(os.environ.get("RANK", "0")) == 0
    with lock_run(run_dir) if main else contextlib.nullcontext():
        return _train(config, Path(run_dir), resume=resume, progress=progress)


def _train(config: TrainConfig, run_dir: Path, *, resume: bool, progress: bool | None):
    torch.set_num_threads(config.threads)
    world = _World(resolve_device(config.device))
    device = world.device
    local = world.local_batch(config.batch_size)
    torch.manual_seed(config.seed)
    data_gen = torch.Generator().manual_seed(config.seed)
    task = build_task(config)
    model = build_model(config, task, device=device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(config, params)
    spikes = _spike_clip(config, params)

    step = sequences = nan_steps = streak = rollbacks = 0
    lr_decayed = False
    elapsed = 0.0
    last_val: dict = {}
    if resume:
        ckpt = load_checkpoint(run_dir)
        ckpt.load_weights_into(model)
        ckpt.restore_train_state(optimizer, data_gen)
        step, sequences, elapsed = ckpt.step, ckpt.sequences, ckpt.elapsed_s
        last_val = ckpt.metrics
        nan_steps = int(ckpt.extra.get("nan_steps", 0))
        streak = int(ckpt.extra.get("streak", 0))
        lr_decayed = bool(ckpt.extra.get("lr_decayed", False))  # the lr is in the optimizer state
        rollbacks = int(ckpt.extra.get("rollbacks", 0))
        if spikes is not None:
            spikes.load_state_dict({"norms": ckpt.extra.get("recent_grad_norms", [])})
        if config.lr != ckpt.config.lr:  # resumed with a new rate: it replaces the current one
            for group in optimizer.param_groups:
                group["lr"] = config.lr
    if world.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        log_file = _MetricsLog(run_dir, step if resume else None)  # first: it checks the old
        (run_dir / "config.json").write_text(config.to_json() + "\n")
    train_model = world.wrap(model)
    # Every rank validates the whole (small) set, so all reach the same stopping decision.
    val_batches = validation_batches(config, task)
    # Drawn from a seed of their own, so that `ntm evaluate`'s tables (EVAL_SEED) test the model
    # on other sequences than those that chose when to stop and which weights to keep.
    general_batches = {size: fixed_batches(task.with_size(size), config.eval_size_sequences, 50,
                                           seed=GENERAL_SEED) for size in config.eval_sizes}

    best = _Best(model, optimizer)
    kept = ckpt.best() if resume else None
    if kept is not None:  # the run's best so far, saved beside its latest state
        weights, optimizer_state, best.metrics = kept
        best.load_state_dict({"score": _score(best.metrics), "weights": weights,
                              "optimizer": optimizer_state})
    elif last_val:
        best.offer(last_val)

    def validate() -> dict:
        nonlocal last_val, streak, lr_decayed, rollbacks
        last_val = evaluate_batches(model, val_batches)
        if world.main:
            log_file.write(step, sequences, elapsed, "val", last_val)
        if general_batches and last_val["bit_errors"] == 0:  # only a solved model can generalise
            errors = 0.0
            for size, batches in general_batches.items():
                row = evaluate_batches(model, batches)
                errors += row["bit_errors"]
                if world.main:
                    log_file.write(step, sequences, elapsed, f"val@{size}", row)
            last_val["general_bit_errors"] = errors
        met = 0 <= config.stop_bit_errors and max(
            last_val["bit_errors"], 0.0 if not general_batches
            else last_val.get("general_bit_errors", math.inf)) <= config.stop_bit_errors
        streak = streak + 1 if met else 0
        if (not lr_decayed and 0 <= config.lr_decay_bit_errors
                and last_val["bit_errors"] <= config.lr_decay_bit_errors):
            _scale_lr(optimizer, config.lr_decay)
            lr_decayed = True
        if config.rollback_bit_errors >= 0 and best.fell_apart(last_val,
                                                               config.rollback_bit_errors):
            last_val = best.restore()
            _scale_lr(optimizer, config.lr_decay)
            best.offer(last_val, replace=True)  # the decayed lr is what a later rollback gets
            rollbacks += 1
            if world.main:
                log_file.write(step, sequences, elapsed, "rollback", last_val)
        else:
            best.offer(last_val)
        save()
        return last_val

    def save() -> None:
        if world.main:
            save_checkpoint(run_dir, config, model, optimizer, data_gen, step=step,
                            sequences=sequences, elapsed_s=elapsed, metrics=last_val,
                            extra={"nan_steps": nan_steps, "streak": streak,
                                   "lr_decayed": lr_decayed, "rollbacks": rollbacks,
                                   "recent_grad_norms": [] if spikes is None
                                   else list(spikes.norms)},
                            best=best.saved())

    bar = _progress(config.max_sequences, sequences, progress if world.main else False)
    converged = 0 <= config.stop_bit_errors and streak >= config.patience_evals
    val_step = step if resume else -1
    run_cost = run_err = run_n = 0.0
    start = time.perf_counter() - elapsed
    model.train()
    # Under torchrun the ranks could see a signal at different steps: there it stops at once.
    stop = _StopSignals(enabled=world.size == 1)
    try:
        while not converged and sequences < config.max_sequences:
            if stop.signum is not None:  # between two steps: the state is consistent
                elapsed = time.perf_counter() - start
                if val_step != step:
                    save()
                raise Interrupted(stop.signum, step, run_dir)
            if config.max_seconds and time.perf_counter() - start >= config.max_seconds:
                break
            batch = task.sample(config.batch_size, data_gen)
            inputs, targets, mask = (t[:, local].to(device) for t in batch)
            logits, _ = train_model(inputs)
            per_seq = masked_bce(logits, targets, mask)
            optimizer.zero_grad(set_to_none=True)
            per_seq.mean().backward()
            if torch.isfinite(_clip(config, params, spikes)):
                optimizer.step()
            else:
                nan_steps += 1  # skip the update: one bad batch must not destroy the model
            step += 1
            sequences += config.batch_size
            bar.update(config.batch_size)
            with torch.no_grad():
                run_cost += float(per_seq.sum()) / math.log(2)
                run_err += float(bit_errors(logits, targets, mask).sum())
                run_n += per_seq.numel()

            if step % config.log_every == 0:
                elapsed = time.perf_counter() - start
                cost, err, n = world.sum([run_cost, run_err, run_n])
                values = {"cost_bits": cost / n, "bit_errors": err / n}
                if world.main:
                    log_file.write(step, sequences, elapsed, "train", values)
                bar.set_postfix(cost=f"{values['cost_bits']:.3g}",
                                bit_err=f"{values['bit_errors']:.3g}", refresh=False)
                run_cost = run_err = run_n = 0.0
            if step % config.eval_every == 0:
                elapsed = time.perf_counter() - start
                validate()
                val_step = step
                converged = 0 <= config.stop_bit_errors and streak >= config.patience_evals
        elapsed = time.perf_counter() - start
        if val_step != step:  # stopped between validations: validate and save the final state
            validate()
            converged = 0 <= config.stop_bit_errors and streak >= config.patience_evals
    finally:
        stop.restore()
        bar.close()
        if world.main:
            log_file.close()
    return TrainResult(run_dir, converged, step, sequences, elapsed, last_val, nan_steps)
