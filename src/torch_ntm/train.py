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
import dataclasses
import gc
import json
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn
from torch.optim.swa_utils import get_ema_multi_avg_fn

from torch_ntm.checkpoint import (
    CHECKPOINT_JSON,
    MAX_RECORD_BYTES,
    STAGED_CONFIG,
    STARTS,
    CheckpointError,
    KeptWeights,
    atomic_write,
    load_checkpoint,
    lock_run,
    save_checkpoint,
    stage_dir,
    start_dir,
)
from torch_ntm.config import (
    OPTIMIZERS,
    ConfigError,
    TrainConfig,
    check_resume,
    differing_keys,
    resolve_device,
)
from torch_ntm.evaluate import evaluate_batches, fixed_batches, task_objective
from torch_ntm.factories import build_model, build_task
from torch_ntm.flat_optim import FlatOptimizer
from torch_ntm.overrides import finetune_config
from torch_ntm.runfiles import own_folder, read_own
from torch_ntm.runlog import MAX_METRICS_BYTES, MetricsLog
from torch_ntm.stability import BestWeights, SpikeClip

__all__ = ["train", "TrainResult", "Interrupted", "make_optimizer", "validation_batches",
           "is_main_process"]

GENERAL_SEED = 1410  # the generalisation validation sets (eval_sizes, eval_repeats)
# Start k of a run with several (``starts``) draws from seed + START_SEED_STEP * k (mod 2**64)
START_SEED_STEP = 1_000_000
# The validation set of a task whose held-out data is not its training distribution (Omniglot's
# test split): a seed of its own, so that `ntm evaluate`'s episodes (EVAL_SEED) are not those that
# chose the weights to keep.
HELD_OUT_SEED = 1605


@dataclass
class TrainResult:
    run_dir: Path
    converged: bool
    step: int
    sequences: int
    elapsed_s: float
    metrics: dict  # last validation (after a rollback: the restored best's)
    nan_steps: int
    # False when a resumed run had nothing left to train (it had converged, or its budget was
    # spent, under the resumed config): its directory is then left as it was.
    trained: bool = True
    # With several starts (``starts``): the one that went on (k: RUN/starts/k), else None.
    start: int | None = None
    # With a fine-tune (``finetune``): the first stage's result (RUN/stages/0), else None.
    first_stage: TrainResult | None = None


class Interrupted(KeyboardInterrupt):
    """`train` was stopped by SIGINT, SIGTERM or SIGHUP and saved a checkpoint at ``step``
    first."""

    def __init__(self, signum: int, step: int, run_dir: Path):
        super().__init__(f"interrupted by signal {signum} at step {step}")
        self.signum, self.step, self.run_dir = signum, step, run_dir


# The signals that stop a training with a checkpoint: Ctrl-C, kill, and a closed terminal or
# ssh session (SIGHUP, where the platform has it)
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))


class _StopSignals:
    """While installed, the `STOP_SIGNALS` (SIGINT, SIGTERM, SIGHUP) only ask the loop to stop
    (``signum``), so that it stops between steps with a checkpoint; a second signal stops at
    once (KeyboardInterrupt). SIGHUP ignored when training starts (``nohup``) stays ignored."""

    def __init__(self, enabled: bool):
        self.signum = None
        self.previous = {}
        if enabled and threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                if sig not in (signal.SIGINT, signal.SIGTERM) and \
                        signal.getsignal(sig) is signal.SIG_IGN:  # SIGHUP under nohup
                    continue
                self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def make_optimizer(config: TrainConfig, params) -> torch.optim.Optimizer:
    # foreach: one op per update across all parameters instead of a loop over them (torch only
    # defaults to it on GPUs); faster on the CPU too (the Speed page).
    if config.optim.optimizer == "rmsprop":
        opt = config.optim
        return torch.optim.RMSprop(params, lr=opt.lr, alpha=opt.rmsprop_alpha,
                                   momentum=opt.momentum, weight_decay=opt.weight_decay,
                                   foreach=True)
    if config.optim.optimizer == "adam":
        if config.optim.weight_decay > 0:  # decoupled; without decay, Adam itself as before the key
            return torch.optim.AdamW(params, lr=config.optim.lr, amsgrad=config.optim.amsgrad,
                                     weight_decay=config.optim.weight_decay, foreach=True)
        return torch.optim.Adam(params, lr=config.optim.lr, amsgrad=config.optim.amsgrad,
                                foreach=True)
    raise ConfigError(f"unknown optimizer {config.optim.optimizer!r}; valid choices: "
                      f"{', '.join(OPTIMIZERS)}")


def validation_batches(config: TrainConfig, task) -> list:
    """The fixed validation set of a run: the same sequences at every validation and resume,
    drawn from the task's validation data (`Task.validation`: for Omniglot, the validation split;
    for priority sort with ``close_pairs``, the paper's task), with a seed of its own where that
    is not the training task."""
    validation = task.validation()
    if validation is task:
        return fixed_batches(task, config.evaluation.eval_sequences, max(config.batch_size, 64))
    return fixed_batches(validation, config.evaluation.eval_sequences, max(config.batch_size, 64),
                         seed=HELD_OUT_SEED)


def _spike_clip(config: TrainConfig, params) -> SpikeClip | None:
    """With ``clip_spikes``, the norm clip relative to the recent median (`SpikeClip`)."""
    if config.optim.clip_spikes <= 0:
        return None
    return SpikeClip(params, factor=config.optim.clip_spikes, max_norm=_max_norm(config))


def _clip(config: TrainConfig, params, spikes: SpikeClip | None) -> torch.Tensor:
    """Clip by value and/or by global norm (``clip_norm``, and spikes if ``spikes``); returns the
    global gradient norm (after value clipping), non-finite exactly when some gradient is."""
    if config.optim.clip_value > 0:
        nn.utils.clip_grad_value_(params, config.optim.clip_value)
    if spikes is not None:
        return spikes()
    max_norm = _max_norm(config)
    if math.isinf(max_norm):  # the norm only: clip_grad_norm_ would also scale every grad by 1
        return nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    return nn.utils.clip_grad_norm_(params, max_norm)


def input_weights(model: nn.Module) -> torch.Tensor:
    """The weights of ``model``'s first layer that take its input (``[units, inputs]``, the
    task's input channels first, then an NTM's or MANN's read vectors): the controller's first
    LSTM cell's ``weight_ih`` or first linear layer's ``weight``, or the LSTM baseline's
    ``weight_ih_l0``."""
    if hasattr(model, "lstm"):  # the LSTM baseline
        return model.lstm.weight_ih_l0
    controller = model.controller
    return controller.cells[0].weight_ih if hasattr(controller, "cells") else \
        controller.layers[0].weight


def _max_norm(config: TrainConfig) -> float:
    """The global-norm clip (``clip_norm``; 0: none, the norm still measured)."""
    return config.optim.clip_norm if config.optim.clip_norm > 0 else math.inf


class _World:
    """Data parallelism under ``torchrun`` (gloo on CPU, NCCL on CUDA); one process otherwise.

    Every rank draws the same global batch from the same generator and trains on its own slice;
    DDP averages the gradients, so the update equals one process's on the global batch.
    """

    def __init__(self, device: torch.device):
        self.size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.device = device
        self.owns_group = False  # whether this process group is ours to shut down
        if self.size > 1:
            import torch.distributed as dist

            if device.type == "cuda":
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
                torch.cuda.set_device(self.device)
            if not dist.is_initialized():
                dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
                self.owns_group = True

    def close(self, finished: bool) -> None:
        """Shut down the process group this run started. Left to the interpreter's exit, gloo's
        threads were torn down mid-connection, and a rank that had trained to the end aborted
        now and then ("terminate called without an active exception", exit -6). After a
        finished run the ranks first wait for each other (rank 0 is still writing the
        checkpoint); after an error, no rank waits for one that may never come."""
        if not self.owns_group:
            return
        import torch.distributed as dist

        if finished:
            dist.barrier()
        dist.destroy_process_group()
        self.owns_group = False

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

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank: a decision every rank takes at the same step."""
        if self.size == 1:
            return flag
        import torch.distributed as dist

        t = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def sum(self, values: list[float]) -> list[float]:
        if self.size == 1:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()


def is_main_process() -> bool:
    """Rank 0 under ``torchrun`` (which sets ``RANK``), or a process of its own: the one that
    writes the run directory."""
    return int(os.environ.get("RANK", "0")) == 0


def _scale_lr(optimizer: torch.optim.Optimizer, factor: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] *= factor


def _score(metrics: dict) -> tuple:
    """Order of validations, best first: fewest wrong bits in the training distribution, then
    fewest at the generalisation sets (``eval_sizes``, ``eval_repeats``, ``eval_pairs``: per
    sequence summed over the sets; none validated counts as infinitely many), or by
    ``keep_perfect_above`` and ``keep_by`` where the config has them (the metrics'
    ``selection_shortfall`` and ``selection_value``, from `_selection`), then the lowest cost.
    For a label task: fewest wrong labels per episode on the held-out data, then the lowest
    cross-entropy (it has no ``eval_sizes``). A task with a reference cost (n-grams) has random
    targets and no bit-exact solution: the lowest cost alone."""
    if "reference_cost_bits" in metrics:
        return (metrics["cost_bits"],)
    general = metrics.get("general_bit_errors")
    if "selection_value" in metrics:
        rank = (metrics["selection_shortfall"], metrics["selection_value"])
    else:
        rank = (math.inf if general is None else general,)
    return (metrics["bit_errors"], *rank, metrics["cost_bits"])


def _selection(config: TrainConfig, rows: dict, general: float) -> tuple[float, float] | None:
    """What ranks a validation by ``keep_perfect_above`` and ``keep_by``, given its rows at the
    generalisation sets by name and its wrong bits summed over them (``general``): (how far
    short of the share of perfect sequences it falls, 0 when above; the keep_by metric, or
    ``general``); None without
    either key. Shares are compared as counts of sequences (more than 0.95 of 200 is 191), not
    as the float32 shares, whose rounding could put a count on either side."""
    floor, by = config.keep_perfect_floor(), config.keep_by_set()
    if floor is None and by is None:
        return None
    short = 0.0
    if floor is not None:
        name, fraction = floor
        count = round(rows[name]["perfect"] * config.evaluation.eval_size_sequences)
        sequences = config.evaluation.eval_size_sequences
        need = math.floor(fraction * sequences + 1e-9) + 1  # more than this
        short = max(0, need - count) / config.evaluation.eval_size_sequences
    return short, (rows[by[0]][by[1]] if by is not None else general)


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

    def saved(self) -> KeptWeights | None:
        """What `save_checkpoint` keeps of it (None before the first validation)."""
        state = self.state_dict()
        if state["weights"] is None:
            return None
        return KeptWeights(state["weights"], state["optimizer"], self.metrics)


def _progress(total: int, initial: int, enabled: bool | None):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="seq", disable=None if enabled is None
                else not enabled, dynamic_ncols=True, smoothing=0.1)


def train(config: TrainConfig, run_dir: str | os.PathLike, *, resume: bool = False,
          progress: bool | None = None, new_lr: bool | None = None) -> TrainResult:
    """Train ``config`` into ``run_dir`` (or continue the run there when ``resume``).

    On a resume, ``lr`` replaces the optimizer's current rate (decayed or not) and that
    of the best weights a rollback would return to when ``new_lr``; by default (None) when it
    differs from the run's own ``lr``. (``ntm train --resume RUN --set lr=X`` passes True.)

    Stops when ``patience_evals`` validations have had <= ``stop_bit_errors``
    bit errors per sequence, in the training distribution and at every ``eval_sizes`` and
    ``eval_repeats``, with none in between over it in the training distribution; or when
    ``max_sequences``/``max_seconds`` is spent.
    Under ``torchrun`` the processes share the global batch and rank 0 writes the run directory,
    holding its lock (`torch_ntm.checkpoint.lock_run`): a second training into it is refused.

    With a ``finetune``, the run first trains its first stage (`first_stage_config`) in
    ``RUN/stages/0`` (resuming it if it was stopped, passing over it if it is done), then the
    fine-tune (`finetune_config`) from the weights it kept, in ``run_dir`` itself
    (``TrainResult.first_stage`` is the first stage's result).

    With ``starts`` above 1, the run first trains each start (`start_config`) in
    ``RUN/starts/K`` (resuming those that were stopped, passing over those that are done), then
    goes on in ``run_dir`` from the start whose last validation, that of the state that goes on,
    is best (`_score`; the first of equals), with that start's metrics, counters, optimizer and
    data streams, as if it had been the run from its first step (``TrainResult.start`` says
    which).
    """
    config.check()  # a config built in Python: the checks the command line's parser makes
    run_dir = Path(run_dir)
    check_finetune(config)
    with lock_run(run_dir) if is_main_process() else contextlib.nullcontext():
        if config.finetune and not (resume and has_checkpoint(run_dir)):
            return _train_stages(config, run_dir, progress=progress, new_lr=new_lr)
        return _train_stage(config, run_dir, resume=resume, progress=progress, new_lr=new_lr)


def _train_stage(config: TrainConfig, run_dir: Path, *, resume: bool, progress: bool | None,
                 new_lr: bool | None = None) -> TrainResult:
    """`train` of one stage (the config's ``finetune`` aside): with several starts, those first
    (until ``run_dir`` has a checkpoint of its own), else the run itself."""
    if config.stabilise.starts > 1 and not (resume and has_checkpoint(run_dir)):
        return _train_starts(config, run_dir, progress=progress, new_lr=new_lr)
    return _train(config, run_dir, resume=resume, progress=progress, new_lr=new_lr)


def _write_config(run_dir: Path, config: TrainConfig) -> None:
    """``run_dir/config.json``: the config that trains there (the folder made if need be)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(run_dir / "config.json", (config.to_json() + "\n").encode())


def start_config(config: TrainConfig, k: int) -> TrainConfig:
    """The config of start ``k`` of a run with several (``starts``): its seed (seed +
    `START_SEED_STEP` k, mod 2**64), ``start_sequences`` for its budget, no time limit."""
    return config.replaced(seed=(config.seed + START_SEED_STEP * k) % 2**64,
                           max_sequences=config.stabilise.start_sequences, max_seconds=0.0,
                           starts=1, start_sequences=0)


def first_stage_config(config: TrainConfig) -> TrainConfig:
    """The config of the first stage of a run with a fine-tune: the run's, without it."""
    return config.replaced(finetune="")


def check_finetune(config: TrainConfig) -> None:
    """Raise `ConfigError` if ``config``'s fine-tune cannot follow its first stage: a setting
    that `finetune_config` refuses, or one that changes the weights' names or shapes (the
    fine-tune starts from the first stage's weights). Nothing for a run without one."""
    if not config.finetune:
        return
    fix = "change them with --set finetune='KEY=VALUE ...', or train one stage: --set finetune="
    try:
        second = finetune_config(config, stage_dir("RUN"))
    except ConfigError as e:
        raise ConfigError(f"{e}; the second stage's settings do not fit this config "
                          f"(finetune={config.finetune!r}): {fix}") from None
    if _weight_shapes(second) != _weight_shapes(config):
        raise ConfigError(f"finetune={config.finetune!r} changes the model's weights "
                          f"({_model_differences(second, config)}); a fine-tune starts from the "
                          f"first stage's weights, so it must keep their shapes: {fix}")


def has_checkpoint(run_dir: Path) -> bool:
    return (run_dir / CHECKPOINT_JSON).is_file()


def starting_config(run_dir: str | os.PathLike) -> TrainConfig | None:
    """The config of a run with several starts that is still training them (no checkpoint of
    its own yet; ``ntm train --resume`` goes on with them): its ``config.json``. None for any
    other directory.

    Raises:
        CheckpointError: its config.json is not a readable config.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or has_checkpoint(run_dir):
        return None
    if (run_dir / STAGED_CONFIG).is_file():  # a run with a fine-tune, before the fine-tune saved
        return _read_config(run_dir / STAGED_CONFIG)
    if not (run_dir / STARTS).is_dir():
        return None
    config = _read_config(run_dir / "config.json")
    return config if config.stabilise.starts > 1 else None


def _read_config(path: Path) -> TrainConfig:
    try:
        config = TrainConfig.from_dict(json.loads(read_own(path, MAX_RECORD_BYTES,
                                                           "config.json")), source=str(path))
    except (OSError, ValueError, RecursionError, ConfigError) as e:
        raise CheckpointError(f"{path}: not a readable run config ({e})") from None
    return config


def _train_stages(config: TrainConfig, run_dir: Path, *, progress: bool | None,
                  new_lr: bool | None = None) -> TrainResult:
    """`train` with a fine-tune, before ``run_dir`` has a checkpoint of its own: the first
    stage in `stage_dir` (``new_lr`` as `train`'s if it resumes), then the fine-tune from its
    kept weights in ``run_dir``."""
    first = stage_dir(run_dir)
    if is_main_process():  # the run's own config, which `ntm train --resume` reads until the
        _write_config(run_dir, config)  # fine-tune's first checkpoint
        own_folder(first.parent)  # not through a link planted there
        own_folder(first)
        atomic_write(run_dir / STAGED_CONFIG, (config.to_json() + "\n").encode())
    try:
        with lock_run(first) if is_main_process() else contextlib.nullcontext():
            before = _train_stage(first_stage_config(config), first,
                                  resume=has_checkpoint(first), progress=progress, new_lr=new_lr)
        result = _train(finetune_config(config, first), run_dir, resume=False,
                        progress=progress)
    except Interrupted as e:  # saved; `--resume RUN` goes on from where it stopped
        raise Interrupted(e.signum, e.step, run_dir) from None
    return dataclasses.replace(result, first_stage=before)


def _train_starts(config: TrainConfig, run_dir: Path, *, progress: bool | None,
                  new_lr: bool | None = None) -> TrainResult:
    """`train` with several starts, before ``run_dir`` has a checkpoint of its own: each
    start, then the best one on in ``run_dir`` (``new_lr`` as `train`'s for the starts it
    resumes and for the one that goes on)."""
    main = is_main_process()
    if main:  # the run's own config from the first: `ntm train --resume` reads it
        _write_config(run_dir, config)
    scores = []
    for k in range(config.stabilise.starts):
        folder = start_dir(run_dir, k)
        if main:  # not through a link planted there
            own_folder(folder.parent)
            own_folder(folder)
        try:
            _train(start_config(config, k), folder, resume=has_checkpoint(folder),
                   progress=progress, new_lr=new_lr)
        except Interrupted as e:  # saved; `--resume RUN` goes on with this start
            raise Interrupted(e.signum, e.step, run_dir) from None
        # ranked by the state that goes on, not by the weights it keeps: a start can leave a
        # plateau and fall back onto it (n-grams, seed 2's third start: 148.3 bits per
        # sequence at 28,800 sequences, 166.8 at 41,600)
        scores.append(_score(load_checkpoint(folder).metrics))
    best = min(range(len(scores)), key=lambda k: scores[k])
    chosen = start_dir(run_dir, best)
    if main:  # its log goes on as the run's
        atomic_write(run_dir / "metrics.csv", read_own(chosen / "metrics.csv", MAX_METRICS_BYTES,
                                                       "metrics.csv"))
    result = _train(config, run_dir, resume=True, progress=progress, new_lr=new_lr,
                    source=chosen)
    return dataclasses.replace(result, start=best)


def load_initial_weights(config: TrainConfig, model: nn.Module) -> None:
    """Load the weights ``config.init_from`` names into ``model`` (nothing if it is empty): a
    run's kept weights, a checkpoint's, or a shipped model's (``pretrained:NAME``).

    Raises:
        ConfigError: no shipped model of that name.
        CheckpointError: no checkpoint there, or its weights do not fit ``model``.
    """
    source = config.init_from
    if not source:
        return
    if source.startswith("pretrained:"):
        from torch_ntm import pretrained

        source = pretrained.path(source.removeprefix("pretrained:"))
    ckpt = load_checkpoint(source)
    try:
        ckpt.load_weights_into(model, ckpt.kept_weights())
    except CheckpointError as e:  # say which settings make the difference, not only a shape
        differ = _model_differences(ckpt.config, config)
        if not differ:
            raise
        raise CheckpointError(f"{e}; init_from {config.init_from} has {differ}: set those to "
                              f"its values to start from its weights") from None


def _weight_shapes(config: TrainConfig) -> dict:
    """The names and shapes of the weights of ``config``'s model (built on the meta device)."""
    model = build_model(config, build_task(config), device="meta")
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _model_differences(theirs: TrainConfig, ours: TrainConfig) -> str:
    """The settings (config keys, ``task.KEY`` for the task's) in which ``theirs`` differs from
    ``ours`` such that the weights' names or shapes change, as "KEY=THEIRS (here OURS)": each
    differing key is tried alone on ``ours``, its model built on the meta device; empty if none
    matters alone."""

    def matters(changed: TrainConfig) -> bool:
        try:
            return _weight_shapes(changed) != here
        except (ConfigError, ValueError, TypeError):  # not buildable alone: it matters
            return True

    def theirs_for(key: str) -> tuple:
        """(ours' value of ``key``, theirs, ours with that key set to theirs)."""
        name = key.removeprefix("task.")
        if name == key:
            other = theirs.value(key)
            return ours.value(key), other, ours.replaced(**{key: other})
        other = getattr(theirs.task_params, name)
        task = dataclasses.replace(ours.task_params, **{name: other})
        return getattr(ours.task_params, name), other, dataclasses.replace(ours, task_params=task)

    here = _weight_shapes(ours)
    found = [f"task {theirs.task!r} (here {ours.task!r})"] if theirs.task != ours.task else []
    for key in differing_keys(ours, theirs):
        if key not in ("init_from", "task_params", "task"):
            mine, other, changed = theirs_for(key)
            if matters(changed):
                found.append(f"{key}={other!r} (here {mine!r})")
    return ", ".join(found)


class _Running(NamedTuple):
    """The training batches since the last "train" row: summed cost in bits, wrong bits, and
    sequences (a checkpoint keeps it as a list)."""

    cost_bits: float
    bit_errors: float
    sequences: float

    @classmethod
    def none(cls) -> _Running:
        """No batches yet."""
        return cls(0.0, 0.0, 0.0)

    @classmethod
    def from_record(cls, saved: object, path: object) -> _Running:
        """The sums a checkpoint at ``path`` kept as a list (`CheckpointError` if not three;
        `load_checkpoint` has checked that its ``extra`` holds only numbers and lists of them)."""
        if not (isinstance(saved, list) and len(saved) == 3):
            raise CheckpointError(f"{path}: invalid checkpoint record (running must be a list "
                                  f"of 3 numbers, got {saved!r})")
        return cls(*saved)

    def plus(self, cost_bits: float, bit_errors: float, sequences: float) -> _Running:
        return _Running(self.cost_bits + cost_bits, self.bit_errors + bit_errors,
                        self.sequences + sequences)


@dataclass
class _State:
    """What changes while a run trains. A checkpoint keeps all of it (the counters in its record,
    the rest in ``extra``), so that a resumed run goes on exactly as if never stopped."""

    step: int = 0
    sequences: int = 0
    elapsed_s: float = 0.0
    metrics: dict = field(default_factory=dict)  # the last validation
    nan_steps: int = 0  # steps whose gradient was not finite: the update was skipped
    streak: int = 0  # validations that met the stopping criterion (see `train`)
    lr_decayed: bool = False  # the one decay of lr_decay_bit_errors is done
    rollbacks: int = 0
    # The curriculum's largest size now (curriculum_start, then up); 0 once it reaches
    # the task's own sizes, or without one.
    curriculum_size: int = 0
    running: _Running = field(default_factory=_Running.none)
    # input_max_norm_ramp's start: the capped columns' largest norm after the first update
    # (None until then).
    input_norm_start: float | None = None

    EXTRA = ("nan_steps", "streak", "lr_decayed", "rollbacks", "curriculum_size", "running",
             "input_norm_start")

    def extra(self) -> dict:
        """The ``EXTRA`` fields a checkpoint keeps (one that is None is left out)."""
        values = {key: getattr(self, key) for key in self.EXTRA}
        return {key: value for key, value in values.items() if value is not None}

    @classmethod
    def from_checkpoint(cls, ckpt) -> "_State":
        saved = {key: ckpt.extra[key] for key in cls.EXTRA if key in ckpt.extra}
        if "running" in saved:
            saved["running"] = _Running.from_record(saved["running"], ckpt.path)
        return cls(step=ckpt.step, sequences=ckpt.sequences, elapsed_s=ckpt.elapsed_s,
                   metrics=ckpt.metrics, **saved)


class _Run:
    """A run's objects (model, optimizer, data, validation sets, log) and its `_State`, with the
    named steps `_train` loops over."""

    def __init__(self, config: TrainConfig, run_dir: Path, resume: bool,
                 new_lr: bool | None = None, source: Path | None = None):
        """``source``: with ``resume``, the run to go on from when not ``run_dir`` itself (the
        best of several starts, `_train_starts`)."""
        torch.set_num_threads(config.threads)
        self.config, self.run_dir = config, run_dir
        self.world = _World(resolve_device(config.device))
        self.local = self.world.local_batch(config.batch_size)
        torch.manual_seed(config.seed)
        self.data_gen = torch.Generator().manual_seed(config.seed)
        self.task = build_task(config)
        self.objective = task_objective(self.task)
        self.model = build_model(config, self.task, device=self.world.device)
        if not resume:  # a resumed run has its own weights
            load_initial_weights(config, self.model)
        named = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        # The parameters become views of one tensor that the optimizer steps at once: bitwise
        # the same update, in about 0.6 of the time (flat_optim.py).
        self.optimizer = FlatOptimizer(self.params, lambda flat: make_optimizer(config, flat))
        # The running average of the weights (ema_decay), by parameter name; None
        # without one. It starts from the initial weights.
        self.averaged = None
        if config.optim.ema_decay:
            self.averaged = {name: p.detach().clone() for name, p in named}
            self._average = get_ema_multi_avg_fn(config.optim.ema_decay)
        self.spikes = _spike_clip(config, self.params)
        self.best = _Best(self.model, self.optimizer)
        self.state = _State()
        self.saved_step = -1
        self.timed_out = False  # stopped by max_seconds
        if resume:
            self._restore(load_checkpoint(source or run_dir), new_lr, source is not None)
        elif config.stabilise.curriculum_start < self.task.train_size:
            self.state.curriculum_size = config.stabilise.curriculum_start
        self.log = None
        # Nothing left to train: the directory keeps the config that trained it (and no new
        # log), rather than one that never ran.
        self.idle = resume and (self.finished or self.out_of_time(self.state.elapsed_s))
        if self.world.main and not self.idle:
            run_dir.mkdir(parents=True, exist_ok=True)
            resume_at = (self.state.step, self.state.sequences) if resume else None
            self.log = MetricsLog(run_dir, self.task.extra_metrics, resume_at)  # checks it
            _write_config(run_dir, config)
        self.train_model = self.world.wrap(self.model)
        # Every rank validates the whole (small) set, so all reach the same stopping decision.
        self.val_batches = validation_batches(config, self.task)
        # Drawn from a seed of their own, so that `ntm evaluate`'s tables (EVAL_SEED) test the
        # model on other sequences than those that chose when to stop and which weights to keep.
        self.general_batches = {
            name: fixed_batches(task, config.evaluation.eval_size_sequences, 50, seed=GENERAL_SEED)
            for name, task in config.generalisation_sets().items()}
        # The same weights with eval_memory_size rows (no parameter depends on the rows).
        self.general_model = self.model
        if config.eval_overrides() and self.general_batches:
            cuda = [self.world.device] if self.world.device.type == "cuda" else []
            with torch.random.fork_rng(devices=cuda):  # its initial weights are not used: they
                # must not draw from the generators training goes on with (an exact resume)
                self.general_model = build_model(config, self.task, device=self.world.device,
                                                 **config.eval_overrides())
        self.start = time.perf_counter() - self.state.elapsed_s
        self.model.train()

    def _restore(self, ckpt, new_lr: bool | None, from_start: bool = False) -> None:
        start = ckpt.config.stabilise
        check_resume(ckpt.config, self.config if not from_start else self.config.replaced(
            seed=ckpt.config.seed, starts=start.starts, start_sequences=start.start_sequences))
        ckpt.load_weights_into(self.model)
        ckpt.restore_train_state(self.optimizer, self.data_gen)  # the lr is in its state
        self.state = _State.from_checkpoint(ckpt)
        size = self.state.curriculum_size
        if (isinstance(size, bool) or not isinstance(size, int)
                or not 0 <= size <= self.task.train_size):
            raise CheckpointError(f"{ckpt.path}: extra.curriculum_size is {size!r}, not a size "
                                  f"of this task from 1 to {self.task.train_size} (or 0: no "
                                  f"curriculum); the record was edited, or is of another task")
        self.saved_step = self.state.step
        if self.spikes is not None:
            self.spikes.load_state_dict({"norms": ckpt.extra.get("recent_grad_norms", [])})
        if new_lr is None:  # by default, a rate other than the run's own
            new_lr = self.config.optim.lr != ckpt.config.optim.lr
        if self.averaged is not None:
            self._restore_average(ckpt)
        kept = ckpt.best()
        if kept is not None:  # the run's best so far, saved beside its latest state
            self.best.metrics = kept.metrics
            self.best.load_state_dict({"score": _score(kept.metrics), "weights": kept.weights,
                                       "optimizer": kept.optimizer})
        elif self.state.metrics:
            self.best.offer(self.state.metrics)
        if new_lr:  # it replaces the current rate, and the one a rollback would restore
            self.best.set_lr(self.config.optim.lr)
            for group in self.optimizer.param_groups:
                group["lr"] = self.config.optim.lr

    def _restore_average(self, ckpt) -> None:
        saved = ckpt.averaged()
        if saved is None:  # the run had no average until now: it starts from these weights
            for value, p in zip(self.averaged.values(), self.params):
                value.copy_(p.detach())
            return
        if saved.keys() != self.averaged.keys():
            raise CheckpointError(f"{ckpt.path}: its average of the weights does not fit this "
                                  "model configuration (other parameter names)")
        for name, value in self.averaged.items():
            value.copy_(saved[name])

    @contextlib.contextmanager
    def _averaged_weights(self):
        """The model holds the average of its weights (with ema_decay) inside, its own weights
        again after; but after a rollback inside, both are the kept weights it rolled back to."""
        if self.averaged is None:
            yield
            return
        average = list(self.averaged.values())
        own = [p.detach().clone() for p in self.params]
        rollbacks = self.state.rollbacks
        with torch.no_grad():
            for p, a in zip(self.params, average):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                rolled_back = self.state.rollbacks != rollbacks
                for p, a, o in zip(self.params, average, own):
                    if rolled_back:
                        a.copy_(p)
                    else:
                        p.copy_(o)

    @property
    def converged(self) -> bool:
        evaluation = self.config.evaluation
        return (0 <= evaluation.stop_bit_errors
                and self.state.streak >= evaluation.patience_evals)

    @property
    def finished(self) -> bool:
        """Converged, or the sequence budget spent (the time budget is `out_of_time`)."""
        return self.converged or self.state.sequences >= self.config.max_sequences

    def out_of_time(self, elapsed: float | None = None) -> bool:
        """Whether ``elapsed`` seconds of training (default: so far, as any rank's clock has
        it: under torchrun all stop at the same step, or one would wait in a collective the
        others never join) spend ``max_seconds``."""
        limit = self.config.max_seconds
        if not limit:
            return False
        if elapsed is None:
            return self.world.any(time.perf_counter() - self.start >= limit)
        return elapsed >= limit

    def _clock(self) -> None:
        self.state.elapsed_s = time.perf_counter() - self.start
        if self.timed_out:  # under torchrun on the first rank's clock to reach the limit
            self.state.elapsed_s = max(self.state.elapsed_s, self.config.max_seconds)

    def train_step(self) -> None:
        """One optimizer step on a fresh batch; the update is skipped if a gradient is not
        finite (one bad batch must not destroy the model)."""
        config, state = self.config, self.state
        task = self.task
        if state.curriculum_size:
            task = task.up_to(state.curriculum_size)
        batch = task.sample(config.batch_size, self.data_gen)
        inputs, targets, mask = (t[:, self.local].to(self.world.device) for t in batch)
        logits, _ = self.train_model(inputs)
        per_seq = self.objective.loss(logits, targets, mask)
        self.optimizer.zero_grad(set_to_none=True)
        per_seq.mean().backward()
        if torch.isfinite(_clip(config, self.params, self.spikes)):
            self.optimizer.step()
            if config.optim.input_max_norm:
                self._cap_input_weights(state.sequences + config.batch_size)
            if self.averaged is not None:
                self._average(list(self.averaged.values()), self.params, None)
        else:
            state.nan_steps += 1
        state.step += 1
        passed = state.sequences
        state.sequences += config.batch_size
        for milestone in config.stabilise.lr_milestones:
            if passed < milestone <= state.sequences:
                _scale_lr(self.optimizer, config.stabilise.lr_decay)
        with torch.no_grad():
            state.running = state.running.plus(
                float(per_seq.sum()) / math.log(2),
                float(self.objective.errors(logits, targets, mask).sum()), per_seq.numel())

    @torch.no_grad()
    def _cap_input_weights(self, sequences: int) -> None:
        """``input_max_norm`` after an update, ``sequences`` into training: each capped
        channel's column of the first layer's input weights scaled down to the cap where its
        norm is above it; the cap falls from the columns' largest norm at the first update to
        ``input_max_norm`` over ``input_max_norm_ramp`` sequences."""
        config, state = self.config, self.state
        weights = input_weights(self.model)
        channels = config.optim.input_max_norm_channels or range(self.task.input_size)
        if state.input_norm_start is None:
            state.input_norm_start = float(weights[:, list(channels)].norm(dim=0).max())
        cap, start = config.optim.input_max_norm, state.input_norm_start
        if config.optim.input_max_norm_ramp:
            done = min(1.0, sequences / config.optim.input_max_norm_ramp)
            cap = max(cap, start + (cap - start) * done)
        for channel in channels:
            norm = float(weights[:, channel].norm())
            if norm > cap:
                weights[:, channel].mul_(cap / norm)

    def _running_total(self) -> _Running:
        """The running sums of every process added up (this process's own without torchrun)."""
        return _Running(*self.world.sum(list(self.state.running)))

    def log_training(self) -> dict:
        """A ``train`` row: the averages since the last one (over all processes)."""
        self._clock()
        total = self._running_total()
        values = {"cost_bits": total.cost_bits / total.sequences,
                  "bit_errors": total.bit_errors / total.sequences}
        self._write("train", values)
        self.state.running = _Running.none()
        size = self.state.curriculum_size
        if size and values["bit_errors"] <= self.config.stabilise.curriculum_bit_errors:
            size += 1  # a row "curriculum@SIZE": from here on, sizes up to SIZE
            self._write(f"curriculum@{size}", {})
            self.state.curriculum_size = 0 if size >= self.task.train_size else size
        return values

    def _write(self, split: str, values: dict) -> None:
        if self.log is not None:
            s = self.state
            self.log.write(s.step, s.sequences, s.elapsed_s, split, values)

    def validate(self) -> None:
        """Validate (and at ``eval_sizes``, ``eval_repeats`` once the training distribution is
        solved), count towards stopping, decay or roll back as configured, keep the best, save.
        With ``ema_decay``, all of it but the save on the average of the weights."""
        with self._averaged_weights():
            self._validate()
        self.save()

    def _validate(self) -> None:
        metrics, worst = self._evaluate()
        self._count_towards_stopping(metrics["bit_errors"], worst)
        self._decay_once(metrics["bit_errors"])
        self.state.metrics = self._keep_or_roll_back(metrics)

    def _evaluate(self) -> tuple[dict, float]:
        """The validation's metrics (logged), and its wrong bits per sequence at the worst of
        the training distribution and the generalisation sets (inf while these are not
        validated)."""
        self._clock()
        metrics = evaluate_batches(self.model, self.val_batches)
        self._write("val", metrics)
        # Wrong bits per sequence at each generalisation set (validated only once the training
        # distribution has none: only then can it generalise); their sum ranks validations.
        at_sizes = [math.inf] if self.general_batches else []
        if self.general_batches and metrics["bit_errors"] == 0:
            if self.general_model is not self.model:
                self.general_model.load_state_dict(self.model.state_dict())
            rows = {}
            for name, batches in self.general_batches.items():
                rows[name] = evaluate_batches(self.general_model, batches)
                self._write(f"val@{name}", rows[name])
            at_sizes = [row["bit_errors"] for row in rows.values()]
            metrics["general_bit_errors"] = sum(at_sizes)
            selection = _selection(self.config, rows, metrics["general_bit_errors"])
            if selection is not None:
                metrics["selection_shortfall"], metrics["selection_value"] = selection
        return metrics, max([metrics["bit_errors"], *at_sizes])

    def _count_towards_stopping(self, bit_errors: float, worst: float) -> None:
        """Count a validation that meets ``stop_bit_errors`` everywhere (``worst``). Counted
        since the last one with too many wrong bits in the training distribution (``bit_errors``):
        one that fails only at eval_sizes does not count, nor start the count again (at 6x the
        training length a good solution can lose one sequence of 100 at one validation and have
        it back at the next: docs/stability.md)."""
        if not 0 <= bit_errors <= self.config.evaluation.stop_bit_errors:
            self.state.streak = 0
        elif worst <= self.config.evaluation.stop_bit_errors:
            self.state.streak += 1

    def _decay_once(self, bit_errors: float) -> None:
        """The one decay of the rate, at the first validation at or under
        ``lr_decay_bit_errors``."""
        config, state = self.config, self.state
        if (not state.lr_decayed and 0 <= config.stabilise.lr_decay_bit_errors
                and bit_errors <= config.stabilise.lr_decay_bit_errors):
            _scale_lr(self.optimizer, config.stabilise.lr_decay)
            state.lr_decayed = True

    def _keep_or_roll_back(self, metrics: dict) -> dict:
        """Offer this validation's weights as the best; or, if the run fell apart
        (``rollback_bit_errors``), restore the best with a decayed rate. Returns the metrics of
        the weights the model now holds."""
        limit = self.config.stabilise.rollback_bit_errors
        if not (0 <= limit and self.best.fell_apart(metrics, limit)):
            self.best.offer(metrics)
            return metrics
        metrics = self.best.restore()
        _scale_lr(self.optimizer, self.config.stabilise.lr_decay)
        self.best.offer(metrics, replace=True)  # the decayed lr is what a later one gets
        self.state.rollbacks += 1
        self._write("rollback", metrics)
        return metrics

    def save(self) -> None:
        """Write the checkpoint (rank 0). Every process calls it: the checkpoint keeps the
        running sums of all of them, which rank 0 holds from here."""
        self.saved_step = self.state.step
        totals = self._running_total()
        self.state.running = totals if self.world.main else _Running.none()
        if not self.world.main:
            return
        s = self.state
        norms = [] if self.spikes is None else list(self.spikes.norms)
        save_checkpoint(self.run_dir, self.config, self.model, self.optimizer, self.data_gen,
                        step=s.step, sequences=s.sequences, elapsed_s=s.elapsed_s,
                        metrics=s.metrics, extra={**s.extra(), "recent_grad_norms": norms},
                        best=self.best.saved(), averaged=self.averaged)

    def close(self, finished: bool) -> None:
        """Close the log, then the process group under torchrun: DDP's wrapper goes first.
        Its reducer shares the group, and a group freed with the reducer is destroyed with the
        GIL held: its destructor joins gloo's worker threads, one of which may still need the
        GIL to free the tensors of the last collective (the barrier's). A deadlock, in 1 of 4
        runs on two busy cores. Freed by ``destroy_process_group``, the group lets go of the
        GIL first."""
        if self.log is not None:
            self.log.close()
        if self.train_model is not self.model:
            self.train_model = self.model
            gc.collect()  # DDP sits in a reference cycle: only a collection frees it
        self.world.close(finished)


def _train(config: TrainConfig, run_dir: Path, *, resume: bool, progress: bool | None,
           new_lr: bool | None = None, source: Path | None = None):
    run = _Run(config, run_dir, resume, new_lr, source)
    state = run.state
    bar = _progress(config.max_sequences, state.sequences, progress if run.world.main else False)
    # Under torchrun the ranks could see a signal at different steps: there it stops at once.
    stop = _StopSignals(enabled=run.world.size == 1)
    completed = False
    try:
        if not resume and config.init_from:  # the weights it starts from are a candidate too:
            run.validate()  # without this one, a fine-tuning could only keep worse ones
        while not run.finished:
            if stop.signum is not None:  # between two steps: the state is consistent
                run._clock()
                if run.saved_step != state.step:
                    run.save()
                raise Interrupted(stop.signum, state.step, run_dir)
            if run.out_of_time():
                run.timed_out = True
                break
            run.train_step()
            bar.update(config.batch_size)
            if state.step % config.log_every == 0:
                values = run.log_training()
                bar.set_postfix(cost=f"{values['cost_bits']:.3g}",
                                bit_err=f"{values['bit_errors']:.3g}", refresh=False)
            if state.step % config.evaluation.eval_every == 0:
                run.validate()
        if run.saved_step != state.step:  # stopped between validations: validate, save
            run.validate()
        elif run.timed_out:  # out of time just after a save: the checkpoint's clock must say
            run._clock()     # so, or resuming with the same budget would train a step more
            run.save()
        completed = True
    finally:
        stop.restore()
        bar.close()
        run.close(finished=completed)
    return TrainResult(run_dir, run.converged, state.step, state.sequences, state.elapsed_s,
                       state.metrics, state.nan_steps, trained=not run.idle)
