"""The lead learner's side of the learner group (``--learners K``; the protocol and the update
seam: mpirl.transport.group; the messages ORDER, SHARD, GRAD: mpirl.transport.wire).

`NoGroup` (K = 1) does nothing; `LeadGroup` (K > 1) hands the other learners their work (ORDER,
SHARD), takes their replies (GRAD, DONE), applies the global updates of ``async`` / ``gba`` and
logs one /group row per contribution.  ``gba`` hands out work under GBA's token control
(`mpirl.agent.gba.Tokens`: K tokens per global step, on demand, the lead's own batches
included); another learner holds up to `PIPELINE` orders, so it computes its next gradient
while its last one travels and while the lead is busy.  It writes nothing into the learner:
the updates it applies come back from `serve` as `Applied` values, and the batches it hands
out come from the placement's `BatchSource`, which also takes their priorities back.

In ``async`` / ``gba`` (and ``switch`` while in GBA) the parameter server is a thread of the
lead's rank (`mpirl.roles.group_server.ServerThread`, running `LeadGroup._serve_once`): it owns
the master weights and Adam state (``trainer``), the token supply and the aggregator, and
serves the other learners while the lead's loop computes its own batch on a copy (``compute``)
or naps; the loop holds the thread's lock the rest of its turn (`hold`, `let_go`).
docs/design.md, "Where the server runs".
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from mpirl.agent.gba import PIPELINE, Contribution, GlobalBatch, SwitchRule, Tokens
from mpirl.agent.grads import set_grads
from mpirl.roles.group_server import ServerThread
from mpirl.transport.group import SubmitSync, bcast_state, bcast_weights, state_crc
from mpirl.transport.wire import ALLREDUCE, RESYNC, SUBMIT, Tag

if TYPE_CHECKING:
    from collections.abc import Callable

    from mpirl.agent.train_step import TrainStep
    from mpirl.logs.runlog import Stream
    from mpirl.roles.learner_state import LearnerState
    from mpirl.roles.placements.common import BatchSource, Drawn
    from mpirl.run.config import Config
    from mpirl.transport.group import LocalSync
    from mpirl.transport.inbox import Inbox
    from mpirl.transport.link import LinkEnd
    from mpirl.transport.wire import Done, Forward, Grad, Message, Wire

#: the final checkpoint waits for the other learners' parts; after this long it says for whom
AWAIT_NOTICE_S = 10.0


class Applied(NamedTuple):
    """A global update the group applied: its number, loss and the |td| it trained on."""

    update: int
    loss: float
    td: np.ndarray


class Group(Protocol):
    """The learner group as the lead learner sees it."""

    k: int

    @property
    def logs_updates(self) -> bool: ...  # the group logs each update it applies (async, gba)

    @property
    def sync_mode(self) -> int: ...  # 0: synchronous updates now, 1: GBA or async

    @property
    def sync(self) -> LocalSync | None: ...  # read only: NoGroup's None, LeadGroup's step

    def start(self, updates: int) -> None: ...
    def hold(self) -> contextlib.AbstractContextManager[Any]: ...  # the lead's loop holds it
    def let_go(self) -> contextlib.AbstractContextManager[Any]: ...  # its compute and naps
    def compute_step(self, trainer: TrainStep) -> TrainStep: ...  # the lead computes on it
    def halt(self) -> None: ...  # join the server thread (re-raising what ended it)
    def saved(self) -> dict[str, Any]: ...  # what the lead's checkpoint part keeps of it
    def resume(self, meta: dict[str, Any]) -> None: ...  # from the lead's checkpoint part
    def route(self, m: Forward) -> bool: ...
    def ready(self) -> bool: ...
    def before_update(self, state: LearnerState) -> None: ...
    def after_update(self, updates: int, loss: float, td: np.ndarray, compute_s: float) -> None: ...
    def serve(self, now: float, state: LearnerState) -> list[Applied]: ...
    def checkpoint(self, cid: int) -> dict[str, Any]: ...
    def written(self, cid: int) -> bool: ...
    def await_written(self, cid: int, notice: Callable[[str], None]) -> None: ...
    def close(self, timeout: float) -> None: ...


class NoGroup:
    """K = 1: the learner alone; every hook is a no-op."""

    k = 1
    logs_updates = False
    sync_mode = 0
    sync = None

    def start(self, updates: int) -> None:
        pass

    def hold(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def let_go(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def compute_step(self, trainer: TrainStep) -> TrainStep:
        return trainer

    def halt(self) -> None:
        pass

    def saved(self) -> dict[str, Any]:
        return {}

    def resume(self, meta: dict[str, Any]) -> None:
        pass

    def route(self, m: Forward) -> bool:
        return False

    def ready(self) -> bool:
        return True

    def before_update(self, state: LearnerState) -> None:
        pass

    def after_update(self, updates: int, loss: float, td: np.ndarray, compute_s: float) -> None:
        pass

    def serve(self, now: float, state: LearnerState) -> list[Applied]:
        return []

    def checkpoint(self, cid: int) -> dict[str, Any]:
        return {}

    def written(self, cid: int) -> bool:
        return True

    def await_written(self, cid: int, notice: Callable[[str], None]) -> None:
        pass

    def close(self, timeout: float) -> None:
        pass


class OtherLearner:
    """What the lead keeps per other learner of the group (``index``: its rank in it)."""

    def __init__(self, index: int, end: LinkEnd) -> None:
        self.index, self.end = index, end
        #: (id, batch, sent, token) unanswered; token -1: none (allreduce, async)
        self.orders: deque[tuple[int, Drawn, float, int]] = deque()
        self.shard = 0  # transitions sent to its shard (replay at the learner)
        self.version = -2  # weights version it holds (-2: the start's broadcast only)
        self.served = 0
        self.done = False


class LeadGroup:
    """K > 1, on the lead (learner 0)."""

    def __init__(
        self,
        cfg: Config,
        comm: Any,
        ends: dict[int, LinkEnd],
        inbox: Inbox,
        trainer: TrainStep,
        syncs: dict[int, LocalSync],
        wire: Wire,
        rows: Stream,
        switches: Stream,
        compute: TrainStep | None = None,
    ) -> None:
        """``comm``: the learners communicator (its collectives); ``ends``: learner j -> the
        lead's end toward it, ``inbox`` for what they send (`mpirl.wiring.connect`); ``syncs``:
        the lead's way to make an update by ``how`` (ALLREDUCE, SUBMIT); ``rows``, ``switches``:
        the /group and /switches streams.  `attach` hands it the placement's batch source.

        ``compute`` (async, gba, switch): a second train step of the same network, the one the
        lead's own batches are computed on while updates are not synchronous; with it `start`
        runs the parameter server in a thread of its own (``server``, `ServerThread`), which
        owns ``trainer`` (the master weights, Adam and the update count) between the lead's
        turns.  Without it (None) the server runs in `serve`, between the lead's own train
        steps."""
        self.cfg, self.comm, self.trainer, self.syncs = cfg, comm, trainer, syncs
        self.wire, self.rows, self.switches, self.inbox = wire, rows, switches, inbox
        self.k = comm.Get_size()
        self.others = [OtherLearner(j, ends[j]) for j in range(1, self.k)]
        self.handlers: dict[Tag, Callable[[Any], None]] = {
            Tag.GRAD: self._on_grad,
            Tag.DONE: self._on_done,
            Tag.CHECKPOINT: self._on_checkpoint,
        }
        #: checkpoints asked of the other learners and not yet written by all: id -> the
        #: learners still to write their part, and the lead's crc32 their state must have
        #: (None: updates were not synchronous when it was asked)
        self.asked: dict[int, tuple[set[int], int | None]] = {}
        self.n_params = sum(p.numel() for p in trainer.params)
        mode = cfg.learner_sync
        self.how = ALLREDUCE if mode in ("allreduce", "switch") else SUBMIT
        trainer.sync = syncs[self.how]
        self.agg: GlobalBatch | None = None
        self.tokens: Tokens | None = None  # gba's token supply (async: none)
        self.lead_token = -1  # the token of the lead's own batch in flight (-1: none)
        if mode in ("gba", "switch"):
            self.agg = GlobalBatch(
                self.k * cfg.batch_size,
                cfg.max_grad_staleness or None,
                severe=cfg.severe_staleness,
            )
            self.tokens = Tokens(self.k, [1] + [PIPELINE] * (self.k - 1))
        elif mode == "async":
            self.agg = GlobalBatch(cfg.batch_size, None, decay=False)
        #: --learner-sync switch: when to go GBA and back (the figures of a pending switch back)
        self.rule = SwitchRule(self.k, now=time.monotonic()) if mode == "switch" else None
        self.draining: tuple[float, int, float, float] | None = None
        self.source: BatchSource | None = None
        self.next_id = 0
        self.turn = 0  # round-robin position of the next forwarded message (0 = the lead)
        self.stopping = False
        # ---- the server thread (async / gba with ``compute``) ----
        if compute is not None:
            compute.sync = syncs[SUBMIT]  # the lead's own batch: its gradient is kept, not stepped
        self.server = ServerThread(
            compute, self._serve_once, cfg.torch_threads, serving=self.how == SUBMIT
        )
        self.lead_version = 0  # the version the lead's batch in flight is computed on
        self.applied: list[Applied] = []  # applied by the thread, not yet returned by `serve`
        self.state: LearnerState | None = None  # the lead's (its beta and stop reason)

    @property
    def sync(self) -> LocalSync:
        return self.syncs[self.how]

    @property
    def logs_updates(self) -> bool:
        """The group logs each update it applies (GBA, async); all-reduce: the learner does."""
        return self.how == SUBMIT

    @property
    def sync_mode(self) -> int:
        """0: synchronous updates now (all-reduce), 1: GBA or async."""
        return int(self.how == SUBMIT)

    def attach(self, source: BatchSource) -> None:
        self.source = source

    def start(self, updates: int) -> None:
        bcast_weights(self.comm, self.trainer, updates)
        for o in self.others:
            o.version = updates
        self.server.start()

    # ---- the server thread (mpirl.roles.group_server) --------------------------------------------
    def hold(self) -> contextlib.AbstractContextManager[Any]:
        """The lead's loop holds the group's state for the length of the block."""
        return self.server.hold()

    def let_go(self) -> contextlib.AbstractContextManager[Any]:
        """Inside `hold`: the server thread may run for the length of the block."""
        return self.server.let_go()

    def _serve_once(self, now: float) -> bool:
        """One round of the server thread (under its lock): while updates are not synchronous,
        take the replies, apply what is assembled, hand out orders (none while a switch back to
        all-reduce waits for the orders out, which `serve` then makes)."""
        if self.how != SUBMIT or self.state is None or self.agg is None:
            return False
        did = self._receive(self.handlers, now)
        applied = self._apply(now, self.state)
        self.applied += applied
        if self.draining is None:
            did |= self._hand_out(self.state)
        return did or bool(applied)

    def halt(self) -> None:
        """Stop the server thread and join it; from here on `serve` serves in the loop.  Raises
        what ended the thread."""
        self.server.halt()

    def compute_step(self, trainer: TrainStep) -> TrainStep:
        """The train step the lead computes its own batch on: while the server thread runs,
        the compute copy (the thread steps the master weights meanwhile); else ``trainer``."""
        c = self.server.compute
        if c is None or not self.server.running or self.how != SUBMIT:
            return trainer
        return c

    def saved(self) -> dict[str, Any]:
        """For the lead's checkpoint part: the transitions sent to each other learner's shard
        (its shard is in its own part; the lead gates its orders on these counts)."""
        return {"group_shards": {str(o.index): o.shard for o in self.others}}

    def resume(self, meta: dict[str, Any]) -> None:
        """Continue the per-learner shard counts of the lead's checkpoint part: without them a
        resumed lead held every order (allreduce: every update) until each shard had been sent
        its start again, though each learner had restored its shard."""
        shards = meta.get("group_shards", {})
        for o in self.others:
            o.shard = int(shards.get(str(o.index), 0))

    # ---- replay at the learner: shards ----------------------------------------------------------
    def route(self, m: Forward) -> bool:
        """Round-robin over the learners by message: True when it went to another's shard."""
        j, self.turn = self.turn, (self.turn + 1) % self.k
        if j == 0:
            return False
        o = self.others[j - 1]
        assert m.buf is not None
        o.end.post(self.wire.shard(m.buf))
        o.shard += m.n
        return True

    # ---- allreduce: an order to every other learner each update ---------------------------------
    def ready(self) -> bool:
        """allreduce: every other learner can take an order for this update now; none while a
        switch back to all-reduce waits for the GBA orders out."""
        if self.draining is not None:
            return False
        if self.how != ALLREDUCE:  # gba: a token is left for the lead's batch
            return self.tokens is None or self.tokens.can_claim(
                0, self.trainer.updates, self._waiting()
            )
        assert self.source is not None
        return self.source.members_ready([o.shard for o in self.others])

    def before_update(self, state: LearnerState) -> None:
        if self.how == ALLREDUCE:
            for o in self.others:
                self._order(o, state)
        else:
            self.lead_version = self.server.load_compute(self.trainer)
            if self.tokens is not None:  # the lead's batch takes a token (ready() saw one)
                token = self.tokens.claim(0, self.trainer.updates, self._waiting())
                assert token is not None, "before_update without ready()"
                self.lead_token = token

    def after_update(self, updates: int, loss: float, td: np.ndarray, compute_s: float) -> None:
        """The lead's own batch is done (``compute_s``: its compute, not its wait for the
        others): allreduce logs the update; async / gba take the lead's gradient as a
        contribution."""
        if self.rule is not None:
            self.rule.observe(0, compute_s, time.monotonic())
        if self.how == ALLREDUCE:
            self.rows.append(
                update=updates,
                learner=-1,
                staleness=0,
                lag=0,
                samples=self.k * len(td),
                scale=1.0,
                wait_s=self.sync.wait_s,
                dropped=0,
            )
            return
        sync = self.sync
        assert isinstance(sync, SubmitSync)
        token, self.lead_token = self.lead_token, -1
        if self.tokens is not None:
            self.tokens.returned(0)
        now = time.monotonic()
        self._add(0, self.lead_version, sync.taken(), float(loss), td, now, token)

    def _add(
        self,
        learner: int,
        version: int,
        grad: np.ndarray,
        loss: float,
        td: np.ndarray,
        now: float,
        token: int = -1,
    ) -> None:
        assert self.agg is not None
        extra = {"loss": loss, "td": td}
        tok = None if token < 0 else token
        self.agg.add(Contribution(self.next_id, learner, version, len(td), grad, now, extra, tok))
        self.next_id += 1

    # ---- orders ----------------------------------------------------------------------------------
    def _order(self, o: OtherLearner, state: LearnerState) -> bool:
        """Send ``o`` its next batch (relayed) or a sample order for its shard; False when there
        is no batch for it.  Its version is the lead's update count now (the trainer's:
        ``state.updates`` catches up only after `serve` returns the updates it applied, and an
        order labelled with it carried newer weights than its label said)."""
        assert self.source is not None
        step = self.trainer.updates
        tokens = self.tokens if self.how != ALLREDUCE else None
        if tokens is not None and not tokens.can_claim(o.index, step, self._waiting()):
            return False
        drawn = self.source.for_member(o.index, o.shard)
        if drawn is None:
            return False
        token = -1
        if tokens is not None:
            claimed = tokens.claim(o.index, step, self._waiting())
            assert claimed is not None  # can_claim said so
            token = claimed
        weights = None
        if self.how != ALLREDUCE and o.version != step:
            weights = (self.trainer.online.flat_params(), self.trainer.target.flat_params())
            o.version = step
        o.end.post(
            self.wire.order(
                self.next_id,
                self.cfg.batch_size,
                state.beta,
                drawn.scale,
                weights,
                step,
                None if drawn.batch is None else drawn.batch.buf,
                self.how,
            )
        )
        o.orders.append((self.next_id, drawn, time.monotonic(), token))
        self.next_id += 1
        return True

    def _hand_out(self, state: LearnerState) -> bool:
        """async / gba: up to `PIPELINE` orders per other learner, a first one to every learner
        holding none before a second to any (gba: each takes a token, `Tokens`)."""
        did = False
        if self.stopping or state.stop_reason is not None:
            return False
        for depth in range(1, PIPELINE + 1):
            for o in self.others:
                if len(o.orders) < depth and not o.done:
                    did |= self._order(o, state)
        return did

    # ---- replies ---------------------------------------------------------------------------------
    def serve(self, now: float, state: LearnerState) -> list[Applied]:
        """Take the other learners' replies, apply what is assembled, hand out orders; with
        --learner-sync switch, switch when the rule says so.  While the server thread runs
        and updates are not synchronous, the thread does the first three: this returns the
        updates it applied since."""
        self.server.check()
        self.state = state
        if not self.server.running or self.how != SUBMIT:
            self._receive(self.handlers, now)
            if self.how == SUBMIT and self.agg is not None:
                self.applied += self._apply(now, state)
                if self.draining is None:
                    self._hand_out(state)
        applied, self.applied = self.applied, []
        if self.rule is not None:
            self._switch(now, state)
        return applied

    # ---- --learner-sync switch -------------------------------------------------------------------
    def _switch(self, now: float, state: LearnerState) -> None:
        """To GBA at once (every learner holds the lead's weights after an all-reduce update);
        back to all-reduce once no GBA order is out: the gradients not yet applied are dropped
        (logged), and every learner takes the lead's networks and Adam state."""
        assert self.rule is not None
        if self.draining is None:
            figures = self.rule.decide(self.how == ALLREDUCE, now)
            if figures is None:
                return
            if self.how == ALLREDUCE:
                self.how, self.trainer.sync = SUBMIT, self.syncs[SUBMIT]
                self.server.serving.set()
                for o in self.others:
                    o.version = state.updates
                if self.tokens is not None:  # no GBA order is out: a fresh supply
                    self.tokens.reset()
                self.server.compute_version = -1  # the lead computes on the master's copy
                self._log_switch(state.updates, 1, figures)
                return
            self.draining = figures
        if any(o.orders for o in self.others) or state.stop_reason is not None:
            return
        assert self.agg is not None
        for c in self.agg.drain():
            self.rows.append(
                update=state.updates, learner=c.learner, staleness=c.staleness(state.updates),
                lag=state.updates - c.version, samples=c.n, scale=0.0, wait_s=now - c.arrived,
                dropped=1,
            )  # fmt: skip
        for o in self.others:
            o.end.post(self.wire.order(self.next_id, 0, state.beta, how=RESYNC))
            self.next_id += 1
        bcast_state(self.comm, self.trainer, self.trainer.updates)
        self.how, self.trainer.sync = ALLREDUCE, self.syncs[ALLREDUCE]
        self.server.serving.clear()
        self._log_switch(state.updates, 0, self.draining)
        self.draining = None

    def _log_switch(self, update: int, to_gba: int, f: tuple[float, int, float, float]) -> None:
        self.switches.append(
            update=update, to_gba=to_gba, ratio=f[0], slowest=f[1], slowest_s=f[2], others_s=f[3]
        )

    def _receive(self, handlers: dict[Tag, Any], now: float) -> bool:
        """Every other learner's messages, each to its handler (`mpirl.transport.inbox`)."""
        did = False
        for o in self.others:
            o.end.poll(now)
            msgs = o.end.receive(now)
            did |= bool(msgs)
            self.inbox.deliver(handlers, msgs, o.index, now)
        return did

    def _on_done(self, m: Done) -> None:
        self.others[m.rank - 1].done = True

    def _on_grad(self, m: Grad) -> None:
        o = self.others[m.rank - 1]
        want, drawn, _, token = o.orders.popleft()
        if m.id != want:
            raise RuntimeError(f"learner: learner {o.index} answered order {m.id}, expected {want}")
        if token >= 0 and self.tokens is not None:
            self.tokens.returned(o.index)
        o.served += 1
        if self.rule is not None:
            self.rule.observe(o.index, m.compute_s, m.t)
        td = m.td_abs
        drawn.max_weight = m.max_weight  # its shard's, for a batch it sampled
        assert self.source is not None
        self.source.trained(drawn, td, m.compute_s, self.trainer.updates)
        grad = m.grad()
        if grad is not None:
            self._add(o.index, m.version, grad, m.loss, td, m.t, token)

    def _apply(self, now: float, state: LearnerState) -> list[Applied]:
        """async / gba: every assembled global batch becomes one update."""
        t, out = self.trainer, []
        most = self.cfg.max_updates
        assert self.agg is not None
        while not (most and t.updates >= most) and (
            taken := self.agg.take(t.updates, self._ahead(t.updates))
        ):
            version = t.updates
            set_grads(t.params, taken.grad)
            t.apply_step()
            first = min(c.arrived for c in taken.used)
            for c, w, s in zip(taken.used, taken.scales, taken.staleness, strict=True):
                self.rows.append(
                    update=t.updates,
                    learner=c.learner,
                    staleness=s,
                    lag=version - c.version,
                    samples=c.n,
                    scale=w,
                    wait_s=now - first,
                    dropped=0,
                )
            for c, s in taken.dropped:
                self.rows.append(
                    update=t.updates,
                    learner=c.learner,
                    staleness=s,
                    lag=version - c.version,
                    samples=c.n,
                    scale=0.0,
                    wait_s=now - c.arrived,
                    dropped=1,
                )
            loss = float(np.mean([c.extra["loss"] for c in taken.used]))
            out.append(
                Applied(t.updates, loss, np.concatenate([c.extra["td"] for c in taken.used]))
            )
        return out

    def _waiting(self) -> int:
        """Gradients in but not applied yet (the token supply counts them)."""
        return 0 if self.agg is None else len(self.agg.waiting)

    def _ahead(self, step: int) -> bool:
        """Whether gradients meant for the next step may fill this one: async (no tokens), or
        every token of this step and the next is out, so no learner can take one until an
        update is made (waiting for this step's last ones would tie everyone to the slowest)."""
        return self.tokens is None or self.tokens.blocked(step, self._waiting())

    # ---- checkpoints -----------------------------------------------------------------------------
    def checkpoint(self, cid: int) -> dict[str, Any]:
        """Ask every other learner for its part of checkpoint ``cid`` and return at once.

        Each writes its part when it reaches the request, after the order it is on: its link
        delivers SHARD, ORDER and CHECKPOINT in the order they were posted, so its part holds
        exactly what the lead had sent it by now, whenever it gets there.  Its acknowledgement
        (`_on_checkpoint`) comes with the replies `serve` takes; `written` says when every part
        is in.  While updates are synchronous every learner must hold the lead's network and
        Adam state as of now: each acknowledgement carries its crc32, checked against the
        lead's, taken here.  Returns what the lead's own part keeps of the group: the
        transitions sent to each other learner's shard (`resume`)."""
        for o in self.others:
            o.end.post(self.wire.checkpoint(cid))
        mine = state_crc(self.trainer) if self.how == ALLREDUCE and self.draining is None else None
        self.asked[cid] = ({o.index for o in self.others}, mine)
        return self.saved()

    def _on_checkpoint(self, m: Message) -> None:
        """Learner ``m.rank`` wrote its part of checkpoint ``m.seq`` (``m.a``: its crc32)."""
        asked = self.asked.get(m.seq)
        if asked is None or m.rank not in asked[0]:
            raise RuntimeError(f"learner: unexpected CHECKPOINT {m.seq} from learner {m.rank}")
        waiting, mine = asked
        if mine is not None and int(m.a) != mine:
            raise RuntimeError(
                f"learner {m.rank} holds another network or Adam state than the lead after "
                f"synchronous updates (checkpoint {m.seq}): the learner group diverged"
            )
        waiting.discard(m.rank)
        if not waiting:
            del self.asked[m.seq]

    def written(self, cid: int) -> bool:
        """Every other learner has written its part of checkpoint ``cid``."""
        return cid not in self.asked

    def await_written(self, cid: int, notice: Callable[[str], None]) -> None:
        """Serve the replies until every other learner's part of checkpoint ``cid`` is written:
        the final checkpoint, which the run waits for.  No time limit: a slow learner only
        delays the end, and one that died ends the job (`mpirl.run.failure`); ``notice`` says
        once, after ``AWAIT_NOTICE_S``, which learners it waits for."""
        self.halt()
        handlers = {Tag.CHECKPOINT: self._on_checkpoint, Tag.GRAD: self._on_grad}
        t0, told = time.monotonic(), False
        while not self.written(cid):
            now = time.monotonic()
            if not told and now - t0 > AWAIT_NOTICE_S:
                notice(
                    f"mpirl: checkpoint {cid} waits for learner(s) "
                    f"{sorted(self.asked[cid][0])} to write their part"
                )
                told = True
            self._receive(handlers, now)
            time.sleep(2e-4)

    def close(self, timeout: float) -> None:
        """STOP to every other learner (after the final checkpoint; it answers its orders
        first), then wait for each one's DONE; the server thread is joined first."""
        self.halt()
        self.stopping = True
        for o in self.others:
            o.end.post(self.wire.stop())
        self._await(Tag.DONE, None, timeout, "finish")
        for o in self.others:
            o.done = True
            o.end.flush_blocking()

    def _await(self, kind: Tag, id_: int | None, timeout: float, what: str) -> dict[int, int]:
        """Serve the replies until each other learner has sent ``kind`` (with id ``id_``);
        RuntimeError after ``timeout`` s.  Returns each one's header ``a``."""
        waiting = {o.index for o in self.others}
        got: dict[int, int] = {}

        def arrived(m: Message) -> None:
            if id_ is None or m.seq == id_:
                waiting.discard(m.rank)
                got[m.rank] = int(m.a)
            else:
                raise RuntimeError(
                    f"learner: learner {m.rank} sent {kind.name} {m.seq} while it was to {what}"
                )

        end = time.monotonic() + timeout
        while waiting:
            now = time.monotonic()
            if now > end:
                raise RuntimeError(
                    f"learner(s) {sorted(waiting)} did not {what} within {timeout:.0f} s"
                )
            self._receive(
                {Tag.CHECKPOINT: self._on_checkpoint, kind: arrived, Tag.GRAD: self._on_grad}, now
            )
            time.sleep(2e-4)
        return got
