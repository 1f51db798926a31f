"""Weights over a slow link: latest-wins, never a backlog; a STOP is never held behind more
than the one weight message in transit (docs/design.md, "Weights on slow links")."""

import json
import subprocess
import sys

import numpy as np
import pytest
from mpirun import mpirun_cmd

from mpirl.transport.link import LinkEnd, LinkProfile
from mpirl.transport.wire import Tag


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
    assert [(t, b) for t, b, _ in comm.sent] == [(Tag.WEIGHTS, 1), (Tag.STOP, 9)]
    end.poll(0.3)  # weights 3 went on the wire at 0.3: leaves at 0.5
    assert end.latest_waiting_bytes == 0 and end.backlog == 1
    end.poll(0.51)
    assert [(t, b) for t, b, _ in comm.sent][2:] == [(Tag.WEIGHTS, 3)]
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


def test_unemulated_link_holds_one_weight_send_in_mpi():
    class _Slow(_Comm):  # a rendezvous send: complete only when the test says so
        def __init__(self):
            super().__init__()
            self.done = False

        def Isend(self, spec, dest, tag):
            super().Isend(spec, dest, tag)
            outer = self

            class _Req:
                def Test(self):
                    return outer.done

            return _Req()

    comm = _Slow()
    end = LinkEnd(comm, 1, LinkProfile())
    end.post_latest(Tag.WEIGHTS, lambda: (_weights(1), None), 0.0)
    for i in range(2, 6):
        end.post_latest(Tag.WEIGHTS, lambda i=i: (_weights(i), None), 0.01 * i)
    end.post(np.full(8, 9, np.uint8), Tag.STOP, 0.1)  # goes to MPI at once
    assert [b for _, b, _ in comm.sent] == [1, 9]
    comm.done = True
    end.poll(0.2)
    end.poll(0.2)
    assert [b for _, b, _ in comm.sent] == [1, 9, 5] and end.latest_replaced == 3


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
    0.74 s on the wire and the learner makes several a second (a backlog of 12 s of them would
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
        "12",
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
    assert summary["wall_s"] <= 12 + 15, summary
    data, _ = read_h5(run / "learner.h5")
    rss, t = data["progress/rss_bytes"], data["progress/t"]
    late = rss[t >= t[0] + 6]
    assert late.size >= 3 and late.max() - late[0] < 32 << 20, rss  # flat, not one backlog
    assert data["progress/weights_replaced"][-1] > 0  # the link could not carry them all
    assert np.nanmax(data["progress/weights_interval"]) <= 1.0 + 1e-9
    lag = data["progress/lag_median"]
    assert np.isfinite(lag).any()


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
