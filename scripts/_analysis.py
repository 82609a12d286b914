"""What the analysis scripts beside this file share: their command line's run and sample size,
and a run's kept weights loaded for inference on one thread."""

import argparse
import sys

import torch

from torch_ntm.checkpoint import Checkpoint, CheckpointError, load_checkpoint


def parser(doc: str, sequences: int) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line, taking RUN and ``--sequences`` (default
    ``sequences``); a script adds its own options."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--sequences", type=int, default=sequences)
    return parser


def load(run: str, task: str | tuple[str, ...]) -> tuple[Checkpoint, torch.nn.Module]:
    """``run``'s checkpoint and its kept weights as a model in eval mode, with the rows `ntm
    evaluate` runs it with (the run's ``eval_memory_size``, else those it trained with), with
    torch on one thread. A run that cannot be read, or is not of ``task`` (or one of them), ends
    the script with one line."""
    torch.set_num_threads(1)
    try:
        ckpt = load_checkpoint(run)
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    tasks = (task,) if isinstance(task, str) else task
    if ckpt.config.task not in tasks:
        sys.exit(f"error: {run} is a {ckpt.config.task!r} run; this script reads "
                 f"{' or '.join(map(repr, tasks))} runs")
    return ckpt, ckpt.model(evaluation=True).eval()
