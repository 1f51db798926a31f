"""SIGTERM and SIGINT, however they arrive, end in a complete final checkpoint, under MPICH and
Open MPI: a job script signalled by SLURM (`--signal=B:TERM`, or scancel / preemption, which
signal every process of the job), a terminal (Ctrl-C, `kill` of mpirun) and a sweep.

Open MPI's mpirun kills the ranks 0.25 s after it gets a SIGTERM or SIGINT; mpirl.launch keeps
those from it and relays a SIGUSR1 (see there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mpirun import launcher, mpirun_cmd, signal_job, wait_for_training

from mpirl.run import checkpoint as ck
from mpirl.run.failure import STOP_SIGNALS

ROOT = Path(__file__).resolve().parents[1]
RUN = [
    "--hidden",
    "16",
    "--target-return",
    "none",
    "--progress-seconds",
    "1",
    "--flush-seconds",
    "1",
]
STOPS = {s.name for s in STOP_SIGNALS}


def _assert_complete_final_checkpoint(run: Path, out: str) -> dict:
    """summary.json from a signal stop, and a checkpoint of that stop with every rank's part."""
    assert (run / "summary.json").exists(), f"no summary.json: the ranks were killed\n{out}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] in STOPS, summary["stop_reason"]
    manifest, skipped = ck.select(run)
    assert manifest is not None, f"no complete checkpoint (skipped: {skipped})\n{out}"
    assert manifest["id"] == summary["checkpoint"] and manifest["reason"] == summary["stop_reason"]
    assert sorted(manifest["parts"]) == ["actor-2", "actor-3", "buffer-0", "learner"]
    assert manifest["counters"]["updates"] == summary["updates"] > 0
    steps = sum(p["meta"]["env_steps"] for n, p in manifest["parts"].items() if "actor" in n)
    assert steps == summary["env_steps"]  # a consistent cut: every step counted once
    return summary


def _job_env(tmp_path: Path) -> dict:
    """jobs/single-node.sbatch as SLURM would start it: 4 ranks, this venv, one job id."""
    (tmp_path / ".venv").symlink_to(sys.prefix)  # the script sources .venv/bin/activate
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        SLURM_SUBMIT_DIR=str(tmp_path),
        SLURM_JOB_ID="7",
        NTASKS="4",
        RUN_ROOT=str(tmp_path / "runs"),
        MAX_SECONDS="150",
        MPIRL_ARGS=" ".join(RUN),
        LAUNCHER="openmpi" if launcher() == "openmpi" else "mpirun",
        MPIRUN_FLAGS="--oversubscribe" if launcher() == "openmpi" else "",
    )
    return env


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["script", "scancel"])
def test_job_script_stopped_by_slurm_writes_a_final_checkpoint(tmp_path, how):
    """`script`: SIGTERM to the batch shell only (`#SBATCH --signal=B:TERM@120`); `scancel`:
    SIGTERM to every process of the job at once (scancel, preemption)."""
    proc = subprocess.Popen(
        ["bash", str(ROOT / "jobs" / "single-node.sbatch")],
        env=_job_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run = tmp_path / "runs" / "mpirl-7-r0"
    try:
        wait_for_training(proc, run)
        if how == "script":
            proc.send_signal(signal.SIGTERM)
        else:
            signal_job(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            signal_job(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    _assert_complete_final_checkpoint(run, out)


def _launch(run: Path, max_seconds: int) -> subprocess.Popen:
    """``python -m mpirl.launch mpirun -n 4 python -m mpirl.main`` in its own process group, as
    a terminal job is."""
    cmd = [sys.executable, "-m", "mpirl.launch", *mpirun_cmd(4), sys.executable, "-m"]
    cmd += ["mpirl.main", "--run-dir", str(run), "--max-seconds", str(max_seconds), *RUN]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["ctrl-c", "kill-mpirun"])
def test_terminal_stop_through_mpirl_launch_writes_a_final_checkpoint(tmp_path, how):
    """`ctrl-c`: SIGINT to the terminal's foreground process group (mpirl.launch and mpirun);
    `kill-mpirun`: SIGTERM to mpirun's pid alone."""
    run = tmp_path / "run"
    proc = _launch(run, max_seconds=150)
    try:
        wait_for_training(proc, run)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            mpirun = _children(proc.pid)  # mpirl.launch starts the launcher only
            assert len(mpirun) == 1, mpirun
            os.kill(mpirun[0], signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            signal_job(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    assert "SIGUSR1 to the launcher" in out
    _assert_complete_final_checkpoint(run, out)


@pytest.mark.mpi
@pytest.mark.parametrize("after", ["spawned", "1s"])
def test_a_stop_in_the_first_second_of_a_launch_is_not_lost(tmp_path, after):
    """A stop sent as soon as mpirl.launch has started the launcher (`spawned`), or 1 s later:
    the launcher forwards a signal only to the ranks it has started, and a started rank dies of
    SIGUSR1 until it takes it. Before the relay's file and the early handler the stop was lost
    (the run went to its end) or killed ranks; now the run stops at once, cleanly."""
    run = tmp_path / "run"
    proc = _launch(run, max_seconds=300)
    try:
        t0 = time.monotonic()
        while not _children(proc.pid) and time.monotonic() - t0 < 30:
            time.sleep(0.005)
        time.sleep(0 if after == "spawned" else 1.0)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            signal_job(proc.pid, signal.SIGKILL)
    took = time.monotonic() - t0
    assert proc.returncode == 0, out
    assert (run / "summary.json").exists(), f"no summary.json: the ranks were killed\n{out}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] in STOPS, (summary["stop_reason"], out)
    assert took < 150, f"{took:.0f} s: the stop was lost, the run went on\n{out}"
    manifest, skipped = ck.select(run)
    assert manifest is not None and manifest["reason"] == summary["stop_reason"], skipped


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.mpi
def test_sweep_stopped_by_sigterm_checkpoints_and_resumes(tmp_path):
    """SIGTERM to `python -m mpirl.sweep` (an array task's TERM): its running run stops with a
    final checkpoint, the sweep exits 128+15, and the next invocation continues that run."""
    cmd = json.dumps([*mpirun_cmd(4)[:-1], "{ranks}"])
    spec = tmp_path / "spec.toml"
    body = textwrap.dedent(f"""
        out = "{tmp_path / "out"}"
        ranks = 4
        resume = true
        launcher = {cmd}
        [flags]
        hidden = [16]
        target_return = "none"
        progress_seconds = 1
        flush_seconds = 1
        [budget]
        BUDGET
        """)
    spec.write_text(body.replace("BUDGET", "max_seconds = 150"))
    run = tmp_path / "out" / "seed0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mpirl.sweep", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for_training(proc, run)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            signal_job(proc.pid, signal.SIGKILL)
    log = (tmp_path / "out" / "seed0.log").read_text()
    assert proc.returncode == 128 + signal.SIGTERM, out + log
    assert "stopped by SIGTERM" in out
    first = _assert_complete_final_checkpoint(run, out + log)
    # the next invocation continues it from that checkpoint, for 20 updates more
    spec.write_text(body.replace("BUDGET", f"max_updates = {first['updates'] + 20}"))
    again = subprocess.run(
        [sys.executable, "-m", "mpirl.sweep", str(spec)],
        check=False,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "continuing from its checkpoint" in again.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_updates" and summary["updates"] == first["updates"] + 20


# ---- mpirl.launch alone, with a stand-in launcher (no MPI) ------------------------------------

FAKE = """
import os, signal, sys, time
def usr1(*_):  # the relay's file is in place before its signal comes
    print("got SIGUSR1, file:", open(os.environ["MPIRL_STOP_FILE"]).read(), flush=True)
    sys.exit(3)
time.sleep(float(sys.argv[1]))  # a launcher that starts slowly: SIGUSR1 would kill it meanwhile
signal.signal(signal.SIGUSR1, usr1)
blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
print("blocked", sorted(s.name for s in blocked), flush=True)
time.sleep(30)
"""


def _fake_launch(tmp_path: Path, slow_s: float = 0.0) -> subprocess.Popen:
    (tmp_path / "fake.py").write_text(FAKE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mpirl.launch", sys.executable, str(tmp_path / "fake.py")]
        + [str(slow_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if slow_s == 0:
        assert proc.stdout.readline().startswith("blocked ['SIGHUP', 'SIGINT', 'SIGTERM']")
    return proc


@pytest.mark.parametrize("to", ["launch", "launcher"])
def test_launch_relays_a_stop_signal_as_sigusr1(tmp_path, to):
    """The launcher starts with TERM/INT/HUP blocked; a TERM to mpirl.launch, or one left
    pending at the launcher, reaches it as USR1; the exit status is the launcher's."""
    proc = _fake_launch(tmp_path)
    target = proc.pid if to == "launch" else _children(proc.pid)[0]
    os.kill(target, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert "SIGTERM: SIGUSR1 to the launcher" in out and "got SIGUSR1, file: SIGTERM" in out
    assert proc.returncode == 3


def test_launch_holds_a_stop_until_the_launcher_takes_sigusr1(tmp_path):
    """A stop as soon as the launcher exists: SIGUSR1's default action would kill a launcher
    that has not set its handler yet, so the relay writes its file and waits to send it."""
    proc = _fake_launch(tmp_path, slow_s=1.5)
    t0 = time.monotonic()
    while not _children(proc.pid) and time.monotonic() - t0 < 30:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert "got SIGUSR1, file: SIGTERM" in out, out
    assert proc.returncode == 3


def test_launch_without_a_launcher_is_one_error():
    p = subprocess.run(
        [sys.executable, "-m", "mpirl.launch", "no-such-mpirun", "-n", "3"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 127 and p.stderr.count("error") == 1 and "no-such-mpirun" in p.stderr
