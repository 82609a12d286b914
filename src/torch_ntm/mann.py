"""A memory-augmented neural network with Least Recently Used Access: `MANNCell` and `MANN`.

Santoro, Bartunov, Botvinick, Wierstra & Lillicrap (2016), "Meta-Learning with Memory-Augmented
Neural Networks", section 3. One time step (H read heads and as many write heads, one to one):

    h_t, ctrl_t = LSTM([x_t, r_{t-1}], ctrl_{t-1})
    k, alpha, a = one linear layer of h_t, split per head           (a: see ``write_vector``)
    w^w_t       = sigmoid(alpha) w^r_{t-1} + (1 - sigmoid(alpha)) w^lu_{t-1}
    M_t         = M_{t-1} with its least-used row (argmin w^u_{t-1}) zeroed, + sum_h w^w_h a_h^T
    w^r_t       = softmax(cosine(k, M_t))                           (beta = 1, or learned)
    r_t         = w^r_t M_t
    w^u_t       = gamma w^u_{t-1} + sum_h w^r_t + sum_h w^w_t
    w^lu_t      = the H rows of smallest usage w^u_t                (a 0/1 mask)
    y_t         = linear([h_t, r_t])                                (logits)

The addressing is in `torch_ntm.functional` (`lrua_write_weights`, `lrua_write`, `update_usage`,
`least_used`, `content_weights`). As for `torch_ntm.model.NTM`, all state is explicit
(`MANNState`), modules hold parameters only, and no parameter's shape depends on the number of
memory rows N.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from torch_ntm import engines
from torch_ntm import functional as ntmf
from torch_ntm.base import Cell, MemoryModule
from torch_ntm.checks import positive_fields, positive_int
from torch_ntm.layout import LRUALayout
from torch_ntm.model import MEMORY_INIT_CONSTANT
from torch_ntm.sequence import SequenceModel
from torch_ntm.states import MANNState

__all__ = ["ENCODERS", "ENGINES", "ConvEncoder", "MANN", "MANNCell", "MANNOptions", "MANNState",
           "WRITE_VECTORS"]

# How `MANN.forward` computes the sequence (the same function, to float rounding, on each):
# `torch_ntm.engines` says what each is and which serves which call.
ENGINES = engines.ENGINES

# What a write head adds to memory. "add": its own add vector a_h = tanh(W h_t) (an NTM-style
# write, which lets what is stored differ from what it is found by); "key": the key of read head
# h, as in the paper (M_t(i) = M_{t-1}(i) + w^w_t(i) k_t), so memory holds the keys it is read by.
WRITE_VECTORS = ("add", "key")

# What the controller reads of an input step: "none", the step itself (the paper); "conv", the
# image that opens the step through `ConvEncoder`'s two convolutions, then the rest of the step;
# "conv+pixels", those features, then the whole step (pixels too).
ENCODERS = ("none", "conv", "conv+pixels")
CONV_CHANNELS = (16, 32)  # feature maps of `ConvEncoder`'s two layers


class ConvEncoder(nn.Module):
    """Features of the square image that opens each input step, for the controller to read.

    The first ``image_size ** 2`` values of a step are the image, row by row (an Omniglot
    episode's 20 x 20 pixels); two convolutions, each 4 x 4 with stride 2 and padding 1 and
    followed by ReLU, give ``CONV_CHANNELS`` feature maps of half the side each time (20 x 20 ->
    16 x 10 x 10 -> 32 x 5 x 5), flattened channel by channel; the rest of the step (the
    previous label) follows them unchanged, or with ``keep_pixels`` the whole step does, pixels
    included. ``output_size`` is the width of the result (800 + 5 on Omniglot's 405; 800 + 405
    keeping the pixels). Weights shared over positions are meant to let features of strokes
    seen in some alphabets serve others, where the paper's controller, reading the pixels
    through one dense layer, learns them at every position anew (what they did on the embedded
    alphabets: docs/results/omniglot.md).

    Args:
        input_size: width of an input step (the image and what follows it).
        image_size: side of the square image (>= 4).
        keep_pixels: the pixels follow the features (the controller reads both).
    """

    def __init__(self, input_size: int, image_size: int, keep_pixels: bool = False,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        pixels = positive_int("image_size", image_size) ** 2
        if image_size < 4:
            raise ValueError(f"image_size must be >= 4 for two 4 x 4 convolutions with stride "
                             f"2, got {image_size}")
        if pixels > input_size:
            raise ValueError(f"image_size={image_size} needs {pixels} input values per step for "
                             f"its image, but input_size is {input_size}: give the side of the "
                             f"square image that opens each step")
        self.image_size, self.keep_pixels = image_size, keep_pixels
        convs, side, width = [], image_size, 1
        for channels in CONV_CHANNELS:
            convs.append(nn.Conv2d(width, channels, 4, stride=2, padding=1, device=device,
                                   dtype=dtype))
            side, width = (side + 2 - 4) // 2 + 1, channels
        self.convs = nn.ModuleList(convs)
        self.output_size = width * side * side + input_size - (0 if keep_pixels else pixels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """He's initialisation for ReLU layers (normal, variance 2 / fan-in; biases 0), which
        keeps the features at the pixels' scale, where torch's default shrinks them (measured:
        docs/results/omniglot.md)."""
        for conv in self.convs:
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
            nn.init.zeros_(conv.bias)

    def forward(self, x: Tensor) -> Tensor:
        """``[..., input_size]`` -> ``[..., output_size]``."""
        side = self.image_size
        image = x[..., :side * side].reshape(-1, 1, side, side)
        for conv in self.convs:
            image = torch.relu(conv(image))
        rest = x if self.keep_pixels else x[..., side * side:]
        return torch.cat([image.reshape(*x.shape[:-1], -1), rest], -1)


@dataclass
class MANNOptions:
    """The architecture of a MANN: the keyword arguments of `MANN` and `MANNCell` but
    ``batch_first``, ``device`` and ``dtype`` (documented in `MANN`)."""

    controller_size: int = 200
    memory_size: int = 128
    memory_width: int = 40
    read_heads: int = 4
    usage_decay: float = ntmf.USAGE_DECAY
    write_vector: str = "add"
    learned_beta: bool = False
    encoder: str = "none"
    image_size: int = 20

    def checked(self) -> MANNOptions:
        """These options, with ``usage_decay`` as a float.

        Raises:
            ValueError: naming the first invalid option and what it must be.
        """
        positive_fields(self, "controller_size", "memory_size", "memory_width", "read_heads")
        decay = self.usage_decay
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay <= 1:
            raise ValueError(f"usage_decay must be a number in [0, 1], got {decay!r}")
        if self.write_vector not in WRITE_VECTORS:
            raise ValueError(f"unknown write_vector {self.write_vector!r}; valid choices: "
                             f"{', '.join(WRITE_VECTORS)}")
        if not isinstance(self.learned_beta, bool):
            raise ValueError(f"learned_beta must be True or False, got {self.learned_beta!r}")
        if self.encoder not in ENCODERS:
            raise ValueError(f"unknown encoder {self.encoder!r}; valid choices: "
                             f"{', '.join(ENCODERS)}")
        positive_int("image_size", self.image_size)
        if self.read_heads > self.memory_size:
            raise ValueError(
                f"read_heads={self.read_heads} least-used rows are marked each step, so "
                f"memory_size must be >= read_heads, got memory_size={self.memory_size}"
            )
        return dataclasses.replace(self, usage_decay=float(decay))


class _MANNBase(MemoryModule):
    """The MANN's spec on `torch_ntm.base.MemoryModule` (options, state, layout, step), shared
    by `MANNCell` and `MANN`. Its controller is always one LSTM layer."""

    Options = MANNOptions
    State = MANNState

    def _build_encoder(self, factory: dict) -> int:
        # what the controller reads of a step (`encode`): None, the step itself
        opt = self.options
        self.features = (None if opt.encoder == "none" else ConvEncoder(
            self.input_size, opt.image_size, keep_pixels=opt.encoder == "conv+pixels",
            **factory))
        return self.input_size if self.features is None else self.features.output_size

    def _layout(self) -> LRUALayout:
        # the heads' fields and step (torch_ntm.layout): what the engines read of the heads
        opt = self.options
        return LRUALayout(opt.read_heads, opt.memory_width, opt.write_vector, opt.learned_beta,
                          opt.usage_decay)

    def _reset_own(self) -> None:
        if self.features is not None:
            self.features.reset_parameters()

    def encode(self, x: Tensor) -> Tensor:
        """What the controller reads of input steps ``[..., input_size]``: ``x`` itself, or its
        `ConvEncoder` features (and the step) with a ``"conv"`` encoder. A function of each
        step alone, so the engines encode a whole sequence at once and the loop one step at a
        time."""
        return x if self.features is None else self.features(x)

    @property
    def head_fields(self) -> dict[str, int]:
        """Each head's fields in the head layer's output, in order, name to width: ``key`` (M),
        ``alpha`` (1), then ``add`` (M) if ``write_vector == "add"`` and ``beta`` (1) if
        ``learned_beta``. Head h's fields are the h-th block of ``sum(widths)`` outputs."""
        return self.head_layout.fields

    def _initial_state(self, batch_size: int, controller: tuple, device, dtype) -> MANNState:
        """Nothing read or written yet: memory a small constant
        (`torch_ntm.model.MEMORY_INIT_CONSTANT`, as NTM's ``memory_init="constant"``); usage,
        read weightings and read vectors zero (r_0 = w^r_0 M_0 = 0), so the first write goes
        to the least-used rows, rows 0..H-1 of the all-zero usage; the LSTM's ``(h, c)``
        learned."""
        b, n, m, h = batch_size, self.memory_size, self.memory_width, self.read_heads
        usage = torch.zeros(b, n, device=device, dtype=dtype)
        return MANNState(
            controller=controller,
            memory=torch.full((b, n, m), MEMORY_INIT_CONSTANT, device=device, dtype=dtype),
            usage=usage,
            read_weights=torch.zeros(b, h, n, device=device, dtype=dtype),
            least_used=ntmf.least_used(usage, h),
            reads=torch.zeros(b, h, m, device=device, dtype=dtype),
        )

    def _state_shapes(self, batch_size: int) -> dict[str, tuple[int, ...]]:
        b, n, m, h = batch_size, self.memory_size, self.memory_width, self.read_heads
        return {"memory": (b, n, m), "usage": (b, n), "read_weights": (b, h, n),
                "least_used": (b, n), "reads": (b, h, m)}

    def _advance(self, x: Tensor, state: MANNState,
                 record: bool = False) -> tuple[Tensor, MANNState]:
        """One time step up to the output layer. x: ``[B, input_size]``. Returns ``(h [B,
        controller_size], state)`` (a MANN records nothing: ``record`` is ignored)."""
        b = x.shape[0]
        x = self.encode(x)
        h, ctrl = self.controller(torch.cat([x, state.reads.reshape(b, -1)], -1), state.controller)
        memory, usage, w_read, least_used, reads = self.head_layout.heads_step(
            self.head_params(h), state.memory, state.usage, state.read_weights, state.least_used)
        return h, MANNState(ctrl, memory, usage, w_read, least_used, reads)


class MANNCell(Cell, _MANNBase):
    """One step of a MANN (`torch_ntm.base.Cell`): `MANN`'s constructor arguments (but
    ``batch_first`` and ``engine``) and parameter names."""


class MANN(SequenceModel, _MANNBase):
    """A memory-augmented neural network with LRUA (Santoro et al. 2016) over sequences, with an
    `nn.LSTM`-like interface (as `torch_ntm.NTM`).

    Args:
        input_size: width of each input step (for Omniglot episodes: the image features and the
            previous step's one-hot label).
        output_size: width of each output step (logits).
        controller_size: hidden units of the LSTM controller (the paper: 200).
        memory_size: N, rows of memory (the paper: 128).
        memory_width: M, width of a row (the paper: 40).
        read_heads: H, read heads, each with its own key; each has a write head with its own
            alpha (and add vector); H rows are marked least used each step (the paper: 4).
        usage_decay: gamma in [0, 1] (default `torch_ntm.functional.USAGE_DECAY`, 0.95).
        write_vector: what a write head adds, ``"add"`` (its own tanh add vector, default) or
            ``"key"`` (its read head's key, as in the paper); see `WRITE_VECTORS`.
        learned_beta: False (default) reads with beta = 1, the paper's softmax of cosine
            similarities; True lets each read head emit a key strength ``softplus(.)``.
        encoder: what the controller reads of each input step (`ENCODERS`): ``"none"``
            (default) the step itself, as in the paper; ``"conv"`` the `ConvEncoder` features
            of the image that opens the step, then the rest of the step; ``"conv+pixels"``
            those features, then the whole step.
        image_size: side of that image with a ``"conv"`` encoder (default 20: an Omniglot
            episode's 20 x 20 pixels, the first 400 values of each step); unused without it.
        batch_first: inputs and outputs are ``[B, T, ...]`` instead of ``[T, B, ...]``.
        engine: how `forward` runs, the same function on each (`torch_ntm.engines`):
            ``"auto"`` (default) the fastest engine that can serve the call: ``"native"`` on
            the CPU (`torch_ntm.engines.mann`), ``"graphs"`` on a CUDA GPU, else ``"eager"``
            (the loop of steps with plain autograd), saying once why. May be changed on a built
            module by assigning ``mann.engine``.
        device: of the parameters.
        dtype: of the parameters.

    Memory starts at a small constant for every call without a state; ``forward(x, state)``
    carries a state on. No parameter depends on N: a trained model loads into a larger memory.

    Example:

        mann = MANN(25, 5)
        logits, state = mann(x)             # x: (T, B, 25) -> logits (T, B, 5)
    """

    _native = "mann"
