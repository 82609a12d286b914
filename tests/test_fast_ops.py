"""Each hand-written backward of the fast engine against autograd of its own forward, op by op,
in float64 and at unequal sizes (batch 3, heads 2, memory 7 x 5), so that a failure names the op."""

import pytest
import torch

from torch_ntm import NTM
from torch_ntm import fast as engine

B, H, N, M = 3, 2, 7, 5
TINY = torch.finfo(torch.float64).tiny


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def _autograd(outputs, inputs, grads):
    """Gradients of ``sum(out * grad)`` for the inputs (zeros where an input is unused)."""
    got = torch.autograd.grad(outputs, inputs, grads, allow_unused=True)
    return [torch.zeros_like(i) if g is None else g for g, i in zip(got, inputs)]


def _same(mine, reference, names):
    for name, a, b in zip(names, mine, reference):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("r", [0, 1, 2])
def test_shift_backward(r):
    gen = torch.Generator().manual_seed(r)
    w, s = _leaves(torch.rand(B, H, N, generator=gen, dtype=torch.float64),
                   torch.rand(B, H, 2 * r + 1, generator=gen, dtype=torch.float64))
    dout = torch.randn(B, H, N, generator=gen, dtype=torch.float64)
    reference = _autograd(engine._shift(w, s, r), [w, s], dout)
    _same(engine._shift_backward(dout, w.detach(), s.detach(), r), reference, ["w", "s"])


@pytest.mark.parametrize("keep", [True, False], ids=["keep", "recompute"])
@pytest.mark.parametrize("r", [0, 1, 2])
def test_address_backward(keep, r):
    gen = torch.Generator().manual_seed(10 + r)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    memory = rand(B, M, N)
    memory[0, :, 3] = 0.0  # a zero row, and a zero key below: the EPS edge
    key = torch.tanh(rand(B, H, M))
    key[1, 0] = 0.0
    inputs = _leaves(
        memory, memory.square().sum(1), torch.softmax(rand(B, H, N), -1), key,
        torch.nn.functional.softplus(rand(B, H, 1)), torch.sigmoid(rand(B, H, 1)),
        torch.softmax(rand(B, H, 2 * r + 1), -1), 1.0 + torch.nn.functional.softplus(rand(B, H, 1)),
    )  # memory, msq (an input of its own), w_prev, key, beta, gate, s, gamma
    memory, msq, w_prev, key, beta, gate, s, gamma = inputs
    w, saved = engine._address(memory, msq, w_prev, key, beta, gate, s, gamma, r, TINY, keep)
    dw = rand(B, H, N)
    reference = _autograd(w, inputs, dw)
    plain = [t.detach() for t in inputs]
    saved = tuple(t.detach() for t in saved)
    got = engine._address_backward(dw, plain[0], plain[1], *plain[2:], w.detach(), saved, r, TINY)
    dw_prev, dkey, dbeta, dgate, ds, dgamma, dmemory, dmsq = got
    _same([dmemory, dmsq, dw_prev, dkey, dbeta, dgate, ds, dgamma], reference,
          ["memory", "msq", "w_prev", "key", "beta", "gate", "shift", "gamma"])


def _flatten(state) -> list:
    """The tensors of a `fast._State`, its per-layer lists spread out, in field order."""
    return [t for field in state for t in (field if isinstance(field, list) else [field])]


def _map(fn, state):
    """A `fast._State` of ``fn`` applied to each tensor of ``state``."""
    return engine._State(*([fn(t) for t in field] if isinstance(field, list) else fn(field)
                           for field in state))


def _unflat(tensors, like):
    """The fields of the state ``like`` from its flat tensors."""
    it = iter(tensors)
    return [[next(it) for _ in field] if isinstance(field, list) else next(it) for field in like]


@pytest.mark.parametrize("options", [
    {},
    {"controller_layers": 2, "write_heads": 2, "shift_range": 2},
    {"controller": "feedforward", "controller_layers": 2, "read_heads": 2},
    {"write_heads": 0, "shift_range": 0},
    {"max_beta": 2.0, "max_gamma": 1.5, "write_heads": 3},
], ids=["paper", "deep-2w", "feedforward", "read-only", "capped"])
def test_step_backward(options):
    """`_step_backward` gives the gradients of the previous state, of each layer's
    pre-activation and of the head layer's output, for given gradients of the step's outputs."""
    torch.manual_seed(0)
    model = NTM(4, 3, controller_size=6, memory_size=N, memory_width=M, dtype=torch.float64,
                **options)
    layout = engine._layout(model, torch.device("cpu"), compile=False)
    cfg = layout.cfg
    x = torch.randn(1, B, 4, dtype=torch.float64)
    x, state = model._prepare(x, None)
    xpre, weights, biases, wp, bp = (t.detach() if isinstance(t, torch.Tensor) else
                                     [w.detach() for w in t]
                                     for t in engine._parameters(layout, model, x))
    xpre = xpre[0].requires_grad_(True)
    biases = [b.requires_grad_(True) for b in biases]
    bp = bp.requires_grad_(True)
    memory = torch.randn(B, M, N, dtype=torch.float64)
    prev = engine._State(
        h=[t.detach().clone().requires_grad_(True) for t in state.controller[0]] if cfg.lstm
        else [],
        c=[t.detach().clone().requires_grad_(True) for t in state.controller[1]] if cfg.lstm
        else [],
        memory=memory.requires_grad_(True),
        msq=memory.detach().square().sum(1).requires_grad_(True),
        w_read=torch.softmax(torch.randn(B, cfg.read_heads, N, dtype=torch.float64), -1)
        .requires_grad_(True),
        w_write=torch.softmax(torch.randn(B, cfg.write_heads, N, dtype=torch.float64), -1)
        .requires_grad_(True),
        reads=torch.randn(B, cfg.read_heads, M, dtype=torch.float64).requires_grad_(True),
    )
    h, cur, saved = engine._step(cfg, TINY, xpre, weights, biases, wp, bp, prev)

    # Random gradients for everything the step returns.
    dh_out, dr_out = torch.randn_like(h), torch.randn_like(cur.reads)
    grads = _map(torch.randn_like, cur)
    outputs = [h, cur.reads] + _flatten(cur)
    out_grads = [dh_out, dr_out] + _flatten(grads)
    prev_leaves = _flatten(prev)
    pre_leaves = [xpre] + biases  # layer 0's pre-activation is xpre; deeper layers' add a bias
    reference = _autograd(outputs, prev_leaves + pre_leaves + [bp], out_grads)

    grads_prev, dpre, draw = engine._step_backward(
        cfg, TINY, weights, wp, _map(torch.Tensor.detach, prev), _map(torch.Tensor.detach, cur),
        saved, dh_out, dr_out, grads)

    def flat(state):  # msq is |memory rows|^2: compare d memory + 2 memory d msq, its total
        total = state.memory + 2.0 * prev.memory.detach() * state.msq.unsqueeze(1)
        return [*state.h, *state.c, total, state.w_read, state.w_write, state.reads]

    n_prev = len(prev_leaves)
    reference_prev = engine._State(*_unflat(reference[:n_prev], prev))
    _same(flat(grads_prev), flat(reference_prev),
          [*(f"h[{i}]" for i in range(len(prev.h))), *(f"c[{i}]" for i in range(len(prev.c))),
           "memory", "w_read", "w_write", "reads"])
    # The bias of a layer sums its pre-activation's gradient over the batch; so does bp's raw.
    _same([dpre[0]] + [d.sum(0) for d in dpre[1:]] + [draw.sum(0)], reference[n_prev:],
          ["xpre"] + [f"bias of layer {i}" for i in range(1, len(dpre))] + ["head bias"])
