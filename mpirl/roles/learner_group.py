"""The learner group: ``--learners K`` ranks training one network (the cloud's first K ranks).

Learner 0 (the lead) is the `mpirl.roles.learner.Learner`: it alone talks to the buffers over the
long-haul link, owns evaluation, checkpoints, weight broadcasts and the stop.  Learners 1..K-1
(`mpirl.roles.learner_worker.GroupWorker`) compute gradients; the lead hands them work over the
``learners`` communicator (the cloud's own network, not the emulated link).

The update step goes through one seam: ``TrainStep.sync.step(trainer, loss, td)`` after the
backward pass.  `LocalSync` (K = 1) clips and steps, as a lone learner does.  The modes
(``--learner-sync``):

``allreduce``  every update the lead sends each worker an ORDER (a batch relayed from a buffer,
               or "sample B from your shard"); every learner computes its gradient and
               `AllreduceSync` sums ``[n * grad, n]`` over the group in one MPI Allreduce of one
               contiguous float32 buffer; each divides by the summed n and takes the same
               Adam step: one update of global batch K x B, the same parameters on every rank.
``async``      parameter server: workers send GRAD (gradient, the weights' version, |td|); the
               lead applies each as it arrives (`mpirl.agent.gba.GlobalBatch` of B, no decay).
``gba``        the lead assembles K x B samples' worth of gradients from whichever learners
               deliver (its own included), drops / decays stale ones (`mpirl.agent.gba`), applies
               one.

Token control (async, gba): a worker holds at most one ORDER; an ORDER carries the lead's
current weights (online and target) when the worker's copy is older, so a gradient's version is
the lead's update count when its ORDER left.

Messages on ``learners`` (numpy uint8 buffers, MPI tag = kind): a 64-byte header f8[8]
``kind, id, version, n, a, b, c, d`` then the body:

=======  =============  ==========================================================================
kind     direction      header fields; body
=======  =============  ==========================================================================
ORDER    lead -> worker id=order, version=weights version in the body (-1: none), n=B, a=beta,
                        b=importance-weight scale, c=1 a relayed BATCH follows; [online f4[P],
                        target f4[P]] [the buffer's BATCH message, as it came over the link]
SHARD    lead -> worker body: a buffer's FORWARD message (replay_at=learner: the worker's shard)
GRAD     worker -> lead id=order, version, n, a=loss, b=compute s, c=1 a gradient follows;
                        [grad f4[P]] td_abs f4[n]
STOP     lead -> worker no body: finish, answer DONE
DONE     worker -> lead a=orders served
CKPT     lead -> worker id=checkpoint: write your part (network, optimizer, shard); the same
         worker -> lead kind back once it is on disk (the lead writes the manifest after)
=======  =============  ==========================================================================
"""

from __future__ import annotations

import time
from enum import IntEnum
from typing import NamedTuple

import numpy as np

MODES = ("allreduce", "async", "gba")
HDR = 8  # float64 header fields


class GTag(IntEnum):
    ORDER = 41
    SHARD = 42
    GRAD = 43
    STOP = 44
    DONE = 45
    CKPT = 46


_GTAGS = {int(t) for t in GTag}


def pack(
    kind: GTag,
    body=(),
    id_: int = 0,
    version: int = -1,
    n: int = 0,
    a: float = 0.0,
    b: float = 0.0,
    c: float = 0.0,
    d: float = 0.0,
) -> np.ndarray:
    """One group message: the header, then each body array's bytes."""
    hdr = np.array([int(kind), id_, version, n, a, b, c, d], np.float64)
    parts = [hdr.view(np.uint8)] + [
        np.ascontiguousarray(x).reshape(-1).view(np.uint8) for x in body
    ]
    return np.concatenate(parts)


def header(buf: np.ndarray) -> np.ndarray:
    return np.frombuffer(buf[: HDR * 8].tobytes(), np.float64)


class GroupMessage(NamedTuple):
    """A received group message: the header's slots, its body, where it came from (as
    `mpirl.transport.wire.Message`); the properties name the slots of each kind (table above)."""

    kind: GTag
    id: int
    version: int
    n: int
    a: float
    b: float
    c: float
    d: float
    body: np.ndarray
    buf: np.ndarray
    rank: int = -1
    t: float = 0.0

    beta = property(lambda m: m.a, doc="ORDER: the importance-sampling exponent")
    scale = property(lambda m: m.b, doc="ORDER: the importance-weight scale")
    relayed = property(lambda m: bool(m.c), doc="ORDER: a buffer's BATCH follows")
    loss = property(lambda m: m.a, doc="GRAD")
    compute_s = property(lambda m: m.b, doc="GRAD: seconds the worker spent")
    has_grad = property(lambda m: bool(m.c), doc="GRAD: a gradient precedes the |td|")
    served = property(lambda m: int(m.a), doc="DONE: orders served")


class GroupWire:
    """Unpacks the group's messages for `mpirl.transport.inbox.Inbox` (as
    `mpirl.transport.wire.Wire` does the run's)."""

    @staticmethod
    def unpack(
        buf: np.ndarray, tag: int, source: str = "?", rank: int = -1, t: float = 0.0
    ) -> GroupMessage:
        if buf.nbytes < HDR * 8:
            raise RuntimeError(
                f"group message with tag {tag} from {source}: {buf.nbytes} "
                f"bytes is shorter than the {HDR * 8}-byte header"
            )
        h = header(buf)
        if int(h[0]) != tag or tag not in _GTAGS:
            raise RuntimeError(
                f"group message with tag {tag} from {source}: header says kind {int(h[0])}"
            )
        return GroupMessage(
            GTag(tag),
            int(h[1]),
            int(h[2]),
            int(h[3]),
            float(h[4]),
            float(h[5]),
            float(h[6]),
            float(h[7]),
            body(buf),
            buf,
            rank,
            t,
        )


def body(buf: np.ndarray) -> np.ndarray:
    return buf[HDR * 8 :]


def floats(raw: np.ndarray, count: int, offset: int = 0) -> np.ndarray:
    """``count`` float32 at byte ``offset`` of ``raw`` (copied: aligned)."""
    return np.frombuffer(raw[offset : offset + 4 * count].tobytes(), np.float32)


# ---- gradients as one contiguous buffer --------------------------------------------------------
def flat_grads(params, out: np.ndarray | None = None) -> np.ndarray:
    """Every parameter's gradient, concatenated in ``params`` order (float32, on the host)."""
    import torch

    with torch.no_grad():
        flat = torch.cat([p.grad.reshape(-1) for p in params]).float().cpu().numpy()
    if out is None:
        return flat
    out[: flat.size] = flat
    return out


def set_grads(params, flat: np.ndarray) -> None:
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


def set_params(params, flat: np.ndarray) -> None:
    """Write ``flat`` (``flat_params`` order) into the parameters."""
    import torch

    off = 0
    with torch.no_grad():
        for p in params:
            k = p.numel()
            p.copy_(torch.from_numpy(np.ascontiguousarray(flat[off : off + k])).view_as(p))
            off += k


def wait_polled(req) -> float:
    """Complete a nonblocking MPI request by polling with a short sleep (a waiting rank never
    spins a core: mpirl.transport.waiting); returns the seconds waited."""
    t0 = time.monotonic()
    nap = 2e-5
    while not req.Test():
        time.sleep(nap)
        nap = min(nap * 2, 5e-4)
    return time.monotonic() - t0


# ---- the seam: what happens after backward ---------------------------------------------------
class LocalSync:
    """K = 1: clip and step, as a lone learner does; ``straggle_s`` sleeps before each step."""

    def __init__(self, straggle_s: float = 0.0):
        self.straggle_s = straggle_s
        self.wait_s = 0.0  # seconds the last step waited for the group

    def step(self, trainer, loss, td) -> None:
        if self.straggle_s:
            time.sleep(self.straggle_s)
        trainer.apply_step()


class AllreduceSync(LocalSync):
    """allreduce: ``[n * grad, n]`` summed over ``comm`` in one MPI Iallreduce (polled), the
    gradient set to the sum / total n (the mean over the global batch), then clip and step.

    CUDA learners: with ``nccl`` (a torch.distributed process group over the same ranks) the
    flat gradient is summed on the device instead; see `nccl_group`."""

    def __init__(self, comm, n_params: int, straggle_s: float = 0.0, nccl=None):
        super().__init__(straggle_s)
        self.comm, self.nccl = comm, nccl
        self.send = np.zeros(n_params + 1, np.float32)
        self.recv = np.zeros_like(self.send)

    def step(self, trainer, loss, td) -> None:
        if self.straggle_s:
            time.sleep(self.straggle_s)
        n = float(td.shape[0])
        if self.nccl is not None:
            self._step_nccl(trainer, n)
            return
        from mpi4py import MPI

        flat_grads(trainer.params, self.send)
        self.send[:-1] *= n
        self.send[-1] = n
        req = self.comm.Iallreduce([self.send, MPI.FLOAT], [self.recv, MPI.FLOAT], op=MPI.SUM)
        self.wait_s = wait_polled(req)
        set_grads(trainer.params, self.recv[:-1] / self.recv[-1])
        trainer.apply_step()

    def _step_nccl(self, trainer, n: float) -> None:  # pragma: no cover - needs 2+ GPUs
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

    def __init__(self, straggle_s: float = 0.0):
        super().__init__(straggle_s)
        self.grad: np.ndarray | None = None

    def step(self, trainer, loss, td) -> None:
        if self.straggle_s:
            time.sleep(self.straggle_s)
        self.grad = flat_grads(trainer.params)

    def taken(self) -> np.ndarray:
        g, self.grad = self.grad, None
        if g is None:
            raise RuntimeError("no gradient was computed since the last one was taken")
        return g


def nccl_group(comm, device):  # pragma: no cover - needs one GPU per learner
    """torch.distributed NCCL over the learner ranks, its rendezvous over ``comm``: rank 0
    picks a free TCP port and broadcasts ``host:port`` (bytes, no pickle).  Untested here (no
    multi-GPU machine); used only for CUDA learners."""
    import socket

    import torch.distributed as dist
    from mpi4py import MPI

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


def make_sync(cfg, comm, n_params: int, device) -> LocalSync:
    """This learner's sync object (``comm``: the learners communicator, None for K = 1)."""
    straggle = straggle_s(cfg, comm)
    if comm is None or comm.Get_size() == 1:
        return LocalSync(straggle)
    if cfg.learner_sync == "allreduce":
        nccl = nccl_group(comm, device) if getattr(device, "type", "cpu") == "cuda" else None
        return AllreduceSync(comm, n_params, straggle, nccl)
    return SubmitSync(straggle)


def straggle_s(cfg, comm) -> float:
    """--straggle RANK:MS: this learner's sleep per update, in seconds (0 elsewhere)."""
    if not cfg.straggle:
        return 0.0
    rank, ms = parse_straggle(cfg.straggle)
    me = 0 if comm is None else comm.Get_rank()  # learner j is world rank j
    return ms / 1000.0 if rank == me else 0.0


def parse_straggle(text: str) -> tuple[int, float]:
    """'RANK:MS' -> (rank, ms); ValueError on anything else."""
    rank, sep, ms = text.partition(":")
    r, m = int(rank), float(ms)
    if not sep or r < 0 or not m >= 0 or m == float("inf"):
        raise ValueError(text)
    return r, m


def shard_config(cfg, learners: int):
    """The config of one learner's replay shard (replay_at=learner): capacity / K each."""
    import dataclasses
    import math

    if learners == 1:
        return cfg
    return dataclasses.replace(cfg, replay_capacity=math.ceil(cfg.replay_capacity / learners))


def bcast_weights(comm, trainer) -> None:
    """Every learner starts from the lead's online and target networks (collective)."""
    from mpi4py import MPI

    for net in (trainer.online, trainer.target):
        flat = np.ascontiguousarray(net.flat_params(), np.float32)
        comm.Bcast([flat, MPI.FLOAT], root=0)
        set_params(list(net.parameters()), flat)
