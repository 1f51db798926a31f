"""Play a run's greedy policy, record videos of it, export its Q-network; no MPI needed::

    python -m mpirl.play RUN_DIR [--checkpoint best|latest|ID] [--episodes 10] [--seed 0]
                         [--video DIR] [--export PATH [--format torchscript|onnx]]
    mpirl play RUN_DIR ...            (the same through the console script)

The env and the network are rebuilt from the run's stored config (``learner.h5``'s
``config_json``): ``--env``, ``--env-kwargs``, ``--env-wrappers``, ``--hidden``, ``--dueling``, and
the Atari/MinAtar preprocessing of training.  Weights: ``best`` = ``RUN_DIR/best.pt`` (see
mpirl.roles.best_model), ``latest`` = the newest complete checkpoint, ``ID`` = checkpoint ID; by
default ``best`` when the run has one, else ``latest``.  The policy is argmax Q under mpirl's own
acting network (numpy MLP for vectors, the torch CNN for images), as the learner's greedy
evaluation; episode ``i`` is reset with seed ``--seed + i``, so a play is repeatable.

``--export PATH`` writes the Q-network: TorchScript (``torch.jit.load(PATH)``) or ONNX
(``--format onnx``, needs ``pip install -e ".[export]"``).  Input: a batch of observations as
the env gives them after mpirl's preprocessing (float32 ``[N, *obs]`` for vectors, uint8
``[N, C, H, W]`` for images: the network scales pixels itself); output: Q-values float32
``[N, actions]``; the greedy action is their argmax.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mpirl.agent import envs
from mpirl.agent.qnet import make_learner_q, make_q
from mpirl.logs.runlog import open_for_reading
from mpirl.roles import best_model
from mpirl.run import checkpoint
from mpirl.run.config import ConfigError, parse

if TYPE_CHECKING:
    import gymnasium as gym

    from mpirl.agent.envs import EnvSpec
    from mpirl.agent.qnet import NumpyQ, TorchActorQ, TorchQNet
    from mpirl.run.config import Config

VIDEO_EXTRA = 'pip install -e ".[video]"'
EXPORT_EXTRA = 'pip install -e ".[export]"'


class PlayError(ValueError):
    """A run folder, checkpoint or option that cannot be played; the text says the fix."""


def run_config(run_dir: str | Path) -> Config:
    """The run's stored Config (learner.h5's config_json, else the newest checkpoint's)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PlayError(f"{str(run_dir)!r} is not a run folder")
    stored = None
    if (run_dir / "learner.h5").is_file():
        with open_for_reading(run_dir / "learner.h5") as f:
            stored = json.loads(f.attrs["config_json"])
    else:
        man, _ = checkpoint.ids(run_dir)
        if man:
            p = checkpoint.root(run_dir) / f"manifest-{man[-1]:06d}.json"
            stored = json.loads(p.read_text())["config"]
    if stored is None:
        raise PlayError(f"{run_dir} has no learner.h5 and no checkpoint: not an mpirl run folder")
    try:
        return parse(["--resume", str(run_dir)], stored=stored)
    except ConfigError as e:
        raise PlayError(f"{run_dir}: stored configuration: {e}") from None


def load_weights(run_dir: str | Path, which: str | None) -> tuple[dict, str]:
    """(the Q-network's state_dict, a line saying where it came from)."""
    run_dir = Path(run_dir)
    best = run_dir / best_model.FILENAME
    if which is None:
        which = "best" if best.is_file() else "latest"
    if which == "best":
        if not best.is_file():
            raise PlayError(
                f"{best} does not exist (the run has not finished a greedy evaluation "
                "yet); use --checkpoint latest or a checkpoint id"
            )
        try:
            state = best_model.load(best)
        except Exception as e:  # noqa: BLE001 - unreadable = corrupt, said once
            raise PlayError(f"{best} cannot be read ({type(e).__name__}: {e})") from None
        ev = state["eval"]
        return state["online"], (
            f"best.pt: update {ev['update']:,}, env steps "
            f"{ev['env_steps']:,}, eval {ev['ret_mean']:.1f} +- "
            f"{ev['ret_std']:.1f} over {ev['episodes']} episodes"
        )
    if which == "latest":
        ckpt_id = None
    elif which.isdigit():
        ckpt_id = int(which)
    else:
        raise PlayError(f"--checkpoint {which!r} must be 'best', 'latest' or a checkpoint id")
    try:
        got, tensors = checkpoint.learner_tensors(run_dir, ckpt_id)
    except checkpoint.CheckpointError as e:
        raise PlayError(str(e)) from None
    return tensors["online"], f"checkpoint {got}"


def networks(
    cfg: Config, spec: EnvSpec, state_dict: dict
) -> tuple[TorchQNet, NumpyQ | TorchActorQ]:
    """(the torch Q-network with these weights, mpirl's acting network with the same)."""
    net = make_learner_q(spec, cfg.hidden, cfg.dueling)
    try:
        net.load_state_dict(state_dict)
    except RuntimeError as e:
        raise PlayError(f"the weights do not fit the run's network ({e})") from None
    net.eval()
    q = make_q(spec, cfg.hidden, cfg.dueling, threads=None)
    q.load(net.flat_params())
    return net, q


def _minatar_frames(env: gym.Env) -> gym.Env:
    """MinAtar's own rendering needs matplotlib and seaborn; this draws the observation instead:
    each channel in its own colour (the last set channel wins), 16 x 16 pixels per cell."""
    import gymnasium as gym

    class MinAtarFrames(gym.Wrapper):
        render_mode = "rgb_array"

        def __init__(self, env: gym.Env) -> None:
            super().__init__(env)
            self.metadata = {**env.metadata, "render_fps": 15}
            shape = env.observation_space.shape
            assert shape is not None  # a Box: envs.make checked it
            c = shape[0]
            hues = np.linspace(0, 1, c, endpoint=False)
            self.palette = (
                np.stack(
                    [np.abs(hues * 6 - 3) - 1, 2 - np.abs(hues * 6 - 2), 2 - np.abs(hues * 6 - 4)],
                    1,
                ).clip(0, 1)
                * 255
            )
            self.obs: Any = None

        def reset(self, **kw: Any) -> tuple[Any, dict[str, Any]]:
            self.obs, info = self.env.reset(**kw)
            return self.obs, info

        def step(self, action: Any) -> tuple:
            self.obs, *rest = self.env.step(action)
            return (self.obs, *rest)

        def render(self) -> np.ndarray:
            o = np.asarray(self.obs) > 0  # [C, H, W]
            img = np.zeros((*o.shape[1:], 3), np.uint8)
            for ch in range(o.shape[0]):
                img[o[ch]] = self.palette[ch].astype(np.uint8)
            return img.repeat(16, 0).repeat(16, 1)

    return MinAtarFrames(env)


def make_env(cfg: Config, spec: EnvSpec, video: str | Path | None = None) -> gym.Env:
    """The run's env as its actors build it; with ``video``, every episode recorded there."""
    if video is None:
        return envs.make(cfg.env, kwargs=cfg.env_kwargs, wrappers=cfg.wrapper_specs())
    if importlib.util.find_spec("moviepy") is None:
        raise PlayError(f"--video needs moviepy (the video extra): {VIDEO_EXTRA}")

    from gymnasium.wrappers import RecordVideo

    for var in ("SDL_VIDEODRIVER", "SDL_AUDIODRIVER"):  # pygame renders off-screen, no sound
        os.environ.setdefault(var, "dummy")
    if spec.family == "minatar":
        env = _minatar_frames(
            envs.make(cfg.env, kwargs=cfg.env_kwargs, wrappers=cfg.wrapper_specs())
        )
    else:
        env = envs.make(
            cfg.env, kwargs=cfg.env_kwargs, wrappers=cfg.wrapper_specs(), render_mode="rgb_array"
        )
    return RecordVideo(
        env, str(video), episode_trigger=lambda _: True, name_prefix="mpirl", disable_logger=True
    )


def play(
    env: gym.Env,
    q: Callable[[np.ndarray], np.ndarray],
    episodes: int,
    seed: int,
    max_steps: int = 0,
    say: Callable[[str], object] = print,
    observations: list | None = None,
) -> np.ndarray:
    """Greedy episodes (argmax q); returns their undiscounted returns. Episode i is reset with
    seed + i and cut after max_steps agent steps (0 = the env's own limit); ``observations``
    collects every observation acted on."""
    returns = np.zeros(episodes)
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        steps, done = 0, False
        while not done:
            if observations is not None:
                observations.append(obs)
            a = int(q(np.asarray(obs)[None])[0].argmax())
            obs, r, term, trunc, _ = env.step(a)
            returns[i] += float(r)
            steps += 1
            done = term or trunc or bool(max_steps and steps >= max_steps)
        say(f"episode {i + 1:3d}: return {returns[i]:9.1f}  ({steps:,} steps)")
    return returns


def export(
    net: TorchQNet,
    spec: EnvSpec,
    path: str | Path,
    fmt: str = "torchscript",
    info: dict | None = None,
) -> Path:
    """Write ``net`` as TorchScript or ONNX (see the module docstring for input and output)."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    example = torch.zeros((2, *spec.obs_shape), dtype=torch.uint8 if spec.image else torch.float32)
    if fmt == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's deprecation notice
            traced = torch.jit.trace(net, example)
            torch.jit.save(traced, str(path), _extra_files={"mpirl.json": json.dumps(info or {})})
        return path
    if fmt != "onnx":
        raise PlayError(f"--format {fmt!r} must be 'torchscript' or 'onnx'")
    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        raise PlayError(
            f"--format onnx needs {' and '.join(missing)} (the export extra): {EXPORT_EXTRA}"
        )

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (example,),
            str(path),
            input_names=["obs"],
            output_names=["q_values"],
            dynamo=True,
            dynamic_shapes=({0: torch.export.Dim("batch")},),
        )
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mpirl.play",
        description=__doc__.split("\n\n")[0].rstrip(":"),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (--run-dir of the run)")
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="best|latest|ID",
        help="whose weights: RUN_DIR/best.pt, the newest checkpoint or checkpoint ID "
        "(default: best if the run has one, else latest)",
    )
    p.add_argument(
        "--episodes",
        type=int,
        default=10,
        help="greedy episodes to play (0: none, e.g. only --export)",
    )
    p.add_argument("--seed", type=int, default=0, help="episode i is reset with seed SEED + i")
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="cut an episode after this many "
        "agent steps (default: the run's --eval-max-steps; 0 = the env's own limit)",
    )
    p.add_argument(
        "--video",
        default=None,
        metavar="DIR",
        help="record every episode as an mp4 "
        f"in DIR (gymnasium's RecordVideo; needs {VIDEO_EXTRA})",
    )
    p.add_argument("--export", default=None, metavar="PATH", help="write the Q-network to PATH")
    p.add_argument(
        "--format",
        default="torchscript",
        choices=("torchscript", "onnx"),
        help=f"format of --export (onnx needs {EXPORT_EXTRA})",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from gymnasium.error import DependencyNotInstalled

    try:
        if args.episodes < 0:
            raise PlayError(f"--episodes {args.episodes} must be >= 0")
        cfg = run_config(args.run_dir)
        spec = envs.inspect(cfg.env, cfg.env_kwargs, cfg.wrapper_specs())
        state, source = load_weights(args.run_dir, args.checkpoint)
        net, q = networks(cfg, spec, state)
        shape = "x".join(map(str, spec.obs_shape))
        print(
            f"mpirl play: {args.run_dir}: {cfg.env} ({spec.family} observations {shape}, "
            f"{spec.n_actions} actions); weights from {source}",
            flush=True,
        )
        if args.export:
            info = {
                "env": cfg.env,
                "obs_shape": list(spec.obs_shape),
                "obs_dtype": "uint8" if spec.image else "float32",
                "n_actions": spec.n_actions,
                "weights": source,
            }
            path = export(net, spec, args.export, args.format, info)
            print(
                f"exported {args.format} to {path}: input obs {info['obs_dtype']} [N, {shape}]"
                f" -> Q-values float32 [N, {spec.n_actions}]; greedy action = argmax",
                flush=True,
            )
        if args.episodes:
            env = make_env(cfg, spec, args.video)
            max_steps = cfg.eval_max_steps if args.max_steps is None else args.max_steps
            try:
                rets = play(
                    env, q, args.episodes, args.seed, max_steps, say=lambda s: print(s, flush=True)
                )
            finally:
                env.close()
            print(
                f"mean return {rets.mean():.1f} +- {rets.std():.1f} over {args.episodes} "
                f"episodes (seed {args.seed}, min {rets.min():.1f}, max {rets.max():.1f})"
            )
            if args.video:
                print(f"videos in {args.video}")
    except (PlayError, ConfigError) as e:
        print(f"mpirl play: error: {e}", file=sys.stderr)
        return 2
    except DependencyNotInstalled as e:  # e.g. pygame, to render CartPole for --video
        print(
            f"mpirl play: error: {e} (the video extra brings moviepy and pygame: {VIDEO_EXTRA})",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
