"""Run under `mpirun -n 2`: rank 0 posts a weight-sized latest-wins message every few ms over a
slow emulated link, then a STOP; rank 1 times what arrives.  Prints JSON on rank 0 (used by
tests/test_weights_link.py).  Rank 1 keeps receiving after the STOP, as a buffer does, until
rank 0 has flushed its link: the weights waiting in the slot enter the wire after the STOP."""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from mpirl.transport.link import LinkEnd, LinkProfile
from mpirl.transport.wire import Tag

lat_ms, mbps, size, seconds = (float(x) for x in sys.argv[1:5])
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
link = LinkEnd(comm.Dup(), 1 - rank, LinkProfile(latency_s=lat_ms / 1e3, rate_bps=mbps * 1e6))
comm.Barrier()
if rank == 0:
    t0, posted, most = time.monotonic(), 0, 0
    while time.monotonic() - t0 < seconds:  # a learner with --weights-every 1
        buf = np.full(int(size), posted % 251, np.uint8)
        link.post_latest(Tag.WEIGHTS, lambda b=buf: (b, None))
        posted += 1
        most = max(most, link.latest_waiting_bytes)
        time.sleep(0.005)
    t_stop = time.monotonic()
    link.post(np.zeros(8, np.uint8), Tag.STOP, t_stop)
    link.flush_blocking(120)
    comm.Send([np.array([t_stop]), MPI.DOUBLE], dest=1, tag=99)
    got = np.empty(2)
    comm.Recv([got, MPI.DOUBLE], source=1, tag=98)
    print(
        json.dumps(
            {
                "posted": posted,
                "most_waiting_bytes": most,
                "replaced": link.latest_replaced,
                "stop_delay_s": got[0] - t_stop,
                "weights_received": int(got[1]),
            }
        )
    )
else:
    weights, t_stop_arrived = 0, None
    while t_stop_arrived is None or not comm.Iprobe(source=0, tag=99):  # 0 has flushed
        for tag, _ in link.receive():
            if tag == Tag.STOP:
                t_stop_arrived = time.monotonic()
            elif t_stop_arrived is None:
                weights += 1
        time.sleep(1e-4)
    t_stop = np.empty(1)
    comm.Recv([t_stop, MPI.DOUBLE], source=0, tag=99)
    comm.Send([np.array([t_stop_arrived, weights], float), MPI.DOUBLE], dest=0, tag=98)
