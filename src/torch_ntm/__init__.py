"""torch-ntm: Neural Turing Machines for PyTorch (Graves, Wayne & Danihelka 2014), and their
successors the MANN (Santoro et al. 2016) and the Differentiable Neural Computer (Graves et al.
2016).

Importing the package loads the modules and their engines only; the shipped models
(`torch_ntm.pretrained`), the training harness and the command line load when first used.
"""

import importlib

from torch_ntm import dnc_functional, functional
from torch_ntm.dnc import DNC, DNCCell, DNCState, DNCTrace
from torch_ntm.mann import MANN, MANNCell, MANNState
from torch_ntm.model import NTM, NTMCell, NTMState, NTMTrace

__all__ = ["DNC", "DNCCell", "DNCState", "DNCTrace", "MANN", "MANNCell", "MANNState", "NTM",
           "NTMCell", "NTMState", "NTMTrace", "dnc_functional", "functional", "pretrained"]
__version__ = "0.2.0"


def __getattr__(name: str):
    if name == "pretrained":  # loads checkpoints, configs and tasks: only when asked for
        return importlib.import_module("torch_ntm.pretrained")
    raise AttributeError(f"module 'torch_ntm' has no attribute {name!r}")
