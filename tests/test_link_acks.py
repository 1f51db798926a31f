"""Latest-wins on a real link (``--link none``): a weight piece is on the wire until the receiver
has acknowledged it, not until MPI's send completes (an eager send completes at once, into MPI's
and TCP's buffers), and the link rate is measured from those acknowledgements (docs/design.md,
"Weights on slow links")."""

import types

import numpy as np
import pytest

from mpirl.transport import link as link_mod
from mpirl.transport.link import ACK, LAST, MIN_PIECE, PIECE, AckRate, LinkEnd, LinkProfile
from mpirl.transport.wire import Tag


class _EagerComm:
    """Every Isend completes at once (MPI's eager path).  Weight pieces cross a wire of
    ``rate`` in order behind each other; the receiver takes each off MPI when its last byte has
    arrived and its ACK (pieces received, gap since the one before) is read at ``clock``."""

    def __init__(self, clock, rate, ack_delay=0.0):
        self.clock, self.rate, self.ack_delay = clock, rate, ack_delay
        self.sent: list[tuple[int, int]] = []  # (tag, bytes)
        self.arrivals: list[float] = []  # of each weight piece, at the receiver
        self.acked = 0

    def Isend(self, spec, dest, tag):
        n = len(spec[0])
        self.sent.append((tag, n))
        if tag >= PIECE:
            start = max(self.clock[0], self.arrivals[-1] if self.arrivals else 0.0)
            self.arrivals.append(start + n * 8 / self.rate)
        return types.SimpleNamespace(Test=lambda: True)

    def Improbe(self, source, tag, status):
        assert tag == ACK
        k = self.acked
        if k >= len(self.arrivals) or self.arrivals[k] + self.ack_delay > self.clock[0]:
            return None
        gap = self.arrivals[k] - self.arrivals[k - 1] if k else float("nan")
        self.acked += 1

        def recv(spec):
            spec[0][:] = (k + 1, gap)

        return types.SimpleNamespace(Recv=recv)

    def pieces(self) -> int:
        """Weight messages and pieces sent (whole or in pieces)."""
        return sum(t % PIECE == Tag.WEIGHTS for t, _ in self.sent)


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(link_mod, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    return now


def _w(i: int, n: int) -> np.ndarray:
    return np.full(n, i, np.uint8)


def test_real_link_holds_two_unacknowledged_pieces_and_measures_the_rate(clock):
    """100 kB weights posted every 10 ms onto a real link of 1 Mb/s (16 KiB per 131 ms): MPI
    never holds more than two pieces of them (one arriving, one behind it), whatever the sends'
    completion says; a STOP goes to MPI at once (behind those); the rate measured from the
    acknowledgements is the link's, not memory-copy speed; the slot keeps the latest message."""
    rate, n = 1e6, 100_000
    comm = _EagerComm(clock, rate)
    end = LinkEnd(comm, 1, LinkProfile(), piece_s=0.05)
    for i in range(20):
        end.post_latest(Tag.WEIGHTS, lambda i=i: (_w(i, n), None), clock[0])
        end.poll(clock[0])
        assert comm.pieces() - comm.acked <= 2, comm.sent
        clock[0] += 0.01
    # the first does not go whole: in MIN_PIECE pieces, split evenly (7 of 14,286 bytes)
    assert comm.sent[:2] == [(PIECE + Tag.WEIGHTS, 14_286)] * 2
    end.post(np.zeros(8, np.uint8), Tag.STOP, clock[0])
    assert comm.sent[-1] == (Tag.STOP, 8)
    while end.backlog and clock[0] < 200:
        clock[0] += 0.01
        end.poll(clock[0])
        assert sum(a > clock[0] for a in comm.arrivals) <= 2  # never a backlog in MPI
    assert end.backlog == 0
    assert end.latest_rate_bps == pytest.approx(rate, rel=0.01)
    assert end.piece_bytes() == MIN_PIECE  # 50 ms at 1 Mb/s is 6 kB: the floor
    tags = [t for t, _ in comm.sent if t >= PIECE]
    assert tags.count(LAST + Tag.WEIGHTS) == 2  # the first message and the latest one
    assert end.latest_replaced == 18
    assert comm.arrivals[-1] < 100.2 + 2 * n * 8 / rate  # two messages' time, no more


def test_ack_rate_is_robust_to_stalls_bunching_and_overhead():
    """Round-trip samples alone (no piece followed another on the wire yet)."""
    r = AckRate()
    assert r.bps != r.bps  # nan before the first
    rate, c = 2e6, 0.02  # 20 ms per-piece overhead (round trip, loop delays)
    for n in (40_000, 40_000, 2_000, 40_000, 40_000, 3_000, 40_000):
        r.add(n, n * 8 / rate + c)
    assert r.bps == pytest.approx(rate, rel=0.02)  # the overhead cancels in the slope
    r.add(40_000, 5.0)  # a receiver stalled in a checkpoint
    r.add(40_000, 1e-4)  # two acknowledgements read in one poll
    assert r.bps == pytest.approx(rate, rel=0.25)
    same = AckRate()
    for _ in range(5):
        same.add(16_384, 16_384 * 8 / rate + c)
    tx = 16_384 * 8 / rate
    assert same.bps == pytest.approx(rate * tx / (tx + c))  # one size: the overhead stays in


def test_gap_samples_win_over_round_trips_and_ignore_outliers():
    """The receiver's gaps between pieces that followed each other: the way back (ACKs behind
    the edge's experiences) does not enter; one stall or one bunched read does not move it."""
    r = AckRate()
    for _ in range(5):
        r.add(16_384, 2.0)  # round trips inflated by a queue on the way back
    assert r.bps == pytest.approx(16_384 * 8 / 2.0)
    for gap in (0.131, 0.13, 0.133, 3.0, 1e-4, 0.131, 0.132):
        r.add_gap(16_384, gap)
    assert r.bps == pytest.approx(16_384 * 8 / 0.131, rel=0.02)


def test_gaps_only_of_pieces_sure_to_follow_the_one_before(clock):
    """ACKs that come back 1 s late (queued behind the edge's experiences on a full link): a
    piece sent when an ACK comes may leave an idle wire behind the one before, so its gap is not
    a sample; the first two pieces of each message, sent together, are.  The rate stays right."""
    rate, n = 1e6, 100_000
    comm = _EagerComm(clock, rate, ack_delay=1.0)
    end = LinkEnd(comm, 1, LinkProfile(), piece_s=0.05)
    for _ in range(3):
        end.post_latest(Tag.WEIGHTS, lambda: (_w(1, n), None), clock[0])
        while end.backlog and clock[0] < 200:
            clock[0] += 0.01
            end.poll(clock[0])
    assert len(end.acked.gaps) == 3  # one per message: its second piece
    assert end.latest_rate_bps == pytest.approx(rate, rel=0.01)
    assert all(8 * b / g == pytest.approx(rate) for b, g in end.acked.gaps)
