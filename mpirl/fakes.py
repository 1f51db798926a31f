"""Fakes of the transport, handed to the roles as arguments (never patched in), and builders of
roles wired to them: what `mpirl.wiring` builds for a real run, without MPI peers.

The tests and the benches import them from here (``from mpirl.fakes import ...``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from mpi4py import MPI

from mpirl.agent.envs import inspect
from mpirl.replay.build import make_replay, record_dtype
from mpirl.roles.actor import Actor
from mpirl.transport.inbox import Inbox, SitePort
from mpirl.transport.link import PROFILES, LinkStats
from mpirl.transport.topology import Ends, layout
from mpirl.transport.wire import Tag, kind_of
from mpirl.wiring import build_buffer, build_learner, make_wire

if TYPE_CHECKING:
    from mpirl.agent.envs import EnvSpec
    from mpirl.logs.runlog import RunLog
    from mpirl.roles.buffer import Buffer
    from mpirl.roles.learner import Learner
    from mpirl.run.config import Config
    from mpirl.transport.link import LinkProfile
    from mpirl.transport.topology import Topology
    from mpirl.transport.wire import Wire


def batch_messages(cfg: Config, spec: EnvSpec, wire: Wire, count: int, size: int) -> list:
    """``count`` BATCH messages as the learner receives them from a buffer: CartPole-like
    transitions (reward 1, a terminal about every 20th) in a seeded prioritized memory of
    ``size``, each a prioritized sample of ``cfg.batch_size`` packed by `Wire.batch`; the same
    messages on every call (the learner benches, tests/group_scripted.py)."""
    rng = np.random.default_rng(0)
    rec = np.zeros(size, wire.record)
    rec["obs"] = rng.normal(0, 0.5, rec["obs"].shape)
    rec["next_obs"] = rec["obs"] + rng.normal(0, 0.05, rec["obs"].shape)
    rec["action"] = rng.integers(0, spec.n_actions, size)
    rec["reward"] = 1.0
    rec["discount"] = np.where(rng.random(size) < 0.05, 0.0, cfg.gamma**cfg.n_step)
    memory = make_replay(cfg, spec, wire.record, seed=0)
    memory.add(rec, rng.random(size).astype(np.float32))
    return [wire.batch(memory.sample(cfg.batch_size), i, 0.0) for i in range(count)]


class ScriptedLink:
    """A `mpirl.transport.link.LinkEnd` toward ``peer`` with no MPI behind it.

    Every post is counted in ``sent`` and, with a ``log`` list, recorded there as ``(peer,
    Tag)``; ``script(link, tag)``, if given, runs on every post (it may queue replies in
    ``inbox``).  ``receive`` hands over what ``inbox`` holds, or with ``feed`` what ``feed()``
    returns on every call (a buffer that always has the next message ready).  Latest-wins posts
    go at once (a link that never backs up)."""

    latest_rate_bps, latest_replaced = float("nan"), 0

    def __init__(
        self,
        peer: int,
        script: Callable | None = None,
        inbox: Any = (),  # (tag, buf) pairs
        log: list | None = None,
        feed: Callable[[], list] | None = None,
    ) -> None:
        self.peer, self.script, self.inbox = peer, script, list(inbox)
        self.log, self.feed = log, feed
        self.sent, self.received = LinkStats(), LinkStats()
        self.profile, self.backlog = PROFILES["none"], 0

    def post(self, buf: np.ndarray, tag: int | None = None, now: float | None = None) -> float:
        tag = kind_of(buf) if tag is None else tag
        if self.log is not None:
            self.log.append((self.peer, Tag(tag)))
        self.sent.count(buf.nbytes)
        if self.script is not None:
            self.script(self, Tag(tag))
        return 0.0

    def post_latest(
        self, tag: int, make: Callable[[], tuple[np.ndarray, Any]], now: float | None = None
    ) -> bool:
        buf, on_commit = make()
        if on_commit is not None:
            on_commit()
        self.post(buf, tag, now)
        return True

    def drop_latest(self) -> None:
        pass

    def receive(self, now: float | None = None, limit: int = 64) -> list:
        if self.feed is not None:
            out = self.feed()
        else:
            out, self.inbox = self.inbox, []
        for _, buf in out:
            self.received.count(buf.nbytes)
        return out

    def poll(self, now: float | None = None) -> None:
        pass

    def next_departure(self) -> None:
        return None

    def set_profile(self, profile: LinkProfile) -> None:
        self.profile = profile


class RecordingPort(SitePort):
    """A `mpirl.transport.inbox.SitePort` on a one-rank site whose posts are recorded in ``posts``
    as ``(Tag, buffer, dest)`` instead of sent."""

    def __init__(self, wire: Wire, me: str = "test rank") -> None:
        super().__init__(MPI.COMM_SELF, Inbox(wire, me, lambda r: f"site rank {r}", MPI.COMM_SELF))
        self.posts: list = []

    def post(self, buf: np.ndarray, dest: int, tag: int | None = None) -> None:
        self.posts.append((kind_of(buf) if tag is None else Tag(tag), buf, dest))


def learner_ends(wire: Wire, links: dict) -> Ends:
    """The lead learner's ends with ``links`` (link rank -> fake) in place of the buffers."""
    return Ends(links=links, inbox=Inbox(wire, "learner", lambda b: f"buffer {b - 1}"))


def learner_topo(buffers: int) -> SimpleNamespace:
    """A topology for a learner built without mpirun (one actor per site)."""
    return SimpleNamespace(link=None, learners=None, places=layout(1 + 2 * buffers, buffers))


def buffer_ends(wire: Wire, link: Any, site: SitePort | None = None) -> Ends:
    """A buffer's ends: ``link`` toward the learner, ``site`` (default: a one-rank site with no
    actors, on COMM_SELF)."""
    site = site or SitePort(
        MPI.COMM_SELF, Inbox(wire, "buffer 0", lambda r: f"actor {r}", MPI.COMM_SELF)
    )
    return Ends(site=site, links={0: link}, inbox=Inbox(wire, "buffer 0", lambda r: "the learner"))


def wire_of(
    cfg: Config, spec: EnvSpec | None = None, role: str | None = None
) -> tuple[EnvSpec, Wire]:
    """``(spec, wire)``: the env spec of ``cfg`` (inspected when not given) and the
    `mpirl.transport.wire.Wire` a rank of a run of ``cfg`` packs and unpacks with (``role``: that
    rank's role), as `mpirl.main` builds them."""
    if spec is None:
        spec = inspect(cfg.env, cfg.env_kwargs, cfg.wrapper_specs())
    return spec, make_wire(cfg, spec, record_dtype(cfg, spec), role)


def make_learner(
    cfg: Config, spec: EnvSpec, wire: Wire, log: RunLog, links: dict, **kw: Any
) -> Learner:
    """A `mpirl.roles.learner.Learner` whose buffers are ``links`` (link rank -> `ScriptedLink`)."""
    return build_learner(
        cfg,
        learner_topo(len(links)),
        spec,
        wire,
        log,
        learner_ends(wire, links),
        say=kw.pop("say", lambda s: None),
        **kw,
    )


def make_buffer(
    cfg: Config, spec: EnvSpec, wire: Wire, log: RunLog, link: Any = None, **kw: Any
) -> Buffer:
    """A `mpirl.roles.buffer.Buffer` (site 0) facing ``link`` (default: a silent `ScriptedLink`) on
    a one-rank site with no actors."""
    topo = SimpleNamespace(place=layout(3, 1)[1])
    return build_buffer(
        cfg, topo, spec, wire, log, buffer_ends(wire, link or ScriptedLink(0)), **kw
    )


def make_actor(
    cfg: Config, spec: EnvSpec, wire: Wire, log: RunLog, **kw: Any
) -> tuple[Actor, RecordingPort]:
    """``(actor, port)``: a `mpirl.roles.actor.Actor` (the only one of site 0) whose messages to the
    buffer are recorded in ``port.posts``."""
    port = RecordingPort(wire, "actor rank 2")
    # a bare topology: what an actor reads of one
    topo = cast("Topology", SimpleNamespace(place=layout(3, 1)[2], n_actors=1))
    return Actor(cfg, topo, spec, wire, log, port, **kw), port
