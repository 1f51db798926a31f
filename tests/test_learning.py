"""Learning happens: CartPole-v1 under mpirun -n 5 (1 learner, 1 buffer, 3 actors), greedy
evaluation must rise well above random.

A random policy scores ~22 on CartPole-v1; the test needs a greedy evaluation mean >= 200 within
the time budget, so it fails when learning breaks (wrong target, wrong priorities, stale weights).
"""

import json

import h5py
import numpy as np
import pytest
from mpirun import run_mpirl


@pytest.mark.mpi
@pytest.mark.parametrize("replay_at", ["buffer", "learner"])
def test_cartpole_learns(tmp_path, replay_at):
    run_dir = tmp_path / "run"
    p = run_mpirl(
        5,
        "--replay-at",
        replay_at,
        "--target-return",
        "200",
        "--max-seconds",
        "240",
        "--run-dir",
        str(run_dir),
        "--seed",
        "1",
        timeout=420,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return", p.stdout[-3000:]
    with h5py.File(run_dir / "learner.h5", "r") as f:
        evals = f["evals/ret_mean"][()]
        assert evals.max() >= 200
        assert evals[0] < 100  # it started from (near) random: the rise is real
        # the actors' episode returns rose too, not only the greedy evaluation
    rets, times = [], []
    for a in run_dir.glob("actor-*.h5"):
        with h5py.File(a, "r") as f:
            rets.append(f["episodes/ret"][()])
            times.append(f["episodes/t"][()] + f.attrs["t0_unix"])
    allr = np.concatenate(rets)[np.argsort(np.concatenate(times))]
    assert allr.size > 20
    assert allr[-len(allr) // 5 :].mean() > allr[: len(allr) // 5].mean()
