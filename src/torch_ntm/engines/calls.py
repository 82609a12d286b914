"""The native engines' table: each model's kernel call, described once.

A call of a model's C++ kernels takes its static sizes as one struct, ``NTMCall``, ``MANNCall`` or
``DNCCall`` here (a ctypes `Description`); `torch_ntm.engines.library` writes every one of them
into the generated ``calls.h`` (C++ structs of the same layout, checked by ``static_assert``s)
that the kernels compile against, so the sizes are declared in one place. `NATIVE` names, by
model, the module that runs its sequences (imported when a model first runs natively, by
`torch_ntm.engines.native`) and its call: a fourth model's native engine is a row here, a module
beside the others and a C++ file.

This module imports no engine: the models, the library and the engines all read it.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

from torch import nn

from torch_ntm.layout import DNC_FIELDS, HEAD_FIELDS, LRUA_FIELDS

__all__ = ["Buffer", "DESCRIPTIONS", "DNCCall", "Description", "MANNCall", "NATIVE", "NTMCall",
           "NTM_BLOCKS"]


class Buffer(NamedTuple):
    """One buffer that a forward call fills and its backward reads: ``count`` of ``shape`` each,
    where ``count`` is "slots" (every step's state and the initial one, T + 1; two for inference),
    "steps" (T, always) or "kept" (every step's intermediates, T; one for inference), and the
    shape's sizes are expressions of the call's fields. One allocation, or with ``blocks`` one per
    slot or step (a large buffer: the heap reuses such blocks between calls, where one allocation
    of them all would be mapped afresh every call); ``blocks="large"``: in blocks where one slot
    or step takes 1 MB or more. ``per``: one such buffer per layer, that many (an expression),
    whose shape may read ``layer``. `torch_ntm.engines.library` allocates them (`allocate`),
    passes their addresses in this order (`arguments`) and generates the C++ that reads them
    (``calls.h``: a struct with one accessor per buffer)."""

    name: str
    count: str
    shape: tuple[str, ...]
    blocks: bool | str = False
    per: str = ""


def _lstm_sizes(heads: str) -> list:
    """The sizes a call of the kernels of a one-layer LSTM with memory (the MANN's, the DNC's)
    starts with, as common.h's ``call_sizes`` reads them: T, B, C, the ``heads`` that read, the
    memory's width and rows, and X, the controller's input width besides the reads (the columns
    of its ``weight_ih`` before theirs)."""
    return [("steps", ctypes.c_int64), ("batch", ctypes.c_int64),  # T, B
            ("controller", ctypes.c_int64), (heads, ctypes.c_int64),  # C, the read heads
            ("width", ctypes.c_int64), ("rows", ctypes.c_int64),  # the memory's, and N
            ("inputs", ctypes.c_int64)]  # X


def _lstm_buffers(reads: str) -> tuple[Buffer, ...]:
    """The buffers of a one-layer LSTM controller that reads ``[reads, h]`` besides its input
    (the MANN's and the DNC's kernels), ``reads`` the width of the reads (an expression of the
    call's fields). The cells come first: `torch_ntm.engines.lstm_memory` reads the steps and the
    batch off them."""
    return (Buffer("cell", "slots", ("batch", "controller")),  # the LSTM's cells
            Buffer("hs", "steps", ("batch", "controller")),  # the LSTM's outputs
            # the recurrent matmul's input [reads, h] of the step before
            Buffer("z", "kept", ("batch", f"{reads} + controller")),
            Buffer("act", "kept", ("batch", "4 * controller")))  # activated gates (i, f, g, o)


def _field_tables(prefix: str, fields: tuple, activations: tuple[str, ...],
                  sizes: tuple[str, ...]) -> list[str]:
    """C++ declarations of a model's head fields (``fields``: a layout's table of NamedTuples
    with ``name``, ``size`` and ``activation``): enums of the fields (``{prefix}_{NAME}``, in
    the table's order), of the ``activations`` and of the ``sizes`` a field may have, and by
    field its size and activation (``k{Prefix}Size``, ``k{Prefix}Activation``), which the
    kernels assert are those they implement. A call then says where each field starts."""
    def enum(kind: str, names) -> str:
        return f"enum {prefix}{kind} : int {{ " + ", ".join(
            f"{prefix}_{name.upper()}" for name in names) + " };"

    def table(kind: str, column: str) -> str:
        return f"constexpr {prefix}{kind} k{prefix.title()}{kind}[] = {{" + ", ".join(
            f"{prefix}_{getattr(f, column).upper()}" for f in fields) + "};"

    return [enum("Field", (f.name for f in fields)), enum("Activation", activations),
            enum("Size", sizes), table("Size", "size"), table("Activation", "activation")]


def _field_starts(prefix: str, call: str, fields: tuple) -> str:
    """C++ of ``{prefix.lower()}_starts(call)``: where a call (of struct ``call``, whose fields
    are named after the head fields) puts each head field, in the table's order (`_field_tables`'
    enum indexes it)."""
    return (f"inline std::array<int64_t, {len(fields)}> {prefix.lower()}_starts(const {call}& d) "
            "{\n  return {" + ", ".join(f"d.{f.name}" for f in fields) + "};\n}")


class Description(ctypes.Structure):
    """The static sizes of a kernel call: subclasses declare ``_fields_`` of ``c_int64``,
    ``c_double`` and fixed arrays of them, and may add C++ declarations the struct's readers need
    (``cpp``: enums of indices into its arrays, say). `torch_ntm.engines.library.header` writes
    the C++ struct. ``name``: the kernels' name (a model's: ``"ntm"``); ``sources``: the files in
    csrc/ with the kernels that take it (several compile on several cores)."""

    cpp: str = ""
    cpp_after: str = ""  # C++ declarations after the struct (that read it)
    name: str = ""
    sources: tuple[str, ...] = ()
    # Where a call passes its buffers (`Buffer`) rather than a layout of its own: the table, in
    # the order of the addresses, and the names of the addresses before them, of the forward
    # call and of the backward call (the generated ``calls.h`` numbers them, so the C++ reads
    # each by name).
    buffers: tuple[Buffer, ...] = ()
    forward_args: tuple[str, ...] = ()
    backward_args: tuple[str, ...] = ()


# The NTM kernels' blocks of the head layer's rows, by activation, in this order
# (`torch_ntm.engines.ntm.head_blocks`).
NTM_BLOCKS = ("tanh", "sigmoid", "softplus", "softmax")


class NTMCall(Description):
    """The static sizes of a call of the NTM's kernels (``torch_ntm_forward``,
    ``torch_ntm_backward``): the C++ struct of the same name in the generated ``calls.h``."""

    _fields_ = [
        ("steps", ctypes.c_int64), ("batch", ctypes.c_int64),  # T, B
        ("layers", ctypes.c_int64), ("hidden", ctypes.c_int64),  # L, C
        ("read_heads", ctypes.c_int64), ("write_heads", ctypes.c_int64),  # Hr, Hw
        ("width", ctypes.c_int64), ("rows", ctypes.c_int64), ("shifts", ctypes.c_int64),  # M, N, S
        ("lstm", ctypes.c_int64), ("keep_all", ctypes.c_int64),
        # The permuted head layer: where each block ends (the tanh block starts at 0), and where
        # head 0 of each kind has each field (`field_start[2 * field + kind]`, kind 0 write, 1
        # read; -1: that kind has no such field) and the field's width.
        ("block_end", ctypes.c_int64 * len(NTM_BLOCKS)),
        ("field_start", ctypes.c_int64 * (2 * len(HEAD_FIELDS))),
        ("field_width", ctypes.c_int64 * len(HEAD_FIELDS)),
        ("beta_cap", ctypes.c_double), ("gamma_cap", ctypes.c_double),  # 0: none
        ("tiny", ctypes.c_double),  # the dtype's smallest normal number
    ]
    name = "ntm"
    sources = ("ntm_forward.cpp", "ntm_backward.cpp")
    cpp = "enum HeadField : int { " + ", ".join(
        f"{f.name.upper()} = {i}" for i, f in enumerate(HEAD_FIELDS)) + " };"
    # What the forward fills and the backward reads (csrc/ntm.h), memory transposed ([M, N] per
    # batch element) and the head layer's outputs in the kernels' blocks (``raw``, P of them:
    # where the softmax block ends).
    buffers = (
        Buffer("h", "slots", ("layers", "batch", "hidden")),  # each layer's output
        Buffer("cell", "slots", ("layers * lstm", "batch", "hidden")),  # the LSTMs' cells
        Buffer("msq", "slots", ("batch", "rows")),  # the memory rows' squared norms
        Buffer("wr", "slots", ("batch", "read_heads", "rows")),
        Buffer("ww", "slots", ("batch", "write_heads", "rows")),
        Buffer("hs", "steps", ("batch", "hidden")),  # the top layer's output
        Buffer("reads", "steps", ("batch", "read_heads", "width")),
        Buffer("raw", "kept", ("batch", "block_end[3]")),
        Buffer("mem", "slots", ("batch", "width", "rows"), blocks="large"),
        # the heads' cosine similarities, write heads first
        Buffer("addr", "kept", ("batch", "read_heads + write_heads", "rows"), blocks="large"),
        # each layer's matmul input: [reads, h] for layer 0, [the layer below's h, h] above (an
        # LSTM), without h for feed-forward layers
        Buffer("z", "kept", ("batch", "(read_heads * width if layer == 0 else hidden) + lstm * "
                             "hidden"), per="layers"),
        # the LSTMs' activated gates (i, f, g, o), or a feed-forward layer's output
        Buffer("act", "kept", ("batch", "4 * hidden if lstm == 1 else hidden"), per="layers"),
    )
    # then, after the buffers, each layer's weights [G, in + C] (G = 4C for an LSTM, gates i, f,
    # o, g; C feed-forward) and the biases of layers 1 and up
    forward_args = ("xpre", "wp", "bp", "reads0")
    # the gradients of the outputs, those of the initial state (each carried in the state's: the
    # initial state's on return) and draw; then, after the buffers, each layer's weights and
    # each layer's dpre [T, B, G] (written)
    backward_args = ("wp", "dhs", "dreads", "dmem", "dwr", "dww", "dreads0", "dh", "dc", "draw")


class MANNCall(Description):
    """The static sizes of a call of the MANN's kernels (``torch_ntm_mann_forward``,
    ``torch_ntm_mann_backward``): the C++ struct of the same name in the generated ``calls.h``."""

    _fields_ = [
        *_lstm_sizes("heads"),  # T, B, C, H, M, N
        # Each head's outputs of the head layer, and where each field of `LRUA_FIELDS` starts
        # among them (-1: absent; add: the key is written, beta: beta = 1), from
        # `MANN.head_fields`.
        ("fields", ctypes.c_int64), *((field.name, ctypes.c_int64) for field in LRUA_FIELDS),
        ("keep_all", ctypes.c_int64),  # every step's state, for the backward
        ("decay", ctypes.c_double),  # the usage decay gamma
    ]
    name = "mann"
    sources = ("mann.cpp",)
    # Each head's fields as `LRUA_FIELDS` describes them (widths and activations), which
    # mann.cpp checks against what it implements.
    cpp = "\n".join(_field_tables("MANN", LRUA_FIELDS, ("tanh", "sigmoid", "softplus"),
                                  ("width", "one")))
    cpp_after = _field_starts("MANN", "MANNCall", LRUA_FIELDS)
    buffers = (
        *_lstm_buffers("heads * width"),
        Buffer("mem", "slots", ("batch", "width", "rows")),  # memory, transposed
        Buffer("msq", "slots", ("batch", "rows")),  # its rows' squared norms (slot 0 unused)
        Buffer("usage", "slots", ("batch", "rows")),
        Buffer("wr", "slots", ("batch", "heads", "rows")),  # read weightings
        Buffer("lu", "slots", ("batch", "rows")),  # the least-used rows
        Buffer("reads", "steps", ("batch", "heads", "width")),
        Buffer("raw", "kept", ("batch", "heads * fields")),  # the head layer's outputs
        Buffer("cos", "kept", ("batch", "heads", "rows")),  # cosine similarities
    )
    # work: [2, B, M, N], where every step's memory is kept, the last two steps' (unused else)
    forward_args = ("xpre", "wih", "whh", "wp", "bp", "h0", "reads0", "work")
    # the gradients of the outputs, those of the initial state (each carried in the state's: the
    # initial state's on return), then the outputs dgates and draw
    backward_args = ("wih", "whh", "wp", "dhs", "dreads", "dmem", "dusage", "dwr", "dreads0",
                     "dh", "dc", "dlu", "dgates", "draw")


class DNCCall(Description):
    """The static sizes of a call of the DNC's kernels (``torch_ntm_dnc_forward``,
    ``torch_ntm_dnc_backward``): the C++ struct of the same name in the generated ``calls.h``."""

    _fields_ = [
        *_lstm_sizes("read_heads"),  # T, B, C, R, W, N
        ("fields", ctypes.c_int64),  # P, the interface layer's outputs
        # where each field of the interface starts among them (DNC_FIELDS' order)
        *((field.name, ctypes.c_int64) for field in DNC_FIELDS),
        ("keep_all", ctypes.c_int64),  # every step's state, for the backward
    ]
    name = "dnc"
    sources = ("dnc.cpp",)
    # The interface's fields as `DNC_FIELDS` describes them: an index each, and by index the
    # heads it has (R read or one write head), its width per head (W, 1 or the 3 read modes of
    # one write head) and its activation, which dnc.cpp checks against what it implements.
    cpp = "\n".join([
        *_field_tables("DNC", DNC_FIELDS, ("none", "oneplus", "sigmoid", "softmax"),
                       ("width", "one", "modes")),
        "constexpr bool kDncReadHeads[] = {" + ", ".join(
            "true" if f.heads == "read" else "false" for f in DNC_FIELDS) + "};"])
    cpp_after = _field_starts("DNC", "DNCCall", DNC_FIELDS)
    buffers = (
        *_lstm_buffers("read_heads * width"),
        Buffer("mem", "slots", ("batch", "rows", "width")),
        Buffer("usage", "slots", ("batch", "rows")),
        Buffer("prec", "slots", ("batch", "rows")),  # precedence
        Buffer("wr", "slots", ("batch", "read_heads", "rows")),  # read weightings
        Buffer("ww", "slots", ("batch", "rows")),  # the write weighting
        Buffer("reads", "steps", ("batch", "read_heads", "width")),
        Buffer("raw", "kept", ("batch", "fields")),  # the interface layer's outputs
        Buffer("fwd", "kept", ("batch", "read_heads", "rows")),  # forward weightings
        Buffer("bwd", "kept", ("batch", "read_heads", "rows")),  # backward weightings
        # the link matrices, the largest buffer (44 MB at N = 128, T = 41, B = 16)
        Buffer("link", "slots", ("batch", "rows", "rows"), blocks=True),
    )
    forward_args = ("xpre", "wih", "whh", "wp", "bp", "h0", "reads0")
    # the gradients of the outputs, those of the initial state (each carried in the state's: the
    # initial state's on return), then the outputs dgates and draw
    backward_args = ("wih", "whh", "wp", "dhs", "dreads", "dmem", "dusage", "dlink", "dprec",
                     "dwr", "dww", "dreads0", "dh", "dc", "dgates", "draw")

    @staticmethod
    def why_not(model: nn.Module) -> str | None:
        """Why the kernels cannot run the DNC ``model``, or None if they can."""
        if model.controller_type != "lstm" or model.controller_layers != 1:
            return ("the native DNC engine runs a one-layer LSTM controller, not "
                    f"{model.controller_layers} {model.controller_type} layer(s)")
        if model.write_heads != 1:
            return f"the native DNC engine runs one write head, not {model.write_heads}"
        if model.sparse_link is not None:
            return "the native DNC engine runs the exact link matrix, not sparse_link"
        return None


# Every call the library's header declares, in its order.
DESCRIPTIONS = (NTMCall, MANNCall, DNCCall)
# Each model's native engine (the module under torch_ntm.engines) and its call, by model name.
NATIVE = {"ntm": ("torch_ntm.engines.ntm", NTMCall), "mann": ("torch_ntm.engines.mann", MANNCall),
          "dnc": ("torch_ntm.engines.dnc", DNCCall)}
