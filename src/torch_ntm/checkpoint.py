"""Checkpoints: weights in safetensors, configuration and training state in JSON. No pickle.

A run directory holds::

    checkpoint.json                   config, counters, metrics, optimizer hyper-parameters,
                                      and the names and SHA-256 of the two files below
    weights-<step>.safetensors        the model's state_dict
    train-state-<step>.safetensors    optimizer tensors and RNG states (for an exact resume)

Every file is written to a temporary name, flushed to disk and renamed into place; the JSON is
renamed last and only then are the previous step's files removed. A crash at any moment therefore
leaves a `checkpoint.json` that names complete files, and a modified or truncated file is caught by
its hash before it is parsed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from torch_ntm.baseline import LSTMBaseline
from torch_ntm.config import ConfigError, TrainConfig
from torch_ntm.model import NTM
from torch_ntm.tasks import make_task

__all__ = [
    "CheckpointError",
    "Checkpoint",
    "build_task",
    "build_model",
    "model_config",
    "save_checkpoint",
    "load_checkpoint",
    "find_checkpoint",
]

FORMAT = "torch-ntm-checkpoint"
VERSION = 1
CHECKPOINT_JSON = "checkpoint.json"
# Checkpoints written before the caps on beta and gamma existed hold models of the paper's
# unbounded form: a config without these keys means that, whatever today's defaults are.
PRE_CAP_CONFIG = {"max_beta": 0.0, "max_gamma": 0.0}


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names the file and the problem."""


def build_task(config: TrainConfig, **task_overrides):
    """The task a config trains on (``config.task`` with ``config.task_params``).

    Raises:
        ConfigError: the task rejects its parameters (e.g. ``min_length`` > ``max_length``).
    """
    try:
        return make_task(config.task, **{**config.task_params, **task_overrides})
    except (ValueError, TypeError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"the task cannot be built from this config: {e}") from None


def model_config(config: TrainConfig, task) -> dict:
    """Constructor arguments of the model a config describes; ``task`` (or a model) gives the
    input and output widths."""
    if config.model == "lstm":
        return {"kind": "lstm", "input_size": task.input_size, "output_size": task.output_size,
                "hidden_size": config.controller_size, "num_layers": config.controller_layers}
    if config.model != "ntm":
        raise ConfigError(f"model must be 'ntm' or 'lstm', got {config.model!r}")
    return {
        "kind": "ntm", "input_size": task.input_size, "output_size": task.output_size,
        "controller": config.controller, "controller_size": config.controller_size,
        "controller_layers": config.controller_layers, "memory_size": config.memory_size,
        "memory_width": config.memory_width, "read_heads": config.read_heads,
        "write_heads": config.write_heads, "shift_range": config.shift_range,
        "memory_init": config.memory_init,
        "max_beta": config.max_beta or None, "max_gamma": config.max_gamma or None,
    }


def build_model(config: TrainConfig, task, device=None, **overrides) -> nn.Module:
    """A freshly initialised model for ``config`` (``overrides``, e.g. ``memory_size=1024``)."""
    kwargs = {**model_config(config, task), **overrides}
    kind = kwargs.pop("kind")
    try:
        if kind == "lstm":
            unused = set(overrides) - {"hidden_size", "num_layers"}
            if unused:
                raise ConfigError(f"the LSTM baseline has no {', '.join(sorted(unused))}")
            return LSTMBaseline(**kwargs, device=device)
        kwargs.setdefault("engine", config.engine)
        return NTM(**kwargs, device=device)
    except (ValueError, TypeError) as e:  # sizes the model rejects, e.g. shift_range too wide
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"the model cannot be built from this config: {e}") from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is either the old or the complete new file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; give what open() would
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _cpu_contiguous(tensors: dict) -> dict:
    return {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}


def _optimizer_split(optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Split an optimizer state_dict into tensors (for safetensors) and JSON-able rest."""
    sd = optimizer.state_dict()
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
) -> Path:
    """Write a checkpoint into ``run_dir`` atomically; returns the path of its JSON file."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    json_path = run_dir / CHECKPOINT_JSON
    previous = _read_json(json_path) if json_path.exists() else None

    weights_name = f"weights-{step:08d}.safetensors"
    _atomic_write(run_dir / weights_name, st_save(_cpu_contiguous(model.state_dict())))
    record = {
        "format": FORMAT,
        "version": VERSION,
        "config": dataclasses.asdict(config),
        "model": model_config(config, model),
        "step": step,
        "sequences": sequences,
        "elapsed_s": elapsed_s,
        "metrics": metrics or {},
        "extra": extra or {},
        "weights": weights_name,
        "weights_sha256": _sha256(run_dir / weights_name),
    }
    if optimizer is not None:
        tensors, meta = _optimizer_split(optimizer)
        tensors["rng.torch"] = torch.get_rng_state()
        if data_generator is not None:
            tensors["rng.data"] = data_generator.get_state()
        state_name = f"train-state-{step:08d}.safetensors"
        _atomic_write(run_dir / state_name, st_save(_cpu_contiguous(tensors)))
        record["optimizer"] = meta
        record["train_state"] = state_name
        record["train_state_sha256"] = _sha256(run_dir / state_name)
    _atomic_write(json_path, json.dumps(record, indent=2).encode())

    if previous:  # the new JSON is in place: the old step's files are no longer referenced
        for key in ("weights", "train_state"):
            old = previous.get(key)
            if old and old not in (record.get("weights"), record.get("train_state")):
                (run_dir / old).unlink(missing_ok=True)
    return json_path


def find_checkpoint(path: str | os.PathLike) -> Path:
    """Resolve a run directory or a checkpoint JSON file to the JSON file's path."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_JSON
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint (expected a run directory or a "
                              f"{CHECKPOINT_JSON} file)")
    return path


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a readable checkpoint JSON file ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a torch-ntm checkpoint (missing format marker)")
    if data.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {data.get('version')} is not supported "
            f"(this torch-ntm reads version {VERSION})"
        )
    return data


def _load_tensors(path: Path, sha256: str | None) -> dict:
    if not path.exists():
        raise CheckpointError(f"{path}: file is missing")
    if sha256 is not None and _sha256(path) != sha256:
        raise CheckpointError(
            f"{path}: file is corrupt or was modified (SHA-256 differs from the one recorded in "
            f"{CHECKPOINT_JSON})"
        )
    try:
        return st_load(path.read_bytes())
    except Exception as e:  # safetensors raises its own error type for malformed files
        raise CheckpointError(f"{path}: not a valid safetensors file ({e})") from None


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

    def task(self, **overrides):
        return build_task(self.config, **overrides)

    def model(self, device=None, **overrides) -> nn.Module:
        """Rebuild the model and load the weights; ``overrides`` such as ``memory_size=1024``."""
        model = build_model(self.config, self.task(), device=device, **overrides)
        self.load_weights_into(model)
        return model

    def load_weights_into(self, model: nn.Module) -> None:
        try:
            model.load_state_dict(self.state_dict)
        except RuntimeError as e:
            first = str(e).strip().splitlines()
            detail = first[1].strip() if len(first) > 1 else first[0]
            raise CheckpointError(
                f"{self.path}: weights do not fit this model configuration ({detail})"
            ) from None

    def restore_train_state(self, optimizer: torch.optim.Optimizer,
                            data_generator: torch.Generator | None = None) -> None:
        """Restore optimizer state and RNG states saved with the checkpoint (for resuming)."""
        rec = self._record
        if "train_state" not in rec:
            raise CheckpointError(f"{self.path}: holds weights only, no training state to resume")
        tensors = _load_tensors(self.path.parent / rec["train_state"], rec["train_state_sha256"])
        try:
            optimizer.load_state_dict(_optimizer_join(tensors, rec["optimizer"]))
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(
                f"{self.path}: optimizer state does not fit this configuration ({e})"
            ) from None
        torch.set_rng_state(tensors["rng.torch"])
        if data_generator is not None and "rng.data" in tensors:
            data_generator.set_state(tensors["rng.data"])


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Load a checkpoint from a run directory or its JSON file.

    Raises:
        CheckpointError: missing, corrupt or foreign files, or an invalid configuration.
    """
    json_path = find_checkpoint(path)
    rec = _read_json(json_path)
    try:
        config = TrainConfig.from_dict({**PRE_CAP_CONFIG, **rec["config"]}, source=str(json_path))
        weights_name, weights_sha = rec["weights"], rec["weights_sha256"]
    except (KeyError, TypeError, ConfigError) as e:
        raise CheckpointError(f"{json_path}: invalid checkpoint record ({e})") from None
    state = _load_tensors(json_path.parent / weights_name, weights_sha)
    return Checkpoint(
        path=json_path, config=config, step=int(rec.get("step", 0)),
        sequences=int(rec.get("sequences", 0)), elapsed_s=float(rec.get("elapsed_s", 0.0)),
        metrics=rec.get("metrics", {}), extra=rec.get("extra", {}), state_dict=state,
        _record=rec,
    )
