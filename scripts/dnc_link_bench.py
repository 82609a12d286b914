"""The DNC's temporal link matrix per step, exact against the paper's sparse approximation stored K
entries per row (docs/speed.md, "The DNC's sparse link matrix").

    python scripts/dnc_link_bench.py [--memory-size 1024,4096] [--k 8] [--batch-size 1]
    python scripts/dnc_link_bench.py --module [--steps 10] ...

Times one step of the link's part of a DNC step, ``torch_ntm.dnc_functional``'s

    exact:   link, precedence, directional_weights               (L_t: N x N per write head)
    sparse:  sparse_link_update, precedence, sparse_directional_weights   (K entries per row)

forward alone and forward with its backward (autograd), on random near one-hot write and read
weightings (1 write head, 4 read heads, float32, one thread), from a link matrix reached by such
writes. Prints the least over ``--repeats`` of the milliseconds per step, the megabytes of the
link state per sequence, and the megabytes one step keeps for its backward (the tensors autograd
saves, counted through `torch.autograd.graph.saved_tensors_hooks`).

With ``--module``, the same for a whole training step of the module, ``DNC(9, 8,
memory_size=N)`` against ``DNC(9, 8, memory_size=N, sparse_link=K)`` (its defaults otherwise: an
LSTM of 64, width 16, 4 read heads; the eager engine, which is what serves a sparse link), on
``--steps`` random input steps: the forward and its backward, per time step, and what autograd
saves per time step.
"""

import argparse
import time

import torch

from torch_ntm import DNC
from torch_ntm import dnc_functional as D

READ_HEADS = 4


def weighting(batch: int, heads: int, n: int) -> torch.Tensor:
    """Near one-hot weightings, as a trained DNC's (``[batch, heads, n]``)."""
    return torch.softmax(20 * torch.rand(batch, heads, n), -1)


def step(kind: str, link, p, w, w_read, k: int):
    """One step of the link's part; returns the new state and a scalar to differentiate."""
    if kind == "exact":
        link = D.link(link, w, p)
        forward, backward = D.directional_weights(link, w_read)
    else:
        link = D.sparse_link_update(link, w, p, k)
        forward, backward = D.sparse_directional_weights(link, w_read)
    return link, D.precedence(p, w), (forward + backward).sum()


def state_bytes(link) -> int:
    tensors = [link] if isinstance(link, torch.Tensor) else list(link)
    return sum(t.numel() * t.element_size() for t in tensors)


def saved_bytes(run) -> int:
    """The bytes of the tensors autograd saves for the backward while ``run()`` runs."""
    saved = []

    def keep(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        run()
    return sum(saved)


def measure(kind: str, n: int, k: int, batch: int, repeats: int) -> dict:
    torch.manual_seed(0)
    if kind == "exact":
        link = torch.zeros(batch, 1, n, n)
    else:
        link = D.empty_sparse_link(batch, 1, n, k)
    p = torch.zeros(batch, 1, n)
    for _ in range(8):  # a link matrix with entries, from near one-hot writes
        link, p, _ = step(kind, link, p, weighting(batch, 1, n), weighting(batch, READ_HEADS, n),
                          k)
    w, w_read = weighting(batch, 1, n), weighting(batch, READ_HEADS, n)
    times = {"forward": [], "forward+backward": []}
    for _ in range(repeats):
        with torch.no_grad():
            start = time.perf_counter()
            step(kind, link, p, w, w_read, k)
            times["forward"].append(time.perf_counter() - start)
        leaves = [t.requires_grad_() for t in (w, w_read)]
        start = time.perf_counter()
        _, _, total = step(kind, link, p, *leaves, k)
        total.backward()
        times["forward+backward"].append(time.perf_counter() - start)
        w, w_read = (t.detach() for t in leaves)
    saved = saved_bytes(lambda: step(kind, link, p, w.requires_grad_(),
                                     w_read.requires_grad_(), k))
    return {"ms": {name: 1e3 * min(ts) for name, ts in times.items()},
            "state_mb": state_bytes(link) / batch / 2**20, "saved_mb": saved / batch / 2**20}


def measure_module(kind: str, n: int, k: int, batch: int, steps: int, repeats: int) -> dict:
    torch.manual_seed(0)
    dnc = DNC(9, 8, memory_size=n, sparse_link=None if kind == "exact" else k, engine="eager")
    x = torch.rand(steps, batch, 9)
    times = {"forward": [], "forward+backward": []}
    for _ in range(repeats):
        with torch.no_grad():
            start = time.perf_counter()
            dnc(x)
            times["forward"].append(time.perf_counter() - start)
        start = time.perf_counter()
        y, state = dnc(x)
        (y.sum() + state.memory.sum()).backward()
        times["forward+backward"].append(time.perf_counter() - start)
    return {"ms": {name: 1e3 * min(ts) / steps for name, ts in times.items()},
            "state_mb": state_bytes(D.sparse_link_from_dense(state.link, k) if kind == "sparse"
                                    else state.link) / batch / 2**20,
            "saved_mb": saved_bytes(lambda: dnc(x)) / batch / steps / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(prog="dnc_link_bench.py", description=__doc__.split("\n")[0])
    parser.add_argument("--memory-size", default="1024,4096",
                        help="memory sizes N, comma-separated (default 1024,4096)")
    parser.add_argument("--k", type=int, default=8, help="K of the sparse link (the paper: 8)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--module", action="store_true",
                        help="time the DNC module's training step instead of the link's part")
    parser.add_argument("--steps", type=int, default=10, help="time steps (with --module)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.module:
        print(f"DNC(9, 8, memory_size=N[, sparse_link={args.k}]), batch {args.batch_size}, "
              f"{args.steps} steps, float32, least of {args.repeats}; per time step: ms, saved "
              f"MB; the link's state at the end (sparse: stored K a row) in MB")
    else:
        print(f"batch {args.batch_size}, 1 write head, {READ_HEADS} read heads, float32, K "
              f"{args.k}, least of {args.repeats}; per sequence: state and saved in MB")
    print(f"{'N':>6} {'link':>7} {'forward ms':>11} {'fwd+bwd ms':>11} {'state MB':>9} "
          f"{'saved MB':>9}")
    for n in (int(v) for v in args.memory_size.split(",")):
        for kind in ("exact", "sparse"):
            r = (measure_module(kind, n, args.k, args.batch_size, args.steps, args.repeats)
                 if args.module else measure(kind, n, args.k, args.batch_size, args.repeats))
            print(f"{n:>6} {kind:>7} {r['ms']['forward']:>11.2f} "
                  f"{r['ms']['forward+backward']:>11.2f} {r['state_mb']:>9.2f} "
                  f"{r['saved_mb']:>9.2f}")


if __name__ == "__main__":
    main()
