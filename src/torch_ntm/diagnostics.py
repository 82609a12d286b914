"""What to watch while an NTM trains: the quantities that move before a trained model falls apart.

`head_statistics` runs a batch through `NTM.trace` (no gradients) and summarises the addressing:
the largest key strength beta and sharpening exponent gamma of each kind of head, the smallest
entropy of a weighting (0 for a one-hot weighting, log N for a uniform one) and the smallest and
largest norm of a memory row after the last step. `gradient_norms` gives the gradient norm of each
group of parameters after ``backward``. docs/stability.md shows them around a collapse.

Example:

    loss.backward()
    grads = gradient_norms(ntm)                 # {"controller": ..., "heads": ..., ...}
    stats = head_statistics(ntm, inputs)        # {"read_beta_max": ..., ...}
"""

from __future__ import annotations

import torch
from torch import Tensor

from torch_ntm.model import NTM

__all__ = ["head_statistics", "gradient_norms", "PARAMETER_GROUPS"]

# Parameter name prefix -> group; anything else (learned initial state) is "initial".
PARAMETER_GROUPS = {"controller.": "controller", "head_params.": "heads", "output.": "output"}


def _entropy(w: Tensor) -> Tensor:
    """Entropy in nats over the last axis, ``0 log 0 = 0``."""
    return -(w * torch.log(w.clamp_min(1e-30))).sum(-1)


@torch.no_grad()
def head_statistics(model: NTM, inputs: Tensor) -> dict[str, float]:
    """Addressing statistics of ``model`` on ``inputs`` (its usual input layout).

    Returns:
        ``{kind}_beta_max``, ``{kind}_gamma_max``, ``{kind}_entropy_min`` and
        ``{kind}_entropy_mean`` for kind ``read`` and ``write`` (over all steps, sequences and heads
        of that kind; write keys only with write heads), and ``memory_row_norm_min`` /
        ``memory_row_norm_max`` over the rows of the final memories.
    """
    was_training = model.training
    model.eval()
    _, state, trace = model.trace(inputs)
    model.train(was_training)
    out = {}
    for kind in ("read", "write"):
        beta, gamma = getattr(trace, f"{kind}_beta"), getattr(trace, f"{kind}_gamma")
        if beta.numel() == 0:
            continue
        entropy = _entropy(getattr(trace, f"{kind}_weights"))
        out[f"{kind}_beta_max"] = float(beta.max())
        out[f"{kind}_gamma_max"] = float(gamma.max())
        out[f"{kind}_entropy_min"] = float(entropy.min())
        out[f"{kind}_entropy_mean"] = float(entropy.mean())
    norms = state.memory.norm(dim=-1)  # (B, N)
    out["memory_row_norm_min"] = float(norms.min())
    out["memory_row_norm_max"] = float(norms.max())
    return out


def gradient_norms(model: torch.nn.Module) -> dict[str, float]:
    """The L2 norm of the gradients of each parameter group (see `PARAMETER_GROUPS`)."""
    sums: dict[str, float] = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        group = next((g for prefix, g in PARAMETER_GROUPS.items() if name.startswith(prefix)),
                     "initial")
        sums[group] = sums.get(group, 0.0) + float(p.grad.detach().double().square().sum())
    return {group: total**0.5 for group, total in sums.items()}
