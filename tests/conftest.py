"""Shared test setup: one CPU thread, so tests stay fast and steady on small machines."""

import torch

torch.set_num_threads(1)
