"""The reference loss: the TD loss of a Q-network on a fixed held-out set of transitions.

The training loss of the two placements is not comparable: each is the importance-weighted loss
of batches sampled differently (from the learner's memory or from a buffer's) at different
stages of training. The reference loss is defined the same way for both: the
*unweighted* loss of `mpirl.agent.dqn.dqn_loss` (double-DQN n-step target, Huber) of the current
online and target networks on a set of transitions that no replay memory ever held, collected
once per environment and seed and stored as ``.npz``.

    python -m mpirl.refloss --env CartPole-v1 --seed 999 --size 10000 --n-step 5 --gamma 0.99 \\
        --out refsets/CartPole-v1-seed999-n5.npz          # prints its sha256

    rs = refloss.load(path, sha256=expected)               # refuses a changed file
    refloss.reference_loss(online, target, rs, huber_delta=cfg.huber_delta)
    # -> {"loss": mean Huber, "td_abs_mean": mean |td|, "n": transitions}

A run computes it with ``--reference-set PATH|auto`` (`resolve`) at every greedy evaluation, in
the evaluation runner, on the weights evaluated used as their own target network
(`reference_loss_self`, numpy): ``/evals/reference_loss``.

Collection: one environment made as the actors make it (`mpirl.agent.envs.make` with the run's
``--env-kwargs`` and ``--env-wrappers``, image rewards clipped to [-1, 1]), reset with ``seed``,
and a policy that is uniform random (default) or epsilon-greedy with a given Q-function; actions
come from ``numpy.random.default_rng(seed)``, so a set depends only on (env, kwargs, wrappers,
seed, size, n_step, gamma, policy) and the library versions. The n-step transitions are built by
the actors' `mpirl.agent.nstep.NStep`, so ``n_step`` and ``gamma`` must be the run's.
``--reference-set auto`` uses `mpirl.seeds.reference`, which no actor's or evaluation's reset
seed equals; a seed picked by hand is one of 2**32 that a run's env resets spread over
(`mpirl.seeds`).

A run accepts a set whose metadata names its env, kwargs, wrappers, n-step and gamma (a set
without ``env_kwargs`` / ``env_wrappers`` in its metadata was collected without any) and whose
observations have the env's shape and dtype; anything else is one error before the run.

The hash: ``sha256`` is over the arrays' contents (name, dtype, shape and bytes of each array,
in name order, the metadata included), not over the file's bytes: ``numpy.savez`` stamps the
zip entries with the time of writing, so two writes of the same set differ as files but not in
this hash. `load` recomputes it and compares.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mpirl import seeds
from mpirl.agent import envs
from mpirl.agent.nstep import ACTION, DISCOUNT, NEXT_OBS, OBS, RETURN, NStep

if TYPE_CHECKING:
    import torch

    from mpirl.agent.envs import EnvSpec
    from mpirl.run.config import Config

__all__ = [
    "RefSet",
    "auto_path",
    "check_fits",
    "collect",
    "content_sha256",
    "env_key",
    "load",
    "reference_loss",
    "reference_loss_self",
    "resolve",
    "save",
]

FORMAT = 1
ARRAYS = ("obs", "action", "reward", "next_obs", "discount")


@dataclass(frozen=True)
class RefSet:
    """n-step transitions ``(obs, action, reward = R, next_obs, discount)`` and how they were
    collected (``meta``: env, env_kwargs, env_wrappers, seed, size, n_step, gamma, policy,
    epsilon, format)."""

    obs: np.ndarray
    action: np.ndarray  # int64
    reward: np.ndarray  # float32, the n-step return
    next_obs: np.ndarray
    discount: np.ndarray  # float32, gamma^k, 0 when the episode terminated
    meta: dict[str, Any]

    def __len__(self) -> int:
        return len(self.action)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {k: getattr(self, k) for k in ARRAYS}
        out["meta_json"] = np.array(json.dumps(self.meta, sort_keys=True))
        return out

    @property
    def sha256(self) -> str:
        return content_sha256(self.arrays())


def content_sha256(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over each array's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def collect(
    env_id: str,
    seed: int,
    size: int,
    n_step: int,
    gamma: float,
    q: Callable[[np.ndarray], np.ndarray] | None = None,
    epsilon: float = 1.0,
    kwargs: dict | None = None,
    wrappers: list[str] | None = None,
) -> RefSet:
    """``size`` n-step transitions from one env, made with ``kwargs`` and ``wrappers`` (see the
    module docstring). Without ``q`` the policy is uniform random; with it, epsilon-greedy on
    ``q(obs_batch) -> Q values``."""
    from gymnasium.spaces import Discrete

    if size < 1:
        raise ValueError(f"size={size} must be >= 1")
    if not 0 <= epsilon <= 1:
        raise ValueError(f"epsilon={epsilon} must be in [0, 1]")
    kwargs, wrappers = dict(kwargs or {}), list(wrappers or [])
    env = envs.make(env_id, seed=seed, kwargs=kwargs, wrappers=wrappers)
    clip = envs.family(env_id) in ("atari", "minatar")  # as EnvSpec.clip_rewards
    assert isinstance(env.action_space, Discrete)  # envs.make checked it
    n_actions = int(env.action_space.n)
    rng = np.random.default_rng(seed)
    nstep = NStep(n_step, gamma)
    obs, _ = env.reset(seed=seed)
    out: list[tuple] = []
    try:
        while len(out) < size:
            if q is None or rng.random() < epsilon:  # explore
                a = int(rng.integers(n_actions))
            else:
                a = int(np.argmax(q(np.asarray(obs)[None])[0]))
            nxt, r, term, trunc, _ = env.step(a)
            if clip:
                r = float(np.clip(float(r), -1.0, 1.0))
            out += nstep.push(obs, a, r, nxt, bool(term), bool(trunc))
            obs = nxt
            if term or trunc:
                obs, _ = env.reset()
    finally:
        env.close()
    out = out[:size]
    meta = {
        "format": FORMAT,
        "env": env_id,
        "env_kwargs": kwargs,
        "env_wrappers": wrappers,
        "seed": int(seed),
        "size": int(size),
        "n_step": int(n_step),
        "gamma": float(gamma),
        "policy": "random" if q is None else "epsilon-greedy",
        "epsilon": 1.0 if q is None else float(epsilon),
        "clip_rewards": clip,
    }
    obs, action, reward, next_obs, discount = (
        [t[i] for t in out] for i in (OBS, ACTION, RETURN, NEXT_OBS, DISCOUNT)
    )
    return RefSet(
        obs=np.stack([np.asarray(x) for x in obs]),
        action=np.array(action, np.int64),
        reward=np.array(reward, np.float32),
        next_obs=np.stack([np.asarray(x) for x in next_obs]),
        discount=np.array(discount, np.float32),
        meta=meta,
    )


def save(refset: RefSet, path: str | Path) -> str:
    """Write ``refset`` as a compressed ``.npz``; return its sha256 (`content_sha256`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = refset.arrays()
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)  # type: ignore[arg-type]  # (stubs: allow_pickle)
    return content_sha256(arrays)


def load(path: str | Path, sha256: str | None = None) -> RefSet:
    """Read a set written by `save` (no pickle); with ``sha256``, refuse one whose contents
    differ."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    missing = [k for k in (*ARRAYS, "meta_json") if k not in arrays]
    if missing:
        raise ValueError(f"{path}: not a reference set (no {', '.join(missing)})")
    got = content_sha256(arrays)
    if sha256 is not None and got != sha256:
        raise ValueError(
            f"{path}: sha256 {got} but {sha256} was expected: the reference set "
            "changed; collect it again or point to the original"
        )
    meta = json.loads(str(arrays.pop("meta_json")))
    return RefSet(meta=meta, **{k: arrays[k] for k in ARRAYS})


def env_key(kwargs: dict | None, wrappers: list[str] | None) -> str:
    """Short hash of the canonical JSON of ``--env-kwargs`` and the ``--env-wrappers`` list
    ("" for neither): runs that differ in them never share an ``auto`` set."""
    kwargs, wrappers = dict(kwargs or {}), list(wrappers or [])
    if not kwargs and not wrappers:
        return ""
    text = json.dumps(
        {"env_kwargs": kwargs, "env_wrappers": wrappers}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def auto_path(
    cache: str | Path,
    env_id: str,
    seed: int,
    size: int,
    n_step: int,
    gamma: float,
    kwargs: dict | None = None,
    wrappers: list[str] | None = None,
) -> Path:
    """Where ``--reference-set auto`` keeps the set of (env, kwargs, wrappers, seed, size,
    n_step, gamma): kwargs and wrappers as `env_key` (``-e<key>``, only when there are any)."""
    key = env_key(kwargs, wrappers)
    name = f"{env_id}{f'-e{key}' if key else ''}-seed{seed}-n{n_step}-g{gamma:g}-{size}"
    return Path(cache) / (name.replace("/", "_").replace(":", "_") + ".npz")


def check_fits(rs: RefSet, path: str | Path, cfg: Config, spec: EnvSpec | None = None) -> None:
    """ValueError naming the mismatch unless ``rs`` was collected on the run's env (id,
    kwargs, wrappers), n-step and gamma, and (with ``spec``, the run's `mpirl.agent.envs.EnvSpec`)
    holds observations of the env's shape and dtype."""
    kwargs = json.loads(json.dumps(dict(cfg.env_kwargs or {})))  # as stored (tuples: lists)
    want = {
        "env": cfg.env,
        "env_kwargs": kwargs,
        "env_wrappers": cfg.wrapper_specs(),
        "n_step": cfg.n_step,
        "gamma": float(cfg.gamma),
    }
    got = {"env_kwargs": {}, "env_wrappers": [], **rs.meta}  # older sets: collected without
    bad = {k: got.get(k) for k, v in want.items() if got.get(k) != v}
    if bad:
        raise ValueError(
            f"reference_set={str(path)!r} was collected with {bad}, the run uses "
            f"{ {k: want[k] for k in bad} }: collect one for this run "
            "(python -m mpirl.refloss) or pass --reference-set auto"
        )
    if spec is not None and (
        rs.obs.shape[1:] != tuple(spec.obs_shape) or rs.obs.dtype != spec.obs_dtype
    ):
        raise ValueError(
            f"reference_set={str(path)!r} holds observations of shape "
            f"{rs.obs.shape[1:]} {rs.obs.dtype}, the run's env {cfg.env!r} gives "
            f"{tuple(spec.obs_shape)} {np.dtype(spec.obs_dtype)}: collect one for "
            "this run (python -m mpirl.refloss) or pass --reference-set auto"
        )


def resolve(
    value: str, cfg: Config, run_dir: str | Path | None, spec: EnvSpec | None = None
) -> tuple[Path, str]:
    """The reference set of a run: ``(path, sha256)`` for ``--reference-set value``.

    ``auto``: the set of `auto_path` in ``<run_dir's parent>/.refsets`` (one cache for the runs
    of a sweep cell or of ``runs/``), collected there on the run's env (its kwargs and wrappers;
    random policy, seed `mpirl.seeds.reference`, --reference-size transitions) when it is not
    there yet; written to a temporary name and renamed, so runs starting together never read
    half a file. A PATH: loaded. Either is checked against the run (`check_fits`; ``spec``: the
    run's env spec, for the observations' shape). Raises ValueError naming the mismatch.
    ``run_dir`` is needed for ``auto`` only."""
    kwargs, wrappers = dict(cfg.env_kwargs or {}), cfg.wrapper_specs()
    if value == "auto":
        assert run_dir is not None, "--reference-set auto needs the run folder"
        seed = seeds.reference(cfg.seed)
        path = auto_path(
            Path(run_dir).resolve().parent / ".refsets",
            cfg.env,
            seed,
            cfg.reference_size,
            cfg.n_step,
            cfg.gamma,
            kwargs,
            wrappers,
        )
        if not path.is_file():
            rs = collect(
                cfg.env,
                seed,
                cfg.reference_size,
                cfg.n_step,
                cfg.gamma,
                kwargs=kwargs,
                wrappers=wrappers,
            )
            tmp = path.with_name(f".{path.stem}.{os.getpid()}.npz")
            save(rs, tmp)
            os.replace(tmp, path)
    else:
        path = Path(value)
        if not path.is_file():
            raise ValueError(
                f"reference_set={value!r}: no such file; write one with python -m "
                "mpirl.refloss or pass --reference-set auto"
            )
    rs = load(path)
    check_fits(rs, path, cfg, spec)
    return path, rs.sha256


def reference_loss(
    online: Callable[[torch.Tensor], torch.Tensor],
    target: Callable[[torch.Tensor], torch.Tensor],
    refset: RefSet,
    huber_delta: float = 1.0,
    chunk: int = 4096,
) -> dict[str, float]:
    """The unweighted `mpirl.agent.dqn.dqn_loss` of ``online`` (with ``target`` for the bootstrap)
    over every transition of ``refset``, in chunks; no gradients, the networks are left as they are.
    Returns the mean Huber loss, the mean |td| and the number of transitions."""
    import torch

    from mpirl.agent.dqn import dqn_loss

    n = len(refset)
    loss_sum = td_sum = 0.0
    with torch.no_grad():
        for i in range(0, n, chunk):
            j = min(n, i + chunk)
            obs = torch.from_numpy(np.ascontiguousarray(refset.obs[i:j]))
            nxt = torch.from_numpy(np.ascontiguousarray(refset.next_obs[i:j]))
            act = torch.from_numpy(refset.action[i:j].astype(np.int64))
            rew = torch.from_numpy(refset.reward[i:j].astype(np.float32))
            disc = torch.from_numpy(refset.discount[i:j].astype(np.float32))
            loss, td = dqn_loss(
                online, target, obs, act, rew, nxt, disc, torch.ones(j - i), huber_delta=huber_delta
            )
            loss_sum += float(loss) * (j - i)
            td_sum += float(td.sum())
    return {"loss": loss_sum / n, "td_abs_mean": td_sum / n, "n": n}


def reference_loss_self(
    q: Callable[[np.ndarray], np.ndarray],
    refset: RefSet,
    huber_delta: float = 1.0,
    chunk: int = 4096,
) -> dict[str, float]:
    """`reference_loss` with one network as both online and target, in numpy on any
    ``q(obs_batch) -> Q values`` (the actors' and evaluator's `mpirl.agent.qnet.NumpyQ`, or the
    torch CNN behind `mpirl.agent.qnet.TorchActorQ`), so the evaluation process needs no torch for
    vector observations: ``a* = argmax_a Q(s', a)``, ``td = Q(s, a) - (R + discount * Q(s', a*))``,
    Huber with ``huber_delta``, unweighted means; ``q_sq_mean`` = mean Q(s, a)^2, the Q scale
    the loss is divided by to compare weights whose values grew by different amounts."""
    n = len(refset)
    loss_sum = td_sum = q_sq_sum = 0.0
    for i in range(0, n, chunk):
        j = min(n, i + chunk)
        rows = np.arange(j - i)
        q_s = np.asarray(q(refset.obs[i:j]), np.float32)
        q_n = np.asarray(q(refset.next_obs[i:j]), np.float32)
        y = refset.reward[i:j] + refset.discount[i:j] * q_n[rows, q_n.argmax(axis=1)]
        q_a = q_s[rows, refset.action[i:j]]
        td = np.abs(q_a - y)
        q_sq_sum += float(np.square(q_a, dtype=np.float64).sum())
        huber = np.where(td <= huber_delta, 0.5 * td * td, huber_delta * (td - 0.5 * huber_delta))
        loss_sum += float(huber.sum(dtype=np.float64))
        td_sum += float(td.sum(dtype=np.float64))
    return {"loss": loss_sum / n, "td_abs_mean": td_sum / n, "q_sq_mean": q_sq_sum / n, "n": n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mpirl.refloss",
        description="Collect a held-out reference set (random policy) and print its sha256.",
    )
    ap.add_argument("--env", required=True, help="gymnasium id, as --env of mpirl.main")
    ap.add_argument(
        "--env-kwargs", default="{}", metavar="JSON", help="the run's --env-kwargs (a JSON object)"
    )
    ap.add_argument(
        "--env-wrappers", default="", metavar="M:F,..", help="the run's --env-wrappers, in order"
    )
    ap.add_argument(
        "--seed",
        type=int,
        required=True,
        help="env and policy seed (mpirl.seeds.reference(--seed) is the run's own)",
    )
    ap.add_argument("--size", type=int, default=10_000, help="transitions")
    ap.add_argument("--n-step", type=int, required=True, help="the run's --n-step")
    ap.add_argument("--gamma", type=float, required=True, help="the run's --gamma")
    ap.add_argument("--out", required=True, help="the .npz to write")
    a = ap.parse_args(argv)
    try:
        kwargs = json.loads(a.env_kwargs)
    except json.JSONDecodeError as e:
        ap.error(f"--env-kwargs {a.env_kwargs!r} is not valid JSON ({e})")
    if not isinstance(kwargs, dict):
        ap.error(f"--env-kwargs {a.env_kwargs!r} must be a JSON object")
    wrappers = [w.strip() for w in a.env_wrappers.split(",") if w.strip()]
    rs = collect(a.env, a.seed, a.size, a.n_step, a.gamma, kwargs=kwargs, wrappers=wrappers)
    digest = save(rs, a.out)
    print(
        f"wrote {a.out}: {len(rs)} transitions of {a.env} (env_kwargs {kwargs}, env_wrappers "
        f"{wrappers}, seed {a.seed}, n-step {a.n_step}, gamma {a.gamma:g}, random policy), "
        f"sha256 {digest}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
