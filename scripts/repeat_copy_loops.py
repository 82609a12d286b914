"""Where a repeat-copy model goes wrong beyond the trained repeats (docs/results/repeat-copy.md).

    python scripts/repeat_copy_loops.py src/torch_ntm/pretrained/repeat_copy [--length 10]

Draws 100 sequences of length ``--length`` for each R in ``--repeats`` (seed 123, never a
validation's), runs the run's kept weights, and prints the wrong data bits of each copy (mean
over the sequences) and the copy in which the end marker is first raised (median; the model
should raise it after copy R, on the step after the last one), and on a second line the read
heads' focus in each copy (the largest weight of a read weighting, mean over its steps, heads and
sequences: 1 on one row, 1/N spread over all N), and on a third how much of the stored sequence
is left unerased at the end of each copy (the L rows of the most write weight during the input;
the product over the answer's steps so far of each entry's ``1 - w e`` of every write head, mean
over the rows, columns and sequences: 1 while nothing is erased there, 0 once it is wiped; adds
are not counted), and on a fourth where the write heads go while the model answers (the rows
their largest weight moves in each copy, and that weight: a head that moves on by a row a step
comes round onto the stored rows after N - L steps). A model that keeps copying and only misplaces
the marker (the paper's, at 20 repeats) has few wrong data bits; one that raises the marker
early and then outputs noise has about half the bits of the copies after it wrong.
"""

import statistics

import _analysis
import torch


def main() -> None:
    parser = _analysis.parser(__doc__, sequences=100)
    parser.add_argument("--length", type=int, default=10)
    parser.add_argument("--repeats", default="10,12,15,20")
    args = parser.parse_args()
    ckpt, model = _analysis.load(args.run, "repeat_copy")
    trained = ckpt.task()
    L, W = args.length, trained.width
    for R in (int(r) for r in args.repeats.split(",")):
        task = trained.with_size(L).with_repeats(R)
        batch = task.sample(args.sequences, torch.Generator().manual_seed(123))
        with torch.no_grad():
            logits, _, trace = model.trace(batch.inputs)
        first = L + 2  # the first answer step (see RepeatCopyTask's layout)
        answer = slice(first, first + R * L)
        wrong = (logits[answer, :, :W] > 0).float() != batch.targets[answer, :, :W]
        per_copy = wrong.float().reshape(R, L, -1, W).sum((1, 3)).mean(1)  # (R,)
        focus = trace.read_weights[answer].amax(-1).reshape(R, -1).mean(1)  # (R,)
        raised = logits[first:first + R * L + 1, :, W] > 0  # (R L + 1, B)
        copy_of_end = [int(col.nonzero()[0]) / L if col.any() else float("inf")
                       for col in raised.T]
        print(f"L = {L}, R = {R}: wrong data bits per copy "
              + " ".join(f"{v:.2f}" for v in per_copy.tolist())
              + f"; end marker first raised after copy {statistics.median(copy_of_end):g}"
              + f" (median of {args.sequences}; right: {R})")
        print("  read focus per copy " + " ".join(f"{v:.2f}" for v in focus.tolist()))
        # The rows written during the input: the L of most write weight over steps 1..L.
        rows = trace.write_weights[1 : L + 1].sum((0, 2)).topk(L, dim=-1).indices  # (B, L)
        heads = trace.write_weights.shape[2]
        index = rows[None, :, None].expand(R * L, -1, heads, -1)  # (RL, B, Hw, L)
        w = trace.write_weights[answer].gather(-1, index)
        keep = (1 - w[..., :, None] * trace.erase[answer][..., None, :]).prod(2)  # (RL, B, L, M)
        left = keep.cumprod(0)[L - 1 :: L].mean((1, 2, 3))  # (R,) at each copy's last step
        print("  stored sequence left unerased after copy "
              + " ".join(f"{v:.2f}" for v in left.tolist()))
        # Where the write heads go while the model answers: how many rows the row of most
        # write weight moves in each copy (signed, the shorter way round the memory), and that
        # largest weight; means over the steps, heads and sequences.
        n = trace.write_weights.shape[-1]
        top = trace.write_weights[first - 1 : first + R * L].argmax(-1)  # (RL + 1, B, Hw)
        moved = ((top.diff(dim=0) + n // 2) % n - n // 2).float()  # (RL, B, Hw)
        moved = moved.reshape(R, L, -1).sum(1).mean(1)  # (R,)
        peak = trace.write_weights[answer].amax(-1).reshape(R, -1).mean(1)  # (R,)
        print("  write head per copy: rows moved " + " ".join(f"{v:+.1f}" for v in moved.tolist())
              + "; largest weight " + " ".join(f"{v:.2f}" for v in peak.tolist()))


if __name__ == "__main__":
    main()
