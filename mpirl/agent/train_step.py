"""The learner's train step on its own: the online and target networks on a device, Adam, and
one double-DQN update on a batch (no MPI, no logging).

The learner role calls it; bench/overheads.py and bench/gpu.py time it standalone.  A
batch goes host -> device with ``put`` (on CUDA through pinned staging buffers and non-blocking
copies), the update is queued with ``launch``, and ``Pending.result`` brings the loss and |td| back
in one copy, so the learner can put the next batch on its way while the current one trains.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from mpirl.agent.frames import stacks
from mpirl.agent.qnet import make_learner_q

if TYPE_CHECKING:
    import torch

    from mpirl.agent.envs import EnvSpec
    from mpirl.run.config import Config


class GradSync(Protocol):
    """The learner group's seam after backward (mpirl.transport.group)."""

    wait_s: float  # seconds the last step waited for the other learners
    slept_s: float  # seconds the last step slept (--straggle)

    def step(self, trainer: Any, loss: Any, td: Any) -> None: ...


def _batch_tensors(
    torch: Any, records: np.ndarray, frames: np.ndarray | None = None, stack: int = 1
) -> tuple[torch.Tensor, ...]:
    """Structured records (possibly an unaligned view of a message) -> torch tensors.

    Image runs: ``obs`` / ``next_obs`` are rebuilt from the frame table and stay uint8 (the
    network casts and scales them)."""
    if frames is not None:
        obs, nxt = (torch.from_numpy(x) for x in stacks(records, frames, stack))
    else:
        obs = torch.from_numpy(np.ascontiguousarray(records["obs"], np.float32))
        nxt = torch.from_numpy(np.ascontiguousarray(records["next_obs"], np.float32))
    return (
        obs,
        torch.from_numpy(np.ascontiguousarray(records["action"], np.int64)),
        torch.from_numpy(np.ascontiguousarray(records["reward"], np.float32)),
        nxt,
        torch.from_numpy(np.ascontiguousarray(records["discount"], np.float32)),
    )


class Pending:
    """An update launched on the device: ``result()`` waits for it and returns ``(loss, |td|)``.

    On CUDA the loss and |td| come back in one non-blocking copy into pinned memory (one
    device -> host transfer per batch), so the host is free between ``launch`` and ``result``;
    on CPU the update has already run."""

    __slots__ = ("_event", "_out")

    def __init__(self, out: torch.Tensor, event: torch.cuda.Event | None = None) -> None:
        self._out, self._event = out, event

    def result(self) -> tuple[float, np.ndarray]:
        if self._event is not None:
            self._event.synchronize()
        out = self._out.numpy()
        return float(out[0]), out[1:].copy()


class TrainStep:
    """The learner's train step, callable on its own (no MPI, no logging; bench/overheads.py
    and bench/gpu.py time it standalone): the online and target networks on ``device``, Adam,
    and one update on a batch.

    ``step(records, weights, frames)`` is one double-DQN update (Huber loss weighted by the
    importance weights, gradient clipping) and returns ``(loss, |td| per sample)``; it counts
    updates (``updates``; a resumed learner sets it) and copies the online network into the
    target after every ``target_update``-th.  It is
    ``put`` (host arrays -> device tensors: on CUDA through pinned staging buffers with
    non-blocking copies), ``launch`` (queue the update) and ``Pending.result``; the learner
    calls them apart to put the next batch on its way while the current one trains."""

    def __init__(
        self, cfg: Config, spec: EnvSpec, device: str | torch.device = "cpu", amp: str = "off"
    ) -> None:
        import torch

        from mpirl.agent.dqn import Adam, dqn_loss

        self.torch, self.loss_fn = torch, dqn_loss
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.amp = amp == "bf16" and self.cuda
        self.spec, self.huber_delta, self.grad_clip = spec, cfg.huber_delta, cfg.grad_clip
        self.online = make_learner_q(spec, cfg.hidden, cfg.dueling).to(self.device)
        self.target = copy.deepcopy(self.online)
        self.params = list(self.online.parameters())
        self.opt = Adam(self.params, lr=cfg.lr)  # torch's kernel, no dynamo import
        self.target_update, self.updates = cfg.target_update, 0
        # CUDA: two sets of pinned host buffers, used in turn, each with the event of its last
        # host -> device copy (a set is rewritten only once that copy is done)
        self._staging: list[tuple[dict[int, torch.Tensor], torch.cuda.Event | None]] = [
            ({}, None),
            ({}, None),
        ]
        self._turn = 0
        self._out: torch.Tensor | None = None  # pinned buffer for loss + |td| coming back
        #: what follows backward: None = clip and step here; a learner group hands in its sync
        #: (mpirl.transport.group), which steps, all-reduces first, or keeps the gradient
        self.sync: GradSync | None = None

    def state_dict_of(self, flat: np.ndarray) -> dict:
        """The online network's state_dict (on the host) with ``flat`` (``flat_params`` order)
        as its parameters: the weights an evaluation played, taken some updates ago."""
        import torch

        out = {k: v.detach().cpu().clone() for k, v in self.online.state_dict().items()}
        off = 0
        for name, p in self.online.named_parameters():
            n = p.numel()
            out[name] = torch.from_numpy(np.array(flat[off : off + n], np.float32)).view(p.shape)
            off += n
        if off != len(flat):
            raise ValueError(f"{len(flat)} weights for a network of {off} parameters")
        return out

    def put(
        self, records: np.ndarray, weights: np.ndarray, frames: np.ndarray | None = None
    ) -> tuple:
        """A batch on the device: (obs, action, reward, next_obs, discount, weights)."""
        torch = self.torch
        if not self.cuda:
            return (
                *_batch_tensors(torch, records, frames, self.spec.stack),
                torch.from_numpy(np.ascontiguousarray(weights, np.float32)),
            )
        if frames is not None:
            obs, nxt = stacks(records, frames, self.spec.stack)
        else:
            obs, nxt = records["obs"], records["next_obs"]
        host = (
            (obs, np.uint8 if frames is not None else np.float32),
            (records["action"], np.int64),
            (records["reward"], np.float32),
            (nxt, np.uint8 if frames is not None else np.float32),
            (records["discount"], np.float32),
            (weights, np.float32),
        )
        bufs, event = self._staging[self._turn]
        if event is not None:
            event.synchronize()
        out = []
        for i, (x, dt) in enumerate(host):
            b = bufs.get(i)
            if b is None or tuple(b.shape) != tuple(np.shape(x)):
                b = bufs[i] = torch.empty(
                    np.shape(x), dtype=_TORCH_DTYPES[dt](torch), pin_memory=True
                )
            b.numpy()[...] = x  # gathers the field out of the records and casts, in one pass
            out.append(b.to(self.device, non_blocking=True))
        event = torch.cuda.Event()
        event.record()
        self._staging[self._turn] = (bufs, event)
        self._turn ^= 1
        return tuple(out)

    def _loss(self, batch: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        obs, act, rew, nxt, disc, w = batch
        if not self.amp:  # (constructing an autocast context costs microseconds per update)
            return self.loss_fn(
                self.online, self.target, obs, act, rew, nxt, disc, w, self.huber_delta
            )
        with self.torch.autocast("cuda", dtype=self.torch.bfloat16):
            return self.loss_fn(
                self.online, self.target, obs, act, rew, nxt, disc, w, self.huber_delta
            )

    def launch(self, batch: tuple) -> Pending:
        """Queue one update on ``batch`` (from ``put``); on CPU it runs now.  One update in
        flight at a time: take its ``result()`` before the next ``launch``."""
        loss, td = self._loss(batch)
        self.opt.zero_grad()
        loss.backward()
        if self.sync is None:
            self.apply_step()
        else:
            self.sync.step(self, loss, td)
        return self._back(loss.detach(), td)

    def apply_step(self, scale: float = 1.0) -> None:
        """Clip the gradients in ``.grad``, take one Adam step, count it, copy the target on
        its cadence.  ``scale`` multiplies the gradients first (the all-reduce's sum times
        1 / n is the mean), folded into the clip's one pass over them."""
        if self.grad_clip > 0:
            self._clip(scale)
        elif scale != 1.0:
            self.torch._foreach_mul_([p.grad for p in self.params if p.grad is not None], scale)
        self.opt.step()
        self.updates += 1
        if self.updates % self.target_update == 0:
            self.sync_target()

    def _clip(self, scale: float = 1.0) -> None:
        """torch.nn.utils.clip_grad_norm_'s foreach path without its wrappers (with them it was
        0.58 of a 2.95 ms CPU update in the learner's profile, now 0.15): scale every gradient
        by min(1, clip / (total norm + 1e-6)), the norm that of the gradients times ``scale``,
        which multiplies them in the same pass."""
        torch = self.torch
        grads = [p.grad for p in self.params if p.grad is not None]
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        if scale == 1.0:
            torch._foreach_mul_(grads, torch.clamp(self.grad_clip / (total + 1e-6), max=1.0))
            return
        factor = torch.clamp(self.grad_clip / (total * scale + 1e-6), max=1.0) * scale
        torch._foreach_mul_(grads, factor)

    def _back(self, loss: torch.Tensor, td: torch.Tensor) -> Pending:
        torch = self.torch
        if not self.cuda:
            return Pending(torch.cat([loss.view(1), td]))
        both = torch.cat([loss.float().view(1), td.float()])
        if self._out is None or self._out.numel() != both.numel():
            self._out = torch.empty(both.numel(), dtype=torch.float32, pin_memory=True)
        self._out.copy_(both, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return Pending(self._out, event)

    def step(
        self, records: np.ndarray, weights: np.ndarray, frames: np.ndarray | None = None
    ) -> tuple[float, np.ndarray]:
        return self.launch(self.put(records, weights, frames)).result()

    def td(self, records: np.ndarray, frames: np.ndarray | None = None) -> np.ndarray:
        """|td| of transitions under the current networks, no update (arrival priorities)."""
        torch = self.torch
        batch = self.put(records, np.ones(len(records), np.float32), frames)
        with torch.no_grad():
            _, td = self._loss(batch)
        return td.float().cpu().numpy()

    def checkpoint_tensors(self) -> dict[str, Any]:
        """What a learner's checkpoint part holds of it: both networks, Adam's state and
        torch's RNG state (``torch.load(..., weights_only=True)`` reads them back)."""
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.opt.state_dict(),
            "torch_rng": self.torch.get_rng_state(),
        }

    def sync_target(self) -> None:
        self.target.load_state_dict(self.online.state_dict())


_TORCH_DTYPES = {
    np.float32: lambda t: t.float32,
    np.int64: lambda t: t.int64,
    np.uint8: lambda t: t.uint8,
}
