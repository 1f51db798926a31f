"""Bytes per transition on the long-haul link, per placement, for any env: what a sweep spec's
bandwidth axis is calibrated with (a pilot to calibrate bytes per transition).

    python experiments/link_bytes.py --env MinAtar/Breakout-v1 [--steps 3000]
                                     [--compress on|off|auto]

One process, no mpirun: an `mpirl.roles.actor.Actor` steps the env with its own exploration (a zero
network, so greedy = action 0, and the actor's Ape-X epsilons) and packs its EXPERIENCE messages
as in a run; the buffer's `ForwardQueue` cuts them into FORWARD messages (replay_at=learner, what
the existing placement sends) and a prioritized memory samples BATCH messages (replay_at=buffer,
what the proposed placement sends), each packed and, for image envs or ``--compress on``,
compressed exactly as a run packs them.  Trained policies make longer, busier episodes, so image
frames compress somewhat less than here; every run logs its own bytes (learner.h5:/transfers).

Then the link a placement needs at a production rate P (env steps/s) and an update rate U:
existing ~ P x FORWARD bytes x 8, proposed ~ U x BATCH bytes x 8 (+ the priorities coming back).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

MIN_STEPS = 1000  # a few FORWARD messages of 256 transitions and a memory to sample from


def measure(env: str, steps: int, compress: str = "auto") -> dict:
    from mpi4py import MPI

    from mpirl.agent.envs import inspect
    from mpirl.fakes import RecordingPort
    from mpirl.logs.runlog import RunLog
    from mpirl.replay.build import make_replay, record_dtype
    from mpirl.roles import actor as actor_mod
    from mpirl.roles.placements.at_learner import ForwardQueue
    from mpirl.run.config import Config
    from mpirl.transport.topology import layout
    from mpirl.transport.wire import Tag
    from mpirl.wiring import make_wire

    cfg = Config(env=env, compress=compress)
    spec = inspect(cfg.env)
    wire = make_wire(cfg, spec, record_dtype(cfg, spec))
    topo = SimpleNamespace(site=MPI.COMM_SELF, link=None, place=layout(3, 1)[2], n_actors=1)
    with (
        tempfile.TemporaryDirectory() as tmp,
        RunLog(Path(tmp) / "actor.h5", {}, flush_seconds=600) as log,
    ):
        port = RecordingPort(wire)  # mpirl.fakes: posts captured, not sent
        actor = actor_mod.Actor(cfg, topo, spec, wire, log, port)
        actor.weights_version, actor.tokens = 0, 10**9
        actor.start_episodes()
        while actor.env_steps < steps:
            actor.step_envs(*actor.act())
            actor.ship()
    sent = [buf for _, buf, _ in port.posts]
    msgs = [wire.unpack(b, Tag.EXPERIENCE) for b in sent]
    n = sum(m.count for m in msgs)
    queue = ForwardQueue(wire, spec, limit=10**7, drop_oldest=True)
    memory = make_replay(cfg, spec, wire.record, seed=0)
    for m in msgs:
        args = (m.records, m.td_abs, m.frames)
        queue.add(*args)
        memory.add(*args)
    fwd = fwd_raw = fwd_n = 0
    while queue.len >= cfg.forward_chunk:
        rec, td, table = queue.take(cfg.forward_chunk)
        fwd += wire.forward(rec, td, 0, frames=table).nbytes
        fwd_raw += wire.last_raw_nbytes
        fwd_n += len(rec)
    bat, bat_raw = [], []
    for i in range(200):
        bat.append(wire.batch(memory.sample(cfg.batch_size), i, 0.0).nbytes)
        bat_raw.append(wire.last_raw_nbytes)
    return {
        "env": env,
        "compress": wire.compress,
        "transitions": n,
        "experience_B": sum(b.nbytes for b in sent) / n,
        "forward_B": fwd / fwd_n,
        "forward_raw_B": fwd_raw / fwd_n,
        "batch_B": float(np.mean(bat)) / cfg.batch_size,
        "batch_raw_B": float(np.mean(bat_raw)) / cfg.batch_size,
        "batch_size": cfg.batch_size,
        "forward_chunk": cfg.forward_chunk,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--steps", type=int, default=3000, help="env steps to pack (default 3000)")
    ap.add_argument("--compress", choices=("auto", "on", "off"), default="auto")
    a = ap.parse_args(argv)
    if a.steps < MIN_STEPS:
        ap.error(
            f"--steps {a.steps} is too few: FORWARD messages hold 256 transitions and the "
            f"memory needs some to sample; use --steps {MIN_STEPS} or more"
        )
    from mpirl.errors import ConfigError

    try:
        r = measure(a.env, a.steps, a.compress)
    except ConfigError as e:  # an unknown env id, a missing extra: mpirl's own message
        print(f"link_bytes: {e}", file=sys.stderr)
        return 2
    print(
        f"| {r['env']} (compress {'on' if r['compress'] else 'off'}) | bytes per transition |\n"
        f"|---|---|\n"
        f"| actor -> buffer, EXPERIENCE | {r['experience_B']:.1f} |\n"
        f"| existing: FORWARD of {r['forward_chunk']} | {r['forward_B']:.1f} "
        f"(packed {r['forward_raw_B']:.1f}) |\n"
        f"| proposed: BATCH of {r['batch_size']} | {r['batch_B']:.1f} "
        f"(packed {r['batch_raw_B']:.1f}) |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
