"""One frozen, documented configuration, parsed once (CLI, optionally a TOML file), validated once.

Every field's ``help`` metadata is the documentation: ``python -m mpirl.main --help`` prints it and
docs/configuration.md's tables are generated from the same text
(``python -m mpirl.run.config_table``; the ``# --- group ---`` comments below are their sections).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpirl.agent.device import valid_name
from mpirl.transport.link import PROFILES, resolve_profile
from mpirl.transport.topology import check_layout

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from mpirl.errors import ConfigError

__all__ = ["Config", "ConfigError", "build_parser", "parse", "resume_dir", "to_dict"]


def _f(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class Config:
    # --- run -----------------------------------------------------------------------------------
    env: str = _f(
        "CartPole-v1",
        "gymnasium environment id (discrete action space): vector "
        "observations, Atari 'ALE/<Game>-v5' or MinAtar 'MinAtar/<Game>-v1' (images "
        'need pip install -e ".[images]"; see docs/images.md); your own as '
        "'my_pkg.my_module:MyEnv-v0' (gymnasium imports the module, which registers "
        "the id)",
    )
    replay_at: str = _f(
        "buffer",
        "where the prioritized replay memory lives: 'buffer' (at the edge: only prioritized "
        "batches cross the link, priority updates come back) or 'learner' (in the cloud: every "
        "experience crosses the link) or 'thinned' (in the cloud; the buffer forwards each "
        "experience with a probability that grows with its priority, within what the learner "
        "samples (rho) and the link carries, and the learner's importance weights undo it; "
        "--learners 1; docs/design.md) or 'auto' (chosen at start between 'buffer' and "
        "'learner' from the link, measured or emulated, and the rates, by the advisor: python "
        "-m mpirl.advise; the run records the choice)",
        choices=("buffer", "learner", "thinned", "auto"),
    )
    env_kwargs: dict | None = _f(
        None,
        "keyword arguments for gymnasium.make at every actor and at the evaluator: a JSON "
        "object on the command line ('{\"max_episode_steps\": 200}'), a table in --config",
    )
    env_wrappers: str | None = _f(
        None,
        "'pkg.mod:fn[,pkg.mod:fn]': callables env -> env applied in order to the env "
        "gymnasium.make returns (before mpirl's Atari/MinAtar preprocessing), at every actor "
        "and at the evaluator; a list of strings in --config",
    )
    buffers: int = _f(1, "number of edge buffers (sites); actors are split over them")
    seed: int = _f(0, "base random seed; every stream of every rank derives its own (seeds.py)")
    max_env_steps: int = _f(2_000_000, "stop after this many env steps (all actors), 0 = no limit")
    max_seconds: float = _f(600.0, "stop after this many seconds of wall time, 0 = no limit")
    max_updates: int = _f(
        0,
        "stop after this many learner updates (over every launch of a "
        "resumed run), 0 = no limit: a fixed update budget per run",
    )
    target_return: float | None = _f(
        None,
        "stop when the greedy evaluation mean reaches this return (default: the env's "
        "reward_threshold, e.g. 475 for CartPole-v1; 'none' disables it)",
    )
    run_dir: str | None = _f(
        None,
        "folder for this run's HDF5 files (default runs/<time>-<env>-<replay_at>, <time> "
        "from rank 0's clock); must be new or empty: mpirl never overwrites a run",
    )
    progress_seconds: float = _f(5.0, "seconds between progress lines (0 = quiet)")
    flush_seconds: float = _f(
        2.0, "seconds between HDF5 flushes (data since the last flush is lost if a rank is killed)"
    )
    tensorboard: bool = _f(
        False,
        "also write TensorBoard event files mirroring the learner's "
        "logs (RUN_DIR/tensorboard) and each buffer's (RUN_DIR/tensorboard/"
        'buffer-<s>); needs pip install -e ".[tensorboard]"',
    )
    checkpoint_seconds: float = _f(
        300.0,
        "seconds between coordinated checkpoints in RUN_DIR/checkpoint (0 = none on a "
        "cadence); a clean stop (budget, target, SIGTERM/SIGINT) always writes one, so the run "
        "can be continued with --resume",
    )

    # --- DQN -----------------------------------------------------------------------------------
    hidden: tuple[int, ...] = _f(
        (64, 64),
        "hidden layer sizes of the MLP Q-network (vector "
        "observations; image observations get a CNN, see mpirl.agent.qnet)",
    )
    dueling: bool = _f(False, "use a dueling head")
    lr: float = _f(1e-3, "Adam learning rate")
    gamma: float = _f(0.99, "discount factor")
    n_step: int = _f(5, "n-step return length (computed at the actors)")
    batch_size: int = _f(64, "learner batch size")
    target_update: int = _f(200, "learner updates between target-network copies")
    grad_clip: float = _f(10.0, "gradient norm clip (0 = off)")
    huber_delta: float = _f(1.0, "Huber loss delta")

    # --- replay memory -------------------------------------------------------------------------
    replay_capacity: int = _f(
        100_000,
        "replay memory capacity in transitions (refused up "
        "front if the host's available memory cannot hold it)",
    )
    alpha: float = _f(0.6, "priority exponent: p = (|td| + eps)^alpha")
    beta: float = _f(0.4, "importance-weight exponent (annealed to 1 over beta_steps updates)")
    beta_steps: int = _f(20_000, "learner updates over which beta anneals to 1 (0 = fixed)")
    priority_eps: float = _f(1e-3, "added to |td| before the exponent")
    learning_starts: int = _f(1_000, "transitions in the replay memory before sampling starts")
    replay_ratio: float = _f(
        4.0,
        "samples per inserted transition the pipeline holds: actors are throttled (token "
        "control) when the learner falls behind, sampling waits when the actors do "
        "(0 = never throttle)",
    )

    # --- the learner group (docs/design.md, "The learner group") -------------------------------
    learners: int = _f(
        1,
        "learner ranks training one network (the first K world ranks, the "
        "cloud); learner 0 talks to the buffers, evaluates, checkpoints and "
        "decides the stop",
    )
    learner_sync: str = _f(
        "switch",
        "how K > 1 learners combine gradients: 'switch' (allreduce while the learners keep "
        "pace, gba while one straggles: the same hyperparameters in both), 'allreduce' (every "
        "update averages every learner's gradient: global batch K x batch_size), 'async' "
        "(parameter server at learner 0: each gradient applied as it arrives) or 'gba' (learner "
        "0 applies one update per K x batch_size samples of gradients from whichever learners "
        "deliver; stale ones decayed or dropped, see --max-grad-staleness)",
        choices=("allreduce", "async", "gba", "switch"),
    )
    max_grad_staleness: int = _f(
        4,
        "--learner-sync gba: drop a gradient whose token (the update it was meant for) is more "
        "than this many updates old (0 = no bound); see --severe-staleness for its weight",
    )
    severe_staleness: int = _f(
        2,
        "--learner-sync gba: a gradient up to this many updates stale (by its token) counts "
        "in full; beyond, it is scaled by 1/(1+staleness-this) (GBA decays only severe "
        "staleness; 0 = 1/(1+staleness) for every stale gradient)",
    )
    straggle: str | None = _f(
        None,
        "test / bench hook: 'RANK:MS' makes learner RANK sleep MS milliseconds in every "
        "update (a slow worker that does not steal CPU); 'RANK:MS@START-END' only from START to "
        "END seconds after it starts (a straggler that comes and goes); RANK '*': every "
        "learner (learners paced at equal speed)",
    )

    # --- pacing (docs/design.md, "Pacing") ------------------------------------------------------
    actor_steps_per_s: float = _f(
        0.0,
        "env steps per second of each actor rank, all its envs together (a token bucket): "
        "total production P = this x actors, the same in both placements (0 = unpaced)",
    )
    learner_updates_per_s: float = _f(
        0.0,
        "cap on the learner's updates per second (a token bucket), so that samples per "
        "produced transition rho = this x batch_size / P is set by the experiment; use with "
        "--replay-ratio 0 (0 = no cap); the achieved P, U and rho: learner.h5:/progress",
    )

    # --- actors --------------------------------------------------------------------------------
    episodic_life: bool = _f(
        False,
        "Atari: a lost life ends the n-step return (discount 0) "
        "for learning; the game goes on and the logged return is the whole "
        "game's",
    )
    envs_per_actor: int = _f(
        4, "environments per actor rank, stepped in lockstep with one batched policy forward"
    )
    eps_base: float = _f(0.4, "Ape-X exploration: eps_i = eps_base^(1 + eps_alpha * i/(N-1))")
    eps_alpha: float = _f(7.0, "Ape-X exploration exponent (see eps_base)")
    actor_chunk: int = _f(64, "transitions per experience message from an actor")
    actor_credits: int = _f(4, "experience messages an actor may have unacknowledged (tokens)")
    weights_every: str = _f(
        "auto",
        "learner updates between weight broadcasts to the buffers: N, or 'auto' = as "
        "often as keeps weight traffic within --weights-link-share of the slowest link (its "
        "measured rate, the last broadcast's size), at most every 100 updates; a link holds at "
        "most one waiting broadcast (a newer one replaces it); the effective interval: "
        "/progress weights_interval",
    )
    weights_link_share: float = _f(
        0.25,
        "--weights-every auto: the share of the link's rate weight broadcasts may use, in (0, 1]",
    )
    weights_encoding: str = _f(
        "full",
        "weights on the long-haul link: 'full' (float32), 'bf16' (half the bytes), "
        "'delta' (int8 change from what the site holds, zstd; needs the images extra for "
        "zstandard); buffers relay float32 to their actors",
        choices=("full", "bf16", "delta"),
    )
    weights_piece_ms: float = _f(
        50.0,
        "a weight broadcast crosses the long-haul link in pieces of this many ms of link time "
        "(at least 16 KiB; at the emulated rate, else the rate the receiver's acknowledgements "
        "measure), so priorities, credits and STOP wait behind a piece or two, not a whole "
        "broadcast; 0 = whole",
    )
    weights_keyframe_every: int = _f(
        20,
        "--weights-encoding delta: a full keyframe every K "
        "broadcasts to a site (and after a resume or a failed "
        "checksum)",
    )

    # --- the link ------------------------------------------------------------------------------
    site_weights: tuple[float, ...] = _f(
        (),
        "share of the learner's work per site (one weight per buffer; default equal): "
        "replay_at=buffer, which site's batch is trained next; replay_at=learner, which site "
        "gets forward tokens first",
    )
    link: str = _f(
        "none",
        "long-haul link profile between the buffers and the learner: "
        "'none' (the real network) or an emulated one (Link profiles at the end of "
        "--help and in docs/configuration.md)",
    )
    latency_ms: float | None = _f(None, "override the profile's one-way latency (ms)")
    bandwidth_mbps: float | None = _f(None, "override the profile's bandwidth (Mbit/s)")
    jitter_ms: float | None = _f(None, "override the profile's jitter (ms, uniform +-)")
    inflight: str = _f(
        "auto",
        "replay_at=buffer: sampled batches in flight across the link: "
        "1 = synchronous, K = asynchronous window, 'auto' = the smallest window "
        "that keeps the learner busy (measured round trip / update time)",
    )
    max_staleness: int = _f(
        64,
        "replay_at=buffer: drop a priority update whose batch was "
        "sampled more than this many batches ago (0 = no bound); updates "
        "for overwritten slots are always dropped",
    )
    link_change: str | None = _f(
        None,
        "change the link profile during the run: "
        "'SECONDS:PROFILE', e.g. '30:wan-100m-30ms' (messages already "
        "queued leave first, in order)",
    )
    forward_overflow: str = _f(
        "block",
        "replay_at=learner or thinned, forward queue full: 'block' "
        "(backpressure to the actors) or 'drop-oldest' (keeps P; the "
        "fraction delivered: /progress delivered_fraction)",
        choices=("block", "drop-oldest"),
    )
    forward_chunk: int = _f(256, "replay_at=learner or thinned: transitions per forwarded message")
    forward_credits: int = _f(
        8, "replay_at=learner or thinned: forwarded messages in flight per buffer"
    )
    arrival_sample: int = _f(
        64,
        "transitions per message whose |td| under the learner's "
        "network is logged on arrival (/transfers/arrival_*): the same "
        "subsample size in both placements; 0 = not logged",
    )
    compress: str = _f(
        "auto",
        "zstd-compress the experiences that cross the link (FORWARD and "
        "BATCH): 'auto' = on for image observations, off for vectors",
        choices=("auto", "on", "off"),
    )

    # --- evaluation ----------------------------------------------------------------------------
    eval_episodes: int = _f(10, "greedy evaluation episodes (run in lockstep at the learner)")
    eval_every: int = _f(500, "learner updates between greedy evaluations")
    eval_every_s: float = _f(
        0.0,
        "seconds of wall time between greedy evaluations instead (0 = by --eval-every): the "
        "same cadence for every placement, whatever update rate the link leaves each",
    )
    eval_max_steps: int = _f(
        27_000,
        "cut a greedy evaluation episode after this many agent "
        "steps (27,000 = Atari's 30-minute cap; 0 = the env's own limit)",
    )
    evaluator: str = _f(
        "process",
        "where the greedy evaluation runs: 'process' (a child process "
        "of the learner, off the update loop), 'thread' (a thread of the "
        "learner; shares its GIL) or 'inline' (in the update loop, which waits "
        "for it); see docs/design.md",
        choices=("process", "thread", "inline"),
    )

    reference_set: str | None = _f(
        None,
        "the reference loss at every greedy evaluation (logged as /evals/reference_loss): "
        "a .npz written by python -m mpirl.refloss, or 'auto' (rank 0 collects one for --env "
        "with its --env-kwargs and --env-wrappers, --seed, --n-step, --gamma and "
        "--reference-size with a random policy, cached in "
        "<run folder's parent>/.refsets/); default off",
    )
    reference_size: int = _f(10_000, "transitions of an --reference-set auto set")

    # --- resources -----------------------------------------------------------------------------
    torch_threads: int = _f(1, "torch threads per rank")
    device: str = _f(
        "auto",
        "the learner's torch device: 'auto' (cuda when torch sees a GPU), "
        "'cpu', 'cuda' or 'cuda:N'; actors and buffers always run on CPU",
    )
    amp: str = _f(
        "off",
        "mixed precision of the learner's forward/backward on CUDA: 'off' or "
        "'bf16' (autocast; weights and optimizer stay float32)",
        choices=("off", "bf16"),
    )
    config: str | None = _f(None, "TOML file with any of these keys (CLI flags win)")

    # ------------------------------------------------------------------------------------------
    def compress_for(self, image: bool) -> bool:
        """Whether FORWARD / BATCH are compressed in a run with (image) observations."""
        return self.compress == "on" or (self.compress == "auto" and image)

    def wrapper_specs(self) -> list[str]:
        """--env-wrappers as a list of 'module:attr' strings, in the order they are applied."""
        return [w.strip() for w in (self.env_wrappers or "").split(",") if w.strip()]

    @property
    def inflight_fixed(self) -> int | None:
        """The fixed window, or None for 'auto'."""
        return None if self.inflight == "auto" else int(self.inflight)

    def link_change_at(self) -> tuple[float, str] | None:
        """(seconds, profile) of --link-change, or None."""
        if self.link_change is None:
            return None

        secs, _, prof = self.link_change.partition(":")
        try:
            t = float(secs)
        except ValueError:
            t = -1.0
        if t < 0 or prof not in PROFILES:
            raise ConfigError(
                f"link_change={self.link_change!r} must be 'SECONDS:PROFILE' with "
                f"SECONDS >= 0 and PROFILE one of {', '.join(PROFILES)}"
            )
        return t, prof

    def weights_every_fixed(self) -> int | None:
        """--weights-every as a number of updates, None for 'auto'; ConfigError if bad."""
        v = str(self.weights_every)
        if v == "auto":
            return None
        if not (v.isdigit() and int(v) >= 1):
            raise ConfigError(
                f"weights_every={self.weights_every!r} must be 'auto' or an "
                "integer >= 1, e.g. --weights-every 100"
            )
        return int(v)

    def validate(self, world_size: int | None = None) -> None:
        """Raise ConfigError naming the first bad value and the fix."""
        self._validate_numbers()
        self._validate_choices()
        self._validate_modes()
        self.link_change_at()  # raises on a bad --link-change

        resolve_profile(self)  # raises ConfigError on an unknown profile or bad overrides
        if world_size is not None:
            check_layout(world_size, self.buffers, self.learners)

    def _validate_numbers(self) -> None:
        c = self
        pos_int = [
            "buffers",
            "learners",
            "n_step",
            "batch_size",
            "target_update",
            "replay_capacity",
            "envs_per_actor",
            "actor_chunk",
            "actor_credits",
            "weights_keyframe_every",
            "forward_chunk",
            "forward_credits",
            "eval_episodes",
            "eval_every",
            "torch_threads",
            "reference_size",
        ]
        for name in pos_int:
            v = getattr(c, name)
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"{name}={v!r} must be an integer > 0")
        for name in [
            "max_env_steps",
            "max_updates",
            "learning_starts",
            "beta_steps",
            "seed",
            "max_staleness",
            "max_grad_staleness",
            "severe_staleness",
            "eval_max_steps",
            "arrival_sample",
        ]:
            v = getattr(c, name)
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"{name}={v!r} must be an integer >= 0")
        if c.max_grad_staleness and c.severe_staleness >= c.max_grad_staleness:
            raise ConfigError(
                f"severe_staleness={c.severe_staleness} must be below "
                f"max_grad_staleness={c.max_grad_staleness}: every gradient past it is dropped, "
                f"so none would ever be decayed; lower --severe-staleness or raise "
                f"--max-grad-staleness (0 = no bound)"
            )
        for name in ["actor_steps_per_s", "learner_updates_per_s"]:
            v = getattr(c, name)
            if not (isinstance(v, (int, float)) and 0 <= v < float("inf")):
                raise ConfigError(
                    f"{name}={v!r} must be a rate >= 0 per second (0 = unpaced), "
                    f"e.g. --{name.replace('_', '-')} 500"
                )
        for name in [
            "max_seconds",
            "progress_seconds",
            "eval_every_s",
            "grad_clip",
            "replay_ratio",
            "checkpoint_seconds",
        ]:
            if getattr(c, name) < 0:
                raise ConfigError(f"{name}={getattr(c, name)!r} must be >= 0")
        for name in ["lr", "huber_delta", "flush_seconds", "priority_eps"]:
            if not getattr(c, name) > 0:
                raise ConfigError(f"{name}={getattr(c, name)!r} must be > 0")
        if not 0 < c.gamma <= 1:
            raise ConfigError(f"gamma={c.gamma!r} must be in (0, 1]")
        if not 0 <= c.alpha <= 1:
            raise ConfigError(f"alpha={c.alpha!r} must be in [0, 1]")
        if not 0 <= c.beta <= 1:
            raise ConfigError(f"beta={c.beta!r} must be in [0, 1]")
        if not 0 <= c.eps_base <= 1:
            raise ConfigError(f"eps_base={c.eps_base!r} must be in [0, 1]")

    def _validate_choices(self) -> None:
        c = self
        if c.replay_at not in ("buffer", "learner", "thinned", "auto"):  # auto: resolved at start
            raise ConfigError(
                f"replay_at={c.replay_at!r} must be 'buffer', 'learner', 'thinned' or 'auto'"
            )
        if c.replay_at == "thinned" and c.learners != 1:
            raise ConfigError(
                f"replay_at='thinned' needs learners=1, not {c.learners}: a group learner's "
                "shard would not know each slot's forwarding probability; use --replay-at "
                "learner with --learners K"
            )
        if any((not isinstance(h, int)) or h <= 0 for h in c.hidden) or not c.hidden:
            raise ConfigError(
                f"hidden={c.hidden!r} must be one or more positive layer sizes, "
                "e.g. --hidden 256 256"
            )
        if c.batch_size > c.replay_capacity:
            raise ConfigError(
                f"batch_size={c.batch_size} must be <= replay_capacity={c.replay_capacity}"
            )
        if c.learning_starts > c.replay_capacity:
            raise ConfigError(
                f"learning_starts={c.learning_starts} must be <= replay_capacity="
                f"{c.replay_capacity}"
            )
        if c.site_weights and (
            len(c.site_weights) != c.buffers or any(not w > 0 for w in c.site_weights)
        ):
            raise ConfigError(
                f"site_weights={c.site_weights!r} must be {c.buffers} positive "
                f"numbers, one per buffer (--buffers {c.buffers})"
            )
        if c.inflight != "auto" and not (c.inflight.isdigit() and int(c.inflight) >= 1):
            raise ConfigError(f"inflight={c.inflight!r} must be 'auto' or an integer >= 1")

    def _validate_modes(self) -> None:
        c = self
        c.weights_every_fixed()  # raises on a bad --weights-every
        if not c.weights_piece_ms >= 0:
            raise ConfigError(
                f"weights_piece_ms={c.weights_piece_ms!r} must be >= 0 (0: broadcasts go whole), "
                "e.g. --weights-piece-ms 50"
            )
        if not 0 < c.weights_link_share <= 1:
            raise ConfigError(
                f"weights_link_share={c.weights_link_share!r} must be in (0, 1], "
                "e.g. --weights-link-share 0.25"
            )
        if c.weights_encoding not in ("full", "bf16", "delta"):
            raise ConfigError(
                f"weights_encoding={c.weights_encoding!r} must be 'full', 'bf16' or 'delta'"
            )
        # (delta needs zstandard on the learner's and the buffers' hosts: a host check,
        # mpirl.run.resources, not one each rank makes here alone)
        if c.compress not in ("auto", "on", "off"):
            raise ConfigError(f"compress={c.compress!r} must be 'auto', 'on' or 'off'")
        if c.forward_overflow not in ("block", "drop-oldest"):
            raise ConfigError(
                f"forward_overflow={c.forward_overflow!r} must be 'block' or 'drop-oldest'"
            )
        if c.env_kwargs is not None and not isinstance(c.env_kwargs, dict):
            raise ConfigError(
                f"env_kwargs={c.env_kwargs!r} must be a JSON object / TOML table "
                "of keyword arguments for gymnasium.make"
            )
        for w in c.wrapper_specs():
            if not _IMPORT_PATH.match(w):
                raise ConfigError(
                    f"env_wrappers={c.env_wrappers!r}: {w!r} must be "
                    "'module:function', e.g. --env-wrappers mypkg.wrappers:clip"
                )
        if c.evaluator not in ("process", "thread", "inline"):
            raise ConfigError(f"evaluator={c.evaluator!r} must be 'process', 'thread' or 'inline'")

        if not valid_name(c.device):
            raise ConfigError(f"device={c.device!r} must be 'auto', 'cpu', 'cuda' or 'cuda:N'")
        if c.amp not in ("off", "bf16"):
            raise ConfigError(f"amp={c.amp!r} must be 'off' or 'bf16'")
        if c.amp != "off" and c.device == "cpu":
            raise ConfigError(
                f"amp={c.amp!r} needs the learner on CUDA, not device='cpu': pass "
                "--amp off or --device cuda"
            )
        if c.learner_sync not in ("allreduce", "async", "gba", "switch"):
            raise ConfigError(
                f"learner_sync={c.learner_sync!r} must be 'allreduce', 'async', 'gba' or 'switch'"
            )
        if c.straggle is not None:
            try:
                rank = parse_straggle(c.straggle)[0]
            except ValueError:
                rank = -2
            if not (0 <= rank < c.learners or rank == EVERY_LEARNER):
                raise ConfigError(
                    f"straggle={c.straggle!r} must be 'RANK:MS' or 'RANK:MS@START-END' with "
                    f"RANK a learner (0..{c.learners - 1}), MS >= 0 and 0 <= START < END "
                    f"seconds, e.g. --straggle {c.learners - 1}:20 or {c.learners - 1}:20@10-20 "
                    "(RANK '*': every learner)"
                )


_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


#: --straggle '*:MS': every learner (its parse_straggle rank)
EVERY_LEARNER = -1


def parse_straggle(text: str) -> tuple[int, float, float, float]:
    """--straggle 'RANK:MS[@START-END]' -> (learner rank, ms slept per update, start s, end s);
    RANK ``*``: every learner (`EVERY_LEARNER`); ValueError on anything else."""
    rank, sep, rest = text.partition(":")
    ms, at, window = rest.partition("@")
    r, m = (EVERY_LEARNER if rank == "*" else int(rank)), float(ms)
    start, end = (0.0, float("inf"))
    if at:
        a, dash, b = window.partition("-")
        if not dash:
            raise ValueError(text)
        start, end = float(a), float(b)
    if (
        not sep
        or (r < 0 and r != EVERY_LEARNER)
        or not m >= 0
        or m == float("inf")
        or not 0 <= start < end
    ):
        raise ValueError(text)
    return r, m, start, end


# ---------------------------------------------------------------------------------------------
# Parsing: CLI flags (dashes), TOML keys (underscores or dashes), same names.


def _arg_type(f: dataclasses.Field) -> tuple[Callable[[str], Any] | None, str | None]:
    t = str(f.type)
    if "dict" in t:
        return str, None  # JSON text, decoded by `parse` (an error there names the value)
    if "tuple" in t:
        return (float if "float" in t else int), "+"
    if t.startswith("bool"):
        return None, None
    if "int" in t and "float" not in t:
        return int, None
    if "float" in t:
        return _float_or_none if "None" in t else float, None
    return str, None


def _float_or_none(s: str) -> float | None:
    """'none'/'off' -> inf (a target never reached: disabled); else the number."""
    if str(s).lower() in ("none", "off"):
        return float("inf")
    return float(s)


def build_parser() -> argparse.ArgumentParser:
    profiles = ", ".join(f"{k} ({v.describe()})" for k, v in PROFILES.items())
    p = argparse.ArgumentParser(
        prog="python -m mpirl.main",
        description="Distributed DQN with prioritized replay over MPI. Run under mpirun, e.g. "
        "`mpirun -n 9 python -m mpirl.main`: rank 0 is the learner, then each site's buffer "
        "followed by its actors.",
        epilog=f"Link profiles: {profiles}.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        typ, nargs = _arg_type(f)
        kw = {"help": f.metadata["help"], "default": argparse.SUPPRESS, "dest": f.name}
        if "choices" in f.metadata:
            kw["choices"] = f.metadata["choices"]
        if typ is None:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        else:
            p.add_argument(flag, type=typ, nargs=nargs, metavar=f.name.upper(), **kw)
    p.add_argument(
        "--resume",
        default=None,
        dest="resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest complete checkpoint, with "
        "its stored configuration, the same number of ranks, appending to its HDF5 "
        "files; only "
        + ", ".join("--" + k.replace("_", "-") for k in RESUME_FLAGS)
        + " may be given with it (--max-seconds counts this launch)",
    )
    return p


def _from_toml(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config={path!r}: no such file; pass an existing TOML file")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config={path!r} is not valid TOML: {e}") from None
    names = {f.name: f for f in dataclasses.fields(Config)}
    out = {}
    for k, v in data.items():
        key = k.replace("-", "_")
        if key not in names or key == "config":
            raise ConfigError(
                f"config={path!r}: unknown key {k!r}; valid keys are the long "
                "options of --help without the dashes"
            )
        if key in ("hidden", "site_weights"):
            v = tuple(v) if isinstance(v, list) else v
        if key == "env_wrappers" and isinstance(v, list):
            v = ",".join(map(str, v))
        out[key] = v
    return out


#: The flags --resume accepts: when and how the run stops and reports, and the hardware the
#: learner uses (a run checkpointed on a GPU continues on a CPU and the other way round), never
#: what it learns.
RESUME_FLAGS = (
    "max_seconds",
    "max_env_steps",
    "max_updates",
    "target_return",
    "checkpoint_seconds",
    "progress_seconds",
    "flush_seconds",
    "tensorboard",
    "device",
    "amp",
    "evaluator",
)


def resume_dir(argv: list[str] | None = None) -> str | None:
    """RUN_DIR of ``--resume RUN_DIR``, or None (usage errors exit as in `parse`)."""
    return vars(build_parser().parse_args(argv)).get("resume")


def parse(argv: list[str] | None = None, stored: dict | None = None) -> Config:
    """CLI flags (and --config TOML) -> a Config, not yet checked against the world size.

    With ``--resume RUN_DIR``, ``stored`` is the run's stored config (``to_dict`` output, from
    its checkpoint manifest); only `RESUME_FLAGS` may override it.
    """
    parser = build_parser()
    ns = vars(parser.parse_args(argv))
    resume = ns.pop("resume", None)
    values: dict[str, Any] = {}
    if resume is not None:
        if stored is None:
            raise ConfigError("--resume RUN_DIR needs the run's stored configuration")
        bad = [k for k in ns if k not in RESUME_FLAGS]
        if bad:
            raise ConfigError(
                f"--resume continues {resume!r} with its stored configuration; only "
                + ", ".join("--" + k.replace("_", "-") for k in RESUME_FLAGS)
                + " may be given with it, not "
                + ", ".join("--" + k.replace("_", "-") for k in bad)
                + " (start a new run to change them)"
            )
        known = {f.name for f in dataclasses.fields(Config)}
        unknown = sorted(set(stored) - known)
        if unknown:
            raise ConfigError(
                f"--resume {resume!r}: the stored configuration has keys this "
                f"mpirl does not know ({', '.join(unknown)}); resume with the "
                "mpirl version that wrote the run"
            )
        values.update(stored)
        values["run_dir"] = resume
    elif ns.get("config"):
        values.update(_from_toml(ns["config"]))
    values.update(ns)
    for key in ("hidden", "site_weights"):
        if key in values:
            values[key] = tuple(values[key])
    if isinstance(values.get("weights_every"), int) and not isinstance(
        values["weights_every"], bool
    ):
        values["weights_every"] = str(values["weights_every"])  # TOML / stored: a number
    if isinstance(values.get("env_kwargs"), str):  # --env-kwargs JSON
        values["env_kwargs"] = _json_object("env_kwargs", values["env_kwargs"])
    names = {f.name: f for f in dataclasses.fields(Config)}
    for k, v in values.items():  # type checks for TOML values (argparse did the CLI ones)
        typ, nargs = _arg_type(names[k])
        if nargs or k == "env_kwargs":  # env_kwargs: checked by validate
            continue
        if typ is None and not isinstance(v, bool):
            raise ConfigError(f"{k}={v!r} must be true or false")
        if typ is _float_or_none and isinstance(v, str):
            try:
                values[k] = v = _float_or_none(v)
            except ValueError:
                raise ConfigError(f"{k}={v!r} must be a number or 'none'") from None
        if typ in (float, _float_or_none) and isinstance(v, int) and not isinstance(v, bool):
            values[k] = float(v)
        elif typ in (float, _float_or_none) and not isinstance(v, float) and v is not None:
            raise ConfigError(f"{k}={v!r} must be a number")
        elif typ is int and (not isinstance(v, int) or isinstance(v, bool)):
            raise ConfigError(f"{k}={v!r} must be an integer")
        elif typ is str and not isinstance(v, str) and v is not None:
            raise ConfigError(f"{k}={v!r} must be a string")
    cfg = Config(**values)
    cfg.validate()
    return cfg


def _json_object(name: str, text: str) -> dict:
    try:
        v = json.loads(text)
    except ValueError as e:
        raise ConfigError(
            f"{name}={text!r} is not valid JSON ({e}); pass a JSON object, e.g. "
            f"--{name.replace('_', '-')} '{{\"max_episode_steps\": 200}}'"
        ) from None
    if not isinstance(v, dict):
        raise ConfigError(
            f'{name}={text!r} must be a JSON object ({{"name": value, ...}}), '
            f"not a {type(v).__name__}"
        )
    return v


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)
