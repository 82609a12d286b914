"""The ``ntm`` command line: train, evaluate, plot, pretrained models, seed sweeps, benchmarks.

User mistakes (unknown options or config keys, bad values, unusable checkpoints) end in one line
``ntm: error: ...`` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _integers(text: str) -> list[int]:
    """Comma-separated integers, or the usage error that says so."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def _int_list(text: str) -> list[int]:
    values = _integers(text)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _seed_list(text: str) -> list[int]:
    values = _integers(text)
    if (not values or min(values) < 0 or max(values) >= 2**64
            or len(set(values)) < len(values)):  # torch's seeds end at 2**64 - 1
        raise argparse.ArgumentTypeError(f"expected distinct seeds from 0 to 2**64 - 1, got "
                                         f"{text!r}")
    return values


def _seed_range(text: str) -> tuple[int, int]:
    """``--seeds K`` (K seeds from ``--first-seed``) or ``A-B`` (seeds A to B): ``(first or
    None, count)``."""
    first, dash, last = text.partition("-")
    try:
        if dash:
            a, b = int(first), int(last)
            if 0 <= a <= b:
                return a, b - a + 1
        else:  # a count; one below 1 is refused with the sweep's other limits
            return None, int(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected a number of seeds >= 1 or a range A-B of seeds "
                                     f"(0 <= A <= B), got {text!r}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _engine_list(text: str) -> list[str]:
    from torch_ntm.model import ENGINES

    values = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in values if v not in ENGINES]
    if not values or unknown:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated engines from {', '.join(ENGINES)}, got {text!r}")
    return list(dict.fromkeys(values))  # each once: a repeat measured the same twice


def _parser() -> argparse.ArgumentParser:
    from torch_ntm.sweep import RAY_INSTALL
    from torch_ntm.tasks import TASKS

    parser = argparse.ArgumentParser(
        prog="ntm", description="Neural Turing Machines: train, evaluate, plot, benchmark.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser.commands = sub.choices  # each command's parser, by name

    p = sub.add_parser("train", help="train a model on a task")
    p.add_argument("task", choices=sorted(TASKS), metavar="TASK",
                   help=f"one of: {', '.join(sorted(TASKS))}")
    p.add_argument("--preset", default=None,
                   help="ntm-lstm (default), ntm-lstm-paper (repeat_copy's and priority_sort's "
                   "default), ntm-ff, lstm; omniglot: mann (default), mann-ntm, lstm; traversal, "
                   "shortest_path: dnc (default), ntm, lstm")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (repeatable); task.KEY for task parameters")
    p.add_argument("--out", default=None,
                   help="run directory (default runs/TASK); must be new or empty")
    p.add_argument("--overwrite", action="store_true",
                   help="train into --out even if it holds files (a run's own are replaced)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--resume", type=Path, default=None, metavar="DIR",
                   help="continue the run in DIR exactly where its checkpoint left off")
    p.add_argument("--no-plots", action="store_true", help="skip figures after training")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("evaluate", help="evaluate a run or checkpoint at several sizes "
                       "(omniglot: accuracy by instance on held-out episodes)")
    p.add_argument("checkpoint", type=Path, nargs="?", metavar="RUN_OR_CHECKPOINT")
    p.add_argument("--pretrained", default=None, metavar="NAME",
                   help="a shipped model instead of a run (see: ntm pretrained list)")
    p.add_argument("--lengths", type=_int_list, default=None, metavar="L1,L2,...",
                   help="task sizes (copy: sequence lengths; recall: items); default per task")
    p.add_argument("--memory-size", type=_positive_int, default=None, metavar="N",
                   help="rebuild the NTM with N memory rows (weights unchanged); default: "
                   "the run's eval_memory_size, else its memory_size")
    p.add_argument("--sequences", type=int, default=None,
                   help="sequences per size (100); omniglot: held-out episodes (1000)")
    p.add_argument("--repeats", type=_int_list, default=None, metavar="R1,R2,...",
                   help="repeat_copy: a row for every length and every one of these numbers of "
                   "repeats (data bit errors and end-marker failures apart)")
    p.add_argument("--task-set", dest="task_overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="change a task parameter for the evaluation, e.g. "
                   "--task-set min_repeats=20 --task-set max_repeats=20 (repeatable)")
    p.add_argument("--seeds", type=_seed_list, default=None, metavar="S1,S2,...",
                   help="draw the held-out data from each of these seeds (default 2014): one "
                   "set per seed, each scored alone; with several, their mean and range too (the "
                   "table's, by size; omniglot's --json too)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser("plot", help="write figures of a run or checkpoint")
    p.add_argument("checkpoint", type=Path, nargs="?", metavar="RUN_OR_CHECKPOINT")
    p.add_argument("--pretrained", default=None, metavar="NAME",
                   help="a shipped model instead of a run (see: ntm pretrained list)")
    p.add_argument("--length", type=int, default=None, help="task size of the example sequence")
    p.add_argument("--memory-size", type=_positive_int, default=None, metavar="N")
    p.add_argument("--out", type=Path, default=None,
                   help="folder (default RUN/figures, or ./figures-NAME for --pretrained)")

    p = sub.add_parser("curves", help="learning curves of several runs on the same axes")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN")
    p.add_argument("--labels", default=None, metavar="A,B,...",
                   help="one label per run (default: each run's task, preset and seed)")
    p.add_argument("--split", choices=("val", "train"), default="val")
    p.add_argument("--out", type=Path, default=Path("learning_curves.png"), metavar="FILE.png")

    p = sub.add_parser("pretrained", help="list the shipped models, or add one from a run")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    p.commands = actions.choices  # each action's parser, for its own usage on an unknown option
    actions.add_parser("list", help="the shipped models and their validation bit errors")
    q = actions.add_parser("export", help="copy a run's weights into the package as NAME")
    q.add_argument("run", type=Path, metavar="RUN_OR_CHECKPOINT")
    q.add_argument("name", metavar="NAME")
    q.add_argument("--dest", type=Path, default=None, metavar="DIR",
                   help="write DIR/NAME instead of into the installed package")
    q.add_argument("--overwrite", action="store_true",
                   help="replace a shipped model, or a folder that holds a run or other files "
                   "(an earlier export in --dest is replaced without it)")

    p = sub.add_parser("sweep", help="train one task with several seeds and report reliability")
    p.add_argument("task", metavar="TASK", help=f"one of: {', '.join(sorted(TASKS))}")
    p.add_argument("--seeds", type=_seed_range, default=None, metavar="K|A-B",
                   help="number of seeds (10), or the seeds A to B")
    p.add_argument("--first-seed", type=int, default=None, metavar="S", help="first seed (0)")
    p.add_argument("--criterion", action="store_true",
                   help="train each seed as `ntm train TASK --seed S` does (the preset's stop "
                   "rule and budget), then score it on the task's paper-level criterion "
                   "(torch_ntm.criteria: three fresh sets of 1,000) and print the table")
    p.add_argument("--jobs", type=int, default=None, metavar="J",
                   help="trainings at once (2; with --ray, as many as the cluster has CPUs)")
    p.add_argument("--preset", default=None, help="as for train (default: the task's own)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (repeatable), as for train")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="train every seed with each value of a config key (repeatable: every "
                   "combination), into OUT/KEY=V/seed-S; V1;V2 for list values")
    p.add_argument("--sequences", type=int, default=None, metavar="N",
                   help="training sequences per seed, past convergence (default 50,000; "
                   "with --criterion, the budget within the preset's stop rule, default the "
                   "preset's)")
    p.add_argument("--out", type=Path, default=None, help="folder (default runs/sweep-TASK)")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="start each training by a Ray task (one CPU each) on a new local Ray "
                   "instance, or on the cluster at ADDRESS (auto: the one on this machine); "
                   f"needs {RAY_INSTALL}")
    p.add_argument("--gpus-per-run", type=float, default=0.0, metavar="G",
                   help="with --ray: GPUs per training (0.25: four share one), on device=cuda")

    p = sub.add_parser("bench", help="training and inference throughput of each engine")
    p.add_argument("--model", choices=("ntm", "mann", "dnc"), default="ntm",
                   help="the model measured on copy batches, at its defaults but the memory "
                   "rows (default ntm: the paper's copy NTM)")
    p.add_argument("--engines", type=_engine_list, default=None, metavar="E1,E2,...",
                   help="engines to measure (default auto,eager: what a model runs by default, "
                   "and the plain loop)")
    p.add_argument("--batch-size", type=_int_list, default=None, metavar="B1,B2,...")
    p.add_argument("--seq-len", type=int, default=20)
    p.add_argument("--memory-size", type=_int_list, default=None, metavar="N1,N2,...")
    p.add_argument("--steps", type=int, default=None, help="timed training steps per config")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: as fast as 2 at batch <= 16 on 2 "
                   "cores, and unaffected by other busy processes)")
    p.add_argument("--json", action="store_true")
    return parser


def _cmd_train(args) -> int:
    import contextlib

    from torch_ntm.checkpoint import clear_run, load_checkpoint, lock_run
    from torch_ntm.config import ConfigError, check_resume, resolve_device
    from torch_ntm.engines import prepare
    from torch_ntm.factories import build_model, build_task
    from torch_ntm.overrides import apply_overrides
    from torch_ntm.presets import resolve_config
    from torch_ntm.train import (
        check_finetune,
        is_main_process,
        load_initial_weights,
        starting_config,
    )

    main_process = is_main_process()  # under torchrun, rank 0 writes
    saved = None  # a resumed run's own config
    if args.resume is not None:
        given = [f"--{name}" for name in ("out", "seed", "preset", "overwrite")
                 if getattr(args, name) not in (None, False)]
        if given:
            raise ConfigError(f"{', '.join(given)} cannot be given with --resume: the run "
                              f"continues in its own directory with its own settings")
        saved = starting_config(args.resume)  # a run still training its starts
        if saved is None:
            ckpt = load_checkpoint(args.resume)
            args.resume = ckpt.path.parent  # RUN/checkpoint.json, as evaluate takes it: the run
            saved = ckpt.config
        if saved.task != args.task:
            raise ConfigError(f"{args.resume} is a {saved.task!r} run, not {args.task!r}")
        config = apply_overrides(saved, args.overrides)
        check_resume(saved, config)
        run_dir = args.resume
    else:
        config = resolve_config(args.task, args.preset, args.overrides, args.seed)
        # A config that cannot train, or weights that do not fit it, fail here.
        load_initial_weights(config, build_model(config, build_task(config)))
        check_finetune(config)
        run_dir = Path(args.out or _default_run_dir(args.task))
        if main_process:  # the other ranks would see its files appear
            run_dir = _new_run_dir(args.out, args.task, args.overwrite)
    if resolve_device(config.device).type == "cpu":  # before a run directory exists for it
        prepare(config.model)  # the native kernels' first build overlaps with what follows
    # Everything is checked: from here on this process owns the run directory.
    stack = contextlib.ExitStack()
    if main_process:
        stack.enter_context(lock_run(run_dir))
        if args.overwrite:
            clear_run(run_dir)
        print(f"run directory: {run_dir}")
        print(_config_line(config, saved, run_dir))
    with stack:
        return _train_and_report(args, config, run_dir, main_process)


def _config_line(config, saved, run_dir: Path) -> str:
    """What a training says of its config: the whole of a new run's; of a resumed run, where its
    own is and what ``--set`` changed in it (the run's settings, printed when it started, are in
    its config.json)."""
    from torch_ntm.config import differing_keys

    if saved is None:
        return f"config: {config.to_json()}"
    changed = ", ".join(f"{key}={config.value(key)!r} (was {saved.value(key)!r})"
                        for key in differing_keys(saved, config))
    return f"config: the run's own ({run_dir / 'config.json'})" + (
        f", with {changed}" if changed else "")


def _default_run_dir(task: str) -> Path:
    """Where ``ntm train TASK`` writes without ``--out``."""
    return Path("runs") / task


def _new_run_dir(out: str | None, task: str, overwrite: bool) -> Path:
    """The directory for a new run, refused (`ConfigError`) unless it is new or empty, or
    ``overwrite`` is given; the current directory and the empty name are always refused."""
    from torch_ntm.checkpoint import CHECKPOINT_JSON, LOCK, foreign_files
    from torch_ntm.config import ConfigError

    if out is not None and not out.strip():
        raise ConfigError("--out is empty; name the run directory (default runs/TASK)")
    run_dir = Path(out) if out is not None else _default_run_dir(task)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--out {run_dir}: exists and is not a directory")
    here = Path.cwd().resolve()
    if run_dir.is_dir() and run_dir.resolve() in (here, *here.parents):
        raise ConfigError(f"--out {out}: is the current directory or holds it; name a directory "
                          f"for the run (default runs/{task})")
    foreign = foreign_files(run_dir) if overwrite and run_dir.is_dir() else []
    if foreign:  # --overwrite removes a run's own files only
        raise ConfigError(f"--out {run_dir}: --overwrite replaces only a run's own files, and "
                          f"{', '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} not (a "
                          f"link, or not what a run writes there); move "
                          f"{'it' if len(foreign) == 1 else 'them'} away or choose another "
                          f"directory")
    if not overwrite and run_dir.is_dir():
        if (run_dir / CHECKPOINT_JSON).exists():
            raise ConfigError(f"--out {run_dir}: already holds a run; continue it with --resume "
                              f"{run_dir}, or replace it with --overwrite")
        held = sorted(p.name for p in run_dir.iterdir() if p.name != LOCK)
        if held:
            listed = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
            stopped = ("; it holds a run stopped before its first checkpoint, which "
                       "--overwrite starts again" if "config.json" in held else "")
            raise ConfigError(f"--out {run_dir}: is not empty (holds {listed}); choose a new "
                              f"directory, or pass --overwrite to train into it{stopped}")
    return run_dir


def _metrics_line(metrics: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())


def _train_and_report(args, config, run_dir: Path, main_process: bool) -> int:
    from torch_ntm.checkpoint import load_checkpoint, stage_dir, start_dir
    from torch_ntm.overrides import override_keys
    from torch_ntm.train import start_config, train

    started = time.perf_counter()
    # A rate given on resume replaces the run's current one, even the value it started with.
    new_lr = args.resume is not None and "lr" in override_keys(args.overrides)
    result = train(config, run_dir, resume=args.resume is not None,
                   progress=False if args.no_progress else None, new_lr=new_lr)
    if not main_process:
        return 0
    wall = time.perf_counter() - started
    if not result.trained:
        if result.converged:
            why = (f"it has converged (stop_bit_errors={config.evaluation.stop_bit_errors}, "
                   f"patience_evals={config.evaluation.patience_evals})")
            more = "--set stop_bit_errors=-1 (or a larger patience_evals)"
        else:
            why = (f"its budget is spent (max_sequences={config.max_sequences}, "
                   f"max_seconds={config.max_seconds})")
            more = "a larger --set max_sequences (or max_seconds)"
        print(f"nothing to train: {why}, at {result.sequences} sequences; {run_dir} is left as "
              f"it was. To train on, resume with {more}, or start a new run from its weights "
              f"with --set init_from={run_dir} --out NEW_DIR (and its --preset and model "
              f"settings: {run_dir / 'config.json'})")
    else:
        status = "converged" if result.converged else "stopped (budget)"
        print(f"{status} after {result.sequences} sequences, {result.step} steps, "
              f"{wall:.1f} s wall this session ({result.elapsed_s:.1f} s training in total)")
    if result.start is not None:
        print(f"went on from start {result.start} of {config.stabilise.starts} "
              f"({start_dir(run_dir, result.start)}, seed "
              f"{start_config(config, result.start).seed}): the best validation after "
              f"{config.stabilise.start_sequences} sequences each")
    if result.first_stage is not None:
        first = result.first_stage
        print(f"first stage: {stage_dir(run_dir)}, {first.sequences} sequences, "
              f"{first.elapsed_s:.1f} s training; the fine-tune (finetune={config.finetune!r}) "
              f"started from the weights it kept, and trained {result.elapsed_s:.1f} s")
    print("last validation: " + _metrics_line(result.metrics))
    ckpt = load_checkpoint(run_dir)
    kept = ckpt.best_metrics
    if kept is not None and kept != result.metrics:  # a later validation did worse
        print("kept weights (the best validation; below and in ntm evaluate): "
              + _metrics_line(kept))
    _print_generalisation(ckpt)
    if not args.no_plots and result.trained:  # an idle resume leaves the directory as it was
        from torch_ntm.plot import plot_run

        paths = plot_run(run_dir)
        print(f"figures: {', '.join(str(p) for p in paths)}")
    return 0


def _print_generalisation(ckpt) -> None:
    """The final table of `ntm train`: the kept weights of the run ``ckpt`` at the task's
    generalisation sizes (a label task: accuracy by instance on held-out episodes)."""
    from torch_ntm.evaluate import evaluate_episodes, evaluate_sizes, format_table

    task, model = ckpt.task(), ckpt.model(evaluation=True)
    if task.label_task:  # no sizes to generalise to: accuracy by instance
        _print_episodes(evaluate_episodes(model, task), task)
        return
    rows = evaluate_sizes(model, task, task.eval_sizes)
    rows_of = (ckpt.config.evaluation.eval_memory_size
               or getattr(ckpt.config.model_params, "memory_size", 0))
    print(f"generalisation ({task.size_name}, trained up to {task.train_size}; memory "
          f"{rows_of} rows):")
    print(format_table(rows))


# The instances (k-th occurrence of a class) that `ntm evaluate` and the end of `ntm train` print
# for a label task: Santoro et al.'s table 1.
PRINTED_INSTANCES = (1, 2, 3, 4, 5, 10)


def _split(task) -> str:
    return getattr(task.held_out(), "split", "held-out")


def _print_episodes(row: dict, task) -> None:
    """`evaluate_episodes`' row as a table: accuracy by instance (the paper's instances), then
    the cost and wrong labels."""
    from torch_ntm.evaluate import format_table

    accuracy = row["accuracy_by_instance"]
    table = [{"instance": k, "accuracy": accuracy[k]} for k in PRINTED_INSTANCES if k in accuracy]
    print(f"{row['sequences']} held-out episodes ({_split(task)} split):")
    print(format_table(table) + f"\ncost {row['cost_bits']:.4g} bits per episode, "
          f"{row['bit_errors']:.4g} wrong labels per episode, {row['perfect']:.4g} of episodes "
          f"without one")


def _checkpoint_arg(args) -> Path:
    """The checkpoint that RUN_OR_CHECKPOINT or ``--pretrained NAME`` names (exactly one)."""
    from torch_ntm import pretrained
    from torch_ntm.config import ConfigError

    if (args.checkpoint is None) == (args.pretrained is None):
        raise ConfigError(f"{args.command}: give either RUN_OR_CHECKPOINT or --pretrained NAME"
                          + (", not both" if args.checkpoint is not None else ""))
    if args.pretrained is not None:
        return pretrained.path(args.pretrained)
    return args.checkpoint


def _cmd_evaluate(args) -> int:
    from torch_ntm.checkpoint import load_checkpoint
    from torch_ntm.config import MAX_EVAL_STEPS, ConfigError, check_set_size, check_steps
    from torch_ntm.engines import prepare
    from torch_ntm.evaluate import EVAL_SEED, evaluate_sizes, format_table
    from torch_ntm.factories import build_task
    from torch_ntm.overrides import apply_overrides

    if args.sequences is not None and args.sequences < 1:
        raise ConfigError(f"--sequences must be >= 1, got {args.sequences}")
    ckpt = load_checkpoint(_checkpoint_arg(args))
    prepare(ckpt.config.model)  # the native kernels' first build overlaps with the set-up
    overrides = {} if args.memory_size is None else {"memory_size": args.memory_size}
    model = ckpt.model(evaluation=True, **overrides)  # the run's generalisation memory
    task = ckpt.task()
    if args.task_overrides:
        config = apply_overrides(ckpt.config, args.task_overrides, "--task-set", prefix="task.")
        changed = build_task(config)
        if (changed.input_size, changed.output_size) != (task.input_size, task.output_size):
            raise ConfigError("--task-set: the change alters the task's input or output width, "
                              "which the trained model cannot take")
        task = changed
    if task.label_task:
        return _evaluate_episodes(args, model, task)
    sizes = args.lengths or list(task.eval_sizes)
    for size in sizes:
        _check_size(task, size, "--lengths")
    if args.repeats is not None and not hasattr(task, "with_repeats"):
        raise ConfigError(f"--repeats applies to repeat_copy, not {task.name}")
    for repeats in args.repeats or [None]:
        for size in sizes:
            each, shown = task.with_size(size), ""
            if repeats is not None:
                each, shown = each.with_repeats(repeats), f" --repeats {repeats}"
            check_steps(each, size, f"--lengths {size}{shown}: a {task.name} sequence",
                        "choose shorter lengths" + (" or fewer repeats" if shown else ""),
                        MAX_EVAL_STEPS)
    num = args.sequences or 100
    for size in sizes:  # each size's sequences are drawn at once
        check_set_size(task.held_out().with_size(size), num, f"--lengths {size}", "--sequences ")
    rows = []
    for seed in args.seeds or [EVAL_SEED]:
        if args.repeats is None:
            each = evaluate_sizes(model, task, sizes, num_sequences=num, seed=seed)
        else:  # one row per (length, repeats), lengths first
            each = [{task.size_name: row.pop(task.size_name), "repeats": repeats, **row}
                    for repeats in args.repeats
                    for row in evaluate_sizes(model, task.with_repeats(repeats), sizes,
                                              num_sequences=num, seed=seed)]
            each.sort(key=lambda row: (row[task.size_name], row["repeats"]))
        # several seeds: a column naming each row's set, first
        rows += [{"seed": seed, **row} if args.seeds else row for row in each]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(format_table(rows))
    if args.seeds is not None and len(args.seeds) > 1:
        print(f"\nover the {len(args.seeds)} sets: the mean, min and max at each size")
        print(format_table(_size_summary(rows, task.size_name)))
    return 0


def _size_summary(rows: list[dict], size_name: str) -> list[dict]:
    """`ntm evaluate --seeds A,B,...` of a sequence task: for each size (and number of repeats)
    the mean, min and max of every score over the sets, as rows of a table."""
    from torch_ntm.evaluate import summarise_sets

    by = [k for k in (size_name, "repeats") if k in rows[0]]
    scores = [k for k in rows[0] if k not in ("seed", "sequences", *by)]
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in by), []).append(row)
    return [{**dict(zip(by, group)), "over sets": name, **values}
            for group, sets in groups.items()
            for name, values in summarise_sets(sets, scores).items()]


def _evaluate_episodes(args, model, task) -> int:
    """`ntm evaluate` of a label task (Omniglot): accuracy by instance on held-out episodes."""
    from torch_ntm.config import ConfigError, check_set_size
    from torch_ntm.evaluate import EVAL_SEED, HELD_OUT_EPISODES, evaluate_episodes

    if args.lengths is not None:
        raise ConfigError(f"--lengths does not apply to {task.name}: it is scored by accuracy at "
                          f"each instance of a class; change the episodes with --task-set "
                          f"instances=N")
    episodes = args.sequences or HELD_OUT_EPISODES
    check_set_size(task.held_out(), episodes, "the held-out episodes", "--sequences ")
    if args.seeds is not None and len(args.seeds) > 1:
        return _evaluate_episode_sets(args, model, task, episodes)
    (seed,) = args.seeds or [EVAL_SEED]
    row = evaluate_episodes(model, task, episodes, seed=seed)
    if args.json:
        accuracy = {str(k): v for k, v in row.pop("accuracy_by_instance").items()}
        print(json.dumps({"task": task.name, "split": _split(task),
                          "accuracy_by_instance": accuracy, **row}, indent=2))
    else:
        _print_episodes(row, task)
    return 0


def _evaluate_episode_sets(args, model, task, episodes: int) -> int:
    """`ntm evaluate --seeds A,B,...` of a label task: one set of held-out episodes per seed,
    each scored alone, then their mean and range (a model's level, not one favourable set)."""
    from torch_ntm.evaluate import evaluate_episodes, format_table, summarise_sets

    sets = []
    for seed in args.seeds:
        row = evaluate_episodes(model, task, episodes, seed=seed)
        accuracy = row.pop("accuracy_by_instance")
        sets.append({"seed": seed, **row, **{f"accuracy_{k}": v for k, v in accuracy.items()}})
    keys = [k for k in sets[0] if k not in ("seed", "sequences")]
    summary = summarise_sets(sets, keys)
    if args.json:
        print(json.dumps({"task": task.name, "split": _split(task), "episodes_per_set": episodes,
                          "sets": sets, **summary}, indent=2))
        return 0
    instances = [k for k in PRINTED_INSTANCES if f"accuracy_{k}" in sets[0]]
    columns = ["cost_bits", "bit_errors", *(f"accuracy_{k}" for k in instances)]
    names = {"cost_bits": "cost", "bit_errors": "wrong",
             **{f"accuracy_{k}": f"instance {k}" for k in instances}}
    table = [{"set": str(s["seed"]), **{names[c]: s[c] for c in columns}} for s in sets]
    table += [{"set": name, **{names[c]: row[c] for c in columns}}
              for name, row in summary.items()]
    print(f"{len(sets)} sets of {episodes} held-out episodes ({_split(task)} split), one per "
          f"seed; accuracy at each instance of a class, cost in bits and wrong labels per "
          f"episode:")
    print(format_table(table))
    return 0


def _check_size(task, size: int, option: str) -> None:
    """A `ConfigError` naming ``option`` if ``task`` has no sequences of ``size``."""
    from torch_ntm.config import ConfigError

    try:
        task.with_size(size)
    except ValueError as e:
        raise ConfigError(f"{option} {size}: no sequence of this task has {task.size_name} = "
                          f"{size} ({e})") from None


def _cmd_plot(args) -> int:
    from torch_ntm.config import ConfigError
    from torch_ntm.plot import plot_run

    if args.length is not None and args.length < 1:
        raise ConfigError(f"--length must be >= 1, got {args.length}")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out}: exists and is not a directory")
    checkpoint = _checkpoint_arg(args)
    if args.length is not None:
        from torch_ntm.checkpoint import load_checkpoint

        _check_size(load_checkpoint(checkpoint).task(), args.length, "--length")
    # A shipped model's figures go to figures-NAME, never into the installed package.
    paths = plot_run(checkpoint, out_dir=args.out, size=args.length,
                     memory_size=args.memory_size)
    for path in paths:
        print(path)
    return 0


def _cmd_curves(args) -> int:
    from torch_ntm.checkpoint import load_checkpoint
    from torch_ntm.config import ConfigError
    from torch_ntm.plot import plot_learning_curves

    if args.labels is None:
        labels = []
        for run in args.runs:
            config = load_checkpoint(run).config
            labels.append(f"{config.task} {config.preset} seed {config.seed}")
    else:
        labels = [label.strip() for label in args.labels.split(",")]
        if len(labels) != len(args.runs):
            raise ConfigError(f"--labels gives {len(labels)} labels for {len(args.runs)} runs")
    if len(set(labels)) != len(labels):
        raise ConfigError(f"labels must differ, got {', '.join(labels)}; pass --labels")
    if args.out.is_dir():
        raise ConfigError(f"--out {args.out}: is a directory; name the PNG file to write")
    from matplotlib.figure import Figure  # the formats matplotlib writes, by file suffix

    formats = Figure().canvas.get_supported_filetypes()
    if args.out.suffix.lower().lstrip(".") not in formats:
        raise ConfigError(f"--out {args.out}: not an image file matplotlib writes; end it in "
                          f"one of .{', .'.join(sorted(formats))} (e.g. curves.png)")
    print(plot_learning_curves(dict(zip(labels, args.runs)), args.out, split=args.split))
    return 0


def _cmd_pretrained(args) -> int:
    from torch_ntm import pretrained
    from torch_ntm.evaluate import format_table

    if args.action == "export":
        path = pretrained.export(args.run, args.name, dest=args.dest, overwrite=args.overwrite)
        print(f"exported {args.run} as {args.name!r}: {path}")
        return 0
    names = pretrained.names()
    if not names:
        print("no pretrained models are shipped with this torch-ntm")
        return 0
    rows = []
    for name in names:
        info = pretrained.info(name)
        rows.append({"name": name, "task": info["task"], "preset": info["preset"],
                     "sequences": info["sequences"],
                     "val_bit_errors": info["metrics"].get("bit_errors", float("nan"))})
    print(format_table(rows))
    return 0


def _cmd_sweep(args) -> int:
    from torch_ntm.config import ConfigError
    from torch_ntm.criteria import CRITERIA
    from torch_ntm.sweep import (
        DEFAULT_SEQUENCES,
        default_out,
        format_grid_report,
        format_report,
        run_sweep,
        seed_dir,
    )

    first, count = args.seeds or (None, 10)
    if first is not None and args.first_seed is not None:
        raise ConfigError("--seeds A-B names the first seed; drop --first-seed")
    first = first if first is not None else (args.first_seed or 0)
    if args.criterion and args.grid:
        raise ConfigError("--criterion: not with --grid (it scores the seeds of one "
                          "configuration)")
    if args.criterion and args.task not in CRITERIA:
        raise ConfigError(f"--criterion: no criterion for {args.task}; tasks with one: "
                          f"{', '.join(CRITERIA)}")
    try:
        report = run_sweep(args.task, count, jobs=args.jobs, preset=args.preset,
                           overrides=args.overrides, grid=args.grid, out=args.out,
                           first_seed=first, ray_address=args.ray,
                           gpus_per_run=args.gpus_per_run, as_trained=args.criterion,
                           sequences=DEFAULT_SEQUENCES if args.sequences is None
                           and not args.criterion else args.sequences)
    except (KeyboardInterrupt, SystemExit) as e:
        out = args.out or default_out(args.task)
        print(f"ntm: sweep interrupted; {out / 'report.md'} reports the seeds that finished; "
              f"run the same command to continue", file=sys.stderr)
        return e.code if isinstance(e, SystemExit) else 130
    points = report.get("points", [report])
    print(format_grid_report(report) if "points" in report else
          format_report(report, report["title"]))
    failed = [" ".join([*([p["point"]] if "point" in p else []), "seed", s])
              for p in points for s, code in p["exit_codes"].items() if code != 0]
    if failed:
        trained = sum(len(p["exit_codes"]) for p in points)
        print(f"ntm: {len(failed)} of {trained} trainings failed ({', '.join(failed)}); see "
              f"their train.log", file=sys.stderr)
        return 1
    if args.criterion:
        from torch_ntm.criteria import format_criteria

        out = args.out or default_out(args.task)
        print()
        print(format_criteria(args.task, {seed: seed_dir(out, seed)
                                          for seed in range(first, first + count)}))
    return 0


def _cmd_bench(args) -> int:
    from torch_ntm.bench import check_engines, check_memory_size, format_table, run_bench
    from torch_ntm.config import ConfigError, check_steps, resolve_device
    from torch_ntm.tasks import CopyTask

    for name, value in (("--threads", args.threads), ("--seq-len", args.seq_len),
                        ("--steps", args.steps)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    # it trains on them, as `ntm train` (its limit)
    check_steps(CopyTask().with_size(args.seq_len), args.seq_len,
                f"--seq-len {args.seq_len}: a copy sequence", "choose a shorter --seq-len")
    kwargs = {"seq_len": args.seq_len, "device": resolve_device(args.device),
              "threads": args.threads, "model": args.model}
    if args.batch_size:
        kwargs["batch_sizes"] = tuple(args.batch_size)
    if args.memory_size:
        for rows in args.memory_size:
            try:
                check_memory_size(rows, args.model)
            except ValueError as e:
                raise ConfigError(f"--memory-size {rows}: {e}") from None
        kwargs["memory_sizes"] = tuple(args.memory_size)
    if args.steps is not None:
        kwargs["steps"] = args.steps
    if args.engines:
        kwargs["engines"] = tuple(args.engines)
        try:
            check_engines(args.engines, kwargs["device"])
        except ValueError as e:
            raise ConfigError(f"--engines: {e}") from None
    records = run_bench(**kwargs)
    print(json.dumps(records, indent=2) if args.json else format_table(records))
    return 0


_COMMANDS = {"train": _cmd_train, "evaluate": _cmd_evaluate, "plot": _cmd_plot,
             "curves": _cmd_curves, "pretrained": _cmd_pretrained, "sweep": _cmd_sweep,
             "bench": _cmd_bench}


def main(argv: list[str] | None = None) -> int:
    from torch_ntm.checkpoint import CheckpointError
    from torch_ntm.config import ConfigError
    from torch_ntm.engines.library import keep_freed_memory
    from torch_ntm.train import Interrupted

    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown and argv.index(unknown[0]) < argv.index(args.command):  # `ntm --bogus train`
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if unknown:  # the command's own usage (its action's, for `pretrained`), not the top level's
        command = parser.commands[args.command]
        command = getattr(command, "commands", {}).get(getattr(args, "action", None), command)
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    keep_freed_memory()  # reuse freed step buffers instead of fresh pages (1.1-1.9x training)
    try:
        return _COMMANDS[args.command](args)
    except (ConfigError, CheckpointError) as e:
        print(f"ntm: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the machine's, not the user's: a full disk, a file size limit
        print(f"ntm: error: {_machine_error(e)}", file=sys.stderr)
        return 1
    except Interrupted as e:
        print(f"ntm: interrupted at step {e.step}; checkpoint saved, resume with --resume "
              f"{e.run_dir}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("ntm: interrupted", file=sys.stderr)
        return 130


# What to do about the machine's errors a run meets (errno -> the fix)
_MACHINE_FIXES = {
    errno.EFBIG: "the file size limit (ulimit -f) is below what the run writes: raise it",
    errno.EACCES: "no permission to write there: write the run elsewhere (--out)",
    errno.ENOSPC: "the disk is full: free space, or write the run elsewhere (--out)",
    errno.EDQUOT: "the disk quota is used up: free space, or write the run elsewhere (--out)",
}


def _machine_error(e: OSError) -> str:
    """One line for an OSError: the file (when known), what failed, and the fix."""
    where = f"{e.filename}: " if e.filename else ""
    fix = _MACHINE_FIXES.get(e.errno)
    return f"{where}{e.strerror or e}" + (f" ({fix})" if fix else "")


def console() -> None:
    """The ``ntm`` program (and ``python -m torch_ntm``): `main`, then exit with its status.

    Before exiting it freezes the garbage collector's objects: the interpreter's final collections
    would otherwise walk every object torch, matplotlib and TensorBoard made (~350,000 after a
    training), about 1 s of `ntm train copy`'s ~25 s. Every file the program writes is closed by
    then; nothing is left to those collections."""
    import gc

    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    console()
