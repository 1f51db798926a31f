"""The learner group's collectives and update seam (``--learners K``: the cloud's first K ranks
train one network; the roles are mpirl.roles.group_lead and mpirl.roles.learner_worker; their
messages ORDER, SHARD, GRAD are kinds of mpirl.transport.wire).

The update step goes through one seam: ``TrainStep.sync.step(trainer, loss, td)`` after the
backward pass (no sync: the learner alone clips and steps).  The modes (``--learner-sync``):

``allreduce``  every update the lead sends each other learner an ORDER (a batch relayed from a
               buffer, or "sample B from your shard"); every learner computes its gradient and
               `AllreduceSync` sums ``[w * grad, w]`` (w = n / B, 1 for a full batch) over the
               group in one persistent sum of one contiguous float32 buffer (through shared
               memory where the group shares a node, else MPI's all-reduce); each
               scales the sum by 1 / (summed w) and takes the same Adam step: one update of
               global batch K x B, the same parameters on every rank.
``async``      parameter server (a thread of the lead's rank, `mpirl.roles.group_lead`): the
               other learners send GRAD (gradient, the weights' version, |td|); the server
               applies each as it arrives (`mpirl.agent.gba.GlobalBatch` of B, no decay).
``gba``        the server assembles K x B samples' worth of gradients from whichever learners
               deliver (the lead's included) under GBA's token control, drops too stale ones and
               decays severely stale ones (`mpirl.agent.gba`), applies one.

Work (async, gba): another learner holds up to two ORDERs (`mpirl.agent.gba.PIPELINE`); under gba
each carries a token, the step its gradient is meant for (`mpirl.agent.gba.Tokens`, kept at the
lead by order id).  An ORDER carries the lead's current weights (online and target) when the
learner's copy is older, so a gradient's version is the lead's update count when its ORDER left.
"""

from __future__ import annotations

import socket
import time
import weakref
import zlib
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from mpi4py import MPI

from mpirl.agent.grads import bind_grads, flat_grads, set_grads, set_params
from mpirl.transport.node_sum import node_sum
from mpirl.transport.waiting import SpinThenNap

MODES = ("allreduce", "async", "gba", "switch")


class Steppable(Protocol):
    """What a sync needs of the train step (`mpirl.agent.train_step.TrainStep`)."""

    params: list[Any]
    device: Any
    torch: Any
    opt: Any  # `mpirl.agent.dqn.Adam`: its ``grad_buffer`` (CPU all-reduce)

    def apply_step(self, scale: float = 1.0) -> None: ...


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
    """K = 1: clip and step, as a lone learner does; ``straggle_s`` sleeps before each step
    (``window``: only from ``start`` to ``end`` seconds after the sync was made)."""

    def __init__(
        self, straggle_s: float = 0.0, window: tuple[float, float] = (0.0, float("inf"))
    ) -> None:
        self.straggle_s, self.window = straggle_s, window
        self.t0 = time.monotonic()
        self.wait_s = 0.0  # seconds the last step waited for the group
        self.slept_s = 0.0  # seconds the last step slept (--straggle)

    def straggle(self) -> None:
        """--straggle: this learner's sleep per update, inside its window."""
        self.slept_s = 0.0
        if self.straggle_s:
            since = time.monotonic() - self.t0
            if self.window[0] <= since < self.window[1]:
                t0 = time.monotonic()
                time.sleep(self.straggle_s)
                self.slept_s = time.monotonic() - t0

    def step(self, trainer: Steppable, loss: Any, td: Any) -> None:
        self.straggle()
        trainer.apply_step()


class AllreduceSync(LocalSync):
    """allreduce: ``[w * grad, w]`` summed over ``comm``, ``w = n / batch`` (1 for a full batch,
    so a full batch is sent as it is), completed by ``wait`` (a bounded adaptive spin on
    ``Test``, then naps with short ``Test`` bursts: `mpirl.transport.waiting.SpinThenNap`); the
    step scales the sum by 1 / (summed w), the mean over the global batch, in its clip's pass.

    The sum is one persistent request that each update only starts: where every learner of the
    group shares one node, `mpirl.transport.node_sum.NodeSum` (the slots of an MPI shared
    window, added up in rank order; ``shared=False`` turns it off); otherwise MPI-4's
    ``MPI_Allreduce_init``, made with the sync (an ``Iallreduce`` builds its schedule anew each
    time, ~15 us of a 0.9 ms update, docs/benchmarks.md), or where the MPI library lacks
    persistent collectives, an ``Iallreduce`` per update.

    CUDA learners: with ``nccl`` (a torch.distributed process group over the same ranks) the
    flat gradient is summed on the device instead; see `process_group`."""

    def __init__(
        self,
        comm: Any,
        n_params: int,
        straggle_s: float = 0.0,
        nccl: Any = None,
        window: tuple[float, float] = (0.0, float("inf")),
        batch: int = 0,
        shared: bool = True,
    ) -> None:
        super().__init__(straggle_s, window)
        self.comm, self.nccl = comm, nccl
        #: the learners' batch size B (0: unknown, every gradient weighted by its n)
        self.batch = batch
        #: completes the all-reduce's request, returns the seconds waited: a bounded, adaptive
        #: spin on ``Test`` and then naps (`mpirl.transport.waiting.SpinThenNap`)
        self.wait: Callable[[Any], float] = SpinThenNap().wait
        #: ``[grad, w]``, summed in place; on a CPU learner every ``.grad`` is a view of it
        #: (`bind_grads`), so backward writes the gradient where the all-reduce sends it from
        #: and the step reads the sum there: no copy either way (the two copies were ~50 us of
        #: a 0.64 ms update, docs/benchmarks.md)
        self.buf = np.zeros(n_params + 1, np.float32)
        #: the ``.grad`` views `bind_grads` made, checked by identity each step (its own check
        #: reads every pointer through numpy's ctypes, ~20 us an update)
        self._views: list[Any] = []
        #: ``buf``'s gradient part as the tensor Adam's zero_grad zeroes (`Adam.grad_buffer`)
        self._grads: Any = None
        #: the persistent sum of ``buf``: through the node's shared memory, or MPI's (None: an
        #: Iallreduce each update; or NCCL).  Collective: every learner makes the same kind
        self.request: Any = None
        if nccl is None:
            self.request = (node_sum(comm, self.buf) if shared else None) or persistent_sum(
                self, comm, self.buf
            )

    def step(self, trainer: Steppable, loss: Any, td: Any) -> None:
        self.straggle()
        n = float(td.shape[0])
        if self.nccl is not None:
            self._step_nccl(trainer, n)
            return
        buf, grad = self.buf, self.buf[:-1]
        if trainer.device.type == "cpu":
            self._bind(trainer)
        else:  # CUDA learners that cannot use NCCL: through the host
            flat_grads(trainer.params, buf)
        w = n / self.batch if self.batch else n
        if w != 1.0:
            grad *= w
        buf[-1] = w
        req = self.request
        if req is None:
            req = self.comm.Iallreduce(MPI.IN_PLACE, [buf, MPI.FLOAT], op=MPI.SUM)
        else:
            req.Start()
        self.wait_s = self.wait(req)
        if trainer.device.type != "cpu":
            set_grads(trainer.params, grad)
        trainer.apply_step(1.0 / float(buf[-1]))

    def _bind(self, trainer: Steppable) -> None:
        """Every ``.grad`` a view of ``buf`` (once, or after something replaced one).  Where
        Adam's zero_grad, just before this backward, found every ``.grad`` one of the views in
        this sync's buffer (``opt.intact``), backward has added into them in place: nothing to
        check again (the second identity check was ~5 us an update)."""
        opt = trainer.opt
        if opt.intact and opt.grad_buffer is self._grads and self._grads is not None:
            return
        views, params = self._views, trainer.params
        same = len(views) == len(params)
        if not (same and all(p.grad is v for p, v in zip(params, views, strict=True))):
            bind_grads(params, self.buf)
            self._views = [p.grad for p in params]
        if self._grads is None:
            self._grads = trainer.torch.from_numpy(self.buf[:-1])
        opt.grad_buffer = self._grads

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


def persistent_sum(owner: object, comm: Any, buf: np.ndarray) -> Any:
    """A persistent in-place float32 sum of ``buf`` over ``comm`` (``MPI_Allreduce_init``;
    collective: every rank makes it at the same point), freed when ``owner`` goes or at exit,
    before MPI_Finalize; None where the MPI library has no persistent collectives."""
    try:
        req = comm.Allreduce_init(MPI.IN_PLACE, [buf, MPI.FLOAT], op=MPI.SUM)
    except (AttributeError, NotImplementedError, MPI.Exception):
        return None
    weakref.finalize(owner, _free_request, req)
    return req


def _free_request(req: Any) -> None:
    if MPI.Is_initialized() and not MPI.Is_finalized():
        try:
            req.Free()
        except MPI.Exception:  # still active (a run torn down mid-sum): MPI_Finalize's
            pass


class SubmitSync(LocalSync):
    """async / gba: no step here; the gradient is kept (``taken()``) for the lead's aggregator
    or a worker's GRAD."""

    def __init__(
        self, straggle_s: float = 0.0, window: tuple[float, float] = (0.0, float("inf"))
    ) -> None:
        super().__init__(straggle_s, window)
        self.grad: np.ndarray | None = None

    def step(self, trainer: Steppable, loss: Any, td: Any) -> None:
        self.straggle()
        self.grad = flat_grads(trainer.params)

    def taken(self) -> np.ndarray:
        g, self.grad = self.grad, None
        if g is None:
            raise RuntimeError("no gradient was computed since the last one was taken")
        return g


def process_group(comm: Any, backend: str, device: Any = None) -> Any:
    """torch.distributed over the learner ranks (``nccl`` for CUDA learners; ``gloo`` tests the
    same path on CPUs), its rendezvous over ``comm``: rank 0 opens a `TCPStore` on a port the
    kernel picks and keeps it open (no free-port race), and broadcasts ``host:port`` (bytes, no
    pickle); the others connect to it."""
    import torch.distributed as dist

    rank, k = comm.Get_rank(), comm.Get_size()
    addr = np.zeros(256, np.uint8)
    store = None
    if rank == 0:
        host = socket.gethostname()
        store = dist.TCPStore(host, 0, world_size=k, is_master=True, wait_for_workers=False)
        text = f"{host}:{store.port}".encode()
        addr[: len(text)] = np.frombuffer(text, np.uint8)
    comm.Bcast([addr, MPI.BYTE], root=0)
    host, _, port = bytes(addr).rstrip(b"\0").decode().rpartition(":")
    if store is None:
        store = dist.TCPStore(host, int(port), world_size=k, is_master=False)
    extra = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=k, **extra)
    return dist


def learner_devices(comm: Any, device: Any) -> list[str]:
    """Every learner's ``host/device`` (``vm/cuda:0``, ``vm/cpu``), gathered as fixed-size bytes
    (no pickle)."""
    mine = np.zeros(256, np.uint8)
    name = str(device)
    name = "cuda:0" if name == "cuda" else name  # torch's current device, unless set
    text = f"{socket.gethostname()}/{name}".encode()[:256]
    mine[: len(text)] = np.frombuffer(text, np.uint8)
    every = np.zeros((comm.Get_size(), 256), np.uint8)
    comm.Allgather([mine, MPI.BYTE], [every, MPI.BYTE])
    return [bytes(row).rstrip(b"\0").decode(errors="replace") for row in every]


def nccl_usable(devices: list[str]) -> bool:
    """NCCL sums on the devices only when every learner has a GPU of its own: learners that
    share one GPU, or mix CPU and CUDA, sum on the host over MPI instead (NCCL hangs or fails
    on either)."""
    return all("/cuda" in d for d in devices) and len(set(devices)) == len(devices)


def make_syncs(
    mode: str,
    comm: Any,
    n_params: int,
    device: Any,
    straggle_s: float = 0.0,
    window: tuple[float, float] = (0.0, float("inf")),
    batch: int = 0,
) -> dict[str, LocalSync]:
    """This learner's sync objects by the way an update is made: ``allreduce`` (synchronous)
    and ``gba`` (the gradient goes to the lead's aggregator); ``switch`` has both.  Making the
    allreduce one is collective over ``comm`` (every learner makes the same); ``batch``: the
    learners' batch size (`AllreduceSync`)."""
    out: dict[str, LocalSync] = {}
    if mode in ("allreduce", "switch"):
        devices = learner_devices(comm, device)  # collective: the same verdict on every learner
        nccl = process_group(comm, "nccl", device) if nccl_usable(devices) else None
        out["allreduce"] = AllreduceSync(comm, n_params, straggle_s, nccl, window, batch)
    if mode in ("async", "gba", "switch"):
        out["gba"] = SubmitSync(straggle_s, window)
    return out


def make_sync(
    mode: str, comm: Any, n_params: int, device: Any, straggle_s: float = 0.0, batch: int = 0
) -> LocalSync:
    """This learner's one sync object in a fixed mode (``comm`` None or of size 1: K = 1)."""
    if comm is None or comm.Get_size() == 1:
        return LocalSync(straggle_s)
    syncs = make_syncs(mode, comm, n_params, device, straggle_s, batch=batch)
    return syncs.get("allreduce") or syncs["gba"]


def bcast_state(comm: Any, trainer: Any, updates: int = 0) -> int:
    """Every learner takes the lead's networks, Adam state (both moments and step counts) and
    update count (collective): synchronous training starts from one state on every learner.
    Returns the update count."""
    tensors = [*trainer.online.parameters(), *trainer.target.parameters()]
    opt = trainer.opt
    tensors += [*opt.exp_avg, *opt.exp_avg_sq, *opt.steps]
    for t in tensors:
        host = np.array(t.detach().cpu().numpy(), np.float32).reshape(-1)  # (0-d: the steps)
        comm.Bcast([host, MPI.FLOAT], root=0)
        with trainer.torch.no_grad():
            t.copy_(trainer.torch.from_numpy(host).reshape(t.shape).to(t.device))
    n = np.array([updates], np.int64)
    comm.Bcast([n, MPI.INT64_T], root=0)
    trainer.updates = int(n[0])
    return trainer.updates


def state_crc(trainer: Any) -> int:
    """crc32 of a learner's online network and Adam state: equal on every learner after
    synchronous updates (the lead checks it at each checkpoint)."""
    crc = 0
    opt = trainer.opt
    for t in [*trainer.online.parameters(), *opt.exp_avg, *opt.exp_avg_sq, *opt.steps]:
        crc = zlib.crc32(np.ascontiguousarray(t.detach().cpu().numpy(), np.float32).data, crc)
    return crc


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
    "make_syncs",
    "set_grads",
    "wait_polled",
]
