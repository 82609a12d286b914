"""Checkpoints: weights in safetensors, configuration and training state in JSON. No pickle.

A run directory holds:

    checkpoint.json                   config, counters, metrics, optimizer hyper-parameters,
                                      and the names and SHA-256 of the two files below
    weights-<step>.safetensors        the model's state_dict
    train-state-<step>.safetensors    optimizer tensors and RNG states (for an exact resume)

Every file is written to a temporary name, flushed to disk and renamed into place; the JSON is
renamed last and only then are superseded files removed (other steps' weights and training state,
and temporary files a crashed save left). A crash at any moment therefore leaves a
`checkpoint.json` that names complete files, and a modified or truncated file is caught by its
hash before it is parsed.

A record is not trusted: the file names it gives must be plain names of the two patterns above
(nothing outside the run directory is read or removed), each with its SHA-256, and a named file
must be a regular file.

Every file of a run is written, removed and read by the rule of `torch_ntm.runfiles` (never
through a link; atomically; every read bounded), whose helpers this module re-exports.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from torch_ntm.config import ConfigError, TrainConfig
from torch_ntm.factories import build_model, build_task, model_config
from torch_ntm.runfiles import (
    CheckpointError,
    atomic_write,
    check_own,
    open_own,
    own_folder,
    read_own,
    refuse_foreign,
    remove_file,
)

__all__ = [
    "atomic_write",
    "remove_file",
    "open_own",
    "own_folder",
    "read_own",
    "CheckpointError",
    "Checkpoint",
    "KeptWeights",
    "save_checkpoint",
    "load_checkpoint",
    "find_checkpoint",
    "lock_run",
    "clear_run",
]

FORMAT = "torch-ntm-checkpoint"
VERSION = 1
CHECKPOINT_JSON = "checkpoint.json"
# Checkpoints written before the caps on beta and gamma existed hold models of the paper's
# unbounded form: a config without these keys means that, whatever today's defaults are.
PRE_CAP_CONFIG = {"max_beta": 0.0, "max_gamma": 0.0}
LOCK = ".lock"  # held (flock) by the one process that writes the run
# The only names a record may give for its files: plain names in the run directory.
_FILE_NAMES = {"weights": re.compile(r"weights-[0-9]+\.safetensors"),
               "train_state": re.compile(r"train-state-[0-9]+\.safetensors"),
               "best": re.compile(r"best-[0-9]+\.safetensors")}
# The most a checkpoint.json may hold (a record is a few kB: config, counters, metrics)
MAX_RECORD_BYTES = 16 << 20
# The most a weights, training-state or best file may hold: the largest model a config may
# build (`torch_ntm.config.MAX_PARAMETERS` float32 parameters, 1 GiB) with its optimizer's state
# (up to three tensors of its size), the average of the weights, and room to spare.
MAX_TENSOR_FILE_BYTES = 8 << 30
# Temporary files of `atomic_write` (".NAME.RANDOM.tmp") for the files a run writes.
_TEMPORARY = re.compile(r"\.(checkpoint\.json|config\.json|metrics\.csv|"
                        r"(weights|train-state|best)-[0-9]+\.safetensors)\.[A-Za-z0-9_]+\.tmp")


class KeptWeights(NamedTuple):
    """A run's best validation: what it keeps and rolls back to."""

    weights: dict  # parameter name -> tensor
    optimizer: dict | None  # the optimizer's state_dict at those weights (None: not recorded)
    metrics: dict  # the validation's


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cpu_contiguous(tensors: dict) -> dict:
    return {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}


def _optimizer_split(optimizer: torch.optim.Optimizer | dict) -> tuple[dict, dict]:
    """Split an optimizer's state_dict (or the dict itself) into tensors (for safetensors) and
    the JSON-able rest."""
    sd = optimizer if isinstance(optimizer, dict) else optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, entries in sd["state"].items():
        for key, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"optim.{idx}.{key}"] = value
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _optimizer_join(tensors: dict, meta: dict) -> dict:
    state: dict = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = value
    for name, value in meta["scalars"].items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    for group in meta["param_groups"]:  # what the optimizer computes with, checked here: a
        # value of another type passed loading and failed at the first step, and a NaN or
        # negative rate trained on
        for key in ("lr", "eps", "weight_decay", "momentum", "alpha", "dampening"):
            if key not in group:
                continue
            value, positive = group[key], key == "eps"  # eps divides: 0 gives NaN steps
            if not (_number(value) and (value > 0 if positive else value >= 0)
                    and value < math.inf):
                raise ValueError(f"param_groups {key} is {value!r}, not a finite number "
                                 f"{'> 0' if positive else '>= 0'}")
        if "betas" in group and not (isinstance(group["betas"], list)
                                     and all(_number(b) and 0 <= b < 1 for b in group["betas"])):
            raise ValueError(f"param_groups betas is {group['betas']!r}, not two numbers in "
                             f"[0, 1)")
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    run_dir: str | os.PathLike,
    config: TrainConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    data_generator: torch.Generator | None = None,
    *,
    step: int = 0,
    sequences: int = 0,
    elapsed_s: float = 0.0,
    metrics: dict | None = None,
    extra: dict | None = None,
    best: KeptWeights | None = None,
    averaged: dict | None = None,
) -> Path:
    """Write a checkpoint into ``run_dir`` atomically; returns the path of its JSON file.

    ``best`` is the run's best validation so far (`KeptWeights`): saved beside the latest
    state, it is the model the run keeps (`Checkpoint.model`) and what a resumed run's rollback
    returns to. ``averaged`` (parameter name -> tensor), the running average of the weights
    (``ema_decay``), is saved with the training state."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    json_path = run_dir / CHECKPOINT_JSON
    weights_name = f"weights-{step:08d}.safetensors"
    weights = st_save(_cpu_contiguous(model.state_dict()))
    atomic_write(run_dir / weights_name, weights)
    record = {
        "format": FORMAT,
        "version": VERSION,
        "config": config.to_dict(),
        "model": model_config(config, model),
        "step": step,
        "sequences": sequences,
        "elapsed_s": elapsed_s,
        "metrics": metrics or {},
        "extra": extra or {},
        "weights": weights_name,
        "weights_sha256": _sha256(weights),
    }
    if optimizer is not None:
        tensors, meta = _optimizer_split(optimizer)
        tensors["rng.torch"] = torch.get_rng_state()
        if data_generator is not None:
            tensors["rng.data"] = data_generator.get_state()
        tensors.update({f"averaged.{name}": value for name, value in (averaged or {}).items()})
        state_name = f"train-state-{step:08d}.safetensors"
        data = st_save(_cpu_contiguous(tensors))
        atomic_write(run_dir / state_name, data)
        record["optimizer"] = meta
        record["train_state"] = state_name
        record["train_state_sha256"] = _sha256(data)
    if best is not None:
        tensors = {f"model.{k}": v for k, v in best.weights.items()}
        meta = None
        if best.optimizer is not None:
            optim_tensors, meta = _optimizer_split(best.optimizer)
            tensors.update(optim_tensors)
        best_name = f"best-{step:08d}.safetensors"
        data = st_save(_cpu_contiguous(tensors))
        atomic_write(run_dir / best_name, data)
        record.update(best=best_name, best_sha256=_sha256(data),
                      best_optimizer=meta, best_metrics=dict(best.metrics))
    atomic_write(json_path, json.dumps(record, indent=2).encode())
    _remove_superseded(run_dir, {record["weights"], record.get("train_state"), record.get("best")})
    return json_path


def _remove_superseded(run_dir: Path, keep: set) -> None:
    """The new JSON is in place: remove the other steps' files and leftover temporary files.

    Only names of the patterns a run writes are removed, never a name read from a record."""
    for entry in os.scandir(run_dir):
        name = entry.name
        ours = any(p.fullmatch(name) for p in _FILE_NAMES.values()) or _TEMPORARY.fullmatch(name)
        if ours and name not in keep and entry.is_file(follow_symlinks=False):
            Path(entry.path).unlink(missing_ok=True)


_HELD: dict[Path, int] = {}  # run directories this process has locked -> nesting depth


def _holder(fd: int) -> str:
    """What the process holding the lock ``fd`` says it is doing (a sweep, a training, an
    export). It writes that just after taking the lock, so an empty lock is read again for a
    moment before it is called "writing it"."""
    for _ in range(50):
        said = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
        if said:
            return said
        time.sleep(0.01)
    return "writing it"


@contextlib.contextmanager
def lock_run(run_dir: str | os.PathLike, holder: str = "training into this run directory"):
    """Hold ``RUN/.lock`` (an exclusive `fcntl.flock`) while the block runs, creating ``RUN``.

    One process writes a run: a second one gets a `CheckpointError` at once, saying what the
    first is doing (its ``holder``, which it writes into the lock: a sweep, an export lock
    their folders too). Re-entrant within a
    process (the command line locks before `torch_ntm.train.train` locks again). The lock goes
    with the process, so a killed training leaves nothing to clean up.
    """
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        key = run_dir.resolve()
        if key in _HELD:
            _HELD[key] += 1
            fd = None
        else:
            fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link planted as the lock: its target is not created
            refuse_foreign(run_dir / LOCK, os.lstat(run_dir / LOCK))
        raise CheckpointError(f"{run_dir}: cannot write the run directory ({e.strerror})") from None
    if fd is not None:
        try:
            refuse_foreign(run_dir / LOCK, os.fstat(fd))
        except CheckpointError:
            os.close(fd)
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            doing = _holder(fd)
            os.close(fd)
            raise CheckpointError(f"{run_dir}: another process is {doing} (it holds "
                                  f"{run_dir / LOCK}); wait for it to end or choose another "
                                  f"directory") from None
        with contextlib.suppress(OSError):  # what this process is doing, for a refused one
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{holder} (process {os.getpid()})".encode(), 0)
        _HELD[key] = 1
    try:
        yield run_dir
    finally:
        _HELD[key] -= 1
        if fd is not None:  # the outermost holder
            del _HELD[key]
            os.close(fd)


# The files `torch_ntm.plot.plot_run` writes into a run's figures/ (`clear_run` removes them)
RUN_FIGURES = ("io.png", "attention.png", "memory.png", "learning_curve.png", "accuracy.png",
               "generalisation.png")
# Where the shipped models live (`torch_ntm.pretrained.ROOT`)
SHIPPED = Path(__file__).parent / "pretrained"


def _is_config(data: bytes) -> bool:
    """Whether ``data`` reads as a run's config.json."""
    return {"task", "task_params", "preset"} <= set(json.loads(data))


def foreign_files(run_dir: str | os.PathLike) -> list[str]:
    """The names in ``run_dir`` that a run writes but that do not hold what a run writes there
    (``checkpoint.json`` without the checkpoint marker, a ``config.json`` that is not a config,
    a ``metrics.csv`` without its columns), or that are links or not regular files (a folder:
    ``figures``, ``tb``, ``starts`` or ``stages`` that is a link or a file), here and in the
    runs inside it: what ``--overwrite`` must not remove."""
    from torch_ntm.runlog import FIELDS, MAX_METRICS_BYTES

    run_dir = Path(run_dir)
    found = [name for name in ("figures", "tb", *_SUB_RUNS)
             if (run_dir / name).is_symlink() or (run_dir / name).exists()
             and not (run_dir / name).is_dir()]
    for name, limit, looks_like in (
            (CHECKPOINT_JSON, MAX_RECORD_BYTES, lambda d: json.loads(d).get("format") == FORMAT),
            ("config.json", MAX_RECORD_BYTES, _is_config),
            ("metrics.csv", MAX_METRICS_BYTES,
             lambda d: not d or d.decode().splitlines()[0].split(",")[:len(FIELDS)] == FIELDS),
            *([] if STAGES in found else [(str(STAGED_CONFIG), MAX_RECORD_BYTES, _is_config)])):
        try:
            data = read_own(run_dir / name, limit, name)
            check_own(run_dir / name)
            if not looks_like(data):
                found.append(name)
        except FileNotFoundError:
            pass
        except (CheckpointError, ValueError, AttributeError, TypeError, IndexError,
                RecursionError):
            found.append(name)
    for sub in _sub_runs(run_dir, skip=found):  # several starts' runs, a first stage's
        if sub.is_symlink() or not sub.is_dir():
            found.append(str(sub.relative_to(run_dir)))
        else:
            found += [str((sub / name).relative_to(run_dir)) for name in foreign_files(sub)]
    # and inside them, what clear_run would remove: checked before anything is removed
    inside = [run_dir / "figures" / name for name in RUN_FIGURES]
    if "tb" not in found and (run_dir / "tb").is_dir():
        inside += sorted((run_dir / "tb").glob("events.out.tfevents.*"))
    for path in inside:
        try:
            check_own(path)
        except CheckpointError:
            found.append(str(path.relative_to(run_dir)))
    return found


def clear_run(run_dir: str | os.PathLike) -> None:
    """Remove the files a run writes (checkpoint, config, metrics, TensorBoard events, its
    figures, and those of its several starts' runs) from ``run_dir``, and nothing else; for
    ``ntm train --overwrite``. A link or other file that is not the run's own (`foreign_files`)
    is refused before anything is removed."""
    run_dir = Path(run_dir)
    foreign = foreign_files(run_dir)
    if foreign:
        raise CheckpointError(f"{run_dir}: {', '.join(foreign)} not a run's own (a link, or "
                              f"not what a run writes there); --overwrite replaces only a "
                              f"run's files: move them away or choose another directory")
    figures, tb = run_dir / "figures", run_dir / "tb"
    for name in RUN_FIGURES:  # a run without --no-plots would have left the old run's
        if figures.is_dir():
            remove_file(figures / name)
    remove_file(run_dir / CHECKPOINT_JSON)  # first: no record names missing files
    _remove_superseded(run_dir, keep=set())
    for name in ("config.json", "metrics.csv"):
        remove_file(run_dir / name)
    if tb.is_dir():
        for event in tb.glob("events.out.tfevents.*"):
            remove_file(event)
    for sub in _sub_runs(run_dir):
        clear_run(sub)
    remove_file(run_dir / STAGED_CONFIG)


# The folders of the runs inside a run: its several starts' (RUN/starts/K) and its first
# stage's (RUN/stages/0, before a fine-tune).
STARTS, STAGES = "starts", "stages"
_SUB_RUNS = (STARTS, STAGES)
# A run with a fine-tune (``finetune``) keeps its own config here, beside its first stage: until
# the fine-tune's first checkpoint, ``ntm train --resume RUN`` reads it.
STAGED_CONFIG = Path(STAGES) / "config.json"


def stage_dir(run_dir: str | os.PathLike) -> Path:
    """Where the first stage of a run with a fine-tune (``finetune``) trains."""
    return Path(run_dir) / STAGES / "0"


def start_dir(run_dir: str | os.PathLike, k: int) -> Path:
    """Where start ``k`` of a run with several (``starts``) trains."""
    return Path(run_dir) / STARTS / str(k)


def _sub_runs(run_dir: Path, skip: list[str] = ()) -> list[Path]:
    """The folders of the runs inside ``run_dir`` (`_SUB_RUNS`, but those in ``skip``): each
    folder's numbered ones, by number."""
    found = []
    for name in _SUB_RUNS:
        folder = run_dir / name
        if name in skip or not folder.is_dir() or folder.is_symlink():
            continue
        found += sorted((p for p in folder.iterdir() if p.name.isdigit()),
                        key=lambda p: int(p.name))
    return found


def find_checkpoint(path: str | os.PathLike) -> Path:
    """Resolve a run directory or a checkpoint JSON file to the JSON file's path."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_JSON
    if not path.exists():
        hint = ""
        if (path.parent / "config.json").exists():  # a training's first files, no checkpoint
            hint = (f"; its run was stopped before its first checkpoint: start it again with "
                    f"ntm train ... --out {path.parent} --overwrite")
        elif path.parts and (SHIPPED / path.parts[0] / CHECKPOINT_JSON).is_file():  # "copy"
            hint = (f"; for the shipped model, pretrained.path({path.parts[0]!r}) (or "
                    f"pretrained.load, or --pretrained on the command line)")
        raise CheckpointError(f"{path}: no such checkpoint (expected a run directory or a "
                              f"{CHECKPOINT_JSON} file){hint}")
    if path.suffix == ".safetensors":  # the weights alone: their shapes do not say the model
        raise CheckpointError(f"{path}: a weights file; pass its run directory ({path.parent}) "
                              f"or the {CHECKPOINT_JSON} beside it, which says the model")
    return path


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(read_own(path, MAX_RECORD_BYTES, CHECKPOINT_JSON))
    except RecursionError:
        raise CheckpointError(f"{path}: not a readable checkpoint JSON file (nested too deeply)"
                              ) from None
    except (OSError, ValueError) as e:  # not UTF-8, not JSON, an integer of over 4,300 digits
        raise CheckpointError(f"{path}: not a readable checkpoint JSON file ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a torch-ntm checkpoint (missing format marker)")
    if data.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {data.get('version')} is not supported "
            f"(this torch-ntm reads version {VERSION})"
        )
    return data


class _Missing(CheckpointError):
    """A file that a record names is not there."""


def _file_name(json_path: Path, rec: dict, key: str) -> tuple[Path, str]:
    """The path and SHA-256 of the file that record ``rec`` names under ``key``, checked: a
    plain name of the expected pattern (inside the run directory) and a hex SHA-256."""
    name, sha256 = rec.get(key), rec.get(f"{key}_sha256")
    pattern = _FILE_NAMES[key]
    if not isinstance(name, str) or not pattern.fullmatch(name):
        raise CheckpointError(f"{json_path}: invalid checkpoint record ({key} must be a file "
                              f"name like {pattern.pattern.replace(chr(92), '')} in the run "
                              f"directory, got {str(name)[:80]!r})")
    if not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise CheckpointError(f"{json_path}: invalid checkpoint record ({key}_sha256 must be "
                              f"the SHA-256 of {name} in hex, got {str(sha256)[:80]!r})")
    return json_path.parent / name, sha256


def _load_tensors(path: Path, sha256: str) -> dict:
    digest = hashlib.sha256()
    try:  # hashed while read, and parsed from the same bytes
        data = read_own(path, MAX_TENSOR_FILE_BYTES, "checkpoint's tensor file", digest)
    except FileNotFoundError:
        raise _Missing(f"{path}: file is missing") from None
    if digest.hexdigest() != sha256:
        raise CheckpointError(
            f"{path}: file is corrupt or was modified (SHA-256 differs from the one recorded in "
            f"{CHECKPOINT_JSON})"
        )
    try:
        return st_load(data)
    except Exception as e:  # safetensors raises its own error type for malformed files
        raise CheckpointError(f"{path}: not a valid safetensors file ({e})") from None


def _model_part(tensors: dict) -> dict:
    """The model's weights among a file's tensors (keys ``model.NAME``), by their own names."""
    return {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}


@dataclass
class Checkpoint:
    """A loaded checkpoint: its config, counters and weights (see `load_checkpoint`)."""

    path: Path
    config: TrainConfig
    step: int
    sequences: int
    elapsed_s: float
    metrics: dict
    extra: dict
    state_dict: dict
    _record: dict
    # The best validation's file, read with the weights (or None): weights under ``model.``,
    # optimizer state beside them.
    _best: dict | None = None

    def task(self, **overrides):
        return build_task(self.config, **overrides)

    def model(self, device=None, *, latest: bool = False, evaluation: bool = False,
              **overrides) -> nn.Module:
        """Rebuild the model the run keeps: the weights of its best validation where the run
        recorded one, else (or with ``latest``) its latest weights. With ``evaluation``, with
        the memory `ntm evaluate` runs it with (the run's ``eval_memory_size``, where it has
        one); ``overrides`` such as ``memory_size=1024`` win over both."""
        if evaluation:
            overrides = {**self.config.eval_overrides(), **overrides}
        model = build_model(self.config, self.task(), device=device, **overrides)
        self.load_weights_into(model, self.state_dict if latest else self.kept_weights())
        return model

    def kept_weights(self) -> dict:
        """The weights the run keeps: its best validation's where it recorded one, else its
        latest (what `model` and ``ntm evaluate`` use)."""
        if "best" not in self._record:
            return self.state_dict
        return _model_part(self._best)

    @property
    def best_metrics(self) -> dict | None:
        """The metrics of the best validation the run recorded (read from the record, no
        weights loaded), or None where `best` is None."""
        return self._record.get("best_metrics", {}) if "best" in self._record else None

    def best(self) -> KeptWeights | None:
        """The best validation the run recorded, or None (checkpoints of older versions,
        shipped models)."""
        rec = self._record
        if "best" not in rec:
            return None
        tensors = self._best
        weights = _model_part(tensors)
        meta = rec.get("best_optimizer")
        try:
            optimizer = None if meta is None else _optimizer_join(tensors, meta)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CheckpointError(f"{self.path}: invalid checkpoint record (best_optimizer: "
                                  f"{e})") from None
        return KeptWeights(weights, optimizer, self.best_metrics)

    def load_weights_into(self, model: nn.Module, state_dict: dict | None = None) -> None:
        """Load the latest weights (or ``state_dict``) into ``model``."""
        try:
            model.load_state_dict(self.state_dict if state_dict is None else state_dict)
        except RuntimeError as e:
            first = str(e).strip().splitlines()
            detail = first[1].strip() if len(first) > 1 else first[0]
            raise CheckpointError(
                f"{self.path}: weights do not fit this model configuration ({detail})"
            ) from None

    def averaged(self) -> dict | None:
        """The running average of the weights saved with the training state (parameter name
        -> tensor), or None where the run kept none (``ema_decay`` 0)."""
        if "train_state" not in self._record:
            return None
        prefix = "averaged."
        found = {k[len(prefix):]: v for k, v in self._train_state.items() if k.startswith(prefix)}
        return found or None

    @functools.cached_property
    def _train_state(self) -> dict:
        """The training state's tensors, read and checked once for all who need them."""
        rec = self._record
        if "train_state" not in rec:
            raise CheckpointError(f"{self.path}: holds weights only, no training state to resume")
        return _load_tensors(*_file_name(self.path, rec, "train_state"))

    def restore_train_state(self, optimizer: torch.optim.Optimizer,
                            data_generator: torch.Generator | None = None) -> None:
        """Restore optimizer state and RNG states saved with the checkpoint (for resuming)."""
        rec = self._record
        tensors = self._train_state
        if "rng.torch" not in tensors:
            raise CheckpointError(f"{self.path}: the training state has no RNG state")
        try:
            optimizer.load_state_dict(_optimizer_join(tensors, rec["optimizer"]))
        except (ValueError, KeyError, RuntimeError, TypeError, AttributeError) as e:
            raise CheckpointError(
                f"{self.path}: optimizer state does not fit this configuration ({e})"
            ) from None
        try:  # a torch state is a uint8 tensor of a fixed size; another raised in torch
            torch.set_rng_state(tensors["rng.torch"])
            if data_generator is not None and "rng.data" in tensors:
                data_generator.set_state(tensors["rng.data"])
        except (RuntimeError, TypeError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"{self.path}: the training state's RNG state is not one "
                                  f"torch can restore ({first})") from None


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Load a checkpoint from a run directory or its JSON file.

    Raises:
        CheckpointError: missing, corrupt or foreign files, or an invalid configuration.
    """
    json_path = find_checkpoint(path)
    for attempt in range(3):
        rec = _read_json(json_path)
        try:
            if not isinstance(rec.get("config"), dict):
                raise ConfigError("config must be an object")
            config = TrainConfig.from_dict({**PRE_CAP_CONFIG, **rec["config"]}, source="config")
            _check_record(rec)
        except ConfigError as e:
            raise CheckpointError(f"{json_path}: invalid checkpoint record ({e})") from None
        try:  # the best validation's file too, now: a training replaces it as it saves
            state = _load_tensors(*_file_name(json_path, rec, "weights"))
            best = _load_tensors(*_file_name(json_path, rec, "best")) if "best" in rec else None
            break
        except _Missing:
            # A training saved a newer checkpoint between our reading the record and its files,
            # and removed them: the new record names the new ones.
            now = _read_json(json_path)
            if attempt == 2 or [now.get(k) for k in ("weights", "best")] == [
                    rec.get(k) for k in ("weights", "best")]:
                raise
    return Checkpoint(
        path=json_path, config=config, step=rec.get("step", 0),
        sequences=rec.get("sequences", 0), elapsed_s=float(rec.get("elapsed_s", 0.0)),
        metrics=rec.get("metrics", {}), extra=rec.get("extra", {}), state_dict=state,
        _record=rec, _best=best,
    )


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_record(rec: dict) -> None:
    """Raise `ConfigError` if a counter, the metrics or the extras have the wrong type."""
    for key in ("step", "sequences"):
        value = rec.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
            raise ConfigError(f"{key} must be an integer from 0 to 2**63 - 1, got "
                              f"{str(value)[:80]!r}")
    elapsed = rec.get("elapsed_s", 0.0)
    if not _number(elapsed) or not elapsed >= 0:
        raise ConfigError(f"elapsed_s must be a number >= 0, got {str(elapsed)[:80]!r}")
    for key in ("metrics", "best_metrics"):  # costs, counts and fractions: none below 0 (a
        # -Infinity best would be kept for ever); NaN is what a diverged validation has
        metrics = rec.get(key, {})
        if not isinstance(metrics, dict) or not all(_number(v) and not v < 0
                                                    for v in metrics.values()):
            raise ConfigError(f"{key} must be an object of numbers >= 0 (or NaN), got "
                              f"{str(metrics)[:80]}")
    if not isinstance(rec.get("best_optimizer"), (dict, type(None))):
        raise ConfigError("best_optimizer must be an object or null")
    extra = rec.get("extra", {})
    if not isinstance(extra, dict) or not all(
            isinstance(v, (int, float, bool)) or (isinstance(v, list) and all(map(_number, v)))
            for v in extra.values()):
        raise ConfigError(f"extra must be an object of numbers and lists of numbers, got "
                          f"{str(extra)[:80]}")
