"""PackedSequence in and out, as nn.LSTM: the same as running each sequence alone."""

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence, pad_packed_sequence

from torch_ntm import NTM
from torch_ntm.model import NTMState

LENGTHS = [5, 2, 7, 2, 1]  # unsorted, with a tie: the order before packing must come back


def model(engine, **kwargs):
    torch.manual_seed(0)
    return NTM(4, 3, controller_size=6, memory_size=7, memory_width=5, read_heads=2,
               write_heads=1, engine=engine, dtype=torch.float64, **kwargs)


def sequences(lengths=LENGTHS):
    g = torch.Generator().manual_seed(1)
    return [torch.rand(n, 4, generator=g, dtype=torch.float64) for n in lengths]


def alone(ntm, seqs, states=None):
    """Each sequence on its own (batch 1): outputs [n, 3] and the final state."""
    results = []
    for i, seq in enumerate(seqs):
        state = None if states is None else _pick(states, i)
        y, last = ntm(seq.unsqueeze(0 if ntm.batch_first else 1), state)
        results.append((y.squeeze(0 if ntm.batch_first else 1), last))
    return results


def _pick(state: NTMState, i: int) -> NTMState:
    return NTMState(tuple(t[:, i:i + 1] for t in state.controller),
                    *(t[i:i + 1] for t in state[1:]))


@pytest.mark.parametrize("engine", ["eager", "auto"])
@pytest.mark.parametrize("controller", ["lstm", "feedforward"])
def test_packed_equals_each_sequence_alone_values_and_gradients(engine, controller):
    ntm = model(engine, controller=controller, controller_layers=2 if controller == "lstm" else 1)
    seqs = sequences()
    packed = pack_sequence(seqs, enforce_sorted=False)
    y, state = ntm(packed)
    assert y.batch_sizes.tolist() == packed.batch_sizes.tolist()
    assert torch.equal(y.sorted_indices, packed.sorted_indices)
    outputs, lengths = pad_packed_sequence(y)
    assert lengths.tolist() == LENGTHS
    # A loss of the packed outputs and of the final state: its gradient is the sum of those of
    # the same loss on each sequence alone.
    loss = (y.data ** 2).sum() + sum((t * t).sum() for t in (*state.controller, *state[1:]))
    grads = torch.autograd.grad(loss, list(ntm.parameters()))
    expected_loss = 0.0
    for i, (out, last) in enumerate(alone(ntm, seqs)):
        torch.testing.assert_close(outputs[: LENGTHS[i], i], out)
        for name, got, want in zip(NTMState._fields, _pick(state, i), last):
            for a, b in zip(got if name == "controller" else (got,),
                            want if name == "controller" else (want,)):
                torch.testing.assert_close(a, b, msg=name)
        expected_loss = expected_loss + (out ** 2).sum() + sum(
            (t * t).sum() for t in (*last.controller, *last[1:]))
    expected = torch.autograd.grad(expected_loss, list(ntm.parameters()))
    for (name, _), a, b in zip(ntm.named_parameters(), grads, expected):
        torch.testing.assert_close(a, b, msg=name)


def test_a_given_state_is_in_the_order_before_packing_and_batch_first_is_ignored():
    ntm = model("auto", batch_first=True)
    seqs = sequences()
    start = ntm(torch.rand(len(seqs), 3, 4, dtype=torch.float64))[1]  # a state worth continuing
    y, state = ntm(pack_sequence(seqs, enforce_sorted=False), start)
    outputs, _ = pad_packed_sequence(y, batch_first=True)
    for i, (out, last) in enumerate(alone(ntm, seqs, start)):
        torch.testing.assert_close(outputs[i, : LENGTHS[i]], out)
        torch.testing.assert_close(state.memory[i], last.memory[0])


def test_sorted_packing_and_one_length():
    ntm = model("eager")
    seqs = sequences([6, 4, 4])
    padded = torch.nn.utils.rnn.pad_sequence(seqs)
    y, state = ntm(pack_padded_sequence(padded, torch.tensor([6, 4, 4])))
    assert y.sorted_indices is None
    torch.testing.assert_close(pad_packed_sequence(y)[0][:4], ntm(padded)[0][:4])
    same = sequences([3, 3])
    y, state = ntm(pack_sequence(same))
    torch.testing.assert_close(pad_packed_sequence(y)[0], ntm(torch.stack(same, 1))[0])


def test_packed_input_of_the_wrong_width_or_to_trace_is_a_clear_error():
    ntm = model("auto")
    with pytest.raises(ValueError, match="packed steps of width 4, got \\[5\\]"):
        ntm(pack_sequence([torch.rand(3, 5, dtype=torch.float64)]))
    with pytest.raises(TypeError, match="pad_packed_sequence"):
        ntm.trace(pack_sequence(sequences()[:2], enforce_sorted=False))
    with pytest.raises(TypeError, match="or a PackedSequence, got list"):
        ntm([1, 2, 3])


@pytest.mark.parametrize("engine", ["eager", "auto"])
def test_a_mann_takes_packed_sequences_as_each_alone(engine):
    # The MANN runs over sequences as the NTM and the DNC do (`torch_ntm.sequence`): packed
    # outputs, final states and gradients are each sequence's alone, on the native engine too.
    from torch_ntm import MANN

    torch.manual_seed(0)
    mann = MANN(4, 3, controller_size=6, memory_size=7, memory_width=5, read_heads=2,
                learned_beta=True, engine=engine, dtype=torch.float64)
    seqs = sequences()
    packed = pack_sequence(seqs, enforce_sorted=False)
    if engine == "auto":
        assert mann.runs_on(packed.data.unsqueeze(1)) == "native"
    y, state = mann(packed)
    outputs, lengths = pad_packed_sequence(y)
    assert lengths.tolist() == LENGTHS
    loss = (y.data ** 2).sum() + (state.memory ** 2).sum()
    grads = torch.autograd.grad(loss, list(mann.parameters()))
    expected_loss = 0.0
    for i, seq in enumerate(seqs):
        out, last = mann(seq.unsqueeze(1))
        torch.testing.assert_close(outputs[: LENGTHS[i], i], out[:, 0])
        for name, got, want in zip(type(state)._fields[1:], state[1:], last[1:]):
            torch.testing.assert_close(got[i:i + 1], want, msg=name)
        for got, want in zip(state.controller, last.controller):
            torch.testing.assert_close(got[:, i:i + 1], want)
        expected_loss = expected_loss + (out ** 2).sum() + (last.memory ** 2).sum()
    expected = torch.autograd.grad(expected_loss, list(mann.parameters()))
    for (name, _), a, b in zip(mann.named_parameters(), grads, expected):
        torch.testing.assert_close(a, b, msg=name)


def _malformed():
    """Packed inputs that torch's unpacking trusts and reads out of bounds on (the first aborted
    the process with heap corruption), or that gave 8 rows for 6 (duplicate indices)."""
    from torch.nn.utils.rnn import PackedSequence

    ok = pack_sequence(sequences(), enforce_sorted=False)
    return {
        "a zero batch size": (PackedSequence(torch.rand(6, 4, dtype=torch.float64),
                                             torch.tensor([2, 0, 1, 1, 1, 1]), None, None),
                              "not positive and non-increasing"),
        "increasing batch sizes": (PackedSequence(torch.rand(6, 4, dtype=torch.float64),
                                                  torch.tensor([1, 2, 3]), None, None),
                                   "not positive and non-increasing"),
        "a row missing": (PackedSequence(ok.data[:-1], ok.batch_sizes, ok.sorted_indices,
                                         ok.unsorted_indices),
                          "sum to 17 steps but whose data has 16 rows"),
        "duplicate indices": (PackedSequence(ok.data, ok.batch_sizes,
                                             torch.tensor([2, 0, 0, 1, 3]), ok.unsorted_indices),
                              "sorted_indices is not a permutation of its 5 sequences"),
        "indices that do not undo each other": (
            PackedSequence(ok.data, ok.batch_sizes, ok.sorted_indices, torch.arange(5)),
            "unsorted_indices do not undo its sorted_indices"),
    }


@pytest.mark.parametrize("case", sorted(_malformed()))
def test_a_malformed_packed_sequence_is_refused_before_torch_reads_it(case):
    packed, message = _malformed()[case]
    with pytest.raises(ValueError, match=message):
        model("eager")(packed)
