"""Pacing (--actor-steps-per-s, --learner-updates-per-s), the update budget (--max-updates), the
existing placement under a link slower than production (--forward-overflow drop-oldest), and the
fixed after-convergence window."""

from __future__ import annotations

import json
import time

import h5py
import numpy as np
import pytest
from mpirun import run_mpirl

from analysis import metrics as M
from analysis.runs import load_run
from mpirl.logs.runlog import read_stream
from mpirl.run.config import ConfigError, parse
from mpirl.transport.pacing import TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- the token bucket (pure) ----------------------------------------------------------------------


def test_bucket_holds_its_rate_and_lateness_does_not_accumulate():
    clock = FakeClock()
    b = TokenBucket(50.0, take=4, clock=clock)  # 50 tokens/s, 4 per take: 12.5 takes/s
    taken = 0
    for _ in range(10_000):  # 10 s polled every ms: exactly the rate
        clock.now += 0.001
        taken += b.try_take()
    assert abs(taken * 4 / 10.0 - 50.0) <= 0.5
    # polled only every 20 ms (a take is due every 80 ms): each take is late, the rate is not
    taken = 0
    for _ in range(500):
        clock.now += 0.02
        taken += b.try_take()
    assert abs(taken * 4 / 10.0 - 50.0) <= 0.5
    clock.now += 10.0  # a long stall: no more than the burst (0.1 s of tokens) afterwards
    burst = 0
    while b.try_take():
        burst += 1
    assert burst == int(b.burst // 4) == 1


def test_bucket_ready_at_and_wait_sleep_instead_of_spinning():
    b = TokenBucket(20.0)  # one token per 50 ms
    assert b.try_take()
    assert not b.try_take()
    assert b.ready_at() - time.monotonic() == pytest.approx(0.05, abs=0.01)
    t0, c0 = time.monotonic(), time.process_time()
    while not b.try_take():
        b.wait(0.002)
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    assert wall == pytest.approx(0.05, abs=0.02)
    assert cpu < 0.5 * wall  # slept, did not spin
    assert b.waited_s > 0.03
    with pytest.raises(ValueError):
        TokenBucket(0.0)


# --- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--actor-steps-per-s", "-1"),
        ("--learner-updates-per-s", "nan"),
        ("--learner-updates-per-s", "inf"),
    ],
)
def test_bad_rate_is_one_clear_error(flag, value):
    with pytest.raises(ConfigError, match=rf"{flag[2:].replace('-', '_')}=.* must be a rate >= 0"):
        parse([flag, value])


def test_max_updates_is_a_budget_resume_may_change():
    with pytest.raises(ConfigError, match=r"max_updates=-3 must be an integer >= 0"):
        parse(["--max-updates", "-3"])
    stored = {"max_updates": 100, "actor_steps_per_s": 250.0}
    cfg = parse(["--resume", "runs/x", "--max-updates", "200"], stored=stored)
    assert cfg.max_updates == 200 and cfg.actor_steps_per_s == 250.0
    with pytest.raises(ConfigError, match="--actor-steps-per-s"):  # what it learns: not changed
        parse(["--resume", "runs/x", "--actor-steps-per-s", "1"], stored=stored)


# --- the fixed window (pure, and on a run's files) ------------------------------------------------


def test_fixed_window_is_updates_half_to_budget():
    u = np.arange(1, 101)
    mask, n = M.fixed_window(u, 100)
    assert n == 100 and u[mask][0] == 50 and u[mask][-1] == 100 and mask.sum() == 51
    mask, n = M.fixed_window(u, 0)  # no budget: the run's own length
    assert n == 100 and mask.sum() == 51
    mask, n = M.fixed_window(np.arange(1, 61), 101)  # stopped early: what it has of 51..101
    assert n == 101 and mask.sum() == 10
    mask, n = M.fixed_window(np.zeros(0, "i8"), None)
    assert n == 0 and not mask.any()


# --- real runs (mpirun, a few seconds each) -------------------------------------------------------

S, U, BATCH, ACTORS = 200.0, 20.0, 64, 2  # far below what this machine does: P 400/s, U 20/s
RHO = U * BATCH / (S * ACTORS)  # 3.2


def _common(run_dir) -> list[str]:
    return [
        "--run-dir",
        str(run_dir),
        "--env",
        "CartPole-v1",
        "--hidden",
        "32",
        "--progress-seconds",
        "1",
        "--checkpoint-seconds",
        "0",
        "--target-return",
        "none",
        "--replay-ratio",
        "0",
        "--learning-starts",
        "100",
        "--batch-size",
        str(BATCH),
        "--actor-chunk",
        "16",  # env steps are reported per chunk: fine-grained counts
        "--actor-steps-per-s",
        str(S),
        "--learner-updates-per-s",
        str(U),
        "--eval-every",
        "10000",
    ]


def _achieved(p: dict) -> tuple[float, float, float]:
    """(P, U, rho) from /progress over the training part of the run: from the first row with
    updates to the first row at the final update count."""
    i0 = int(np.flatnonzero(p["updates"] > 0)[0])
    i1 = int(np.flatnonzero(p["updates"] == p["updates"].max())[0])
    assert p["t"][i1] - p["t"][i0] >= 3.0, p
    dt = p["t"][i1] - p["t"][i0]
    rate_p = (p["env_steps"][i1] - p["env_steps"][i0]) / dt
    rate_u = (p["updates"][i1] - p["updates"][i0]) / dt
    return rate_p, rate_u, rate_u * BATCH / rate_p


def _check_logged_rho(p: dict) -> None:
    d_steps, d_upd = np.diff(p["env_steps"]), np.diff(p["updates"])
    ok = d_steps > 0
    assert np.allclose(p["rho"][1:][ok], d_upd[ok] * BATCH / d_steps[ok])


@pytest.mark.mpi
def test_pacing_holds_the_requested_rates_and_max_updates_stops_exactly(tmp_path):
    run_dir = tmp_path / "paced"
    r = run_mpirl(
        2 + ACTORS,
        *_common(run_dir),
        "--replay-at",
        "buffer",
        "--max-updates",
        "120",
        "--max-seconds",
        "60",
        timeout=240,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "max_updates" and summary["updates"] == 120
    with h5py.File(run_dir / "learner.h5", "r", locking=False) as f:
        p = read_stream(f, "progress")
        assert int(read_stream(f, "updates")["update"][-1]) == 120
    rate_p, rate_u, rho = _achieved(p)
    print(
        f"requested P {S * ACTORS:.0f}/s U {U:.0f}/s rho {RHO:.2f}; "
        f"achieved P {rate_p:.1f}/s U {rate_u:.2f}/s rho {rho:.3f}"
    )
    assert rate_p == pytest.approx(S * ACTORS, rel=0.1)
    assert rate_u == pytest.approx(U, rel=0.1)
    assert rho == pytest.approx(RHO, rel=0.1)
    _check_logged_rho(p)
    assert np.isnan(p["delivered_fraction"]).all()  # replay_at=buffer: nothing forwarded
    assert np.nanmax(p["capped_s"]) > 0.5  # the cap, not the data, set the pace
    # 20 updates/s of ~1 ms each: the learner naps between them, and says so
    assert np.median(p["idle_fraction"][1:]) > 0.5 and (p["idle_fraction"] <= 1.01).all()
    for a in (2, 3):
        with h5py.File(run_dir / f"actor-{a}.h5", "r", locking=False) as f:
            act = read_stream(f, "actor")
        assert act["paced_s"][-1] > 1.0  # the actor slept to hold its rate
    # the fixed window of the analysis: updates 60..120 of the budget of 120
    with h5py.File(run_dir / "learner.h5", "r", locking=False) as f:
        upd = read_stream(f, "updates")
        xf = read_stream(f, "transfers")
    m = M.run_metrics(load_run(run_dir))
    assert m["budget_updates"] == 120 and m["fixed_complete"]
    want = (upd["update"] >= 60) & (upd["update"] <= 120)
    assert want.sum() == 61
    assert m["train_loss"] == pytest.approx(float(np.mean(upd["loss"][want])), rel=1e-6)
    sel = (xf["update"] >= 60) & (xf["update"] <= 120)
    assert m["prio_held"] == pytest.approx(
        float(np.average(xf["priority_mean"][sel], weights=xf["n"][sel])), rel=1e-5
    )
    assert np.isfinite(m["train_loss_conv"])  # the settle rule stays beside it


@pytest.mark.mpi
def test_drop_oldest_under_a_slow_link_keeps_production_and_logs_the_delivered_fraction(tmp_path):
    run_dir = tmp_path / "drop"
    # ~12.5 kB/s toward the learner (~200 CartPole transitions/s) against P = 400/s
    r = run_mpirl(
        2 + ACTORS,
        *_common(run_dir),
        "--replay-at",
        "learner",
        "--max-seconds",
        "8",
        "--forward-overflow",
        "drop-oldest",
        "--link",
        "wan-100m-30ms",
        "--bandwidth-mbps",
        "0.1",
        "--forward-chunk",
        "64",
        "--forward-credits",
        "2",
        timeout=240,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    with h5py.File(run_dir / "learner.h5", "r", locking=False) as f:
        p = read_stream(f, "progress")
    with h5py.File(run_dir / "buffer-0.h5", "r", locking=False) as f:
        site = read_stream(f, "site")
        attrs = {k: int(f.attrs[k]) for k in ("inserted", "forwarded", "forward_dropped")}
    rate_p, rate_u, rho = _achieved(p)
    print(
        f"requested P {S * ACTORS:.0f}/s U {U:.0f}/s; achieved P {rate_p:.1f}/s "
        f"U {rate_u:.2f}/s rho {rho:.3f}; delivered {summary['delivered_fraction']:.3f}"
    )
    assert rate_p == pytest.approx(S * ACTORS, rel=0.1)  # P holds: actors are not throttled
    assert rate_u == pytest.approx(U, rel=0.1)
    _check_logged_rho(p)
    # the buffer's counters add up in every row, and some production was dropped
    assert (
        site["inserted"] == site["forwarded"] + site["forward_dropped"] + site["forward_queue"]
    ).all()
    assert attrs["forward_dropped"] > 0
    assert attrs["inserted"] == attrs["forwarded"] + attrs["forward_dropped"]  # queue drained
    # delivered < 1, the same at the learner (env steps) and at the buffer (its inserts)
    frac = summary["delivered_fraction"]
    assert 0.1 < frac < 0.9
    assert frac == pytest.approx(attrs["forwarded"] / attrs["inserted"], abs=0.03)
    rows = np.isfinite(p["delivered_fraction"])
    assert rows.sum() >= 3 and (p["delivered_fraction"][rows] < 1.0).mean() >= 0.75


@pytest.mark.mpi
def test_max_updates_continues_with_resume_and_never_overshoots(tmp_path):
    run_dir = tmp_path / "budget"
    base = [
        "--env",
        "CartPole-v1",
        "--hidden",
        "16",
        "--progress-seconds",
        "0",
        "--target-return",
        "none",
        "--learning-starts",
        "100",
        "--eval-every",
        "10000",
        "--learner-updates-per-s",
        "50",
        "--max-seconds",
        "60",
        "--replay-at",
        "learner",
        "--replay-ratio",
        "0",
    ]  # resumed: a batch in turn one
    r = run_mpirl(3, "--run-dir", str(run_dir), *base, "--max-updates", "40", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    for budget, want in (("70", 70), ("70", 70)):  # the second: reached already
        r = run_mpirl(3, "--resume", str(run_dir), "--max-updates", budget, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["stop_reason"] == "max_updates" and summary["updates"] == want
    with h5py.File(run_dir / "learner.h5", "r", locking=False) as f:
        assert list(read_stream(f, "updates")["update"]) == list(range(1, 71))
