"""jobs/pin.sh: the learner (world rank 0) alone on the first usable core, the other ranks on the
rest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpirun import mpirun_cmd

PIN = Path(__file__).resolve().parent.parent / "jobs" / "pin.sh"
SHOW = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
CPUS = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="pinning needs 2 usable CPUs")


def _env(**kw: str) -> dict:
    e = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
    }
    e.update(kw)
    return e


@needs_two
@pytest.mark.parametrize("var", ["PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"])
def test_rank_0_alone_on_the_first_core_the_others_on_the_rest(var):
    for rank, want in (("0", CPUS[:1]), ("1", CPUS[1:]), ("7", CPUS[1:])):
        out = subprocess.run(
            [str(PIN), *SHOW], env=_env(**{var: rank}), capture_output=True, text=True, check=True
        ).stdout
        assert out.strip() == str(want), (var, rank, out)


def test_no_rank_is_one_clear_error():
    r = subprocess.run([str(PIN), *SHOW], env=_env(), capture_output=True, text=True)
    assert r.returncode == 2 and "PMI_RANK" in r.stderr and "mpirun" in r.stderr


@pytest.mark.mpi
@needs_two
def test_under_mpirun():
    r = subprocess.run(
        [
            *mpirun_cmd(3),
            str(PIN),
            sys.executable,
            "-c",
            "import os; r = os.environ.get('PMI_RANK') or "
            "os.environ.get('OMPI_COMM_WORLD_RANK'); "
            # one write per rank: mpirun interleaves the ranks' output at write boundaries
            "os.write(1, f'{r} {sorted(os.sched_getaffinity(0))}\\n'.encode())",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    got = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert got == {"0": str(CPUS[:1]), "1": str(CPUS[1:]), "2": str(CPUS[1:])}, r.stdout
