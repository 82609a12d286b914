"""What a graph-task model gets wrong, answer step by answer step (docs/results/dnc.md).

    python scripts/graph_errors.py runs/traversal [--sizes 3,5,10] [--sequences 500]

For a `traversal` or `shortest_path` run: draws ``--sequences`` episodes of each graph size
(seed 123, never a validation's), runs the run's kept weights, and prints, for each answer step
i (the i-th triple of the path), the fraction of those triples whose source, edge label or
destination is wrong (a field is wrong when one of its digits is), and of those with any field
wrong. On traversal the source of step 1 is the query's start node and the edge labels are the
query's, so a model that keeps the query but has not learnt to look its edges up is wrong in the
destinations (and, from step 2, in the sources, the destinations before them).
"""

import _analysis
import torch

FIELDS = ("source", "edge", "destination")


def main() -> None:
    parser = _analysis.parser(__doc__, sequences=500)
    parser.add_argument("--sizes", default="3,5,10", help="graph sizes (nodes), comma-separated")
    args = parser.parse_args()
    ckpt, model = _analysis.load(args.run, ("traversal", "shortest_path"))
    task = ckpt.task()
    digits = task.digits
    print(f"{ckpt.config.task}, {args.sequences} sequences a size: the fraction of answer "
          f"triples with each field wrong")
    print(f"{'nodes':>5} {'step':>4} {'triples':>7} " + " ".join(f"{f:>11}" for f in FIELDS)
          + f" {'any':>6}")
    for size in (int(s) for s in args.sizes.split(",")):
        batch = task.with_size(size).sample(args.sequences, torch.Generator().manual_seed(123))
        with torch.no_grad():
            logits, _ = model(batch.inputs)
        steps, b = batch.mask.shape
        shape = (steps, b, 3, digits, 10)  # each field's digits, a softmax group each
        wrong = (logits.view(shape).argmax(-1) != batch.targets.view(shape).argmax(-1)).any(-1)
        answer_step = batch.mask.long().cumsum(0) * batch.mask  # 1, 2, ... on answer steps
        for i in range(1, int(answer_step.max()) + 1):
            at = answer_step == i
            fields = wrong[at].float()  # [triples, 3]
            print(f"{size:>5} {i:>4} {int(at.sum()):>7} "
                  + " ".join(f"{float(f):>11.3f}" for f in fields.mean(0))
                  + f" {float(fields.any(-1).float().mean()):>6.3f}")


if __name__ == "__main__":
    main()
