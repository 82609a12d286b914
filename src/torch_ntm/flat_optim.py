"""One optimizer step for all of a model's parameters at once.

A torch optimizer steps each parameter with its own ops (on the CPU, ``foreach`` still loops over
the tensors), which for a small model is a noticeable part of a training step at batch 1; one step
over one flat tensor costs less (measured on the Speed page, "one optimizer step for all the
parameters"). `FlatOptimizer` makes the
parameters views of one flat tensor, gives the optimizer that tensor, and gathers the gradients into
its ``grad`` before each step. The update is elementwise, so each number comes out bitwise as the
per-parameter optimizer would make it (tested), and its ``state_dict`` is the per-parameter
optimizer's, so checkpoints do not change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

__all__ = ["FlatOptimizer"]


class FlatOptimizer:
    """An optimizer over one flat tensor that the given parameters become views of.

    Args:
        params: the parameters (same dtype and device; at least one). Each is pointed in place
            (``Tensor.set_``: the same Python object) at its part of the flat tensor, so the
            module that holds them, and any reference to them, sees every update.
        make: builds the optimizer from a list of tensors, e.g. ``lambda ps: torch.optim.RMSprop(
            ps, lr=1e-4)``; it gets ``[flat]``.

    ``zero_grad``, ``step``, ``state_dict`` and ``load_state_dict`` behave as the optimizer's;
    ``state_dict`` splits the flat state into the per-parameter state that ``make`` applied to
    ``params`` would have (one group, parameters numbered in order), and ``load_state_dict`` takes
    that form. Where it differs:

    - A parameter without a gradient at a ``step`` is stepped with zeros, where torch's optimizers
      skip it: one that never has a gradient stays put (without weight decay), but one that had
      one before moves on its momentum, and its step counter advances with the others. Every
      model this library builds gives each parameter a gradient at every step.
    - ``param_groups`` are the optimizer's, with ``[flat]`` as their parameters (for the learning
      rate and other settings); ``flat.grad`` holds the gradients only from ``step`` on, so clip
      the parameters' own gradients (as `train` does), not the groups'. It is not a
      ``torch.optim.Optimizer``: give a learning-rate scheduler its ``optimizer``.
    - The parameters share the flat tensor's storage: build the module on its device and dtype
      first (``.to()``, ``.double()``, ``load_state_dict(assign=True)`` or an LSTM's
      ``flatten_parameters()`` afterwards give it new tensors, and ``step`` then raises); save
      ``state_dict()`` with ``safetensors.torch.save_file`` (``save_model`` refuses shared
      storage), and ``torch.save`` of one parameter writes the whole flat tensor.
    """

    def __init__(self, params: Iterable[Tensor],
                 make: Callable[[list[Tensor]], torch.optim.Optimizer]) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("FlatOptimizer needs at least one parameter")
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) > 1:
            raise ValueError(f"FlatOptimizer needs parameters of one dtype and device, got "
                             f"{sorted(map(str, kinds))}; give each kind its own optimizer")
        with torch.no_grad():
            flat = torch.cat([p.reshape(-1) for p in self.params])
        self.flat = nn.Parameter(flat)
        self._sizes = [p.numel() for p in self.params]
        with torch.no_grad():
            for p, view in zip(self.params, self._views(self.flat)):
                p.set_(view.untyped_storage(), view.storage_offset(), view.shape, view.stride())
        self._addresses = [p.data_ptr() for p in self.params]
        self.flat.grad = torch.zeros_like(flat)
        self.optimizer = make([self.flat])

    def _views(self, flat: Tensor) -> list[Tensor]:
        """``flat`` cut into views shaped as the parameters."""
        return [v.view(p.shape) for v, p in zip(flat.split(self._sizes), self.params)]

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """Gather the parameters' gradients into the flat one (zeros where one has none), then
        step the optimizer.

        Raises:
            RuntimeError: a parameter no longer lies in the flat tensor (the module was converted
                or moved after this optimizer was made), which the step would no longer update.
        """
        for i, (p, address) in enumerate(zip(self.params, self._addresses)):
            if p.data_ptr() != address:
                raise RuntimeError(
                    f"FlatOptimizer: parameter {i} (shape {tuple(p.shape)}) no longer lies in the "
                    "flat tensor: the module was converted, moved or given new tensors after the "
                    "optimizer was made, and its steps would not reach it; make the optimizer "
                    "after .to() / .double() / flatten_parameters()")
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        torch.cat([g.reshape(-1) for g in grads], out=self.flat.grad)
        self.optimizer.step()
        # The update wrote to the parameters' storage through the flat tensor: tell autograd, so
        # that a graph which saved them before the step still refuses to backward, as it would.
        torch.autograd.graph.increment_version(self.params)

    def state_dict(self) -> dict:
        """The per-parameter form of the optimizer's ``state_dict``: flat tensors cut into views
        shaped as the parameters, counters (``step``) copied to each."""
        inner = self.optimizer.state_dict()
        flat_state = inner["state"].get(0, {})
        state = {i: {} for i in range(len(self.params))} if flat_state else {}
        for key, value in flat_state.items():
            if _is_counter(value):  # each parameter has its own
                for i in state:
                    state[i][key] = _copy(value)
            else:
                for i, view in enumerate(self._views(value)):
                    state[i][key] = view
        (group,) = inner["param_groups"]
        group = {**group, "params": list(range(len(self.params)))}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a per-parameter ``state_dict`` (`state_dict`'s form, or that of the optimizer
        ``make`` builds, over the same parameters in the same order).

        Raises:
            ValueError: it has another number of parameters or groups, a tensor of another
                shape, or per-parameter counters that differ (a state a flat step cannot
                continue exactly).
        """
        groups, state = state_dict["param_groups"], state_dict["state"]
        count = len(self.params)
        if len(groups) != 1 or list(groups[0]["params"]) != list(range(count)):
            raise ValueError(f"optimizer state for another parameter list: expected one group of "
                             f"{count} parameters, got groups of "
                             f"{[len(g['params']) for g in groups]}")
        flat_state = {}
        if state:
            if sorted(state) != list(range(count)):
                raise ValueError(f"optimizer state for {len(state)} of {count} parameters; a flat "
                                 "step needs all or none")
            for key in state[0]:
                values = [state[i][key] for i in range(count)]
                if all(_is_counter(v) for v in values):
                    if any(not torch.equal(torch.as_tensor(v), torch.as_tensor(values[0]))
                           for v in values):
                        raise ValueError(f"optimizer state {key!r} differs between parameters; "
                                         "a flat step needs one value for all")
                    # a copy: the optimizer advances it in place, and the caller keeps its own
                    flat_state[key] = _copy(values[0])
                    continue
                for v, p in zip(values, self.params):
                    if not isinstance(v, Tensor) or v.shape != p.shape:
                        shape = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
                        raise ValueError(f"optimizer state {key!r} of shape {shape} for a "
                                         f"parameter of shape {tuple(p.shape)}")
                flat_state[key] = torch.cat([v.reshape(-1) for v in values]).to(self.flat)
        self.optimizer.load_state_dict({"state": {0: flat_state} if flat_state else {},
                                        "param_groups": [{**groups[0], "params": [0]}]})


def _is_counter(value) -> bool:
    """Whether a value of an optimizer's per-parameter state is a counter of the whole step
    (``step``: a number or a 0-d tensor) rather than a tensor of the parameter's shape."""
    return not isinstance(value, Tensor) or value.dim() == 0


def _copy(value):
    return value.clone() if isinstance(value, Tensor) else value
