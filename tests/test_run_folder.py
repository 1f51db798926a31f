"""Ranks that reach main() seconds apart still agree on one run folder (rank 0 decides it)."""

import json
import sys

import pytest
from mpirun import mpirun_cmd

from mpirl.run import checkpoint as ck

# initializes MPI, then holds the odd ranks back past a second boundary before mpirl.main runs
LATE_START = """
import sys, time
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() % 2:
    time.sleep(2.2)
from mpirl.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.mpi
def test_default_run_folder_is_rank_0s_when_ranks_start_apart(tmp_path):
    import subprocess

    script = tmp_path / "late_start.py"
    script.write_text(LATE_START)
    p = subprocess.run(
        [
            *mpirun_cmd(4),
            sys.executable,
            str(script),
            "--max-seconds",
            "4",
            "--checkpoint-seconds",
            "1",
            "--target-return",
            "none",
            "--learning-starts",
            "200",
            "--hidden",
            "32",
            "32",
            "--progress-seconds",
            "0",
            "--flush-seconds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 1, [f.name for f in folders]
    run = folders[0]
    assert f"run folder runs/{run.name}" in p.stdout
    assert sorted(x.name for x in run.glob("*.h5")) == [
        "actor-2.h5",
        "actor-3.h5",
        "buffer-0.h5",
        "learner.h5",
    ]
    summary = json.loads((run / "summary.json").read_text())
    manifest, skipped = ck.select(run)
    assert not skipped and manifest["id"] == summary["checkpoint"]
    assert sorted(manifest["parts"]) == ["actor-2", "actor-3", "buffer-0", "learner"]
    assert manifest["id"] >= 2  # periodic checkpoints and the final one, all in this folder
