"""A network's parameters and gradients as one flat float32 vector (host side), in
``parameters()`` order: what the learner group sums, sends and writes back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def flat_grads(params: Sequence[torch.nn.Parameter], out: np.ndarray | None = None) -> np.ndarray:
    """Every parameter's gradient, concatenated in ``params`` order (float32, on the host)."""
    import torch

    with torch.no_grad():
        flat = torch.cat([p.grad.reshape(-1) for p in params]).float().cpu().numpy()  # type: ignore[union-attr]
    if out is None:
        return flat
    out[: flat.size] = flat
    return out


def set_grads(params: Sequence[torch.nn.Parameter], flat: np.ndarray) -> None:
    """Write ``flat`` (``flat_grads`` order) into every parameter's ``.grad``."""
    import torch

    off = 0
    with torch.no_grad():
        for p in params:
            k = p.numel()
            g = torch.from_numpy(np.ascontiguousarray(flat[off : off + k])).view_as(p)
            if p.grad is None:
                p.grad = g.to(p.device, p.dtype).clone()
            else:
                p.grad.copy_(g)
            off += k
    if off != flat.size:
        raise ValueError(f"{flat.size} gradient values for {off} parameters")


def set_params(params: Sequence[torch.nn.Parameter], flat: np.ndarray) -> None:
    """Write ``flat`` (``flat_params`` order) into the parameters."""
    import torch

    off = 0
    with torch.no_grad():
        for p in params:
            k = p.numel()
            p.copy_(torch.from_numpy(np.ascontiguousarray(flat[off : off + k])).view_as(p))
            off += k
