"""What a GPU machine is checked with (run by scripts/gpu_check.sh; needs Python with torch only).

``--part checks``: every model on the graphs engine (the default on CUDA) against the eager loop,
float64 and float32, from the initial state and from a state passed in: that it captured, that
``runs_on`` says so before and after, the largest difference (values, final state, gradients)
and the first call's time (the capture); a capture with an eager pass's graph still alive (a
kept ``loss``) and a fused optimizer; four forced capture failures (a sync and a raise, twice),
after each of which the RNG must give the numbers it would have given, ``nn.init`` must work, no
memory may stay allocated (torch's cached cuBLAS workspaces aside, whose bytes are printed too),
the reason must be the failure's own and ``runs_on`` must say "eager".

``--part rates``: training sequences (episodes) per second of a user's loop (copy batches of
length 20, or 50-step episodes for the MANN; loss, backward, clipping, an RMSProp step) on the
default engine and on eager, for the 2/2-head NTM, the DNC and the MANN.

Each check prints one line and one JSON record (a line starting ``RESULT``), which gpu_check.sh
gathers into its table.

    PYTHONPATH=src python scripts/gpu_check.py --part checks|rates
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from torch_ntm import DNC, MANN, NTM
from torch_ntm.baseline import LSTMBaseline
from torch_ntm.engines import graphs
from torch_ntm.metrics import masked_bce
from torch_ntm.tasks import CopyTask

# Every model of issue 56's first item, at the sizes its users train (copy task: 9 in, 8 out).
MODELS = {
    "NTM 1/1 (paper copy)": lambda: NTM(9, 8),
    "NTM 2/2 heads": lambda: NTM(9, 8, read_heads=2, write_heads=2),
    "NTM LSTM 2 layers, 3 write": lambda: NTM(9, 8, controller_layers=2, write_heads=3),
    "NTM feedforward 2/2": lambda: NTM(9, 8, controller="feedforward", read_heads=2,
                                       write_heads=2),
    "MANN(405, 5)": lambda: MANN(405, 5),
    "MANN conv": lambda: MANN(405, 5, encoder="conv"),
    "MANN conv+pixels": lambda: MANN(405, 5, encoder="conv+pixels"),
    "DNC(9, 8)": lambda: DNC(9, 8),
    "DNC 2 write heads": lambda: DNC(9, 8, write_heads=2),
    "DNC sparse K=8, N=64": lambda: DNC(9, 8, memory_size=64, sparse_link=8),
    "LSTM baseline": lambda: LSTMBaseline(9, 8),
}


def _result(**record) -> None:
    print("RESULT " + json.dumps(record), flush=True)


def _state_with_grad(model, batch):
    """A state to pass in: the initial one, perturbed, its float leaves requiring gradients."""
    def perturbed(t):
        if not t.is_floating_point():
            return t
        return (t + 0.01 * torch.rand_like(t)).detach().requires_grad_(True)

    return pytree.tree_map(perturbed, model.initial_state(batch, "cuda",
                                                          next(model.parameters()).dtype))


def _run(model, x, state):
    """Outputs, final state, and the gradients of the parameters, the input and the state."""
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    y, final = model(x, state)
    leaves = [t for t in pytree.tree_leaves(final) if t.is_floating_point()]
    loss = y.square().sum() + sum((t * (i + 1)).sin().sum() for i, t in enumerate(leaves))
    wrt = [x, *(p for p in model.parameters() if p.requires_grad),
           *(t for t in pytree.tree_leaves(state or ()) if t.requires_grad)]
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    return [y.detach(), *(t.detach() for t in leaves), *(g for g in grads if g is not None)]


def _max_difference(a, b) -> float:
    return max(float((u.double() - v.double()).abs().max() / (v.double().abs().max() + 1e-30))
               for u, v in zip(a, b))


def _captured(model) -> bool:
    return any(g is not None for g in graphs._GRAPHS.get(model, {}).values())


def model_checks() -> bool:
    # The LSTM baseline's eager loop is cuDNN's LSTM, which computes in TF32 by default
    # (torch.backends.cudnn.allow_tf32); the graphs engine's steps do not: compare both in full
    # float32.
    torch.backends.cudnn.allow_tf32 = False
    ok = True
    for name, make in MODELS.items():
        for dtype, tol, explicit in ((torch.float64, 1e-10, False), (torch.float64, 1e-10, True),
                                     (torch.float32, 2e-4, False)):
            torch.manual_seed(0)
            model = make().to("cuda", dtype)
            x = torch.rand(20, 16, model.input_size, device="cuda", dtype=dtype)
            state = _state_with_grad(model, 16) if explicit else None
            model.engine = "auto"
            before = model.runs_on(x)
            torch.cuda.synchronize()
            start = time.perf_counter()
            got = _run(model, x, state)
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            after, captured = model.runs_on(x), _captured(model)
            model.engine = "eager"
            diff = _max_difference(got, _run(model, x, state))
            passed = before == after == "graphs" and captured and diff < tol
            ok &= passed
            label = f"{name} {str(dtype)[6:]}{' state given' if explicit else ''}"
            print(f"{'ok  ' if passed else 'FAIL'} {label}: runs_on {before} -> {after}, "
                  f"captured {captured}, largest relative difference to eager {diff:.1e} "
                  f"(< {tol}), first call {first:.2f} s", flush=True)
            _result(check=label, kind="model", passed=passed, diff=diff, first_call_s=first)
            del model
            graphs._GRAPHS.clear()
    return ok


def kept_alive_check() -> bool:
    """An eager pass's graph alive (a loss kept for logging), then the default engine with a
    fused Adam: captures, and trains."""
    torch.manual_seed(0)
    model = NTM(9, 8, read_heads=2, write_heads=2, engine="eager").cuda()
    x = torch.rand(20, 16, 9, device="cuda")
    kept = model(x)[0].sum()
    model.engine = "auto"
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    for _ in range(3):
        optimizer.zero_grad()
        model(x)[0].square().mean().backward()
        optimizer.step()
    passed = model.runs_on(x) == "graphs" and _captured(model) and kept.grad_fn is not None
    print(f"{'ok  ' if passed else 'FAIL'} capture with an eager graph alive, fused Adam: runs "
          f"on {model.runs_on(x)}, captured {_captured(model)}", flush=True)
    _result(check="eager graph alive + fused Adam", kind="process", passed=passed)
    graphs._GRAPHS.clear()
    return passed


class _FailsUnderCapture(NTM):
    """An NTM that reads a value on the host while a graph is captured ("sync": CUDA refuses
    the capture) or raises there ("raise"), and runs normally otherwise."""

    how = "sync"

    def _step(self, x, state):
        if torch.cuda.is_current_stream_capturing():
            if self.how == "sync":
                x = x * float(x.sum() > 0)
            else:
                raise RuntimeError("not capturable")
        return super()._step(x, state)


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages = []

    def emit(self, record) -> None:
        self.messages.append(record.getMessage())


def _allocated() -> tuple[int, int]:
    """Bytes allocated on the device: as they are, and with torch's cached cuBLAS workspaces
    (one per handle and stream, kept for the process's life) freed first."""
    torch.cuda.synchronize()
    gc.collect()
    raw = torch.cuda.memory_allocated()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.synchronize()
    return raw, torch.cuda.memory_allocated()


def failed_capture_checks() -> bool:
    """Forced capture failures, each at a shape of its own (the engine says each failure once):
    a sync and a raise, twice each, so that a failure which broke the next capture shows up as a
    wrong reason. Memory is measured once before the four and once after them, with the models
    dropped: a failure that leaked would leave more each time (what one round keeps alive until
    the next, a final state say, does not count against it)."""
    ok = True
    counter = _Count()
    logging.getLogger("torch_ntm.engines").addHandler(counter)
    graphs._GRAPHS.clear()
    _, start = _allocated()
    for batch, how in ((16, "sync"), (17, "raise"), (18, "sync"), (19, "raise")):
        torch.manual_seed(0)
        model = _FailsUnderCapture(9, 8, read_heads=2, write_heads=2).cuda()
        model.how = how
        x = torch.rand(20, batch, 9, device="cuda")
        torch.cuda.manual_seed(7)
        expected = torch.randn(5, device="cuda")
        torch.cuda.manual_seed(7)
        errors = []
        try:
            for _ in range(2):
                y, state = model(x)
                y.square().sum().backward()
                del y, state
            random = torch.randn(5, device="cuda")
            torch.nn.init.normal_(torch.empty(3, device="cuda"))
            same_random = bool(torch.equal(random, expected))
            del random, expected
        except RuntimeError as e:
            errors.append(str(e).splitlines()[0])
            same_random = False
        said = sum("could not capture" in m for m in counter.messages)
        counter.messages.clear()
        why = next(iter(graphs._FAILED.get(model, {}).values()), "none")
        right_why = "not capturable" in why if how == "raise" else why != "none"
        runs_on = model.runs_on(x)
        passed = same_random and said == 1 and right_why and runs_on == "eager" and not errors
        ok &= passed
        print(f"{'ok  ' if passed else 'FAIL'} forced failed capture ({how}, batch {batch}): RNG "
              f"as before {same_random}, said {said} time(s), runs_on {runs_on}; why: {why}"
              f"{', error: ' + errors[0] if errors else ''}", flush=True)
        _result(check=f"failed capture ({how}, batch {batch}): RNG, reason, runs_on",
                kind="process", passed=passed)
        del model, x
        graphs._GRAPHS.clear()
    _, end = _allocated()
    passed = end <= start
    ok &= passed
    print(f"{'ok  ' if passed else 'FAIL'} memory after the four failed captures: "
          f"{end - start:+,} bytes against before them (torch's cuBLAS workspaces, a cache kept "
          f"per stream, freed on both sides)", flush=True)
    _result(check="failed captures: no memory left", kind="process", passed=passed)
    logging.getLogger("torch_ntm.engines").removeHandler(counter)
    return ok


def _rate(model, batch: int, episodes: bool, seconds: float) -> tuple[float, float]:
    """(sequences per second of training steps, median over timed blocks; first step's s)."""
    if episodes:  # 50-step episodes of the MANN, labels 0..4
        x = torch.rand(50, batch, model.input_size, device="cuda")
        target = torch.randint(0, 5, (50, batch), device="cuda")

        def loss_of(logits):
            return F.cross_entropy(logits.flatten(0, 1), target.flatten())
    else:
        task = CopyTask().with_size(20)
        x, y, mask = (t.cuda() for t in task.sample(batch, torch.Generator().manual_seed(0)))

        def loss_of(logits):
            return masked_bce(logits, y, mask).mean()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-4, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_of(model(x)[0]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()

    torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    step()
    rates, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(rates) < 3:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        rates.append(3 * batch / (time.perf_counter() - start))
    return statistics.median(rates), first


RATES = [  # name, model, batch, episodes (MANN) or copy sequences
    ("NTM 2/2 heads", lambda: NTM(9, 8, read_heads=2, write_heads=2), 1024, False),
    ("DNC(9, 8)", lambda: DNC(9, 8), 256, False),
    ("DNC(9, 8)", lambda: DNC(9, 8), 1024, False),
    ("MANN(405, 5)", lambda: MANN(405, 5), 16, True),
    ("MANN(405, 5)", lambda: MANN(405, 5), 256, True),
]


def rates() -> None:
    for name, make, batch, episodes in RATES:
        for engine in ("auto", "eager"):
            torch.manual_seed(0)
            model = make().cuda()
            model.engine = engine
            rate, first = _rate(model, batch, episodes, 2.5 if engine == "auto" else 1.0)
            x = torch.rand(50 if episodes else 41, batch, model.input_size, device="cuda")
            runs_on = model.runs_on(x)
            unit = "episodes" if episodes else "sequences"
            print(f"{name} batch {batch} engine={engine!r} ({runs_on}): {rate:,.0f} {unit}/s, "
                  f"first step {first:.1f} s", flush=True)
            _result(rate=name, batch=batch, engine=engine, runs_on=runs_on, per_s=rate,
                    first_s=first, unit=unit)
            del model
            graphs._GRAPHS.clear()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("checks", "rates"), default="checks")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    if args.part == "rates":
        rates()
        return 0
    ok = kept_alive_check()  # first: in a process where nothing was captured yet
    ok &= failed_capture_checks()
    ok &= model_checks()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
