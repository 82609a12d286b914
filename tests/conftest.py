"""Shared test setup: one CPU thread, so tests stay fast and steady on small machines; no
training left running after the test that started it; the shipped models (`shipped`)."""

import os
import signal
from pathlib import Path

import pytest
import torch

from torch_ntm import pretrained
from torch_ntm.checkpoint import load_checkpoint

torch.set_num_threads(1)


@pytest.fixture
def shipped():
    """``shipped(name)``: shipped model ``name`` in eval mode and the task it was trained on."""
    def load(name: str):
        return pretrained.load(name).eval(), load_checkpoint(pretrained.path(name)).task()

    return load


def _descendants(root: int) -> list[tuple[int, bytes]]:
    """(pid, command line) of every live process below ``root``, read from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] != "Z":
            parents.setdefault(int(stat[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for pid in parents.get(todo.pop(), []):
            try:
                found.append((pid, Path(f"/proc/{pid}/cmdline").read_bytes()))
            except OSError:
                continue
            todo.append(pid)
    return found


@pytest.fixture(autouse=True)
def _no_training_outlives_its_test():
    """A test that fails while a training it started still runs (a signal that came too early, a
    wait that timed out) must not leave it to compete for the CPU with every later test: on two
    cores one such process slows the rest of the suite many times over. Kills what is left and
    fails the test.
    Only our own trainings: torch's compile workers are meant to outlive a test."""
    yield
    if not Path("/proc/self/stat").exists():
        return
    left = [(pid, cmd) for pid, cmd in _descendants(os.getpid())
            if b"torch_ntm" in cmd or b"torchrun" in cmd]
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        shown = "; ".join(cmd.replace(b"\0", b" ").decode(errors="replace")[:120]
                          for _, cmd in left)
        pytest.fail(f"the test left {len(left)} training process(es) running: {shown}")
