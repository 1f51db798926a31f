"""The consistent cut: how a checkpoint is taken across ranks while messages are in flight.

The learner coordinates (`Cut`), each buffer relays to its actors (`SiteCut`), each actor writes
its part between two env steps and acknowledges:

1. **request**: the learner posts CHECKPOINT(id) to every buffer; a buffer forwards it to every
   actor of its site.
2. **ack**: an actor writes its part and answers CHECKPOINT(id, env steps).  From then on the
   buffer takes nothing more from that actor (its later messages wait, queued in MPI); when every
   actor has acknowledged, the buffer holds exactly what they sent before their snapshots: it
   writes its part, acknowledges to the learner and releases them.
3. **park**: the learner likewise stops receiving from a buffer once that buffer has
   acknowledged; messages it had already received behind the ack are parked, in order.
4. **write, manifest**: when every buffer has acknowledged, the learner writes its part and then
   the manifest, last (`mpirl.run.checkpoint.Checkpointer`), and handles the parked messages first.
   With a learner group the manifest waits, without holding the lead, until every other learner
   has written its part (`mpirl.roles.learner_parts.LearnerCheckpoint.commit`).

So every env step and every transition is in exactly one part.  A stop waits for a checkpoint in
progress; STOP then carries the id of a final checkpoint that every rank writes before its DONE
(`Cut.final_id`), and the learner writes its part and the manifest after the last DONE.  The
guarantees and their tests: docs/reliability.md.

This module holds the protocol's state; the roles call it where it matters and do the sending
(they own the links) and the writing (they own what is saved).  Pure Python, no MPI.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol


class Numbering(Protocol):
    """Where checkpoint ids come from (`mpirl.run.checkpoint.Checkpointer`)."""

    def next_id(self) -> int: ...


class Cut:
    """The learner's side: when a checkpoint starts, which buffers have acknowledged, what waits.

    ``sites`` are the buffers' link ranks; ``every_s`` the periodic cadence (0: only the final
    checkpoint); ``checkpointer`` None turns checkpoints off (``final_id`` is then -1)."""

    def __init__(
        self,
        checkpointer: Numbering | None,
        sites: Iterable[int],
        every_s: float,
        timeout_s: float,
        t_start: float,
    ) -> None:
        self.on = checkpointer is not None
        self.sites = list(sites)
        self.every_s = every_s if self.on else 0
        self.timeout_s = timeout_s
        self.next_id = checkpointer.next_id() if checkpointer is not None else 1
        self.id = -1  # the checkpoint in progress, -1 when none
        self.t0 = 0.0  # its start
        self.t_last = t_start  # the end of the last one
        self.acked: dict[int, int] = {}  # site -> its env steps at its snapshot
        self.parked: dict[int, deque[Any]] = {
            s: deque() for s in self.sites
        }  # a site's messages after its ack

    @property
    def in_progress(self) -> bool:
        return self.id >= 0

    def due(self, now: float, stopping: bool) -> bool:
        """A periodic checkpoint should start now."""
        return (
            bool(self.every_s)
            and not self.in_progress
            and not stopping
            and now - self.t_last >= self.every_s
        )

    def begin(self, now: float) -> int:
        """Start checkpoint ``next_id``; the caller posts CHECKPOINT(id) to every site."""
        self.id, self.next_id, self.t0 = self.next_id, self.next_id + 1, now
        return self.id

    def acknowledge(self, site: int, seq: int, env_steps: int) -> bool:
        """A site's CHECKPOINT(seq) answer; False if it is not the one in progress."""
        if not self.in_progress or seq != self.id:
            return False
        self.acked[site] = env_steps
        return True

    def holds(self, site: int) -> bool:
        """The site has acknowledged: what it sends after waits for the learner's part."""
        return site in self.acked

    def park(self, site: int, messages: Iterable[Any]) -> None:
        self.parked[site].extend(messages)

    def unpark(self, site: int) -> list[Any]:
        """The site's parked messages, oldest first (they go before anything newer)."""
        out = list(self.parked[site])
        self.parked[site].clear()
        return out

    @property
    def complete(self) -> bool:
        """Every site's part (and its actors') is on disk: the learner's part and the manifest
        may be written."""
        return self.in_progress and len(self.acked) == len(self.sites)

    def end(self, now: float) -> None:
        self.id, self.t_last = -1, now
        self.acked.clear()

    def overdue(self, now: float) -> str | None:
        """The error when a site has not acknowledged within ``timeout_s``, else None."""
        if not self.in_progress or now - self.t0 <= self.timeout_s:
            return None
        missing = sorted(s - 1 for s in set(self.sites) - set(self.acked))
        return (
            f"checkpoint {self.id}: no acknowledgement from buffer(s) {missing} after "
            f"{self.timeout_s:.0f} s"
        )

    def final_id(self) -> int:
        """The id STOP carries: the final checkpoint every rank writes before DONE (-1: none)."""
        return self.next_id if self.on else -1


class SiteCut:
    """A buffer's side: the checkpoint it relays and which of its actors have acknowledged."""

    def __init__(self, actors: Iterable[int]) -> None:
        self.actors = list(actors)
        self.id = -1  # the checkpoint in progress
        self.held: set[int] = set()  # actors that acknowledged: their later messages wait

    @property
    def in_progress(self) -> bool:
        return self.id >= 0

    def begin(self, cid: int) -> None:
        """CHECKPOINT(cid) from the learner; the caller forwards it to every actor."""
        self.id = cid

    def acknowledge(self, actor: int, seq: int) -> bool:
        if not self.in_progress or seq != self.id:
            return False
        self.held.add(actor)
        return True

    def holds(self, actor: int) -> bool:
        return actor in self.held

    @property
    def complete(self) -> bool:
        """Every actor's messages before its snapshot are in: write, acknowledge, release."""
        return self.in_progress and len(self.held) == len(self.actors)

    def end(self) -> None:
        self.id = -1
        self.held.clear()
