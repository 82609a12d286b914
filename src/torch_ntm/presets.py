"""The presets of ``ntm train TASK --preset NAME``: each a set of `TrainConfig` keys, with one
line saying why. How each was found (sweeps, seeds, figures) is in docs/presets.md.

The default preset of a task (`default_preset`) is the paper's NTM-LSTM architecture where not
said otherwise (Omniglot: the MANN; the graph tasks: the DNC); presets whose name ends in
``-paper`` keep the paper's optimiser (RMSProp with momentum 0.9, batch 1, gradient clipping to
[-10, 10]); the others are tuned for wall-clock speed on a CPU (batches of sequences, Adam), but
the graph tasks', a starting point not yet tuned (DeepMind's reference DNC optimiser).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from torch_ntm.config import ConfigError, TrainConfig
from torch_ntm.overrides import apply_overrides
from torch_ntm.tasks import TASKS

__all__ = ["PRESETS", "Preset", "default_preset", "resolve_config"]


class Preset(NamedTuple):
    why: str  # one line; the history is in docs/presets.md
    keys: dict  # `TrainConfig` keys (``task_params``: the task's)


# Parts that several presets share.
_PAPER_OPT = {"optimizer": "rmsprop", "batch_size": 1, "clip_value": 10.0, "momentum": 0.9}
_NTM_FF = {"model": "ntm", "controller": "feedforward", "controller_layers": 1}
_LSTM = {"model": "lstm", "controller_layers": 3}
# Once solved, fine-tune at 0.3 times the rate; put the best weights back if a validation later
# has more than 1 wrong bit per sequence.
_STABLE = {"lr_decay_bit_errors": 0.0, "lr_decay": 0.3, "rollback_bit_errors": 1.0}
# One-shot learning (Santoro et al. 2016, section 4.1): Adam at 1e-3, batches of 16 episodes, a
# budget of episodes, the weights of the best validation kept; mirror images as classes.
_OMNIGLOT = {"optimizer": "adam", "lr": 1e-3, "batch_size": 16, "clip_value": 0.0,
             "clip_norm": 10.0, "max_sequences": 1_600_000, "eval_every": 500,
             "eval_sequences": 1000, "log_every": 50, "task_params": {"reflections": True}}
# The mann presets' MANN (docs/presets.md): sizes, regularisation, averaging and jitter.
_MANN = {**_OMNIGLOT, "model": "mann", "controller_size": 200, "memory_size": 128,
         "memory_width": 40, "read_heads": 4, "learned_beta": True, "lr_decay": 0.3,
         "weight_decay": 0.05, "ema_decay": 0.999}
_MANN_JITTER = {"reflections": True, "max_angle": 20.0, "max_shift": 2.5, "max_scale": 0.2,
                "max_shear": 0.3}
_BIT_ADAM = {"optimizer": "adam", "batch_size": 16, "clip_value": 0.0, "clip_norm": 10.0}
# The DNC paper's graph tasks: batches of 16 and the global gradient norm clipped at 50, as in
# DeepMind's reference DNC training script, but Adam at 1e-3 in place of its RMSProp at 1e-4, and
# no curriculum (every size of the task's 3..10 from the start); memory for the 90 edges of a
# 30-node graph when evaluating. Why each (measured): docs/presets.md and docs/results/dnc.md.
_GRAPH = {"optimizer": "adam", "lr": 1e-3, "batch_size": 16, "clip_value": 0.0,
          "clip_norm": 50.0, "eval_every": 200, "memory_size": 64, "memory_width": 32,
          "eval_memory_size": 128}
# Repeat copy's second stage: 60,000 sequences at 1e-5 with 64 rows (128 when validating), the
# count's input weights (channel 9) capped at norm 10.5 over the first 15,000, validated at 15
# and 20 repeats and at L = 20, R = 10 every 500, keeping the weights with the fewest wrong
# data bits at 20 repeats among those over 95% perfect at L = 20, R = 10.
_REPEAT_COPY_FINETUNE = " ".join([
    "lr=1e-5", "max_sequences=60000", "memory_size=64", "eval_memory_size=128",
    "eval_repeats=15,20", "eval_pairs=20x10", "eval_every=500", "stop_bit_errors=-1",
    "input_max_norm=10.5", "input_max_norm_channels=9", "input_max_norm_ramp=15000",
    "keep_by=r20:data_bit_errors", "keep_perfect_above=20r10:0.95"])
_GRAPH_PRESETS = {
    "dnc": Preset(
        "a DNC (an LSTM of 128, memory 64 x 32, 4 read heads) with Adam at 1e-3",
        {**_GRAPH, "model": "dnc", "controller_size": 128, "read_heads": 4, "write_heads": 1}),
    "ntm": Preset(
        "the NTM baseline: the DNC's controller, memory and read heads, the same optimiser",
        {**_GRAPH, "model": "ntm", "controller_size": 128, "read_heads": 4, "write_heads": 1}),
    "lstm": Preset(
        "the LSTM baseline (3 layers of 256), the same optimiser",
        {**_GRAPH, **_LSTM, "controller_size": 256}),
}

# The copy task's default (ntm-lstm).
_COPY = {**_BIT_ADAM, "lr": 3e-3, "weight_decay": 0.1, "clip_norm": 1.0, "clip_spikes": 2.0,
         "stop_bit_errors": 0.0, "patience_evals": 10, "eval_sizes": [40, 120],
         "eval_memory_size": 256, "max_sequences": 60_000, "eval_every": 100,
         "rollback_bit_errors": 1.0, "lr_decay": 0.3, "lr_decay_bit_errors": 0.0}

PRESETS: dict[str, dict[str, Preset]] = {
    "copy": {
        "ntm-lstm": Preset(
            "AdamW, spikes clipped; once L <= 20, 40 and 120 are solved, the rate cut 0.3x and "
            "a stop after ten such validations", _COPY),
        "dnc": Preset(
            "the DNC (one read, one write head) on ntm-lstm's optimiser without weight decay or "
            "the stop: 20,000 sequences",
            {**_COPY, "model": "dnc", "weight_decay": 0.0, "lr_decay_bit_errors": -1.0,
             "stop_bit_errors": -1.0, "patience_evals": 2, "max_sequences": 20_000}),
        "ntm-lstm-paper": Preset(
            "the paper's optimiser and rate",
            {**_PAPER_OPT, "lr": 1e-4, "stop_bit_errors": 0.0, "eval_every": 2000}),
        "ntm-ff": Preset(
            "the paper's feed-forward NTM, trained with Adam",
            {**_NTM_FF, **_BIT_ADAM, "controller_size": 100, "lr": 1e-3,
             "stop_bit_errors": 0.0, "eval_every": 100}),
        "lstm": Preset(
            "the LSTM baseline (3 layers of 256), trained with Adam",
            {**_LSTM, **_BIT_ADAM, "controller_size": 256, "lr": 1e-3, "stop_bit_errors": 0.0,
             "eval_every": 100}),
    },
    "repeat_copy": {
        "ntm-lstm": Preset(
            "Adam at 3e-3, which solves the training distribution (1e-3 made no progress)",
            {**_BIT_ADAM, "lr": 3e-3, "stop_bit_errors": 0.0, "eval_every": 200}),
        "ntm-lstm-paper": Preset(
            "the paper's optimiser, validated at L = 15 and 20, then a fine-tune that caps the "
            "count's input weights",
            {**_PAPER_OPT, "lr": 1e-4, "eval_sizes": [15, 20], "eval_size_sequences": 200,
             "max_sequences": 300_000, "finetune": _REPEAT_COPY_FINETUNE}),
        "ntm-ff": Preset(
            "a feed-forward controller, which loops over the stored rows by content and "
            "generalises in length",
            {**_NTM_FF, **_BIT_ADAM, **_STABLE, "controller_size": 100, "lr": 1e-3,
             "clip_spikes": 2.0, "eval_every": 200, "stop_bit_errors": 0.0,
             "eval_sizes": [15, 20], "max_sequences": 373_808}),
        "lstm": Preset(
            "the paper's LSTM baseline (3 layers of 512)",
            {**_LSTM, "controller_size": 512, "lr": 3e-5, **_PAPER_OPT}),
    },
    "associative_recall": {
        "ntm-lstm": Preset(
            "a learned initial memory row, spikes clipped and rows of 40: 9 of 10 seeds solve it",
            {**_BIT_ADAM, "lr": 1e-3, "clip_spikes": 2.0, "stop_bit_errors": 0.0,
             "eval_every": 200, "memory_init": "learned", "memory_width": 40}),
        "ntm-lstm-paper": Preset("the paper's optimiser and rate", {**_PAPER_OPT, "lr": 1e-4}),
        "ntm-ff": Preset(
            "the paper's table 2 (4 heads, a controller of 256) and optimiser, with the "
            "fine-tune and rollback (the shipped model)",
            {**_NTM_FF, "controller_size": 256, "read_heads": 4, "write_heads": 4, "lr": 1e-4,
             **_PAPER_OPT, **_STABLE}),
        "lstm": Preset(
            "the paper's LSTM baseline (3 layers of 256)",
            {**_LSTM, "controller_size": 256, "lr": 1e-4, **_PAPER_OPT}),
    },
    "ngrams": {
        "ntm-lstm": Preset(
            "the write head started a row a step, the read head's key strength at 5, a fixed "
            "budget, the rate cut twice",
            {**_BIT_ADAM, "lr": 1e-3, "eval_every": 200, "write_init": "sequential",
             "read_beta_bias": 5.0, "max_sequences": 300_000,
             "lr_milestones": [170_000, 260_000], "lr_decay": 0.3}),
        "ntm-lstm-paper": Preset("the paper's optimiser and rate", {**_PAPER_OPT, "lr": 3e-5}),
        "ntm-ff": Preset(
            "the paper's feed-forward NTM and optimiser",
            {**_NTM_FF, "controller_size": 100, "lr": 3e-5, **_PAPER_OPT}),
        "lstm": Preset(
            "the paper's LSTM baseline (3 layers of 128)",
            {**_LSTM, "controller_size": 128, "lr": 1e-4, **_PAPER_OPT}),
    },
    "priority_sort": {
        "ntm-lstm": Preset(
            "the shipped model's recipe: Adam at 3e-3 in batches of 256 (for a GPU)",
            {**_BIT_ADAM, "controller_layers": 2, "read_heads": 5, "write_heads": 5, "lr": 3e-3,
             "batch_size": 256, "eval_every": 100}),
        "ntm-lstm-paper": Preset(
            "the paper's architecture, optimiser and million sequences, spikes clipped: the "
            "paper's curve on a CPU",
            {"controller_layers": 2, "read_heads": 5, "write_heads": 5, "lr": 3e-5,
             **_PAPER_OPT, "clip_spikes": 2.0, "eval_every": 5000, "max_sequences": 1_000_000}),
        "ntm-ff": Preset(
            "the paper's feed-forward NTM (8 heads, a controller of 512) and optimiser",
            {**_NTM_FF, "controller_size": 512, "read_heads": 8, "write_heads": 8, "lr": 3e-5,
             **_PAPER_OPT}),
        "lstm": Preset(
            "the LSTM baseline with Adam at 3e-3, which beat 1e-3",
            {**_LSTM, **_BIT_ADAM, "controller_size": 128, "lr": 3e-3, "eval_every": 200}),
    },
    "omniglot": {
        "mann": Preset(
            "the paper's MANN, a learned key strength, more jitter, rate cuts, weight decay and "
            "averaging",
            {**_MANN, "max_sequences": 584_080, "lr_milestones": [330_000, 450_000],
             "task_params": _MANN_JITTER}),
        "mann-15": Preset(
            "the mann preset on the paper's 15-class episodes (string labels), rate cuts scaled "
            "to 150,000 episodes",
            {**_MANN, "max_sequences": 150_000, "lr_milestones": [85_000, 115_000],
             "task_params": {**_MANN_JITTER, "classes": 15, "labels": "string"}}),
        "mann-ntm": Preset(
            "an NTM with the NTM's addressing at comparable sizes (the paper's comparison)",
            {**_OMNIGLOT, "model": "ntm", "controller_size": 200, "memory_size": 128,
             "memory_width": 40, "read_heads": 4, "write_heads": 1}),
        "lstm": Preset(
            "the paper's LSTM baseline: one layer of 200 units",
            {**_OMNIGLOT, "model": "lstm", "controller_size": 200, "controller_layers": 1}),
    },
    "traversal": _GRAPH_PRESETS,
    "shortest_path": _GRAPH_PRESETS,
}
# The preset `resolve_config` picks when none is named: the NTM-LSTM's, but for these.
_DEFAULT_PRESETS = {"omniglot": "mann", "repeat_copy": "ntm-lstm-paper",
                    "priority_sort": "ntm-lstm-paper", "traversal": "dnc", "shortest_path": "dnc"}


def default_preset(task: str) -> str:
    """The preset of ``task`` that ``ntm train TASK`` uses without ``--preset``."""
    return _DEFAULT_PRESETS.get(task, "ntm-lstm")


def resolve_config(task: str, preset: str | None = None, overrides: list[str] = (),
                   seed: int | None = None) -> TrainConfig:
    """The default config of ``task``, its ``preset`` applied, then ``overrides``, then seed."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; valid tasks: {', '.join(sorted(TASKS))}")
    presets = PRESETS[task]
    preset = default_preset(task) if preset is None else preset
    if preset not in presets:
        raise ConfigError(
            f"unknown preset {preset!r} for task {task!r}; valid presets: {', '.join(presets)}"
        )
    config = TrainConfig.from_dict({"task": task, "preset": preset, **presets[preset].keys},
                                   source=f"preset {preset!r}")
    config = apply_overrides(config, list(overrides))
    if seed is not None:
        config = dataclasses.replace(config, seed=seed)
        config.check("--seed")
    return config
