"""Run under `mpirun -n K`: ROUNDS sums through `mpirl.transport.node_sum.NodeSum`, each rank
at its own uneven pace (random naps before Start and between Tests, so ranks run an update
ahead of each other), every sum checked against the exact one; rank 0 prints a JSON line
(used by tests/test_learner_group.py).

    node_sum_run.py ROUNDS
"""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from mpirl.transport.node_sum import NodeSum, node_sum

comm = MPI.COMM_WORLD
rank, k = comm.Get_rank(), comm.Get_size()
ROUNDS = int(sys.argv[1])
N = 1000
buf = np.zeros(N, np.float32)
req = node_sum(comm, buf)
assert isinstance(req, NodeSum), req
rng = np.random.default_rng(rank)
wrong = 0
base = np.arange(N, dtype=np.float32)
for s in range(ROUNDS):
    # integer-valued floats: every order of addition gives the same sum, so a wrong one is a
    # stale or missing slot, never rounding
    buf[:] = base + (rank + 1) * (s + 1)
    if rng.random() < 0.3:
        time.sleep(rng.uniform(0, 2e-3))
    req.Start()
    while not req.Test():
        if rng.random() < 0.5:
            time.sleep(rng.uniform(0, 2e-4))
    want = k * base + (s + 1) * k * (k + 1) / 2
    wrong += int(not np.array_equal(buf, want))
try:
    req.Start()
    req.Start()
    twice = "no error"
except RuntimeError as e:
    twice = str(e)
req.Wait()
total = np.zeros(1, np.int64)
comm.Allreduce([np.array([wrong], np.int64), MPI.INT64_T], [total, MPI.INT64_T])
if rank == 0:
    print(json.dumps({"rounds": ROUNDS, "wrong": int(total[0]), "twice": twice}))
