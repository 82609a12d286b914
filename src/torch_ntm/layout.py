"""What the models' tensors mean, in one place: their recurrent states and head layers' outputs.

The model (`torch_ntm.model`) and its engines (`torch_ntm.engines`) both read these descriptions;
neither imports the other for them.

The head layer (``NTM.head_params``, one linear layer for all heads) emits the Hr read heads'
parameters first, then the Hw write heads', each head its fields in `HEAD_FIELDS` order:

    read head:   key (M) | beta (1) | gate (1) | shift (2R + 1) | gamma (1)
    write head:  key (M) | beta (1) | gate (1) | shift (2R + 1) | gamma (1) | erase (M) | add (M)

Trained weights depend on this order, so it is a stable contract. The MANN's heads are
`LRUALayout`; the DNC's interface vector is `DNCLayout` (its fields in `DNC_FIELDS` order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from torch_ntm import dnc_functional as dncf
from torch_ntm import functional as ntmf
from torch_ntm.states import DNCState, NTMState  # defined there, exported here as before

__all__ = ["NTMState", "HeadField", "HEAD_FIELDS", "HeadLayout", "HeadParameters", "LRUAField",
           "LRUA_FIELDS", "LRUALayout", "LRUAParameters", "soft_cap", "DNCState", "DNCField",
           "DNC_FIELDS", "DNCInterface", "DNCAccess", "DNCLayout"]


class HeadField(NamedTuple):
    """One addressing parameter a head emits."""

    name: str  # the paper's symbols: key k, beta, gate g, shift s, gamma, erase e, add a
    activation: str  # "tanh", "sigmoid", "softplus" (gamma: 1 + softplus) or "softmax"
    size: str  # "width" (M), "shifts" (2R + 1) or "one"
    write_only: bool = False


HEAD_FIELDS = (
    HeadField("key", "tanh", "width"),
    HeadField("beta", "softplus", "one"),
    HeadField("gate", "sigmoid", "one"),
    HeadField("shift", "softmax", "shifts"),
    HeadField("gamma", "softplus", "one"),
    HeadField("erase", "sigmoid", "width", write_only=True),
    HeadField("add", "tanh", "width", write_only=True),
)
HEAD_KINDS = ("read", "write")


class HeadParameters(NamedTuple):
    """Activated addressing parameters of all heads of one kind (paper's symbols)."""

    key: Tensor  # k, (B, H, M), tanh
    beta: Tensor  # beta, (B, H, 1), softplus
    gate: Tensor  # g, (B, H, 1), sigmoid
    shift: Tensor  # s, (B, H, 2R+1), softmax
    gamma: Tensor  # gamma, (B, H, 1), 1 + softplus
    erase: Tensor | None  # e, (B, H, M), sigmoid (write heads only)
    add: Tensor | None  # a, (B, H, M), tanh (write heads only)


def soft_cap(x: Tensor, cap: float) -> Tensor:
    """``cap * tanh(x / cap)``: ~x for x << cap, never above cap; ``cap = 0`` leaves x as is."""
    return x if cap == 0 else cap * torch.tanh(x / cap)


@dataclass(frozen=True)
class HeadLayout:
    """Where each head's fields lie in the head layer's output, for one model's sizes.

    Args:
        read_heads: Hr, the number of read heads.
        write_heads: Hw, the number of write heads.
        width: M, the memory width.
        shifts: 2R + 1, the shift distribution's width.
    """

    read_heads: int
    write_heads: int
    width: int
    shifts: int

    def fields(self, kind: str) -> dict[str, int]:
        """Name -> size of the fields of one head of ``kind`` ("read" or "write"), in order."""
        if kind not in HEAD_KINDS:
            raise ValueError(f"unknown head kind {kind!r}; valid: {', '.join(HEAD_KINDS)}")
        sizes = {"width": self.width, "shifts": self.shifts, "one": 1}
        return {f.name: sizes[f.size] for f in HEAD_FIELDS if kind == "write" or not f.write_only}

    def heads(self, kind: str) -> int:
        return self.read_heads if kind == "read" else self.write_heads

    def start(self, kind: str) -> int:
        """First output of the heads of ``kind``: the read heads come first."""
        return 0 if kind == "read" else self.read_heads * sum(self.fields("read").values())

    @property
    def size(self) -> int:
        """Outputs of the head layer, all heads together."""
        return self.start("write") + self.write_heads * sum(self.fields("write").values())

    def rows(self, kind: str, field: str) -> list[int]:
        """The head layer's outputs that hold ``field`` of every head of ``kind``, head by head."""
        fields = self.fields(kind)
        offset = list(fields).index(field)
        offset = sum(list(fields.values())[:offset])
        stride, base = sum(fields.values()), self.start(kind)
        return [base + h * stride + offset + i
                for h in range(self.heads(kind)) for i in range(fields[field])]

    def activate(self, raw: Tensor, kind: str, beta_cap: float = 0.0,
                 gamma_cap: float = 0.0) -> HeadParameters:
        """The activated parameters of the heads of ``kind`` from the head layer's output
        ``raw [B, size]``; beta and gamma - 1 are soft-capped at ``beta_cap`` and ``gamma_cap``
        (0: unbounded). Read heads have no erase or add (None)."""
        fields = self.fields(kind)
        start = self.start(kind)
        block = raw[:, start : start + self.heads(kind) * sum(fields.values())]
        parts = dict(zip(fields, torch.split(block.view(raw.shape[0], self.heads(kind), -1),
                                             list(fields.values()), dim=-1)))
        write = kind == "write"
        return HeadParameters(
            key=torch.tanh(parts["key"]),
            beta=soft_cap(ntmf.softplus(parts["beta"]), beta_cap),
            gate=torch.sigmoid(parts["gate"]),
            shift=torch.softmax(parts["shift"], dim=-1),
            gamma=1.0 + soft_cap(ntmf.softplus(parts["gamma"]), gamma_cap),
            erase=torch.sigmoid(parts["erase"]) if write else None,
            add=torch.tanh(parts["add"]) if write else None,
        )

    def heads_step(self, raw: Tensor, memory: Tensor, read_weights: Tensor, write_weights: Tensor,
                   beta_cap: float = 0.0, gamma_cap: float = 0.0) -> tuple:
        """The heads' part of a step, from the head layer's output ``raw [B, size]``: the write
        heads address the memory ``[B, N, M]`` as it was and write, then the read heads address
        and read the memory after the write (eq. 2-9).

        Returns:
            ``(memory, read_weights, write_weights, reads [B, Hr, M], (write, read))``, the
                last the activated `HeadParameters` of each kind (write is None without write
                heads).
        """
        wp = None
        if self.write_heads:
            wp = self.activate(raw, "write", beta_cap, gamma_cap)
            write_weights = ntmf.address(memory, write_weights, wp.key, wp.beta, wp.gate,
                                         wp.shift, wp.gamma)
            memory = ntmf.write(memory, write_weights, wp.erase, wp.add)
        rp = self.activate(raw, "read", beta_cap, gamma_cap)
        read_weights = ntmf.address(memory, read_weights, rp.key, rp.beta, rp.gate, rp.shift,
                                    rp.gamma)
        return memory, read_weights, write_weights, ntmf.read(memory, read_weights), (wp, rp)


class LRUAField(NamedTuple):
    """One field of a MANN head's part of the head layer's output."""

    name: str
    size: str  # "width" (M) or "one"
    activation: str  # "tanh", "sigmoid" or "softplus"
    needs: str = ""  # present only where the layout's option of this name holds (else always)


# Each MANN head's fields, in this order. alpha's sigmoid is applied inside
# `functional.lrua_write_weights` (the head layer's output is passed raw); the native kernels
# apply it with the others.
LRUA_FIELDS = (
    LRUAField("key", "width", "tanh"),
    LRUAField("alpha", "one", "sigmoid"),
    LRUAField("add", "width", "tanh", needs="own_add"),  # else the key is written
    LRUAField("beta", "one", "softplus", needs="learned_beta"),  # else beta = 1
)


class LRUAParameters(NamedTuple):
    """Activated parameters of all H heads of a MANN (a read head and its write head together)."""

    key: Tensor  # k, (B, H, M), tanh
    alpha: Tensor  # alpha, (B, H, 1), raw: `functional.lrua_write_weights` applies the sigmoid
    add: Tensor  # a, (B, H, M), tanh; the key itself when write_vector == "key"
    beta: Tensor  # beta, (B, H, 1), softplus if learned, else 1 (the paper's plain cosine)


@dataclass(frozen=True)
class LRUALayout:
    """A MANN's heads (Santoro et al. 2016, LRUA): where each head's fields lie in its head layer's
    output, and the heads' part of a step.

    Args:
        heads: H, read heads, each with its write head.
        width: M, the memory width.
        write_vector: ``"add"`` (each write head emits its own add vector) or ``"key"`` (it
            writes its read head's key).
        learned_beta: each read head emits a key strength (else beta = 1).
        decay: the usage decay gamma.
    """

    heads: int
    width: int
    write_vector: str
    learned_beta: bool
    decay: float

    @property
    def own_add(self) -> bool:
        """Whether each write head emits its own add vector (else it writes its read head's
        key)."""
        return self.write_vector == "add"

    @property
    def fields(self) -> dict[str, int]:
        """Each head's fields (`LRUA_FIELDS`), in order, name to width: ``key`` (M), ``alpha``
        (1), then ``add`` (M) if ``write_vector == "add"`` and ``beta`` (1) if
        ``learned_beta``; head h's fields are the h-th block of ``sum(widths)`` outputs."""
        return {f.name: self.width if f.size == "width" else 1 for f in LRUA_FIELDS
                if not f.needs or getattr(self, f.needs)}

    @property
    def size(self) -> int:
        """The width of the head layer's output: every head's fields."""
        return self.heads * sum(self.fields.values())

    def activate(self, raw: Tensor) -> LRUAParameters:
        """The activated fields of the head layer's output ``raw [B, H * sum(widths)]``."""
        fields = self.fields
        parts = dict(zip(fields, torch.split(raw.view(raw.shape[0], self.heads, -1),
                                             list(fields.values()), dim=-1)))
        key = torch.tanh(parts["key"])
        add = torch.tanh(parts["add"]) if "add" in parts else key
        beta = ntmf.softplus(parts["beta"]) if "beta" in parts else torch.ones_like(
            parts["alpha"])
        return LRUAParameters(key=key, alpha=parts["alpha"], add=add, beta=beta)

    def heads_step(self, raw: Tensor, memory: Tensor, usage: Tensor, read_weights: Tensor,
                   least_used: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The heads' part of a step from the head layer's output ``raw``: the write weights
        from the previous read weights and least-used rows, the least-used row zeroed and the
        write, the reads of the memory after it, the usage and the next least-used rows.

        Returns:
            ``(memory [B, N, M], usage [B, N], read_weights [B, H, N], least_used [B, N],
                reads [B, H, M])``.
        """
        hp = self.activate(raw)
        w_write = ntmf.lrua_write_weights(read_weights, least_used, hp.alpha)
        memory = ntmf.lrua_write(memory, usage, w_write, hp.add)
        w_read = ntmf.content_weights(memory, hp.key, hp.beta)  # (B, H, N)
        usage = ntmf.update_usage(usage, w_read, w_write, self.decay)
        reads = ntmf.read(memory, w_read)  # (B, H, M)
        return memory, usage, w_read, ntmf.least_used(usage, self.heads), reads


# ------------------------------------------------------------------------------------------------
# The Differentiable Neural Computer (Graves et al. 2016, Methods)
# ------------------------------------------------------------------------------------------------


class DNCField(NamedTuple):
    """One part of the DNC's interface vector xi_t."""

    name: str
    heads: str  # "read" (R of them) or "write" (Hw)
    size: str  # "width" (W), "one" or "modes" (2 Hw + 1)
    activation: str  # "none", "oneplus" (1 + softplus), "sigmoid" or "softmax"


# The interface vector's parts in the paper's order (Methods, "Interface parameters"), each part
# holding that field of every head of its kind, head after head.
DNC_FIELDS = (
    DNCField("read_key", "read", "width", "none"),
    DNCField("read_strength", "read", "one", "oneplus"),
    DNCField("write_key", "write", "width", "none"),
    DNCField("write_strength", "write", "one", "oneplus"),
    DNCField("erase", "write", "width", "sigmoid"),
    DNCField("write_vector", "write", "width", "none"),
    DNCField("free_gate", "read", "one", "sigmoid"),
    DNCField("allocation_gate", "write", "one", "sigmoid"),
    DNCField("write_gate", "write", "one", "sigmoid"),
    DNCField("read_mode", "read", "modes", "softmax"),
)


class DNCInterface(NamedTuple):
    """The activated interface vector xi_t of a DNC (the paper's symbols)."""

    read_key: Tensor  # k^r, (B, R, W)
    read_strength: Tensor  # beta^r, (B, R, 1), in [1, inf)
    write_key: Tensor  # k^w, (B, Hw, W)
    write_strength: Tensor  # beta^w, (B, Hw, 1), in [1, inf)
    erase: Tensor  # e, (B, Hw, W), in [0, 1]
    write_vector: Tensor  # v, (B, Hw, W)
    free_gate: Tensor  # f, (B, R), in [0, 1]
    allocation_gate: Tensor  # g^a, (B, Hw, 1), in [0, 1]
    write_gate: Tensor  # g^w, (B, Hw, 1), in [0, 1]
    read_mode: Tensor  # pi, (B, R, 2 Hw + 1), a softmax: (backward_1..Hw, content, forward_1..Hw)


class DNCAccess(NamedTuple):
    """What one step of a DNC's memory access computes (`DNCLayout.access_step`)."""

    memory: Tensor  # M_t, (B, N, W)
    usage: Tensor  # u_t, (B, N)
    link: Tensor | dncf.SparseLink  # L_t, (B, Hw, N, N), or stored sparse (`sparse_link`)
    precedence: Tensor  # p_t, (B, Hw, N)
    read_weights: Tensor  # w^r_t, (B, R, N)
    write_weights: Tensor  # w^w_t, (B, Hw, N)
    reads: Tensor  # r_t, (B, R, W)
    allocation: Tensor  # a_t, (B, Hw, N)
    interface: DNCInterface


_ACTIVATIONS = {
    "none": lambda x: x,
    "oneplus": lambda x: 1.0 + ntmf.softplus(x),
    "sigmoid": torch.sigmoid,
    "softmax": lambda x: torch.softmax(x, dim=-1),
}


@dataclass(frozen=True)
class DNCLayout:
    """A DNC's interface vector: where each field lies in the interface layer's output, and the
    memory access of one step (`torch_ntm.dnc_functional`).

    Args:
        read_heads: R.
        write_heads: Hw (the paper: 1).
        width: W, the memory width.
        sparse_link: None for the exact link matrix, or K for the paper's sparse approximation
            (`torch_ntm.dnc_functional.sparse_link_update`: `access_step` then takes and returns
            the link as a `torch_ntm.dnc_functional.SparseLink`, O(N K) a step).
    """

    read_heads: int
    write_heads: int
    width: int
    sparse_link: int | None = None

    @property
    def fields(self) -> dict[str, tuple[int, int]]:
        """Each field of `DNC_FIELDS`, in order, name to ``(heads, width per head)``."""
        sizes = {"width": self.width, "one": 1,
                 "modes": dncf.read_mode_width(self.write_heads)}
        heads = {"read": self.read_heads, "write": self.write_heads}
        return {f.name: (heads[f.heads], sizes[f.size]) for f in DNC_FIELDS}

    @property
    def size(self) -> int:
        """Outputs of the interface layer: the length of xi_t."""
        return sum(h * w for h, w in self.fields.values())

    def activate(self, raw: Tensor) -> DNCInterface:
        """The activated interface from the interface layer's output ``raw [B, size]``."""
        fields = self.fields
        parts = torch.split(raw, [h * w for h, w in fields.values()], dim=-1)
        values = {f.name: _ACTIVATIONS[f.activation](part.view(raw.shape[0], *fields[f.name]))
                  for f, part in zip(DNC_FIELDS, parts)}
        values["free_gate"] = values["free_gate"].squeeze(-1)  # (B, R)
        return DNCInterface(**values)

    def access_step(self, raw: Tensor, memory: Tensor, usage: Tensor,
                    link: Tensor | dncf.SparseLink, precedence: Tensor, read_weights: Tensor,
                    write_weights: Tensor) -> DNCAccess:
        """The memory access of one step from the interface layer's output ``raw [B, size]`` and
        the previous step's memory, usage, link, precedence and weightings (`DNCState`'s shapes):
        free, allocate, write, link, then read the memory after the write
        (`torch_ntm.dnc_functional`, whose module docstring lists the steps). With
        ``sparse_link``, ``link`` is a `torch_ntm.dnc_functional.SparseLink` in and out."""
        xi = self.activate(raw)
        usage = dncf.usage(usage, write_weights, dncf.retention(xi.free_gate, read_weights))
        content = dncf.content_weights(memory, xi.write_key, xi.write_strength)
        alloc = dncf.write_allocations(usage, (xi.allocation_gate * xi.write_gate)[..., 0])
        w_write = dncf.write_weights(alloc, content, xi.allocation_gate, xi.write_gate)
        memory = dncf.write(memory, w_write, xi.erase, xi.write_vector)
        if self.sparse_link is None:
            link = dncf.link(link, w_write, precedence)
            forward, backward = dncf.directional_weights(link, read_weights)
        else:
            link = dncf.sparse_link_update(link, w_write, precedence, self.sparse_link)
            forward, backward = dncf.sparse_directional_weights(link, read_weights)
        precedence = dncf.precedence(precedence, w_write)
        content = dncf.content_weights(memory, xi.read_key, xi.read_strength)
        w_read = dncf.read_weights(content, forward, backward, xi.read_mode)
        return DNCAccess(memory, usage, link, precedence, w_read, w_write,
                         dncf.read(memory, w_read), alloc, xi)
