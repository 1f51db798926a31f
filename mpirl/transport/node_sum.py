"""The learner group's gradient sum through one node's shared memory, where every learner of
the group runs on the same node (a laptop, one cluster node): a persistent request with MPI's
``Start`` / ``Test`` / ``Wait``, so `mpirl.transport.group.AllreduceSync` completes it as it
would ``MPI_Allreduce_init``'s.

Why not MPI's all-reduce there: on two pinned learners (CartPole's network, 4,610 floats, batch
64) MPICH's persistent all-reduce cost ~11 us to start and ~50 us to complete an update even when
both learners arrived together (its single-copy transfer, ``process_vm_readv``, and the
handshakes around it), ~8% of a 0.6 ms update (docs/benchmarks.md).  Here each learner copies
its ``[w * grad, w]`` into its slot of an MPI shared window (``MPI_Win_allocate_shared``),
publishes the update's sequence number in its flag, and once every flag shows it, adds the K
slots up in rank order: the same additions in the same order on every learner, so the sums are
bitwise equal and the learners' weights stay equal.

Slots are double-buffered by the parity of the sequence number: a learner can be one update
ahead of another (its sum done, the next one started) but never two, since starting update
s + 1 needs every flag at s, and a learner raises its flag for s + 1 only after it has read
update s - 1's slots, the ones update s + 1 overwrites.  ``MPI_Win_sync`` orders the slot's
stores before the flag's and the flag's loads before the slot's (a no-op on x86; required on
weaker memory models).  Every ``PROGRESS_EVERY``-th failed ``Test`` advances MPI's progress
engine (``Iprobe``), as the all-reduce's own ``Test`` did, so a message another rank waits for
(an ORDER, a weights broadcast) moves while this learner waits here; not every one, since a
spinning wait polls ``Test`` every fraction of a microsecond and a flag's load is all it needs.
"""

from __future__ import annotations

import atexit
from typing import Any

import numpy as np
from mpi4py import MPI

LINE = 64  # bytes: one flag per cache line
PROGRESS_EVERY = 32  # failed Tests per MPI progress call


class NodeSum:
    """A persistent in-place float32 sum of ``buf`` over ``comm``, whose ranks share a node
    (made by `node_sum`, collectively).  ``Start()`` publishes this rank's ``buf``; ``Test()``
    is True once every rank's is in, with their sum (rank order) in ``buf``."""

    def __init__(self, comm: Any, buf: np.ndarray) -> None:
        if buf.dtype != np.float32 or buf.ndim != 1:
            raise ValueError(f"NodeSum sums a flat float32 buffer, not {buf.dtype} {buf.shape}")
        self.comm, self.buf = comm, buf
        self.rank, self.k = comm.Get_rank(), comm.Get_size()
        n = buf.size
        slot = -(-n * 4 // LINE) * LINE  # bytes, a whole number of cache lines
        total = LINE * self.k + 2 * self.k * slot
        self.win = MPI.Win.Allocate_shared(total if self.rank == 0 else 0, 1, comm=comm)
        mem, _ = self.win.Shared_query(0)
        whole = mem.cast("B")
        raw = np.frombuffer(whole, np.uint8, count=total)
        #: each rank's published sequence number, one cache line apart (rank r's at r * LINE /
        #: 8): a memoryview, whose items read and write as Python ints with one aligned 8-byte
        #: load or store each, so a spinning wait's poll is a few bytecodes
        self.flags = whole[: LINE * self.k].cast("q")
        #: [parity, rank, n]: each rank's ``buf`` for the updates of that parity
        self.slots = raw[LINE * self.k :].view(np.float32).reshape(2, self.k, slot // 4)[..., :n]
        self.win.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch, for Win_sync
        if self.rank == 0:
            raw[:] = 0
        self.win.Sync()
        comm.Barrier()
        self.win.Sync()
        self._flag = self.rank * LINE // 8
        self._others = [r * LINE // 8 for r in range(self.k) if r != self.rank]
        #: every rank's slot, in rank order, for even and for odd updates; this rank's own
        self._all = tuple(tuple(self.slots[s, r] for r in range(self.k)) for s in (0, 1))
        self._mine = (self._all[0][self.rank], self._all[1][self.rank])
        self.seq = 0  # this rank's last started sum
        self.done = True
        self._misses = 0
        atexit.register(_free, self.win)  # collective: at exit on every rank, not at a GC

    def Start(self) -> None:
        if not self.done:
            raise RuntimeError("NodeSum.Start before the last sum completed")
        self.seq += 1
        self.done = False
        np.copyto(self._mine[self.seq & 1], self.buf)
        self.win.Sync()  # the slot's stores before the flag's
        self.flags[self._flag] = self.seq

    def Test(self) -> bool:
        if self.done:
            return True
        seq, flags = self.seq, self.flags
        for i in self._others:
            if flags[i] < seq:
                self._misses += 1
                if self._misses % PROGRESS_EVERY == 0:  # MPI's progress meanwhile
                    self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
                return False
        self.win.Sync()  # the flags' loads before the slots'
        slots, out = self._all[seq & 1], self.buf
        np.add(slots[0], slots[1], out=out)
        for r in range(2, self.k):
            np.add(out, slots[r], out=out)
        self.done = True
        return True

    def Wait(self) -> None:
        while not self.Test():
            pass


def node_sum(comm: Any, buf: np.ndarray) -> NodeSum | None:
    """A `NodeSum` of ``buf`` over ``comm`` where its K >= 2 ranks share one node, else None
    (collective over ``comm``: every rank gets the same answer)."""
    if comm.Get_size() < 2:
        return None
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    one_node = node.Get_size() == comm.Get_size()
    node.Free()
    if not one_node:
        return None
    return NodeSum(comm, buf)


def _free(win: Any) -> None:
    if MPI.Is_initialized() and not MPI.Is_finalized():
        win.Unlock_all()
        win.Free()
