"""Run under `mpirun -n 3` across a real link (tests/netns.py): rank 0 (cloud) and rank 1 (edge)
each send the other ``count`` messages of 16 bytes, as mpirl's small control messages go, rank 0
sends rank 1 ``large`` messages of ``size`` bytes (as weight pieces go), then every rank stops.
tests/test_real_link.py runs it with 0 and with N small messages: the first gives the bytes a
job carries to start and stop (Hydra's launch, PMI, UCX wire-up), the difference MPI's own bytes
per small message on this link."""

import sys

import numpy as np
from mpi4py import MPI

count = int(sys.argv[1])
large, size = (int(x) for x in sys.argv[2:4]) if len(sys.argv) > 3 else (0, 0)
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
x = np.zeros(16, np.uint8)
if rank in (0, 1):
    peer = 1 - rank
    for _ in range(count):
        req = comm.Isend([x, MPI.BYTE], dest=peer, tag=1)
        comm.Recv([np.empty(16, np.uint8), MPI.BYTE], source=peer, tag=1)
        req.Wait()
    big = np.zeros(size, np.uint8)
    for _ in range(large):  # cloud -> edge, as weight pieces go
        if rank == 0:
            comm.Send([big, MPI.BYTE], dest=1, tag=2)
        else:
            comm.Recv([big, MPI.BYTE], source=0, tag=2)
comm.Barrier()
