"""The paper's LSTM baseline: a stack of LSTM layers and a linear read-out, with `NTM`'s
interface."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from torch_ntm import engines

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
        engine: ``"auto"`` (default): on a CUDA GPU the graphs engine (`torch_ntm.engines`:
            the step below, captured over the sequence as CUDA graphs), elsewhere ``nn.LSTM``
            itself; ``"eager"``: ``nn.LSTM`` everywhere.
    """

    def __init__(self, input_size: int, output_size: int, *, hidden_size: int = 256,
                 num_layers: int = 3, batch_first: bool = False, engine: str = "auto",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.input_size, self.output_size = input_size, output_size
        self.hidden_size, self.num_layers = hidden_size, num_layers
        self.batch_first = batch_first
        self.engine = engines.check_engine(engine)
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

    def initial_state(self, batch_size: int, device: torch.device | str | None = None,
                      dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """``(h, c)``, zeros ``[num_layers, batch_size, hidden_size]`` each (``nn.LSTM``'s)."""
        like = self.output.weight
        zeros = torch.zeros(self.num_layers, batch_size, self.hidden_size,
                            device=device or like.device, dtype=dtype or like.dtype)
        return zeros, zeros.clone()

    def _step(self, x: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple]:
        """One time step of ``nn.LSTM``'s layers (``torch.lstm_cell`` with its weights) and the
        read-out: what the graphs engine captures. x: ``[B, input_size]``."""
        h, c = state
        hs, cs = [], []
        for layer in range(self.num_layers):
            weights = [getattr(self.lstm, f"{name}_l{layer}")
                       for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            x, c_layer = torch.lstm_cell(x, (h[layer], c[layer]), *weights)
            hs.append(x)
            cs.append(c_layer)
        return self.output(x), (torch.stack(hs), torch.stack(cs))

    def runs_on(self, x: Tensor) -> str:
        """The engine that `forward` runs on input ``x``: ``"graphs"`` or ``"eager"``
        (``nn.LSTM``); on a GPU, a shape whose capture failed is ``"eager"`` from then on."""
        steps = x.transpose(0, 1) if self.batch_first and x.dim() == 3 else x
        return engines.choose(self, steps, None)

    def forward(self, x: Tensor, state=None) -> tuple[Tensor, tuple]:
        if x.dim() != 3 or x.shape[2] != self.input_size:
            layout = "[batch, time, %d]" if self.batch_first else "[time, batch, %d]"
            raise ValueError(
                f"LSTMBaseline expects input of shape {layout % self.input_size}, "
                f"got {list(x.shape)}"
            )
        steps = x.transpose(0, 1) if self.batch_first else x
        if engines.choose(self, steps, None) == "graphs":
            from torch_ntm.engines import graphs

            if state is None:
                state = self.initial_state(steps.shape[1], steps.device, steps.dtype)
            y, state = graphs.forward(self, steps, tuple(state), self._step)
            return (y.transpose(0, 1) if self.batch_first else y), state
        h, state = self.lstm(x, state)
        return self.output(h), state
