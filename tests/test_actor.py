"""The actor's per-step bookkeeping against an independent reference, without mpirun: an Actor on
a one-rank communicator steps real CartPole envs, its EXPERIENCE messages are captured, and every
transition is checked against the n-step transitions `mpirl.agent.nstep.NStep` builds from the same
env steps (recorded by a wrapper), with the initial priorities recomputed from the actor's
network."""

from collections import Counter
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
from mpi4py import MPI

from mpirl.agent.envs import inspect
from mpirl.agent.nstep import NStep
from mpirl.fakes import RecordingPort
from mpirl.logs.runlog import RunLog
from mpirl.roles import actor as actor_mod
from mpirl.run.config import Config
from mpirl.transport.topology import layout
from mpirl.transport.wire import Tag


class _Record(gym.Wrapper):
    """Every step as (obs acted on, action, reward, next obs, terminated, truncated)."""

    def __init__(self, env, steps):
        super().__init__(env)
        self.steps, self.obs = steps, None

    def reset(self, **kw):
        self.obs, info = self.env.reset(**kw)
        return self.obs, info

    def step(self, a):
        nxt, r, term, trunc, info = self.env.step(a)
        self.steps.append((self.obs.copy(), int(a), float(r), nxt.copy(), term, trunc))
        self.obs = nxt
        return nxt, r, term, trunc, info


@pytest.mark.parametrize("n_step", [1, 3])
def test_actor_sends_the_n_step_transitions_of_its_env_steps(tmp_path, run_wire, n_step):
    cfg = Config(
        n_step=n_step,
        envs_per_actor=3,
        actor_chunk=16,
        hidden=(16,),
        env_kwargs={"max_episode_steps": 12},
    )  # truncations as well as terminations
    spec, wire = run_wire(cfg, inspect(cfg.env), role="actor")
    topo = SimpleNamespace(site=MPI.COMM_SELF, link=None, place=layout(3, 1)[2], n_actors=1)
    with RunLog(tmp_path / "actor-2.h5", {}, flush_seconds=60) as log:
        port = RecordingPort(wire)
        a = actor_mod.Actor(cfg, topo, spec, wire, log, port)
        recorded = [[] for _ in a.envs]
        a.envs = [_Record(e, rec) for e, rec in zip(a.envs, recorded, strict=True)]
        sent = port.posts  # (tag, buffer, dest)
        a.q.load(np.random.default_rng(1).normal(0, 0.5, a.q.size).astype(np.float32))
        a.weights_version = 0
        a.start_episodes()
        a.tokens = 10**9
        for _ in range(400):
            a.step_envs(*a.act())
            a.ship()
        a.send_chunk(final=True)  # what is left (the open n-step windows stay unsent)

    got = Counter()
    td_sent = []
    for tag, buf, _ in sent:
        assert tag == Tag.EXPERIENCE
        m = wire.unpack(buf, tag)
        rec = m.arrays["records"]
        for i in range(m.count):
            got[
                (
                    rec["obs"][i].tobytes(),
                    int(rec["action"][i]),
                    round(float(rec["reward"][i]), 5),
                    rec["next_obs"][i].tobytes(),
                    round(float(rec["discount"][i]), 5),
                )
            ] += 1
        # the initial priority, recomputed: |R + discount * max_a Q(s') - Q(s, a)|
        q_s = a.q(rec["obs"])[np.arange(m.count), rec["action"]]
        want = np.abs(rec["reward"] + rec["discount"] * a.q(rec["next_obs"]).max(axis=1) - q_s)
        td_sent.append((m.arrays["td_abs"], want))

    expected = Counter()
    for steps in recorded:
        ns = NStep(n_step, cfg.gamma)
        for obs, act, r, nxt, term, trunc in steps:
            for t in ns.push(obs, act, r, nxt, term, trunc):
                expected[
                    (
                        t[0].astype(np.float32).tobytes(),
                        t[1],
                        round(t[2], 5),
                        np.asarray(t[3], np.float32).tobytes(),
                        round(t[4], 5),
                    )
                ] += 1
    assert sum(len(s) for s in recorded) == a.env_steps == 1200
    assert any(s[5] for steps in recorded for s in steps)  # a truncation happened
    assert any(s[4] for steps in recorded for s in steps)  # and a termination
    assert got == expected
    for td, want in td_sent:
        np.testing.assert_allclose(td, want, rtol=1e-4, atol=1e-5)
