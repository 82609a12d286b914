"""What the analysis scripts beside this file share: their command line's run and sample size,
and a run's kept weights loaded for inference on one thread."""

import argparse

import torch

from torch_ntm.checkpoint import Checkpoint, load_checkpoint


def parser(doc: str, sequences: int) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line, taking RUN and ``--sequences`` (default
    ``sequences``); a script adds its own options."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--sequences", type=int, default=sequences)
    return parser


def load(run: str) -> tuple[Checkpoint, torch.nn.Module]:
    """``run``'s checkpoint and its kept weights as a model in eval mode, with torch on one
    thread."""
    torch.set_num_threads(1)
    ckpt = load_checkpoint(run)
    return ckpt, ckpt.model().eval()
