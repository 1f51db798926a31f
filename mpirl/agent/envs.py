"""Gymnasium environments: creation, checks (DQN needs a discrete action space), eval.

``inspect`` is the one place that decides what an observation is (shape, dtype, scaling, and for
image environments the frame that actors, wire and replay memory store once):

==============  ==========================  ====================================================
family          ids                         observation
==============  ==========================  ====================================================
vector          any 1-D Box env             as the env gives it (float32 ...)
Atari           ``ALE/<Game>-v5`` (and the  AtariPreprocessing + FrameStackObservation: no-op
                old ``*NoFrameskip-v4``)    reset (up to 30), frame skip 4 done by the wrapper
                                            (the ALE env runs with frameskip=1), 84x84
                                            grayscale, 4 frames -> uint8 [4, 84, 84]; one frame
                                            is [1, 84, 84]; the net scales by 1/255
MinAtar         ``MinAtar/<Game>-v0|v1``    bool [10, 10, C] transposed to uint8 [C, 10, 10];
                                            Markov already (no stacking); values 0/1, no scaling
==============  ==========================  ====================================================

The user's own environments: ``--env my_pkg.my_module:MyEnv-v0`` (gymnasium imports the module,
which registers the id), ``--env-kwargs`` (passed to ``gymnasium.make``) and ``--env-wrappers``
(callables ``env -> env`` applied in order to what ``gymnasium.make`` returns, before the family's
preprocessing).  Every rank builds its envs through `make`, so a bad module, kwarg or wrapper
fails the same way on every rank during configuration (rank 0 prints it).

Image environments need the optional extra: ``pip install -e ".[images]"``.  Rewards of image
environments are clipped to [-1, 1] by the actors (``EnvSpec.clip_rewards``); episode returns are
logged unclipped.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from mpirl import seeds
from mpirl.errors import ConfigError

if TYPE_CHECKING:  # gymnasium is imported where an env is made (not at import)
    import gymnasium as gym

IMAGES_EXTRA = 'pip install -e ".[images]"'
ATARI_STACK = 4
ATARI_NOOP_MAX = 30
ATARI_FRAME_SKIP = 4
ATARI_SIZE = 84


@dataclass(frozen=True)
class EnvSpec:
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    n_actions: int
    reward_threshold: float | None
    #: "vector", "atari" or "minatar"
    family: str = "vector"
    #: image envs: shape of one stored frame (channels, height, width); an observation is
    #: ``stack`` frames concatenated along axis 0.  None for vector observations.
    frame_shape: tuple[int, ...] | None = None
    stack: int = 1
    #: the network multiplies its input by this (1/255 for 8-bit pixels)
    obs_scale: float = 1.0
    clip_rewards: bool = False

    @property
    def image(self) -> bool:
        return self.frame_shape is not None


def family(env_id: str) -> str:
    """Which preprocessing an id gets (from the id alone: no import needed)."""
    if env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4"):
        return "atari"
    if env_id.startswith("MinAtar/"):
        return "minatar"
    return "vector"


def _need_images_extra(env_id: str, missing: str) -> ConfigError:
    verb = "are" if "," in missing else "is"
    return ConfigError(
        f"env={env_id!r} is an image environment and needs the images extra "
        f"({missing} {verb} not installed): {IMAGES_EXTRA}"
    )


def _register(env_id: str) -> None:
    """Register the image families' gymnasium ids (gymnasium >= 1.0 loads no plugins itself)."""
    fam = family(env_id)
    if fam == "vector":
        return

    names = {"cv2": "opencv-python-headless", "ale_py": "ale-py"}
    mods = (("ale_py", "cv2") if fam == "atari" else ("minatar",)) + ("zstandard",)
    missing = [names.get(m, m) for m in mods if importlib.util.find_spec(m) is None]
    if missing:
        raise _need_images_extra(env_id, ", ".join(missing))
    import gymnasium as gym

    if fam == "atari":
        import ale_py

        gym.register_envs(ale_py)
    elif not any(k.startswith("MinAtar/") for k in gym.envs.registry):
        # minatar imports matplotlib + seaborn for its own display (about 3 s per rank on 2
        # cores); mpirl never renders, so those imports are made to fail fast, then undone.
        blocked = [m for m in ("matplotlib.pyplot", "seaborn") if m not in sys.modules]
        sys.modules.update({m: None for m in blocked})  # type: ignore[misc]  # None blocks it
        level = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # minatar warns that it cannot render
        try:
            from minatar import gym as minatar_gym
        finally:
            for m in blocked:
                sys.modules.pop(m, None)
            logging.getLogger().setLevel(level)
        minatar_gym.register_envs()


class _MinAtarObs:
    """Transpose MinAtar's bool [10, 10, C] to uint8 [C, 10, 10] (channels first, as torch)."""

    @staticmethod
    def wrap(env: gym.Env) -> gym.Env:
        import gymnasium as gym

        assert isinstance(env.observation_space, gym.spaces.Box)  # make() checked it
        h, w, c = env.observation_space.shape
        space = gym.spaces.Box(0, 1, (c, h, w), np.uint8)
        return gym.wrappers.TransformObservation(
            env, lambda o: np.ascontiguousarray(np.transpose(o, (2, 0, 1)), np.uint8), space
        )


def _import_module(module: str, what: str) -> ModuleType:
    """The user's module (ConfigError naming it when it cannot be imported)."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module: any failure is a config error
        raise ConfigError(
            f"{what}: cannot import module {module!r} ({type(e).__name__}: {e}); "
            "it must be importable on every rank (pip install it, or put it on "
            "PYTHONPATH)"
        ) from None


def _import_attr(path: str, what: str) -> Any:
    """``'pkg.mod:name'`` -> the object (ConfigError naming the path when it cannot be had)."""
    module, _, name = path.partition(":")
    obj: Any = _import_module(module, what)
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what}: module {module!r} has no {name!r} (from {path!r})")
        obj = getattr(obj, part)
    return obj


def _gym_make(env_id: str, kwargs: dict) -> gym.Env:
    """gymnasium.make with the user's kwargs; its failures as ConfigErrors that say the fix."""
    import gymnasium as gym

    if ":" in env_id:  # gymnasium imports it too; here its failures get a clear message
        _import_module(env_id.partition(":")[0], f"env={env_id!r}")
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.Error as e:
        raise ConfigError(
            f"env={env_id!r} is not a gymnasium environment id ({e}); pick one "
            "from gymnasium.envs.registry, e.g. --env CartPole-v1"
        ) from None
    except TypeError as e:
        bad = re.search(r"unexpected keyword argument '([^']+)'", str(e))
        if bad and bad.group(1) in kwargs:
            raise ConfigError(
                f"env_kwargs: env={env_id!r} takes no keyword argument "
                f"{bad.group(1)!r} ({e}); check the names its constructor "
                "accepts"
            ) from None
        raise ConfigError(
            f"env={env_id!r} with env_kwargs={kwargs!r}: gymnasium.make failed (TypeError: {e})"
        ) from None


def wrap(env: gym.Env, wrappers: list[str]) -> gym.Env:
    """Apply ``'pkg.mod:fn'`` wrappers in order: ``env = fn(env)``."""
    import gymnasium as gym

    for path in wrappers:
        fn = _import_attr(path, f"env_wrappers: {path!r}")
        if not callable(fn):
            raise ConfigError(
                f"env_wrappers: {path!r} is not callable (it is {fn!r:.60} of "
                f"type {type(fn).__name__}); a wrapper is a function or class "
                "that takes an env and returns one"
            )
        try:
            out = fn(env)
        except Exception as e:  # noqa: BLE001 - the user's code, reported as their config
            raise ConfigError(f"env_wrappers: {path!r} raised {type(e).__name__}: {e}") from None
        if not isinstance(out, gym.Env):
            raise ConfigError(
                f"env_wrappers: {path!r} returned {type(out).__name__}, not a "
                "gymnasium.Env; a wrapper must return the (wrapped) env"
            )
        env = out
    return env


def make(
    env_id: str,
    seed: int | None = None,
    kwargs: dict | None = None,
    wrappers: list[str] | None = None,
    render_mode: str | None = None,
) -> gym.Env:
    """A gymnasium env with mpirl's preprocessing for its family (see the module docstring):
    ``gymnasium.make(env_id, **kwargs)``, then ``wrappers`` in order, then the preprocessing."""
    import gymnasium as gym

    _register(env_id)
    fam = family(env_id)
    kwargs = dict(kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if fam == "atari":
        if kwargs.get("frameskip", 1) != 1:
            raise ConfigError(
                f"env_kwargs: frameskip={kwargs['frameskip']!r} for env={env_id!r}: mpirl's "
                f"Atari preprocessing skips {ATARI_FRAME_SKIP} frames itself (max-pooling the "
                "last two) and needs the ALE env at frameskip=1; remove frameskip from "
                "--env-kwargs"
            )
        kwargs.setdefault("frameskip", 1)  # AtariPreprocessing skips (max-pools 2 frames)
    env = wrap(_gym_make(env_id, kwargs), wrappers or [])
    if not isinstance(env.action_space, gym.spaces.Discrete):
        env.close()
        raise ConfigError(
            f"env={env_id!r} has action space {env.action_space}; DQN needs a "
            "Discrete action space (pick a discrete env, e.g. CartPole-v1)"
        )
    if not isinstance(env.observation_space, gym.spaces.Box):
        env.close()
        raise ConfigError(
            f"env={env_id!r} has observation space {env.observation_space}; "
            "mpirl needs a Box observation space"
        )
    if fam == "atari":
        from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

        env = AtariPreprocessing(
            env,
            noop_max=ATARI_NOOP_MAX,
            frame_skip=ATARI_FRAME_SKIP,
            screen_size=ATARI_SIZE,
            grayscale_obs=True,
            terminal_on_life_loss=False,
            scale_obs=False,
        )
        # padding "reset": the first observation of an episode is 4 copies of the reset frame
        env = FrameStackObservation(env, ATARI_STACK, padding_type="reset")
    elif fam == "minatar":
        env = _MinAtarObs.wrap(env)
    if seed is not None:
        env.action_space.seed(seed)
    return env


def inspect(env_id: str, kwargs: dict | None = None, wrappers: list[str] | None = None) -> EnvSpec:
    from gymnasium.spaces import Box, Discrete

    env = make(env_id, kwargs=kwargs, wrappers=wrappers)
    assert isinstance(env.observation_space, Box) and isinstance(env.action_space, Discrete)
    shape = tuple(env.observation_space.shape)
    dtype = np.dtype(env.observation_space.dtype)
    n_actions = int(env.action_space.n)
    threshold = getattr(env.spec, "reward_threshold", None)
    env.close()
    fam = family(env_id)
    if fam == "atari":
        return EnvSpec(
            shape,
            dtype,
            n_actions,
            threshold,
            family=fam,
            frame_shape=(1,) + shape[1:],
            stack=ATARI_STACK,
            obs_scale=1 / 255,
            clip_rewards=True,
        )
    if fam == "minatar":
        return EnvSpec(
            shape,
            dtype,
            n_actions,
            threshold,
            family=fam,
            frame_shape=shape,
            stack=1,
            obs_scale=1.0,
            clip_rewards=True,
        )
    if len(shape) != 1:
        raise ConfigError(
            f"env={env_id!r} has observation shape {shape}; vector observations "
            "(1-D Box), Atari (ALE/<Game>-v5) and MinAtar (MinAtar/<Game>-v1) are "
            "supported"
        )
    return EnvSpec(shape, dtype, n_actions, threshold)


class Evaluator:
    """Greedy evaluation: ``episodes`` envs stepped in lockstep with one batched forward.

    An episode is cut after ``max_steps`` agent steps (0 = the env's own limit): a greedy Atari
    agent that never presses FIRE in Breakout would otherwise play until the 108,000-frame cap.
    """

    def __init__(
        self,
        env_id: str,
        episodes: int,
        seed: int,
        max_steps: int = 0,
        kwargs: dict | None = None,
        wrappers: list[str] | None = None,
    ) -> None:
        """``seed``: the run's --seed; round ``k`` resets with ``seeds.evaluation(seed, episodes,
        k)``."""
        self.envs = [make(env_id, kwargs=kwargs, wrappers=wrappers) for _ in range(episodes)]
        self.seed = seed
        self.round = 0
        self.max_steps = max_steps

    def run(self, q: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Mean-able array of the episodes' undiscounted returns under argmax q."""
        n = len(self.envs)
        obs = np.stack(
            [
                e.reset(seed=s)[0]
                for e, s in zip(self.envs, seeds.evaluation(self.seed, n, self.round), strict=True)
            ]
        )
        self.round += 1
        returns = np.zeros(n)
        live = np.ones(n, bool)
        steps = 0
        while live.any():
            idx = np.flatnonzero(live)
            actions = q(obs[idx]).argmax(axis=1)
            steps += 1
            for j, a in zip(idx, actions, strict=True):
                o, r, term, trunc, _ = self.envs[j].step(int(a))
                returns[j] += r
                obs[j] = o
                if term or trunc or (self.max_steps and steps >= self.max_steps):
                    live[j] = False
        return returns

    def close(self) -> None:
        for e in self.envs:
            e.close()
