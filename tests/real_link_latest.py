"""Run under `mpirun -n 2` across a real link (tests/netns.py), `--link none` style: rank 0 posts
a ``size``-byte latest-wins message every 5 ms for ``seconds``, then a STOP; rank 1 receives as
a buffer does.  Prints JSON on rank 0: the rate rank 0 measured (`LinkEnd.latest_rate_bps`),
the STOP's delay (rank 1's arrival time minus rank 0's post time: one machine, one monotonic
clock), weight messages received, bytes rank 0 handed to MPI (tests/test_real_link.py)."""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from mpirl.transport.link import LinkEnd, LinkProfile
from mpirl.transport.wire import Tag

size, seconds, piece_ms = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
link = LinkEnd(comm.Dup(), 1 - rank, LinkProfile(), piece_s=piece_ms / 1e3)
comm.Barrier()
if rank == 0:
    t0, posted, rates = time.monotonic(), 0, []
    while time.monotonic() - t0 < seconds:  # a learner with --weights-every 1
        buf = np.full(size, posted % 251, np.uint8)
        link.post_latest(Tag.WEIGHTS, lambda b=buf: (b, None))
        posted += 1
        rates.append(link.latest_rate_bps)
        for _ in range(50):
            link.poll()
            link.receive()  # (a learner receives too: ACKs may come this way)
            time.sleep(1e-4)
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
                "replaced": link.latest_replaced,
                "rate_bps": link.latest_rate_bps,
                "rates_bps": rates[:: max(1, len(rates) // 20)],
                "gaps": [[n, g] for n, g in link.acked.gaps],
                "sent_bytes": link.sent.total_bytes,
                "piece_bytes": link.piece_bytes(),
                "stop_delay_s": got[0] - t_stop,
                "weights_received": int(got[1]),
                "seconds": t_stop - t0,
            }
        )
    )
else:
    weights, t_stop_arrived = 0, None
    while t_stop_arrived is None or not comm.Iprobe(source=0, tag=99):  # 0 has flushed
        link.poll()
        for tag, _ in link.receive():
            if tag == Tag.STOP:
                t_stop_arrived = time.monotonic()
            elif t_stop_arrived is None:
                weights += 1
        time.sleep(2e-3)  # a busy buffer's turn
    t_stop = np.empty(1)
    comm.Recv([t_stop, MPI.DOUBLE], source=0, tag=99)
    comm.Send([np.array([t_stop_arrived, weights], float), MPI.DOUBLE], dest=0, tag=98)
    while link.backlog:
        link.poll()
