"""The evaluation child process (--evaluator process): the learner hands it weights without
waiting for it, and it runs outside the MPI job that started the learner."""

import json
import os
import time

import numpy as np
import pytest

from mpirl.agent.qnet import n_params
from mpirl.roles.evaluation import ProcessRunner, child_environ

HIDDEN = (1024, 1024)  # 4.2 MB of float32 weights for CartPole's 4 inputs: 67 pipe buffers
# a user's env module, as the README describes; importing it (in the child only) records the
# environment it sees and takes SLOW_S seconds, as importing torch and building Atari envs do
MODULE = """
import json, os, time
import gymnasium as gym
with open(os.environ["MPIRL_TEST_SEEN"], "w") as f:
    json.dump(sorted(os.environ), f)
time.sleep(float(os.environ["MPIRL_TEST_SLOW_S"]))
gym.register("MpirlSlowPole-v0", max_episode_steps=20,
             entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv")
"""


def _settings(env: str) -> dict:
    return {
        "reference": None,
        "env": env,
        "episodes": 2,
        "seed": 0,
        "max_steps": 0,
        "hidden": list(HIDDEN),
        "dueling": False,
        "kwargs": {},
        "wrappers": [],
    }


@pytest.fixture
def user_env(tmp_path, monkeypatch):
    (tmp_path / "slow_user_env.py").write_text(MODULE)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(x for x in (str(tmp_path), os.environ.get("PYTHONPATH")) if x)
    )
    monkeypatch.setenv("MPIRL_TEST_SEEN", str(tmp_path / "seen.json"))
    return tmp_path


def _result(runner, timeout: float):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        res = runner.poll()
        if res is not None:
            return res
        time.sleep(0.01)
    raise AssertionError(f"no evaluation result within {timeout} s")


def test_weights_reach_a_child_still_starting_without_holding_the_learner(user_env, monkeypatch):
    """4.2 MB of weights to a child that reads them only after 3 s of start-up: `request`
    returns at once (a blocking pipe write waits those 3 s), and the round is still played."""
    monkeypatch.setenv("MPIRL_TEST_SLOW_S", "3")
    flat = np.zeros(n_params(4, 2, HIDDEN, False), np.float32)
    assert flat.nbytes > 4e6
    r = ProcessRunner(_settings("slow_user_env:MpirlSlowPole-v0"))
    try:
        t0 = time.monotonic()
        r.request(flat, 5, 100, 7)
        handed = time.monotonic() - t0
        flat += 1.0  # the learner refills its buffer at the next broadcast: not what was asked
        res = _result(r, 120)
    finally:
        r.close()
    assert handed < 0.5, f"the hand-off held the learner {handed:.2f} s"
    assert (res.round, res.update, res.env_steps) == (5, 100, 7)
    assert len(res.returns) == 2 and (res.returns > 0).all()
    assert not res.params.any()  # the weights evaluated (and offered as best.pt), not the refill
    assert r.proc.returncode == 0


def test_close_ends_a_child_that_never_reads(user_env, monkeypatch):
    """The learner stops while the child is still starting and its request is half written:
    close kills the child after its timeout, which ends the writer thread too."""
    monkeypatch.setenv("MPIRL_TEST_SLOW_S", "60")
    r = ProcessRunner(_settings("slow_user_env:MpirlSlowPole-v0"))
    r.request(np.zeros(n_params(4, 2, HIDDEN, False), np.float32), 0, 1, 1)
    t0 = time.monotonic()
    r.close(timeout=2)
    assert time.monotonic() - t0 < 10 and r.proc.returncode is not None
    r._writer.join(timeout=5)
    assert not r._writer.is_alive()


LAUNCHER = {
    "PMI_RANK": "0",
    "PMI_SIZE": "3",
    "PMI_FD": "9",
    "PMI_HOSTNAME": "vm",
    "MPI_LOCALNRANKS": "3",
    "MPI_LOCALRANKID": "0",
    "HYDRA_CONTROL_FD": "7",
    "MPIR_CVAR_CH3_NOLOCAL": "1",
    "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_COMM_WORLD_SIZE": "3",
    "PMIX_RANK": "0",
    "PMIX_NAMESPACE": "prterun-vm-1@1",
    "PRTE_MCA_ess": "pmi",
}


def test_child_runs_outside_the_launchers_job(user_env, monkeypatch):
    """The learner's environment as MPICH's Hydra, SLURM or Open MPI set it: the child (and a
    user's env module it imports, which may import mpi4py) sees none of the launcher's
    variables, and everything else."""
    monkeypatch.setenv("MPIRL_TEST_SLOW_S", "0")
    monkeypatch.setenv("MPIRL_TEST_KEEP", "1")
    for k, v in LAUNCHER.items():
        monkeypatch.setenv(k, v)
    r = ProcessRunner(_settings("slow_user_env:MpirlSlowPole-v0"))
    try:
        r.request(np.zeros(n_params(4, 2, HIDDEN, False), np.float32), 0, 1, 1)
        _result(r, 120)
    finally:
        r.close()
    seen = set(json.loads((user_env / "seen.json").read_text()))
    assert not seen & set(LAUNCHER), sorted(seen & set(LAUNCHER))
    assert {"MPIRL_TEST_KEEP", "PATH", "PYTHONPATH"} <= seen
    assert child_environ({"PMIX_X": "1", "SLURM_JOB_ID": "4"}) == {"SLURM_JOB_ID": "4"}


MPI_MODULE = """
import sys
from mpi4py import MPI
print(f"env module: MPI size {MPI.COMM_WORLD.Get_size()}", file=sys.stderr)
import gymnasium as gym
gym.register("MpirlMpiPole-v0", max_episode_steps=20,
             entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv")
"""
DRIVER = """
import time, numpy as np
from mpi4py import MPI
from mpirl.roles.evaluation import ProcessRunner
from mpirl.agent.qnet import n_params
r = ProcessRunner({"reference": None, "env": "mpi_user_env:MpirlMpiPole-v0", "episodes": 2,
                   "seed": 0, "max_steps": 0, "hidden": [16], "dueling": False, "kwargs": {},
                   "wrappers": []})
r.request(np.zeros(n_params(4, 2, (16,), False), np.float32), 0, 1, 1)
while (res := r.poll()) is None:
    time.sleep(0.02)
r.close()
print("returns", res.returns.tolist())
"""


@pytest.mark.mpi
def test_a_users_env_module_may_import_mpi4py_under_mpirun(tmp_path):
    """A real launch: the learner's rank under mpirun starts the evaluation child, whose env
    module imports mpi4py.  With the launcher's PMI_FD and PMI_RANK inherited, MPICH's child
    aborts in PMI_Init (and the learner with it); without them it is an MPI of one process."""
    import subprocess
    import sys

    from mpirun import mpirun_cmd

    (tmp_path / "mpi_user_env.py").write_text(MPI_MODULE)
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            x for x in (str(tmp_path), os.environ.get("PYTHONPATH")) if x
        ),
    }
    p = subprocess.run(
        [*mpirun_cmd(1), sys.executable, str(tmp_path / "driver.py")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "env module: MPI size 1" in p.stderr and "returns [" in p.stdout, p.stdout + p.stderr
