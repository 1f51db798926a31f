"""The job scripts and sweeps under a real Slurm (22.05, Debian's packages): a one-node cluster
brought up for this module (tests/slurm_cluster.py), real sbatch jobs, the run folders read back.

Marked ``slurm``: left out of the default run (pyproject addopts) and run by `.ci/run` as a step
of its own, ``python -m pytest -m slurm -p no:xdist tests/test_slurm.py``. Skips with the reason
where no cluster can come up (not root, no package access).

Each job runs the worktree's code with this Python's venv (``VENV``), from the repository root,
its run folders and Slurm output under the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from slurm_cluster import Node, SlurmCluster, unavailable

pytestmark = [pytest.mark.slurm, pytest.mark.mpi]

REPO = Path(__file__).resolve().parent.parent
VENV = sys.prefix
#: CartPole-v1's reward threshold, the default --target-return
TARGET = 475.0


def _env(**kw) -> dict[str, str]:
    """The job's environment: this venv, the worktree first on the path."""
    path = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)
    return {"VENV": VENV, "PYTHONPATH": path, **{k: str(v) for k, v in kw.items()}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = unavailable()
    if why:
        pytest.skip(f"no real Slurm here: {why}")
    c = SlurmCluster(tmp_path_factory.mktemp("slurm") / "cluster", [Node("n1", "127.0.0.1")])
    try:
        c.start()
    except Exception:
        c.stop()
        raise
    yield c
    c.stop()


def _evals(run: Path) -> np.ndarray:
    try:
        with h5py.File(run / "learner.h5", "r", locking=False) as f:
            return f["evals/ret_mean"][()] if "evals" in f else np.zeros(0)
    except (OSError, KeyError):  # not created yet, or the read overlapped a flush
        return np.zeros(0)


def _rows(run: Path) -> dict[str, dict[str, int]]:
    """Rows per stream of every HDF5 file of a run."""
    out = {}
    for p in sorted(run.glob("*.h5")):
        with h5py.File(p, "r", locking=False) as f:
            out[p.stem] = {
                k: len(next(iter(g.values()))) for k, g in f.items() if isinstance(g, h5py.Group)
            }
    return out


def _out(cluster: SlurmCluster, job: int, tmp: Path) -> str:
    text = "\n".join(p.read_text(errors="replace") for p in sorted(tmp.glob(f"*{job}*.out")))
    return f"--- job {job} output\n{text[-6000:]}\n{cluster.logs(1500)}"


def _submit(cluster, tmp: Path, script: str, *sbatch: str, **env) -> int:
    return cluster.sbatch(
        f"--output={tmp}/slurm-%x-%j.out",
        *sbatch,
        str(REPO / script),
        cwd=REPO,
        env=_env(RUN_ROOT=tmp / "runs", **env),
    )


def test_single_node_reaches_the_target(cluster, tmp_path):
    """`sbatch jobs/single-node.sbatch`, as a user runs it: the run stops at the target return
    (475) and writes its summary and a checkpoint."""
    job = _submit(cluster, tmp_path, "jobs/single-node.sbatch", MAX_SECONDS=120)
    rec = cluster.wait_done(job, 200)[0]
    out = _out(cluster, job, tmp_path)
    assert rec["JobState"] == "COMPLETED", out
    run = tmp_path / "runs" / f"mpirl-1node-{job}-r0"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return", (summary, out)
    assert _evals(run).max() >= TARGET, out
    assert list(run.glob("checkpoint/manifest-*.json")), out
    with h5py.File(run / "learner.h5", "r") as f:
        assert json.loads(f.attrs["layout_json"])  # the rank -> host table is there
