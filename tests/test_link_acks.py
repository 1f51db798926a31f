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
    """Every Isend completes at once (MPI's eager path); the peer's acknowledgements are queued
    by the test (`ack`) and handed out by a matched probe on the ACK tag."""

    def __init__(self):
        self.sent: list[tuple[int, int]] = []  # (tag, bytes)
        self.acks: list[int] = []

    def Isend(self, spec, dest, tag):
        self.sent.append((tag, len(spec[0])))
        return types.SimpleNamespace(Test=lambda: True)

    def Improbe(self, source, tag, status):
        assert tag == ACK
        if not self.acks:
            return None
        k = self.acks.pop(0)

        def recv(spec):
            spec[0][:] = k

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


def test_real_link_holds_one_unacknowledged_piece_and_measures_the_rate(clock):
    """100 kB weights posted every 10 ms onto a real link whose receiver takes 16 KiB per
    131 ms (1 Mb/s): MPI never holds more than one piece of them, whatever the sends' completion
    says, a STOP goes to MPI at once (behind that one piece), and the rate measured from the
    acknowledgements is the receiver's, not memory-copy speed."""
    comm = _EagerComm()
    end = LinkEnd(comm, 1, LinkProfile(), piece_s=0.05)
    rate, n = 1e6, 100_000
    for i in range(20):
        end.post_latest(Tag.WEIGHTS, lambda i=i: (_w(i, n), None), clock[0])
        end.poll(clock[0])
        assert comm.pieces() == 1, comm.sent  # the first message does not go whole either
        clock[0] += 0.01
    assert comm.sent[0] == (PIECE + Tag.WEIGHTS, MIN_PIECE)
    end.post(np.zeros(8, np.uint8), Tag.STOP, clock[0])
    assert comm.sent[-1] == (Tag.STOP, 8)
    # the receiver acknowledges each piece when its last byte has arrived
    t_free = 100.0
    for _ in range(40):
        k = comm.pieces()
        t_free += [b for t, b in comm.sent if t % PIECE == Tag.WEIGHTS][-1] * 8 / rate
        clock[0] = max(clock[0], t_free)
        comm.acks.append(k)
        end.poll(clock[0])
        assert comm.pieces() <= k + 1
        if not end.backlog:
            break
    assert end.backlog == 0
    assert end.latest_rate_bps == pytest.approx(rate, rel=0.01)
    assert end.piece_bytes() == MIN_PIECE  # 50 ms at 1 Mb/s is 6 kB: the floor
    tags = [t for t, _ in comm.sent if t >= PIECE]
    assert tags.count(LAST + Tag.WEIGHTS) == 2  # the first message and the latest one
    assert end.latest_replaced == 18


def test_ack_rate_is_robust_to_stalls_bunching_and_overhead():
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
