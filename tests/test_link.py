import pytest

from mpirl.run.config import Config, ConfigError
from mpirl.transport.link import PROFILES, LinkEnd, LinkModel, LinkProfile, resolve_profile


def test_bandwidth_serializes_back_to_back():
    m = LinkModel(LinkProfile(latency_s=0.01, rate_bps=8e6))  # 1 MB/s
    assert m.departure(0.0, 1000) == pytest.approx(0.001)
    assert m.departure(0.0, 1000) == pytest.approx(0.002)  # queued behind the first
    assert m.departure(1.0, 1000) == pytest.approx(1.001)  # idle link starts at once
    assert m.busy_time == pytest.approx(0.003)


def test_latency_and_fifo_with_jitter():
    import numpy as np

    lat, jit = 0.01, 0.005
    # arrivals 0.1 ms apart, far closer than the jitter: FIFO holds some messages back, yet
    # none leaves the [latency - jitter, latency + jitter] window (a held message waits for an
    # earlier one, which arrived earlier and was delayed at most latency + jitter)
    m = LinkModel(LinkProfile(latency_s=lat, jitter_s=jit), seed=1)
    arrivals = np.arange(200) * 1e-4
    times = np.array([m.delivery(t) for t in arrivals])
    assert (np.diff(times) >= 0).all()  # in order
    delay = times - arrivals
    assert delay.min() >= lat - jit - 1e-12 and delay.max() <= lat + jit + 1e-12, delay
    # arrivals 20 ms apart (> 2 x jitter): FIFO never binds, each delay is latency + U(-j, j)
    m = LinkModel(LinkProfile(latency_s=lat, jitter_s=jit), seed=2)
    arrivals = np.arange(200) * 0.02
    delay = np.array([m.delivery(t) for t in arrivals]) - arrivals
    assert delay.min() >= lat - jit - 1e-12 and delay.max() <= lat + jit + 1e-12, delay
    assert delay.max() - delay.min() > 1.5 * jit  # the jitter is there, over most of its range
    assert delay.std() > 0.4 * jit  # uniform on [-j, j]: std j / sqrt(3) = 0.58 j
    assert abs(delay.mean() - lat) < 0.2 * jit  # centred on the latency
    assert LinkModel(LinkProfile(latency_s=0.02)).delivery(1.0) == pytest.approx(1.02)


def test_profiles_and_overrides():
    assert not PROFILES["none"].emulated
    fiber = PROFILES["fiber-10km-25g"]
    assert fiber.latency_s == pytest.approx(50e-6) and fiber.rate_bps == 25e9
    p = resolve_profile(Config(link="wan-100m-30ms", latency_ms=5.0))
    assert p.latency_s == pytest.approx(0.005) and p.rate_bps == 100e6
    with pytest.raises(ConfigError, match="link='dialup'"):
        resolve_profile(Config(link="dialup"))
    with pytest.raises(ConfigError, match="bandwidth_mbps=0"):
        resolve_profile(Config(bandwidth_mbps=0.0))


def test_real_link_delivers_in_the_same_call():
    """With no emulation a message is handed over by the receive() call that takes it off MPI,
    even when the caller's clock reading predates its arrival (not one loop turn later)."""
    import time

    import numpy as np
    from mpi4py import MPI

    end = LinkEnd(MPI.COMM_SELF, 0, PROFILES["none"])
    now = time.monotonic()  # the loop's reading, taken before the message exists
    end.post(np.arange(16, dtype=np.uint8), tag=7)
    got = []
    for _ in range(1000):  # a send to self may take a few progress calls to match
        end.poll()
        got = end.receive(now)
        if got:
            break
    assert [(t, b.tolist()) for t, b in got] == [(7, list(range(16)))]
    for _ in range(1000):  # complete the send: no request left pending at MPI_Finalize
        end.poll()
        if not end.backlog:
            break
    assert end.backlog == 0


class _FakeComm:
    """Records every Isend (tag, bytes) in the order LinkEnd starts it."""

    def __init__(self):
        self.sent = []

    def Isend(self, spec, dest, tag):
        self.sent.append((tag, len(spec[0])))

        class _Done:
            def Test(self):
                return True

        return _Done()


def test_profile_change_to_unemulated_keeps_fifo_order():
    """--link-change to `none` while messages wait in the emulated queue: a later message must
    not overtake them (a DONE or checkpoint ack ahead of data breaks the protocol)."""
    import numpy as np

    from mpirl.transport.wire import Tag

    comm = _FakeComm()
    end = LinkEnd(comm, 1, PROFILES["wan-100m-30ms"])
    t = 100.0
    end.post(np.zeros(1 << 20, np.uint8), Tag.FORWARD, t)  # 1 MB: leaves after ~84 ms
    assert comm.sent == []
    end.set_profile(PROFILES["none"])
    end.post(np.zeros(64, np.uint8), Tag.DONE, t + 0.001)
    end.post(np.zeros(32, np.uint8), Tag.CHECKPOINT, t + 0.002)
    end.poll(t + 1.0)
    assert [tag for tag, _ in comm.sent] == [Tag.FORWARD, Tag.DONE, Tag.CHECKPOINT]
    assert comm.sent[0][1] == 1 << 20 and end.backlog == 0
    end.post(np.zeros(8, np.uint8), Tag.DONE, t + 2.0)  # queue empty: unemulated sends at once
    assert comm.sent[-1] == (Tag.DONE, 8)
