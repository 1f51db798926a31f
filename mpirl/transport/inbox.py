"""The one receive loop: matched probe, receive, unpack, the handler of the message's kind.

Every message a role takes comes through here, either straight off MPI (`Inbox.serve`: the site
network, no emulation) or from a link end that has held it for the emulated latency
(`Inbox.deliver`; `mpirl.transport.link.LinkEnd.receive` takes it off MPI with `take`)::

    Improbe(source, ANY_TAG) -> Recv into a buffer of the probed size -> unpack(buf, tag)
        -> handlers[m.kind](m)      (no handler for the kind: RuntimeError naming it and the
                                     sender; a malformed message: mpirl.transport.wire.WireError)

A handler gets one argument, the message's view (`mpirl.transport.wire.VIEWS`), which carries the
sender's rank (``m.rank``), the time it was handed over (``m.t``) and the buffer as received
(``m.buf``).  Nothing here blocks: a rank with nothing to do naps (`mpirl.transport.waiting`), it
never spins in MPI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from mpirl.transport.wire import Tag, kind_of

if TYPE_CHECKING:
    from mpirl.transport.wire import Message, Wire

#: a role's handler of each kind it takes; a handler gets the kind's view (`Message` subclass)
Handlers = Mapping[Tag, Callable[[Any], object]]


def take(
    comm: MPI.Comm,
    source: int,
    status: MPI.Status,
    reuse: Mapping[int, np.ndarray] | None = None,
) -> tuple[int, int, np.ndarray] | None:
    """One message from ``source`` (or MPI.ANY_SOURCE) if one waits: ``(rank, tag, buf)``, else
    None.  Matched probe, so a message is received into a buffer of its own size; ``reuse``
    maps a tag to a buffer to receive into when the size matches (the actor's weights)."""
    msg = comm.Improbe(source=source, tag=MPI.ANY_TAG, status=status)
    if msg is None:
        return None
    tag, n = status.Get_tag(), status.Get_count(MPI.BYTE)
    buf = reuse.get(tag) if reuse else None
    if buf is None or buf.nbytes != n:
        buf = np.empty(n, np.uint8)
    msg.Recv([buf, MPI.BYTE])
    return status.Get_source(), tag, buf


class Inbox:
    """One rank's inbox: ``me`` names the rank in errors, ``sender(rank)`` names a sender;
    ``wire`` unpacks (`mpirl.transport.wire.Wire`); ``comm`` is the communicator `serve`
    probes (None: messages come from link ends only)."""

    def __init__(
        self, wire: Wire, me: str, sender: Callable[[int], str], comm: MPI.Comm | None = None
    ) -> None:
        self.wire, self.me, self.sender, self.comm = wire, me, sender, comm
        self.status = MPI.Status()

    def dispatch(
        self, handlers: Handlers, tag: int, buf: np.ndarray, rank: int, now: float = 0.0
    ) -> Message:
        """Unpack one message and hand it to the handler of its kind; returns the message."""
        name = self.sender(rank)
        m = self.wire.unpack(buf, tag, name, rank, now)
        handler = handlers.get(m.kind)
        if handler is None:
            raise RuntimeError(f"{self.me}: unexpected {m.kind.name} from {name}")
        handler(m)
        return m

    def serve(
        self,
        handlers: Handlers,
        source: int = MPI.ANY_SOURCE,
        limit: int | None = None,
        sources: Callable[[], Iterable[int] | None] | None = None,
        reuse: Mapping[int, np.ndarray] | None = None,
        now: float = 0.0,
    ) -> int:
        """Every message waiting on ``comm`` (at most ``limit``), each to its handler; returns
        how many.  ``sources()``, asked before each probe, lists the only ranks to take from
        (None: ``source``): a handler may change it (the consistent cut holds a sender)."""
        n = 0
        while limit is None or n < limit:
            got = self._take(source, sources, reuse)
            if got is None:
                break
            rank, tag, buf = got
            self.dispatch(handlers, tag, buf, rank, now)
            n += 1
        return n

    def _take(
        self,
        source: int,
        sources: Callable[[], Iterable[int] | None] | None,
        reuse: Mapping[int, np.ndarray] | None,
    ) -> tuple[int, int, np.ndarray] | None:
        assert self.comm is not None, f"{self.me}: serve needs the inbox's communicator"
        allowed = sources() if sources is not None else None
        if allowed is None:
            return take(self.comm, source, self.status, reuse)
        for r in allowed:
            got = take(self.comm, r, self.status, reuse)
            if got is not None:
                return got
        return None

    def deliver(
        self,
        handlers: Handlers,
        msgs: list[tuple[int, np.ndarray]],
        rank: int,
        now: float = 0.0,
        until: Callable[[], bool] | None = None,
    ) -> list[tuple[int, np.ndarray]]:
        """Messages a link end handed over (``(tag, buf)``, from ``rank``), each to its handler;
        stops after the one that makes ``until()`` true and returns the rest (else [])."""
        for i, (tag, buf) in enumerate(msgs):
            self.dispatch(handlers, tag, buf, rank, now)
            if until is not None and until():
                return msgs[i + 1 :]
        return []


class SitePort:
    """One rank's end of the site communicator (no emulation): ``post`` is a nonblocking
    uppercase ``Isend`` of a numpy buffer (no pickle), kept until it completes; ``inbox``
    receives."""

    def __init__(self, comm: MPI.Comm, inbox: Inbox) -> None:
        self.comm, self.inbox = comm, inbox
        self.sends: list = []  # (request, buffer) in flight

    def post(self, buf: np.ndarray, dest: int, tag: int | None = None) -> None:
        """Send ``buf`` to site rank ``dest``, tagged with the kind its header declares."""
        tag = kind_of(buf) if tag is None else tag
        self.sends.append((self.comm.Isend([buf, MPI.BYTE], dest=dest, tag=tag), buf))

    def poll(self) -> None:
        """Forget the sends that completed."""
        if self.sends:
            self.sends[:] = [(r, b) for r, b in self.sends if not r.Test()]

    @property
    def backlog(self) -> int:
        return len(self.sends)
