"""The models' recurrent states, with one set of helpers: `NTMState`, `MANNState`, `DNCState`.

Each is a NamedTuple whose first field is the controller's tuple of tensors (``(h, c)`` of an LSTM,
``()`` of a feed-forward controller) and whose other fields are tensors, batch first. A model's
``forward`` takes one (or None for its ``initial_state``) and returns the next; ``map``,
``detach`` and ``tensors`` work alike on all three.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

__all__ = ["NTMState", "MANNState", "DNCState"]


class NTMState(NamedTuple):
    """Recurrent state of an NTM, passed in and returned by `forward`.

    Attributes:
        controller: LSTM controller: ``(h, c)``, each ``[L, B, C]``; feed-forward: ``()``.
        memory: ``[B, N, M]`` memory matrix.
        read_weights: ``[B, Hr, N]`` read weightings.
        write_weights: ``[B, Hw, N]`` write weightings.
        reads: ``[B, Hr, M]`` read vectors of the last step.
    """

    controller: tuple
    memory: Tensor
    read_weights: Tensor
    write_weights: Tensor
    reads: Tensor

    def map(self, fn) -> NTMState:
        """The state with ``fn`` applied to each of its tensors (the controller's too), e.g.
        ``state.map(lambda t: t.to("cuda"))``."""
        return type(self)(tuple(fn(t) for t in self.controller), *(fn(t) for t in self[1:]))

    def detach(self) -> NTMState:
        """The same values cut from the graph that made them: to carry a state into the next
        chunk of a long sequence without backpropagating into the last (truncated
        backpropagation through time)."""
        return self.map(Tensor.detach)

    def tensors(self) -> dict[str, Tensor]:
        """Each tensor by name: ``controller[0]``, ..., then the other fields in order."""
        named = {f"controller[{i}]": t for i, t in enumerate(self.controller)}
        return named | {name: getattr(self, name) for name in self._fields[1:]}


class MANNState(NamedTuple):
    """Recurrent state of a MANN, passed in and returned by `forward`.

    Attributes:
        controller: the LSTM's ``(h, c)``, each ``[1, B, C]`` (as for `nn.LSTM`).
        memory: ``[B, N, M]`` memory M_t.
        usage: ``[B, N]`` usage weights w^u_t.
        read_weights: ``[B, H, N]`` read weightings w^r_t.
        least_used: ``[B, N]`` least-used weighting w^lu_t (H ones), used by the next step.
        reads: ``[B, H, M]`` read vectors r_t.
    """

    controller: tuple
    memory: Tensor
    usage: Tensor
    read_weights: Tensor
    least_used: Tensor
    reads: Tensor

    # NTMState's: each tensor through a function, the state cut from its graph, by name
    map = NTMState.map
    detach = NTMState.detach
    tensors = NTMState.tensors


class DNCState(NamedTuple):
    """Recurrent state of a DNC, passed in and returned by `torch_ntm.DNC`'s ``forward``.

    Attributes:
        controller: LSTM controller: ``(h, c)``, each ``[L, B, C]``; feed-forward: ``()``.
        memory: ``[B, N, W]`` memory M_t.
        usage: ``[B, N]`` usage vector u_t.
        link: ``[B, Hw, N, N]`` temporal link matrix L_t of each write head (with
            ``sparse_link=K``, each row holds at most K non-zero entries, and the DNC's sequence
            loop carries it as a `torch_ntm.dnc_functional.SparseLink` between its steps).
        precedence: ``[B, Hw, N]`` precedence weighting p_t of each write head.
        read_weights: ``[B, R, N]`` read weightings w^r_t.
        write_weights: ``[B, Hw, N]`` write weightings w^w_t.
        reads: ``[B, R, W]`` read vectors r_t.
    """

    controller: tuple
    memory: Tensor
    usage: Tensor
    link: Tensor
    precedence: Tensor
    read_weights: Tensor
    write_weights: Tensor
    reads: Tensor

    map = NTMState.map
    detach = NTMState.detach
    tensors = NTMState.tensors
