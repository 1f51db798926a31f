"""What a run's replay memory is, decided once from the config and the env spec (no MPI)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from mpirl.agent.frames import frames_per_transition as fpt
from mpirl.agent.frames import record_dtype as frame_record
from mpirl.replay.frames import FrameReplay, frame_footprint_bytes
from mpirl.replay.memory import PrioritizedReplay, footprint_bytes
from mpirl.transport.wire import transition_dtype

if TYPE_CHECKING:
    import numpy as np

    from mpirl.agent.envs import EnvSpec
    from mpirl.replay.frames import FrameReplay
    from mpirl.replay.memory import PrioritizedReplay
    from mpirl.run.config import Config


def record_dtype(cfg: Config, spec: EnvSpec) -> np.dtype:
    """The run's record dtype: whole transitions for vectors, frame indices for images."""
    if spec.image:
        return frame_record(spec.stack)

    return transition_dtype(spec.obs_shape, spec.obs_dtype)


def frames_per_transition(cfg: Config, spec: EnvSpec) -> float:
    return fpt(spec.stack, cfg.n_step, cfg.envs_per_actor, cfg.actor_chunk)


def beta_at(cfg: Config, updates: int) -> float:
    """The importance-weight exponent after ``updates`` learner updates: ``beta`` annealed
    linearly to 1 over ``beta_steps`` updates.  The learner's update count decides it wherever
    the memory lives (the buffers learn it from PRIORITIES and WEIGHTS)."""
    if cfg.beta_steps == 0:
        return cfg.beta
    return min(1.0, cfg.beta + (1 - cfg.beta) * updates / cfg.beta_steps)


def shard_config(cfg: Config, learners: int) -> Config:
    """The config of one learner's replay shard (replay at the learner, ``--learners K``):
    capacity / K each."""
    if learners == 1:
        return cfg
    return dataclasses.replace(cfg, replay_capacity=math.ceil(cfg.replay_capacity / learners))


def make_replay(
    cfg: Config, spec: EnvSpec, record: np.dtype, seed: int
) -> PrioritizedReplay | FrameReplay:
    """The prioritized replay memory of a run (buffer or learner, whichever holds it)."""
    if spec.frame_shape is not None:  # spec.image
        return FrameReplay(
            cfg.replay_capacity,
            spec.stack,
            spec.frame_shape,
            frames_per_transition(cfg, spec),
            alpha=cfg.alpha,
            beta=cfg.beta,
            eps=cfg.priority_eps,
            seed=seed,
        )
    return PrioritizedReplay(
        cfg.replay_capacity, record, alpha=cfg.alpha, beta=cfg.beta, eps=cfg.priority_eps, seed=seed
    )


def replay_footprint(cfg: Config, spec: EnvSpec) -> int:
    if spec.frame_shape is not None:  # spec.image
        return frame_footprint_bytes(
            cfg.replay_capacity, spec.stack, spec.frame_shape, frames_per_transition(cfg, spec)
        )
    return footprint_bytes(cfg.replay_capacity, record_dtype(cfg, spec))


#: Image runs: the frame ring is sized for the expected frames per transition, and short
#: episodes or uneven env streams carry more (9% more with 6-step MinAtar episodes at --n-step 1),
#: which keeps ``len(memory)`` below the capacity for good (retirement).  --learning-starts must
#: leave this much room, or sampling never starts while the actors wait for it.
FRAME_HEADROOM = 0.10


def max_learning_starts(cfg: Config, spec: EnvSpec) -> int:
    """The largest --learning-starts the replay memory is sure to reach.

    Vectors: the capacity.  Images: 90% of it (FRAME_HEADROOM) less one message (retirement
    frees whole messages: an actor's ``actor_chunk``, or a FORWARD of ``forward_chunk`` at the
    learner)."""
    if not spec.image:
        return cfg.replay_capacity
    group = cfg.actor_chunk if cfg.replay_at == "buffer" else cfg.forward_chunk
    return max(0, int(cfg.replay_capacity * (1 - FRAME_HEADROOM)) - group)
