"""The paper's LSTM baseline: a stack of LSTM layers and a linear read-out, with `NTM`'s
interface."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["LSTMBaseline"]


class LSTMBaseline(nn.Module):
    """``nn.LSTM`` + ``nn.Linear`` with forget-gate bias 1;
    ``forward(x, state) -> (logits, state)``.

    Args:
        input_size: width of each input step.
        output_size: width of each output step (logits).
        hidden_size: units per layer.
        num_layers: LSTM layers.
        batch_first: inputs and outputs are ``[B, T, ...]``.
    """

    def __init__(self, input_size: int, output_size: int, *, hidden_size: int = 256,
                 num_layers: int = 3, batch_first: bool = False, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.input_size, self.output_size = input_size, output_size
        self.hidden_size, self.num_layers = hidden_size, num_layers
        self.batch_first = batch_first
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=batch_first, **factory)
        self.output = nn.Linear(hidden_size, output_size, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lstm.reset_parameters()
        self.output.reset_parameters()
        c = self.hidden_size
        with torch.no_grad():
            for layer in range(self.num_layers):
                getattr(self.lstm, f"bias_ih_l{layer}")[c : 2 * c].fill_(1.0)
                getattr(self.lstm, f"bias_hh_l{layer}")[c : 2 * c].fill_(0.0)

    def forward(self, x: Tensor, state=None) -> tuple[Tensor, tuple]:
        if x.dim() != 3 or x.shape[2] != self.input_size:
            layout = "[batch, time, %d]" if self.batch_first else "[time, batch, %d]"
            raise ValueError(
                f"LSTMBaseline expects input of shape {layout % self.input_size}, "
                f"got {list(x.shape)}"
            )
        h, state = self.lstm(x, state)
        return self.output(h), state
