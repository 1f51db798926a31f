"""Run under `mpirun -n 2`: the real learner group (the lead's `Learner` loop and learner 1's
`GroupWorker`, as `mpirl.wiring` builds them) with ``--learner-sync MODE``, ``--replay-at
buffer`` and a scripted buffer that hands the lead the same batches in the same order in every
run (`mpirl.fakes.ScriptedLink`), no actors; UPDATES global updates, then the stop protocol.
Rank 0 prints a JSON line: the crc32 of the lead's network and Adam state
(`mpirl.transport.group.state_crc`), learner 1's, the switches logged and the updates made
(used by tests/test_learner_group.py, with allreduce and switch).  With gba the run is not
deterministic (its server thread applies gradients as they come), and on a loaded machine it
did not always end here (3 of 9 tries at load 5, 2026-12-06): not diagnosed, not used.

    group_scripted.py MODE UPDATES RUN_DIR
"""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
from mpi4py import MPI

from mpirl.fakes import ScriptedLink, batch_messages, learner_ends, wire_of
from mpirl.logs.runlog import RunLog
from mpirl.run.config import Config
from mpirl.transport.group import state_crc
from mpirl.transport.inbox import Inbox
from mpirl.transport.link import PROFILES, LinkEnd
from mpirl.transport.topology import Ends, layout
from mpirl.transport.wire import Tag
from mpirl.wiring import build_learner, build_worker

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
MODE, UPDATES, RUN_DIR = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
cfg = Config(
    replay_at="buffer",
    learners=2,
    learner_sync=MODE,
    hidden=(32, 32),
    batch_size=32,
    target_update=20,  # several target copies within the run
    max_updates=UPDATES,
    eval_every=10**9,
    evaluator="inline",
    progress_seconds=0,
    checkpoint_seconds=0,
    target_return=float("nan"),
)
spec, wire = wire_of(cfg, role="learner")
topo = SimpleNamespace(link=None, learners=comm, places=layout(4, 1, 2))


def scripted_buffer() -> ScriptedLink:
    """A buffer that has the next batch ready on every receive (the k-th received is always
    batch k) until the learner's STOP, then says DONE."""
    bufs, sent, stopped = batch_messages(cfg, spec, wire, 3 * UPDATES, 4096), [0], [False]

    def feed() -> list:
        if stopped[0]:
            out, link.inbox = link.inbox, []
            return out
        sent[0] += 1
        return [(Tag.BATCH, bufs[(sent[0] - 1) % len(bufs)].copy())]

    def on_post(lk: ScriptedLink, tag: Tag) -> None:
        if tag == Tag.STOP:
            stopped[0] = True
            lk.inbox += [(Tag.STATS, wire.stats([], 0, 0)), (Tag.DONE, wire.done(0, 0))]

    link = ScriptedLink(1, on_post, feed=feed)
    return link


RUN_DIR.mkdir(parents=True, exist_ok=True)
if rank == 0:
    ends = learner_ends(wire, {1: scripted_buffer()})
    ends.group = {1: LinkEnd(comm, 1, PROFILES["none"])}
    ends.group_inbox = Inbox(wire, "learner", lambda j: f"learner {j}")
    with RunLog(RUN_DIR / "learner.h5", {}, flush_seconds=1) as log:
        lrn = build_learner(cfg, topo, spec, wire, log, ends, say=lambda s: None)
        lrn.run()
        crc = state_crc(lrn.trainer)
    other = np.zeros(1, np.int64)
    comm.Recv([other, MPI.INT64_T], source=1)
    with h5py.File(RUN_DIR / "learner.h5", "r") as f:
        switches = len(f["switches/t"]) if "switches/t" in f else 0
    print(
        json.dumps(
            {
                "crc": crc,
                "crc_learner_1": int(other[0]),
                "updates": lrn.state.updates,
                "switches": switches,
            }
        )
    )
else:
    ends = Ends()
    ends.group = {0: LinkEnd(comm, 0, PROFILES["none"])}
    ends.group_inbox = Inbox(wire, "learner 1", lambda j: "the lead learner")
    with RunLog(RUN_DIR / "learner-1.h5", {}, flush_seconds=1) as log:
        worker = build_worker(cfg, topo, spec, wire, log, ends)
        worker.run()
    comm.Send([np.array([state_crc(worker.trainer)], np.int64), MPI.INT64_T], dest=0)
