"""What a GPU machine is checked with (run by scripts/gpu_check.sh; needs Python with torch only):
the graphs engine against the eager loop on CUDA (values, final state and gradients, NTM and MANN,
float64 and float32) and its first-use time per bucket; a MANN training loop's episodes per second
on the default engine against eager. Prints one line per check and a JSON record per figure
(lines starting ``RESULT``) that gpu_check.sh gathers into its summary table.

    PYTHONPATH=src python scripts/gpu_check.py [--part checks|mann]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from torch_ntm import MANN, NTM


def _result(**record) -> None:
    print("RESULT " + json.dumps(record), flush=True)


def _run(model, x):
    model.zero_grad(set_to_none=True)
    y, state = model(x)
    loss = y.square().sum() + sum(t.sin().sum() for t in pytree.tree_leaves(state)
                                  if t.is_floating_point())
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return [y.detach(), *(t.detach() for t in pytree.tree_leaves(state)), *grads]


def _max_difference(a, b) -> float:
    return max(float((u.double() - v.double()).abs().max() / (v.double().abs().max() + 1e-30))
               for u, v in zip(a, b))


def checks() -> bool:
    """The graphs engine (the default on CUDA) against eager, per model and dtype, at lengths in
    two buckets; the first call of each bucket (its capture) timed."""
    ok = True
    device = torch.device("cuda")
    for name, make in (("NTM", lambda: NTM(9, 8, read_heads=2, write_heads=2)),
                       ("MANN", lambda: MANN(405, 5))):
        for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
            torch.manual_seed(0)
            model = make().to(device, dtype)
            for T in (41, 45, 20):  # buckets 48, 48, 24
                x = torch.randn(T, 16, model.input_size, device=device, dtype=dtype)
                model.engine = "auto"
                runs_on = model.runs_on(x)
                torch.cuda.synchronize()
                start = time.perf_counter()
                got = _run(model, x)
                torch.cuda.synchronize()
                first = time.perf_counter() - start
                model.engine = "eager"
                expected = _run(model, x)
                diff = _max_difference(got, expected)
                passed = runs_on == "graphs" and diff < tol
                ok &= passed
                print(f"{'ok  ' if passed else 'FAIL'} {name} {str(dtype)[6:]} T={T}: runs on "
                      f"{runs_on}, largest relative difference to eager {diff:.2e} (< {tol}), "
                      f"first call {first:.2f} s", flush=True)
                _result(check=f"{name} {str(dtype)[6:]} T={T}", passed=passed, diff=diff,
                        first_call_s=first)
    return ok


def mann(seconds: float = 20.0, batch: int = 16) -> None:
    """A user's loop around ``MANN(405, 5)`` (random 50-step episodes, cross-entropy, Adam) on the
    default engine and on eager: episodes per second, median of timed blocks."""
    device = torch.device("cuda")
    for engine in ("auto", "eager"):
        torch.manual_seed(0)
        model = MANN(405, 5, engine=engine).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.rand(50, batch, 405, device=device)
        y = torch.randint(0, 5, (50, batch), device=device)

        def step():
            optimizer.zero_grad(set_to_none=True)
            logits, _ = model(x)
            F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
            optimizer.step()

        for _ in range(3):
            step()
        rates, end = [], time.perf_counter() + seconds / 2
        while time.perf_counter() < end:
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(10):
                step()
            torch.cuda.synchronize()
            rates.append(10 * batch / (time.perf_counter() - start))
        rate = statistics.median(rates)
        print(f"MANN(405, 5) engine={engine!r} ({model.runs_on(x)}), batch {batch}: {rate:.0f} "
              f"episodes/s", flush=True)
        _result(mann_engine=engine, runs_on=model.runs_on(x), episodes_per_s=rate, batch=batch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("checks", "mann"), default="checks")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    if args.part == "checks":
        return 0 if checks() else 1
    mann()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
