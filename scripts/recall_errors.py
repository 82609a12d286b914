"""What an associative-recall model gets wrong (docs/results/associative-recall.md).

    python scripts/recall_errors.py runs/sweep-recall-learned-spikes/seed-1 [--items 6]

Draws 5,000 sequences of exactly ``--items`` items (seed 123, never a validation's), runs the
run's kept weights, and splits the sequences into those with a wrong bit and the rest. For each
it prints how many bits were wrong, which item was queried, and the Hamming distance from the
queried item to its nearest other item of the sequence: a model that tells items apart by a
blurred key confuses close ones.
"""

import statistics

import _analysis
import torch


def main() -> None:
    parser = _analysis.parser(__doc__, sequences=5000)
    parser.add_argument("--items", type=int, default=6)
    args = parser.parse_args()
    ckpt, model = _analysis.load(args.run, "associative_recall")
    task = ckpt.task().with_size(args.items)
    W, k, n = task.width, task.item_length, args.items
    generator = torch.Generator().manual_seed(123)
    rows = []  # (wrong bits, queried item, nearest other item's distance in bits)
    for start in range(0, args.sequences, 500):  # in batches of 500 (the last may be smaller)
        batch = task.sample(min(500, args.sequences - start), generator)
        with torch.no_grad():
            logits, _ = model(batch.inputs)
        wrong = (((logits > 0).float() != batch.targets) & batch.mask.unsqueeze(-1)).sum((0, 2))
        # item i is at steps (k+1) i + 1 .. (k+1) i + k (after its delimiter); the query after
        # the n items
        items = torch.stack([batch.inputs[(k + 1) * i + 1:(k + 1) * (i + 1), :, :W]
                             for i in range(n)])  # (n, k, B, W)
        query = batch.inputs[(k + 1) * n + 1:(k + 1) * (n + 1), :, :W]  # (k, B, W)
        same = (items == query).all(-1).all(1)  # (n, B): items equal to the query
        distance = (items != query).sum((1, 3))  # (n, B) bits from each item to the query
        for b in range(batch.inputs.shape[1]):
            q = int(same[:, b].nonzero()[0])
            nearest = min(int(distance[i, b]) for i in range(n) if i != q)
            rows.append((int(wrong[b]), q, nearest))
    failed = [r for r in rows if r[0] > 0]
    print(f"{len(failed)} of {len(rows)} sequences with a wrong bit "
          f"({len(failed) / len(rows):.1%}); wrong bits in those: median "
          f"{statistics.median(r[0] for r in failed) if failed else 0}")
    for name, group in (("wrong", failed), ("right", [r for r in rows if r[0] == 0])):
        if not group:
            continue
        by_query = [sum(r[1] == i for r in group) / len(group) for i in range(n - 1)]
        print(f"{name:5s}: nearest other item to the query, mean "
              f"{statistics.mean(r[2] for r in group):.2f} bits; queried item 0..{n - 2}: "
              + " ".join(f"{f:.2f}" for f in by_query))


if __name__ == "__main__":
    main()
