"""The MANN's native engine (`torch_ntm.engines.mann`, csrc/mann.cpp) computes `MANN.forward` as
the eager loop does: outputs, final state and the gradients of every parameter, of the input and
of a state passed in, in float64 to ~1e-10, over the configurations of the head layer (add or key
written, beta learned or 1), one and several heads, batch 1 and 3, small and paper-sized memories;
with and without gradients; where usages tie and the least-used rows are chosen by index."""

from __future__ import annotations

import pytest
import torch

from torch_ntm import MANN, MANNState
from torch_ntm import functional as F
from torch_ntm.engines import library

pytestmark = pytest.mark.skipif(
    not (library.available("mann", torch.float32) and library.available("mann",
                                                                            torch.float64)),
    reason=f"native library not built: {library.error('mann', torch.float64)}")

IN, OUT = 6, 4
TOL = {"rtol": 1e-10, "atol": 1e-12}


def build(seed: int = 0, *, dtype=torch.float64, **options) -> MANN:
    torch.manual_seed(seed)
    options = {"controller_size": 8, "memory_size": 7, "memory_width": 5, "read_heads": 2,
               **options}
    return MANN(IN, OUT, dtype=dtype, **options)


def rand(*shape, seed: int = 1, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def leaf_state(state: MANNState) -> MANNState:
    """``state`` cut from its graph, every tensor a leaf that requires a gradient."""
    return state.map(lambda t: t.detach().clone().requires_grad_())


def leaves(state: MANNState) -> list[torch.Tensor]:
    return list(state.tensors().values())


def loss_of(y: torch.Tensor, state: MANNState) -> torch.Tensor:
    """Every output and state tensor with its own weights, so that no gradient is left out; the
    same weight for each memory row (the same loss for a state with rows swapped, `by_usage`)."""
    total = (y * rand(*y.shape, seed=7)).sum()
    for i, (name, t) in enumerate(state.tensors().items()):
        if name == "least_used":  # a step function of the usage: no gradient
            continue
        if name in ("memory", "usage", "read_weights"):  # rows: dim 1, 1 and 2
            shape = list(t.shape)
            shape[2 if name == "read_weights" else 1] = 1
            total = total + (t.square() * rand(*shape, seed=20 + i)).sum()
        else:
            total = total + (t * rand(*t.shape, seed=20 + i)).sum()
    return total


def run(mann: MANN, engine: str, x: torch.Tensor, state: MANNState | None = None):
    """Outputs, final state, and the gradients of the parameters, of x and of the state."""
    mann.engine = engine
    x = x.detach().clone().requires_grad_()
    given = None if state is None else leaf_state(state)
    y, final = mann(x, given)
    wrt = [*mann.parameters(), x, *([] if given is None else leaves(given))]
    grads = torch.autograd.grad(loss_of(y, final), wrt, allow_unused=True)
    return y.detach(), final.detach(), grads


def assert_states_close(a: MANNState, b: MANNState, **tol) -> None:
    for (name, x), y in zip(a.tensors().items(), b.tensors().values()):
        torch.testing.assert_close(x, y, **tol, msg=lambda s, n=name: f"{n}: {s}")


def by_usage(state: MANNState) -> MANNState:
    """``state`` with its memory rows in the order of their usage.

    The eager loop's float rounding can break a tie between rows that are equal in exact
    arithmetic (rows never written: their similarities come out of a batched matmul whose
    rounding depends on the row's place in it), where the native engine keeps them equal and
    takes the lowest row, as `functional.least_used` says. Such rows hold the same values, so
    either choice gives the same outputs and parameter gradients, and the same state but for the
    order of those rows: states from a fresh start are compared in this order."""
    order = state.usage.argsort(dim=-1, stable=True)  # [B, N]
    rows = order[..., None].expand(-1, -1, state.memory.shape[-1])
    heads = order[:, None].expand(-1, state.read_weights.shape[1], -1)
    return state._replace(memory=state.memory.gather(1, rows), usage=state.usage.gather(1, order),
                          read_weights=state.read_weights.gather(2, heads),
                          least_used=state.least_used.gather(1, order))


def assert_same(got, expected, exact_state: bool = True, **tol) -> None:
    (y, state, grads), (y_e, state_e, grads_e) = got, expected
    torch.testing.assert_close(y, y_e, **tol)
    if exact_state:
        assert_states_close(state, state_e, **tol)
    else:
        assert_states_close(by_usage(state), by_usage(state_e), **tol)
    assert [g is None for g in grads] == [g is None for g in grads_e]
    for i, (g, g_e) in enumerate(zip(grads, grads_e)):
        if g_e is not None:
            torch.testing.assert_close(g, g_e, **tol, msg=lambda s, i=i: f"gradient {i}: {s}")


CONFIGS = [
    # write_vector, learned_beta, read_heads, batch, memory_size, seed
    ("add", False, 2, 3, 7, 0),
    ("key", False, 1, 3, 7, 1),
    ("add", True, 4, 1, 7, 2),
    ("key", True, 4, 3, 128, 3),
    ("add", False, 1, 1, 128, 4),
    ("add", True, 4, 3, 128, 5),
    ("add", True, 2, 2, 40, 6),  # 2 and 3 heads; rows that end in a part of a vector block
    ("key", False, 3, 2, 40, 7),
]


def random_state(mann: MANN, batch: int, seed: int) -> MANNState:
    """A state with no two rows alike (random memory and usage, softmax read weightings)."""
    n, m, h, c = mann.memory_size, mann.memory_width, mann.read_heads, mann.controller_size
    usage = rand(batch, n, seed=seed).abs()
    return MANNState((0.3 * rand(1, batch, c, seed=seed + 1), rand(1, batch, c, seed=seed + 2)),
                     rand(batch, n, m, seed=seed + 3),
                     usage, torch.softmax(2 * rand(batch, h, n, seed=seed + 4), -1),
                     F.least_used(usage, h), 0.5 * rand(batch, h, m, seed=seed + 5))


@pytest.mark.parametrize("vector,beta,heads,batch,rows,seed", CONFIGS)
def test_equals_the_eager_loop(vector, beta, heads, batch, rows, seed):
    """From a fresh state (usages tie: the first writes go to rows 0..H-1, the first zeroed row
    is row 0; the final state compared `by_usage`) and from a state passed in: values and the
    gradients of every parameter, of the input and of each tensor of the state."""
    mann = build(seed, write_vector=vector, learned_beta=beta, read_heads=heads,
                 memory_size=rows, usage_decay=0.9)
    x = rand(9, batch, IN, seed=seed + 10)
    assert_same(run(mann, "native", x), run(mann, "eager", x), exact_state=False, **TOL)
    state = random_state(mann, batch, seed + 30)
    assert_same(run(mann, "native", x, state), run(mann, "eager", x, state), **TOL)


def test_more_heads_than_the_register_blocked_kernels():
    """Five heads take the kernels' general path (the state compared `by_usage`)."""
    mann = build(6, read_heads=5, memory_size=20, learned_beta=True)
    x = rand(6, 3, IN, seed=16)
    (y, state, grads), (y_e, state_e, grads_e) = run(mann, "native", x), run(mann, "eager", x)
    torch.testing.assert_close(y, y_e, **TOL)
    for g, g_e in zip(grads, grads_e):
        torch.testing.assert_close(g, g_e, **TOL)
    assert_states_close(by_usage(state), by_usage(state_e), **TOL)


def test_least_used_ties_and_the_zeroed_row():
    """Usages with ties, and a NaN-free exact rule: the H rows of a stable sort (lower rows
    first among equal usages), the zeroed row the first minimum."""
    mann = build(7, read_heads=3, memory_size=9)
    state = mann.initial_state(4)
    usage = torch.tensor([[0.5, 0.1, 0.1, 0.3, 0.1, 0.2, 0.1, 0.9, 0.0],
                          [0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2],
                          [0.3, 0.3, 0.1, 0.4, 0.1, 0.3, 0.5, 0.0, 0.0],
                          [0.0] * 9], dtype=torch.float64)
    state = state._replace(usage=usage, memory=rand(4, 9, 5, seed=8))
    x = rand(3, 4, IN, seed=9)
    mann.engine = "eager"
    y_e, s_e = mann(x[:1], state)
    mann.engine = "native"
    y, s = mann(x[:1], state)
    torch.testing.assert_close(y, y_e, **TOL)
    assert_states_close(s.detach(), s_e.detach(), **TOL)
    # the rows written: the least-used ones passed in (all rows of the read weightings, which
    # are zero); the zeroed row: the first minimum, which keeps none of its old value
    for b, row in enumerate([8, 0, 7, 0]):
        kept = state.memory[b, row] * 0  # zeroed, then written
        written = s.memory[b, row] - kept
        torch.testing.assert_close(written, s_e.memory[b, row].detach(), **TOL)
    with torch.no_grad():  # and over more steps, the least-used rows as the eager loop's
        mann.engine = "eager"
        _, s_e = mann(x, state)
        mann.engine = "native"
        _, s = mann(x, state)
    assert torch.equal(s.least_used, s_e.least_used)


def test_carried_state_batch_first_and_no_grad():
    mann = build(8, read_heads=3, memory_size=10)
    x = rand(8, 3, IN, seed=18)
    mann.engine = "eager"
    with torch.no_grad():
        y_e, s_e = mann(x)
    mann.engine = "native"
    y_a, s_a = mann(x[:5])
    y_b, s_b = mann(x[5:], s_a)  # a state carried over two calls, in the graph
    torch.testing.assert_close(torch.cat([y_a, y_b]).detach(), y_e, **TOL)
    assert_states_close(s_b.detach(), s_e, **TOL)
    (y_b.sum() + s_b.memory.sum()).backward()  # through both calls
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in mann.parameters())
    with torch.no_grad():  # the inference path: two slots of state, odd and even lengths
        for steps in (7, 8):
            y_n, s_n = mann(x[:steps])
            mann.engine = "eager"
            y_r, s_r = mann(x[:steps])
            mann.engine = "native"
            torch.testing.assert_close(y_n, y_r, **TOL)
            assert_states_close(s_n, s_r, **TOL)
    first = build(8, read_heads=3, memory_size=10, batch_first=True)
    first.engine = "native"
    y_f, s_f = first(x.transpose(0, 1).contiguous())
    torch.testing.assert_close(y_f.transpose(0, 1).detach(), y_e, **TOL)
    assert_states_close(s_f.detach(), s_e, **TOL)
    assert "engine='native'" in repr(mann)


def test_float32_is_close_to_float64():
    m64 = build(9, read_heads=4, memory_size=32, learned_beta=True)
    m32 = build(9, read_heads=4, memory_size=32, learned_beta=True, dtype=torch.float32)
    m32.load_state_dict({k: v.float() for k, v in m64.state_dict().items()})
    x = rand(10, 3, IN, seed=19)
    state = random_state(m64, 3, 40)
    y64, s64, g64 = run(m64, "native", x, state)
    y32, s32, g32 = run(m32, "native", x.float(), state.map(lambda t: t.float()))
    torch.testing.assert_close(y32, y64.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s32.memory, s64.memory.float(), rtol=1e-4, atol=1e-5)
    for g, g_e in zip(g32, g64):
        if g_e is not None:  # (the learned initial h, c: unused with a state given)
            torch.testing.assert_close(g, g_e.float(), rtol=1e-3, atol=1e-4)


def test_gradcheck_tiny():
    """gradcheck of the input, the memory and reads passed in, and three weights (not the usage:
    a perturbation of tied usages changes the rows chosen)."""
    mann = build(10, controller_size=3, memory_size=4, memory_width=2, read_heads=2,
                 learned_beta=True)
    mann.engine = "native"
    state = mann.initial_state(2)
    names = ["head_params.weight", "output.weight", "controller.cells.0.weight_ih"]
    params = dict(mann.named_parameters())

    def f(x, memory, reads, *weights):
        s = state._replace(memory=memory, reads=reads)
        out, final = torch.func.functional_call(mann, dict(zip(names, weights)), (x, s))
        return out, final.memory, final.usage, final.read_weights

    inputs = (rand(3, 2, IN, seed=21).requires_grad_(), rand(2, 4, 2, seed=22).requires_grad_(),
              rand(2, 2, 2, seed=23).requires_grad_(),
              *(params[n].detach().clone().requires_grad_() for n in names))
    assert torch.autograd.gradcheck(f, inputs)


def test_zero_keys_and_inputs_give_finite_gradients():
    """Keys of exactly zero (the head layer zeroed: the cosine's norms rest on EPS alone) and a
    zero input: values and gradients finite, and as the eager loop's."""
    mann = build(11, read_heads=4, memory_size=16, write_vector="key")
    with torch.no_grad():
        mann.head_params.weight.zero_()
        mann.head_params.bias.zero_()
    x = torch.zeros(5, 3, IN, dtype=torch.float64)
    got, expected = run(mann, "native", x), run(mann, "eager", x)
    assert all(g is None or torch.isfinite(g).all() for g in got[2])
    assert_same(got, expected, **TOL)


def test_torch_func_runs_the_eager_loop():
    mann = build(12)
    mann.engine = "native"
    x = rand(4, 2, IN, seed=24)
    params = {k: p.detach() for k, p in mann.named_parameters()}

    def loss(p):
        return torch.func.functional_call(mann, p, (x,))[0].square().sum()

    grads = torch.func.grad(loss)(params)
    mann(x)[0].square().sum().backward()
    for name, p in mann.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, **TOL, msg=name)


def test_paper_sized_memory():
    """128 x 40 memory, 4 heads, 50 units: outputs and gradients of every parameter (the state
    compared `by_usage`)."""
    mann = build(13, controller_size=50, memory_size=128, memory_width=40, read_heads=4)
    x = rand(12, 4, IN, seed=25)
    (y, state, grads), (y_e, state_e, grads_e) = run(mann, "native", x), run(mann, "eager", x)
    torch.testing.assert_close(y, y_e, **TOL)
    for g, g_e in zip(grads, grads_e):
        torch.testing.assert_close(g, g_e, **TOL)
    assert_states_close(by_usage(state), by_usage(state_e), **TOL)


def test_native_engine_is_what_runs(monkeypatch):
    """The tests above compare the native engine, not the eager loop run twice: where the
    library runs (grad mode or not), `MANN.forward` calls it; under torch.func it does not."""
    from torch_ntm.engines import mann as native

    def refuse(*args):
        raise RuntimeError("native engine called")

    monkeypatch.setattr(native, "forward", refuse)
    mann = build(14)
    mann.engine = "native"
    x = rand(3, 2, IN, seed=26)
    with pytest.raises(RuntimeError, match="native engine called"):
        mann(x)
    with torch.no_grad(), pytest.raises(RuntimeError, match="native engine called"):
        mann(x)
    mann.engine = "eager"
    mann(x)


def test_second_derivatives_equal_the_eager_engines():
    """Under create_graph=True the native backward is computed again through the eager step:
    double backward and a gradient penalty on the parameters equal the eager loop's. A state
    with distinct usages, so that both pick the same least-used rows."""
    mann = build(30, learned_beta=True)
    x0 = rand(3, 2, IN, seed=31)
    start = mann.initial_state(2)
    start = start._replace(usage=rand(2, 7, seed=32), memory=rand(2, 7, 5, seed=33))
    start = start._replace(least_used=F.least_used(start.usage, 2))
    results = []
    for engine in ("native", "eager"):
        mann.engine = engine
        mann.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        (grad,) = torch.autograd.grad(mann(x, start)[0].pow(2).sum(), x, create_graph=True)
        (double,) = torch.autograd.grad(grad.sum(), x)
        x = x0.clone().requires_grad_()
        (grad,) = torch.autograd.grad(mann(x, start)[0].sum(), x, create_graph=True)
        grad.pow(2).sum().backward()
        results.append((double, {n: p.grad for n, p in mann.named_parameters()
                                 if p.grad is not None}))
    (double, penalty), (double_e, penalty_e) = results
    torch.testing.assert_close(double, double_e, **TOL)
    assert penalty.keys() == penalty_e.keys() and penalty
    for name in penalty_e:
        torch.testing.assert_close(penalty[name], penalty_e[name], **TOL, msg=name)
