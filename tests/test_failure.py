"""Faults under mpirun: one failing or killed rank ends the whole job promptly, non-zero, with
one message naming the rank and its role; the survivors' HDF5 files stay readable.

Faults are injected with the test-only hook ``MPIRL_FAULT=ROLE:RANK:SECONDS[:ACTION]``
(mpirl.run.failure.Fault), SECONDS after that rank's role loop started.
"""

from __future__ import annotations

import json
import re
import time

import h5py
import pytest
from mpirun import run_mpirl

ARGS = [
    "--max-seconds",
    "60",
    "--hidden",
    "32",
    "32",
    "--target-return",
    "none",
    "--progress-seconds",
    "0",
    "--flush-seconds",
    "1",
]
ABORT_WITHIN_S = 10.0  # measured: 6-30 ms after a raise, about 0.2 s after a SIGKILL


def _fault(n: int, spec: str, tmp_path):
    p = run_mpirl(
        n,
        "--run-dir",
        str(tmp_path / "run"),
        *ARGS,
        timeout=120,
        env={"MPIRL_FAULT": spec, "MPIRL_TRACEBACK": "0"},
    )
    ended = time.time()
    m = re.search(r"injected fault: \w+ at unix (\d+\.\d+)", p.stderr)
    return p, (ended - float(m.group(1))) if m else None


@pytest.mark.parametrize(
    "spec, who",
    [
        ("learner:0:1", "rank 0 (learner)"),
        ("buffer:1:1", "rank 1 (buffer of site 0)"),
        ("actor:2:1", "rank 2 (actor of site 0)"),
    ],
)
@pytest.mark.mpi
def test_exception_in_any_role_aborts_the_job(tmp_path, spec, who):
    p, took = _fault(3, spec, tmp_path)
    assert p.returncode != 0
    failed = [x for x in p.stderr.splitlines() if " failed: " in x]
    want = f"mpirl: {who} failed: RuntimeError: injected fault (MPIRL_FAULT='{spec}')"
    assert failed == [want], p.stderr
    assert took is not None and took < ABORT_WITHIN_S, took


@pytest.mark.mpi
def test_an_exception_in_the_gba_server_thread_aborts_the_job(tmp_path):
    """The parameter server is a thread of the lead's rank (gba): an exception there is raised
    again in the lead's loop, which fails the job with one message naming it and its cause."""
    spec = "server:0:2"
    p = run_mpirl(
        5, "--run-dir", str(tmp_path / "run"), *ARGS, "--learners", "2",
        "--learner-sync", "gba", "--replay-at", "learner", timeout=120,
        env={"MPIRL_FAULT": spec, "MPIRL_TRACEBACK": "0"},
    )  # fmt: skip
    ended = time.time()
    assert p.returncode != 0
    failed = [x for x in p.stderr.splitlines() if " failed: " in x]
    want = (
        "mpirl: rank 0 (learner) failed: RuntimeError: learner: the GBA server thread failed: "
        f"RuntimeError: injected fault (MPIRL_FAULT='{spec}')"
    )
    assert failed == [want], p.stderr
    m = re.search(r"injected fault: raise at unix (\d+\.\d+)", p.stderr)
    assert m is not None and ended - float(m.group(1)) < ABORT_WITHIN_S, p.stderr


@pytest.mark.mpi
def test_sigkilled_rank_ends_the_job_and_files_stay_readable(tmp_path):
    p, took = _fault(4, "actor:2:4:kill", tmp_path)
    assert p.returncode != 0 and took is not None and took < ABORT_WITHIN_S, (took, p.stderr)
    killed_at = float(re.search(r"at unix (\d+\.\d+)", p.stderr).group(1))
    run = tmp_path / "run"
    for name, stream in [
        ("learner.h5", "updates"),
        ("buffer-0.h5", "site"),
        ("actor-3.h5", "episodes"),
        ("actor-2.h5", "episodes"),
    ]:
        with h5py.File(run / name, "r") as f:  # plain h5py, default arguments
            assert json.loads(f.attrs["config_json"])["hidden"] == [32, 32]
            t = f[stream]["t"][()]
            n = min(d.shape[0] for d in f[stream].values())
            assert n > 0, name
            # data up to the last flush: rows within --flush-seconds (1 s) of the kill, plus
            # slack for a loaded machine (the survivors were killed about 0.2 s later)
            last = f.attrs["t0_unix"] + t[:n].max()
            assert killed_at - last < 1.0 + 2.5, (name, killed_at - last)


@pytest.mark.mpi
def test_mismatched_message_is_rejected_naming_rank_and_message(tmp_path):
    p, _ = _fault(3, "actor:2:1:wire", tmp_path)
    assert p.returncode != 0
    failed = [x for x in p.stderr.splitlines() if " failed: " in x]
    assert len(failed) == 1, p.stderr
    assert failed[0].startswith(
        "mpirl: rank 1 (buffer of site 0) failed: WireError: message "
        "with tag 1 from actor (site rank 1): wire version 99"
    )


@pytest.mark.parametrize(
    "forced, who",
    [
        ("1:memory", "rank 1 (buffer of site 0)"),
        ("2:env", "rank 2 (actor of site 0)"),
    ],
)
@pytest.mark.mpi
def test_a_host_check_failing_on_one_nonzero_rank_ends_the_job_with_one_message(
    tmp_path, forced, who
):
    """MPIRL_FAULT_CHECK=RANK:CHECK fails one check on one rank only (mpirl.run.resources): rank 0
    says so once, naming the rank, its host and the check, and every rank exits at once (no
    rank left waiting in a collective for one that gave up)."""
    import socket

    p = run_mpirl(
        3,
        "--run-dir",
        str(tmp_path / "run"),
        *ARGS,
        timeout=120,
        env={"MPIRL_FAULT_CHECK": forced, "MPIRL_TRACEBACK": "0"},
    )
    ended = time.time()
    assert p.returncode == 2, p.stderr
    errors = [x for x in p.stderr.splitlines() if x.startswith("mpirl: error:")]
    check = forced.split(":")[1]
    assert len(errors) == 1 and errors[0].startswith(
        f"mpirl: error: {who} on host {socket.gethostname()}: {check}: "
    ), p.stderr
    at = float(
        re.search(r"injected check failure: \w+ on rank \d+ at unix (\d+\.\d+)", p.stderr).group(1)
    )
    assert ended - at < ABORT_WITHIN_S, (ended - at, p.stderr)
    assert "Traceback" not in p.stderr and "BAD TERMINATION" not in p.stdout + p.stderr
    assert not (tmp_path / "run").exists()  # checked before the run folder is made


def test_bad_fault_spec_is_refused():
    from mpirl.run.failure import Fault

    with pytest.raises(ValueError, match="ROLE:RANK:SECONDS"):
        Fault("actor", 2, "actor:2:soon")
    f = Fault("actor", 2, "learner:0:1,actor:2:0:raise")
    assert f.action == "raise"
    with pytest.raises(RuntimeError, match="injected fault"):
        f.check()
    assert Fault("buffer", 1, "actor:2:0").action is None


@pytest.mark.parametrize("how", ["early", "file"])
def test_a_stop_asked_for_while_the_rank_starts_is_the_first_request(tmp_path, monkeypatch, how):
    """`early`: a relayed SIGUSR1 that comes while the rank imports is kept by the early handler
    (its default action would kill the rank); `file`: one the launcher never forwarded (it was
    sent before the rank existed) is read from the relay's file. Either is StopSignal's first
    request, with its watchdog armed, and a second signal after repeat_s ends the job."""
    import os
    import signal

    from mpirl.run import failure

    before = {s: signal.getsignal(s) for s in failure.STOP_SIGNALS}
    monkeypatch.setattr(failure, "_early", None)
    monkeypatch.setenv(failure.STOP_FILE_ENV, str(tmp_path / "stop"))
    assert failure.stop_asked_at_start() is None  # no file: nothing asked
    stop = None
    try:
        if how == "early":
            failure.catch_stop_early()
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.05)  # Python runs the handler between bytecodes of the main thread
            expect = "SIGUSR1"
        else:
            (tmp_path / "stop").write_text("SIGTERM")
            expect = "SIGTERM"
        stop = failure.StopSignal(world=None, who="test", repeat_s=0.3)
        assert stop.requested == expect and stop._watchdog._timer is not None
        time.sleep(0.35)
        with pytest.raises(KeyboardInterrupt, match="second SIGUSR1"):
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.05)
    finally:
        if stop is not None:
            stop._watchdog.disarm()
        for s, h in before.items():
            signal.signal(s, h)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGUSR1"])
def test_stop_signals_ask_for_a_clean_stop(sig):
    """SIGUSR1 too: mpirl.launch relays every stop as SIGUSR1 (Open MPI's mpirun kills the ranks
    0.25 s after a SIGTERM). The signals are unblocked (a launcher started by mpirl.launch has
    them blocked, and Hydra passes that on); a burst within repeat_s is one request (scancel:
    SLURM's TERM and the relayed USR1); a signal after that ends the job."""
    import os
    import signal

    from mpirl.run.failure import StopSignal

    signum = getattr(signal, sig)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signum])
    stop = None
    try:
        for s in before:  # if StopSignal left one alone, the test fails instead of dying
            signal.signal(s, lambda *_: None)
        stop = StopSignal(world=None, who="test", repeat_s=0.5)
        assert signum not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        os.kill(os.getpid(), signum)
        time.sleep(0.05)  # Python runs the handler between bytecodes of the main thread
        assert stop.requested == sig
        os.kill(os.getpid(), signal.SIGUSR1 if sig != "SIGUSR1" else signal.SIGTERM)
        time.sleep(0.05)  # the same request: ignored
        time.sleep(0.5)
        with pytest.raises(KeyboardInterrupt, match=f"second {sig}"):
            os.kill(os.getpid(), signum)
            time.sleep(0.05)
    finally:
        if stop is not None:
            stop._watchdog.disarm()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s, h in before.items():
            signal.signal(s, h)
