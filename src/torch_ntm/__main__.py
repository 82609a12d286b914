"""``python -m torch_ntm`` runs the ``ntm`` command line (used by ``torchrun -m torch_ntm``)."""

from torch_ntm.cli import console

console()
