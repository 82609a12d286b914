"""Reliability across seeds: train one task with K seeds and report who converged, how fast, and
who collapsed or diverged afterwards.

``ntm sweep copy --seeds 10`` runs ``ntm train`` once per seed in its own process (``--jobs`` at a
time, one thread each) into ``OUT/seed-S/``. Every seed trains for the full ``--sequences`` budget
with ``stop_bit_errors=-1``, so a model that converges and later falls apart is seen. The report
(`summarise`, `format_report`) is a pure function of the run directories' ``metrics.csv`` and
``checkpoint.json``; it is written to ``OUT/report.json`` and ``OUT/report.md``, also when the
sweep is stopped (Ctrl-C, SIGTERM: the children save a checkpoint and stop). Running the same
sweep again continues it: complete seeds are reused, incomplete ones resumed.

A seed *converges* at its first validation with bit errors per sequence <= the preset's
``stop_bit_errors`` (0 where the preset has none), *collapses* if a later validation has more than
`COLLAPSE_BIT_ERRORS` and the trainer did not roll it back at once (``rollback_bit_errors``: a
``rollback`` row in ``metrics.csv``; the report counts those apart as *rolled back*), and
*diverges* if any logged cost is not finite. The goal: every seed
converges within `GOAL_TIME_RATIO` times the median time, none collapses, no NaN anywhere.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from torch_ntm.checkpoint import CHECKPOINT_JSON, CheckpointError, load_checkpoint
from torch_ntm.config import ConfigError, resolve_config
from torch_ntm.factories import build_model, build_task
from torch_ntm.runlog import read_metrics

__all__ = ["run_sweep", "summarise", "format_report", "COLLAPSE_BIT_ERRORS", "GOAL_TIME_RATIO"]

COLLAPSE_BIT_ERRORS = 1.0  # a converged seed whose validation exceeds this has collapsed
GOAL_TIME_RATIO = 3.0  # the slowest seed may take this many times the median time to converge
DEFAULT_SEQUENCES = 50_000

# Keys the sweep sets itself, and the option to use instead.
_OWN_KEYS = {"seed": "--first-seed", "max_sequences": "--sequences"}


def run_sweep(task: str, seeds: int = 10, *, jobs: int = 2, preset: str | None = None,
              overrides: list[str] = (), sequences: int = DEFAULT_SEQUENCES,
              out: str | os.PathLike | None = None, first_seed: int = 0,
              echo=print) -> dict:
    """Train ``task`` with seeds ``first_seed .. first_seed + seeds - 1`` and report.

    Each seed runs ``python -m torch_ntm train`` in its own process with ``OMP_NUM_THREADS=1``
    and ``--set threads=1`` (before ``overrides``, which may change it), ``stop_bit_errors=-1``
    and ``max_sequences=sequences``; its output goes to ``OUT/seed-S/train.log``.

    Args:
        task: a task name (see `torch_ntm.tasks.TASKS`).
        seeds: how many seeds, >= 1.
        jobs: how many trainings run at once, >= 1.
        preset: the preset (default ``ntm-lstm``); its ``stop_bit_errors`` (or one given in
            ``overrides``) is the convergence threshold, 0 when negative.
        overrides: ``key=value`` strings as for ``ntm train --set`` (not ``seed`` or
            ``max_sequences``: use ``first_seed`` and ``sequences``).
        sequences: training sequences per seed, >= 1.
        out: the sweep folder (default ``runs/sweep-TASK``); a seed whose folder holds a run of
            these settings is reused when complete and resumed otherwise.
        first_seed: the first seed.
        echo: called with one line of progress per started and finished seed.

    Returns:
        The report (`summarise`'s dictionary plus ``title``, ``task``, ``preset``,
        ``sequences_per_seed``, ``exit_codes`` by seed trained now and ``reused``, the seeds
        that were complete already), also written to
        ``OUT/report.json`` and, formatted, ``OUT/report.md``.

    Raises:
        ConfigError: a bad task, preset, override or count, or runs of other settings in ``out``.
        KeyboardInterrupt, SystemExit: the sweep was stopped (Ctrl-C, SIGTERM); the report of
            the seeds that finished was written first.
    """
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    if sequences < 1:
        raise ConfigError(f"--sequences must be >= 1, got {sequences}")
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key in _OWN_KEYS:
            raise ConfigError(f"--set {key}: the sweep sets {key} itself; use {_OWN_KEYS[key]}")
    config = resolve_config(task, preset, overrides)
    build_model(config, build_task(config))  # fail here, once, rather than in every child
    threshold = max(config.stop_bit_errors, 0.0)

    out = Path(out) if out is not None else Path("runs") / f"sweep-{task}"
    run_dirs = [out / f"seed-{s}" for s in range(first_seed, first_seed + seeds)]
    sets = ["threads=1", *overrides, "stop_bit_errors=-1", f"max_sequences={sequences}"]
    # What each folder holds decides what to do: a complete run is reused, an incomplete one
    # resumed, anything else started afresh (a sweep can be continued by running it again).
    done = {}  # seed -> "complete" or "resume"
    for seed, run_dir in zip(range(first_seed, first_seed + seeds), run_dirs):
        if (run_dir / CHECKPOINT_JSON).exists():
            done[seed] = _existing_run(run_dir, resolve_config(task, preset, sets, seed),
                                       sequences)

    def command(seed: int, run_dir: Path) -> list[str]:
        if done.get(seed) == "resume":
            argv = [sys.executable, "-m", "torch_ntm", "train", task, "--resume", str(run_dir)]
        else:
            argv = [sys.executable, "-m", "torch_ntm", "train", task, "--seed", str(seed),
                    "--out", str(run_dir), "--overwrite"]  # the folder holds our train.log
            argv += ["--preset", preset] if preset is not None else []
        return argv + ["--no-plots", "--no-progress",
                       *(arg for item in sets for arg in ("--set", item))]

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    pending = [(s, d) for s, d in zip(range(first_seed, first_seed + seeds), run_dirs)
               if done.get(s) != "complete"]
    for seed in sorted(s for s, state in done.items() if state == "complete"):
        echo(f"seed {seed}: complete already ({out / f'seed-{seed}'})")
    running: dict[int, tuple[subprocess.Popen, float]] = {}
    exit_codes: dict[int, int] = {}
    terminated = _SigtermAsExit()
    stopped = None
    try:
        while pending or running:
            while pending and len(running) < jobs:
                seed, run_dir = pending.pop(0)
                run_dir.mkdir(parents=True, exist_ok=True)
                with open(run_dir / "train.log", "ab" if seed in done else "wb") as log:
                    # Its own session: Ctrl-C reaches the sweep only, which stops the children
                    # once (SIGTERM: each saves a checkpoint that a continued sweep resumes).
                    proc = subprocess.Popen(command(seed, run_dir), stdout=log,
                                            stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True,
                                            preexec_fn=_terminate_with_parent)
                running[seed] = (proc, time.perf_counter())
                echo(f"seed {seed}: {'resumed' if seed in done else 'started'} ({run_dir})")
            time.sleep(0.1)
            for seed, (proc, started) in list(running.items()):
                if proc.poll() is not None:
                    del running[seed]
                    exit_codes[seed] = proc.returncode
                    log = out / f"seed-{seed}" / "train.log"
                    status = ("done" if proc.returncode == 0 else
                              f"FAILED with exit status {proc.returncode} (see {log})")
                    echo(f"seed {seed}: {status} after {time.perf_counter() - started:.1f} s")
    except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C, SIGTERM: report what finished
        stopped = e
    finally:  # interrupted (Ctrl-C, SIGTERM): stop the children rather than leave them training
        for proc, _ in running.values():
            proc.terminate()
        for proc, _ in running.values():
            proc.wait()
        terminated.restore()

    title = (f"Sweep: {task} ({config.preset}), seeds {first_seed}-{first_seed + seeds - 1}, "
             f"{sequences:,} sequences each")
    report = {"title": title, "task": task, "preset": config.preset,
              "sequences_per_seed": sequences, **summarise(run_dirs, threshold),
              "exit_codes": {str(s): c for s, c in sorted(exit_codes.items())},
              "reused": sorted(s for s, state in done.items() if state == "complete")}
    (out / "report.json").write_text(json.dumps(_finite(report), indent=2) + "\n")
    (out / "report.md").write_text(format_report(report, title) + "\n")
    if stopped is not None:
        raise stopped
    return report


def _existing_run(run_dir: Path, config, sequences: int) -> str:
    """``"complete"`` if ``run_dir`` holds this seed's run with the whole budget, ``"resume"``
    if it holds an incomplete one; `ConfigError` if its run has other settings."""
    try:
        ckpt = load_checkpoint(run_dir)
    except CheckpointError as e:
        raise ConfigError(f"{run_dir} holds a run that cannot be continued ({e}); remove it "
                          f"or choose another --out") from None
    other = [f.name for f in dataclasses.fields(config) if f.name not in ("max_sequences",)
             and getattr(config, f.name) != getattr(ckpt.config, f.name)]
    if other:
        raise ConfigError(f"{run_dir} already holds a run with other settings "
                          f"({', '.join(other)}); remove it or choose another --out or "
                          f"--first-seed")
    return "complete" if ckpt.sequences >= sequences else "resume"


class _SigtermAsExit:
    """Turn SIGTERM into `SystemExit` (status 143) until `restore`, so that a sweep killed
    with ``kill`` stops its children as one stopped with Ctrl-C does (SIGTERM's default
    action would end the sweep at once and leave them training)."""

    def __init__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread():  # only there can it be set
            self.previous = signal.signal(signal.SIGTERM, self._exit)

    @staticmethod
    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def _terminate_with_parent() -> None:
    """In a child, before it runs: on Linux, have the kernel send it SIGTERM when the sweep
    dies, even by SIGKILL (which the sweep cannot catch to stop its children); the child then
    saves a checkpoint and exits. Elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _finite(value):
    """``value`` with non-finite floats replaced by None, so the JSON is strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _float(text: str | None) -> float | None:
    """A CSV cell as a float (``nan``/``inf`` included), or None when empty."""
    if text is None or not text.strip():
        return None
    return float(text)


def _seed_row(run_dir: Path, threshold: float) -> dict:
    """One seed's line of the report, from its ``metrics.csv`` and ``checkpoint.json``."""
    row = {"seed": None, "run_dir": str(run_dir), "complete": False, "converged": False,
           "converged_sequences": None, "converged_s": None, "collapsed": False,
           "rolled_back": 0, "diverged": False, "nan_steps": 0, "final_bit_errors": None}
    name = run_dir.name
    if name.startswith("seed-") and name[5:].lstrip("-").isdigit():
        row["seed"] = int(name[5:])
    try:
        record = json.loads((run_dir / CHECKPOINT_JSON).read_text())
    except (OSError, ValueError):  # not started, or failed before its first checkpoint
        record = {}
    config = record.get("config", {})
    row["seed"] = config.get("seed", row["seed"])
    row["nan_steps"] = int(record.get("extra", {}).get("nan_steps", 0))
    row["complete"] = bool(record) and record.get("sequences", 0) >= config.get("max_sequences", 0)
    try:
        rows = read_metrics(run_dir / "metrics.csv")
    except CheckpointError:  # not a metrics file (yet): nothing learned to report
        rows = []
    fallen = False  # the last validation, after converging, was a collapse
    for r in rows:
        cost = _float(r.get("cost_bits"))
        if cost is not None and not math.isfinite(cost):
            row["diverged"] = True
        if r.get("split") == "rollback":  # the trainer put the best weights back
            row["final_bit_errors"] = _float(r.get("bit_errors"))
            row["rolled_back"] += 1
            fallen = False
            continue
        if r.get("split") != "val":
            continue
        errors = _float(r.get("bit_errors"))
        if errors is None:
            continue
        row["collapsed"] = row["collapsed"] or fallen
        row["final_bit_errors"] = errors
        if not row["converged"]:
            if errors <= threshold:  # NaN compares False: never converged on a NaN
                row["converged"] = True
                row["converged_sequences"] = int(r["sequences"])
                row["converged_s"] = float(r["elapsed_s"])
        else:
            fallen = not errors <= COLLAPSE_BIT_ERRORS  # NaN bit errors after converging too
    row["collapsed"] = row["collapsed"] or fallen
    return row


def summarise(run_dirs, threshold: float = 0.0) -> dict:
    """The sweep report of some run directories (one seed each); reads files only.

    Args:
        run_dirs: run directories, each with ``metrics.csv`` and ``checkpoint.json`` (missing
            files count as an incomplete seed that did not converge).
        threshold: validation bit errors per sequence at or below which a seed has converged.

    Returns:
        ``seeds``: one dict per run, in order: ``seed``, ``run_dir``, ``complete`` (its
        checkpoint holds the whole ``max_sequences`` budget), ``converged``,
        ``converged_sequences`` and ``converged_s`` (sequences and training
        seconds at the first converged validation, or None), ``collapsed`` (not rolled back),
        ``rolled_back`` (how many times the trainer restored its best weights), ``diverged``,
        ``nan_steps`` (skipped updates), ``final_bit_errors`` (last validation, or None);
        and the summary: ``threshold``, ``collapse_bit_errors``, ``num_seeds``,
        ``num_converged``, ``median_converged_s``, ``median_converged_sequences``,
        ``max_over_median_s`` (slowest converged seed's time over the median, or None),
        ``num_collapsed``, ``total_rolled_back``, ``num_diverged``, ``total_nan_steps`` and
        ``goal_met``.
    """
    rows = [_seed_row(Path(d), threshold) for d in run_dirs]
    times = [r["converged_s"] for r in rows if r["converged"]]
    seqs = [r["converged_sequences"] for r in rows if r["converged"]]
    median_s = statistics.median(times) if times else None
    ratio = max(times) / median_s if times and median_s > 0 else None
    num_converged = len(times)
    num_collapsed = sum(r["collapsed"] for r in rows)
    num_diverged = sum(r["diverged"] for r in rows)
    total_nan = sum(r["nan_steps"] for r in rows)
    goal = (bool(rows) and num_converged == len(rows) and num_collapsed == 0
            and num_diverged == 0 and total_nan == 0
            and (ratio is None or ratio <= GOAL_TIME_RATIO))
    return {
        "threshold": threshold, "collapse_bit_errors": COLLAPSE_BIT_ERRORS,
        "num_seeds": len(rows), "num_converged": num_converged,
        "median_converged_s": median_s,
        "median_converged_sequences": statistics.median(seqs) if seqs else None,
        "max_over_median_s": ratio, "num_collapsed": num_collapsed,
        "total_rolled_back": sum(r["rolled_back"] for r in rows),
        "num_diverged": num_diverged, "total_nan_steps": total_nan, "goal_met": goal,
        "seeds": rows,
    }


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def format_report(summary: dict, title: str | None = None) -> str:
    """`summarise`'s dictionary as Markdown: a table with one row per seed, then the summary."""
    lines = [f"# {title}", ""] if title else []
    lines += [
        "| seed | converged | sequences | time (s) | collapsed | rolled back | diverged "
        "| NaN steps | final bit errors |",
        "|---:|:---:|---:|---:|:---:|---:|:---:|---:|---:|",
    ]
    for r in summary["seeds"]:
        seqs = f"{r['converged_sequences']:,}" if r["converged"] else "-"
        secs = f"{r['converged_s']:.1f}" if r["converged"] else "-"
        final = "-" if r["final_bit_errors"] is None else f"{r['final_bit_errors']:.4g}"
        converged = _yes(r["converged"]) + ("" if r["complete"] else " (incomplete)")
        lines.append(f"| {r['seed']} | {converged} | {seqs} | {secs} | {_yes(r['collapsed'])} "
                     f"| {r['rolled_back']} | {_yes(r['diverged'])} | {r['nan_steps']} "
                     f"| {final} |")
    median_s, median_seq = summary["median_converged_s"], summary["median_converged_sequences"]
    ratio = summary["max_over_median_s"]
    lines += [
        "",
        f"- converged: {summary['num_converged']}/{summary['num_seeds']} "
        f"(validation bit errors per sequence <= {summary['threshold']:g})",
        "- median time to converge: " + ("-" if median_s is None else
                                         f"{median_s:.1f} s ({median_seq:,.0f} sequences)"),
        "- slowest / median time: " + ("-" if ratio is None else f"{ratio:.2f}"),
        f"- collapsed after converging (validation bit errors > "
        f"{summary['collapse_bit_errors']:g}, not rolled back): {summary['num_collapsed']}",
        f"- rollbacks to the best weights: {summary['total_rolled_back']}",
        f"- diverged (non-finite cost): {summary['num_diverged']}; "
        f"NaN steps: {summary['total_nan_steps']}",
        f"- goal (all converge within {GOAL_TIME_RATIO:g}x the median time, none collapses, "
        f"no NaN): {'met' if summary['goal_met'] else 'not met'}",
    ]
    return "\n".join(lines)
