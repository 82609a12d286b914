"""What `NTM`, `MANN` and `DNC` share over sequences: `SequenceModel`.

Each model is a cell base (its parameters, `initial_state`, the checks of its inputs and state,
and ``_step``, the eager step that is its specification) with this class in front of it, which
runs the step over a sequence: the layout (``batch_first``), the engine (`torch_ntm.engines`),
`PackedSequence` inputs, and the loop that `torch.export` traces. A reader following ``x`` from
``forward`` goes down into one engine here and comes back with ``(y, state)``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from torch_ntm import engines
from torch_ntm.checks import one_dtype, sequence_layout, time_major
from torch_ntm.packed import forward_packed

__all__ = ["SequenceModel"]


class SequenceModel:
    """A model over sequences, in front of a `torch_ntm.base.MemoryModule` (its parameters,
    ``State``, ``initial_state``, checks and ``_step(x_t, state) -> (y_t, state)``).

    A subclass names its native engine (``_native``: its row of `torch_ntm.engines.calls.NATIVE`,
    None without one; the engine's module is imported on the first native call), and, if it
    records a trace, its type (``_trace_type``) and ``_trace_row``.

    Args (beyond the model's):
        batch_first: inputs and outputs are ``[B, T, ...]`` instead of ``[T, B, ...]``.
        engine: how `forward` runs (`torch_ntm.engines`), changeable later by assigning
            ``model.engine``.
    """

    _native: ClassVar[str | None] = None
    _trace_type: ClassVar[type | None] = None  # what `trace` records, if the model has one

    def __init__(self, input_size: int, output_size: int, *, batch_first: bool = False,
                 engine: str = "auto", device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, **options) -> None:
        super().__init__(input_size, output_size, device=device, dtype=dtype, **options)
        self.batch_first = bool(batch_first)
        self.engine = engine

    @property
    def engine(self) -> str:
        return self._engine

    @engine.setter
    def engine(self, value: str) -> None:
        self._engine = engines.check_engine(value)

    def runs_on(self, x: Tensor) -> str:
        """The engine that `forward` runs on input ``x`` (time-major or batch first, as
        `forward` takes it): ``"native"``, ``"graphs"`` or ``"eager"``
        (`torch_ntm.engines.choose`). On a GPU, a shape whose capture failed is ``"eager"``
        from then on."""
        steps = x.transpose(0, 1) if self.batch_first and x.dim() == 3 else x
        return engines.choose(self, steps, engines.native_call(self._native))

    def extra_repr(self) -> str:
        return (super().extra_repr() + (", batch_first=True" if self.batch_first else "")
                + (f", engine={self.engine!r}" if self.engine != "auto" else ""))

    def config(self) -> dict:
        return {**super().config(), "batch_first": self.batch_first}

    def _prepare(self, x: Tensor, state):
        """``x`` time-major and checked, and the state to start from (``state``, checked, or
        the initial state)."""
        name = type(self).__name__
        if isinstance(x, PackedSequence):
            raise TypeError(f"{name}.trace takes a padded tensor, not a PackedSequence: unpack "
                            f"it with torch.nn.utils.rnn.pad_packed_sequence")
        x = time_major(self, x)
        self._check_dtype(x)
        if state is None:
            state = self.initial_state(x.shape[1], x.device, x.dtype)
        else:
            self._check_state(state, x.shape[1], x)
        return x, state

    def _finish(self, y: Tensor) -> Tensor:
        """Time-major outputs ``[T, B, output_size]`` in the module's layout."""
        return y.transpose(0, 1) if self.batch_first else y

    def forward(self, x: Tensor | PackedSequence,
                state: tuple | None = None) -> tuple[Tensor | PackedSequence, tuple]:
        """Args:
            x: ``[T, B, input_size]`` (``[B, T, input_size]`` if ``batch_first``), or a
                `PackedSequence` of sequences of different lengths (as for `nn.LSTM`).
            state: the model's state to continue from (`NTMState`, `MANNState`, `DNCState`),
                or None for `initial_state`; for a packed input, in the order of the sequences
                before packing.

        Returns:
            ``(logits, state)``, logits ``[T, B, output_size]`` (or batch first), or a
                `PackedSequence` like ``x`` for a packed input; the state after each sequence's
                own last step.
        """
        name = type(self).__name__
        if torch.jit.is_tracing():  # it failed in the initial state, on a traced batch size
            raise RuntimeError(
                f"{name} does not support torch.jit.trace (a trace would also fix the sequence "
                f"length); use torch.export.export(model, (x,), dynamic_shapes=...), which "
                f"traces one program for every length (docs/guide.md, Export)")
        if isinstance(x, PackedSequence):  # run in pieces that end where some sequence ends
            return forward_packed(x, state, self._forward_padded, batch_first=self.batch_first,
                                  input_size=self.input_size, name=name)
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} expects a tensor of shape {sequence_layout(self)} or a "
                            f"PackedSequence, got {type(x).__name__}")
        return self._forward_padded(x, state)

    def _forward_padded(self, x: Tensor, state):
        if torch.compiler.is_exporting():
            return self._forward_scan(x, state)
        x, state = self._prepare(x, state)  # time-major, checked
        engine = engines.choose(self, x, engines.native_call(self._native))
        if engine == "native":
            y, state = engines.native(self._native).forward(self, x, state)
        elif engine == "graphs":
            from torch_ntm.engines import graphs

            y, state = graphs.forward(self, x, self._loop_state(state), self._step)
            state = self._public_state(state)
        else:
            outputs = []
            state = self._loop_state(state)
            for x_t in x:
                y, state = self._step(x_t, state)
                outputs.append(y)
            y, state = torch.stack(outputs), self._public_state(state)
        return one_dtype(self._finish(y), state, x)

    def trace(self, x: Tensor, state: tuple | None = None) -> tuple[Tensor, tuple, tuple]:
        """Like `forward`, and also records every step (`torch_ntm.model.NTMTrace`,
        `torch_ntm.dnc.DNCTrace`: weightings, memory and what each model's heads emit), for
        plots; always on the eager loop.

        Returns:
            ``(logits, state, trace)``; the trace's tensors are time-major ``[T, B, ...]``.
        """
        if self._trace_type is None:
            raise TypeError(f"{type(self).__name__} records no trace")
        x, state = self._prepare(x, state)
        outputs, rows = [], []
        state = self._loop_state(state)
        for x_t in x:
            y, state, record = self._step(x_t, state, record=True)
            outputs.append(y)
            rows.append(self._trace_row(state, record))
        trace = self._trace_type(*(torch.stack(column) for column in zip(*rows)))
        return (*one_dtype(self._finish(torch.stack(outputs)), self._public_state(state), x),
                trace)

    def _trace_row(self, state, record) -> tuple:
        """The model's: one step's fields of its trace, from the state after the step and what
        the step recorded."""
        raise NotImplementedError

    def _forward_scan(self, x: Tensor, state):
        """The eager step under torch's ``scan`` (what `torch.export` traces): one loop over a
        time axis of any length, where a Python loop would fix the traced length."""
        from torch._higher_order_ops.scan import scan

        x, state = self._prepare(x, state)
        layers, kind = len(state.controller), self.State

        def step(carry: tuple, x_t: Tensor) -> tuple[tuple, Tensor]:  # flat tensors in and out
            y, new = self._step(x_t, kind(tuple(carry[:layers]), *carry[layers:]))
            return (*new.controller, *new[1:]), y

        # scan needs the carry's leaves laid out as the step returns them
        flat = tuple(t.contiguous() for t in (*state.controller, *state[1:]))
        final, y = scan(step, flat, x)
        return self._finish(y), kind(tuple(final[:layers]), *final[layers:])
