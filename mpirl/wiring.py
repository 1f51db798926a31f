"""Who talks to whom, and which parts each role is handed: built once per rank.

`connect` gives a rank its ends of the networks; `build_learner`, `build_buffer` and
`build_worker` build a role from its parts, picking the placement of the replay memory
(``--replay-at``, `mpirl.roles.placements`) and the learner group's sync (``--learners``,
``--learner-sync``, `mpirl.transport.group`) here and nowhere else; `run_role` runs this rank's
role.  Tests and benches build their roles with the same functions, over fake ends
(`mpirl.fakes`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from mpirl import advise, seeds
from mpirl.agent import device as device_mod
from mpirl.agent import qnet
from mpirl.agent.train_step import TrainStep
from mpirl.errors import ConfigError
from mpirl.logs import schema
from mpirl.roles.actor import Actor
from mpirl.roles.buffer import Buffer, BufferParts, RawBytes
from mpirl.roles.evaluation import make_runner
from mpirl.roles.group_lead import Group, LeadGroup, NoGroup
from mpirl.roles.learner import CKPT_TIMEOUT_S, Learner, LearnerParts
from mpirl.roles.learner_parts import Evaluation, LearnerCheckpoint, Report
from mpirl.roles.learner_rows import Arrivals, HeldRows
from mpirl.roles.learner_state import LearnerState
from mpirl.roles.learner_worker import GroupWorker
from mpirl.roles.placements import pick
from mpirl.roles.placements.common import LearnerContext, Site, SiteContext
from mpirl.run import failure
from mpirl.run.checkpoint import part_name, write_allowance_s
from mpirl.run.config import EVERY_LEARNER, parse_straggle
from mpirl.transport import probe
from mpirl.transport.cut import Cut
from mpirl.transport.group import LocalSync, make_syncs
from mpirl.transport.inbox import Inbox, SitePort
from mpirl.transport.link import PROFILES, LinkEnd, resolve_profile
from mpirl.transport.pacing import TokenBucket
from mpirl.transport.topology import ACTOR, BUFFER, Ends, layout
from mpirl.transport.waiting import Backoff
from mpirl.transport.weight_sync import WeightSync
from mpirl.transport.wire import ALLREDUCE, SUBMIT, Wire

if TYPE_CHECKING:
    from collections.abc import Callable

    from mpi4py import MPI

    from mpirl.agent.envs import EnvSpec
    from mpirl.logs.runlog import RunLog
    from mpirl.run.checkpoint import Checkpointer, Part
    from mpirl.run.config import Config
    from mpirl.run.failure import StopSignal
    from mpirl.transport.topology import Topology


def make_wire(cfg: Config, spec: EnvSpec, record: np.dtype, role: str | None = None) -> Wire:
    """This rank's packer; only the learner and the buffers compress (FORWARD, BATCH), so only
    they need zstandard (mpirl.run.resources)."""
    return Wire(
        record,
        qnet.param_count(spec.obs_shape, spec.n_actions, cfg.hidden, cfg.dueling),
        frame_shape=spec.frame_shape,
        compress=cfg.compress_for(spec.image) and role != "actor",
    )


def connect(cfg: Config, topo: Topology, wire: Wire) -> Ends:
    """Who talks to whom, built once for this rank (the roles are handed the result)::

        actor  --site--  buffer s  ==link (emulated: cfg.link)==  lead learner  --learners--
                                                                      learner 1..K-1

    The learner never talks to actors, nor a buffer to another site.  Tests and benches build
    an `Ends` of fakes instead (`mpirl.fakes`)."""
    me, ends = topo.place, Ends()
    piece_s = cfg.weights_piece_ms / 1e3
    if me.role == ACTOR:
        assert topo.site is not None  # actors and buffers are on a site
        ends.site = SitePort(
            topo.site,
            Inbox(wire, f"actor rank {me.rank}", lambda r: f"buffer of site {me.site}", topo.site),
        )
    elif me.role == BUFFER:
        assert topo.site is not None and topo.link is not None  # a site and the link
        ends.site = SitePort(
            topo.site,
            Inbox(wire, f"buffer {me.site}", lambda r: f"actor (site rank {r})", topo.site),
        )
        seed = seeds.buffer(cfg.seed, me.rank)["link"]
        ends.links = {0: LinkEnd(topo.link, 0, resolve_profile(cfg), seed=seed, piece_s=piece_s)}
        ends.inbox = Inbox(wire, f"buffer {me.site}", lambda r: "the learner")
    elif topo.lead:
        assert topo.link is not None  # the lead learner is on the link
        n, profile = topo.link.Get_size() - 1, resolve_profile(cfg)
        link_seeds = seeds.learner(cfg.seed, n)["link"]
        ends.links = {
            b: LinkEnd(topo.link, b, profile, seed=link_seeds[b - 1], piece_s=piece_s)
            for b in range(1, n + 1)
        }
        ends.inbox = Inbox(wire, "learner", lambda b: f"buffer {b - 1}")
        k = topo.learners.Get_size() if topo.learners is not None else 1
        # (k > 1: the learners communicator is there)
        group = cast("MPI.Comm", topo.learners)
        ends.group = {j: LinkEnd(group, j, PROFILES["none"]) for j in range(1, k)}
        ends.group_inbox = Inbox(wire, "learner", lambda j: f"learner {j}")
    else:  # learner j > 0 of the group
        assert topo.learners is not None  # K > 1 learners
        ends.group = {0: LinkEnd(topo.learners, 0, PROFILES["none"])}
        ends.group_inbox = Inbox(wire, f"learner {me.index}", lambda j: "the lead learner")
    return ends


def straggle_s(cfg: Config, learner: int) -> float:
    """--straggle RANK:MS: learner ``learner``'s sleep per update, in seconds (0 elsewhere)."""
    return straggle_of(cfg, learner)[0]


def straggle_of(cfg: Config, learner: int) -> tuple[float, tuple[float, float]]:
    """--straggle RANK:MS[@START-END]: learner ``learner``'s sleep per update in seconds and
    its window in seconds after the learner starts (0 and always elsewhere; RANK ``*``: every
    learner's)."""
    if not cfg.straggle:
        return 0.0, (0.0, float("inf"))
    rank, ms, start, end = parse_straggle(cfg.straggle)
    mine = rank in (learner, EVERY_LEARNER)
    return (ms / 1000.0 if mine else 0.0), (start, end)


def group_syncs(cfg: Config, comm: Any, trainer: TrainStep, learner: int) -> dict[int, LocalSync]:
    """A group learner's ways to make an update, by an ORDER's ``how`` (collective over
    ``comm``: the all-reduce one sets up the group's sum); the trainer starts with the first."""
    n_params = sum(p.numel() for p in trainer.params)
    sleep, window = straggle_of(cfg, learner)
    syncs = make_syncs(
        cfg.learner_sync, comm, n_params, trainer.device, sleep, window, cfg.batch_size
    )
    out = {ALLREDUCE: syncs["allreduce"]} if "allreduce" in syncs else {}
    out |= {SUBMIT: syncs["gba"]} if "gba" in syncs else {}
    trainer.sync = next(iter(out.values()))
    return out


def checkpoint_timeout_s(cfg: Config, spec: EnvSpec) -> float:
    """CKPT_TIMEOUT_S plus the time a healthy buffer may take to write what its placement keeps
    there (``checkpoint.write_allowance_s``): a large memory must not abort a healthy one."""
    edge = pick(cfg.replay_at).edge_memory_bytes(cfg, spec)
    return CKPT_TIMEOUT_S + (write_allowance_s(edge) if edge else 0.0)


def _group(
    cfg: Config, topo: Any, ends: Ends, trainer: TrainStep, wire: Wire, streams: Any
) -> Group:
    """The learner group as the lead sees it (K = 1: `NoGroup`); sets the trainer's sync."""
    comm = getattr(topo, "learners", None)  # (a bench or test may pass a bare topology)
    if comm is None or comm.Get_size() == 1:
        sleep, window = straggle_of(cfg, 0)
        trainer.sync = LocalSync(sleep, window) if cfg.straggle else None
        return NoGroup()
    syncs = group_syncs(cfg, comm, trainer, 0)
    assert ends.group_inbox is not None
    compute = None  # async / gba: the server thread steps ``trainer``, the lead computes on this
    if cfg.learner_sync != "allreduce":
        compute = TrainStep(cfg, trainer.spec, trainer.device, cfg.amp)
    return LeadGroup(
        cfg, comm, ends.group, ends.group_inbox, trainer, syncs, wire, streams["group"],
        streams["switches"], compute,
    )  # fmt: skip


def _lead_trainer(
    cfg: Config, spec: EnvSpec, log: RunLog, say: Callable[[str], None], torch: Any
) -> TrainStep:
    """The lead learner's train step on its device (recorded in its file, said once)."""
    dev = device_mod.resolve(cfg.device, torch)
    dev_info = device_mod.describe(dev, torch)
    log.set_attrs(**dev_info)
    say(device_mod.banner(dev_info, cfg.amp))
    return TrainStep(cfg, spec, dev, cfg.amp)


def build_learner(
    cfg: Config,
    topo: Any,
    spec: EnvSpec,
    wire: Wire,
    log: RunLog,
    ends: Ends,
    say: Callable[[str], None] = print,
    stop_signal: StopSignal | None = None,
    ckpt: Checkpointer | None = None,
    resume: Part | None = None,
    refset: tuple[str, str] | None = None,
) -> Learner:
    """The lead learner and its parts: ``ends.links`` (link rank b -> the end toward buffer
    b - 1) with ``ends.inbox``; ``ends.group`` and ``ends.group_inbox`` toward the other
    learners (--learners K)."""
    import torch

    torch.set_num_threads(cfg.torch_threads)
    seed = seeds.learner(cfg.seed, len(ends.links))
    torch.manual_seed(seed["torch"])
    sites = {
        b: Site(b, end, cfg.site_weights[b - 1] if cfg.site_weights else 1.0)
        for b, end in sorted(ends.links.items())
    }
    trainer = _lead_trainer(cfg, spec, log, say, torch)
    target = cfg.target_return if cfg.target_return is not None else spec.reward_threshold
    target_return = target if target is not None and np.isfinite(target) else None
    log.set_attrs(target_return=target_return)
    streams = schema.open_streams(log, "learner")
    rows = HeldRows(streams, log, cfg.alpha, cfg.priority_eps, cfg.huber_delta)
    arrival_rng = np.random.default_rng(seed["arrival"])
    arrivals = Arrivals(cfg.arrival_sample, cfg.alpha, cfg.priority_eps, arrival_rng, trainer.td)
    group = _group(cfg, topo, ends, trainer, wire, streams)
    state = LearnerState(beta=cfg.beta)
    if resume is None:  # the first launch's loop start stays time zero across resumes
        log.set_attrs(loop_start_t=log.elapsed())
    source = pick(cfg.replay_at).batch_source(
        LearnerContext(
            cfg, spec, wire, sites, rows, arrivals, streams, lambda: state.updates, group,
            seed["replay"],
        )
    )  # fmt: skip
    if isinstance(group, LeadGroup):
        group.attach(source)
    weights = WeightSync(cfg, wire, {b: s.link for b, s in sites.items()}, lambda b: sites[b].done)
    backoff = Backoff()
    assert ends.inbox is not None
    parts = LearnerParts(
        cfg=cfg,
        wire=wire,
        log=log,
        sites=sites,
        inbox=ends.inbox,
        trainer=trainer,
        source=source,
        group=group,
        weights=weights,
        evaluation=Evaluation(
            cfg,
            lambda: make_runner(cfg.evaluator, cfg, spec, refset),
            streams["evals"],
            log.path.parent,
            trainer,
            target_return,
            say,
        ),
        checkpoints=LearnerCheckpoint(
            ckpt,
            trainer,
            [part_name(p.role, p.site, p.rank) for p in topo.places],
            log,
            torch,
            weights,
        ),
        cut=Cut(
            ckpt, sites, cfg.checkpoint_seconds, checkpoint_timeout_s(cfg, spec), state.t_start
        ),
        report=Report(
            cfg,
            streams,
            sites,
            source,
            weights,
            backoff,
            say,
            state.t_start,
            lambda: group.sync_mode,
        ),
        rows=rows,
        state=state,
        backoff=backoff,
        fault=failure.FAULT,
        cap=TokenBucket(cfg.learner_updates_per_s) if cfg.learner_updates_per_s else None,
        resume=resume,
        stop_signal=stop_signal,
        say=say,
    )
    return Learner(parts)


def build_buffer(
    cfg: Config,
    topo: Any,
    spec: EnvSpec,
    wire: Wire,
    log: RunLog,
    ends: Ends,
    ckpt: Checkpointer | None = None,
    resume: Part | None = None,
) -> Buffer:
    """A buffer and its placement's side: ``ends.site`` toward the actors, ``ends.links[0]`` the
    long-haul link to the learner, ``ends.inbox`` for what it delivers."""
    me = topo.place
    seed = seeds.buffer(cfg.seed, me.rank)
    streams = schema.open_streams(log, "buffer")
    raw, link = RawBytes(wire), ends.links[0]
    side = pick(cfg.replay_at).site_side(
        SiteContext(
            cfg, spec, wire, link, streams, raw, seed["replay"], getattr(topo, "n_actors", 0)
        )
    )
    assert ends.site is not None and ends.inbox is not None
    return Buffer(
        BufferParts(
            cfg, wire, log, streams, ends.site, link, ends.inbox, side, me.site, raw, ckpt, resume
        )
    )


def build_worker(
    cfg: Config,
    topo: Any,
    spec: EnvSpec,
    wire: Wire,
    log: RunLog,
    ends: Ends,
    ckpt: Checkpointer | None = None,
    resume: Part | None = None,
) -> GroupWorker:
    """Learner j > 0 of the group: ``ends.group[0]`` toward the lead, ``ends.group_inbox``."""
    import torch

    torch.set_num_threads(cfg.torch_threads)
    comm = topo.learners
    index, k = comm.Get_rank(), comm.Get_size()
    seed = seeds.group_learner(cfg.seed, index)
    torch.manual_seed(seed["torch"])
    dev = device_mod.resolve(cfg.device, torch)
    if dev.type == "cuda" and torch.cuda.device_count() > 1:  # one GPU per learner
        dev = torch.device(f"cuda:{index % torch.cuda.device_count()}")
    log.set_attrs(**device_mod.describe(dev, torch))
    trainer = TrainStep(cfg, spec, dev, cfg.amp)
    syncs = group_syncs(cfg, comm, trainer, index)
    shard = pick(cfg.replay_at).worker_shard(cfg, spec, wire.record, k, index, seed["replay"])
    streams = schema.open_streams(log, "learner_worker")
    assert ends.group_inbox is not None
    worker = GroupWorker(
        index, comm, trainer, syncs, wire, log, streams["work"], ends.group[0], ends.group_inbox,
        shard, ckpt, torch,
    )  # fmt: skip
    if resume is not None:
        worker.restore(resume)
    return worker


#: what ``--replay-at auto`` assumes for a rate the run does not pace: the committed runs'
#: figures (docs/results.md: 3,000 env steps/s per actor; 187.5 updates/s, rho 1 at P = 12,000)
ASSUMED_ACTOR_STEPS_PER_S = 3000.0
ASSUMED_UPDATES_PER_S = 187.5


def resolve_replay_at(world: MPI.Comm, cfg: Config) -> tuple[Config, dict[str, Any] | None]:
    """``--replay-at auto``: the advisor's placement (`mpirl.advise`), the same on every rank,
    decided once before any role is built; ``(cfg, None)`` for a fixed placement.  The link: the
    emulated profile's rate and latency, or with ``--link none`` the real link measured between
    rank 0 and every buffer (`mpirl.transport.probe`; the slowest site decides).  The rates:
    ``--actor-steps-per-s`` x actors and ``--learner-updates-per-s``, or the committed runs'
    figures where unpaced (said in the advice's notes).  Rank 0 decides and broadcasts the
    advice as JSON (no pickle); the returned config holds the resolved placement."""
    if cfg.replay_at != "auto":
        return cfg, None
    places = layout(world.Get_size(), cfg.buffers, cfg.learners)
    buffers = [p.rank for p in places if p.role == BUFFER]
    profile = resolve_profile(cfg)
    probes = None if profile.emulated else probe.measure(world, buffers)
    text = ""
    if world.Get_rank() == 0:
        try:
            text = "A" + json.dumps(
                _auto_advice(
                    cfg,
                    len(places) - len(buffers) - cfg.learners,
                    profile.rate_bps,
                    profile.latency_s,
                    probes,
                )
            )
        except Exception as e:  # noqa: BLE001 - every rank must get the verdict, not hang
            text = f"E--replay-at auto: the advisor failed: {type(e).__name__}: {e}"
    got = _bcast_bytes(world, text)
    if got[:1] != "A":
        raise ConfigError(got[1:])
    adv = json.loads(got[1:])
    return dataclasses.replace(cfg, replay_at=adv["replay_at"]), adv


def _auto_advice(
    cfg: Config,
    actors: int,
    rate_bps: float,
    latency_s: float,
    probes: list[probe.Probe] | None,
) -> dict[str, Any]:
    """Rank 0: the advisor's inputs from the run's flags and the link, then its advice."""
    notes = []
    if probes is not None:
        slow = min(probes, key=lambda p: p.rate_bps)
        rate_bps, latency_s = slow.rate_bps, max(p.rtt_s for p in probes) / 2
        notes.append(
            "link measured at start: "
            + "; ".join(
                f"buffer rank {p.rank}: {p.rate_bps / 1e6:.4g} Mb/s ({p.nbytes:,} B timed), "
                f"round trip {p.rtt_s * 1e3:.3g} ms"
                for p in probes
            )
            + f"; the slowest (rank {slow.rank}) decides"
        )
    else:
        notes.append(f"link emulated: {cfg.link} ({resolve_profile(cfg).describe()})")
    per_actor = cfg.actor_steps_per_s or ASSUMED_ACTOR_STEPS_PER_S
    if not cfg.actor_steps_per_s:
        notes.append(
            f"actors unpaced: assumed {ASSUMED_ACTOR_STEPS_PER_S:,.0f} env steps/s per actor "
            "(the committed runs' pace); set --actor-steps-per-s for a better choice"
        )
    updates = cfg.learner_updates_per_s or ASSUMED_UPDATES_PER_S
    if not cfg.learner_updates_per_s:
        notes.append(
            f"learner unpaced: assumed {ASSUMED_UPDATES_PER_S:g} updates/s (the committed "
            "runs' rate at rho 1); set --learner-updates-per-s for a better choice"
        )
    inp = advise.Inputs(
        rate_bps / 1e6,
        latency_s * 1e3,
        per_actor * actors,
        updates,
        cfg.batch_size,
        advise.env_bytes(cfg.env, cfg.batch_size, cfg.forward_chunk),
        tuple(notes),
    )
    return advise.advise(inp, advise.load_map())


def _bcast_bytes(world: MPI.Comm, text: str) -> str:
    """Rank 0's ``text`` on every rank (length, then bytes; no pickle)."""
    data = np.frombuffer(text.encode(), np.uint8)
    n = np.array([data.size], np.int64)
    world.Bcast(n, root=0)
    buf = data.copy() if world.Get_rank() == 0 else np.empty(int(n[0]), np.uint8)
    world.Bcast(buf, root=0)
    return bytes(buf).decode()


def run_role(
    topo: Topology,
    cfg: Config,
    spec: EnvSpec,
    wire: Wire,
    log: RunLog,
    ckpt: Checkpointer,
    stop_signal: StopSignal,
    resume: Part | None,
    refset: tuple[str, str] | None,
) -> dict[str, Any] | None:
    """This rank's role, handed its ends of the networks (`connect`); the lead learner's
    summary (summary.json), None elsewhere."""
    ends = connect(cfg, topo, wire)
    if topo.role == "learner" and not topo.lead:  # learner 1..K-1 of a group
        build_worker(cfg, topo, spec, wire, log, ends, ckpt=ckpt, resume=resume).run()
    elif topo.role == "learner":
        if refset is not None:
            log.set_attrs(reference_set=refset[0], reference_set_sha256=refset[1])
        say = lambda s: print(s, flush=True)  # noqa: E731
        learner = build_learner(
            cfg, topo, spec, wire, log, ends, say, stop_signal, ckpt, resume, refset
        )
        return learner.run()
    elif topo.role == "buffer":
        build_buffer(cfg, topo, spec, wire, log, ends, ckpt=ckpt, resume=resume).run()
    else:
        assert ends.site is not None
        Actor(cfg, topo, spec, wire, log, ends.site, ckpt=ckpt, resume=resume).run()
    return None


__all__ = [
    "build_buffer",
    "build_learner",
    "build_worker",
    "checkpoint_timeout_s",
    "connect",
    "make_wire",
    "resolve_replay_at",
    "run_role",
]
