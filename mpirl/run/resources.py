"""Host checks before a run starts: each rank checks, on its own host, what its role uses; the
verdicts are gathered and rank 0 says the outcome once, naming the rank, host, role and check.

===============  ===================================================================
check            ranks that run it
===============  ===================================================================
``env``          those that build envs: the learner (greedy evaluation) and the actors;
                 the env imports and builds, and gives the learner's spaces
``memory``       those that hold a replay memory: the buffers (``--replay-at buffer``)
                 or the learner (``--replay-at learner``); summed per host (two buffers
                 on one host need two memories of that host's ``MemAvailable``)
``tensorboard``  with ``--tensorboard``: the learner and the buffers (they write events)
``zstandard``    when the link compresses (``--compress``) or weights go as deltas
                 (``--weights-encoding delta``): the learner and the buffers
``device``       with ``--device cuda...`` or ``--amp bf16``: every learner rank (each
                 trains on its own host's device; `mpirl.agent.device.check`)
===============  ===================================================================

Nothing that can differ by host is checked by one rank alone or by each rank alone: a rank that
failed alone would exit while the others wait for it here (``--config`` is read by rank 0 and
sent to every rank, mpirl.main).

Protocol (`check`): every rank fills one fixed-size `ROW` (host = ``MPI.Get_processor_name()``,
its reading of available memory, its first failing check and that check's message, and the
env spec it built, as JSON); ``Allgather``; every rank then decides from the same rows
(`verdict`) and raises the same `mpirl.run.config.ConfigError` (printed by rank 0 only), or takes
rank 0's env spec (buffers build no env): no rank waits on one that gave up.

A check that fails alike on every rank that runs it (a bad ``--env`` on one host) is said as
is; otherwise the message starts with who failed, e.g. ``rank 5 (actor of site 1) on host
edge-2: env: ...``.  The test-only hook ``MPIRL_FAULT_CHECK=RANK:CHECK`` (`mpirl.run.failure.
forced_checks`) makes a check fail on one rank.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from typing import TYPE_CHECKING, NamedTuple, cast

import numpy as np

from mpirl.agent import device, envs
from mpirl.agent.envs import EnvSpec
from mpirl.logs.dashboard import check_installed
from mpirl.replay.build import replay_footprint
from mpirl.replay.memory import available_memory
from mpirl.run import failure
from mpirl.run.config import ConfigError
from mpirl.transport import topology

if TYPE_CHECKING:
    from mpi4py import MPI

    from mpirl.run.config import Config
    from mpirl.transport.topology import Place

CHECKS = ("env", "memory", "tensorboard", "zstandard", "device")

#: one rank's findings, gathered as bytes (no pickle)
ROW = np.dtype(
    [("host", "S256"), ("avail", "<i8"), ("check", "S16"), ("error", "S1024"), ("spec", "S1024")]
)


class Failure(NamedTuple):
    """A failed check: the ranks it failed on (several: one memory summed over a host)."""

    ranks: tuple[int, ...]
    host: str
    check: str
    text: str


def holds_replay(role: str, cfg: Config) -> bool:
    """Whether a rank of ``role`` holds a prioritized replay memory in this run."""
    return role == ("buffer" if cfg.replay_at == "buffer" else "learner")


def checks_for(role: str, cfg: Config) -> tuple[str, ...]:
    """The checks a rank of ``role`` runs (see the module docstring)."""
    out = []
    if role in ("learner", "actor"):
        out.append("env")
    if holds_replay(role, cfg):
        out.append("memory")
    if cfg.tensorboard and role in ("learner", "buffer"):
        out.append("tensorboard")
    if needs_zstandard(cfg) and role in ("learner", "buffer"):
        out.append("zstandard")
    if role == "learner" and device.needs_check(cfg.device, cfg.amp):
        out.append("device")
    return tuple(out)


def needs_zstandard(cfg: Config) -> str:
    """What needs zstandard at the learner and the buffers, in words ('' when nothing does)."""
    why = []
    if cfg.compress_for(envs.family(cfg.env) != "vector"):
        why.append(f"compress={cfg.compress!r}")
    if cfg.weights_encoding == "delta":
        why.append("weights_encoding='delta'")
    return " and ".join(why)


def who(place: Place) -> str:
    """``rank 1 (buffer of site 0)``, as mpirl.run.failure names a rank."""
    return f"rank {place.rank} ({place.role}" + (
        f" of site {place.site})" if place.site >= 0 else ")"
    )


def spec_json(spec: EnvSpec) -> str:
    d = dataclasses.asdict(spec)
    d["obs_dtype"] = np.dtype(spec.obs_dtype).str
    return json.dumps(d, sort_keys=True)


def spec_from_json(text: str) -> EnvSpec:
    d = json.loads(text)
    d["obs_shape"] = tuple(d["obs_shape"])
    d["obs_dtype"] = np.dtype(d["obs_dtype"])
    if d["frame_shape"] is not None:
        d["frame_shape"] = tuple(d["frame_shape"])
    return EnvSpec(**d)


def local_row(
    cfg: Config, role: str, host: str, forced: frozenset[str] = frozenset()
) -> tuple[np.ndarray, object]:
    """Run this rank's checks here, on ``host``; returns its `ROW` and the env spec it built
    (or None).  ``forced``: checks made to fail (test hook; inert for checks this role does not
    run; a forced ``memory`` reads 0 bytes available)."""
    row = np.zeros((), ROW)
    row["host"] = host.encode()[:256]
    row["avail"] = -1
    spec, failed = None, []
    mine = checks_for(role, cfg)
    hook = " (injected: MPIRL_FAULT_CHECK)"
    if "env" in mine:
        try:
            if "env" in forced:
                raise ConfigError(f"env={cfg.env!r} cannot be built on this host{hook}")
            spec = envs.inspect(cfg.env, cfg.env_kwargs, cfg.wrapper_specs())
            text = spec_json(spec).encode()
            if len(text) > ROW["spec"].itemsize:
                raise ConfigError(f"env={cfg.env!r}: its spec {text!r} is too long to send")
            row["spec"] = text
        except ConfigError as e:
            failed.append(("env", str(e)))
        except Exception as e:  # noqa: BLE001 - the user's env code: reported, never a hang
            failed.append(("env", f"env={cfg.env!r}: {type(e).__name__}: {e}"))
    if "memory" in mine:
        avail = 0 if "memory" in forced else available_memory()[0]
        row["avail"] = -1 if avail is None else avail
    if "tensorboard" in mine:
        try:
            if "tensorboard" in forced:
                raise ConfigError(f"tensorboard=True: tensorboard cannot be imported here{hook}")
            check_installed()
        except ConfigError as e:
            failed.append(("tensorboard", str(e)))
    if "zstandard" in mine and (
        "zstandard" in forced or importlib.util.find_spec("zstandard") is None
    ):
        fix = f"install it (part of the images extra: {envs.IMAGES_EXTRA})"
        if cfg.weights_encoding == "delta":
            fix += " or pass --weights-encoding bf16"
        if cfg.compress_for(envs.family(cfg.env) != "vector"):
            fix += " or --compress off"
        failed.append(
            (
                "zstandard",
                f"{needs_zstandard(cfg)} needs zstandard on the learner's and the buffers' "
                f"hosts; {fix}" + (hook if "zstandard" in forced else ""),
            )
        )
    if "device" in mine:
        if "device" in forced:
            err = f"device={cfg.device!r} cannot be used on this host; pass --device cpu{hook}"
        else:
            try:
                err = device.check(cfg.device, cfg.amp)
            except Exception as e:  # noqa: BLE001 - torch itself: reported, never a hang
                err = f"device={cfg.device!r}: {type(e).__name__}: {e}"
        if err:
            failed.append(("device", err))
    if failed:
        row["check"], row["error"] = failed[0][0].encode(), failed[0][1].encode()[:1024]
    return row, spec


def _text(b: bytes) -> str:
    return bytes(b).rstrip(b"\0").decode(errors="replace")


def memory_failures(rows: np.ndarray, places: list[Place], cfg: Config, need: int) -> list[Failure]:
    """Per host: the replay memories of the ranks on it (``need`` bytes each) against the
    smallest ``MemAvailable`` they read there (unknown: not checked)."""
    hosts: dict[str, list[int]] = {}
    for p in places:
        if holds_replay(p.role, cfg):
            hosts.setdefault(_text(rows[p.rank]["host"]), []).append(p.rank)
    out = []
    for host, ranks in hosts.items():
        readings = [int(rows[r]["avail"]) for r in ranks if rows[r]["avail"] >= 0]
        total = need * len(ranks)
        if not readings or total <= (avail := min(readings)):
            continue
        k, per = len(ranks), need / cfg.replay_capacity
        most = int(avail * 0.8 / (per * k))
        if k == 1:
            text = (
                f"replay_capacity={cfg.replay_capacity:,} needs {need / 2**30:.2f} GiB "
                f"({per:,.0f} bytes per transition) but only {avail / 2**30:.2f} GiB is "
                f"available; lower --replay-capacity to at most {most:,}"
            )
        else:
            text = (
                f"{k} replay memories of replay_capacity={cfg.replay_capacity:,} share this "
                f"host and need {k} x {need / 2**30:.2f} GiB = {total / 2**30:.2f} GiB "
                f"({per:,.0f} bytes per transition) but only {avail / 2**30:.2f} GiB is "
                f"available; lower --replay-capacity to at most {most:,}, or place those "
                "ranks on different hosts"
            )
        out.append(Failure(tuple(ranks), host, "memory", text))
    return out


def verdict(rows: np.ndarray, places: list[Place], cfg: Config, need: int | None) -> str:
    """The one error message for the gathered ``rows`` ("" when every check passed).
    ``need``: bytes of one replay memory (None: not known, the learner's env failed)."""
    fails = [
        Failure(
            (p.rank,),
            _text(rows[p.rank]["host"]),
            _text(rows[p.rank]["check"]),
            _text(rows[p.rank]["error"]),
        )
        for p in places
        if rows[p.rank]["check"]
    ]
    ref = _text(rows[0]["spec"])
    for p in places:  # every env-building rank must build the learner's env
        got = _text(rows[p.rank]["spec"])
        if p.rank and got and ref and got != ref:
            fails.append(
                Failure(
                    (p.rank,),
                    _text(rows[p.rank]["host"]),
                    "env",
                    f"env={cfg.env!r} gives {got} here but {ref} on rank 0; "
                    "install the same env and versions on every host",
                )
            )
    if not fails and need is not None:
        fails = memory_failures(rows, places, cfg, need)
    if not fails:
        return ""
    fails.sort(key=lambda f: f.ranks)
    first = fails[0]
    alike = [f for f in fails if (f.check, f.text) == (first.check, first.text)]
    runs = [p.rank for p in places if first.check in checks_for(p.role, cfg)]
    if first.check != "memory" and sorted(r for f in alike for r in f.ranks) == runs:
        head, rest = first.text, [f for f in fails if f not in alike]  # alike on every rank
    else:
        names = ", ".join(who(places[r]) for r in first.ranks[:-1])
        names = (
            f"{names} and {who(places[first.ranks[-1]])}" if names else who(places[first.ranks[0]])
        )
        head, rest = f"{names} on host {first.host}: {first.check}: {first.text}", fails[1:]
    if rest:
        head += "; also failing: " + ", ".join(
            f"{who(places[f.ranks[0]])} on host {f.host}: {f.check}" for f in rest[:8]
        )
        if len(rest) > 8:
            head += f" and {len(rest) - 8} more"
    return head


def check(world: MPI.Comm, cfg: Config) -> EnvSpec:
    """Run the host checks on every rank (the module docstring); returns the env spec, the
    same on every rank, or raises the same ConfigError on every rank."""
    from mpi4py import MPI

    rank = world.Get_rank()
    places = topology.layout(world.Get_size(), cfg.buffers, cfg.learners)
    try:
        forced = failure.forced_checks(rank, CHECKS)
    except ValueError as e:  # the same on every rank
        raise ConfigError(str(e)) from None
    row, _ = local_row(cfg, places[rank].role, MPI.Get_processor_name(), forced)
    rows = np.zeros(world.Get_size(), ROW)
    world.Allgather([row.reshape(1).view(np.uint8), MPI.BYTE], [rows.view(np.uint8), MPI.BYTE])
    return decide(rows, places, cfg)


def decide(rows: np.ndarray, places: list[Place], cfg: Config) -> EnvSpec:
    """Every rank decides from the same gathered ``rows``: rank 0's env spec, or the same
    ConfigError (`verdict`)."""
    ref = _text(rows[0]["spec"])
    spec = spec_from_json(ref) if ref else None
    err = verdict(rows, places, cfg, None if spec is None else replay_footprint(cfg, spec))
    if err:
        raise ConfigError(err)
    return cast(EnvSpec, spec)  # no error: rank 0 made the spec
