"""``python -m torch_ntm`` runs the ``ntm`` command line (used by ``torchrun -m torch_ntm``)."""

import sys

from torch_ntm.cli import main

sys.exit(main())
