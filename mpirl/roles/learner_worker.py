"""A learner of the group other than the lead (``--learners K``, learners 1..K-1).

Its loop serves the lead's messages (mpirl.roles.learner_group): SHARD into its replay shard
(replay_at=learner), ORDER = one batch to compute a gradient on (relayed from a buffer, or
sampled from its shard), STOP.  In ``allreduce`` the gradient goes into the group's Allreduce
and every learner steps; in ``async`` / ``gba`` it goes back to the lead in a GRAD message with
the version of the weights it was computed on.  Either way the batch's |td| goes back (the
priorities of a relayed batch; its shard's own priorities are updated here).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from mpirl.agent import device as device_mod
from mpirl.agent.train_step import TrainStep
from mpirl.logs import schema
from mpirl.replay.build import make_replay
from mpirl.roles.learner_group import (
    GroupMessage,
    GTag,
    SubmitSync,
    bcast_weights,
    floats,
    make_sync,
    pack,
    set_params,
    shard_config,
)
from mpirl.run import seeds
from mpirl.run.checkpoint import memory_state, restore_memory
from mpirl.transport.waiting import Backoff
from mpirl.transport.wire import Tag, Wire

if TYPE_CHECKING:
    from mpirl.agent.envs import EnvSpec
    from mpirl.logs.runlog import RunLog
    from mpirl.run.config import Config
    from mpirl.transport.topology import Ends, Topology


class GroupWorker:
    """Learner ``topo.learners.Get_rank()`` > 0: gradients on the lead's orders."""

    def __init__(
        self,
        cfg: Config,
        topo: Topology,
        spec: EnvSpec,
        wire: Wire,
        log: RunLog,
        ends: Ends,
        ckpt=None,
        resume=None,
    ):
        """``ends.group[0]``: the end toward the lead, ``ends.group_inbox`` for its messages
        (`mpirl.main.connect`)."""
        import torch

        self.cfg, self.topo, self.spec, self.wire, self.log = cfg, topo, spec, wire, log
        self.torch = torch
        torch.set_num_threads(cfg.torch_threads)
        comm = topo.learners
        self.comm, self.index = comm, comm.Get_rank()
        seed = seeds.learner(cfg.seed, 1)
        torch.manual_seed(seed["torch"] + 7919 * self.index)
        dev = device_mod.resolve(cfg.device, torch)
        if dev.type == "cuda" and torch.cuda.device_count() > 1:  # one GPU per learner
            dev = torch.device(f"cuda:{self.index % torch.cuda.device_count()}")
        log.set_attrs(**device_mod.describe(dev, torch))
        self.trainer = TrainStep(cfg, spec, dev, cfg.amp)
        self.sync = make_sync(
            cfg, comm, sum(p.numel() for p in self.trainer.params), self.trainer.device
        )
        self.trainer.sync = self.sync
        self.end, self.inbox = ends.group[0], ends.group_inbox
        self.handlers = {
            GTag.SHARD: self.on_shard,
            GTag.ORDER: self.on_order,
            GTag.CKPT: self.on_checkpoint,
            GTag.STOP: self.on_stop,
        }
        self.memory = None
        if cfg.replay_at == "learner":  # one shard of the group's memory
            self.memory = make_replay(
                shard_config(cfg, comm.Get_size()),
                spec,
                wire.record,
                seed=seed["replay"] + 7919 * self.index,
            )
        self.logs = schema.open_streams(log, "learner_worker")
        self.backoff = Backoff()
        self.version = 0
        self.served = 0
        self.stopped = False
        self.ckpt = ckpt
        if resume is not None:
            self.restore(resume)

    def run(self) -> dict:
        from mpirl.run import failure

        bcast_weights(self.comm, self.trainer)
        while not self.stopped or self.end.backlog:
            failure.FAULT.check()
            now = time.monotonic()
            self.end.poll(now)
            msgs = [] if self.stopped else self.end.receive(now)
            self.inbox.deliver(self.handlers, msgs, 0, now)
            self.backoff.work() if msgs else self.backoff.idle()
            self.log.maybe_flush(now)
        return {"orders": self.served}

    def on_shard(self, g: GroupMessage) -> None:
        m = self.wire.unpack(np.array(g.body), Tag.FORWARD, "the lead learner")
        self.memory.add(m.arrays["records"], m.arrays["td_abs"], m.arrays.get("frames"))

    def on_order(self, g: GroupMessage) -> None:
        """One batch: load the weights it carries, compute, answer GRAD."""
        t0 = time.monotonic()
        oid, version, n, beta, scale, relayed = (g.id, g.version, g.n, g.beta, g.scale, g.relayed)
        raw = g.body
        t = self.trainer
        if version >= 0:  # the lead's weights: online, then target
            p = sum(x.numel() for x in t.params)
            set_params(t.params, floats(raw, p))
            set_params(list(t.target.parameters()), floats(raw, p, 4 * p))
            raw = raw[8 * p :]
            self.version = version
        sample = None
        if relayed:
            m = self.wire.unpack(np.array(raw), Tag.BATCH, "the lead learner")
            records, frames = m.arrays["records"], m.arrays.get("frames")
            weights = m.arrays["weights"] * np.float32(scale)
        else:
            self.memory.beta = beta
            sample = self.memory.sample(n)
            records, weights, frames = sample.records, sample.weights, sample.frames
        version_used = self.version if isinstance(self.sync, SubmitSync) else t.updates
        loss, td = t.launch(t.put(records, weights, frames)).result()
        if sample is not None:
            self.memory.update(sample.indices, sample.generations, td)
        grad = [self.sync.taken()] if isinstance(self.sync, SubmitSync) else []
        spent = time.monotonic() - t0
        self.end.post(
            pack(
                GTag.GRAD,
                [*grad, td.astype(np.float32)],
                oid,
                version_used,
                len(td),
                loss,
                spent,
                float(bool(grad)),
            ),
            GTag.GRAD,
        )
        self.logs["work"].append(
            order=oid,
            version=version_used,
            samples=len(td),
            loss=loss,
            compute_s=spent,
            wait_s=self.sync.wait_s,
        )
        self.served += 1

    def on_checkpoint(self, g: GroupMessage) -> None:
        """Write this learner's part (its network and optimizer: the lead's own in allreduce,
        its copy otherwise; its shard) and acknowledge."""
        cid = g.id
        t = self.trainer
        meta = {"served": self.served, "version": self.version, "updates": t.updates}
        arrays = None
        if self.memory is not None:
            arrays, meta["replay"] = memory_state(self.memory)
        self.ckpt.write(
            cid,
            meta,
            arrays,
            {
                "online": t.online.state_dict(),
                "target": t.target.state_dict(),
                "optimizer": t.opt.state_dict(),
                "torch_rng": self.torch.get_rng_state(),
            },
        )
        self.end.post(pack(GTag.CKPT, id_=cid), GTag.CKPT)

    def restore(self, part) -> None:
        """Continue from this learner's part of checkpoint ``part`` (the networks are the
        lead's, broadcast at the start; the optimizer and the shard are this learner's)."""
        t, r = self.trainer, part.meta
        t.opt.load_state_dict(part.torch["optimizer"])
        self.torch.set_rng_state(part.torch["torch_rng"])
        t.updates, self.version, self.served = r["updates"], r["version"], r["served"]
        if self.memory is not None:
            restore_memory(self.memory, part.arrays, r["replay"])

    def on_stop(self, g: GroupMessage) -> None:
        self.end.post(pack(GTag.DONE, a=self.served), GTag.DONE)
        self.stopped = True
