"""`FlatOptimizer`: the per-parameter optimizer's updates and state, bitwise, from one flat step."""

import copy
import functools
import re

import pytest
import torch
from torch import nn

from torch_ntm import NTM
from torch_ntm.baseline import LSTMBaseline
from torch_ntm.flat_optim import FlatOptimizer
from torch_ntm.stability import BestWeights

OPTIMIZERS = {
    "rmsprop": functools.partial(torch.optim.RMSprop, lr=1e-3, alpha=0.95, momentum=0.9,
                                 eps=1e-10, foreach=True),
    "adam-amsgrad": functools.partial(torch.optim.Adam, lr=1e-3, amsgrad=True),
    "adamw": functools.partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.1),
}


def _model(kind="ntm"):
    torch.manual_seed(0)
    if kind == "lstm":  # nn.LSTM keeps weak references to its parameters
        return LSTMBaseline(5, 3, hidden_size=10)
    return NTM(5, 3, controller_size=10, memory_size=9, memory_width=4, engine="eager")


def _step(model, optimizer, x, y, clip=True):
    optimizer.zero_grad()
    logits, _ = model(x)
    nn.functional.binary_cross_entropy_with_logits(logits, y).backward()
    if clip:  # on the parameters' own gradients, before the flat step gathers them
        nn.utils.clip_grad_norm_(list(model.parameters()), 0.05)
    optimizer.step()


def _pair(kind, name):
    a = _model(kind)
    b = copy.deepcopy(a)
    return a, OPTIMIZERS[name](list(a.parameters())), b, FlatOptimizer(b.parameters(),
                                                                       OPTIMIZERS[name])


def _data(steps=12):
    g = torch.Generator().manual_seed(1)
    return [(torch.rand(6, 2, 5, generator=g), torch.rand(6, 2, 3, generator=g).round())
            for _ in range(steps)]


@pytest.mark.parametrize("kind", ["ntm", "lstm"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_updates_and_state_are_the_per_parameter_optimizers_bitwise(kind, name):
    a, plain, b, flat = _pair(kind, name)
    params = list(b.parameters())
    for x, y in _data():
        _step(a, plain, x, y)
        _step(b, flat, x, y)
    assert [p is q for p, q in zip(params, b.parameters())] == [True] * len(params)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    ours, theirs = flat.state_dict(), plain.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    assert sorted(ours["state"]) == sorted(theirs["state"])
    for i, state in theirs["state"].items():
        assert sorted(ours["state"][i]) == sorted(state)
        for key, value in state.items():
            assert torch.equal(ours["state"][i][key], value), (i, key)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_per_parameter_state_loaded_continues_bitwise(name):
    """What a checkpoint of the per-parameter optimizer holds (earlier runs) resumes exactly,
    and the flat one's own state loads into a per-parameter optimizer too."""
    a, plain, b, flat = _pair("ntm", name)
    data = _data(16)
    for x, y in data[:8]:
        _step(a, plain, x, y)
    b.load_state_dict(a.state_dict())
    flat.load_state_dict(copy.deepcopy(plain.state_dict()))
    for x, y in data[8:12]:
        _step(a, plain, x, y)
        _step(b, flat, x, y)
    plain.load_state_dict(copy.deepcopy(flat.state_dict()))
    for x, y in data[12:]:
        _step(a, plain, x, y)
        _step(b, flat, x, y)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_the_learning_rate_of_its_groups_is_the_optimizers():
    _, _, b, flat = _pair("ntm", "rmsprop")
    for group in flat.param_groups:
        group["lr"] *= 0.5
    assert flat.optimizer.param_groups[0]["lr"] == 5e-4
    assert flat.state_dict()["param_groups"][0]["lr"] == 5e-4


def test_a_parameter_without_a_gradient_is_stepped_with_zeros():
    """Documented difference: torch skips it; the flat step gives it zeros, which without weight
    decay leaves it where it is."""
    used, unused = nn.Parameter(torch.ones(3)), nn.Parameter(torch.full((2,), 7.0))
    flat = FlatOptimizer([used, unused], OPTIMIZERS["rmsprop"])
    for _ in range(3):
        flat.zero_grad()
        (used * torch.arange(3.0)).sum().backward()
        flat.step()
    assert torch.equal(unused.detach(), torch.full((2,), 7.0))
    assert not torch.equal(used.detach(), torch.ones(3))
    assert torch.equal(flat.state_dict()["state"][1]["square_avg"], torch.zeros(2))


@pytest.mark.parametrize("change, message", [
    (lambda sd: sd["param_groups"][0].update(params=[0, 1]), "expected one group"),
    (lambda sd: sd["state"].pop(3), "a flat step needs all or none"),
    (lambda sd: sd["state"][2].update(step=sd["state"][2]["step"] + 1), "differs between"),
    (lambda sd: sd["state"][0].update(square_avg=torch.zeros(7)), "of shape (7,)"),
])
def test_a_state_it_cannot_continue_is_refused_with_the_reason(change, message):
    a, plain, _, flat = _pair("ntm", "rmsprop")
    x, y = _data(1)[0]
    _step(a, plain, x, y)
    state = copy.deepcopy(plain.state_dict())
    change(state)
    with pytest.raises(ValueError, match=re.escape(message)):
        flat.load_state_dict(state)


def test_no_parameters_or_mixed_dtypes_are_errors():
    with pytest.raises(ValueError, match="at least one parameter"):
        FlatOptimizer([], OPTIMIZERS["rmsprop"])
    mixed = [nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2, dtype=torch.float64))]
    with pytest.raises(ValueError, match="one dtype and device"):
        FlatOptimizer(mixed, OPTIMIZERS["rmsprop"])


@pytest.mark.parametrize("flat", [False, True])
def test_kept_weights_restore_again_and_again(flat):
    """`BestWeights` hands its kept state to the optimizer, which advances counters in place: the
    kept state must not follow it (it did, and a second restore of the flat optimizer's state
    then found parameter 0's step ahead of the others)."""
    a, plain, b, flat_opt = _pair("ntm", "adam-amsgrad")
    model, optimizer = (b, flat_opt) if flat else (a, plain)
    keeper = BestWeights(model, optimizer)
    data = _data(9)
    for x, y in data[:3]:
        _step(model, optimizer, x, y)
    keeper.update(1.0)
    kept = copy.deepcopy(keeper.state_dict()["optimizer"])
    for x, y in data[3:6]:
        _step(model, optimizer, x, y)
    keeper.restore()
    for x, y in data[6:]:
        _step(model, optimizer, x, y)
    keeper.restore()
    state = keeper.state_dict()["optimizer"]["state"]
    for i, values in kept["state"].items():
        for key, value in values.items():
            assert torch.equal(state[i][key], value), (i, key)
    assert float(optimizer.state_dict()["state"][0]["step"]) == 3


def test_a_graph_saved_before_the_step_still_refuses_to_backward():
    """The step writes the parameters through the flat tensor; autograd must know, as it does
    for the per-parameter optimizer's in-place update."""
    for flat in (False, True):
        a, plain, b, flat_opt = _pair("ntm", "rmsprop")
        model, optimizer = (b, flat_opt) if flat else (a, plain)
        x, y = _data(1)[0]
        loss = nn.functional.binary_cross_entropy_with_logits(model(x)[0], y)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_a_module_converted_after_it_was_made_is_refused_not_left_behind():
    _, _, b, flat = _pair("ntm", "rmsprop")
    x, y = _data(1)[0]
    b.double()
    with pytest.raises(RuntimeError, match="no longer lies in the flat tensor"):
        _step(b, flat, x.double(), y.double(), clip=False)


def test_a_scheduler_on_its_optimizer_sets_the_rate_it_steps_and_saves():
    _, _, b, flat = _pair("ntm", "rmsprop")
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(flat.optimizer, patience=0,
                                                           factor=0.5)
    for loss in (1.0, 2.0):
        scheduler.step(loss)
    assert flat.param_groups[0]["lr"] == 5e-4
    assert flat.state_dict()["param_groups"][0]["lr"] == 5e-4
