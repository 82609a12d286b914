"""torch-ntm: Neural Turing Machines for PyTorch (Graves, Wayne & Danihelka 2014)."""

from torch_ntm import (
    functional,
    pretrained,  # noqa: E402 (needs the modules above)
)
from torch_ntm.mann import MANN, MANNCell, MANNState
from torch_ntm.model import NTM, NTMCell, NTMState, NTMTrace

__all__ = ["MANN", "MANNCell", "MANNState", "NTM", "NTMCell", "NTMState", "NTMTrace",
           "functional", "pretrained"]
__version__ = "0.1.0"
