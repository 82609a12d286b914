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

from torch import nn

from torch_ntm.layout import DNC_FIELDS, HEAD_FIELDS

__all__ = ["DESCRIPTIONS", "DNCCall", "Description", "MANNCall", "NATIVE", "NTMCall",
           "NTM_BLOCKS"]


class Description(ctypes.Structure):
    """The static sizes of a kernel call: subclasses declare ``_fields_`` of ``c_int64``,
    ``c_double`` and fixed arrays of them, and may add C++ declarations the struct's readers need
    (``cpp``: enums of indices into its arrays, say). `torch_ntm.engines.library.header` writes
    the C++ struct. ``name``: the kernels' name (a model's: ``"ntm"``); ``sources``: the files in
    csrc/ with the kernels that take it (several compile on several cores)."""

    cpp: str = ""
    name: str = ""
    sources: tuple[str, ...] = ()


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


class MANNCall(Description):
    """The static sizes of a call of the MANN's kernels (``torch_ntm_mann_forward``,
    ``torch_ntm_mann_backward``): the C++ struct of the same name in the generated ``calls.h``."""

    _fields_ = [
        ("steps", ctypes.c_int64), ("batch", ctypes.c_int64),  # T, B
        ("controller", ctypes.c_int64), ("heads", ctypes.c_int64),  # C, H
        ("width", ctypes.c_int64), ("rows", ctypes.c_int64),  # M, N
        # Each head's outputs of the head layer, and where alpha, add (-1: the key is written)
        # and beta (-1: beta = 1) lie among them (the key first), from `MANN.head_fields`.
        ("fields", ctypes.c_int64), ("alpha", ctypes.c_int64), ("add", ctypes.c_int64),
        ("beta", ctypes.c_int64),
        ("keep_all", ctypes.c_int64),  # every step's state, for the backward
        ("decay", ctypes.c_double),  # the usage decay gamma
    ]
    name = "mann"
    sources = ("mann.cpp",)


class DNCCall(Description):
    """The static sizes of a call of the DNC's kernels (``torch_ntm_dnc_forward``,
    ``torch_ntm_dnc_backward``): the C++ struct of the same name in the generated ``calls.h``."""

    _fields_ = [
        ("steps", ctypes.c_int64), ("batch", ctypes.c_int64),  # T, B
        ("controller", ctypes.c_int64), ("read_heads", ctypes.c_int64),  # C, R
        ("width", ctypes.c_int64), ("rows", ctypes.c_int64),  # W, N
        ("fields", ctypes.c_int64),  # P, the interface layer's outputs
        # where each field of the interface starts among them (DNC_FIELDS' order)
        *((field.name, ctypes.c_int64) for field in DNC_FIELDS),
        ("keep_all", ctypes.c_int64),  # every step's state, for the backward
    ]
    name = "dnc"
    sources = ("dnc.cpp",)

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
