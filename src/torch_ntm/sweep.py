"""Reliability across seeds and settings: train one task with K seeds (at each point of an
optional grid of settings) and report who converged, how fast, and who collapsed or diverged.

``ntm sweep copy --seeds 10`` runs ``ntm train`` once per seed into ``OUT/seed-S/``;
``--grid lr=1e-3,3e-3 --grid batch_size=16,32`` runs every seed at every combination, each
combination (grid point) in its own folder, ``OUT/lr=1e-3,batch_size=16/seed-S/``. Each training
is a child process (one thread, ``OMP_NUM_THREADS=1``), started ``--jobs`` at a time on this
machine, or with ``--ray [ADDRESS]`` by a Ray task on a Ray cluster (`torch_ntm.sweep` imports Ray
only then). Every seed trains for the full ``--sequences`` budget with ``stop_bit_errors=-1``, so
a model that converges and later falls apart is seen. The report (`summarise`, `format_report`,
`format_grid_report`) is a pure function of the run directories' ``metrics.csv`` and
``checkpoint.json``; it is written to ``OUT/report.json`` and ``OUT/report.md``, also when the
sweep is stopped (Ctrl-C, SIGTERM: the trainings save a checkpoint and stop). Running the same
sweep again continues it: complete seeds are reused, incomplete ones resumed.

A seed *converges* at its first validation with bit errors per sequence <= the preset's
``stop_bit_errors`` (0 where the preset has none), *collapses* if a later validation has more than
`COLLAPSE_BIT_ERRORS` and the trainer did not roll it back at once (``rollback_bit_errors``: a
``rollback`` row in ``metrics.csv``; the report counts those apart as *rolled back*), and
*diverges* if any logged cost is not finite. The goal: every seed
converges within `GOAL_TIME_RATIO` times the median time, none collapses, no NaN anywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

from torch_ntm.checkpoint import (
    CHECKPOINT_JSON,
    MAX_RECORD_BYTES,
    CheckpointError,
    atomic_write,
    load_checkpoint,
    lock_run,
    open_own,
    own_folder,
    read_own,
    stage_dir,
)
from torch_ntm.config import ConfigError, differing_keys
from torch_ntm.factories import build_model, build_task
from torch_ntm.overrides import apply_overrides, finetune_config
from torch_ntm.presets import resolve_config
from torch_ntm.runlog import read_metrics

__all__ = ["run_sweep", "parse_grid", "GridPoint", "summarise", "format_report",
           "format_grid_report", "default_out", "COLLAPSE_BIT_ERRORS", "GOAL_TIME_RATIO",
           "RAY_INSTALL"]

COLLAPSE_BIT_ERRORS = 1.0  # a converged seed whose validation exceeds this has collapsed
GOAL_TIME_RATIO = 3.0  # the slowest seed may take this many times the median time to converge
DEFAULT_SEQUENCES = 50_000
DEFAULT_JOBS = 2  # trainings at once on this machine (no --ray)
RAY_INSTALL = "pip install 'torch-ntm[ray]'"
_STOP_SECONDS = 120  # how long a stopped Ray sweep waits for its trainings' checkpoints

# Keys the sweep sets itself, and the option to use instead.
_OWN_KEYS = {"seed": "--first-seed", "max_sequences": "--sequences"}


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One combination of ``--grid`` values: ``name`` (``"lr=1e-3,batch_size=16"``, its folder;
    ``""`` for a sweep without a grid) and its ``overrides`` (``("lr=1e-3", "batch_size=16")``).
    """

    name: str
    overrides: tuple[str, ...]


def parse_grid(grid: list[str] = ()) -> list[GridPoint]:
    """Every combination of ``key=v1,v2,...`` strings, the first key's values outermost.

    Values are separated by commas, or by semicolons where any is given (for list values:
    ``eval_sizes=40,120;80`` is two points). Without a grid, one point with no overrides.
    Values are checked later, against the config (`run_sweep`).

    Raises:
        ConfigError: an item without ``=`` or values, an empty or repeated value, a key given
            twice or one the sweep sets itself, a value that cannot name a folder.
    """
    axes, keys = [], set()
    for item in grid:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise ConfigError(f"--grid expects key=value1,value2,..., got {item!r}")
        if key in _OWN_KEYS:
            raise ConfigError(f"--grid {key}: the sweep sets {key} itself; use "
                              f"{_OWN_KEYS[key]}")
        if key in keys:
            raise ConfigError(f"--grid {key}: given twice; list its values once "
                              f"(--grid {key}=v1,v2)")
        keys.add(key)
        values = [v.strip() for v in text.split(";" if ";" in text else ",")]
        if "" in values or len(set(values)) < len(values):
            raise ConfigError(f"--grid {item}: has an empty or repeated value")
        if any("/" in v or v in (".", "..") for v in values):
            raise ConfigError(f"--grid {item}: a value names the grid point's folder, so it "
                              f"cannot hold '/' or be '.' or '..'")
        axes.append([f"{key}={v}" for v in values])
    return [GridPoint(",".join(combo), combo) for combo in itertools.product(*axes)]


@dataclasses.dataclass
class _SeedRun:
    """One training of the sweep: a seed at a grid point, and what its folder holds now."""

    point: GridPoint
    seed: int
    run_dir: Path
    sets: list[str]  # its --set strings: the sweep's, the grid point's, then seed and budget
    state: str = "new"  # "new", "resume" (an incomplete run of these settings) or "complete"
    exit_code: int | None = None  # of its training in this sweep, once finished

    @property
    def label(self) -> str:
        return f"{self.point.name} seed {self.seed}" if self.point.name else f"seed {self.seed}"


def run_sweep(task: str, seeds: int = 10, *, jobs: int | None = None, preset: str | None = None,
              overrides: list[str] = (), grid: list[str] = (),
              sequences: int | None = DEFAULT_SEQUENCES, out: str | os.PathLike | None = None,
              first_seed: int = 0, ray_address: str | None = None, gpus_per_run: float = 0.0,
              as_trained: bool = False, echo=print) -> dict:
    """Train ``task`` with seeds ``first_seed .. first_seed + seeds - 1`` (at each grid point)
    and report.

    Each training runs ``python -m torch_ntm train`` in a child process with
    ``OMP_NUM_THREADS=1`` and ``--set threads=1`` (before ``overrides``, which may change it),
    then ``overrides``, the grid point's values, ``stop_bit_errors=-1`` and
    ``max_sequences=sequences`` (with ``as_trained``, neither: each seed trains as ``ntm train
    TASK --seed S`` does, to the preset's stop rule, within ``sequences`` if given, else the
    preset's budget); its output goes to ``RUN/train.log``. Without ``ray_address``
    the children run on this machine, ``jobs`` at a time; with it, each is started by a Ray task
    that holds one CPU (and ``gpus_per_run`` GPUs) of the cluster for as long as it trains.

    Args:
        task: a task name (see `torch_ntm.tasks.TASKS`).
        seeds: how many seeds, >= 1.
        jobs: how many trainings run at once, >= 1 (default `DEFAULT_JOBS`; with Ray, as many
            as the cluster has room for, and a new local instance gets ``jobs`` CPUs).
        preset: the preset (default: the task's, `torch_ntm.presets.default_preset`); its
            ``stop_bit_errors`` (or one given in ``overrides`` or the grid) is the convergence
            threshold, 0 when negative.
        overrides: ``key=value`` strings as for ``ntm train --set`` (not ``seed`` or
            ``max_sequences``: use ``first_seed`` and ``sequences``).
        grid: ``key=v1,v2`` strings (see `parse_grid`) of config keys as for ``overrides``
            but not among them; every seed is trained at every combination.
        sequences: training sequences per seed, >= 1 (None, only with ``as_trained``: the
            preset's budget).
        as_trained: train each seed as the default command does (the preset's stop rule and
            budget), the runs `torch_ntm.criteria` scores, instead of past convergence.
        out: the sweep folder (default ``runs/sweep-TASK``); a run folder (``OUT/seed-S``, or
            ``OUT/POINT/seed-S`` with a grid) that holds a run of these settings is reused when
            complete and resumed otherwise. With Ray it must be a folder that every machine of
            the cluster sees at the same path.
        first_seed: the first seed.
        ray_address: None to train on this machine; ``"local"`` to start a Ray instance here
            for the sweep; otherwise the address of a running cluster (``"auto"``: the one
            started on this machine with ``ray start``, ``"HOST:6379"``). If Ray is initialised
            in this process already, its connection is used and left open.
        gpus_per_run: with Ray, the GPUs each training holds (a fraction shares one); more than
            0 also sets ``device=cuda`` (before ``overrides``, which may change it).
        echo: called with one line of progress per started and finished training.

    Returns:
        The report, also written to ``OUT/report.json`` and, formatted, ``OUT/report.md``.
        Without a grid: `summarise`'s dictionary plus ``title``, ``task``, ``preset``,
        ``sequences_per_seed``, ``exit_codes`` by seed trained now and ``reused``, the seeds that
        were complete already. With a grid: ``title``, ``task``, ``preset``,
        ``sequences_per_seed``, ``grid`` (the ``--grid`` strings) and ``points``, one dictionary
        per grid point: ``point`` (its name), ``overrides``, and the keys of the report without a
        grid from ``threshold`` on.

    Raises:
        ConfigError: a bad task, preset, override, grid or count, runs of other settings in
            ``out``, or ``ray_address`` given and Ray not installed.
        KeyboardInterrupt, SystemExit: the sweep was stopped (Ctrl-C, SIGTERM); the report of
            the trainings that finished was written first.
    """
    if sequences is None and not as_trained:
        raise ConfigError("--sequences: a sweep past convergence needs a budget")
    for name, value, least in (("--seeds", seeds, 1), ("--first-seed", first_seed, 0),
                               ("--jobs", jobs, 1), ("--sequences", sequences, 1)):
        if value is not None and value < least:
            raise ConfigError(f"{name} must be >= {least}, got {value}")
    if first_seed + seeds > 2**64:  # torch's seeds end at 2**64 - 1 (`TrainConfig.seed`)
        raise ConfigError(f"--first-seed {first_seed} with --seeds {seeds} goes past the largest "
                          f"seed, 2**64 - 1; give --first-seed <= {2**64 - seeds}")
    if not (gpus_per_run >= 0 and math.isfinite(gpus_per_run)):
        raise ConfigError(f"--gpus-per-run must be a number >= 0, got {gpus_per_run}")
    if gpus_per_run and ray_address is None:
        raise ConfigError("--gpus-per-run needs --ray; without Ray, --set device=cuda trains "
                          "every run on this machine's GPU")
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key in _OWN_KEYS:
            raise ConfigError(f"--set {key}: the sweep sets {key} itself; use {_OWN_KEYS[key]}")
    if ray_address is not None:
        _import_ray()  # a missing Ray, or no cluster there, is a mistake to report before
        _check_ray_address(ray_address)  # anything runs
    points = parse_grid(grid)
    given = {item.partition("=")[0].strip() for item in overrides}
    for item in points[0].overrides:  # every point has every grid key
        if item.partition("=")[0] in given:
            raise ConfigError(f"--grid {item.partition('=')[0]}: also given with --set; give it "
                              f"in one place")
    sets = ["threads=1", *(["device=cuda"] if gpus_per_run else []), *overrides]
    configs = _point_configs(task, preset, sets, points)

    out = Path(out) if out is not None else default_out(task)
    with lock_run(out, "running a sweep into this folder"):  # one at a time writes its logs
        return _sweep(task, preset, sets, points, configs, out, seeds, first_seed, sequences,
                      jobs, ray_address, gpus_per_run, grid, as_trained, echo)


def _sweep(task, preset, sets, points, configs, out, seeds, first_seed, sequences, jobs,
           ray_address, gpus_per_run, grid, as_trained, echo) -> dict:
    """`run_sweep` once its arguments are checked, holding the lock of ``out``."""
    seed_range = range(first_seed, first_seed + seeds)
    own = ([] if as_trained else ["stop_bit_errors=-1"]) + (
        [] if sequences is None else [f"max_sequences={sequences}"])
    runs = [_SeedRun(p, s, seed_dir(out, s, p.name), [*sets, *p.overrides, *own])
            for p in points for s in seed_range]
    for run in runs:  # OUT/POINT/seed-S: not a link planted in the sweep's folder
        if run.point.name:
            own_folder(out / run.point.name)
        own_folder(run.run_dir)
    # What each folder holds decides what to do: a complete run is reused, an incomplete one
    # resumed, anything else started afresh (a sweep can be continued by running it again).
    for run in runs:
        if (run.run_dir / CHECKPOINT_JSON).exists():
            config = resolve_config(task, preset, run.sets, run.seed)
            run.state = _existing_run(run.run_dir, config)
    for run in runs:
        if run.state == "complete":
            echo(f"{run.label}: complete already ({run.run_dir})")
    pending = [run for run in runs if run.state != "complete"]
    stopped = _train_all(task, preset, pending, jobs, ray_address, gpus_per_run, echo)

    budget = sequences if sequences is not None else configs[0].max_sequences
    title = (f"Sweep: {task} ({configs[0].preset}), seeds {first_seed}-{seed_range[-1]}, "
             + (f"as `ntm train` runs each (the preset's stop rule, at most {budget:,} "
                f"sequences)" if as_trained else f"{budget:,} sequences each"))
    report = {"title": title, "task": task, "preset": configs[0].preset,
              "sequences_per_seed": budget}
    summaries = []
    for point, config in zip(points, configs):
        mine = [run for run in runs if run.point == point]
        summaries.append({
            **summarise([run.run_dir for run in mine], config.evaluation.stop_bit_errors),
            "exit_codes": {str(r.seed): r.exit_code for r in mine if r.exit_code is not None},
            "reused": [r.seed for r in mine if r.state == "complete"]})
    if grid:
        report["title"] += f", {len(points)} grid points"
        report["grid"] = list(grid)
        report["points"] = [{"point": p.name, "overrides": list(p.overrides), **summary}
                            for p, summary in zip(points, summaries)]
        text = format_grid_report(report)
    else:
        report.update(summaries[0])
        text = format_report(report, title)
    atomic_write(out / "report.json", (json.dumps(_finite(report), indent=2) + "\n").encode())
    atomic_write(out / "report.md", (text + "\n").encode())
    if stopped is not None:
        raise stopped
    return report


def _point_configs(task: str, preset: str | None, sets: list[str], points: list[GridPoint]):
    """Each grid point's resolved config (without seed and budget), every model built once so
    that a config that cannot train fails here rather than in every training."""
    base = resolve_config(task, preset, sets)
    for item in dict.fromkeys(i for point in points for i in point.overrides):
        with _grid_errors():  # each value alone first: the error names it
            apply_overrides(base, [item])
    configs = []
    for point in points:
        with _grid_errors(point.name) if point.name else contextlib.nullcontext():
            config = resolve_config(task, preset, [*sets, *point.overrides])
            build_model(config, build_task(config))
        configs.append(config)
    return configs


@contextlib.contextmanager
def _grid_errors(point: str = ""):
    """A `ConfigError` about a ``--grid`` value said as such (the config parser names the option
    ``--set``; the user gave ``--grid``), and the grid point named where one is given."""
    try:
        yield
    except ConfigError as e:
        text = str(e)
        if text.startswith("--set"):
            text = "--grid" + text[len("--set"):]
        raise ConfigError(f"grid point {point}: {text}" if point else text) from None


def _train_all(task: str, preset: str | None, runs: list[_SeedRun], jobs: int | None,
               ray_address: str | None, gpus_per_run: float, echo) -> BaseException | None:
    """Train ``runs``, ``jobs`` at a time, and set each one's ``exit_code``; the exception that
    stopped the sweep (Ctrl-C, SIGTERM: the trainings were stopped first), or None."""
    if not runs:
        return None  # nothing to train: no Ray to start either
    pending, running = list(runs), []  # running: (run, handle)
    launcher = terminated = stopped = None
    try:
        if ray_address is None:
            launcher, limit = _Processes(), jobs or DEFAULT_JOBS
        else:
            launcher, limit = _Ray(ray_address, jobs, gpus_per_run), jobs or len(runs)
        terminated = _SigtermAsExit()  # after ray.init, which sets a handler of its own
        while pending or running:
            while pending and len(running) < limit:
                run = pending.pop(0)
                resume = run.state == "resume"
                handle = launcher.start(_train_argv(task, preset, run), run.run_dir / "train.log",
                                        append=resume)
                running.append((run, handle))
                echo(f"{run.label}: {launcher.started(resume)} ({run.run_dir})")
            time.sleep(0.1)
            for run, handle in list(running):
                finished = launcher.poll(handle)
                if finished is None:
                    continue
                running.remove((run, handle))
                run.exit_code = finished.exit_code
                where = f" on {finished.node}" if finished.node else ""
                if finished.error:
                    status = f"FAILED{where}: {finished.error}"
                elif finished.exit_code:
                    status = (f"FAILED with exit status {finished.exit_code}{where} (see "
                              f"{run.run_dir / 'train.log'})")
                else:
                    status = "done"
                    if finished.node and not (run.run_dir / CHECKPOINT_JSON).exists():
                        status += f", but {run.run_dir} is not seen here (see --out)"
                echo(f"{run.label}: {status} after {finished.seconds:.1f} s{where}")
    except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C, SIGTERM: report what finished
        stopped = e
    finally:  # interrupted (Ctrl-C, SIGTERM): stop the trainings rather than leave them training
        if launcher is not None:
            launcher.stop([handle for _, handle in running])
        if terminated is not None:
            terminated.restore()
        if launcher is not None:
            launcher.close()
    return stopped


def default_out(task: str) -> Path:
    """The folder of a sweep of ``task`` without ``out``."""
    return Path("runs") / f"sweep-{task}"


def seed_dir(out: Path, seed: int, point: str = "") -> Path:
    """The run directory of ``seed`` in the sweep folder ``out`` (in grid point ``point``'s
    folder for a grid)."""
    return Path(out) / point / f"seed-{seed}"


def _train_argv(task: str, preset: str | None, run: _SeedRun) -> list[str]:
    """``run``'s ``ntm train`` command, after ``python``: resumed, or new into its folder."""
    run_dir = str(run.run_dir.absolute())  # a Ray worker's current directory may be another
    if run.state == "resume":
        argv = ["-m", "torch_ntm", "train", task, "--resume", run_dir]
    else:
        argv = ["-m", "torch_ntm", "train", task, "--seed", str(run.seed), "--out", run_dir,
                "--overwrite"]  # the folder holds our train.log
        argv += ["--preset", preset] if preset is not None else []
    return argv + ["--no-plots", "--no-progress", *(arg for item in run.sets
                                                    for arg in ("--set", item))]


def _start_training(argv: list[str], log: Path, append: bool) -> subprocess.Popen:
    """``python argv`` (`_train_argv`) in a child process with one thread, its output in
    ``log``; in a session of its own, so that Ctrl-C reaches the sweep only, which stops the
    children once (SIGTERM: each saves a checkpoint that a continued sweep resumes)."""
    own_folder(log.parent)
    with open_own(log, append=append) as f:
        return subprocess.Popen([sys.executable, *argv], stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"},
                                start_new_session=True, preexec_fn=_terminate_with_parent)


class _Finished(typing.NamedTuple):
    """How a training ended: its exit status, seconds, the machine (Ray) and a Ray error."""

    exit_code: int
    seconds: float
    node: str = ""
    error: str = ""


class _Processes:
    """Each training a child process of the sweep, on this machine."""

    @staticmethod
    def started(resume: bool) -> str:
        return "resumed" if resume else "started"

    @staticmethod
    def start(argv: list[str], log: Path, append: bool):
        return _start_training(argv, log, append), time.perf_counter()

    @staticmethod
    def poll(handle) -> _Finished | None:
        proc, started = handle
        if proc.poll() is None:
            return None
        return _Finished(proc.returncode, time.perf_counter() - started)

    @staticmethod
    def stop(handles) -> None:
        for proc, _ in handles:
            proc.terminate()
        for proc, _ in handles:
            proc.wait()

    def close(self) -> None:
        pass


class _Ray:
    """Each training started by a Ray task (`_train_on_worker`) that holds one CPU and
    ``gpus`` GPUs of the cluster at ``address`` (``"local"``: a new instance on this machine
    with ``jobs`` CPUs, or all) while it trains."""

    def __init__(self, address: str, jobs: int | None, gpus: float):
        self.ray = ray = _import_ray()
        self.sigterm = signal.getsignal(signal.SIGTERM)  # ray.init replaces it
        self.owned = not ray.is_initialized()  # else the caller's connection, left open
        if self.owned:
            local = {"include_dashboard": False, "num_cpus": jobs} if address == "local" else {}
            try:
                ray.init(address=address, log_to_driver=False, logging_level="WARNING",
                         **local)
            except ConnectionError as e:  # no cluster there
                self._restore_sigterm()
                raise ConfigError(f"--ray {address}: {e}") from None
        # No retries: a retried training would start again from the sweep's first decision.
        self.task = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=0)(_train_on_worker)

    @staticmethod
    def started(resume: bool) -> str:
        return "queued on Ray" + (" to resume" if resume else "")

    def start(self, argv: list[str], log: Path, append: bool):
        return self.task.remote(argv, str(log.absolute()), append)

    def poll(self, ref) -> _Finished | None:
        if not self.ray.wait([ref], timeout=0)[0]:
            return None
        try:
            return _Finished(*self.ray.get(ref))
        except self.ray.exceptions.RayError as e:  # the task failed, or its worker died
            return _Finished(1, 0.0, error=str(e).strip().splitlines()[-1])

    def stop(self, refs) -> None:
        for ref in refs:  # a KeyboardInterrupt in each task, which stops its training
            self.ray.cancel(ref)
        if refs:  # ... with SIGTERM: it saves a checkpoint first
            self.ray.wait(refs, num_returns=len(refs), timeout=_STOP_SECONDS)

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()
            self._restore_sigterm()

    def _restore_sigterm(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.sigterm)


def _train_on_worker(argv: list[str], log: str, append: bool) -> tuple[int, float, str]:
    """A Ray task: the training ``python argv`` (`_start_training`, with this worker's
    Python); its exit status, seconds and machine. Cancelled (KeyboardInterrupt), it stops the
    training with SIGTERM, which saves a checkpoint, and waits for it."""
    started = time.perf_counter()
    # ray.cancel raises KeyboardInterrupt the way SIGINT does, so not where SIGINT is ignored,
    # as it is in everything started from a sweep run in the background (nohup ntm sweep &).
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None
    try:
        proc = _start_training(argv, Path(log), append)
        try:
            while proc.poll() is None:
                time.sleep(0.2)  # short: a cancellation is raised between two sleeps
        except BaseException:
            proc.terminate()
            proc.wait()
            raise
    finally:
        if previous is not None:  # the worker runs other tasks afterwards
            signal.signal(signal.SIGINT, previous)
    return proc.returncode, time.perf_counter() - started, platform.node()


# How long a sweep waits for the cluster at --ray HOST:PORT to answer (ray.init itself retried
# a dead address for minutes)
_RAY_CONNECT_SECONDS = 10


def _check_ray_address(address: str) -> None:
    """Raise `ConfigError` if nothing answers at ``address`` (``HOST:PORT`` or
    ``ray://HOST:PORT``) within `_RAY_CONNECT_SECONDS`; ``local``, ``auto`` and other forms are
    left to Ray."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), _RAY_CONNECT_SECONDS):
            pass
    except (OSError, ValueError) as e:
        raise ConfigError(f"--ray {address}: no Ray cluster answers there ({e}); check the "
                          f"address, start one with ray start --head, or use --ray (a new local "
                          f"instance)") from None


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--ray needs Ray, which is not installed: {RAY_INSTALL}") from None
    return ray


def _finished(sequences: int, budget: int, streak: int, stop_bit_errors: float,
              patience_evals: int) -> bool:
    """Whether a run is over: ``budget`` sequences spent, or its stop rule met
    (``stop_bit_errors`` >= 0 and a streak of ``patience_evals`` validations)."""
    return sequences >= budget or (stop_bit_errors >= 0 and streak >= patience_evals)


def _existing_run(run_dir: Path, config) -> str:
    """``"complete"`` if ``run_dir`` holds this seed's run, over (`_finished`), ``"resume"``
    if it holds an unfinished one; `ConfigError` if its run has other settings."""
    try:
        ckpt = load_checkpoint(run_dir)
    except CheckpointError as e:
        raise ConfigError(f"{run_dir} holds a run that cannot be continued ({e}); remove it "
                          f"or choose another --out") from None
    if config.finetune:  # the checkpoint is the fine-tune's, from the first stage it names
        config = finetune_config(config, ckpt.config.init_from)
    sequences = config.max_sequences
    other = [key for key in differing_keys(config, ckpt.config) if key != "max_sequences"]
    if other:
        raise ConfigError(f"{run_dir} already holds a run with other settings "
                          f"({', '.join(other)}); remove it or choose another --out or "
                          f"--first-seed")
    if ckpt.config.max_sequences > sequences:  # the report would say fewer than it trained
        raise ConfigError(f"{run_dir} holds a run with a budget of "
                          f"{ckpt.config.max_sequences:,} sequences, more than --sequences "
                          f"{sequences:,}; pass --sequences {ckpt.config.max_sequences} to "
                          f"reuse it, or choose another --out")
    evaluation = ckpt.config.evaluation
    over = _finished(ckpt.sequences, sequences, ckpt.extra.get("streak", 0),
                     evaluation.stop_bit_errors, evaluation.patience_evals)
    return "complete" if over else "resume"


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


def _read_rows(run_dir: Path) -> list[dict]:
    try:
        return read_metrics(run_dir / "metrics.csv")
    except CheckpointError:  # not a metrics file (yet): nothing learned to report
        return []


def _timeline(run_dir: Path) -> list[dict]:
    """The rows of ``run_dir``'s ``metrics.csv``; for a run with a fine-tune (``finetune``),
    its first stage's (``RUN/stages/0``) first, then the fine-tune's, their sequences and
    seconds counted on from where the first stage ends: one run from its first step."""
    first = _read_rows(stage_dir(run_dir))
    rows = _read_rows(run_dir)
    if not first or not rows:
        return first or rows
    done = {key: max(float(r[key]) for r in first) for key in ("sequences", "elapsed_s")}
    return first + [{**r, "sequences": str(int(done["sequences"]) + int(r["sequences"])),
                     "elapsed_s": str(done["elapsed_s"] + float(r["elapsed_s"]))}
                    for r in rows]


def _seed_row(run_dir: Path, threshold: float) -> dict:
    """One seed's line of the report, from its ``metrics.csv`` and ``checkpoint.json``."""
    row = {"seed": None, "run_dir": str(run_dir), "complete": False, "converged": False,
           "converged_sequences": None, "converged_s": None, "collapsed": False,
           "rolled_back": 0, "diverged": False, "nan_steps": 0, "final_bit_errors": None}
    name = run_dir.name
    if name.startswith("seed-") and name[5:].lstrip("-").isdigit():
        row["seed"] = int(name[5:])
    try:
        record = json.loads(read_own(run_dir / CHECKPOINT_JSON, MAX_RECORD_BYTES,
                                     CHECKPOINT_JSON))
    except (OSError, ValueError, CheckpointError):  # not started, or failed before its first
        record = {}  # checkpoint
    config = record.get("config", {})
    row["seed"] = config.get("seed", row["seed"])
    row["nan_steps"] = int(record.get("extra", {}).get("nan_steps", 0))
    evaluation = config.get("evaluation", config)  # nested, or flat as earlier versions wrote
    row["complete"] = bool(record) and _finished(
        record.get("sequences", 0), config.get("max_sequences", 0),
        record.get("extra", {}).get("streak", 0), evaluation.get("stop_bit_errors", -1),
        evaluation.get("patience_evals", 1))
    rows = _timeline(run_dir)
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
        threshold: validation bit errors per sequence at or below which a seed has converged:
            the preset's ``stop_bit_errors``. Below 0 (a preset that trains a fixed budget, such
            as n-grams') a seed's row counts 0 bit errors as converged, and the goal is not
            judged (``goal_met`` None): the task's criterion judges those runs
            (`torch_ntm.criteria`, ``ntm sweep --criterion``).

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
        ``goal_met`` (None: not judged).
    """
    judged = threshold >= 0
    threshold = max(threshold, 0.0)
    rows = [_seed_row(Path(d), threshold) for d in run_dirs]
    times = [r["converged_s"] for r in rows if r["converged"]]
    seqs = [r["converged_sequences"] for r in rows if r["converged"]]
    median_s = statistics.median(times) if times else None
    ratio = max(times) / median_s if times and median_s > 0 else None
    num_converged = len(times)
    num_collapsed = sum(r["collapsed"] for r in rows)
    num_diverged = sum(r["diverged"] for r in rows)
    total_nan = sum(r["nan_steps"] for r in rows)
    goal = None if not judged else (
        bool(rows) and num_converged == len(rows) and num_collapsed == 0
        and num_diverged == 0 and total_nan == 0 and (ratio is None or ratio <= GOAL_TIME_RATIO))
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


def _goal(summary: dict) -> str:
    return {True: "met", False: "not met", None: "not judged"}[summary["goal_met"]]


def format_report(summary: dict, title: str | None = None) -> str:
    """`summarise`'s dictionary as Markdown: a table with one row per seed, then the summary
    (and the goal, where `summarise` judged it)."""
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
        f"no NaN): {_goal(summary)}" if summary["goal_met"] is not None else
        "- goal: not judged here: the preset trains a fixed budget rather than to 0 bit errors; "
        "the task's criterion (--criterion) judges each seed",
    ]
    return "\n".join(lines)


def format_grid_report(report: dict) -> str:
    """`run_sweep`'s report of a grid as Markdown: a table with one row per grid point, then
    each point's `format_report` under its name."""
    lines = [f"# {report['title']}", "",
             "| grid point | converged | median time (s) | median sequences | slowest / median "
             "| collapsed | rolled back | diverged | NaN steps | goal |",
             "|:---|:---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for p in report["points"]:
        converged = f"{p['num_converged']}/{p['num_seeds']}"
        if not all(r["complete"] for r in p["seeds"]):
            converged += " (incomplete)"
        median_s, median_seq = p["median_converged_s"], p["median_converged_sequences"]
        ratio = p["max_over_median_s"]
        lines.append(
            f"| {p['point']} | {converged} | {'-' if median_s is None else f'{median_s:.1f}'} "
            f"| {'-' if median_seq is None else f'{median_seq:,.0f}'} "
            f"| {'-' if ratio is None else f'{ratio:.2f}'} | {p['num_collapsed']} "
            f"| {p['total_rolled_back']} | {p['num_diverged']} | {p['total_nan_steps']} "
            f"| {_goal(p)} |")
    for p in report["points"]:
        lines += ["", f"## {p['point']}", "", format_report(p)]
    return "\n".join(lines)
