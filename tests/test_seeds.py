"""mpirl.seeds: every seed stream of a run is disjoint from every other, at any scale, and each
one is a function of --seed (and the checkpoint a launch resumed from) only."""

import functools
from types import SimpleNamespace

import gymnasium as gym
import numpy as np

from mpirl import seeds
from mpirl.agent.envs import Evaluator
from mpirl.run.config import Config
from mpirl.transport.topology import ACTOR, layout


@functools.cache
def _layout(world: int, buffers: int):
    places = layout(world, buffers)
    return places, sum(p.role == ACTOR for p in places)


def _topo(world: int, buffers: int, rank: int):
    places, actors = _layout(world, buffers)
    return SimpleNamespace(place=places[rank], places=places, n_actors=actors)


def _all_seeds(cfg: Config, world: int, checkpoints: list, rounds: int):
    """(env reset seeds, generator seeds) of every rank of a ``world``-rank run over the launches
    that resumed from ``checkpoints`` (None: the first), and ``rounds`` evaluation rounds."""
    resets, gens = [], []
    for rank in range(world):
        for ckpt in checkpoints:
            s = seeds.of_rank(cfg, _topo(world, cfg.buffers, rank), ckpt)
            resets += s.get("envs", [])
        # generator seeds do not depend on the launch
        gens += [v for k, v in s.items() if k not in ("envs", "evaluation", "link")]
        links = s.get("link", [])
        gens += [x + d for x in (links if rank == 0 else [links] if links else []) for d in (0, 1)]
    resets.append(seeds.reference(cfg.seed))
    for k in range(rounds):
        resets += seeds.evaluation(cfg.seed, cfg.eval_episodes, k)
    return resets, gens


def test_every_reset_and_generator_seed_is_distinct_over_1000_ranks():
    """1000 ranks (10 sites) x 8 envs x a new run and 5 resumes, 2000 evaluation rounds of 10
    episodes, the reference set: 67,000 env resets, no two with one seed, every one a valid
    RandomState seed; the generator seeds (torch, replay, arrival, links both ways, exploration)
    are distinct too and never an env reset seed."""
    cfg = Config(seed=7, buffers=10, envs_per_actor=8, eval_episodes=10)
    resets, gens = _all_seeds(cfg, 1000, [None, 1, 2, 3, 40, 1000], 2000)
    assert len(resets) == 989 * 8 * 6 + 1 + 2000 * 10
    assert len(set(resets)) == len(resets)
    assert all(0 <= s < 2**32 for s in resets)
    assert len(gens) == (3 + 10 * 2) + 10 * (1 + 2) + 989  # learner, buffers, actors
    assert len(set(gens)) == len(gens)
    assert min(gens) >= 2**63 and max(gens) < 2**64  # torch.manual_seed takes up to 2**64 - 1


def test_an_actor_never_plays_the_evaluation_episodes():
    """The overlap of old: evaluation round 0 reset with seed + 10000 + i, the actor at world
    rank 10 its env i with the same seed."""
    cfg = Config(seed=0, buffers=1, envs_per_actor=4, eval_episodes=10)
    evals = {s for k in range(100) for s in seeds.evaluation(cfg.seed, cfg.eval_episodes, k)}
    for rank in range(2, 40):
        envs = seeds.of_rank(cfg, _topo(40, 1, rank))["envs"]
        assert not evals & set(envs), f"rank {rank}"


def test_seeds_are_a_function_of_seed_and_launch():
    """One --seed: the same seeds every time; a resumed launch: fresh env seeds, the same
    exploration stream (its state is restored from the checkpoint); another --seed: others."""
    cfg = Config(seed=3, buffers=2, envs_per_actor=4, eval_episodes=5)
    for rank in range(7):
        assert seeds.of_rank(cfg, _topo(7, 2, rank)) == seeds.of_rank(cfg, _topo(7, 2, rank))
    a0, a1 = (seeds.of_rank(cfg, _topo(7, 2, 6), c) for c in (None, 1))
    assert a0["exploration"] == a1["exploration"] and not set(a0["envs"]) & set(a1["envs"])
    other = Config(seed=4, buffers=2, envs_per_actor=4, eval_episodes=5)
    r3, r4 = _all_seeds(cfg, 7, [None, 1], 10), _all_seeds(other, 7, [None, 1], 10)
    assert not set(r3[0]) & set(r4[0]) and not set(r3[1]) & set(r4[1])


def test_evaluator_resets_with_the_rounds_seeds():
    """Round k of the Evaluator starts from the observations of envs reset with
    seeds.evaluation(seed, episodes, k)."""
    seen = []

    def q(obs):
        if not seen:
            seen.append(obs.copy())
        return np.zeros((len(obs), 2))

    ev = Evaluator("CartPole-v1", 3, seed=11)
    ev.round = 4
    ev.run(q)
    ev.close()
    want = []
    for s in seeds.evaluation(11, 3, 4):
        env = gym.make("CartPole-v1")
        want.append(env.reset(seed=s)[0])
        env.close()
    np.testing.assert_array_equal(seen[0], np.stack(want))


def test_every_learner_of_a_group_has_its_own_generator_seeds():
    """--learners 3: the other learners' torch and replay seeds come from mpirl.seeds like
    every other rank's, distinct from the lead's, the buffers' and each other's."""
    cfg = Config(seed=5, buffers=2, learners=3, envs_per_actor=2, eval_episodes=5)
    places = layout(12, cfg.buffers, learners=cfg.learners)
    n_actors = sum(p.role == ACTOR for p in places)
    gens = []
    for p in places:
        s = seeds.of_rank(cfg, SimpleNamespace(place=p, places=places, n_actors=n_actors))
        gens += [v for k, v in s.items() if k not in ("envs", "evaluation", "link")]
    assert len(gens) == 3 + 2 * 2 + 2 * 1 + n_actors  # lead, other learners, buffers, actors
    assert len(set(gens)) == len(gens)
