"""Pretrained models shipped with the package, one folder per name.

Each folder holds a weights-only checkpoint in the format of `torch_ntm.checkpoint`
(``checkpoint.json`` and ``weights-<step>.safetensors``, no training state):

    from torch_ntm import pretrained

    pretrained.names()                          # e.g. ['copy']
    pretrained.info("copy")                     # task, preset, sequences, validation metrics
    ntm = pretrained.load("copy", memory_size=1024)   # the trained NTM with 1024 memory rows

Models are added with `export` (``ntm pretrained export RUN NAME``), which copies a run's weights,
config, counters and last validation metrics into ``pretrained/NAME/``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from torch import nn

from torch_ntm.checkpoint import (
    CHECKPOINT_JSON,
    LOCK,
    SHIPPED,
    Checkpoint,
    load_checkpoint,
    lock_run,
    save_checkpoint,
)
from torch_ntm.config import ConfigError

__all__ = ["ROOT", "names", "path", "info", "load", "export"]

ROOT = SHIPPED  # where shipped models live (this folder); ``root=`` arguments look elsewhere

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a plain folder name: no paths, no dot-files


def _root(root: str | os.PathLike | None) -> Path:
    return ROOT if root is None else Path(root)


def names(*, root: str | os.PathLike | None = None) -> list[str]:
    """Names of the models in ``root`` (default: the shipped ones), sorted."""
    folder = _root(root)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir()
                  if _NAME.fullmatch(p.name) and (p / CHECKPOINT_JSON).is_file())


def path(name: str, *, root: str | os.PathLike | None = None) -> Path:
    """The ``checkpoint.json`` of model ``name``.

    Raises:
        ConfigError: (a `ValueError`) no model of that name; the message lists the valid names.
    """
    valid = names(root=root)
    if name not in valid:
        choices = f"valid names: {', '.join(valid)}" if valid else "none are shipped"
        raise ConfigError(f"unknown pretrained model {name!r}; {choices}")
    return _root(root) / name / CHECKPOINT_JSON


def _checkpoint(name: str, root) -> Checkpoint:
    return load_checkpoint(path(name, root=root))


def info(name: str, *, root: str | os.PathLike | None = None) -> dict:
    """What model ``name`` is and how well it did when exported.

    Returns:
        ``name``, ``task``, ``task_params``, ``preset``, ``model`` (``"ntm"``, ``"lstm"``,
        ``"mann"`` or ``"dnc"``), ``step``, ``sequences`` (trained on), ``elapsed_s`` (training
        time) and ``metrics`` (the last validation: ``cost_bits``, ``bit_errors`` per sequence,
        ``perfect``, ...; for Omniglot wrong labels per episode in ``bit_errors``, and
        ``accuracy_1``, ``accuracy_2``, ..., the accuracy at the k-th instance of a class).
    """
    ckpt = _checkpoint(name, root)
    config = ckpt.config
    return {"name": name, "task": config.task, "task_params": config.to_dict()["task_params"],
            "preset": config.preset, "model": config.model, "step": ckpt.step,
            "sequences": ckpt.sequences, "elapsed_s": ckpt.elapsed_s,
            "metrics": dict(ckpt.metrics)}


def load(name: str, *, root: str | os.PathLike | None = None,
         device: torch.device | str | None = None, **overrides: object) -> nn.Module:
    """The trained model ``name`` (an `NTM`, the LSTM baseline or a `MANN`), in training mode.

    Args:
        name: one of `names`.
        root: folder to look in (default: the shipped models).
        device: where to put the model (default: the CPU).
        **overrides: constructor arguments to change, e.g. ``memory_size=1024``; the weights do
            not depend on the memory size, so they load unchanged. ``evaluation=True``: the
            memory `ntm evaluate` runs it with (`Checkpoint.model`).
    """
    return _checkpoint(name, root).model(device=device, **overrides)


def export(run_dir: str | os.PathLike, name: str,
           dest: str | os.PathLike | None = None, *, overwrite: bool = False) -> Path:
    """Write a weights-only copy of a run's checkpoint as model ``name``.

    The copy keeps the run's config, step, sequences and training time, and the weights and
    metrics of its best validation (of its last, for checkpoints that recorded no best). It is
    written holding the folder's lock (`torch_ntm.checkpoint.lock_run`), atomically as any
    checkpoint. An earlier export of that name in ``dest`` is replaced; a shipped model, a
    training run or a folder of other files only with ``overwrite``.

    Args:
        run_dir: a run directory or its ``checkpoint.json``.
        name: the model's name (letters, digits, ``_``, ``.``, ``-``).
        dest: folder that receives ``NAME/`` (default: the package's own pretrained folder).
        overwrite: replace a shipped model, or write into a folder that holds a run or files
            that an export does not write (a run's weights and training state are removed).

    Returns:
        The path of the new ``checkpoint.json``.

    Raises:
        ConfigError: a bad name or ``dest``, or a folder that ``overwrite`` must allow.
        CheckpointError: the run cannot be read, or another process writes the folder.
    """
    if not _NAME.fullmatch(name):
        raise ConfigError(f"pretrained model name {name!r} must be letters, digits, '_', '.' "
                          f"or '-', starting with a letter or digit")
    if dest is not None and Path(dest).exists() and not Path(dest).is_dir():
        raise ConfigError(f"--dest {dest}: exists and is not a directory")
    ckpt = load_checkpoint(run_dir)
    best = ckpt.best_metrics  # the run's model is its best validation's, where it recorded one
    target = _root(dest) / name
    if dest is None and not overwrite and (target / CHECKPOINT_JSON).exists():
        raise ConfigError(f"pretrained model {name!r} is shipped with torch-ntm; export under "
                          f"another NAME (or into --dest DIR), or pass --overwrite to replace "
                          f"it")
    with lock_run(target, "writing this folder"):
        if not overwrite:
            _check_replaceable(target)
        return save_checkpoint(target, ckpt.config, ckpt.model(), step=ckpt.step,
                               sequences=ckpt.sequences, elapsed_s=ckpt.elapsed_s,
                               metrics=ckpt.metrics if best is None else best)


# What an export writes: its record and weights (and the lock, and a crashed save's leftovers)
_EXPORTED = re.compile(rf"{re.escape(CHECKPOINT_JSON)}|{re.escape(LOCK)}|"
                       r"weights-[0-9]+\.safetensors|"
                       r"\.(checkpoint\.json|weights-[0-9]+\.safetensors)\..*\.tmp")


def _check_replaceable(target: Path) -> None:
    """Raise `ConfigError` unless ``target`` is empty or holds an earlier export: what `export`
    replaces without ``overwrite``."""
    held = sorted(p.name for p in target.iterdir())
    if not (target / CHECKPOINT_JSON).exists():
        others = [n for n in held if n != LOCK]
        if others:
            listed = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            raise ConfigError(f"{target}: holds files that are not an export ({listed}); export "
                              f"into an empty folder (another --dest or NAME), or pass "
                              f"--overwrite to write into it")
        return
    record = load_checkpoint(target)._record
    if any(key in record for key in ("train_state", "best")) or not all(
            _EXPORTED.fullmatch(n) for n in held):
        raise ConfigError(f"{target}: holds a training run (or files an export does not "
                          f"write), which an export would destroy; choose another --dest or "
                          f"NAME, or pass --overwrite to replace it")
