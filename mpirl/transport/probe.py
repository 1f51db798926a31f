"""Measure the real long-haul link at start (``--replay-at auto --link none``): rank 0 (the lead
learner) and each buffer exchange a few ping-pongs (the round trip) and a timed transfer toward
the learner (the rate); the slowest site decides.  Plain numpy buffers and uppercase mpi4py
calls over COMM_WORLD, before any role runs, so nothing else is on the wire; the timed transfer
is sized from a first, small one to take about `TARGET_S` (`MIN_BYTES` to `MAX_BYTES`), so the
probe stays under about a second on links of a few Mb/s and up."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mpi4py import MPI

TAG = 31_700  # probe messages (nothing else is sent before the roles start)
PINGS = 5
MIN_BYTES = 256 * 1024
MAX_BYTES = 4 * 2**20
TARGET_S = 0.25


@dataclass(frozen=True)
class Probe:
    """One site's link as measured from rank 0."""

    rank: int  # the buffer's world rank
    rtt_s: float  # best round trip of a small message
    rate_bps: float  # bits/s toward the learner (timed transfer, round trip taken off)
    nbytes: int  # size of the timed transfer


def _transfer(world: MPI.Comm, peer: int, nbytes: int, big: np.ndarray, rtt: float) -> float:
    """Rank 0's side of one transfer: ask ``peer`` for ``nbytes`` and time it; bits/s."""
    go = np.array([nbytes], np.int64)
    t = time.perf_counter()
    world.Send(go, dest=peer, tag=TAG)
    world.Recv(big[:nbytes], source=peer, tag=TAG)
    return nbytes * 8 / max(time.perf_counter() - t - rtt, 1e-6)


def _measure_one(world: MPI.Comm, peer: int, big: np.ndarray) -> Probe:
    ping = np.zeros(1, np.int64)
    rtts = []
    for _ in range(PINGS):
        t = time.perf_counter()
        world.Send(ping, dest=peer, tag=TAG)
        world.Recv(ping, source=peer, tag=TAG)
        rtts.append(time.perf_counter() - t)
    rtt = min(rtts)
    first = _transfer(world, peer, MIN_BYTES, big, rtt)
    n = int(min(MAX_BYTES, max(MIN_BYTES, first / 8 * TARGET_S)))
    rate = _transfer(world, peer, n, big, rtt)
    world.Send(np.array([0], np.int64), dest=peer, tag=TAG)  # done
    return Probe(peer, rtt, max(rate, first) if n == MIN_BYTES else rate, n)


def _answer(world: MPI.Comm) -> None:
    """A buffer's side: echo the pings, send what rank 0 asks for, until it says 0."""
    ping = np.zeros(1, np.int64)
    for _ in range(PINGS):
        world.Recv(ping, source=0, tag=TAG)
        world.Send(ping, dest=0, tag=TAG)
    big = np.ones(MAX_BYTES, np.uint8)
    while True:
        world.Recv(ping, source=0, tag=TAG)
        if int(ping[0]) == 0:
            return
        world.Send(big[: int(ping[0])], dest=0, tag=TAG)


def measure(world: MPI.Comm, buffers: list[int]) -> list[Probe] | None:
    """Rank 0: the probes of every buffer rank in ``buffers`` (one after another); a buffer:
    answers rank 0 and gets None; any other rank: None at once."""
    rank = world.Get_rank()
    if rank == 0:
        big = np.empty(MAX_BYTES, np.uint8)
        return [_measure_one(world, b, big) for b in buffers]
    if rank in buffers:
        _answer(world)
    return None
