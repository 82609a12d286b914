"""Each model's native engine (`torch_ntm.engines.ntm`, `.mann`, `.dnc`: csrc/*.cpp) computes its
``forward`` as the eager loop does: one suite, parametrised by a table of the models (`SPECS`: how
to build a small one of each, in float64 or float32, and the helpers their comparisons need).
Outputs, final state and the gradients of every parameter, of the input and of a state passed in,
in float64 to ~1e-10; a state carried over calls, batch first and without gradients; float32
close to float64; gradcheck; zero keys; torch.func and second derivatives on the eager loop; and
that the native engine is what runs. What is particular to one model is tested beside it
(test_mann_native.py, test_dnc_native.py; the NTM's engines in test_engines.py and
test_native.py), and a property test_engines.py checks for the NTM takes no NTM case here."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from test_engines import CONFIGS as NTM_CONFIGS

from torch_ntm import DNC, MANN, NTM, DNCState, MANNState, NTMState, engines
from torch_ntm import functional as F
from torch_ntm.engines import library

IN, OUT = 6, 4
TOL = {"rtol": 1e-10, "atol": 1e-12}
SMALL = {"controller_size": 8, "memory_size": 7, "memory_width": 5, "read_heads": 2}


def rand(*shape, seed: int = 1, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ------------------------------------------------------------------------------------------------
# Each model's state: a random one, its rows in the order of their usage, and a loss over it.
# ------------------------------------------------------------------------------------------------


def ntm_random_state(ntm: NTM, batch: int, seed: int) -> NTMState:
    """A state with no two rows alike (random memory, reads and controller, softmax
    weightings)."""
    start = ntm.initial_state(batch)
    return NTMState(tuple(0.3 * rand(*t.shape, seed=seed + 1 + i)
                          for i, t in enumerate(start.controller)),
                    rand(*start.memory.shape, seed=seed + 3),
                    torch.softmax(2 * rand(*start.read_weights.shape, seed=seed + 4), -1),
                    torch.softmax(2 * rand(*start.write_weights.shape, seed=seed + 5), -1),
                    0.5 * rand(*start.reads.shape, seed=seed + 6))


def mann_random_state(mann: MANN, batch: int, seed: int) -> MANNState:
    """A state with no two rows alike (random memory and usage, softmax read weightings)."""
    n, m, h, c = mann.memory_size, mann.memory_width, mann.read_heads, mann.controller_size
    usage = rand(batch, n, seed=seed).abs()
    return MANNState((0.3 * rand(1, batch, c, seed=seed + 1), rand(1, batch, c, seed=seed + 2)),
                     rand(batch, n, m, seed=seed + 3),
                     usage, torch.softmax(2 * rand(batch, h, n, seed=seed + 4), -1),
                     F.least_used(usage, h), 0.5 * rand(batch, h, m, seed=seed + 5))


def weighting(*shape, seed: int, total: float = 0.9) -> torch.Tensor:
    """Non-negative rows summing to ``total`` (a weighting of the paper's Delta_N)."""
    return total * torch.softmax(2 * rand(*shape, seed=seed), -1)


def dnc_random_state(dnc: DNC, batch: int, seed: int) -> DNCState:
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


def mann_by_usage(state: MANNState) -> MANNState:
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


def dnc_by_usage(state: DNCState) -> DNCState:
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


def loss_of_every_tensor(y: torch.Tensor, state) -> torch.Tensor:
    """Every output and state tensor with its own weights, so that no gradient is left out."""
    total = (y * rand(*y.shape, seed=7)).sum()
    for i, t in enumerate(state.tensors().values()):
        total = total + (t * rand(*t.shape, seed=20 + i)).sum()
    return total


def mann_loss_of(y: torch.Tensor, state: MANNState) -> torch.Tensor:
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


# ------------------------------------------------------------------------------------------------
# The table of models, and what every test runs and compares.
# ------------------------------------------------------------------------------------------------


def unchanged(state):
    return state


@dataclass(frozen=True)
class Spec:
    """One model of the suite. ``name``: its native engine (`torch_ntm.engines.native`) and the
    first word of its tests' ids."""

    name: str
    model: type
    state: type
    random_state: Callable  # (model, batch, seed) -> a state with no two rows alike
    loss_of: Callable  # (y, state) -> a loss that reaches every gradient
    by_usage: Callable = unchanged  # (state) -> the state, rows that may tie in one order

    def build(self, seed: int = 0, *, dtype=torch.float64, **options):
        """A small model (`SMALL`, then ``options``), its weights drawn from ``seed``."""
        torch.manual_seed(seed)
        return self.model(IN, OUT, dtype=dtype, **{**SMALL, **options})

    @property
    def needs_library(self):
        """A mark that skips a case unless the model's library builds in float32 and float64."""
        built = all(library.available(self.name, dtype) for dtype in (torch.float32, torch.float64))
        why = library.error(self.name, torch.float64)
        return pytest.mark.skipif(not built, reason=f"native library not built: {why}")


NTM_SPEC = Spec("ntm", NTM, NTMState, ntm_random_state, loss_of_every_tensor)
MANN_SPEC = Spec("mann", MANN, MANNState, mann_random_state, mann_loss_of, mann_by_usage)
DNC_SPEC = Spec("dnc", DNC, DNCState, dnc_random_state, loss_of_every_tensor, dnc_by_usage)
SPECS = (NTM_SPEC, MANN_SPEC, DNC_SPEC)


def spec_of(thing) -> Spec:
    """The spec of a model or of a state."""
    return next(s for s in SPECS if isinstance(thing, (s.model, s.state)))


def case(spec: Spec, *values, id: str = ""):
    """A test case of ``spec``'s model, its id the model's name (then ``id``), skipped where its
    native library is not built."""
    return pytest.param(spec, *values, id=f"{spec.name}-{id}" if id else spec.name,
                        marks=spec.needs_library)


def random_state(model, batch: int, seed: int):
    return spec_of(model).random_state(model, batch, seed)


def by_usage(state):
    return spec_of(state).by_usage(state)


def leaf_state(state):
    """``state`` cut from its graph, every tensor a leaf that requires a gradient."""
    return state.map(lambda t: t.detach().clone().requires_grad_())


def run(model, engine: str, x: torch.Tensor, state=None, fresh: bool = False):
    """Outputs, final state, and the gradients of the parameters, of x and of the state (with
    ``fresh``, of a loss that sees the final state `by_usage`, whatever the order of rows that
    tie)."""
    model.engine = engine
    assert model.runs_on(x) == engine
    x = x.detach().clone().requires_grad_()
    given = None if state is None else leaf_state(state)
    y, final = model(x, given)
    wrt = [*model.parameters(), x, *([] if given is None else given.tensors().values())]
    loss = spec_of(model).loss_of(y, by_usage(final) if fresh else final)
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    return y.detach(), final.detach(), grads


def assert_states_close(a, b, **tol) -> None:
    for (name, x), y in zip(a.tensors().items(), b.tensors().values(), strict=True):
        torch.testing.assert_close(x, y, **tol, msg=lambda s, n=name: f"{n}: {s}")


def assert_same(got, expected, exact_state: bool = True, **tol) -> None:
    """Outputs, final states (with ``exact_state`` False, `by_usage`) and gradients alike."""
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


# ------------------------------------------------------------------------------------------------
# The suite.
# ------------------------------------------------------------------------------------------------


def mann_config(vector, beta, heads, batch, rows, seed):
    return case(MANN_SPEC, {"write_vector": vector, "learned_beta": beta, "read_heads": heads,
                            "memory_size": rows, "usage_decay": 0.9}, batch, seed,
                id=f"{vector}-{beta}-{heads}-{batch}-{rows}-{seed}")


def dnc_config(heads, batch, rows, width, seed):
    return case(DNC_SPEC, {"read_heads": heads, "memory_size": rows, "memory_width": width},
                batch, seed, id=f"{heads}-{batch}-{rows}-{width}-{seed}")


def ntm_config(name, batch, seed):
    return case(NTM_SPEC, NTM_CONFIGS[name], batch, seed, id=f"{name}-{batch}-{seed}")


CONFIGS = [
    # NTM: a configuration of test_engines.CONFIGS, batch, seed
    ntm_config("paper", 2, 0),
    ntm_config("multi-head", 3, 1),
    ntm_config("deep-lstm", 1, 2),
    ntm_config("feedforward", 3, 3),
    # MANN: write_vector, learned_beta, read_heads, batch, memory_size, seed
    mann_config("add", False, 2, 3, 7, 0),
    mann_config("key", False, 1, 3, 7, 1),
    mann_config("add", True, 4, 1, 7, 2),
    mann_config("key", True, 4, 3, 128, 3),
    mann_config("add", False, 1, 1, 128, 4),
    mann_config("add", True, 4, 3, 128, 5),
    mann_config("add", True, 2, 2, 40, 6),  # 2 and 3 heads; rows that end in a part of a block
    mann_config("key", False, 3, 2, 40, 7),
    # DNC: read_heads, batch, memory_size, memory_width, seed
    dnc_config(2, 3, 7, 5, 0),
    dnc_config(1, 3, 7, 5, 1),
    dnc_config(4, 1, 16, 16, 2),
    dnc_config(4, 3, 64, 32, 3),
    dnc_config(5, 2, 9, 3, 4),
    dnc_config(3, 2, 1, 4, 5),  # one row: the link matrix is its zero diagonal
    dnc_config(2, 1, 2, 1, 6),
]


@pytest.mark.parametrize("spec,options,batch,seed", CONFIGS)
def test_equals_the_eager_loop(spec, options, batch, seed):
    """From a fresh state (the MANN's and the DNC's usages tie: the first writes go to rows
    0..H-1, the free list in row order; the final state compared `by_usage`) and from a state
    passed in: values and the gradients of every parameter, of the input and of each tensor of
    the state."""
    model = spec.build(seed, **options)
    x = rand(9, batch, IN, seed=seed + 10)
    assert_same(run(model, "native", x, fresh=True), run(model, "eager", x, fresh=True),
                exact_state=False, **TOL)
    state = random_state(model, batch, seed + 30)
    assert_same(run(model, "native", x, state), run(model, "eager", x, state), **TOL)


@pytest.mark.parametrize("spec", [case(MANN_SPEC), case(DNC_SPEC)])
def test_carried_state_batch_first_and_no_grad(spec):
    model = spec.build(8, read_heads=3, memory_size=10)
    x = rand(8, 3, IN, seed=18)
    model.engine = "eager"
    with torch.no_grad():
        y_e, s_e = model(x)
    model.engine = "native"
    y_a, s_a = model(x[:5])
    y_b, s_b = model(x[5:], s_a)  # a state carried over two calls, in the graph
    torch.testing.assert_close(torch.cat([y_a, y_b]).detach(), y_e, **TOL)
    assert_states_close(s_b.detach(), s_e, **TOL)
    (y_b.sum() + sum(t.sum() for t in s_b.tensors().values())).backward()  # through both calls
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    with torch.no_grad():  # the inference path: two slots of state, odd and even lengths
        for steps in (7, 8):
            y_n, s_n = model(x[:steps])
            model.engine = "eager"
            y_r, s_r = model(x[:steps])
            model.engine = "native"
            torch.testing.assert_close(y_n, y_r, **TOL)
            assert_states_close(s_n, s_r, **TOL)
    first = spec.build(8, read_heads=3, memory_size=10, batch_first=True)
    assert first.runs_on(x) == "native"  # the default, "auto"
    y_f, s_f = first(x.transpose(0, 1).contiguous())
    torch.testing.assert_close(y_f.transpose(0, 1).detach(), y_e, **TOL)
    assert_states_close(s_f.detach(), s_e, **TOL)
    assert "engine='native'" in repr(model)


@pytest.mark.parametrize("spec,options,seed", [
    case(NTM_SPEC, {"read_heads": 2, "write_heads": 2, "memory_size": 32, "memory_width": 16}, 40),
    case(MANN_SPEC, {"read_heads": 4, "memory_size": 32, "learned_beta": True}, 40),
    case(DNC_SPEC, {"read_heads": 4, "memory_size": 32, "memory_width": 16}, 50),
])
def test_float32_is_close_to_float64(spec, options, seed):
    """From a state passed in: outputs and every tensor of the final state to 1e-4, the
    gradients to 1e-3."""
    m64 = spec.build(9, **options)
    m32 = spec.build(9, **options, dtype=torch.float32)
    m32.load_state_dict({k: v.float() for k, v in m64.state_dict().items()})
    x = rand(10, 3, IN, seed=19)
    state = random_state(m64, 3, seed)
    y64, s64, g64 = run(m64, "native", x, state)
    y32, s32, g32 = run(m32, "native", x.float(), state.map(lambda t: t.float()))
    torch.testing.assert_close(y32, y64.float(), rtol=1e-4, atol=1e-5)
    assert_states_close(s32, s64.map(lambda t: t.float()), rtol=1e-4, atol=1e-5)
    for g, g_e in zip(g32, g64):
        if g_e is not None:  # (the learned initial h, c: unused with a state given)
            torch.testing.assert_close(g, g_e.float(), rtol=1e-3, atol=1e-4)


def mann_gradcheck_start(mann: MANN) -> MANNState:
    return mann.initial_state(2)._replace(memory=rand(2, 4, 2, seed=22),
                                          reads=rand(2, 2, 2, seed=23))


@pytest.mark.parametrize("spec,options,start,given,returned", [
    case(MANN_SPEC, {"learned_beta": True}, mann_gradcheck_start, ("memory", "reads"),
         ("memory", "usage", "read_weights")),
    case(DNC_SPEC, {}, lambda dnc: random_state(dnc, 2, 60),
         ("memory", "link", "precedence", "read_weights", "write_weights", "reads"),
         ("memory", "usage", "link", "read_weights")),
])
def test_gradcheck_tiny(spec, options, start, given, returned):
    """gradcheck of the input, three weights and the tensors ``given`` of a state passed in:
    the MANN's memory and reads, every tensor of the DNC's but the usage (a perturbation of tied
    usages changes the rows chosen; of the DNC's, it reorders the free list)."""
    model = spec.build(10, controller_size=3, memory_size=4, memory_width=2, read_heads=2,
                       **options)
    model.engine = "native"
    state = start(model)
    names = ["head_params.weight", "output.weight", "controller.cells.0.weight_ih"]
    params = dict(model.named_parameters())

    def f(x, *tensors):
        s = state._replace(**dict(zip(given, tensors)))
        weights = dict(zip(names, tensors[len(given):]))
        out, final = torch.func.functional_call(model, weights, (x, s))
        return out, *(getattr(final, name) for name in returned)

    inputs = (rand(3, 2, IN, seed=21).requires_grad_(),
              *(getattr(state, n).clone().requires_grad_() for n in given),
              *(params[n].detach().clone().requires_grad_() for n in names))
    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize("spec,options", [
    case(MANN_SPEC, {"write_vector": "key"}),
    case(DNC_SPEC, {}),
])
def test_zero_keys_and_inputs_give_finite_gradients(spec, options):
    """Keys of exactly zero (the head layer zeroed: the cosine's norms rest on EPS alone) over a
    fresh (the DNC's: empty) memory and a zero input: values and gradients finite, and as the
    eager loop's."""
    model = spec.build(11, read_heads=4, memory_size=16, **options)
    with torch.no_grad():
        model.head_params.weight.zero_()
        model.head_params.bias.zero_()
    x = torch.zeros(5, 3, IN, dtype=torch.float64)
    got, expected = run(model, "native", x), run(model, "eager", x)
    assert all(g is None or torch.isfinite(g).all() for g in got[2])
    assert_same(got, expected, **TOL)


@pytest.mark.parametrize("spec", [case(spec) for spec in SPECS])
def test_torch_func_runs_the_eager_loop(spec):
    """torch.func's gradients (the eager loop's) equal backward's (the native engine's), on
    engines "auto" and "native"."""
    model = spec.build(12)
    x = rand(4, 2, IN, seed=24)
    params = {k: p.detach() for k, p in model.named_parameters()}

    def loss(p):
        return torch.func.functional_call(model, p, (x,))[0].square().sum()

    for engine in ("auto", "native"):
        model.engine = engine
        model.zero_grad(set_to_none=True)
        grads = torch.func.grad(loss)(params)
        model(x)[0].square().sum().backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, **TOL, msg=f"{engine}: {name}")


@pytest.mark.parametrize("spec", [case(spec) for spec in SPECS])
def test_native_engine_is_what_runs(spec, monkeypatch):
    """The tests above compare the native engine, not the eager loop run twice: where the
    library runs (grad mode or not, engine "auto" or "native"), the model's ``forward`` calls
    it; under torch.func, and on engine "eager", it does not."""

    def refuse(*args):
        raise RuntimeError("native engine called")

    monkeypatch.setattr(engines.native(spec.name), "forward", refuse)
    model = spec.build(14)
    x = rand(3, 2, IN, seed=26)
    params = {k: p.detach() for k, p in model.named_parameters()}
    for engine in ("auto", "native"):
        model.engine = engine
        with pytest.raises(RuntimeError, match="native engine called"):
            model(x)
        with torch.no_grad(), pytest.raises(RuntimeError, match="native engine called"):
            model(x)
        torch.func.grad(lambda p: torch.func.functional_call(model, p, (x,))[0].sum())(params)
    model.engine = "eager"
    model(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_batch_invariant_matmul(dtype):
    """`library.linear_rows` (csrc/common.h's `gemm_rows_invariant`): ``x W^T + b`` to float64's
    rounding of the same sum, for shapes around its paths and blocks (1-3 rows in scalars; rows
    across lanes, padded, in blocks of 2 vectors x 4 columns and 1 x 8, columns left over, k =
    1); each row the same bits alone (the scalar path) as among the others; the bias left as it
    was."""
    if not library.available("dnc", dtype):
        pytest.skip(f"native library not built: {library.error('dnc', dtype)}")
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else TOL
    for m, n, k in [(1, 256, 9), (1, 8, 1), (2, 16, 3), (4, 16, 8), (5, 37, 13), (7, 300, 70),
                    (9, 1, 200), (40, 65, 129)]:
        x, weight, bias = rand(m, k, seed=m), rand(n, k, seed=n), rand(n, seed=k)
        x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype)
        before = bias.clone()
        out = library.linear_rows("dnc", x, weight, bias)
        exact = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
        torch.testing.assert_close(out.double(), exact, **tol)
        assert torch.equal(bias, before)
        for i in range(m):
            assert torch.equal(library.linear_rows("dnc", x[i:i + 1], weight, bias), out[i:i + 1])


@pytest.mark.parametrize("spec", [case(MANN_SPEC), case(DNC_SPEC)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grad", [False, True])
def test_a_sequence_gets_the_same_bits_alone_as_in_any_batch(spec, dtype, grad):
    """The MANN's and the DNC's native engines give each sequence the same outputs and final
    state, to the bit, run alone or in a batch of 16 or of 5: their matmuls sum each row's entries
    in one order whatever the batch (BLAS's do not: rows ~1e-7 apart), so usages that are equal
    in exact arithmetic and round apart in a batch cannot send the write to another row (it did
    for 7 of 80 sequences of a DNC(9, 8), a memory row permuted)."""
    torch.manual_seed(3)
    model = spec.model(9, 8, dtype=dtype, **({"memory_size": 16, "memory_width": 8,
                                              "controller_size": 32} if spec is MANN_SPEC else {}))
    x = torch.rand(30, 16, 9, generator=torch.Generator().manual_seed(4)).round().to(dtype)
    with torch.set_grad_enabled(grad):
        for rows in (range(16), range(11, 16)):
            batch = list(rows)
            y, state = model(x[:, batch])
            for i, b in enumerate(batch):
                y_alone, alone = model(x[:, b:b + 1])
                assert torch.equal(y_alone[:, 0], y[:, i]), (b, len(batch))
                for name, t in alone.tensors().items():
                    full = state.tensors()[name]
                    row = full[:, i:i + 1] if name.startswith("controller") else full[i:i + 1]
                    assert torch.equal(t, row), (name, b, len(batch))


def field_rows(engine, model, config, name: str) -> torch.Tensor:
    """The head (interface) layer's rows of field ``name`` under ``config`` (``engine``'s
    `_config`): each MANN head's block of ``config.fields`` outputs holds its fields, the DNC's
    interface holds each field of all heads in one run."""
    start = config.starts[engine._FIELDS.index(name)]
    if isinstance(model, MANN):
        width = model.head_layout.fields[name]
        return torch.cat([torch.arange(k * config.fields + start, k * config.fields + start + width)
                          for k in range(model.read_heads)])
    heads, width = model.head_layout.fields[name]
    return torch.arange(start, start + heads * width)


_MANN_OVERLAP = ("mann: a head's fields (a key and alpha among them) must cover its outputs, no "
                 "overlap")


@pytest.mark.parametrize("spec,options,first,second,overlap,refused", [
    case(MANN_SPEC, {"learned_beta": True}, "key", "add", ("alpha", "beta"), _MANN_OVERLAP),
    case(MANN_SPEC, {"learned_beta": True}, "alpha", "beta", ("add", "key"), _MANN_OVERLAP),
    case(DNC_SPEC, {}, "write_key", "erase", ("read_mode", "read_key"),
         "dnc: the interface fields must cover its outputs, no overlap"),
])
def test_the_kernels_read_the_head_fields_where_the_call_puts_them(spec, options, first, second,
                                                                   overlap, refused, monkeypatch):
    """mann.cpp and dnc.cpp take each head field where the call says, in any order (calls.h's
    tables give their widths and activations): two fields of one width swapped, with the head
    layer's rows swapped to match, give the same outputs and final state to the bit and the same
    gradients (the head layer's in the swapped rows) to rounding; fields that overlap are
    refused, naming the problem."""
    engine = importlib.import_module(f"torch_ntm.engines.{spec.name}")
    model = spec.build(43, **options)
    x = rand(5, 3, IN, seed=44)
    y, final, grads = run(model, "native", x)
    config = engine._config(model)
    a, b = field_rows(engine, model, config, first), field_rows(engine, model, config, second)
    order = torch.arange(model.head_params.weight.shape[0])
    order[a], order[b] = b, a  # its own inverse
    with torch.no_grad():
        for p in model.head_params.parameters():
            p.copy_(p[order])
    starts = list(config.starts)
    i, j = engine._FIELDS.index(first), engine._FIELDS.index(second)
    starts[i], starts[j] = starts[j], starts[i]
    swapped = config._replace(starts=tuple(starts))
    monkeypatch.setattr(engine, "_config", lambda model: swapped)
    y2, final2, grads2 = run(model, "native", x)
    assert torch.equal(y2, y)
    assert all(torch.equal(s, t) for s, t in zip(final2.tensors().values(),
                                                 final.tensors().values()))
    names = [name for name, _ in model.named_parameters()]
    for name, g2, g in zip(names, grads2, grads):  # sums over the rows in their new order
        torch.testing.assert_close(g2[order] if name.startswith("head_params") else g2, g,
                                   **TOL, msg=name)
    onto, moved = (engine._FIELDS.index(name) for name in overlap)
    starts[moved] = starts[onto]
    overlapping = config._replace(starts=tuple(starts))
    monkeypatch.setattr(engine, "_config", lambda model: overlapping)
    with pytest.raises(Exception, match=re.escape(refused)):
        model(x)


def mann_distinct_usages(mann: MANN) -> MANNState:
    """A state with distinct usages, so that both engines pick the same least-used rows."""
    start = mann.initial_state(2)
    start = start._replace(usage=rand(2, 7, seed=32), memory=rand(2, 7, 5, seed=33))
    return start._replace(least_used=F.least_used(start.usage, 2))


@pytest.mark.parametrize("spec,options,start", [
    case(MANN_SPEC, {"learned_beta": True}, mann_distinct_usages),
    case(DNC_SPEC, {}, lambda dnc: random_state(dnc, 2, 70)),
])
def test_second_derivatives_equal_the_eager_engines(spec, options, start):
    """Under create_graph=True the native backward is computed again through the eager step:
    double backward and a gradient penalty on the parameters equal the eager loop's (the NTM's:
    test_engines.py)."""
    model = spec.build(30, **options)
    x0 = rand(3, 2, IN, seed=31)
    state = start(model)
    results = []
    for engine in ("native", "eager"):
        model.engine = engine
        model.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        (grad,) = torch.autograd.grad(model(x, state)[0].pow(2).sum(), x, create_graph=True)
        (double,) = torch.autograd.grad(grad.sum(), x)
        x = x0.clone().requires_grad_()
        (grad,) = torch.autograd.grad(model(x, state)[0].sum(), x, create_graph=True)
        grad.pow(2).sum().backward()
        results.append((double, {n: p.grad for n, p in model.named_parameters()
                                 if p.grad is not None}))
    (double, penalty), (double_e, penalty_e) = results
    torch.testing.assert_close(double, double_e, **TOL)
    assert penalty.keys() == penalty_e.keys() and penalty
    for name in penalty_e:
        torch.testing.assert_close(penalty[name], penalty_e[name], **TOL, msg=name)


@pytest.mark.parametrize("spec", [case(spec) for spec in SPECS])
def test_a_second_derivative_runs_the_models_own_step(spec, monkeypatch):
    """What a native backward under create_graph=True differentiates is the model's own
    ``_advance`` (under `torch.func.functional_call`, on the parameters the forward used), one
    call a step: no engine keeps a copy of the step. A first-order backward calls it not at
    all; a change to the model's step reaches the second derivative."""
    model = spec.build(33)
    model.engine = "native"
    x0 = rand(5, 2, IN, seed=34)
    calls = []
    own = type(model)._advance

    def counted(self, *args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return own(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "_advance", counted)
    x = x0.clone().requires_grad_()
    model(x)[0].square().sum().backward()
    assert calls == []  # the forward and a first-order backward: the library alone
    (grad,) = torch.autograd.grad(model(x)[0].square().sum(), x, create_graph=True)
    assert calls == [True] * 5
    (double,) = torch.autograd.grad(grad.sum(), x)
    # Every parameter's gradient comes back through it, equal to the library's first-order one.
    params = [p for p in model.parameters() if p.requires_grad]
    first = torch.autograd.grad(model(x)[0].square().sum(), params)
    recorded = torch.autograd.grad(model(x)[0].square().sum(), params, create_graph=True)
    assert all(g.grad_fn is not None for g in recorded)
    for got, expected in zip(recorded, first):
        torch.testing.assert_close(got, expected, **TOL)
    # A model whose step is other (its output scaled) gives another second derivative.
    monkeypatch.setattr(type(model), "_advance", lambda self, *a, **k: (
        lambda h, *rest: (2 * h, *rest))(*own(self, *a, **k)))
    (grad,) = torch.autograd.grad(model(x)[0].square().sum(), x, create_graph=True)
    (other,) = torch.autograd.grad(grad.sum(), x)
    assert not torch.allclose(double, other)
