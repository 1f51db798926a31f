"""The Q-network: one layer spec, two implementations that share a flat float32 parameter vector.

* ``TorchQ``: the learner's network (torch), with an optional dueling head.
* ``NumpyQ``: the same function in numpy, for actors and evaluation.  Actors and buffers never
  import torch: on 2 cores, 9 ranks importing torch cost ~19 s of start-up against ~2.4 s without
  it, and a numpy forward of a few observations is faster than torch's per-call overhead.

Parameter order (the wire format of WEIGHTS): for each layer, weight (out, in) row-major then
bias (out,); hidden layers first, then the head(s): ``q`` or, with dueling, ``value`` then
``advantage``.  Image observations (the Nature CNN) are not supported yet.
"""

from __future__ import annotations

import numpy as np


def layer_shapes(obs_dim: int, n_actions: int, hidden: tuple[int, ...], dueling: bool):
    """[(name, out, in), ...] in parameter order."""
    shapes, d = [], obs_dim
    for i, h in enumerate(hidden):
        shapes.append((f"hidden{i}", h, d))
        d = h
    if dueling:
        shapes += [("value", 1, d), ("advantage", n_actions, d)]
    else:
        shapes.append(("q", n_actions, d))
    return shapes


def n_params(obs_dim, n_actions, hidden, dueling) -> int:
    return sum(o * i + o for _, o, i in layer_shapes(obs_dim, n_actions, hidden, dueling))


class NumpyQ:
    """Q(s, .) in numpy from the flat parameter vector."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: tuple[int, ...], dueling: bool):
        self.shapes = layer_shapes(obs_dim, n_actions, hidden, dueling)
        self.dueling = dueling
        self.size = sum(o * i + o for _, o, i in self.shapes)
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []
        self.load(np.zeros(self.size, np.float32))

    def load(self, flat: np.ndarray) -> None:
        if flat.size != self.size:
            raise ValueError(f"weights have {flat.size} parameters, the network needs "
                             f"{self.size}: every rank must use the same --hidden/--dueling/env")
        flat = np.array(flat, np.float32, copy=True)
        self.layers, off = [], 0
        for _, o, i in self.shapes:
            w = flat[off: off + o * i].reshape(o, i)
            off += o * i
            b = flat[off: off + o]
            off += o
            self.layers.append((np.ascontiguousarray(w.T), b))  # x @ W.T, transposed once

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = np.asarray(x, np.float32).reshape(len(x), -1)
        n_hidden = len(self.layers) - (2 if self.dueling else 1)
        for wt, b in self.layers[:n_hidden]:
            h = h @ wt
            h += b
            np.maximum(h, 0, out=h)
        if self.dueling:
            (wv, bv), (wa, ba) = self.layers[n_hidden:]
            adv = h @ wa + ba
            return (h @ wv + bv) + adv - adv.mean(axis=1, keepdims=True)
        wt, b = self.layers[-1]
        return h @ wt + b


def make_torch_q(obs_dim: int, n_actions: int, hidden: tuple[int, ...], dueling: bool):
    """The learner's network (imports torch lazily)."""
    import torch
    from torch import nn

    class TorchQ(nn.Module):
        def __init__(self):
            super().__init__()
            shapes = layer_shapes(obs_dim, n_actions, hidden, dueling)
            n_hidden = len(hidden)
            self.hidden = nn.ModuleList(nn.Linear(i, o) for _, o, i in shapes[:n_hidden])
            heads = shapes[n_hidden:]
            self.heads = nn.ModuleList(nn.Linear(i, o) for _, o, i in heads)
            self.dueling = dueling

        def forward(self, x):
            h = x.reshape(x.shape[0], -1)
            for layer in self.hidden:
                h = torch.relu(layer(h))
            if self.dueling:
                v, a = self.heads[0](h), self.heads[1](h)
                return v + a - a.mean(dim=1, keepdim=True)
            return self.heads[0](h)

        def flat_params(self) -> np.ndarray:
            with torch.no_grad():
                return torch.cat([p.reshape(-1) for p in self.parameters()]).numpy().copy()

    return TorchQ()
