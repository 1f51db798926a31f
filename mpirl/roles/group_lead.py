"""The lead learner's side of the learner group (see mpirl.roles.learner_group for the protocol).

`Solo` (K = 1) does nothing and keeps `mpirl.roles.learner.Learner` as it is; `LeadGroup` (K > 1)
hands the other learners their work (ORDER, SHARD), takes their replies (GRAD, DONE), applies
the global updates of ``async`` / ``gba`` and logs one /group row per contribution.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from mpirl.agent.gba import Contribution, GlobalBatch
from mpirl.roles.learner_group import (
    GroupMessage,
    GTag,
    LocalSync,
    SubmitSync,
    bcast_weights,
    floats,
    make_sync,
    pack,
    set_grads,
)
from mpirl.transport.link import LinkEnd

if TYPE_CHECKING:
    from mpirl.transport.inbox import Inbox
    from mpirl.transport.topology import Ends


class Solo:
    """K = 1: the learner alone; every hook is a no-op."""

    logs_updates = False
    k = 1

    def __init__(self, lead):
        self.sync = make_sync(lead.cfg, None, 0, lead.trainer.device)
        self.learning_starts = lead.cfg.learning_starts

    def start(self) -> None:
        pass

    def insert(self, records, td_abs, frames, buf) -> bool:
        return False

    def ready(self) -> bool:
        return True

    def before_update(self) -> None:
        pass

    def after_update(self, loss: float, td: np.ndarray) -> None:
        pass

    def serve(self, now: float) -> bool:
        return False

    def checkpoint(self, cid: int, timeout: float) -> None:
        pass

    def close(self, timeout: float) -> None:
        pass


class Member:
    """What the lead keeps per other learner (``index`` = its rank in ``learners``)."""

    def __init__(self, index: int, end: LinkEnd):
        self.index, self.end = index, end
        self.orders: deque = deque()  # (order id, source, sent time) not yet answered
        self.shard = 0  # transitions sent to its shard (replay_at=learner)
        self.version = -2  # weights version it holds (-2: the start's broadcast only)
        self.served = 0
        self.done = False


class LeadGroup(Solo):
    """K > 1, on the lead (learner 0)."""

    def __init__(self, lead, comm, ends: dict[int, LinkEnd], inbox: Inbox):
        """``comm``: the learners communicator (its collectives); ``ends``: learner j -> the
        lead's end toward it, ``inbox`` for what they send (`mpirl.main.connect`)."""
        cfg = lead.cfg
        self.lead, self.cfg, self.comm, self.mode = lead, cfg, comm, cfg.learner_sync
        self.k = comm.Get_size()
        self.members = [Member(j, ends[j]) for j in range(1, self.k)]
        self.inbox = inbox
        self.handlers = {GTag.GRAD: self._on_grad, GTag.DONE: self._on_done}
        self.n_params = sum(p.numel() for p in lead.trainer.params)
        self.sync = make_sync(cfg, comm, self.n_params, lead.trainer.device)
        self.learning_starts = math.ceil(cfg.learning_starts / self.k)
        self.logs_updates = self.mode != "allreduce"
        self.agg = None
        if self.mode == "gba":
            self.agg = GlobalBatch(self.k * cfg.batch_size, cfg.max_grad_staleness or None)
        elif self.mode == "async":
            self.agg = GlobalBatch(cfg.batch_size, None, decay=False)
        self.next_id = 0
        self.turn = 0  # round-robin position of the next forwarded message (0 = the lead)
        self.stopping = False

    def start(self) -> None:
        bcast_weights(self.comm, self.lead.trainer)
        for m in self.members:
            m.version = self.lead.updates

    # ---- replay_at=learner: shards --------------------------------------------------------------
    def insert(self, records, td_abs, frames, buf) -> bool:
        """Round-robin over the learners by message: True when it went to another's shard."""
        j, self.turn = self.turn, (self.turn + 1) % self.k
        if j == 0:
            return False
        m = self.members[j - 1]
        m.end.post(pack(GTag.SHARD, [buf]), GTag.SHARD)
        m.shard += len(records)
        return True

    # ---- allreduce: an order to every member each update -----------------------------------------
    def ready(self) -> bool:
        """allreduce: every member can take an order for this update now."""
        if self.mode != "allreduce":
            return True
        lead = self.lead
        if lead.at_learner:
            return all(m.shard >= self.learning_starts for m in self.members)
        return sum(len(s.ready) for s in lead.sites.values()) >= len(self.members)

    def before_update(self) -> None:
        if self.mode == "allreduce":
            for m in self.members:
                self._order(m)

    def after_update(self, loss: float, td: np.ndarray) -> None:
        """The lead's own batch is done: allreduce logs the update; async / gba take the
        lead's gradient as a contribution."""
        now = time.monotonic()
        lead = self.lead
        if self.mode == "allreduce":
            lead.logs["group"].append(
                update=lead.updates,
                learner=-1,
                staleness=0,
                samples=self.k * len(td),
                scale=1.0,
                wait_s=self.sync.wait_s,
                dropped=0,
            )
            return
        self._add(0, lead.trainer.updates, self.sync.taken(), float(loss), td, now)

    def _add(self, learner, version, grad, loss, td, now) -> None:
        self.agg.add(
            Contribution(
                self.next_id, learner, version, len(td), grad, now, {"loss": loss, "td": td}
            )
        )
        self.next_id += 1

    # ---- orders ----------------------------------------------------------------------------------
    def _order(self, m: Member) -> bool:
        """Send ``m`` its next batch (relayed) or a sample order for its shard; False when there
        is no batch for it."""
        lead, cfg = self.lead, self.cfg
        src, scale, body_ = None, 1.0, []
        if not lead.at_learner:
            got = lead.take_site_batch()
            if got is None:
                return False
            src, scale, raw = got
        else:
            lead.sampled += cfg.batch_size
        version = -1
        if self.mode != "allreduce" and m.version != lead.updates:
            version = lead.updates
            body_ = [lead.trainer.online.flat_params(), lead.trainer.target.flat_params()]
            m.version = version
        if src is not None:
            body_.append(raw)
        m.end.post(
            pack(
                GTag.ORDER,
                body_,
                self.next_id,
                version,
                cfg.batch_size,
                lead.beta,
                scale,
                float(src is not None),
            ),
            GTag.ORDER,
        )
        m.orders.append((self.next_id, src, time.monotonic()))
        self.next_id += 1
        return True

    def _hand_out(self) -> bool:
        """async / gba token control: one order at a time per member."""
        lead, did = self.lead, False
        if self.stopping or lead.stop_reason is not None:
            return False
        for m in self.members:
            if m.orders or m.done:
                continue
            if lead.at_learner and (m.shard < self.learning_starts or not lead.may_sample()):
                continue
            did |= self._order(m)
        return did

    # ---- replies ---------------------------------------------------------------------------------
    def serve(self, now: float) -> bool:
        """Take the members' replies, apply what is assembled, hand out orders."""
        did = self._receive(self.handlers, now)
        if self.agg is not None:
            did |= self._apply(now)
            did |= self._hand_out()
        return did

    def _receive(self, handlers: dict, now: float) -> bool:
        """Every member's messages, each to its handler (`mpirl.transport.inbox`)."""
        did = False
        for m in self.members:
            m.end.poll(now)
            msgs = m.end.receive(now)
            did |= bool(msgs)
            self.inbox.deliver(handlers, msgs, m.index, now)
        return did

    def _on_done(self, g: GroupMessage) -> None:
        self.members[g.rank - 1].done = True

    def _on_grad(self, g: GroupMessage) -> None:
        m = self.members[g.rank - 1]
        want, src, _ = m.orders.popleft()
        if g.id != want:
            raise RuntimeError(f"learner: learner {m.index} answered order {g.id}, expected {want}")
        m.served += 1
        raw, grad = g.body, None
        if g.has_grad:
            grad = floats(raw, self.n_params)
            raw = raw[4 * self.n_params :]
        td = floats(raw, g.n)
        lead = self.lead
        if src is not None and not src[0].done:  # replay_at=buffer: priorities to its buffer
            lead.post_priorities(src, td, g.compute_s)
        if grad is not None:
            self._add(m.index, g.version, grad, g.loss, td, g.t)

    def _apply(self, now: float) -> bool:
        """async / gba: every assembled global batch becomes one update."""
        lead, t, did = self.lead, self.lead.trainer, False
        most = self.cfg.max_updates
        while not (most and t.updates >= most) and (taken := self.agg.take(t.updates)):
            set_grads(t.params, taken.grad)
            t.apply_step()
            lead.updates = t.updates
            first = min(c.arrived for c in taken.used)
            for c, w, s in zip(taken.used, taken.scales, taken.staleness, strict=True):
                lead.logs["group"].append(
                    update=t.updates,
                    learner=c.learner,
                    staleness=s,
                    samples=c.n,
                    scale=w,
                    wait_s=now - first,
                    dropped=0,
                )
            for c, s in taken.dropped:
                lead.logs["group"].append(
                    update=t.updates,
                    learner=c.learner,
                    staleness=s,
                    samples=c.n,
                    scale=0.0,
                    wait_s=now - c.arrived,
                    dropped=1,
                )
            loss = float(np.mean([c.extra["loss"] for c in taken.used]))
            lead.rows.update(
                t.updates, loss, np.concatenate([c.extra["td"] for c in taken.used]), lead.beta
            )
            lead.loss_sum += loss
            lead.loss_n += 1
            lead.applied()
            did = True
        return did

    def checkpoint(self, cid: int, timeout: float) -> None:
        """Every member writes its part of checkpoint ``cid`` (before the lead's manifest)."""
        for m in self.members:
            m.end.post(pack(GTag.CKPT, id_=cid), GTag.CKPT)
        self._await(GTag.CKPT, cid, timeout, f"write their part of checkpoint {cid}")

    def close(self, timeout: float) -> None:
        """STOP to every member (after the final checkpoint; it answers its orders first), then
        wait for each one's DONE."""
        self.stopping = True
        for m in self.members:
            m.end.post(pack(GTag.STOP), GTag.STOP)
        self._await(GTag.DONE, None, timeout, "finish")
        for m in self.members:
            m.done = True
            m.end.flush_blocking()

    def _await(self, kind: GTag, id_: int | None, timeout: float, what: str) -> None:
        """Serve the members' replies until each has sent ``kind`` (with header id ``id_``);
        RuntimeError after ``timeout`` s."""
        waiting = {m.index for m in self.members}

        def arrived(g: GroupMessage) -> None:
            if id_ is None or g.id == id_:
                waiting.discard(g.rank)
            else:
                raise RuntimeError(
                    f"learner: learner {g.rank} sent {kind.name} {g.id} while it was to {what}"
                )

        end = time.monotonic() + timeout
        while waiting:
            now = time.monotonic()
            if now > end:
                raise RuntimeError(
                    f"learner(s) {sorted(waiting)} did not {what} within {timeout:.0f} s"
                )
            self._receive({kind: arrived, GTag.GRAD: self._on_grad}, now)
            time.sleep(2e-4)


def make_group(lead, ends: Ends) -> Solo:
    comm = getattr(lead.topo, "learners", None)
    if comm is None or comm.Get_size() == 1:
        return Solo(lead)
    return LeadGroup(lead, comm, ends.group, ends.group_inbox)


__all__ = ["LeadGroup", "LocalSync", "Member", "Solo", "SubmitSync", "make_group"]
