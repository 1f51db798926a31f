"""The best model of a run: ``RUN_DIR/best.pt``, rewritten whenever a greedy evaluation beats
every earlier one (DQN often gets worse when training goes on past its best policy).

Contents: ``torch.save`` of tensors and plain numbers only, read with
``torch.load(path, weights_only=True)``::

    format   1
    online   the Q-network's state_dict (the keys of the checkpoint's learner.pt "online")
    eval     update, env_steps, ret_mean, ret_std, ret_min, ret_max, episodes, unix (numbers)
             and returns (a float64 tensor, one return per evaluation episode)

Written atomically (temp file, fsync, rename): a kill leaves the previous best.pt or the new one.
``python -m mpirl.play RUN_DIR --checkpoint best`` plays it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from mpirl.run.checkpoint import _fsync_dir, _write_tmp

FILENAME = "best.pt"
FORMAT = 1


def offer(
    run_dir: str | Path, state_dict: dict, returns: np.ndarray, best_so_far: float, **at: int
) -> bool:
    """Write ``state_dict`` as the run's best model if the evaluation ``returns`` beat
    ``best_so_far`` and the best.pt already on disk (a resumed run may have written a better one
    after its checkpoint). ``at``: where the run was (update, env_steps). True if written."""
    mean = float(np.mean(returns))
    if not mean > best_so_far:
        return False
    path = Path(run_dir) / FILENAME
    if path.exists() and mean <= load(path)["eval"]["ret_mean"]:
        return False
    write(path, state_dict, returns, **at)
    return True


def write(path: str | Path, state_dict: dict, returns: np.ndarray, **at: int) -> None:
    import torch

    r = np.asarray(returns, np.float64)
    figures = {
        **{k: int(v) for k, v in at.items()},
        "ret_mean": float(r.mean()),
        "ret_std": float(r.std()),
        "ret_min": float(r.min()),
        "ret_max": float(r.max()),
        "episodes": int(r.size),
        "returns": torch.from_numpy(r.copy()),
        "unix": time.time(),
    }
    state = {"format": FORMAT, "online": dict(state_dict), "eval": figures}
    path = Path(path)
    os.replace(_write_tmp(path, lambda f: torch.save(state, f)), path)
    _fsync_dir(path.parent)


def load(path: str | Path) -> dict:
    """best.pt as written by `write` (tensors and numbers only: weights_only=True)."""
    import torch

    state = torch.load(path, weights_only=True, map_location="cpu")
    if not isinstance(state, dict) or state.get("format") != FORMAT or "online" not in state:
        raise ValueError(f"{path} is not an mpirl best model (format {FORMAT})")
    return state
