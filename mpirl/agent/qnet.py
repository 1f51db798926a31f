"""The Q-network: one layer spec, two implementations that share a flat float32 parameter vector.

* ``TorchQ``: the learner's network (torch), with an optional dueling head.
* ``NumpyQ``: the same function in numpy, for actors and evaluation.  Actors and buffers never
  import torch: on 2 cores, 9 ranks importing torch cost ~19 s of start-up against ~2.4 s without
  it, and a numpy forward of a few observations is faster than torch's per-call overhead.

Parameter order (the wire format of WEIGHTS): for each layer, weight (out, in) row-major then
bias (out,); hidden layers first, then the head(s): ``q`` or, with dueling, ``value`` then
``advantage``.

Image observations ([C, H, W] uint8, see mpirl.agent.envs) get a CNN: the Nature DQN stack (conv 32
8x8 /4, conv 64 4x4 /2, conv 64 3x3 /1, FC 512) when H, W >= 36, else the MinAtar paper's stack
(conv 16 3x3 /1, FC 128); then the same ``q`` or ``value`` + ``advantage`` head(s).  The input is
cast to float32 and multiplied by ``obs_scale`` (1/255 for pixels) inside the network, so uint8
frames travel and are stored as uint8.  Parameters follow ``nn.Module.parameters()``: conv weights
(out, in, kh, kw) then biases, layer by layer, then the FC, then the head(s).  Actors of image
runs run the same torch module (``TorchActorQ``, torch imported lazily, one thread, no_grad): a
numpy convolution would be slower than torch's and a second implementation to keep in step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where a torch network is made (not at import)
    import torch
    from torch import nn

    from mpirl.agent.envs import EnvSpec

    class TorchQNet(nn.Module):
        """What `make_torch_q` returns (MLP or CNN): a module with the flat parameter vector."""

        dueling: bool

        def q_from_features(self, h: torch.Tensor) -> torch.Tensor: ...
        def flat_params(self) -> np.ndarray: ...


def conv_layers(obs_shape: tuple[int, ...]) -> tuple[list[tuple[int, int, int, int]], int]:
    """([(out, in, kernel, stride), ...], fc units) of the CNN for a [C, H, W] observation."""
    c, h, w = obs_shape
    if min(h, w) >= 36:  # Nature DQN (Mnih et al. 2015): 84x84 -> 20 -> 9 -> 7
        return [(32, c, 8, 4), (64, 32, 4, 2), (64, 64, 3, 1)], 512
    return [(16, c, 3, 1)], 128  # MinAtar (Young & Tian 2019): 10x10 -> 8x8x16


def _conv_out(obs_shape: tuple[int, ...]) -> int:
    convs, _ = conv_layers(obs_shape)
    h, w = obs_shape[1:]
    for _, _, k, s in convs:
        h, w = (h - k) // s + 1, (w - k) // s + 1
    if h < 1 or w < 1:
        raise ValueError(f"observation shape {obs_shape} is too small for the CNN")
    return convs[-1][0] * h * w


def param_count(
    obs_shape: tuple[int, ...], n_actions: int, hidden: tuple[int, ...], dueling: bool
) -> int:
    """Length of the flat parameter vector (WEIGHTS) for either network, without torch."""
    if len(obs_shape) == 1:
        return n_params(obs_shape[0], n_actions, hidden, dueling)
    convs, fc = conv_layers(obs_shape)
    n = sum(o * i * k * k + o for o, i, k, _ in convs)
    n += fc * _conv_out(obs_shape) + fc
    heads = [1, n_actions] if dueling else [n_actions]
    return n + sum(h * fc + h for h in heads)


def layer_shapes(
    obs_dim: int, n_actions: int, hidden: tuple[int, ...], dueling: bool
) -> list[tuple[str, int, int]]:
    """[(name, out, in), ...] in parameter order."""
    shapes: list[tuple[str, int, int]] = []
    d = obs_dim
    for i, h in enumerate(hidden):
        shapes.append((f"hidden{i}", h, d))
        d = h
    if dueling:
        shapes += [("value", 1, d), ("advantage", n_actions, d)]
    else:
        shapes.append(("q", n_actions, d))
    return shapes


def n_params(obs_dim: int, n_actions: int, hidden: tuple[int, ...], dueling: bool) -> int:
    return sum(o * i + o for _, o, i in layer_shapes(obs_dim, n_actions, hidden, dueling))


class NumpyQ:
    """Q(s, .) in numpy from the flat parameter vector."""

    def __init__(
        self, obs_dim: int, n_actions: int, hidden: tuple[int, ...], dueling: bool
    ) -> None:
        self.shapes = layer_shapes(obs_dim, n_actions, hidden, dueling)
        self.dueling = dueling
        self.size = sum(o * i + o for _, o, i in self.shapes)
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []
        self.load(np.zeros(self.size, np.float32))

    def load(self, flat: np.ndarray) -> None:
        if flat.size != self.size:
            raise ValueError(
                f"weights have {flat.size} parameters, the network needs "
                f"{self.size}: every rank must use the same --hidden/--dueling/env"
            )
        flat = np.array(flat, np.float32, copy=True)
        self.layers, off = [], 0
        for _, o, i in self.shapes:
            w = flat[off : off + o * i].reshape(o, i)
            off += o * i
            b = flat[off : off + o]
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


def make_torch_q(
    obs_dim: int | tuple[int, ...],
    n_actions: int,
    hidden: tuple[int, ...],
    dueling: bool,
    obs_scale: float = 1.0,
) -> TorchQNet:
    """The learner's network (imports torch lazily): an MLP for an int / 1-D shape, a CNN for a
    [C, H, W] shape."""
    import torch
    from torch import nn

    if isinstance(obs_dim, (tuple, list)) and len(obs_dim) == 3:
        return _make_torch_cnn(tuple(obs_dim), n_actions, dueling, obs_scale)
    dim = int(np.prod(obs_dim)) if isinstance(obs_dim, (tuple, list)) else obs_dim

    class TorchQ(_torch_q_base()):  # type: ignore[misc]  # a base made at run time
        def __init__(self) -> None:
            super().__init__()
            shapes = layer_shapes(dim, n_actions, hidden, dueling)
            n_hidden = len(hidden)
            self.hidden = nn.ModuleList(nn.Linear(i, o) for _, o, i in shapes[:n_hidden])
            heads = shapes[n_hidden:]
            self.heads = nn.ModuleList(nn.Linear(i, o) for _, o, i in heads)
            self.dueling = dueling

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x.reshape(x.shape[0], -1)
            for layer in self.hidden:
                h = torch.relu(layer(h))
            return self.q_from_features(h)

    return TorchQ()


def _torch_q_base() -> type[nn.Module]:
    """What the MLP and the CNN Q-networks share: the (dueling) head over the last features and
    the flat parameter vector that travels as WEIGHTS (defined lazily: only the learner and image
    actors import torch)."""
    import torch
    from torch import nn

    class TorchQBase(nn.Module):
        heads: nn.ModuleList
        dueling: bool

        def q_from_features(self, h: torch.Tensor) -> torch.Tensor:
            if self.dueling:
                v, a = self.heads[0](h), self.heads[1](h)
                return v + a - a.mean(dim=1, keepdim=True)
            return self.heads[0](h)

        def flat_params(self) -> np.ndarray:
            """One float32 vector, on the host (one device -> host copy for a GPU learner)."""
            with torch.no_grad():
                return torch.cat([p.reshape(-1) for p in self.parameters()]).cpu().numpy()

    return TorchQBase


def _make_torch_cnn(
    obs_shape: tuple[int, ...], n_actions: int, dueling: bool, obs_scale: float
) -> TorchQNet:
    import torch
    from torch import nn

    convs, fc = conv_layers(obs_shape)
    flat_in = _conv_out(obs_shape)

    class TorchCNNQ(_torch_q_base()):  # type: ignore[misc]  # a base made at run time
        def __init__(self) -> None:
            super().__init__()
            self.convs = nn.ModuleList(nn.Conv2d(i, o, k, stride=s) for o, i, k, s in convs)
            self.fc = nn.Linear(flat_in, fc)
            heads = [1, n_actions] if dueling else [n_actions]
            self.heads = nn.ModuleList(nn.Linear(fc, h) for h in heads)
            self.dueling = dueling
            self.scale = float(obs_scale)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x.to(torch.float32)
            if self.scale != 1.0:
                h = h * self.scale
            for conv in self.convs:
                h = torch.relu(conv(h))
            h = torch.relu(self.fc(h.flatten(1)))
            return self.q_from_features(h)

    return TorchCNNQ()


class TorchActorQ:
    """The CNN for actors and evaluation of image runs: the learner's torch module, loaded from
    the flat WEIGHTS vector, run under no_grad on one thread; numpy in, numpy out (NumpyQ's
    interface)."""

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        n_actions: int,
        dueling: bool,
        obs_scale: float,
        threads: int | None = 1,
    ) -> None:
        import torch

        if threads is not None:
            torch.set_num_threads(threads)
        self._torch = torch
        self.net = make_torch_q(tuple(obs_shape), n_actions, (), dueling, obs_scale)
        self.net.eval()
        self.size = sum(p.numel() for p in self.net.parameters())

    def load(self, flat: np.ndarray) -> None:
        if flat.size != self.size:
            raise ValueError(
                f"weights have {flat.size} parameters, the network needs "
                f"{self.size}: every rank must use the same --dueling/env"
            )
        torch = self._torch
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(
                torch.from_numpy(np.array(flat, np.float32, copy=True)), self.net.parameters()
            )

    def __call__(self, x: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.no_grad():
            return self.net(torch.from_numpy(np.ascontiguousarray(x))).numpy()


def make_q(
    spec: EnvSpec, hidden: tuple[int, ...], dueling: bool, threads: int | None = 1
) -> NumpyQ | TorchActorQ:
    """The acting/evaluation network for a run: NumpyQ for vectors (no torch import), the torch
    CNN for images (``threads``: torch threads to set, None = leave as is)."""
    if spec.image:
        return TorchActorQ(spec.obs_shape, spec.n_actions, dueling, spec.obs_scale, threads)
    return NumpyQ(spec.obs_shape[0], spec.n_actions, hidden, dueling)


def make_learner_q(spec: EnvSpec, hidden: tuple[int, ...], dueling: bool) -> TorchQNet:
    shape = spec.obs_shape if spec.image else spec.obs_shape[0]
    return make_torch_q(shape, spec.n_actions, hidden, dueling, spec.obs_scale)
