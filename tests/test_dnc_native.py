"""The DNC's native engine (`torch_ntm.engines.dnc`, csrc/dnc.cpp) computes `DNC.forward` as the
eager loop does: outputs, final state and the gradients of every parameter, of the input and of a
state passed in, in float64 to ~1e-10, over one to five read heads, batch 1 and 3, memories of 1
to 64 rows; with and without gradients; from an empty memory (all usages tie) and from a state
with a full memory; and the models it does not serve run on the eager loop, saying why."""

from __future__ import annotations

import logging

import pytest
import torch

from torch_ntm import DNC, DNCState, engines
from torch_ntm.engines import library

pytestmark = pytest.mark.skipif(
    not (library.available("dnc", torch.float32) and library.available("dnc", torch.float64)),
    reason=f"native library not built: {library.error('dnc', torch.float64)}")

IN, OUT = 6, 4
TOL = {"rtol": 1e-10, "atol": 1e-12}


def build(seed: int = 0, *, dtype=torch.float64, **options) -> DNC:
    torch.manual_seed(seed)
    options = {"controller_size": 8, "memory_size": 7, "memory_width": 5, "read_heads": 2,
               **options}
    return DNC(IN, OUT, dtype=dtype, **options)


def rand(*shape, seed: int = 1, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def weighting(*shape, seed: int, total: float = 0.9) -> torch.Tensor:
    """Non-negative rows summing to ``total`` (a weighting of the paper's Delta_N)."""
    return total * torch.softmax(2 * rand(*shape, seed=seed), -1)


def random_state(dnc: DNC, batch: int, seed: int) -> DNCState:
    """A state in the ranges the DNC keeps: usage in (0, 1), weightings summing to < 1, a link
    matrix with a zero diagonal whose rows and columns sum to < 1, random memory and reads."""
    n, w, r, c = dnc.memory_size, dnc.memory_width, dnc.read_heads, dnc.controller_size
    link = weighting(batch, 1, n, n, seed=seed + 6, total=0.45)
    link = (link + link.transpose(-1, -2) * 0.5) * (1 - torch.eye(n, dtype=link.dtype))
    return DNCState((0.3 * rand(1, batch, c, seed=seed + 1), rand(1, batch, c, seed=seed + 2)),
                    rand(batch, n, w, seed=seed + 3), torch.rand(
                        batch, n, generator=torch.Generator().manual_seed(seed + 4),
                        dtype=torch.float64),
                    link, weighting(batch, 1, n, seed=seed + 7),
                    weighting(batch, r, n, seed=seed + 8), weighting(batch, 1, n, seed=seed + 9),
                    0.5 * rand(batch, r, w, seed=seed + 5))


def leaf_state(state: DNCState) -> DNCState:
    """``state`` cut from its graph, every tensor a leaf that requires a gradient."""
    return state.map(lambda t: t.detach().clone().requires_grad_())


def loss_of(y: torch.Tensor, state: DNCState) -> torch.Tensor:
    """Every output and state tensor with its own weights, so that no gradient is left out."""
    total = (y * rand(*y.shape, seed=7)).sum()
    for i, t in enumerate((*state.controller, *state[1:])):
        total = total + (t * rand(*t.shape, seed=20 + i)).sum()
    return total


def run(dnc: DNC, engine: str, x: torch.Tensor, state: DNCState | None = None,
        fresh: bool = False):
    """Outputs, final state, and the gradients of the parameters, of x and of the state (with
    ``fresh``, of a loss that sees the final state `by_usage`, whatever the order of rows that
    tie)."""
    dnc.engine = engine
    assert dnc.runs_on(x) == engine
    x = x.detach().clone().requires_grad_()
    given = None if state is None else leaf_state(state)
    y, final = dnc(x, given)
    wrt = [*dnc.parameters(), x, *([] if given is None else [*given.controller, *given[1:]])]
    loss = loss_of(y, by_usage(final) if fresh else final)
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    return y.detach(), final.detach(), grads


def by_usage(state: DNCState) -> DNCState:
    """``state`` with its memory rows in the order of their usage (and the link matrix's rows
    and columns, and every weighting's entries, with them).

    Rows that are equal in exact arithmetic (never written) come out of a batched matmul with
    roundings that depend on their place in it and on the CPU's vector width, so one engine can
    allocate the row that the other sees as tied with it, or as just ahead. Such rows hold the
    same values: either choice gives the same outputs and parameter gradients, and the same
    state but for the order of those rows. States from a fresh start are compared in this
    order."""
    order = state.usage.argsort(dim=-1, stable=True)  # [B, N]

    def rows(t: torch.Tensor) -> torch.Tensor:  # [B, ..., N] along its last dimension
        index = order.view(order.shape[0], *([1] * (t.dim() - 2)), -1).expand_as(t)
        return t.gather(-1, index)

    link = rows(rows(state.link).transpose(-1, -2)).transpose(-1, -2)
    return state._replace(memory=rows(state.memory.transpose(1, 2)).transpose(1, 2),
                          usage=rows(state.usage), link=link, precedence=rows(state.precedence),
                          read_weights=rows(state.read_weights),
                          write_weights=rows(state.write_weights))


def assert_same(got, expected, exact_state: bool = True, **tol) -> None:
    (y, state, grads), (y_e, state_e, grads_e) = got, expected
    if not exact_state:
        state, state_e = by_usage(state), by_usage(state_e)
    torch.testing.assert_close(y, y_e, **tol)
    for name, a, b in zip(("h", "c"), state.controller, state_e.controller):
        torch.testing.assert_close(a, b, **tol, msg=lambda s, n=name: f"{n}: {s}")
    for name, a, b in zip(DNCState._fields[1:], state[1:], state_e[1:]):
        torch.testing.assert_close(a, b, **tol, msg=lambda s, n=name: f"{n}: {s}")
    assert [g is None for g in grads] == [g is None for g in grads_e]
    for i, (g, g_e) in enumerate(zip(grads, grads_e)):
        if g_e is not None:
            torch.testing.assert_close(g, g_e, **tol, msg=lambda s, i=i: f"gradient {i}: {s}")


CONFIGS = [
    # read_heads, batch, memory_size, memory_width, seed
    (2, 3, 7, 5, 0),
    (1, 3, 7, 5, 1),
    (4, 1, 16, 16, 2),
    (4, 3, 64, 32, 3),
    (5, 2, 9, 3, 4),
    (3, 2, 1, 4, 5),  # one row: the link matrix is its zero diagonal
    (2, 1, 2, 1, 6),
]


@pytest.mark.parametrize("heads,batch,rows,width,seed", CONFIGS)
def test_equals_the_eager_loop(heads, batch, rows, width, seed):
    """From the empty initial state (every usage ties: the free list in row order; the final
    state compared `by_usage`) and from a state passed in: values and the gradients of every
    parameter, of the input and of each tensor of the state."""
    dnc = build(seed, read_heads=heads, memory_size=rows, memory_width=width)
    x = rand(9, batch, IN, seed=seed + 10)
    assert_same(run(dnc, "native", x, fresh=True), run(dnc, "eager", x, fresh=True),
                exact_state=False, **TOL)
    state = random_state(dnc, batch, seed + 30)
    assert_same(run(dnc, "native", x, state), run(dnc, "eager", x, state), **TOL)


def test_a_full_memory_and_tied_usages_allocate_as_the_eager_loop():
    """Usages of exactly 1 (nothing to allocate: a = 0) and exact ties (the stable sort's row
    order): values and gradients as the eager loop's, all finite."""
    dnc = build(7, read_heads=2, memory_size=6)
    state = random_state(dnc, 3, 40)
    usage = torch.tensor([[1.0] * 6, [0.5, 0.2, 0.2, 0.5, 0.0, 0.0], [0.3] * 6],
                         dtype=torch.float64)
    state = state._replace(usage=usage, write_weights=torch.zeros_like(state.write_weights))
    x = rand(4, 3, IN, seed=41)
    got, expected = run(dnc, "native", x, state), run(dnc, "eager", x, state)
    assert all(g is None or torch.isfinite(g).all() for g in got[2])
    assert_same(got, expected, **TOL)


def test_zero_keys_empty_memory_and_zero_inputs_give_finite_gradients():
    """The interface layer zeroed (keys of exactly zero: the cosines rest on EPS alone) over an
    empty memory and a zero input: values and gradients finite, and as the eager loop's."""
    dnc = build(11, read_heads=4, memory_size=16)
    with torch.no_grad():
        dnc.head_params.weight.zero_()
        dnc.head_params.bias.zero_()
    x = torch.zeros(5, 3, IN, dtype=torch.float64)
    got, expected = run(dnc, "native", x), run(dnc, "eager", x)
    assert all(g is None or torch.isfinite(g).all() for g in got[2])
    assert_same(got, expected, **TOL)


def test_carried_state_batch_first_and_no_grad():
    dnc = build(8, read_heads=3, memory_size=10)
    x = rand(8, 3, IN, seed=18)
    dnc.engine = "eager"
    with torch.no_grad():
        y_e, s_e = dnc(x)
    dnc.engine = "native"
    y_a, s_a = dnc(x[:5])
    y_b, s_b = dnc(x[5:], s_a)  # a state carried over two calls, in the graph
    torch.testing.assert_close(torch.cat([y_a, y_b]).detach(), y_e, **TOL)
    for a, b in zip(s_b.detach()[1:], s_e[1:]):
        torch.testing.assert_close(a, b, **TOL)
    (y_b.sum() + s_b.memory.sum() + s_b.link.sum()).backward()  # through both calls
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in dnc.parameters())
    with torch.no_grad():  # the inference path: two slots of state, odd and even lengths
        for steps in (7, 8):
            y_n, s_n = dnc(x[:steps])
            dnc.engine = "eager"
            y_r, s_r = dnc(x[:steps])
            dnc.engine = "native"
            torch.testing.assert_close(y_n, y_r, **TOL)
            for a, b in zip((*s_n.controller, *s_n[1:]), (*s_r.controller, *s_r[1:])):
                torch.testing.assert_close(a, b, **TOL)
    first = build(8, read_heads=3, memory_size=10, batch_first=True)
    assert first.runs_on(x) == "native"  # the default, "auto"
    y_f, s_f = first(x.transpose(0, 1).contiguous())
    torch.testing.assert_close(y_f.transpose(0, 1).detach(), y_e, **TOL)
    torch.testing.assert_close(s_f.memory.detach(), s_e.memory, **TOL)


def test_float32_is_close_to_float64():
    m64 = build(9, read_heads=4, memory_size=32, memory_width=16)
    m32 = build(9, read_heads=4, memory_size=32, memory_width=16, dtype=torch.float32)
    m32.load_state_dict({k: v.float() for k, v in m64.state_dict().items()})
    x = rand(10, 3, IN, seed=19)
    state = random_state(m64, 3, 50)
    y64, s64, g64 = run(m64, "native", x, state)
    y32, s32, g32 = run(m32, "native", x.float(), state.map(lambda t: t.float()))
    torch.testing.assert_close(y32, y64.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s32.link, s64.link.float(), rtol=1e-4, atol=1e-5)
    for g, g_e in zip(g32, g64):
        if g_e is not None:  # (the learned initial h, c: unused with a state given)
            torch.testing.assert_close(g, g_e.float(), rtol=1e-3, atol=1e-4)


def test_gradcheck_tiny():
    """gradcheck of the input, every tensor of a state passed in (usages apart, so that a
    perturbation does not reorder the free list) and three weights."""
    dnc = build(10, controller_size=3, memory_size=4, memory_width=2, read_heads=2)
    dnc.engine = "native"
    start = random_state(dnc, 2, 60)
    names = ["head_params.weight", "output.weight", "controller.cells.0.weight_ih"]
    params = dict(dnc.named_parameters())

    def f(x, memory, link, precedence, read_weights, write_weights, reads, *weights):
        s = start._replace(memory=memory, link=link, precedence=precedence,
                           read_weights=read_weights, write_weights=write_weights, reads=reads)
        out, final = torch.func.functional_call(dnc, dict(zip(names, weights)), (x, s))
        return out, final.memory, final.usage, final.link, final.read_weights

    state = [getattr(start, n).clone().requires_grad_() for n in (
        "memory", "link", "precedence", "read_weights", "write_weights", "reads")]
    inputs = (rand(3, 2, IN, seed=21).requires_grad_(), *state,
              *(params[n].detach().clone().requires_grad_() for n in names))
    assert torch.autograd.gradcheck(f, inputs)


def test_native_engine_is_what_runs(monkeypatch):
    """The tests above compare the native engine, not the eager loop run twice: where the
    library runs (grad mode or not), `DNC.forward` calls it."""
    from torch_ntm.engines import dnc as native

    def refuse(*args):
        raise RuntimeError("native engine called")

    monkeypatch.setattr(native, "forward", refuse)
    dnc = build(14)
    x = rand(3, 2, IN, seed=26)
    for engine in ("auto", "native"):
        dnc.engine = engine
        with pytest.raises(RuntimeError, match="native engine called"):
            dnc(x)
        with torch.no_grad(), pytest.raises(RuntimeError, match="native engine called"):
            dnc(x)
    dnc.engine = "eager"
    dnc(x)


@pytest.mark.parametrize("options,why", [
    ({"controller": "feedforward"}, "one-layer LSTM controller, not 1 feedforward"),
    ({"controller_layers": 2}, "one-layer LSTM controller, not 2 lstm"),
    ({"write_heads": 2}, "one write head, not 2"),
    ({"sparse_link": 3}, "the exact link matrix, not sparse_link"),
])
def test_the_models_it_does_not_serve_run_eager_saying_why(options, why, caplog, monkeypatch):
    monkeypatch.setattr(engines.common, "_SAID", set())  # said once per process: maybe said before
    dnc = build(15, **options)
    x = rand(4, 2, IN, seed=27)
    assert dnc.runs_on(x) == "eager"
    with caplog.at_level(logging.WARNING, logger="torch_ntm.engines"):
        y, _ = dnc(x)
    dnc.engine = "eager"
    torch.testing.assert_close(y, dnc(x)[0], rtol=0, atol=0)
    assert why in caplog.text


def test_torch_func_runs_the_eager_loop():
    dnc = build(12)
    x = rand(4, 2, IN, seed=24)
    params = {k: p.detach() for k, p in dnc.named_parameters()}

    def loss(p):
        return torch.func.functional_call(dnc, p, (x,))[0].square().sum()

    grads = torch.func.grad(loss)(params)
    dnc(x)[0].square().sum().backward()
    for name, p in dnc.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, **TOL, msg=name)


def test_second_derivatives_equal_the_eager_engines():
    """Under create_graph=True the native backward is computed again through the eager step:
    double backward and a gradient penalty on the parameters equal the eager loop's."""
    dnc = build(30)
    x0 = rand(3, 2, IN, seed=31)
    start = random_state(dnc, 2, 70)
    results = []
    for engine in ("native", "eager"):
        dnc.engine = engine
        dnc.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        (grad,) = torch.autograd.grad(dnc(x, start)[0].pow(2).sum(), x, create_graph=True)
        (double,) = torch.autograd.grad(grad.sum(), x)
        x = x0.clone().requires_grad_()
        (grad,) = torch.autograd.grad(dnc(x, start)[0].sum(), x, create_graph=True)
        grad.pow(2).sum().backward()
        results.append((double, {n: p.grad for n, p in dnc.named_parameters()
                                 if p.grad is not None}))
    (double, grads), (double_e, grads_e) = results
    torch.testing.assert_close(double, double_e, **TOL)
    assert grads.keys() == grads_e.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], grads_e[name], **TOL, msg=name)
