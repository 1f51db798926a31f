"""Run under `mpirun -n K`: the learners' torch.distributed rendezvous (mpirl.transport.group
.process_group) with gloo on CPUs, one all_reduce, and the devices every learner reports;
rank 0 prints JSON (used by tests/test_learner_group.py)."""

import json

import torch
from mpi4py import MPI

from mpirl.transport.group import learner_devices, nccl_usable, process_group

comm = MPI.COMM_WORLD
dist = process_group(comm, "gloo")
x = torch.tensor([float(comm.Get_rank() + 1)])
dist.all_reduce(x)
devices = learner_devices(comm, torch.device("cpu"))
dist.destroy_process_group()
if comm.Get_rank() == 0:
    print(json.dumps({"sum": float(x[0]), "devices": devices, "nccl": nccl_usable(devices)}))
