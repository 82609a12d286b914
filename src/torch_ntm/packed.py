"""`PackedSequence` inputs for a recurrent model that runs padded batches, as `nn.LSTM` takes them.

A model state here is a NamedTuple whose first field is the controller's tuple of tensors (batch
at dim 1, as `nn.LSTM`'s ``(h, c)``) and whose other fields are tensors with the batch first
(`torch_ntm.layout.DNCState`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

__all__ = ["check_packed", "forward_packed", "where_batch"]


def check_packed(x: PackedSequence, name: str) -> None:
    """A clear error unless ``x`` is a well-formed `PackedSequence` (as
    `torch.nn.utils.rnn.pack_padded_sequence` makes them), before any torch call trusts it:
    torch's unpacking reads memory out of bounds on a malformed one and can crash the process.

    ``batch_sizes``: a 1-d int64 CPU tensor of positive, non-increasing counts summing to the
    data's rows; ``sorted_indices`` and ``unsorted_indices`` (both or neither): permutations of
    the ``batch_sizes[0]`` sequences, each the other's inverse.
    """
    fix = "build it with torch.nn.utils.rnn.pack_padded_sequence or pack_sequence"
    sizes, data = x.batch_sizes, x.data
    if not isinstance(data, Tensor) or data.dim() < 1:
        raise ValueError(f"{name} got a PackedSequence whose data is not a tensor of rows; {fix}")
    if (not isinstance(sizes, Tensor) or sizes.dim() != 1 or sizes.dtype != torch.int64
            or sizes.device.type != "cpu" or sizes.numel() == 0):
        raise ValueError(f"{name} got a PackedSequence whose batch_sizes is not a non-empty 1-d "
                         f"int64 CPU tensor; {fix}")
    counts = sizes.tolist()
    if min(counts) < 1 or any(a < b for a, b in zip(counts, counts[1:])):
        raise ValueError(f"{name} got a PackedSequence whose batch_sizes {counts[:8]}"
                         f"{'...' if len(counts) > 8 else ''} are not positive and "
                         f"non-increasing; {fix}")
    if sum(counts) != data.shape[0]:
        raise ValueError(f"{name} got a PackedSequence whose batch_sizes sum to {sum(counts)} "
                         f"steps but whose data has {data.shape[0]} rows; {fix}")
    order, inverse = x.sorted_indices, x.unsorted_indices  # PackedSequence makes both or neither
    if order is not None:
        batch = counts[0]
        for label, index in (("sorted_indices", order), ("unsorted_indices", inverse)):
            if (not isinstance(index, Tensor) or index.dim() != 1 or index.dtype != torch.int64
                    or index.numel() != batch
                    or not torch.equal(index.sort().values.cpu(), torch.arange(batch))):
                raise ValueError(f"{name} got a PackedSequence whose {label} is not a "
                                 f"permutation of its {batch} sequences; {fix}")
        if not torch.equal(order[inverse], torch.arange(batch, device=order.device)):
            raise ValueError(f"{name} got a PackedSequence whose unsorted_indices do not undo "
                             f"its sorted_indices; {fix}")


def where_batch(mask: Tensor, new, old):
    """The state ``new`` for the sequences where ``mask`` ``[B]`` (bool) is set, else ``old``."""

    def pick(a: Tensor, b: Tensor, dim: int) -> Tensor:
        shape = [1] * a.dim()
        shape[dim] = -1
        return torch.where(mask.view(shape), a, b)

    controller = tuple(pick(a, b, 1) for a, b in zip(new[0], old[0]))
    return type(new)(controller, *(pick(a, b, 0) for a, b in zip(new[1:], old[1:])))


def forward_packed(x: PackedSequence, state: NamedTuple | None, run: Callable, *,
                   batch_first: bool, input_size: int, name: str
                   ) -> tuple[PackedSequence, NamedTuple]:
    """Runs ``run(padded, state) -> (outputs, state)`` on the padded batch of ``x`` in pieces that
    end where some sequence ends, and keeps each sequence's state from the piece that ended it.

    The batch keeps its size throughout (the steps past a sequence's end are computed and
    dropped), so the result equals running each sequence alone.

    Args:
        x: the packed input, steps of width ``input_size``.
        state: the state to start from (None: ``run``'s initial state), in the order of the
            sequences before packing.
        run: the model's forward on a padded tensor (``[T, B, I]``, or ``[B, T, I]`` if
            ``batch_first``), returning outputs in the same layout and the final state.
        batch_first: the layout ``run`` takes and returns.
        input_size: I, for the error message on a packed input of another width.
        name: the model's name, for that message.

    Returns:
        ``(outputs, state)``: the outputs packed exactly as ``x`` is (same ``batch_sizes`` and
        order), and the state after each sequence's own last step.
    """
    check_packed(x, name)
    padded, lengths = pad_packed_sequence(x)  # [T, B, I] in the order before packing
    if padded.dim() != 3 or padded.shape[2] != input_size:
        raise ValueError(f"{name} expects packed steps of width {input_size}, got "
                         f"{list(x.data.shape[1:])}")
    pieces, final, start = [], None, 0
    for end in sorted(set(lengths.tolist())):
        piece = padded[start:end]
        y, state = run(piece.transpose(0, 1) if batch_first else piece, state)
        pieces.append(y.transpose(0, 1) if batch_first else y)
        ended = (lengths == end).to(padded.device)
        final = state if final is None else where_batch(ended, state, final)
        start = end
    y = torch.cat(pieces)  # [T, B, O]
    order = x.sorted_indices
    if order is not None:
        y, lengths = y.index_select(1, order), lengths[order.cpu()]
    data = pack_padded_sequence(y, lengths, enforce_sorted=True).data
    return PackedSequence(data, x.batch_sizes, x.sorted_indices, x.unsorted_indices), final
