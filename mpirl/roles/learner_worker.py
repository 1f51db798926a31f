"""A learner of the group other than the lead (``--learners K``, learners 1..K-1).

Its loop serves the lead's messages (mpirl.transport.group, mpirl.transport.wire): SHARD into its
replay shard (a placement with the memory at the learner), ORDER = one batch to compute a
gradient on (relayed from a buffer, or sampled from its shard), STOP.  In ``allreduce`` the
gradient goes into the group's Allreduce and every learner steps; in ``async`` / ``gba`` it goes
back to the lead in a GRAD message with the version of the weights it was computed on.  Either
way the batch's |td| goes back (the priorities of a relayed batch; its shard's own priorities are
updated here).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from mpirl.agent.grads import set_params
from mpirl.run import failure
from mpirl.run.checkpoint import memory_state, restore_memory
from mpirl.transport.group import SubmitSync, bcast_state, bcast_weights, state_crc
from mpirl.transport.waiting import Backoff
from mpirl.transport.wire import RESYNC, SUBMIT, Tag

if TYPE_CHECKING:
    from collections.abc import Callable

    from mpirl.agent.train_step import TrainStep
    from mpirl.logs.runlog import RunLog, Stream
    from mpirl.replay.frames import FrameReplay
    from mpirl.replay.memory import PrioritizedReplay
    from mpirl.run.checkpoint import Checkpointer, Part
    from mpirl.transport.group import LocalSync
    from mpirl.transport.inbox import Inbox
    from mpirl.transport.link import LinkEnd
    from mpirl.transport.wire import Batch, Forward, Message, Order, Shard, Wire


class GroupWorker:
    """Learner ``index`` > 0 of the group: gradients on the lead's orders."""

    def __init__(
        self,
        index: int,
        comm: Any,
        trainer: TrainStep,
        syncs: dict[int, LocalSync],
        wire: Wire,
        log: RunLog,
        work: Stream,
        end: LinkEnd,
        inbox: Inbox,
        shard: PrioritizedReplay | FrameReplay | None,
        ckpt: Checkpointer | None,
        torch: Any,
    ) -> None:
        """``end``: toward the lead, ``inbox`` for its messages (`mpirl.wiring.connect`);
        ``shard``: its part of the group's replay memory (None: the memory is not at the
        learner); ``work``: the /work stream; ``syncs``: how it makes an update, by an ORDER's
        ``how`` (ALLREDUCE, SUBMIT)."""
        self.index, self.comm, self.trainer, self.syncs, self.wire = (
            index,
            comm,
            trainer,
            syncs,
            wire,
        )
        self.sync = next(iter(syncs.values()))
        self.log, self.work, self.end, self.inbox, self.memory = log, work, end, inbox, shard
        self.ckpt, self.torch = ckpt, torch
        self.handlers: dict[Tag, Callable[[Any], None]] = {
            Tag.SHARD: self.on_shard,
            Tag.ORDER: self.on_order,
            Tag.CHECKPOINT: self.on_checkpoint,
            Tag.STOP: self.on_stop,
        }
        self.n_params = sum(p.numel() for p in trainer.params)
        self.backoff = Backoff()
        self.version = 0
        self.served = 0
        self.stopped = False

    def run(self) -> dict[str, int]:
        # the lead's networks and their version (after a resume too: not this learner's own)
        self.version = bcast_weights(self.comm, self.trainer)
        while not self.stopped or self.end.backlog:
            failure.FAULT.check()
            now = time.monotonic()
            self.end.poll(now)
            msgs = [] if self.stopped else self.end.receive(now)
            self.inbox.deliver(self.handlers, msgs, 0, now)
            self.backoff.work() if msgs else self.backoff.idle()
            self.log.maybe_flush(now)
        return {"orders": self.served}

    def on_shard(self, g: Shard) -> None:
        m = cast("Forward", self.wire.unpack(g.forward_buf, Tag.FORWARD, "the lead learner"))
        assert self.memory is not None
        self.memory.add(m.records, m.td_abs, m.frames)

    def on_order(self, g: Order) -> None:
        """One batch: load the weights it carries, compute, answer GRAD (RESYNC: take the lead's
        networks and Adam state, collectively, and compute nothing)."""
        t0 = time.monotonic()
        t = self.trainer
        if g.how == RESYNC:
            self.version = bcast_state(self.comm, t)
            return
        self.sync = t.sync = self.syncs[g.how]
        weights = g.weights(self.n_params)
        if weights is not None:  # the lead's weights: online, then target
            set_params(t.params, weights[0])
            set_params(list(t.target.parameters()), weights[1])
            self.version = g.version
        sample, max_weight = None, 0.0
        if g.relayed:
            b = cast("Batch", self.wire.unpack(g.batch_buf(self.n_params), Tag.BATCH, "the lead"))
            records, frames, weights_is = b.records, b.frames, b.weights
        else:  # its shard: weights on the scale of every shard's (the lead's ``scale``)
            assert self.memory is not None
            self.memory.beta = g.beta
            sample = self.memory.sample(g.n)
            records, weights_is, frames = sample.records, sample.weights, sample.frames
            max_weight = self.memory.max_weight()
        if g.scale != 1.0:
            weights_is = weights_is * np.float32(g.scale)
        submits = g.how == SUBMIT
        version_used = self.version if submits else t.updates
        batch = t.put(records, weights_is, frames)
        t_step = time.monotonic()
        loss, td = t.launch(batch).result()
        step_s = time.monotonic() - t_step  # as the lead measures its own: launch and result
        if sample is not None:
            assert self.memory is not None
            self.memory.update(sample.indices, sample.generations, td)
        if not submits:  # an all-reduce step: its weights are the lead's, of this update count
            self.version = t.updates
        grad = self.sync.taken() if isinstance(self.sync, SubmitSync) else None
        spent = time.monotonic() - t0
        compute = step_s - self.sync.wait_s  # the train step, not the wait for the others
        self.end.post(self.wire.grad(g.id, version_used, td, loss, compute, grad, max_weight))
        self.work.append(
            order=g.id,
            version=version_used,
            samples=len(td),
            loss=loss,
            compute_s=spent,
            wait_s=self.sync.wait_s,
        )
        self.served += 1

    def on_checkpoint(self, g: Message) -> None:
        """Write this learner's part (its network and optimizer: the lead's own in allreduce,
        its copy otherwise; its shard) and acknowledge."""
        cid = g.seq
        t = self.trainer
        meta: dict[str, Any] = {
            "served": self.served,
            "version": self.version,
            "updates": t.updates,
        }
        arrays = None
        if self.memory is not None:
            arrays, meta["replay"] = memory_state(self.memory)
        assert self.ckpt is not None
        self.ckpt.write(
            cid,
            meta,
            arrays,
            t.checkpoint_tensors(),
        )
        self.end.post(self.wire.checkpoint(cid, state_crc(t)))  # the lead compares it

    def restore(self, part: Part) -> None:
        """Continue from this learner's part of checkpoint ``part`` (the networks are the
        lead's, broadcast at the start; the optimizer and the shard are this learner's)."""
        t, r = self.trainer, part.meta
        assert part.torch is not None  # a learner's part holds its tensors
        t.opt.load_state_dict(part.torch["optimizer"])
        self.torch.set_rng_state(part.torch["torch_rng"])
        t.updates, self.version, self.served = r["updates"], r["version"], r["served"]
        if self.memory is not None:
            restore_memory(self.memory, part.arrays, r["replay"])

    def on_stop(self, g: Message) -> None:
        self.end.post(self.wire.done(self.served, 0))
        self.stopped = True
