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


def bind_grads(params: Sequence[torch.nn.Parameter], out: np.ndarray) -> bool:
    """Make every parameter's ``.grad`` a view of ``out`` (float32, on the host, ``flat_grads``
    order), holding the gradients they hold now; True when they already were.  Backward adds
    into an existing ``.grad`` in place (autograd's accumulation outside grad mode), so once
    bound, and zeroed rather than dropped between steps, the gradients land in ``out`` with
    no copy: the all-reduce sends it as it is.  CPU float32 parameters only."""
    import torch

    at, off, bound = out.ctypes.data, 0, True
    for p in params:
        g = p.grad
        bound = bound and g is not None and g.data_ptr() == at + 4 * off
        off += p.numel()
    if off > out.size or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"{out.size} float32 gradient values for {off} parameters")
    if bound:
        return True
    if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in params):
        raise ValueError("bind_grads: CPU float32 parameters only")
    whole, off = torch.from_numpy(out), 0
    with torch.no_grad():
        for p in params:
            k = p.numel()
            view = whole[off : off + k].view_as(p)
            view.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
            p.grad = view
            off += k
    return False


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
