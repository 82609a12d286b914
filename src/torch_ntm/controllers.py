"""The controllers a memory model can have: a stack of LSTM cells, or of feed-forward layers.

Each is ``(x, state) -> (h, state)`` with an ``initial_state(batch_size)`` (learned for the
LSTM) and ``reset_parameters()``; `CONTROLLERS` names them for the ``controller=`` argument of
`torch_ntm.NTM` and `torch_ntm.DNC` (a `torch_ntm.MANN`'s is always one LSTM layer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["CONTROLLERS", "FeedForwardController", "LSTMController", "under_torch_func"]


class LSTMController(nn.Module):
    """A stack of LSTM cells with a learned initial state and forget-gate bias 1."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int, **factory) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.cells = nn.ModuleList(
            nn.LSTMCell(input_size if i == 0 else hidden_size, hidden_size, **factory)
            for i in range(num_layers)
        )
        self.h0 = nn.Parameter(torch.empty(num_layers, hidden_size, **factory))
        self.c0 = nn.Parameter(torch.empty(num_layers, hidden_size, **factory))

    def reset_parameters(self) -> None:
        for cell in self.cells:
            cell.reset_parameters()
            # Gate order is (input, forget, cell, output); bias_ih + bias_hh is the gate's bias.
            c = self.hidden_size
            with torch.no_grad():
                cell.bias_ih[c : 2 * c].fill_(1.0)
                cell.bias_hh[c : 2 * c].fill_(0.0)
        nn.init.normal_(self.h0, std=0.1)
        nn.init.normal_(self.c0, std=0.1)

    def initial_state(self, batch_size: int) -> tuple:
        shape = (self.num_layers, batch_size, self.hidden_size)
        return (self.h0.unsqueeze(1).expand(shape), self.c0.unsqueeze(1).expand(shape))

    def forward(self, x: Tensor, state: tuple) -> tuple[Tensor, tuple]:
        h_prev, c_prev = state
        hs, cs = [], []
        # torch.vmap has no batching rule for nn.LSTMCell's fused op: there, the same cell of
        # plain ops (equal to float rounding)
        step = _lstm_cell if under_torch_func() else _fused_lstm_cell
        for layer, cell in enumerate(self.cells):
            h, c = step(cell, x, (h_prev[layer], c_prev[layer]))
            hs.append(h)
            cs.append(c)
            x = h
        return x, (torch.stack(hs), torch.stack(cs))


def _fused_lstm_cell(cell: nn.LSTMCell, x: Tensor, state: tuple) -> tuple[Tensor, Tensor]:
    """`nn.LSTMCell`'s own step (one fused op)."""
    return cell(x, state)


def _lstm_cell(cell: nn.LSTMCell, x: Tensor, state: tuple) -> tuple[Tensor, Tensor]:
    """`nn.LSTMCell`'s step in plain ops (gate order input, forget, cell, output)."""
    h, c = state
    gates = F.linear(x, cell.weight_ih, cell.bias_ih) + F.linear(h, cell.weight_hh, cell.bias_hh)
    i, f, g, o = gates.chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


class FeedForwardController(nn.Module):
    """Stacked tanh layers; its state is empty, so the NTM's only memory is the external one."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int, **factory) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.layers = nn.ModuleList(
            nn.Linear(input_size if i == 0 else hidden_size, hidden_size, **factory)
            for i in range(num_layers)
        )

    def reset_parameters(self) -> None:
        for layer in self.layers:
            layer.reset_parameters()

    def initial_state(self, batch_size: int) -> tuple:
        return ()

    def forward(self, x: Tensor, state: tuple) -> tuple[Tensor, tuple]:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x, ()


CONTROLLERS: dict[str, type[nn.Module]] = {
    "lstm": LSTMController,
    "feedforward": FeedForwardController,
}


def under_torch_func() -> bool:
    """Whether a `torch.func` transform (grad, vmap, jacrev, ...) is running: nn.LSTMCell's fused
    op has no batching rule there, so a plain-op LSTM cell runs instead."""
    return torch._C._are_functorch_transforms_active()
