"""Weights over a slow link: latest-wins, never a backlog; a STOP is never held behind more
than the one weight message in transit (docs/design.md, "Weights on slow links")."""

import json
import subprocess
import sys

import numpy as np
import pytest
from mpirun import mpirun_cmd

from mpirl.transport.link import LAST, LinkEnd, LinkProfile
from mpirl.transport.wire import Tag

W = LAST + Tag.WEIGHTS  # a latest-wins message's last piece (or the whole one) on the wire


class _Comm:
    """Records every Isend (tag, first byte, bytes); sends complete at once."""

    def __init__(self):
        self.sent = []

    def Isend(self, spec, dest, tag):
        self.sent.append((tag, int(spec[0][0]), len(spec[0])))

        class _Done:
            def Test(self):
                return True

        return _Done()


def _weights(i: int, n: int = 25_000) -> np.ndarray:
    return np.full(n, i, np.uint8)


def test_latest_wins_slot_and_control_overtakes():
    comm = _Comm()
    end = LinkEnd(comm, 1, LinkProfile(rate_bps=1e6))  # 25 kB: 0.2 s on the wire
    assert end.post_latest(Tag.WEIGHTS, lambda: (_weights(1), None), 0.0)  # on the wire
    assert not end.post_latest(Tag.WEIGHTS, lambda: (_weights(2), None), 0.01)  # the slot
    assert not end.post_latest(Tag.WEIGHTS, lambda: (_weights(3), None), 0.02)  # replaces 2
    assert end.latest_replaced == 1 and end.latest_waiting_bytes == 25_000
    end.post(np.full(8, 9, np.uint8), Tag.STOP, 0.05)  # behind the one in transit only
    end.poll(0.3)
    assert [(t, b) for t, b, _ in comm.sent] == [(W, 1), (Tag.STOP, 9)]
    end.poll(0.3)  # weights 3 went on the wire at 0.3: leaves at 0.5
    assert end.latest_waiting_bytes == 0 and end.backlog == 1
    end.poll(0.51)
    assert [(t, b) for t, b, _ in comm.sent][2:] == [(W, 3)]
    assert end.backlog == 0
    assert end.latest_rate_bps == pytest.approx(1e6)


def test_on_commit_runs_when_it_enters_the_wire():
    comm, log = _Comm(), []
    end = LinkEnd(comm, 1, LinkProfile(rate_bps=1e6))
    end.post_latest(Tag.WEIGHTS, lambda: (_weights(1), lambda: log.append(1)), 0.0)
    end.post_latest(Tag.WEIGHTS, lambda: (_weights(2), lambda: log.append(2)), 0.1)
    end.post_latest(Tag.WEIGHTS, lambda: (_weights(3), lambda: log.append(3)), 0.15)
    assert log == [1]  # 2 and 3 wait: the peer will never see 2
    end.poll(0.25)
    assert log == [1, 3]


def test_unemulated_link_holds_two_weight_sends_in_mpi():
    """Until the receiver acknowledges them (link.WINDOW; tests/test_link_acks.py: an eager send
    completes at once, an acknowledgement only when the bytes have arrived)."""
    import types

    class _Slow(_Comm):
        def __init__(self):
            super().__init__()
            self.done = False

        def Improbe(self, source, tag, status):
            if not self.done:
                return None
            self.done = False
            k = sum(t >= 1000 for t, _, _ in self.sent)
            return types.SimpleNamespace(Recv=lambda spec: spec[0].__setitem__(0, k))

    comm = _Slow()
    end = LinkEnd(comm, 1, LinkProfile())
    end.post_latest(Tag.WEIGHTS, lambda: (_weights(1), None), 0.0)
    for i in range(2, 6):
        end.post_latest(Tag.WEIGHTS, lambda i=i: (_weights(i), None), 0.01 * i)
    end.post(np.full(8, 9, np.uint8), Tag.STOP, 0.1)  # goes to MPI at once
    assert [b for _, b, _ in comm.sent] == [1, 2, 9]
    comm.done = True
    end.poll(0.2)
    end.poll(0.2)
    assert [b for _, b, _ in comm.sent] == [1, 2, 9, 5] and end.latest_replaced == 2


@pytest.mark.mpi
def test_stop_within_one_weight_transfer_over_mpi():
    """A learner posting weights every 5 ms onto a link that takes 0.2 s per broadcast: the
    bytes waiting never exceed one broadcast and a STOP arrives within one transfer + latency."""
    lat_ms, mbps, size = 20.0, 1.0, 25_000
    p = subprocess.run(
        [
            *mpirun_cmd(2),
            sys.executable,
            "tests/link_latest.py",
            str(lat_ms),
            str(mbps),
            str(size),
            "2.0",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.strip().splitlines()[-1])
    tx = size * 8 / (mbps * 1e6)
    assert res["most_waiting_bytes"] <= size
    assert res["stop_delay_s"] <= tx + lat_ms / 1e3 + 0.05, res
    assert 5 <= res["weights_received"] <= 2.0 / tx + 2, res


@pytest.mark.mpi
def test_slow_link_run_stops_on_time_with_flat_memory(tmp_path):
    """CartPole at 0.2 Mb/s, --weights-every 1, --replay-ratio 0: a broadcast (18 kB) takes
    0.74 s on the wire and the learner makes several a second (a backlog of 8 s of them would
    take minutes to drain).  The job stops within 15 s of --max-seconds (the STOP is not held
    behind a backlog of weights) and the learner's resident memory does not grow with the run."""
    from mpirun import read_h5, run_mpirl

    run = tmp_path / "run"
    p = run_mpirl(
        3,
        "--bandwidth-mbps",
        "0.2",
        "--latency-ms",
        "20",
        "--weights-every",
        "1",
        "--replay-ratio",
        "0",
        "--max-seconds",
        "8",
        "--target-return",
        "none",
        "--checkpoint-seconds",
        "0",
        "--progress-seconds",
        "1",
        "--evaluator",
        "thread",
        "--run-dir",
        str(run),
        timeout=240,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_seconds"
    assert summary["wall_s"] <= 8 + 15, summary
    data, _ = read_h5(run / "learner.h5")
    rss, t = data["progress/rss_bytes"], data["progress/t"]
    late = rss[t >= t[0] + 4]
    assert late.size >= 3 and late.max() - late[0] < 32 << 20, rss  # flat, not one backlog
    assert data["progress/weights_replaced"][-1] > 0  # the link could not carry them all
    assert np.nanmax(data["progress/weights_interval"]) <= 1.0 + 1e-9
    lag = data["progress/lag_median"]
    assert np.isfinite(lag).any()


def test_control_messages_wait_behind_one_piece_not_a_whole_broadcast():
    """100 kB of weights on a 1 Mb/s link (0.8 s) go in 7 pieces of 14,286 bytes (piece_s 50 ms
    gives 6 kB, raised to MIN_PIECE, 16 KiB; then split evenly): a STOP posted just after the
    weights leaves after the first piece (0.114 s), not after the whole broadcast; the pieces
    add up to the message, the last one under LAST + tag, the others under PIECE + tag."""
    from mpirl.transport.link import MIN_PIECE, PIECE

    comm = _Comm()
    end = LinkEnd(comm, 1, LinkProfile(rate_bps=1e6), piece_s=0.05)
    assert end.piece_bytes() == MIN_PIECE
    assert end.post_latest(Tag.WEIGHTS, lambda: (_weights(1, 100_000), None), 0.0)
    end.post(np.full(8, 9, np.uint8), Tag.STOP, 0.01)
    stop_at = None
    for k in range(1, 101):  # 10 ms steps to 1 s
        end.poll(k * 0.01)
        if stop_at is None and any(t == Tag.STOP for t, _, _ in comm.sent):
            stop_at = k * 0.01
    tags = [t for t, _, _ in comm.sent]
    assert tags == [PIECE + Tag.WEIGHTS, Tag.STOP, *[PIECE + Tag.WEIGHTS] * 5, W]
    assert stop_at == pytest.approx(0.12)  # the first piece leaves at 0.114 s
    assert sum(n for t, _, n in comm.sent if t != Tag.STOP) == 100_000
    assert end.backlog == 0 and end.latest_rate_bps == pytest.approx(1e6)


def test_pieces_are_joined_into_the_message_at_the_receiver():
    """Over MPI (a link end sending to itself): the receiver hands over the STOP that went
    between the pieces first, then the weights, byte for byte, under their own tag."""
    import time

    from mpi4py import MPI

    end = LinkEnd(MPI.COMM_SELF, 0, LinkProfile(rate_bps=1e8), piece_s=1e-3)
    w = np.random.default_rng(0).integers(0, 256, 50_000).astype(np.uint8)
    end.post_latest(Tag.WEIGHTS, lambda: (w, None))
    end.post(np.full(8, 9, np.uint8), Tag.STOP)
    got, t_end = [], time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < t_end:
        end.poll()
        got += end.receive()
    while end.backlog and time.monotonic() < t_end:  # no request pending at MPI_Finalize
        end.poll()
    assert [t for t, _ in got] == [Tag.STOP, Tag.WEIGHTS]
    assert np.array_equal(got[1][1], w) and end.backlog == 0 and not end._parts


def test_drop_latest_leaves_nothing_for_a_peer_that_left():
    comm = _Comm()
    end = LinkEnd(comm, 1, LinkProfile(rate_bps=1e6))
    end.post_latest(Tag.WEIGHTS, lambda: (_weights(1), None), 0.0)
    end.post_latest(Tag.WEIGHTS, lambda: (_weights(2), None), 0.01)
    end.drop_latest()
    end.post(np.full(8, 9, np.uint8), Tag.DONE, 0.02)
    end.poll(1.0)
    end.poll(1.0)
    assert [b for _, b, _ in comm.sent] == [1, 9] and end.backlog == 0
    pieces = LinkEnd(comm, 1, LinkProfile(rate_bps=1e6), piece_s=0.05)  # 2 pieces of 16 KiB
    pieces.post_latest(Tag.WEIGHTS, lambda: (_weights(3, 30_000), None), 1.0)
    pieces.drop_latest()  # the second piece is never sent
    pieces.poll(2.0)
    pieces.poll(2.0)
    assert [b for _, b, _ in comm.sent][2:] == [3] and pieces.backlog == 0


@pytest.mark.parametrize("piece_s", [0.0, 1e-3])
def test_an_empty_latest_message_is_sent(piece_s):
    """A 0-byte latest-wins message (none is posted today: WEIGHTS carry a header) leaves as one
    empty message, pieces on or off (with them off it divided by zero)."""
    import time

    from mpi4py import MPI

    end = LinkEnd(MPI.COMM_SELF, 0, LinkProfile(rate_bps=1e8), piece_s=piece_s)
    end.post_latest(Tag.WEIGHTS, lambda: (np.zeros(0, np.uint8), None))
    got, t_end = [], time.monotonic() + 10
    while not got and time.monotonic() < t_end:
        end.poll()
        got += end.receive()
    while end.backlog and time.monotonic() < t_end:
        end.poll()
    assert [(t, b.nbytes) for t, b in got] == [(Tag.WEIGHTS, 0)] and end.backlog == 0
