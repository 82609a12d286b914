"""How a dynamic n-grams model uses its memory, against the Bayes-optimal predictor
(docs/results/ngrams.md).

    python scripts/ngrams_memory.py RUN [--sequences 3000]

Draws ``--sequences`` sequences of the run's task (seed 2000, never a validation's) and prints:

- the cost above the Bayes-optimal predictor, split by how many times the next bit's context
  (its last ``order - 1`` bits) occurred before in the sequence, the counts the optimum predicts
  from: a model that merges contexts pays even where a context is new (the optimum predicts 1/2
  there), one that counts imprecisely pays most where the counts are large;
- for the first 200 sequences (their eager trace), each head's use of the rows at the scored
  steps: how many rows are ever the largest of its weighting, the mean largest weight, and its
  purity, the share of steps whose largest row is one the step's context has more often than
  any other context (1 when every row serves one context).
"""

import _analysis
import torch

from torch_ntm.tasks import NGramsTask

# Bins of how many times a context occurred before (the last one open-ended).
BINS = ((0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, None))


def cost_by_count(model, task: NGramsTask, sequences: int, generator) -> list:
    """Per bin of `BINS`: ``(share of scored steps, model bits a step, optimum bits a step)``."""
    totals = torch.zeros(len(BINS), 3, dtype=torch.float64)
    for start in range(0, sequences, 500):
        batch = task.sample(min(500, sequences - start), generator)
        with torch.no_grad():
            logits, _ = model(batch.inputs)
        y = batch.targets[..., 0].double()
        p = torch.sigmoid(logits[..., 0].double())
        model_bits = -torch.log2(torch.where(y > 0.5, p, 1 - p))
        optimum_bits, before = task.reference_steps(batch)
        for i, (low, high) in enumerate(BINS):
            sel = batch.mask & (before >= low) & (before <= (high if high is not None else before))
            totals[i] += torch.stack([sel.sum(), model_bits[sel].sum(), optimum_bits[sel].sum()])
    steps = totals[:, 0].sum()
    return [(n / steps, m / n, o / n) for n, m, o in totals.tolist()]


def head_use(weights: torch.Tensor, context: torch.Tensor, mask: torch.Tensor) -> tuple:
    """``(rows used, mean largest weight, purity)`` of one head's weightings ``[T, B, N]`` at
    the scored steps (``mask``), each averaged over the sequences."""
    top = weights.argmax(-1)
    rows, purity = [], []
    for b in range(weights.shape[1]):
        r, c = top[mask[:, b], b], context[mask[:, b], b]
        counts = torch.zeros(weights.shape[-1], int(context.max()) + 1)
        counts.index_put_((r, c), torch.ones(len(r)), accumulate=True)
        purity.append((counts.argmax(1)[r] == c).float().mean().item())
        rows.append(len(torch.unique(r)))
    largest = weights.max(-1).values[mask].mean().item()
    return sum(rows) / len(rows), largest, sum(purity) / len(purity)


def main() -> None:
    parser = _analysis.parser(__doc__, sequences=3000)
    args = parser.parse_args()
    ckpt, model = _analysis.load(args.run, "ngrams")
    task = ckpt.task()
    generator = torch.Generator().manual_seed(2000)
    rows = cost_by_count(model, task, args.sequences, generator)
    per_sequence = task.length - task.order + 1  # scored steps a sequence
    model_cost = sum(s * m for s, m, _ in rows) * per_sequence
    optimum_cost = sum(s * o for s, _, o in rows) * per_sequence
    print(f"{args.run}: {args.sequences} sequences of {task.length} bits: {model_cost:.2f} bits a "
          f"sequence, the optimum {optimum_cost:.2f} ({model_cost / optimum_cost - 1:+.2%})")
    print("context seen before | share of steps | bits a step (optimum) | above it, a sequence")
    for (low, high), (share, m, o) in zip(BINS, rows):
        seen = f"{low}-{high}" if high is not None else f"{low}+"
        print(f"{seen:>19} | {share:14.1%} | {m:.4f} ({o:.4f})       | "
              f"{(m - o) * share * per_sequence:+.3f}")
    inputs, _, mask = task.sample(min(200, args.sequences), torch.Generator().manual_seed(2000))
    with torch.no_grad():
        _, _, trace = model.trace(inputs)
    context = task.contexts(inputs[..., 0])
    for kind, weights in (("read", trace.read_weights), ("write", trace.write_weights)):
        for h in range(weights.shape[2]):
            used, largest, purity = head_use(weights[:, :, h], context, mask)
            print(f"{kind} head {h}: {used:.1f} rows used of {weights.shape[-1]}, largest weight "
                  f"{largest:.3f}, purity {purity:.3f}")


if __name__ == "__main__":
    main()
