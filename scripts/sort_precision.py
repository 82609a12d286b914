"""Which priority-sort sequences a model gets wrong (docs/results/priority-sort.md).

    python scripts/sort_precision.py src/torch_ntm/pretrained/priority_sort [--inputs 20]

Draws 1,000 sequences of ``--inputs`` inputs (seed 777, never a validation's), runs the run's
kept weights, and relates the sequences with a wrong bit to how close their priorities are: for
each sequence the smallest gap between two priorities that the target orders (the top
``num_outputs`` and the first one left out), and for each output step the gap between its
vector's priority and its nearest neighbour in that order (``--float64``: the model run in
float64, to tell the weights' resolution from float32's). A model that orders priorities to a
finite resolution fails on the sequences whose gaps fall below it, whatever it learned besides.
"""

import _analysis
import torch

GAPS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)


def main() -> None:
    parser = _analysis.parser(__doc__, sequences=1000)
    parser.add_argument("--inputs", type=int, default=20)
    parser.add_argument("--float64", action="store_true", help="run the model in float64")
    args = parser.parse_args()
    ckpt, model = _analysis.load(args.run, "priority_sort")
    dtype = torch.float64 if args.float64 else torch.float32
    model.to(dtype)
    task = ckpt.task().held_out().with_size(args.inputs)  # the paper's task (no close_pairs)
    n, m, W = task.num_inputs, task.num_outputs, task.width
    batch = task.sample(args.sequences, torch.Generator().manual_seed(777))
    with torch.no_grad():
        logits, _ = model(batch.inputs.to(dtype))
    answer = slice(n + 1, n + 1 + m)  # the output steps (see PrioritySortTask's layout)
    wrong = ((logits[answer] > 0).float() != batch.targets[answer]).any(-1)  # (m, B)
    perfect = ~wrong.any(0)  # (B,)
    ranked = batch.inputs[:n, :, W].sort(0, descending=True).values  # (n, B)
    gaps = ranked[:m] - ranked[1 : m + 1]  # output i's priority minus the next one's, (m, B)
    smallest = gaps.min(0).values  # (B,)
    above = torch.cat([torch.full_like(gaps[:1], float("inf")), gaps[:-1]])
    nearest = torch.minimum(above, gaps)  # each output's gap to its nearest neighbour, (m, B)

    print(f"{args.run}: {n} inputs, {m} outputs, {args.sequences} sequences, "
          f"{perfect.double().mean():.1%} perfect")
    head = ("smallest gap", "below it", "perfect", "the rest", "perfect")
    print("{:>14} {:>10} {:>8} | {:>10} {:>8}".format(*head))
    for d in GAPS:
        below = smallest < d
        rates = [f"{perfect[s].double().mean():.1%}" if s.any() else "-" for s in (below, ~below)]
        print(f"{d:>14g} {int(below.sum()):>10} {rates[0]:>8} | {int((~below).sum()):>10} "
              f"{rates[1]:>8}")
    if wrong.any():
        print(f"wrong output steps: {int(wrong.sum())}; their gap to the nearest priority, median "
              f"{nearest[wrong].median():.2g} (right ones: {nearest[~wrong].median():.2g}); "
              f"under 0.01: {(nearest[wrong] < 0.01).double().mean():.1%} of the wrong, "
              f"{(nearest < 0.01).double().mean():.1%} of all")


if __name__ == "__main__":
    main()
