"""Train NTMs with a user's plain loop, several seeds, and report converged / collapsed / NaN.

The loop is the README's (its "Training in your own loop"): Adam at the task preset's rate,
`SpikeClip` (the gradient norm clipped at 1 and at 2x the median of the last 100 steps), batches
of 16, one thread; no rollback, no learning-rate decay, no early stop. ``--clip-norm 10
--clip-spikes 0`` is the loop that fell apart (docs/stability.md). A seed *converges* at its first
validation without a wrong bit; it then trains on to ``--factor`` times the sequences that took,
and *collapses* if a later validation has more than ``--collapse-bits`` wrong bits per sequence.
Every ``--log-every`` steps it also records the quantities of `torch_ntm.diagnostics` (gradient
norms per group, update size, largest beta and gamma, weighting entropy, memory row norms), so a
collapse can be looked at in the act.

    python scripts/plain_loop.py copy --seeds 0-9 --out docs/sweeps/plain-copy
    python scripts/plain_loop.py associative_recall --seeds 0-4 --eval-every 200 \
        --max-sequences 1200000 --out docs/sweeps/plain-recall
    python scripts/plain_loop.py copy --seeds 0-4 --clip-norm 10 --clip-spikes 0 \
        --model-set max_gamma=3 --out /tmp/ablate

Writes ``OUT/seed-S.csv`` per seed and ``OUT/report.json`` and ``OUT/report.md`` for all.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import time
from pathlib import Path

import torch

from torch_ntm import NTM
from torch_ntm.diagnostics import gradient_norms, head_statistics
from torch_ntm.evaluate import evaluate_batches, fixed_batches
from torch_ntm.metrics import masked_bce
from torch_ntm.presets import resolve_config
from torch_ntm.stability import SpikeClip
from torch_ntm.tasks import make_task


def seeds_arg(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def model_kwargs(task_name: str, overrides: list[str]) -> dict:
    """The task's ntm-lstm preset architecture, then ``key=value`` overrides (Python literals)."""
    kwargs = dataclasses.asdict(resolve_config(task_name, "ntm-lstm").model_params)
    for item in overrides:
        key, _, value = item.partition("=")
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    return kwargs


def write_rows(path: Path, fields: list[str], rows: list[dict]) -> None:
    keys = fields + sorted({k for r in rows for k in r} - set(fields))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, keys)
        writer.writeheader()
        writer.writerows(rows)


def run_seed(args, seed: int, out: Path) -> dict:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    task = make_task(args.task)
    model = NTM(task.input_size, task.output_size, engine=args.engine,
                **model_kwargs(args.task, args.model_set))
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=args.lr, eps=args.adam_eps)
    val = fixed_batches(task, 256, 64)
    clip = (SpikeClip(params, factor=args.clip_spikes, max_norm=args.clip_norm)
            if args.clip_spikes else None)
    fields = ["step", "sequences", "elapsed_s", "split", "cost_bits", "bit_errors", "grad_norm",
              "update_ratio", "update_max"]
    rows, start = [], time.perf_counter()
    converged_at = None
    nan = False
    step = 0
    norms: list[float] = []
    budget = args.max_sequences
    while step * args.batch_size < budget:
        inputs, targets, mask = task.sample(args.batch_size, gen)
        logits, _ = model(inputs)
        loss = masked_bce(logits, targets, mask).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        fine = args.fine[0] <= (step + 1) * args.batch_size <= args.fine[1]
        log = (step + 1) % args.log_every == 0 or fine
        if log:
            groups = gradient_norms(model)
            before = [p.detach().clone() for p in params]
        norm = clip() if clip is not None else torch.nn.utils.clip_grad_norm_(params,
                                                                              args.clip_norm)
        if args.dump_spikes and converged_at is not None and len(norms) >= 50 and (
                float(norm) > args.dump_spikes * sorted(norms)[len(norms) // 2]):
            weights = {k: v.clone() for k, v in model.state_dict().items()}  # before the step
            torch.save({"model": weights, "batch": (inputs, targets, mask), "step": step,
                        "norm": float(norm)}, out / f"spike-{seed}-{step}.pt")
        norms = (norms + [float(norm)])[-50:]
        opt.step()
        step += 1
        seqs = step * args.batch_size
        if not math.isfinite(float(loss.detach())) or not math.isfinite(float(norm)):
            nan = True
        if log:
            delta = torch.cat([(p.detach() - b).flatten() for p, b in zip(params, before)])
            weight = torch.cat([b.flatten() for b in before])
            row = {"step": step, "sequences": seqs, "elapsed_s": time.perf_counter() - start,
                   "split": "train", "cost_bits": float(loss.detach()) / math.log(2),
                   "grad_norm": float(norm),
                   "update_ratio": float(delta.norm() / weight.norm()),
                   "update_max": float(delta.abs().max()),
                   **{f"grad_{k}": v for k, v in groups.items()},
                   **head_statistics(model, inputs[:, : args.diag_sequences])}
            rows.append(row)
        if step % args.eval_every == 0 or nan:
            m = evaluate_batches(model, val)
            rows.append({"step": step, "sequences": seqs,
                         "elapsed_s": time.perf_counter() - start, "split": "val",
                         "cost_bits": m["cost_bits"], "bit_errors": m["bit_errors"]})
            err = m["bit_errors"]
            if not math.isfinite(err) or not math.isfinite(m["cost_bits"]):
                nan = True
            if converged_at is None and err == 0:
                converged_at = seqs
                budget = min(args.max_sequences, args.factor * seqs)
            write_rows(out / f"seed-{seed}.csv", fields, rows)  # so far, to watch it live
            if args.verbose:
                print(f"seed {seed} seq {seqs} val bits {m['cost_bits']:.3f} err {err:.3f}",
                      flush=True)
        if nan:
            break
    write_rows(out / f"seed-{seed}.csv", fields, rows)
    return seed_result(seed, [r for r in rows if r["split"] == "val"], args)


def seed_result(seed: int, val_rows: list[dict], args) -> dict:
    """A seed's line of the report from its validation rows: *converged* at the first without a
    wrong bit, *collapsed* if a later one has more than ``--collapse-bits``, *nan* if one is not
    finite, and *stopped* if the rows end before the budget (a run cut short, or a partial
    CSV read by ``--report-only``)."""
    converged_at, worst_after, budget = None, 0.0, args.max_sequences
    for row in val_rows:
        seqs, err = int(row["sequences"]), float(row["bit_errors"])
        if not math.isfinite(err) or not math.isfinite(float(row["cost_bits"])):
            worst_after = math.inf
            break
        if converged_at is None and err == 0:
            converged_at, budget = seqs, min(args.max_sequences, args.factor * seqs)
        elif converged_at is not None:
            worst_after = max(worst_after, err)
    last = val_rows[-1]
    trained = int(last["sequences"])
    status = ("nan" if worst_after == math.inf else "collapsed"
              if worst_after > args.collapse_bits else "stopped" if trained < budget
              else "not converged" if converged_at is None else "converged")
    return {"seed": seed, "status": status, "converged_at": converged_at, "sequences": trained,
            "worst_bit_errors_after": worst_after, "final_bit_errors": float(last["bit_errors"]),
            "elapsed_s": float(last["elapsed_s"])}


def read_val_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if r["split"] == "val"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("task")
    p.add_argument("--seeds", type=seeds_arg, default=[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--lr", type=float, default=None, help="default: the task preset's")
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument("--clip-norm", type=float, default=1.0)
    p.add_argument("--clip-spikes", type=float, default=2.0, metavar="FACTOR",
                   help="clip at FACTOR times the median recent norm too (SpikeClip)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--engine", default="auto")
    p.add_argument("--model-set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--fine", type=lambda t: tuple(int(v) for v in t.split(":")), default=(0, -1),
                   metavar="FROM:TO", help="also log every step between these sequence counts")
    p.add_argument("--cosine-eps", type=float, default=None,
                   help="ablation: replace torch_ntm.functional.EPS (added to squared norms)")
    p.add_argument("--dump-spikes", type=float, default=0.0, metavar="FACTOR",
                   help="after converging, save weights and batch of every step whose gradient "
                   "norm exceeds FACTOR times the median of the last 50 (for analysis)")
    p.add_argument("--diag-sequences", type=int, default=4)
    p.add_argument("--factor", type=float, default=3.0)
    p.add_argument("--collapse-bits", type=float, default=1.0)
    p.add_argument("--max-sequences", type=int, default=200_000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: report the seeds from OUT/**/seed-S.csv")
    args = p.parse_args()
    if args.lr is None:
        args.lr = resolve_config(args.task, "ntm-lstm").optim.lr
    torch.set_num_threads(args.threads)
    if args.cosine_eps is not None:  # ablation: the cosine similarity's epsilon
        import torch_ntm.functional

        if args.engine != "eager":
            p.error("--cosine-eps needs --engine eager: the native kernels' epsilon is compiled in")
        torch_ntm.functional.EPS = args.cosine_eps
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in args.seeds:
        if args.report_only:  # seeds run apart (e.g. one per core), or one cut short
            csv_path = next(args.out.glob(f"**/seed-{seed}.csv"))
            results.append(seed_result(seed, read_val_rows(csv_path), args))
        else:
            results.append(run_seed(args, seed, args.out))
        print(json.dumps(results[-1]), flush=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (args.out / "report.json").write_text(json.dumps({"settings": settings, "seeds": results},
                                                     indent=2) + "\n")
    lines = ["| seed | status | converged at (sequences) | trained to | worst bit errors after "
             "| final bit errors |", "|---:|---|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['seed']} | {r['status']} | {r['converged_at'] or '-'} | "
                     f"{r['sequences']} | {r['worst_bit_errors_after']:.3g} | "
                     f"{r['final_bit_errors']:.3g} |")
    counts = {s: sum(r["status"] == s for r in results)
              for s in ("converged", "collapsed", "nan", "not converged", "stopped")}
    lines.append("")
    lines.append(", ".join(f"{k}: {v}" for k, v in counts.items()))
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
