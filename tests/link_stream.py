"""Run under `mpirun -n 2`: stream messages over an emulated link in both directions and print
what arrived when, as JSON on rank 0 (used by tests/test_link_emulation.py)."""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from mpirl.transport.link import LinkEnd, LinkProfile

lat_ms, mbps, size, count = (float(x) for x in sys.argv[1:5])
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
link = LinkEnd(comm.Dup(), 1 - rank, LinkProfile(latency_s=lat_ms / 1e3, rate_bps=mbps * 1e6))


def stream(sender: int) -> dict:
    comm.Barrier()
    if rank == sender:
        t0 = time.monotonic()
        for i in range(int(count)):
            buf = np.full(int(size), i % 251, np.uint8)
            link.post(buf, tag=1)
        link.flush_blocking(60)
        comm.Send([np.array([t0]), MPI.DOUBLE], dest=1 - rank, tag=9)
        return {}
    got = []
    while len(got) < count:
        for _, buf in link.receive():
            got.append((time.monotonic(), buf.nbytes, int(buf[0])))
        time.sleep(1e-4)
    t0 = np.empty(1)
    comm.Recv([t0, MPI.DOUBLE], source=1 - rank, tag=9)
    return {"t0": float(t0[0]), "arrivals": got}


out = {"a_to_b": stream(0), "b_to_a": stream(1)}
res = comm.gather(out.get("a_to_b") or out.get("b_to_a"), root=0)  # tiny test-only control data
if rank == 0:
    print(json.dumps({"a_to_b": res[1], "b_to_a": res[0]}))
