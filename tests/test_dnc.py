"""Tests of `torch_ntm.DNC`, `DNCCell` and `DNCState`: the NTM's module contract for the
Differentiable Neural Computer (shapes, explicit state, batch_first, PackedSequence, dtypes,
torch.export, trace, errors) and that it learns.

Sizes are unequal (input 5, output 3, batch 3, N 7, W 4, R 2) so that a swapped axis fails.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim
from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence

from torch_ntm import DNC, DNCCell, DNCState, DNCTrace
from torch_ntm import dnc_functional as D
from torch_ntm.layout import DNC_FIELDS, DNCLayout
from torch_ntm.metrics import masked_bce
from torch_ntm.tasks import CopyTask

IN, OUT, B, N, W, R = 5, 3, 3, 7, 4, 2
CONFIGS = {
    "lstm": {},
    "two write heads": {"write_heads": 2},
    "two layers": {"controller_layers": 2},
    "feedforward": {"controller": "feedforward"},
    "sparse": {"sparse_link": 2},
}


def make(cls=DNC, seed=0, dtype=torch.float64, **options):
    torch.manual_seed(seed)
    kwargs = dict(controller_size=10, memory_size=N, memory_width=W, read_heads=R)
    return cls(IN, OUT, dtype=dtype, **(kwargs | options))


def inputs(steps=6, batch=B, seed=1, dtype=torch.float64):
    return torch.rand(steps, batch, IN, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def assert_states_close(a: DNCState, b: DNCState, **tol):
    for (name, x), y in zip(a.tensors().items(), b.tensors().values()):
        torch.testing.assert_close(x, y, msg=name, **tol)


# --------------------------------------------------------------------------------------------
# Shapes and state
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_output_and_state_shapes(name):
    options = CONFIGS[name]
    dnc = make(**options)
    hw = options.get("write_heads", 1)
    y, state = dnc(inputs())
    assert y.shape == (6, B, OUT)
    assert isinstance(state, DNCState)
    assert state.memory.shape == (B, N, W)
    assert state.usage.shape == (B, N)
    assert state.link.shape == (B, hw, N, N)
    assert state.precedence.shape == (B, hw, N)
    assert state.read_weights.shape == (B, R, N)
    assert state.write_weights.shape == (B, hw, N)
    assert state.reads.shape == (B, R, W)
    layers = options.get("controller_layers", 1)
    want = [] if name == "feedforward" else [(layers, B, 10)] * 2
    assert [tuple(t.shape) for t in state.controller] == want


def test_the_interface_vector_is_split_in_the_papers_order():
    """Each field of the interface layer's output, read back from a raw vector 0, 1, 2, ...: the
    paper's order (read keys, read strengths, write key, write strength, erase, write vector, free
    gates, allocation gate, write gate, read modes), each field head after head."""
    r, hw, w = 2, 2, 3
    layout = DNCLayout(r, hw, w)
    # keys and strengths of both kinds, erase and write vectors, free, allocation and write gates
    assert layout.size == (r * w + r) + (hw * w + hw) + 2 * hw * w + r + 2 * hw + r * (2 * hw + 1)
    raw = torch.arange(layout.size, dtype=torch.float64).unsqueeze(0)
    xi = layout.activate(raw)
    at = 0

    def take(count):
        nonlocal at
        part = raw[0, at: at + count]
        at += count
        return part

    torch.testing.assert_close(xi.read_key[0], take(r * w).view(r, w))
    torch.testing.assert_close(xi.read_strength[0], 1 + torch.nn.functional.softplus(
        take(r).view(r, 1)))
    torch.testing.assert_close(xi.write_key[0], take(hw * w).view(hw, w))
    torch.testing.assert_close(xi.write_strength[0], 1 + torch.nn.functional.softplus(
        take(hw).view(hw, 1)))
    torch.testing.assert_close(xi.erase[0], torch.sigmoid(take(hw * w).view(hw, w)))
    torch.testing.assert_close(xi.write_vector[0], take(hw * w).view(hw, w))
    torch.testing.assert_close(xi.free_gate[0], torch.sigmoid(take(r)))
    torch.testing.assert_close(xi.allocation_gate[0], torch.sigmoid(take(hw).view(hw, 1)))
    torch.testing.assert_close(xi.write_gate[0], torch.sigmoid(take(hw).view(hw, 1)))
    torch.testing.assert_close(xi.read_mode[0], torch.softmax(take(r * (2 * hw + 1)).view(
        r, 2 * hw + 1), -1))
    assert at == layout.size
    assert [f.name for f in DNC_FIELDS] == list(xi._fields)


def test_the_paper_sized_interface_has_its_length():
    # the paper's one write head: W R + 3 W + 5 R + 3
    dnc = DNC(4, 4, memory_width=16, read_heads=4)
    assert dnc.head_params.out_features == 16 * 4 + 3 * 16 + 5 * 4 + 3


def test_a_step_is_the_functional_access_composed_in_the_papers_order():
    """The module's step against the access written out here from `dnc_functional`."""
    dnc = make(write_heads=2)
    cell = make(DNCCell, write_heads=2)
    x, s = inputs(steps=1)[0], None
    for _ in range(3):  # a few steps, so the state is not the initial one
        _, s = cell(torch.rand(B, IN, dtype=torch.float64), s)
    y, new = cell(x, s)
    h, ctrl = dnc.controller(torch.cat([x, s.reads.reshape(B, -1)], -1), s.controller)
    xi = dnc.head_layout.activate(dnc.head_params(h))
    u = D.usage(s.usage, s.write_weights, D.retention(xi.free_gate, s.read_weights))
    a = D.write_allocations(u, (xi.allocation_gate * xi.write_gate)[..., 0])
    ww = D.write_weights(a, D.content_weights(s.memory, xi.write_key, xi.write_strength),
                         xi.allocation_gate, xi.write_gate)
    memory = D.write(s.memory, ww, xi.erase, xi.write_vector)
    link = D.link(s.link, ww, s.precedence)
    f, b = D.directional_weights(link, s.read_weights)
    wr = D.read_weights(D.content_weights(memory, xi.read_key, xi.read_strength), f, b,
                        xi.read_mode)
    reads = D.read(memory, wr)
    want = DNCState(ctrl, memory, u, link, D.precedence(s.precedence, ww), wr, ww, reads)
    assert_states_close(new, want)
    torch.testing.assert_close(y, dnc.output(torch.cat([h, reads.reshape(B, -1)], -1)))


@pytest.mark.parametrize("name", ["lstm", "two write heads", "feedforward"])
def test_stepping_the_cell_equals_the_sequence_module(name):
    dnc, cell = make(**CONFIGS[name]), make(DNCCell, **CONFIGS[name])
    cell.load_state_dict(dnc.state_dict())
    x = inputs()
    y, state = dnc(x)
    s, ys = None, []
    for x_t in x:
        y_t, s = cell(x_t, s)
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys), y)
    assert_states_close(s, state)


def test_two_halves_with_carried_state_equal_one_pass():
    dnc = make(write_heads=2)
    x = inputs(steps=8)
    y, state = dnc(x)
    y1, s1 = dnc(x[:3])
    y2, s2 = dnc(x[3:], s1)
    torch.testing.assert_close(torch.cat([y1, y2]), y)
    assert_states_close(s2, state)


def test_batch_first_equals_time_major_transposed():
    dnc, dnc_bf = make(), make(batch_first=True)
    x = inputs()
    y, state = dnc(x)
    y_bf, state_bf = dnc_bf(x.transpose(0, 1))
    torch.testing.assert_close(y_bf, y.transpose(0, 1))
    assert_states_close(state_bf, state)


def test_the_state_maps_detaches_and_names_its_tensors():
    dnc = make()
    _, state = dnc(inputs())
    assert list(state.tensors()) == ["controller[0]", "controller[1]", "memory", "usage", "link",
                                     "precedence", "read_weights", "write_weights", "reads"]
    assert all(t.grad_fn is not None for t in state.tensors().values())
    assert all(t.grad_fn is None for t in state.detach().tensors().values())
    as32 = state.map(lambda t: t.float())
    assert all(t.dtype == torch.float32 for t in as32.tensors().values())


def test_the_initial_state_is_empty_memory_and_the_learned_parts():
    dnc = make()
    s = dnc.initial_state(4)
    for name in ("memory", "usage", "link", "precedence", "read_weights", "write_weights"):
        assert (getattr(s, name) == 0).all(), name
    torch.testing.assert_close(s.reads, dnc.reads0.expand(4, -1, -1))
    assert (dnc.reads0 == 0).all()  # the paper's r_0 = 0, learned from there
    assert s.controller[0].shape == (1, 4, 10)
    s32 = dnc.initial_state(2, dtype=torch.float32)
    assert all(t.dtype == torch.float32 for t in s32.tensors().values())


def test_the_module_holds_no_sequence_state():
    dnc = make()
    x = inputs()
    y1, _ = dnc(x)
    dnc(inputs(seed=5))
    y2, _ = dnc(x)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)


def test_a_state_dict_loads_into_a_larger_memory_and_runs():
    small, large = make(), make(memory_size=2 * N)
    large.load_state_dict(small.state_dict())
    y, state = large(inputs())
    assert state.link.shape[-1] == 2 * N and torch.isfinite(y).all()


# --------------------------------------------------------------------------------------------
# Packed sequences, dtypes, export
# --------------------------------------------------------------------------------------------

LENGTHS = [5, 2, 7, 2, 1]  # unsorted, with a tie


def _pick(state: DNCState, i: int) -> DNCState:
    return DNCState(tuple(t[:, i:i + 1] for t in state.controller),
                    *(t[i:i + 1] for t in state[1:]))


@pytest.mark.parametrize("batch_first", [False, True])
def test_packed_equals_each_sequence_alone_values_and_gradients(batch_first):
    dnc = make(write_heads=2, batch_first=batch_first)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.rand(n, IN, generator=g, dtype=torch.float64) for n in LENGTHS]
    packed = pack_sequence(seqs, enforce_sorted=False)
    y, state = dnc(packed)
    assert y.batch_sizes.tolist() == packed.batch_sizes.tolist()
    outputs, lengths = pad_packed_sequence(y)
    assert lengths.tolist() == LENGTHS
    loss = (y.data ** 2).sum() + sum((t * t).sum() for t in state.tensors().values())
    grads = torch.autograd.grad(loss, list(dnc.parameters()))
    expected_loss = 0.0
    for i, seq in enumerate(seqs):
        out, last = dnc(seq.unsqueeze(0 if batch_first else 1))
        out = out.squeeze(0 if batch_first else 1)
        torch.testing.assert_close(outputs[: LENGTHS[i], i], out)
        assert_states_close(_pick(state, i), last)
        expected_loss = expected_loss + (out ** 2).sum() + sum(
            (t * t).sum() for t in last.tensors().values())
    expected = torch.autograd.grad(expected_loss, list(dnc.parameters()))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)


def test_float32_and_float64_models_agree():
    d64 = make(write_heads=2)
    d32 = make(write_heads=2, dtype=torch.float32)
    d32.load_state_dict(d64.state_dict())
    x = inputs(steps=10)
    y64, s64 = d64(x)
    y32, s32 = d32(x.float())
    assert y32.dtype == torch.float32 and s32.link.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y64, rtol=1e-4, atol=1e-5)
    assert_states_close(s32.map(torch.Tensor.double), s64, rtol=1e-4, atol=1e-5)


def test_bfloat16_runs_and_stays_finite():
    dnc = make(dtype=torch.bfloat16)
    y, state = dnc(inputs(dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()


@pytest.mark.slow  # tracing the step under scan: 20-50 s on one core, so one configuration
def test_exported_dnc_is_the_eager_function_at_new_lengths():
    torch.compiler.reset()
    dnc = make(write_heads=2, sparse_link=3).eval()
    program = torch.export.export(dnc, (inputs(steps=4, batch=2),),
                                  dynamic_shapes={"x": {0: Dim("T")}})
    for steps in (9, 2):
        x = inputs(steps=steps, batch=2, seed=steps)
        got_y, got_state = program.module()(x)
        want_y, want_state = dnc(x)
        torch.testing.assert_close(got_y, want_y, rtol=1e-10, atol=1e-10)
        assert_states_close(DNCState(tuple(got_state[0]), *got_state[1:]), want_state,
                            rtol=1e-10, atol=1e-10)


def test_torch_jit_trace_is_refused_with_the_way_to_export():
    with pytest.raises(RuntimeError, match=r"torch.jit.trace .* use torch.export.export"):
        torch.jit.trace(DNC(4, 3), (torch.rand(5, 2, 4),))


# --------------------------------------------------------------------------------------------
# Gradients, trace, sparse link, engines
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lstm", "two write heads", "sparse"])
def test_every_parameter_gets_a_finite_nonzero_gradient(name):
    dnc = make(**CONFIGS[name])
    y, state = dnc(inputs(steps=8))
    (y.sum() + state.memory.sum()).backward()
    for pname, p in dnc.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


def test_gradients_are_finite_with_huge_inputs_and_a_full_memory():
    """Saturated gates (allocation with all usage ~1, one-hot weightings) stay NaN-free."""
    dnc = make(write_heads=2)
    with torch.no_grad():  # every gate ~1 and strength ~31 but the free gates ~0: nothing freed
        bias, start = dnc.head_params.bias, 0
        for name, (heads, width) in dnc.head_layout.fields.items():
            bias[start: start + heads * width] = -30.0 if name == "free_gate" else 30.0
            start += heads * width
    y, state = dnc(1e3 * inputs(steps=12))
    (y.sum() + state.usage.sum()).backward()
    assert torch.isfinite(y).all()
    assert all(torch.isfinite(p.grad).all() for p in dnc.parameters())
    assert (state.usage > 0.99).all()


@pytest.mark.parametrize("name", ["lstm", "two write heads"])
def test_trace_records_every_step_matches_forward_and_keeps_the_invariants(name):
    dnc = make(**CONFIGS[name])
    hw = CONFIGS[name].get("write_heads", 1)
    x = inputs(steps=9)
    y, state = dnc(x)
    y_t, state_t, trace = dnc.trace(x)
    assert isinstance(trace, DNCTrace)
    torch.testing.assert_close(y_t, y)
    assert_states_close(state_t, state)
    assert trace.link.shape == (9, B, hw, N, N)
    assert trace.read_modes.shape == (9, B, R, 2 * hw + 1)
    assert trace.free_gates.shape == (9, B, R) and trace.write_gates.shape == (9, B, hw)
    torch.testing.assert_close(trace.memory[-1], state.memory)
    torch.testing.assert_close(trace.link[-1], state.link)
    assert ((trace.usage >= 0) & (trace.usage <= 1)).all()
    assert (trace.link >= 0).all()
    assert (torch.diagonal(trace.link, dim1=-2, dim2=-1) == 0).all()
    for w in (trace.read_weights, trace.write_weights, trace.precedence, trace.allocation,
              trace.link, trace.link.transpose(-1, -2)):
        assert (w >= 0).all() and (w.sum(-1) <= 1 + 1e-12).all()


def test_sparse_link_with_k_equal_to_n_is_the_dense_model():
    """K = N keeps every entry: the stored link (N slots a row, other sums' order) is the exact
    model to float64 rounding."""
    dense, sparse = make(write_heads=2), make(write_heads=2, sparse_link=N)
    sparse.load_state_dict(dense.state_dict())
    x = inputs(steps=8)
    y, state = dense(x)
    y_s, state_s = sparse(x)
    torch.testing.assert_close(y_s, y, rtol=1e-12, atol=1e-14)
    assert_states_close(state_s, state, rtol=1e-12, atol=1e-14)


def dense_sparse_reference(dnc: DNC, x, state: DNCState):
    """The sparse DNC's sequence written out here from `dnc_functional`, its link kept dense
    (`sparse_link` on N x N matrices, `directional_weights`): what the module's loop, which
    stores the link K entries a row, must equal."""
    k, outputs = dnc.sparse_link, []
    ctrl, memory, usage, link, prec, w_read, w_write, reads = state
    for x_t in x:
        h, ctrl = dnc.controller(torch.cat([x_t, reads.flatten(1)], -1), ctrl)
        xi = dnc.head_layout.activate(dnc.head_params(h))
        usage = D.usage(usage, w_write, D.retention(xi.free_gate, w_read))
        content = D.content_weights(memory, xi.write_key, xi.write_strength)
        alloc = D.write_allocations(usage, (xi.allocation_gate * xi.write_gate)[..., 0])
        w_write = D.write_weights(alloc, content, xi.allocation_gate, xi.write_gate)
        memory = D.write(memory, w_write, xi.erase, xi.write_vector)
        link = D.sparse_link(link, w_write, prec, k)
        prec = D.precedence(prec, w_write)
        forward, backward = D.directional_weights(link, w_read)
        content = D.content_weights(memory, xi.read_key, xi.read_strength)
        w_read = D.read_weights(content, forward, backward, xi.read_mode)
        reads = D.read(memory, w_read)
        outputs.append(dnc.output(torch.cat([h, reads.flatten(1)], -1)))
    return torch.stack(outputs), DNCState(ctrl, memory, usage, link, prec, w_read, w_write, reads)


def with_sharp_writes(dnc: DNC) -> DNC:
    """``dnc`` with its allocation and write gates near 1 (their biases at 6): writes near
    one-hot on the free rows, so that links pass the sparse link's 1/K threshold."""
    start = 0
    with torch.no_grad():
        for name, (heads, width) in dnc.head_layout.fields.items():
            if name in ("allocation_gate", "write_gate"):
                dnc.head_params.bias[start : start + heads * width] = 6.0
            start += heads * width
    return dnc


@pytest.mark.parametrize("k", [2, 3, 5])
def test_the_stored_sparse_link_is_the_dense_sparse_link_with_its_gradients(k):
    """K < N: the module's loop (the link K entries a row) against the dense reference, values,
    final state and the gradients of the parameters and of the state passed in (its link too),
    continuing from a state with links in it."""
    dnc = with_sharp_writes(make(write_heads=2, sparse_link=k, memory_size=12))
    _, start = dnc(inputs(steps=9, seed=3))
    start = start.detach().map(lambda t: t.clone().requires_grad_())
    assert (start.link > 0).sum((-1, -2)).min() >= 4  # links to carry and convert
    x = inputs(steps=7)
    y, state = dnc(x, start)
    y_ref, state_ref = dense_sparse_reference(dnc, x, start)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-14)
    assert_states_close(state, state_ref, rtol=1e-12, atol=1e-14)
    params = list(dnc.parameters())
    wrt = params + list(start.tensors().values())

    g = torch.Generator().manual_seed(5)
    weights = [torch.rand(t.shape, generator=g, dtype=t.dtype)
               for t in (y, *state.tensors().values())]

    def grads(y, state):
        loss = sum((w * t).sum() for w, t in zip(weights, (y, *state.tensors().values())))
        return torch.autograd.grad(loss, wrt, allow_unused=True)

    for got, want in zip(grads(y, state), grads(y_ref, state_ref)):
        if want is None:
            assert got is None or not got.any()
        else:
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_the_stored_sparse_link_keeps_no_n_by_n_tensor_per_step():
    """What autograd saves for the backward, per step, grows linearly with N with the sparse
    link and with N^2 with the exact one (the point of the paper's approximation)."""
    def saved_per_step(n, **options):
        dnc = make(memory_size=n, engine="eager", **options)
        counts = []
        for steps in (2, 6):
            numel = [0]

            def pack(t):
                numel[0] += t.numel()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                dnc(inputs(steps=steps))
            counts.append(numel[0])
        return (counts[1] - counts[0]) / 4

    exact = saved_per_step(256) / saved_per_step(128)
    sparse = saved_per_step(256, sparse_link=2) / saved_per_step(128, sparse_link=2)
    assert exact > 3.5 and sparse < 2.2, (exact, sparse)


def test_a_sparse_link_keeps_at_most_k_entries_per_row_and_column():
    _, _, trace = make(sparse_link=2).trace(inputs(steps=10))
    nonzero = trace.link > 0
    assert nonzero.sum(-1).max() <= 2 and nonzero.sum(-2).max() <= 2


def test_auto_and_native_run_the_native_engine_as_the_eager_one():
    """The default engine is the native one (`tests/test_dnc_native.py` checks it to float64
    rounding); here, against the eager loop."""
    x = inputs()
    y, _ = make(engine="eager")(x)
    for engine in ("auto", "native"):
        dnc = make(engine=engine)
        assert dnc.runs_on(x) == "native"
        torch.testing.assert_close(dnc(x)[0], y, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown engine 'fast!'; valid choices: auto"):
        make(engine="fast!")


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def test_wrong_input_shapes_name_expected_and_actual():
    dnc = make()
    with pytest.raises(ValueError, match=r"shape \[time, batch, 5\], got \[6, 3, 4\]"):
        dnc(torch.rand(6, 3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="use DNCCell"):
        dnc(torch.rand(3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="length 0"):
        dnc(torch.rand(0, 3, 5, dtype=torch.float64))
    with pytest.raises(TypeError, match="PackedSequence"):
        dnc([1, 2])
    with pytest.raises(ValueError, match=r"DNCCell expects input of shape \[batch, 5\]"):
        make(DNCCell)(torch.rand(6, 3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="expects input of dtype torch.float64"):
        dnc(torch.rand(6, 3, 5))


def test_a_state_that_does_not_fit_is_named():
    dnc = make()
    _, state = dnc(inputs(batch=2))
    with pytest.raises(ValueError,
                       match=r"state.memory has shape \[2, 7, 4\], expected \[3, 7, 4\]"):
        dnc(inputs(batch=3), state)
    _, other = make(write_heads=2)(inputs())
    with pytest.raises(ValueError, match=r"state.link .* expected \[3, 1, 7, 7\]"):
        dnc(inputs(), other)
    _, ff = make(controller="feedforward")(inputs())
    with pytest.raises(ValueError,
                       match=r"state.controller must be \(h, c\), each of shape \[1, 3, 10\]"):
        dnc(inputs(), ff)
    with pytest.raises(TypeError, match="must be a DNCState"):
        dnc(inputs(), tuple(ff))
    _, ok = dnc(inputs())
    with pytest.raises(ValueError, match="state.usage has dtype torch.float32"):
        dnc(inputs(), ok._replace(usage=ok.usage.float()))


@pytest.mark.parametrize("bad, match", [
    ({"controller": "gru"}, "unknown controller 'gru'; valid choices: feedforward, lstm"),
    ({"memory_size": 0}, "memory_size must be an integer >= 1"),
    ({"write_heads": 0}, "write_heads must be an integer >= 1"),
    ({"read_heads": 1.5}, "read_heads must be an integer >= 1"),
    ({"sparse_link": 0}, "sparse_link .* must be an integer >= 1"),
])
def test_invalid_options_are_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        make(**bad)


def test_the_options_give_the_attributes_repr_and_config():
    dnc = make(write_heads=2, sparse_link=3, batch_first=True)
    assert dnc.memory_size == N and dnc.write_heads == 2 and dnc.controller_type == "lstm"
    assert "sparse_link=3" in repr(dnc) and "batch_first=True" in repr(dnc)
    rebuilt = DNC(**dnc.config(), dtype=torch.float64)
    rebuilt.load_state_dict(dnc.state_dict())
    torch.testing.assert_close(rebuilt(inputs())[0], dnc(inputs())[0])
    with pytest.raises(AttributeError, match="fixed when the module is built"):
        dnc.memory_size = 9


# --------------------------------------------------------------------------------------------
# Learning
# --------------------------------------------------------------------------------------------


def test_it_learns_a_short_copy_task_within_seconds():
    """60 Adam steps on copies of 2-3 four-bit vectors: the held-out loss falls well below the
    chance level (2.5 vectors x 4 bits x ln 2 = 6.9 nats), to ~4.7 in about a second."""
    torch.manual_seed(0)
    task = CopyTask(width=4, min_length=2, max_length=3)
    dnc = DNC(task.input_size, task.output_size, controller_size=32, memory_size=8,
              memory_width=8, read_heads=1)
    opt = torch.optim.Adam(dnc.parameters(), lr=1e-2)
    held = task.sample(64, generator=torch.Generator().manual_seed(7))

    def held_loss():
        with torch.no_grad():
            return masked_bce(dnc(held.inputs)[0], held.targets, held.mask).mean().item()

    before = held_loss()
    g = torch.Generator().manual_seed(100)
    for _ in range(60):
        x, y, mask = task.sample(16, generator=g)
        loss = masked_bce(dnc(x)[0], y, mask).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = held_loss()
    assert before > 6.5
    assert after < 0.8 * before, (before, after)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    cpu = make(write_heads=2, sparse_link=3)
    gpu = make(write_heads=2, sparse_link=3).cuda()
    x = inputs(steps=8)
    y, state = cpu(x)
    y_g, state_g = gpu(x.cuda())
    torch.testing.assert_close(y_g.cpu(), y)
    assert_states_close(state_g.map(torch.Tensor.cpu), state)
    (y_g.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in gpu.parameters())


def test_per_sample_gradients_by_vmap():
    """vmap(grad(...)) over the batch (the free list's sort and scatter included) equals each
    sequence's own backward."""
    from torch.func import functional_call, grad, vmap

    dnc = make(write_heads=2)
    x = inputs(steps=5)
    params = {k: p.detach() for k, p in dnc.named_parameters()}

    def loss(p, sequence):  # [T, IN]: a batch of one
        return functional_call(dnc, p, (sequence[:, None],))[0].square().sum()

    per_sample = vmap(grad(loss), in_dims=(None, 1))(params, x)
    for b in range(B):
        dnc.zero_grad()
        dnc(x[:, b : b + 1])[0].square().sum().backward()
        for name, p in dnc.named_parameters():
            torch.testing.assert_close(per_sample[name][b], p.grad, rtol=1e-10, atol=1e-12,
                                       msg=f"{name}, sequence {b}")


def test_forward_mode_ad_agrees_with_finite_differences():
    import torch.autograd.forward_ad as fwad
    from torch.func import functional_call

    dnc = make(write_heads=2)
    x, vx = inputs(), torch.randn(6, B, IN, dtype=torch.float64)
    weight = dnc.head_params.weight.detach()
    vw = torch.randn_like(weight)

    def output(x, weight):
        return functional_call(dnc, {"head_params.weight": weight}, (x,))[0]

    with fwad.dual_level():
        tangent = fwad.unpack_dual(output(fwad.make_dual(x, vx),
                                          fwad.make_dual(weight, vw))).tangent
    eps = 1e-6
    with torch.no_grad():
        central = (output(x + eps * vx, weight + eps * vw)
                   - output(x - eps * vx, weight - eps * vw)) / (2 * eps)
    torch.testing.assert_close(tangent, central, rtol=1e-6, atol=1e-8)


def test_the_module_guides_example_runs_with_the_shapes_it_states():
    import re
    from pathlib import Path

    guide = (Path(__file__).resolve().parent.parent / "docs" / "guide.md").read_text()
    example = re.search(r"## DNC\n.*?```python\n(.*?)```", guide, re.S).group(1)
    scope: dict = {"torch": torch}
    exec(compile(example, "docs/guide.md", "exec"), scope)
    assert tuple(scope["logits"].shape) == (41, 16, 8)
    assert isinstance(scope["state"], DNCState)


@pytest.mark.slow
def test_ntm_train_trains_a_dnc_that_evaluate_and_plot_read_back(tmp_path, capsys):
    # `--set model=dnc` through the whole harness: training (the validation cost falls),
    # its checkpoint evaluated and plotted from the run directory, and resumed.
    import json

    from torch_ntm.cli import main
    from torch_ntm.runlog import read_metrics

    run = tmp_path / "dnc"
    settings = ["--set", "model=dnc", "--set", "optimizer=adam", "--set", "lr=3e-3",
                "--set", "task.max_length=4", "--set", "eval_sizes=", "--set", "eval_every=25",
                "--set", "eval_sequences=64", "--set", "max_sequences=1200"]
    assert main(["train", "copy", "--out", str(run), *settings]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["model"] == "dnc" and config["model_params"]["sparse_link"] is None
    assert "shift_range" not in config["model_params"]  # the NTM's key: not a DNC's
    costs = [float(r["cost_bits"]) for r in read_metrics(run / "metrics.csv", "val")]
    assert len(costs) == 3 and costs[0] > costs[1] > costs[2] and costs[2] < 0.9 * costs[0]
    assert {p.name for p in (run / "figures").iterdir()} >= {
        "attention.png", "memory.png", "usage.png", "link.png", "read_modes.png"}
    capsys.readouterr()
    assert main(["evaluate", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)
    assert main(["train", "copy", "--resume", str(run), "--set", "max_sequences=1600"]) == 0
    assert len(read_metrics(run / "metrics.csv", "val")) == 4
