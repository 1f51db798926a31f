"""Helpers to run mpirl under the venv's mpirun in tests."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def mpirun_path() -> str:
    here = Path(sys.executable).parent / "mpirun"
    found = str(here) if here.exists() else shutil.which("mpirun")
    if not found:
        raise RuntimeError("mpirun not found: install mpirl into a venv (pip install -e .)")
    return found


def run_mpirl(n: int, *args: str, timeout: float = 300, env: dict | None = None,
              cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    cmd = [mpirun_path(), "-n", str(n), sys.executable, "-m", "mpirl.main", *args]
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e, cwd=cwd)
