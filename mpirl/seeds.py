"""Every random seed of a run, derived from ``--seed`` in this one place.

Two kinds, disjoint by construction:

* **generator seeds** (torch, replay sampling, link jitter, exploration draws):
  ``SeedSequence(seed, spawn_key=(stream, *index))``, one stream per row below, as a 64-bit
  integer with its top bit set (``>= 2**63``), so none equals an env reset seed;
* **env reset seeds** (actors' envs, evaluation episodes, the reference set): one 32-bit space
  (MinAtar and other envs seed ``numpy.random.RandomState``, which takes ``< 2**32``) in which
  every reset has its own slot ``c``::

      episode i of evaluation round k      c = 3 (k E + i)
      env j of actor a, launch L           c = 3 (L A M + a M + j) + 1
      the reference set                    c = 2

  (``E`` = --eval-episodes; ``A`` actors of ``M`` = --envs-per-actor envs; ``L`` = 0 for a new
  run, the checkpoint id after --resume, so a resumed run starts fresh episodes).  The seed is
  ``(a_S c + b_S) mod 2**32``, ``a_S`` odd, ``a_S, b_S`` from ``SeedSequence(seed,
  spawn_key=(ENV_RESETS,))``: a bijection, so distinct slots get distinct seeds in every run,
  and runs of another ``--seed`` get unrelated ones.

=========================  ==========================================  =========================
rank                       seed                                        drives
=========================  ==========================================  =========================
learner                    generator TORCH                             torch (network init)
learner                    generator REPLAY (rank 0)                   the replay memory's
                                                                       sampling (replay_at=
                                                                       learner)
learner                    generator ARRIVAL                           arrival |td| subsample
learner j > 0 of a group   generator TORCH (j); REPLAY (j)             its network's init, its
                                                                       replay shard's sampling
learner                    env resets, slots 3 (k E + i)               greedy evaluation episodes
learner, link to site s    generator LINK (rank 0, site s) (+ 1        emulated link jitter
                           inbound)
buffer at world rank r     generator REPLAY (r); LINK (r) (+ 1         replay memory sampling,
                           inbound)                                    emulated link jitter
learner (rank 0)           env resets, slot 2                          --reference-set auto: the
                                                                       held-out set's env and
                                                                       random policy
actor at world rank r      generator EXPLORATION (r)                   exploration draws
actor index a, env j       env resets, slot 3 (L A M + a M + j) + 1    env resets, action space
=========================  ==========================================  =========================

Each rank's HDF5 file stores its own as the attribute ``seeds_json`` (of its latest launch; the
learner's ``evaluation`` lists round 0's).  `mpirl.play` seeds episode ``i`` with ``--seed + i``
on its own (a replay, not part of a run).  What the seeds cannot fix: the ranks run
asynchronously, so which experiences reach the replay memory when, which batch the learner
trains next and which weights an actor holds at a step depend on timing; two runs with one seed
share their first weights and first episodes, then drift apart (docs/running.md, "Reproducibility").
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mpirl.run.config import Config
    from mpirl.transport.topology import Topology

# generator streams (the first word of the spawn key)
TORCH, REPLAY, ARRIVAL, LINK, EXPLORATION, ENV_RESETS = 1, 2, 3, 4, 5, 6
# env reset slot classes (c mod 3)
EVALUATION, ACTOR_ENV, REFERENCE = 0, 1, 2
RESET_SLOTS = 1 << 32


def generator(seed: int, stream: int, *index: int) -> int:
    """The seed of generator stream ``(stream, *index)``: 64 bits of
    ``SeedSequence(seed, spawn_key=(stream, *index))`` with the top bit set."""
    words = np.random.SeedSequence(seed, spawn_key=(stream, *index)).generate_state(2)
    return (int(words[1]) << 32 | int(words[0])) | 1 << 63


def env_reset(seed: int, kind: int, x: int) -> int:
    """The env reset seed of slot ``3 x + kind`` (module docstring): ``(a c + b) mod 2**32``."""
    c = 3 * x + kind
    if x < 0 or c >= RESET_SLOTS:
        raise ValueError(
            f"env reset slot x={x} of kind {kind} is outside 0..{RESET_SLOTS // 3}"
            " (more evaluation rounds or resumed launches than 32-bit seeds hold)"
        )
    a, b = _affine(seed)
    return (a * c + b) % RESET_SLOTS


@functools.lru_cache(maxsize=64)
def _affine(seed: int) -> tuple[int, int]:
    """(a odd, b) of the env reset bijection of ``seed``."""
    a, b = np.random.SeedSequence(seed, spawn_key=(ENV_RESETS,)).generate_state(2)
    return int(a) | 1, int(b)


def evaluation(seed: int, episodes: int, rnd: int) -> list[int]:
    """The reset seeds of evaluation round ``rnd``'s ``episodes`` episodes."""
    return [env_reset(seed, EVALUATION, rnd * episodes + i) for i in range(episodes)]


def reference(seed: int) -> int:
    """The seed of the reference set that ``--reference-set auto`` collects (mpirl.refloss)."""
    return env_reset(seed, REFERENCE, 0)


def learner(seed: int, sites: int, eval_episodes: int = 0) -> dict:
    return {
        "torch": generator(seed, TORCH),
        "replay": generator(seed, REPLAY, 0),
        "arrival": generator(seed, ARRIVAL),
        "evaluation": evaluation(seed, eval_episodes, 0),
        "link": [generator(seed, LINK, 0, s) for s in range(sites)],
    }


def group_learner(seed: int, index: int) -> dict:
    """Learner ``index`` > 0 of a learner group (world rank ``index``, below every buffer)."""
    return {"torch": generator(seed, TORCH, index), "replay": generator(seed, REPLAY, index)}


def buffer(seed: int, rank: int) -> dict:
    return {"replay": generator(seed, REPLAY, rank), "link": generator(seed, LINK, rank)}


def actor(
    seed: int, rank: int, index: int, actors: int, envs: int, checkpoint: int | None = None
) -> dict:
    """Actor ``index`` (of ``actors``) at world rank ``rank``; ``checkpoint``: the id this launch
    resumed from (None: a new run)."""
    base = (0 if checkpoint is None else checkpoint) * actors * envs + index * envs
    return {
        "exploration": generator(seed, EXPLORATION, rank),
        "envs": [env_reset(seed, ACTOR_ENV, base + j) for j in range(envs)],
    }


def of_rank(cfg: Config, topo: Topology, checkpoint: int | None = None) -> dict:
    """The seeds of this rank (``topo``: a topology.Topology) in a launch that resumed from
    ``checkpoint`` (None: a new run)."""
    place = topo.place
    if place.role == "learner":
        if place.index > 0:
            return group_learner(cfg.seed, place.index)
        return learner(cfg.seed, cfg.buffers, cfg.eval_episodes)
    if place.role == "buffer":
        return buffer(cfg.seed, place.rank)
    return actor(cfg.seed, place.rank, place.index, topo.n_actors, cfg.envs_per_actor, checkpoint)
