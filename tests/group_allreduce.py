"""Run under `mpirun -n K`: K learners with AllreduceSync, each on its own batch, against one
lone learner (rank 0) on the K batches concatenated; rank 0 prints the largest parameter
difference and the Adam state's as JSON (used by tests/test_learner_group.py).

    group_allreduce.py B UPDATES [uneven] [mpi]

``uneven``: the last learner's batches hold B / 2 transitions (the sync is told B, so its
gradient is weighted by 1/2: the mean is still over every transition).  ``mpi``: the sum is
MPI's all-reduce even though the learners share a node (else it is the node's shared memory,
`mpirl.transport.node_sum`)."""

import dataclasses
import json
import sys

import numpy as np
import torch
from mpi4py import MPI

from mpirl.agent import envs
from mpirl.agent.train_step import TrainStep
from mpirl.run.config import Config
from mpirl.transport.group import AllreduceSync, bcast_weights, state_crc
from mpirl.transport.wire import transition_dtype

comm = MPI.COMM_WORLD
rank, k = comm.Get_rank(), comm.Get_size()
B, UPDATES = int(sys.argv[1]), int(sys.argv[2])
UNEVEN, MPI_SUM = "uneven" in sys.argv[3:], "mpi" in sys.argv[3:]
SIZES = [B] * (k - 1) + [B // 2 if UNEVEN else B]  # each learner's batch
STARTS = np.concatenate([[0], np.cumsum(SIZES)])
cfg = dataclasses.replace(Config(), hidden=(32, 32), grad_clip=0.5, target_update=2)
spec = envs.inspect("CartPole-v1")
torch.manual_seed(100 + rank)  # different initial networks: bcast_weights must align them
group = TrainStep(cfg, spec)
n_params = sum(p.numel() for p in group.params)
group.sync = sync = AllreduceSync(comm, n_params, batch=B, shared=not MPI_SUM)
bcast_weights(comm, group)


def batches(update: int):
    """The K batches of one update (the same on every rank: seeded by the update)."""
    rng = np.random.default_rng(update)
    total = int(STARTS[-1])
    rec = np.zeros(total, transition_dtype(spec.obs_shape, np.float32))
    rec["obs"] = rng.normal(size=rec["obs"].shape)
    rec["next_obs"] = rng.normal(size=rec["obs"].shape)
    rec["action"] = rng.integers(0, spec.n_actions, total)
    rec["reward"] = rng.normal(size=total)
    rec["discount"] = 0.99 * (rng.random(total) > 0.1)
    return rec, rng.uniform(0.2, 1.0, total).astype(np.float32)


lone = None
if rank == 0:
    lone = TrainStep(cfg, spec)
    lone.online.load_state_dict(group.online.state_dict())
    lone.target.load_state_dict(group.target.state_dict())
for u in range(UPDATES):
    rec, w = batches(u)
    mine = slice(STARTS[rank], STARTS[rank + 1])
    group.step(rec[mine], w[mine])
    if lone is not None:
        lone.step(rec, w)
crcs = np.zeros(k, np.int64)  # every learner's weights and Adam state, bitwise
comm.Allgather([np.array([state_crc(group)], np.int64), MPI.INT64_T], [crcs, MPI.INT64_T])
if rank == 0:
    diff = max(float((a - b).abs().max()) for a, b in zip(group.params, lone.params, strict=True))
    tdiff = max(
        float((a - b).abs().max())
        for a, b in zip(group.target.parameters(), lone.target.parameters(), strict=True)
    )
    moved = max(
        float((a - b).abs().max())
        for a, b in zip(group.params, TrainStep(cfg, spec).params, strict=True)
    )
    print(
        json.dumps(
            {
                "param_diff": diff,
                "target_diff": tdiff,
                "moved": moved,
                "updates": group.updates,
                "persistent": sync.request is not None,
                "sum": type(sync.request).__name__,
                "same_on_every_learner": bool((crcs == crcs[0]).all()),
                "summed_w": float(sync.buf[-1]),
            }
        )
    )
