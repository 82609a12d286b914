"""How a repeat-copy model stores the count it is given (docs/results/repeat-copy.md).

    python scripts/repeat_copy_count.py src/torch_ntm/pretrained/repeat_copy [--max-repeats 20]

Feeds ``--sequences`` sequences of length ``--length`` (seed 123; default one) with the count
channel set for each R in 1 .. ``--max-repeats``, and reads the LSTM controller's cell state on
the step after the count (every layer's cells, numbered across layers; the mean over the
sequences). For the ``--units`` cells whose value moves most from R = 1 to R = 10 (the trained
range), it prints the value at each R and how far the storage extrapolates: the change per
repeat beyond R = 10 over the change per repeat up to it (1 for a count stored linearly; 0 for
one that does not grow past the trained range, as a saturated tanh does). A model cannot count
to a number it has not stored.
"""

import sys

import _analysis
import torch

TRAINED = 10  # the largest R of the training distribution (the paper's)


def main() -> None:
    parser = _analysis.parser(__doc__, sequences=1)
    parser.add_argument("--length", type=int, default=10)
    parser.add_argument("--max-repeats", type=int, default=20)
    parser.add_argument("--units", type=int, default=5)
    args = parser.parse_args()
    ckpt, model = _analysis.load(args.run, "repeat_copy")
    if ckpt.config.model != "ntm" or ckpt.config.model_params.controller != "lstm":
        sys.exit(f"error: {args.run} has no LSTM controller in an NTM; this script reads the "
                 f"cell state of one")
    if args.max_repeats <= TRAINED:
        sys.exit(f"error: --max-repeats must be above the trained {TRAINED}, got "
                 f"{args.max_repeats}")
    task = ckpt.task().with_size(args.length)
    L, repeats = args.length, torch.arange(1, args.max_repeats + 1)
    S = args.sequences
    prefix = task.sample(S, torch.Generator().manual_seed(123)).inputs[:L + 2]  # to the count
    x = prefix.repeat_interleave(len(repeats), dim=1)  # sequence s at columns s R .. s R + R - 1
    x[L + 1, :, task.width + 1] = repeats.repeat(S) / task.repeats_norm  # the count (the layout)
    with torch.no_grad():
        _, state = model(x)
    _, cell = state.controller  # (layers, S R, hidden)
    cell = cell.transpose(0, 1).reshape(S, len(repeats), -1).mean(0)  # (R, layers x hidden)
    within = (cell[TRAINED - 1] - cell[0]) / (TRAINED - 1)  # change per repeat, R = 1..10
    beyond = (cell[-1] - cell[TRAINED - 1]) / (args.max_repeats - TRAINED)
    print(f"{args.run}: cell state after the count, R = 1..{args.max_repeats}, the {args.units} "
          f"cells that move most up to R = {TRAINED}")
    for unit in within.abs().argsort(descending=True)[:args.units].tolist():
        values = " ".join(f"{v:.2f}" for v in cell[:, unit].tolist())
        print(f"cell {unit}: {values}; extrapolates {float(beyond[unit] / within[unit]):.2f}")


if __name__ == "__main__":
    main()
