"""No model's step synchronises the GPU with the host, checked on the CPU.

A CUDA graph captures kernels, not host decisions: an op whose forward or backward waits for the
GPU to answer a question (``prod``'s backward asks whether an input is zero, ``nonzero`` how many
there are, ``.item()`` a value) cannot be captured, and a model that has one falls back to the
eager engine on a GPU. The graphs engine runs each model's eager step (``model._step``), so this
suite runs that step over a short sequence, forward and backward, for every model and
configuration that the engines' equivalence suites cover, and fails on any such op.

Two recorders, because neither sees everything:

- a `TorchDispatchMode` sees every aten op of the forward and of autograd's backward as it runs,
  with its arguments (``_local_scalar_dense`` is ``.item()``, ``bool()`` and ``.tolist()``; a
  boolean index; ``repeat_interleave`` without ``output_size``; a tensor made from host data);
- the autograd graph's ``grad_fn`` nodes name the backward formulas. Under a dispatch mode torch
  takes the zero-safe, sync-free branch of ``prod``'s and ``cumprod``'s backward, so the first
  recorder cannot see them; their nodes give them away.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from torch_ntm import DNC, MANN, NTM
from torch_ntm import dnc_functional as dncf
from torch_ntm import functional as ntmf
from torch_ntm.baseline import LSTMBaseline

aten = torch.ops.aten

# Ops that make the host wait for the device, whatever their arguments.
SYNC_OPS = {
    aten._local_scalar_dense.default: ".item(), bool() or .tolist() of a tensor",
    aten.nonzero.default: "nonzero (its output's size is known only on the device)",
    aten.nonzero_static.default: None,  # the capturable form: allowed (None)
    aten.masked_select.default: "masked_select (its output's size is known only on the device)",
    aten.unique_consecutive.default: "unique_consecutive",
    aten._unique2.default: "unique",
    aten.argwhere.default: "argwhere",
    aten.lift_fresh.default: "a tensor made from host data inside the step (torch.tensor)",
}
# Backward formulas that synchronise on CUDA (the grad_fn of the forward op that has them).
SYNC_BACKWARDS = {
    "ProdBackward0": "prod's backward (checks for zeros on the host)",
    "ProdBackward1": "prod's backward (checks for zeros on the host)",
    "CumprodBackward0": "cumprod's backward (checks for zeros on the host)",
    "MaskedSelectBackward0": "masked_select",
    "MaskedScatterBackward0": "masked_scatter's backward (counts the mask on the host)",
    "NonzeroBackward0": "nonzero",
}


def _index_is_boolean(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in indices if i is not None)


class SyncRecorder(TorchDispatchMode):
    """Records the ops that would synchronise a CUDA device, with what each is."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = SYNC_OPS.get(func)
        if why is not None:
            self.found.append(f"{func}: {why}")
        elif func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                      aten._index_put_impl_.default) and _index_is_boolean(args[1]):
            self.found.append(f"{func}: a boolean-mask index (nonzero on the host)")
        elif func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            self.found.append(f"{func}: repeat_interleave without output_size")
        elif func in (aten._to_copy.default, aten.copy_.default):
            source, target = args[0] if func is aten._to_copy.default else args[1], None
            target = kwargs.get("device") if func is aten._to_copy.default else args[0].device
            if target is not None and torch.device(target) != source.device:
                self.found.append(f"{func}: a copy between devices inside the step")
        return func(*args, **kwargs)


# Tensor methods that read a value on the host (on a CPU tensor some reach no aten op at all).
HOST_READS = {torch.Tensor.tolist: ".tolist() of a tensor", torch.Tensor.numpy: ".numpy()",
              torch.Tensor.item: ".item() of a tensor", torch.Tensor.__bool__: "bool() of a tensor",
              torch.Tensor.__int__: "int() of a tensor", torch.Tensor.__float__:
              "float() of a tensor", torch.Tensor.__index__: "a tensor used as an index"}


class HostReadRecorder(TorchFunctionMode):
    """Records the tensor methods that bring a value to the host."""

    def __init__(self, found: list[str]) -> None:
        super().__init__()
        self.found = found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            self.found.append(f"Tensor.{func.__name__}: {HOST_READS[func]}")
        return func(*args, **(kwargs or {}))


def sync_backwards(roots) -> list[str]:
    """The backward formulas that synchronise in the autograd graph of ``roots``' grad_fns."""
    found, seen = [], set()
    stack = [t.grad_fn for t in roots if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = type(node).__name__
        if name in SYNC_BACKWARDS:
            found.append(f"{name}: {SYNC_BACKWARDS[name]}")
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def synchronising_ops(fn, *inputs: torch.Tensor) -> list[str]:
    """The ops of ``fn(*inputs)`` (a list or pytree of tensors) and of its backward (to every
    input and parameter reached) that would synchronise a CUDA device, each once."""
    recorder = SyncRecorder()
    with HostReadRecorder(recorder.found), recorder:
        outputs = [t for t in pytree.tree_leaves(fn(*inputs))
                   if isinstance(t, torch.Tensor) and t.requires_grad]
        found = sync_backwards(outputs)
        loss = sum((o * (i + 1)).sin().sum() for i, o in enumerate(outputs))
        loss.backward()
    return sorted(set(recorder.found + found))


def _step_loop(model, state):
    """The graphs engine's function of a model: the eager step over a sequence from ``state``
    (made outside it, as the engine's input), outputs and final state
    (`torch_ntm.engines.graphs.masked_loop`, every step on)."""
    from torch_ntm.engines.graphs import masked_loop

    def run(x):
        y, final = masked_loop(model._step, x, torch.ones(x.shape[0], dtype=torch.bool), state)
        return [y, *pytree.tree_leaves(final)]

    return run


SMALL = {"controller_size": 11, "memory_size": 7, "memory_width": 5}
# Every model the equivalence suites cover (tests/test_engines.py, test_mann_native.py,
# test_dnc_native.py, test_mann_encoder.py), by the options that change its step's ops.
MODELS = {
    "ntm": lambda: NTM(6, 4, **SMALL),
    "ntm-2-write-heads": lambda: NTM(6, 4, **SMALL, read_heads=2, write_heads=2),
    "ntm-deep-lstm-3-write": lambda: NTM(6, 4, **SMALL, controller_layers=2, shift_range=2,
                                         write_heads=3, memory_init="learned"),
    "ntm-feedforward": lambda: NTM(6, 4, **SMALL, controller="feedforward",
                                   controller_layers=2, read_heads=2),
    "ntm-read-only": lambda: NTM(6, 4, **SMALL, write_heads=0, shift_range=0),
    "ntm-capped": lambda: NTM(6, 4, **SMALL, max_beta=2.0, max_gamma=1.5, write_heads=2),
    "mann": lambda: MANN(6, 4, **SMALL, read_heads=2),
    "mann-key-learned-beta": lambda: MANN(6, 4, **SMALL, read_heads=3, write_vector="key",
                                          learned_beta=True),
    "mann-conv": lambda: MANN(64, 4, controller_size=11, memory_size=7, memory_width=5,
                              encoder="conv", image_size=8),
    "mann-conv+pixels": lambda: MANN(64, 4, controller_size=11, memory_size=7,
                                     memory_width=5, encoder="conv+pixels", image_size=8),
    "dnc": lambda: DNC(6, 4, **SMALL, read_heads=2),
    "dnc-2-write-heads": lambda: DNC(6, 4, **SMALL, read_heads=2, write_heads=2),
    "dnc-feedforward": lambda: DNC(6, 4, **SMALL, controller="feedforward"),
    "dnc-sparse": lambda: DNC(6, 4, **SMALL, read_heads=2, sparse_link=3),
    "dnc-sparse-2-write-heads": lambda: DNC(6, 4, **SMALL, write_heads=2, sparse_link=2),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_model_step_synchronises(name, dtype):
    torch.manual_seed(0)
    model = MODELS[name]().to(dtype)
    x = torch.rand(5, 3, model.input_size, dtype=dtype, requires_grad=True)
    state = model._loop_state(model.initial_state(3, dtype=dtype))
    assert synchronising_ops(_step_loop(model, state), x) == []


def test_no_step_of_the_lstm_baseline_synchronises():
    torch.manual_seed(0)
    model = LSTMBaseline(6, 4, hidden_size=5, num_layers=2)

    x = torch.rand(2, 3, 6, requires_grad=True)
    assert synchronising_ops(_step_loop(model, model.initial_state(3)), x) == []


def test_an_explicit_state_adds_no_synchronising_op():
    """A state passed in (leaves that require a gradient) is the other capture: its backward
    reaches the state's leaves."""
    torch.manual_seed(0)
    model = DNC(6, 4, **SMALL, read_heads=2, write_heads=2)
    state = pytree.tree_map(lambda t: t.detach().requires_grad_(t.is_floating_point()),
                            model.initial_state(3))
    assert synchronising_ops(_step_loop(model, state), torch.rand(4, 3, 6)) == []
    assert all(t.grad is not None for t in pytree.tree_leaves(state) if t.requires_grad)


# The recorders themselves: each kind of op they must catch, and what they must let pass.
def _old_write(memory, w, erase, add):  # functional.write before the chain of products
    keep = torch.prod(1.0 - w.transpose(1, 2).unsqueeze(-1) * erase.unsqueeze(1), dim=2)
    return memory * keep + torch.matmul(w.transpose(1, 2), add)


CAUGHT = {
    "prod": (lambda x: torch.prod(x, 1), "ProdBackward1"),
    "prod-all": (lambda x: x.prod(), "ProdBackward0"),
    "cumprod": (lambda x: torch.cumprod(x, -1), "CumprodBackward0"),
    "item": (lambda x: x * x.sum().item(), "_local_scalar_dense"),
    "bool": (lambda x: x * 2 if bool(x.sum() > 0) else x, "bool()"),
    "tolist": (lambda x: x * x[0, 0].tolist(), "tolist"),
    "nonzero": (lambda x: x[(x > 0.5).nonzero()[:, 0]], "nonzero"),
    "boolean-mask": (lambda x: x[x > 0.5], "boolean-mask index"),
    "masked_select": (lambda x: x.masked_select(x > 0.5), "masked_select"),
    "repeat_interleave": (lambda x: x.repeat_interleave(torch.tensor([1, 2]), dim=0),
                          "without output_size"),
    "host-tensor": (lambda x: x * torch.tensor([1.0, 2.0, 3.0]), "host data"),
    "old-write": (lambda x: _old_write(torch.rand(1, 3, 2), x.reshape(1, 2, 3).softmax(-1),
                                       x[:, :2].sigmoid()[None], x[:, 1:][None]),
                  "ProdBackward1"),
}


@pytest.mark.parametrize("name", sorted(CAUGHT))
def test_the_recorders_catch_each_kind_of_synchronising_op(name):
    fn, expected = CAUGHT[name]
    found = synchronising_ops(lambda x: [fn(x)], torch.rand(2, 3, requires_grad=True))
    assert any(expected in line for line in found), found


def test_the_recorders_pass_the_capturable_forms():
    repeats = torch.tensor([1, 2])

    def fn(x):
        order = torch.argsort(x.detach(), dim=-1, stable=True)
        y = x.gather(-1, order).cumsum(-1) * torch.where(x > 0.5, x, 0.0)
        y = y + x.repeat_interleave(repeats, dim=0, output_size=3)[:2]
        return [F.softmax(y, -1), torch.zeros_like(x).scatter(-1, order[..., :1], 1.0)]

    assert synchronising_ops(fn, torch.rand(2, 3, requires_grad=True)) == []


def test_the_sync_free_products_equal_torchs():
    """The products the steps take in place of prod and cumprod, against torch's in float64,
    values and gradients (also through exact zeros, where prod's own backward branches)."""
    torch.manual_seed(0)
    x = torch.rand(3, 4, 6, dtype=torch.float64)
    x[0, 1, 2] = 0.0
    x[1, :, 3] = 0.0
    for dim in (1, -1):
        torch.testing.assert_close(ntmf.product(x, dim), torch.prod(x, dim), rtol=1e-14, atol=0)
    torch.testing.assert_close(dncf.exclusive_cumprod(x), torch.cumprod(  # bit for bit
        torch.cat([torch.ones_like(x[..., :1]), x[..., :-1]], -1), -1), rtol=0, atol=0)
    for fn, ref in ((lambda t: ntmf.product(t, 1), lambda t: torch.prod(t, 1)),
                    (dncf.exclusive_cumprod, lambda t: torch.cumprod(
                        torch.cat([torch.ones_like(t[..., :1]), t[..., :-1]], -1), -1))):
        a = x.clone().requires_grad_(True)
        b = x.clone().requires_grad_(True)
        g = torch.randn_like(ref(x))
        (fn(a) * g).sum().backward()
        (ref(b) * g).sum().backward()
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-13, atol=1e-15)
        small = (x[:2, :2].clone().requires_grad_(True),)  # with a zero
        assert torch.autograd.gradcheck(fn, small, check_forward_ad=True)
        assert torch.autograd.gradgradcheck(fn, small)
