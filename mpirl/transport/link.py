"""The long-haul link between an edge buffer and the cloud learner: model, pacing, accounting.

The model is a store-and-forward pipe per direction: a message of ``n`` bytes handed to the link at
time ``t`` starts serializing at ``max(t, busy_until)``, leaves after ``n * 8 / rate`` seconds and
is delivered ``latency (+- jitter)`` later, in order.  Bandwidth is applied at the sender (the real
MPI send happens when the last bit would have left), latency at the receiver (a received message
is held until ``arrival + latency``), so no clock has to be shared between hosts.  The real MPI
messages are delayed and paced; nothing is simulated away, and the real network's own time adds
on top (with profile ``none`` it is all there is).

**Latest-wins messages** (``LinkEnd.post_latest``; the learner's weights): at most one is on
the wire and at most one waits in a slot that a newer one replaces.  The slot enters the wire
only when the wire has drained, and the bytes held for the kind never exceed two messages.  On
the wire a latest-wins message goes in **pieces** of ``piece_s`` seconds of link time (at least
`MIN_PIECE` bytes; at the emulated rate, else at the rate measured from acknowledgements,
`AckRate`; `MIN_PIECE` until one is measured): one piece at a time, each after the messages
posted while the one before it was on the wire.  Under emulation one piece is on the wire,
until the model has serialized it and its MPI send completed; on a real network (no emulation)
at most `WINDOW` (two), each until the receiver has **acknowledged** it (an `ACK` message the
receiving end sends when it takes the piece off MPI): a send completing there only means MPI or
TCP buffered the bytes.  So a control message (priorities, credits, STOP) waits behind one or
two pieces, not a whole broadcast (8.5 s for MinAtar's weights at 0.5 Mb/s, during which a
buffer would get no credits).  A message is cut into pieces of one size; every piece but the
last carries ``PIECE + tag``, the last ``LAST + tag``; the receiving end acknowledges each,
joins them, and delivers the message under ``tag`` when its last piece arrives.
docs/design.md, "Weights on slow links", maps this onto MPI's eager and rendezvous paths.

``LinkModel`` is pure (no MPI) and unit-tested; ``LinkEnd`` applies it to one peer over a
communicator with uppercase mpi4py calls.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mpirl.errors import ConfigError
from mpirl.transport.wire import kind_of

if TYPE_CHECKING:
    from mpi4py import MPI

    from mpirl.run.config import Config

PIECE = 1000  # tag offset of a latest-wins message's pieces but its last (link-internal)
LAST = 2000  # tag offset of a latest-wins message's last piece (link-internal; acknowledged)
ACK = 3000  # tag of the receiver's acknowledgement of a latest-wins piece (link-internal): two
#             float64, how many pieces it has received and the time since it received the one before
WINDOW = 2  # latest-wins pieces unacknowledged at once on a real link: one arriving, one behind it

MIN_PIECE = 16 * 1024  # bytes: smaller pieces would cost more in messages than they save
RATE_SAMPLES = 9  # acknowledged pieces the measured rate is taken over (`AckRate`)
#: test and bench hook: a folder where each link end appends its measured rate, at most once a
#: second, as JSON lines to ``link-<world rank>-<peer>.jsonl`` (tests/test_real_link.py)
TRACE_ENV = "MPIRL_LINK_TRACE"


class AckRate:
    """The link rate for latest-wins messages, measured from the receiver's acknowledgements.

    An MPI send completing says nothing on a real network (an eager one completes at once, into
    MPI's and TCP's buffers); an acknowledgement does.  Two kinds of sample:

    * **gap** (`add_gap`), the one used when there is any: a piece sent while the one before it
      was still unacknowledged follows it on the wire, so the receiver takes it off MPI
      ``8 bytes / rate`` after that one.  The receiver measures that gap on its own clock and
      sends it in the ACK, so neither the way back (ACKs queue behind the edge's experiences
      on a saturated link) nor any clock offset enters.  A piece taken in the same `receive`
      call as the one before has no gap (it may have waited there: when it arrived is not
      known).  The estimate is the median of ``8 bytes / gap`` over the large ones (at least a
      quarter of the largest: a small last piece's gap is mostly the receiver's poll delay)
      of the last `RATE_SAMPLES` such pieces: one receiver stall (one long gap) or a late
      poll followed by a prompt one (one short gap) do not move it.
    * **round trip** (`add`), until a gap sample exists (single-piece messages after an idle
      wire): ``dt`` from the piece's hand-over to MPI to its ACK read here, its transfer time
      plus an overhead ``c`` (round trip, poll delays, queueing on the way back).

    Round-trip samples, medians over the last `RATE_SAMPLES` pieces:

    * ``raw`` = the median of ``8 bytes / dt`` over the large pieces (at least a quarter of the
      largest kept; all when fewer than 2): the rate a piece actually got, ``c`` included;
    * when small pieces are among them too (a message's last piece; at most a quarter of the
      large ones' median size), the overhead cancels in the two-point slope
      ``8 (median large bytes - median small bytes) / (median large dt - median small dt)``;
      it is taken if it lies in ``[raw, 2 raw]`` (else ``raw``: noise, not a rate).
    """

    def __init__(self, n: int = RATE_SAMPLES):
        self.samples: deque = deque(maxlen=n)
        self.gaps: deque = deque(maxlen=n)

    def add(self, nbytes: int, dt: float) -> None:
        if nbytes > 0 and dt > 0:
            self.samples.append((nbytes, dt))

    def add_gap(self, nbytes: int, gap: float) -> None:
        if nbytes > 0 and gap > 0:
            self.gaps.append((nbytes, gap))

    @property
    def bps(self) -> float:
        if self.gaps:
            top = max(n for n, _ in self.gaps)
            return float(np.median([8.0 * n / g for n, g in self.gaps if n >= top / 4]))
        if not self.samples:
            return float("nan")
        top = max(n for n, _ in self.samples)
        large = [(n, d) for n, d in self.samples if n >= top / 4]
        if len(large) < 2:
            large = list(self.samples)
        raw = float(np.median([8.0 * n / d for n, d in large]))
        nl = float(np.median([n for n, _ in large]))
        small = [(n, d) for n, d in self.samples if n <= nl / 4]
        if len(small) >= 2:
            dn = nl - float(np.median([n for n, _ in small]))
            dd = float(np.median([d for _, d in large])) - float(np.median([d for _, d in small]))
            if dd > 0 and raw <= (slope := 8.0 * dn / dd) <= 2 * raw:
                return slope
        return raw


@dataclass(frozen=True)
class LinkProfile:
    latency_s: float = 0.0  # one way
    rate_bps: float = float("inf")  # bits per second
    jitter_s: float = 0.0  # uniform +- on the latency

    def describe(self) -> str:
        if self.latency_s == 0 and self.rate_bps == float("inf"):
            return "real network, no emulation"
        rate = "unlimited" if self.rate_bps == float("inf") else f"{self.rate_bps / 1e6:g} Mb/s"
        s = f"{self.latency_s * 1e3:g} ms one way, {rate}"
        return s + (f", jitter {self.jitter_s * 1e3:g} ms" if self.jitter_s else "")

    @property
    def emulated(self) -> bool:
        return self.latency_s > 0 or self.rate_bps != float("inf") or self.jitter_s > 0


PROFILES: dict[str, LinkProfile] = {
    "none": LinkProfile(),
    # The source paper's prototype: 10 km of fibre (~49 us one way) behind a 25GbE switch.
    "fiber-10km-25g": LinkProfile(latency_s=50e-6, rate_bps=25e9),
    "wan-1g-10ms": LinkProfile(latency_s=10e-3, rate_bps=1e9),
    "wan-100m-30ms": LinkProfile(latency_s=30e-3, rate_bps=100e6),
}


def resolve_profile(cfg: Config) -> LinkProfile:
    """The profile named by ``cfg.link`` with the CLI overrides applied; ConfigError if bad."""
    if cfg.link not in PROFILES:
        raise ConfigError(
            f"link={cfg.link!r} is not a known profile; choose one of "
            f"{', '.join(PROFILES)} (and override with --latency-ms, "
            "--bandwidth-mbps, --jitter-ms)"
        )
    p = PROFILES[cfg.link]
    lat = p.latency_s if cfg.latency_ms is None else cfg.latency_ms / 1e3
    rate = p.rate_bps if cfg.bandwidth_mbps is None else cfg.bandwidth_mbps * 1e6
    jit = p.jitter_s if cfg.jitter_ms is None else cfg.jitter_ms / 1e3
    if lat < 0:
        raise ConfigError(f"latency_ms={cfg.latency_ms!r} must be >= 0")
    if not rate > 0:
        raise ConfigError(f"bandwidth_mbps={cfg.bandwidth_mbps!r} must be > 0")
    if jit < 0 or jit > lat:
        raise ConfigError(f"jitter_ms={jit * 1e3:g} must be in [0, latency_ms={lat * 1e3:g}]")
    return LinkProfile(latency_s=lat, rate_bps=rate, jitter_s=jit)


class LinkModel:
    """One direction of the link: when does a message leave, when does it arrive."""

    def __init__(self, profile: LinkProfile, seed: int = 0) -> None:
        self.profile = profile
        self.busy_until = 0.0
        self.busy_time = 0.0  # seconds spent serializing
        self._last_delivery = 0.0
        self._rng = random.Random(seed)

    def departure(self, t: float, nbytes: int) -> float:
        """Time the last bit of a message handed over at ``t`` leaves the sender."""
        start = max(t, self.busy_until)
        tx = nbytes * 8.0 / self.profile.rate_bps
        self.busy_until = start + tx
        self.busy_time += tx
        return self.busy_until

    def delivery(self, t_arrival: float) -> float:
        """Time a message that arrived at ``t_arrival`` is handed to the application (FIFO)."""
        lat = self.profile.latency_s
        if self.profile.jitter_s:
            lat += self._rng.uniform(-self.profile.jitter_s, self.profile.jitter_s)
        self._last_delivery = max(self._last_delivery, t_arrival + lat)
        return self._last_delivery


class LinkStats:
    """Counters for one direction; reset per logging interval with ``take()``."""

    __slots__ = ("bytes", "msgs", "queue_s", "total_bytes", "total_msgs")

    def __init__(self) -> None:
        self.bytes = self.msgs = 0
        self.queue_s = 0.0
        self.total_bytes = self.total_msgs = 0

    def count(self, nbytes: int, queue_s: float = 0.0) -> None:
        self.bytes += nbytes
        self.msgs += 1
        self.queue_s += queue_s
        self.total_bytes += nbytes
        self.total_msgs += 1

    def take(self) -> tuple[int, int, float]:
        out = (self.bytes, self.msgs, self.queue_s)
        self.bytes = self.msgs = 0
        self.queue_s = 0.0
        return out


class LinkEnd:
    """One end of a long-haul link to ``peer`` on ``comm``: paced sends, delayed receives.

    ``post(buf, tag)`` hands a uint8 buffer to the link (it must not be reused by the caller);
    ``poll()`` starts the sends whose departure time has come and completes finished ones;
    ``receive()`` returns the ``(tag, buf)`` messages whose delivery time has come.
    ``piece_s``: a latest-wins message goes in pieces of this much link time (0: whole).
    """

    def __init__(
        self, comm: MPI.Comm, peer: int, profile: LinkProfile, seed: int = 0, piece_s: float = 0.0
    ) -> None:
        from mpi4py import MPI

        from mpirl.transport.inbox import take  # (mpi4py on first use: the pure parts import none)

        self._MPI, self._take = MPI, take
        self.comm, self.peer, self.profile = comm, peer, profile
        self.out_model = LinkModel(profile, seed)
        self.in_model = LinkModel(profile, seed + 1)
        self.sent, self.received = LinkStats(), LinkStats()
        self._queue: deque = deque()  # (departure, t_handed, tag, buf) waiting to leave
        self._pending: list = []  # (request, buf) in MPI
        self._held: deque = deque()  # (delivery, tag, buf) arrived, waiting out the latency
        self._status = MPI.Status()
        self.piece_s = piece_s
        self._slot: tuple[int, np.ndarray, Callable[[], None] | None, float] | None = None
        # latest-wins (tag, buf, on_commit, t_handed) not on the wire yet
        self._pieces: deque = deque()  # (tag, view) of the one on the wire, not handed over yet
        self._latest_buf = None  # emulated: the piece on the wire until its send completes
        self._unacked: deque = deque()  # real link: (number, t handed, bytes, behind another)
        self._pieces_sent = self._pieces_got = 0  # latest-wins pieces sent and received, ever
        self._t_got = float("nan")  # when the last latest-wins piece was received
        self._ack_in = np.zeros(2, np.float64)
        self._parts: dict[int, list] = {}  # received pieces of a latest-wins message, by tag
        self.latest_replaced = 0  # latest-wins messages a newer one replaced in the slot
        self.acked = AckRate()  # the rate measured from acknowledged pieces
        self.acks_sent = 0  # ACKs this end sent (link-internal, not counted in `sent`)
        self._trace, self._t_trace = os.environ.get(TRACE_ENV), -1.0

    # ---- sending -----------------------------------------------------------------------------
    def post(self, buf: np.ndarray, tag: int | None = None, now: float | None = None) -> float:
        """Hand ``buf`` to the link, tagged with the kind its header declares; returns the time
        it waits behind earlier messages."""
        tag = kind_of(buf) if tag is None else tag
        now = time.monotonic() if now is None else now
        if self.profile.emulated:
            start = max(now, self.out_model.busy_until)
            dep = self.out_model.departure(now, buf.nbytes)
            self._queue.append((dep, now, tag, buf))
            self.poll(now)
            return start - now
        if self._queue:  # queued under an emulated profile (--link-change): leave after them
            dep = max(now, self._queue[-1][0])
            self._queue.append((dep, now, tag, buf))
            self.poll(now)
            return dep - now
        self._isend(buf, tag, 0.0)
        return 0.0

    def post_latest(
        self,
        tag: int,
        make: Callable[[], tuple[np.ndarray, Callable | None]],
        now: float | None = None,
    ) -> bool:
        """Hand a latest-wins message to the link: ``make()`` returns ``(buf, on_commit)``.

        ``make`` is called after the link has settled at ``now``, so it may encode against what
        the peer will hold (``on_commit`` is called when ``buf`` enters the wire: from then on the
        peer receives it).  If no latest-wins message is on the wire and nothing is queued ahead,
        it goes now; else it takes the slot, replacing the one waiting there.  True: it went now.
        """
        now = time.monotonic() if now is None else now
        self.poll(now)
        buf, on_commit = make()
        if self._slot is not None:
            self.latest_replaced += 1
        self._slot = (tag, buf, on_commit, now)
        self.poll(now)
        return self._slot is None

    def drop_latest(self) -> None:
        """Forget the latest-wins message waiting in the slot, and the pieces of the one on the
        wire not handed over yet (the peer has left: its DONE)."""
        self._slot = None
        self._pieces.clear()
        self._unacked.clear()  # no acknowledgement will come for the ones on the wire

    @property
    def latest_waiting_bytes(self) -> int:
        """Bytes of the latest-wins message waiting in the slot (0 or one message)."""
        return 0 if self._slot is None else self._slot[1].nbytes

    @property
    def latest_rate_bps(self) -> float:
        """The rate latest-wins messages get: the modelled one under emulation, else the one
        measured from the receiver's acknowledgements (`AckRate`; nan before the first)."""
        return self.profile.rate_bps if self.profile.emulated else self.acked.bps

    def piece_bytes(self) -> int:
        """Bytes of a piece now (0: the message goes whole)."""
        if self.piece_s <= 0:
            return 0
        rate = self.latest_rate_bps
        if rate != rate:  # nothing acknowledged yet: the smallest pieces, never a whole message
            return MIN_PIECE
        if not 0 < rate < float("inf"):
            return 0
        return max(MIN_PIECE, int(rate * self.piece_s / 8))

    def _advance_latest(self, now: float) -> bool:
        """Hand the next piece of the message on the wire, or the slot's message, to the wire:
        once the wire has room (`_wire_full`) and every message queued before it has departed.
        True: a piece went."""
        if self._queue or self._wire_full():
            return False
        if not self._pieces:
            if self._slot is None:
                return False
            tag, buf, on_commit, handed = self._slot
            self._slot = None
            if on_commit is not None:
                on_commit()
            c = self.piece_bytes() or max(1, buf.nbytes)  # an empty message goes as one
            k = max(1, -(-buf.nbytes // c))
            c = max(1, -(-buf.nbytes // k))  # k pieces of (nearly) one size: no tiny last one
            self._pieces.extend((PIECE + tag, buf[i * c : (i + 1) * c]) for i in range(k - 1))
            self._pieces.append((LAST + tag, buf[(k - 1) * c :]))
        else:
            handed = now
        tag, piece = self._pieces.popleft()
        self._latest_buf = piece
        if self.profile.emulated:
            dep = self.out_model.departure(now, piece.nbytes)
            self._queue.append((dep, handed, tag, piece))
            if dep <= now:
                self._queue.popleft()
                self._isend(piece, tag, max(0.0, dep - handed))
        else:
            self._isend(piece, tag, now - handed)
        return True

    def _wire_full(self) -> bool:
        """No further latest-wins piece may enter the wire now: under emulation one is there
        (serializing, or in MPI); on a real link `WINDOW` are unacknowledged."""
        if self.profile.emulated:
            return self._latest_buf is not None
        return len(self._unacked) >= WINDOW

    def _on_ack(self, k: int, gap: float, now: float) -> None:
        """The receiver has received ``k`` latest-wins pieces, the ``k``-th ``gap`` seconds after
        the one before (pieces sent under emulation, before a --link-change, are not tracked)."""
        while self._unacked and self._unacked[0][0] <= k:
            i, t0, n, behind = self._unacked.popleft()
            if i == k:
                self.acked.add(n, now - t0)
                if behind:
                    self.acked.add_gap(n, gap)
                if self._trace and now - self._t_trace >= 1.0:
                    self._write_trace(now)

    def _write_trace(self, now: float) -> None:
        self._t_trace = now
        me = self._MPI.COMM_WORLD.Get_rank()
        row = {
            "t": now,
            "rate_bps": self.latest_rate_bps,
            "gap_samples": len(self.acked.gaps),
            "rtt_samples": [[n, round(d, 4)] for n, d in self.acked.samples],
            "gaps": [[n, round(g, 4)] for n, g in self.acked.gaps],
            "pieces_sent": self._pieces_sent,
            "replaced": self.latest_replaced,
        }
        assert self._trace is not None  # called only with MPIRL_LINK_TRACE set
        path = os.path.join(self._trace, f"link-{me}-{self.peer}.jsonl")
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def _take_acks(self, now: float) -> None:
        while self._unacked:
            msg = self.comm.Improbe(source=self.peer, tag=ACK, status=self._status)
            if msg is None:
                return
            msg.Recv([self._ack_in, self._MPI.BYTE])
            self._on_ack(int(self._ack_in[0]), float(self._ack_in[1]), now)

    def set_profile(self, profile: LinkProfile) -> None:
        """Change the emulated link from now on (messages already queued keep their times, and
        later ones leave after them: FIFO across the change)."""
        self.profile = profile
        self.out_model.profile = profile
        self.in_model.profile = profile

    def _isend(self, buf: np.ndarray, tag: int, queue_s: float) -> None:
        req = self.comm.Isend([buf, self._MPI.BYTE], dest=self.peer, tag=tag)
        self._pending.append((req, buf))
        self.sent.count(buf.nbytes, queue_s)
        if tag >= PIECE:
            self._pieces_sent += 1
            if not self.profile.emulated:
                t = time.monotonic()
                behind = False  # sure to follow the one before on the wire: a gap sample
                if self._unacked:  # sent within half the one before's transfer time (1 ms
                    # before any rate is known): that one cannot have arrived yet
                    _, t_prev, n_prev, _ = self._unacked[-1]
                    rate = self.acked.bps
                    most = 0.5 * 8 * n_prev / rate if 0 < rate < float("inf") else 0.0
                    behind = t - t_prev <= max(1e-3, most)
                self._unacked.append((self._pieces_sent, t, buf.nbytes, behind))

    def poll(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        while self._queue and self._queue[0][0] <= now:
            dep, handed, tag, buf = self._queue.popleft()
            self._isend(buf, tag, max(0.0, dep - handed))
        if self._unacked:
            self._take_acks(time.monotonic())
        if self._pending:
            still = []
            for r, b in self._pending:
                if not r.Test():
                    still.append((r, b))
                elif b is self._latest_buf:
                    self._latest_buf = None  # the model serialized it and MPI took it
            self._pending = still
        while (self._slot is not None or self._pieces) and not self._wire_full():
            if not self._advance_latest(now):
                break

    @property
    def backlog(self) -> int:
        """Messages handed to the link that have not completed yet (the slot's and the pieces
        not handed over yet included)."""
        return (
            len(self._queue)
            + len(self._pending)
            + len(self._pieces)
            + (self._slot is not None)
            + len(self._unacked)  # real link: not arrived yet (and no ACK left unreceived)
        )

    def next_departure(self) -> float | None:
        """When the next queued message leaves (the loop sleeps until then at most)."""
        if self._queue:
            return self._queue[0][0]
        if (self._slot is not None or self._pieces) and not self._wire_full():
            return time.monotonic()
        return None

    # ---- receiving ---------------------------------------------------------------------------
    def receive(self, now: float | None = None, limit: int = 64) -> list[tuple[int, np.ndarray]]:
        """The ``(tag, buf)`` messages whose delivery time has come, in order; takes at most
        ``limit`` off MPI (`mpirl.transport.inbox.take`) and holds each for the latency."""
        first = True  # the first piece taken in this call (a gap is known for it only)
        for _ in range(limit):
            got = self._take(self.comm, self.peer, self._status)
            if got is None:
                break
            _, tag, buf = got
            t = time.monotonic()
            if tag == ACK:  # (taken here when it came before poll looked for it)
                a = buf.view(np.float64)
                self._on_ack(int(a[0]), float(a[1]), t)
                continue
            self.received.count(buf.nbytes)
            if tag >= PIECE:  # a piece of a latest-wins message: acknowledged; the last delivers
                self._pieces_got += 1
                gap = t - self._t_got if first else float("nan")  # nan: none (or the first)
                ack = np.array([self._pieces_got, gap], np.float64)
                self._t_got, first = t, False
                req = self.comm.Isend([ack, self._MPI.BYTE], dest=self.peer, tag=ACK)
                self._pending.append((req, ack))
                self.acks_sent += 1
                if tag < LAST:
                    self._parts.setdefault(tag - PIECE, []).append(buf)
                    continue
                tag -= LAST
            if self._parts.get(tag):
                buf = np.concatenate([*self._parts.pop(tag), buf])
            if self.profile.emulated:
                self._held.append((self.in_model.delivery(t), tag, buf))
            else:
                self._held.append((t, tag, buf))
        # the caller's `now` predates what this call received: a message that arrived just now
        # over a real link is due now, not one loop turn later
        now = time.monotonic() if now is None or self._held else now
        out = []
        while self._held and self._held[0][0] <= now:
            _, tag, buf = self._held.popleft()
            out.append((tag, buf))
        return out

    def flush_blocking(self, timeout: float = 10.0) -> bool:
        """Push out everything queued (used at shutdown); False if it did not finish in time."""
        end = time.monotonic() + timeout
        while self.backlog and time.monotonic() < end:
            self.poll()
            time.sleep(1e-4)
        return not self.backlog

    def utilization(self, wall_s: float) -> float:
        """Fraction of ``wall_s`` the outgoing direction spent serializing (modelled bandwidth)."""
        if self.profile.rate_bps == float("inf") or wall_s <= 0:
            return 0.0
        return self.out_model.busy_time / wall_s
