"""Every random seed of a run, derived from ``--seed`` in this one place.

=========================  ==========================================  =========================
rank                       seed                                        drives
=========================  ==========================================  =========================
learner                    seed                                        torch (network init); the
                                                                       replay memory's sampling
                                                                       (replay_at=learner)
learner                    seed + 10,000, reset with + 7919 * round    greedy evaluation episodes
                           + episode
learner, link to site s    seed + 17 (s + 1) (+ 1 inbound)             emulated link jitter
buffer at world rank r     seed + r (+ 1 inbound on the link)          replay memory sampling,
                                                                       emulated link jitter
learner (rank 0)           seed + 500,009                              --reference-set auto: the
                                                                       held-out set's env and
                                                                       random policy
actor at world rank r      seed + 1000 r                               exploration draws
actor at world rank r,     seed + 1000 r + j (+ 7919 * checkpoint id   env resets, action space
env j                      after --resume: fresh episodes)
=========================  ==========================================  =========================

Each rank's HDF5 file stores its own as the attribute ``seeds_json`` (of its latest launch).
What the seeds cannot fix: the ranks run asynchronously, so which experiences reach the replay
memory when, which batch the learner trains next and which weights an actor holds at a step
depend on timing; two runs with one seed share their first weights and first episodes, then
drift apart (README, "Reproducibility").
"""

from __future__ import annotations

EVAL_OFFSET = 10_000
RESUME_STRIDE = 7919
REFERENCE_OFFSET = 500_009  # no actor's (seed + 1000 r + j) below rank 500


def reference(seed: int) -> int:
    """The seed of the reference set that ``--reference-set auto`` collects (mpirl.refloss)."""
    return seed + REFERENCE_OFFSET


def learner(seed: int, sites: int) -> dict:
    return {"torch": seed, "replay": seed, "evaluation": seed + EVAL_OFFSET,
            "link": [seed + 17 * (s + 1) for s in range(sites)]}


def buffer(seed: int, rank: int) -> dict:
    return {"replay": seed + rank, "link": seed + rank}


def actor(seed: int, rank: int, envs: int, checkpoint: int | None = None) -> dict:
    base = seed + 1000 * rank
    first = base + (0 if checkpoint is None else RESUME_STRIDE * checkpoint)
    return {"exploration": base, "envs": [first + j for j in range(envs)]}


def of_rank(cfg, place, checkpoint: int | None = None) -> dict:
    """The seeds of the rank at ``place`` (a topology.Place) in a launch that resumed from
    ``checkpoint`` (None: a new run)."""
    if place.role == "learner":
        return learner(cfg.seed, cfg.buffers)
    if place.role == "buffer":
        return buffer(cfg.seed, place.rank)
    return actor(cfg.seed, place.rank, cfg.envs_per_actor, checkpoint)
