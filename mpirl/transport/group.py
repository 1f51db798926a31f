"""The learner group's collectives and update seam (``--learners K``: the cloud's first K ranks
train one network; the roles are mpirl.roles.group_lead and mpirl.roles.learner_worker; their
messages ORDER, SHARD, GRAD are kinds of mpirl.transport.wire).

The update step goes through one seam: ``TrainStep.sync.step(trainer, loss, td)`` after the
backward pass (no sync: the learner alone clips and steps).  The modes (``--learner-sync``):

``allreduce``  every update the lead sends each other learner an ORDER (a batch relayed from a
               buffer, or "sample B from your shard"); every learner computes its gradient and
               `AllreduceSync` sums ``[n * grad, n]`` over the group in one MPI Allreduce of one
               contiguous float32 buffer; each divides by the summed n and takes the same
               Adam step: one update of global batch K x B, the same parameters on every rank.
``async``      parameter server: the other learners send GRAD (gradient, the weights' version,
               |td|); the lead applies each as it arrives (`mpirl.agent.gba.GlobalBatch` of B,
               no decay).
``gba``        the lead assembles K x B samples' worth of gradients from whichever learners
               deliver (its own included), drops / decays stale ones (`mpirl.agent.gba`),
               applies one.

Token control (async, gba): a learner holds at most one ORDER; an ORDER carries the lead's
current weights (online and target) when the learner's copy is older, so a gradient's version is
the lead's update count when its ORDER left.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from mpi4py import MPI

from mpirl.agent.grads import flat_grads, set_grads, set_params
from mpirl.transport.waiting import SpinThenNap

MODES = ("allreduce", "async", "gba")


class Steppable(Protocol):
    """What a sync needs of the train step (`mpirl.agent.train_step.TrainStep`)."""

    params: list[Any]
    device: Any
    torch: Any

    def apply_step(self) -> None: ...


def wait_polled(req: Any) -> float:
    """Complete a nonblocking MPI request by polling with a short sleep (a waiting rank never
    spins a core: mpirl.transport.waiting); returns the seconds waited.  The allreduce's wait
    was this until naps chained through the collective's steps made it cost 5x one learner
    (`AllreduceSync.wait`, `SpinThenNap`); it suits waits that are long anyway."""
    t0 = time.monotonic()
    nap = 2e-5
    while not req.Test():
        time.sleep(nap)
        nap = min(nap * 2, 5e-4)
    return time.monotonic() - t0


class LocalSync:
    """K = 1: clip and step, as a lone learner does; ``straggle_s`` sleeps before each step."""

    def __init__(self, straggle_s: float = 0.0) -> None:
        self.straggle_s = straggle_s
        self.wait_s = 0.0  # seconds the last step waited for the group

    def step(self, trainer: Steppable, loss: Any, td: Any) -> None:
        if self.straggle_s:
            time.sleep(self.straggle_s)
        trainer.apply_step()


class AllreduceSync(LocalSync):
    """allreduce: ``[n * grad, n]`` summed over ``comm`` in one MPI Iallreduce, completed by
    ``wait`` (a bounded adaptive spin on ``Test``, then naps with short ``Test`` bursts:
    `mpirl.transport.waiting.SpinThenNap`), the gradient set to the sum / total n (the mean over
    the global batch), then clip and step.

    CUDA learners: with ``nccl`` (a torch.distributed process group over the same ranks) the
    flat gradient is summed on the device instead; see `nccl_group`."""

    def __init__(self, comm: Any, n_params: int, straggle_s: float = 0.0, nccl: Any = None) -> None:
        super().__init__(straggle_s)
        self.comm, self.nccl = comm, nccl
        #: completes the Iallreduce's request, returns the seconds waited: a bounded, adaptive
        #: spin on ``Test`` and then naps (`mpirl.transport.waiting.SpinThenNap`)
        self.wait: Callable[[Any], float] = SpinThenNap().wait
        self.send = np.zeros(n_params + 1, np.float32)
        self.recv = np.zeros_like(self.send)

    def step(self, trainer: Steppable, loss: Any, td: Any) -> None:
        if self.straggle_s:
            time.sleep(self.straggle_s)
        n = float(td.shape[0])
        if self.nccl is not None:
            self._step_nccl(trainer, n)
            return

        flat_grads(trainer.params, self.send)
        self.send[:-1] *= n
        self.send[-1] = n
        req = self.comm.Iallreduce([self.send, MPI.FLOAT], [self.recv, MPI.FLOAT], op=MPI.SUM)
        self.wait_s = self.wait(req)
        set_grads(trainer.params, self.recv[:-1] / self.recv[-1])
        trainer.apply_step()

    def _step_nccl(self, trainer: Steppable, n: float) -> None:  # pragma: no cover - needs 2+ GPUs
        torch, dist = trainer.torch, self.nccl
        with torch.no_grad():
            flat = (
                torch.cat(
                    [p.grad.reshape(-1) for p in trainer.params]
                    + [torch.tensor([1.0], device=trainer.device)]
                )
                * n
            )
        t0 = time.monotonic()
        dist.all_reduce(flat)
        self.wait_s = time.monotonic() - t0
        off = 0
        with torch.no_grad():
            for p in trainer.params:
                k = p.numel()
                p.grad.copy_(flat[off : off + k].view_as(p) / flat[-1])
                off += k
        trainer.apply_step()


class SubmitSync(LocalSync):
    """async / gba: no step here; the gradient is kept (``taken()``) for the lead's aggregator
    or a worker's GRAD."""

    def __init__(self, straggle_s: float = 0.0) -> None:
        super().__init__(straggle_s)
        self.grad: np.ndarray | None = None

    def step(self, trainer: Steppable, loss: Any, td: Any) -> None:
        if self.straggle_s:
            time.sleep(self.straggle_s)
        self.grad = flat_grads(trainer.params)

    def taken(self) -> np.ndarray:
        g, self.grad = self.grad, None
        if g is None:
            raise RuntimeError("no gradient was computed since the last one was taken")
        return g


def nccl_group(comm: Any, device: Any) -> Any:  # pragma: no cover - needs one GPU per learner
    """torch.distributed NCCL over the learner ranks, its rendezvous over ``comm``: rank 0
    picks a free TCP port and broadcasts ``host:port`` (bytes, no pickle).  Untested here (no
    multi-GPU machine); used only for CUDA learners."""
    import torch.distributed as dist

    addr = np.zeros(256, np.uint8)
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        text = f"{socket.gethostname()}:{port}".encode()
        addr[: len(text)] = np.frombuffer(text, np.uint8)
    comm.Bcast([addr, MPI.BYTE], root=0)
    where = bytes(addr).rstrip(b"\0").decode()
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://{where}",
        rank=comm.Get_rank(),
        world_size=comm.Get_size(),
        device_id=device,
    )
    return dist


def make_sync(
    mode: str, comm: Any, n_params: int, device: Any, straggle_s: float = 0.0
) -> LocalSync:
    """This learner's sync object (``comm``: the learners communicator, None for K = 1)."""
    if comm is None or comm.Get_size() == 1:
        return LocalSync(straggle_s)
    if mode == "allreduce":
        nccl = nccl_group(comm, device) if getattr(device, "type", "cpu") == "cuda" else None
        return AllreduceSync(comm, n_params, straggle_s, nccl)
    return SubmitSync(straggle_s)


def bcast_weights(comm: Any, trainer: Any, updates: int = 0) -> int:
    """Every learner starts from the lead's online and target networks and learns the lead's
    update count, the version of those weights (collective; ``updates``: the lead's)."""
    for net in (trainer.online, trainer.target):
        flat = np.ascontiguousarray(net.flat_params(), np.float32)
        comm.Bcast([flat, MPI.FLOAT], root=0)
        set_params(list(net.parameters()), flat)
    version = np.array([updates], np.int64)
    comm.Bcast([version, MPI.INT64_T], root=0)
    return int(version[0])


__all__ = [
    "MODES",
    "AllreduceSync",
    "LocalSync",
    "SubmitSync",
    "bcast_weights",
    "flat_grads",
    "make_sync",
    "set_grads",
    "wait_polled",
]
