"""Entry point: ``mpirun -n 9 python -m mpirl.main [options]``.

Every rank is handed its ends of the networks and its role's parts by `mpirl.wiring` (who talks
to whom), and every message comes in through `mpirl.transport.inbox` (one receive loop).  All
message kinds (layouts: mpirl.transport.wire ``Tag``), their direction and, in [brackets], their
flow control::

  actor            buffer s                         lead learner                learner j > 0
    | site network    |  long-haul link (LinkEnd)      |  learners network (K > 1)  |
    |--EXPERIENCE---->|                                |
    |<--------CREDIT--|  [actor_credits unanswered per actor; one back per EXPERIENCE unless
    |                 |   --replay-ratio or the full forward queue holds it: backpressure]
    |<-------WEIGHTS--|<-----------------------WEIGHTS-|  [latest wins: one on the link, in
    |  (relayed, f4)  |                                |   pieces other kinds pass; one waiting]
    |                 |--KEYFRAME--------------------->|  [ask for the next in full]
    |                 |--FORWARD---------------------->|  replay_at=learner, thinned
    |                 |<------------------------CREDIT-|  [forward_credits unanswered FORWARDs]
    |                 |--BATCH------------------------>|  replay_at=buffer
    |                 |<--------------------PRIORITIES-|  [one per BATCH trained: the buffer's
    |                 |                                |   in-flight window of BATCHes]
    |                 |--STATS------------------------>|  [every 0.25 s]
    |<----CHECKPOINT--|<--------------------CHECKPOINT-|  request (mpirl.transport.cut)
    |--CHECKPOINT---->|--CHECKPOINT------------------->|  ack [later messages of the sender
    |                 |                                |   wait until the receiver's snapshot]
    |<----------STOP--|<--------------------------STOP-|
    |--DONE---------->|--DONE------------------------->|  [a buffer's after all its actors']
    |<----------DONE--|<--------------------------DONE-|  ack: the rank may leave
                                                       |--ORDER--------------------->|
                                                       |--SHARD--------------------->|
                                                       |<-----------------------GRAD-|
      [async, gba: one ORDER unanswered per learner; allreduce: one ORDER per update each]
                                                       |--CHECKPOINT---------------->|
                                                       |<-----------------CHECKPOINT-|
                                                       |--STOP---------------------->|
                                                       |<-----------------------DONE-|

Rank 0 is the learner, then each site's buffer followed by its actors (see
mpirl.transport.topology).  Configuration is parsed and validated once on every rank, every
rank reaching the same verdict (``--config`` is read by rank 0 and its text sent to every rank);
what depends on the host (the env, memory, optional packages, the learners' device) is checked
by the ranks that use it and gathered into one verdict (mpirl.run.resources); errors are
printed by rank 0 only and every rank exits non-zero.
``--resume RUN_DIR``: rank 0 picks and checks the newest complete checkpoint and broadcasts its
manifest (the stored config comes from it); every rank loads its own part, and any rank's failure
becomes one error on rank 0 (gathered), so every rank reaches the same verdict there too.
"""

from __future__ import annotations

import os
import sys

# One BLAS/OpenMP thread per rank: 9 ranks share 2 cores. Set before numpy/torch load.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

if __name__ == "__main__" and sys.argv[1:2] != ["play"]:
    # a stop relayed while this rank imports is kept, not its death (mpirl.run.failure)
    from mpirl.run.failure import catch_stop_early

    catch_stop_early()

import contextlib  # noqa: E402
import cProfile  # noqa: E402
import dataclasses  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from importlib.metadata import PackageNotFoundError, version  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any, cast  # noqa: E402

import numpy as np  # noqa: E402

from mpirl import play, refloss, seeds  # noqa: E402
from mpirl.logs.dashboard import TensorBoardMirror  # noqa: E402
from mpirl.logs.runlog import RunLog  # noqa: E402
from mpirl.placement import slurm_info  # noqa: E402
from mpirl.replay.build import (  # noqa: E402
    FRAME_HEADROOM,
    max_learning_starts,
    record_dtype,
    replay_footprint,
)
from mpirl.run import checkpoint, failure, resources  # noqa: E402
from mpirl.run.checkpoint import (  # noqa: E402
    Checkpointer,
    file_rows,
    part_name,
    write_allowance_s,
)
from mpirl.run.config import (  # noqa: E402
    ConfigError,
    build_parser,
    parse,
    resume_dir,
    to_dict,
)
from mpirl.transport import topology  # noqa: E402
from mpirl.transport.link import resolve_profile  # noqa: E402

if TYPE_CHECKING:
    from mpi4py import MPI

    from mpirl.agent.envs import EnvSpec
    from mpirl.run.checkpoint import Part
    from mpirl.run.config import Config
    from mpirl.transport.link import LinkProfile
    from mpirl.transport.topology import Place, Topology


def _versions() -> dict[str, str]:
    from mpi4py import MPI

    out = {
        "python": sys.version.split()[0],
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
        "mpi_standard": "{}.{}".format(*MPI.Get_version()),
    }
    for pkg in ("mpirl", "torch", "numpy", "gymnasium", "h5py", "mpi4py"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "unknown"
    return out


def _hostnames(world: MPI.Comm) -> list[str]:
    """Every rank's host name, gathered as fixed-size bytes (no pickle)."""
    from mpi4py import MPI

    mine = np.zeros(256, np.uint8)
    name = socket.gethostname().encode()[:256]
    mine[: len(name)] = np.frombuffer(name, np.uint8)
    allnames = np.zeros((world.Get_size(), 256), np.uint8)
    world.Allgather([mine, MPI.BYTE], [allnames, MPI.BYTE])
    return [bytes(row).rstrip(b"\0").decode(errors="replace") for row in allnames]


def _default_run_dir(cfg: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{cfg.env}-{cfg.replay_at}"


def _prepare_run_dir(world: MPI.Comm, cfg: Config) -> Path:
    """Rank 0 decides and creates the run folder; every rank gets its path or its error (no
    silent overwrite).  The default folder's time stamp is rank 0's clock: ranks start seconds
    apart (more so under Open MPI, on several hosts), and each rank's own stamp would split the
    run over several folders."""
    err, path = "", None
    if world.Get_rank() == 0:
        path = Path(cfg.run_dir) if cfg.run_dir else _default_run_dir(cfg)
        try:
            if path.exists() and (not path.is_dir() or any(path.iterdir())):
                err = (
                    f"run_dir={str(path)!r} exists and is not an empty folder; pass a new "
                    "--run-dir (mpirl never writes into an existing run)"
                )
            else:
                path.mkdir(parents=True, exist_ok=True)
                probe = path / ".write-test"
                probe.write_bytes(b"")
                probe.unlink()
        except OSError as e:
            err = (
                f"run_dir={str(path)!r} cannot be created or written ({e.strerror}); pass a "
                "writable --run-dir"
            )
    got = _bcast_text(world, None if path is None else ("E" + err if err else "P" + str(path)))
    if got[:1] != "P":
        raise ConfigError(got[1:] or "the run folder could not be prepared (see rank 0)")
    return Path(got[1:])


def _bcast_text(world: MPI.Comm, text: str | None) -> str:
    """Rank 0's ``text`` on every rank, as bytes (no pickle)."""
    from mpi4py import MPI

    data = np.frombuffer((text or "").encode(), np.uint8) if world.Get_rank() == 0 else None
    n = np.array([0 if data is None else data.size], np.int64)
    world.Bcast([n, MPI.INT64_T], root=0)
    buf = data.copy() if data is not None else np.empty(int(n[0]), np.uint8)
    world.Bcast([buf, MPI.BYTE], root=0)
    return bytes(buf).decode()


def _reference_set(
    world: MPI.Comm, cfg: Config, run_dir: Path | None, spec: EnvSpec
) -> tuple[str, str]:
    """Rank 0 (the learner) resolves --reference-set (collecting an ``auto`` set once on the
    run's env, see mpirl.refloss.resolve, and checking it fits ``spec``); every rank gets
    ``(path, sha256)`` or the same ConfigError, whatever rank 0 met (this runs before failure
    handling is installed: an exception escaping here would leave the others in the Bcast)."""
    assert cfg.reference_set  # the callers ask only when it is set
    text = None
    path: Path | str
    if world.Get_rank() == 0:
        try:
            path, sha = refloss.resolve(cfg.reference_set, cfg, run_dir, spec)
            text = f"P{path}\n{sha}"
        except (ValueError, OSError) as e:  # refloss names the value; numpy, the OS may not
            text = f"E{e}" if "reference_set=" in str(e) else None
            if text is None:
                text = (
                    f"Ereference_set={cfg.reference_set!r} cannot be used: {type(e).__name__}: {e}"
                )
        except Exception as e:  # noqa: BLE001 - a corrupt file (BadZipFile), the user's env code
            # while an `auto` set is collected: every rank must get it, never wait in the Bcast
            if cfg.reference_set == "auto":
                what, fix = "collecting the set on the run's env", "fix the env (or its wrappers)"
            else:
                what, fix = "reading the file", "pass a set written by mpirl.refloss, or auto"
            text = (
                f"Ereference_set={cfg.reference_set!r}: {what} failed with "
                f"{type(e).__name__}: {e}; {fix}"
            )
    got = _bcast_text(world, text)
    if got[:1] != "P":
        raise ConfigError(got[1:])
    path, sha = got[1:].rsplit("\n", 1)
    return path, sha


def _resume_manifest(world: MPI.Comm, run_dir: str) -> dict:
    """Rank 0 selects and checks the checkpoint; every rank gets its manifest or the error."""
    text, err = None, ""
    if world.Get_rank() == 0:
        try:
            manifest, skipped = checkpoint.select(run_dir)
            for why in skipped:
                print(f"mpirl: warning: skipping {why}", file=sys.stderr, flush=True)
            text = json.dumps(manifest)
        except checkpoint.CheckpointError as e:
            err = str(e)
        except Exception as e:  # noqa: BLE001 - must reach every rank, not hang them
            err = f"--resume {run_dir!r}: {type(e).__name__}: {e}"
        text = "E" + err if err else "M" + cast("str", text)  # no error: the manifest's JSON
    got = _bcast_text(world, text)
    if got[:1] != "M":
        raise checkpoint.CheckpointError(got[1:] or "the checkpoint could not be read")
    return json.loads(got[1:])


def _resume_parts(
    world: MPI.Comm,
    run_dir: Path,
    manifest: dict,
    places: list[Place],
    cfg: Config,
    spec: EnvSpec,
    record: np.dtype,
) -> Part | None:
    """Every rank loads its part; the first failure (by rank) is every rank's error."""
    from mpi4py import MPI

    rank = world.Get_rank()
    me = places[rank]
    name = checkpoint.part_name(me.role, me.site, me.rank)
    part, err = None, ""
    try:
        if not (run_dir / f"{name}.h5").is_file():
            raise checkpoint.CheckpointError(
                f"{run_dir / (name + '.h5')} is missing; --resume appends to the run's HDF5 files"
            )
        part = checkpoint.load_part(run_dir, manifest, name)
        if me.role != "actor" and "replay_storage" in part.arrays:
            dt = part.arrays["replay_storage"].dtype
            if dt != record:
                raise checkpoint.CheckpointError(
                    f"checkpoint {part.id}: {name}'s replay memory holds {dt}, the env "
                    f"{cfg.env} gives {record}"
                )
    except checkpoint.CheckpointError as e:
        err = str(e)
    except Exception as e:  # noqa: BLE001 - reported by rank 0, never a hang
        err = f"checkpoint {manifest.get('id')}: {name}: {type(e).__name__}: {e}"
    mine = np.zeros(1024, np.uint8)
    raw = err.encode()[:1024]
    mine[: len(raw)] = np.frombuffer(raw, np.uint8)
    every = np.zeros((world.Get_size(), 1024), np.uint8)
    world.Allgather([mine, MPI.BYTE], [every, MPI.BYTE])
    for r, row in enumerate(every):
        text = bytes(row).rstrip(b"\0").decode(errors="replace")
        if text:
            raise checkpoint.CheckpointError(f"rank {r}: {text}")
    return part


class _Setup:
    """What the configuration step hands to the job: every rank holds the same."""

    def __init__(
        self,
        cfg: Config,
        spec: EnvSpec,
        record: np.dtype,
        manifest: dict | None,
        run_dir: Path,
        part: Part | None,
        refset: tuple[str, str] | None,
        auto: dict[str, Any] | None = None,
    ) -> None:
        self.cfg, self.spec, self.record, self.manifest = cfg, spec, record, manifest
        self.run_dir, self.part, self.refset = run_dir, part, refset
        self.auto = auto  # --replay-at auto: the advisor's advice (mpirl.advise), else None


def main(argv: list[str] | None = None) -> int:
    """Configure (every rank, one verdict printed by rank 0), then run this rank's role."""
    if (sys.argv[1:] if argv is None else argv)[:1] == ["play"]:  # `mpirl play RUN_DIR`: no MPI
        return play.main((sys.argv[1:] if argv is None else argv)[1:])
    failure.catch_stop_early()  # (the `mpirl` script's ranks: they start here)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        setup = _configure(world, argv)
    except (ConfigError, topology.LayoutError) as e:
        if world.Get_rank() == 0:
            sys.stderr.write(f"mpirl: error: {e}\n")
        return 2
    if isinstance(setup, int):  # --help, or argparse's usage error
        return setup
    return _run(world, setup)


def _configure(world: MPI.Comm, argv: list[str] | None) -> _Setup | int:
    """Parse and check the configuration, resolve the env, check resources, decide the run
    folder (or load this rank's checkpoint part).  ConfigError on a bad value."""
    rank = world.Get_rank()
    # the same verdict on every rank, printed by rank 0 only
    quiet = contextlib.redirect_stdout(io.StringIO()) if rank else contextlib.nullcontext()
    quiet_err = contextlib.redirect_stderr(io.StringIO()) if rank else contextlib.nullcontext()
    manifest = None
    with quiet, quiet_err:
        try:
            resume = resume_dir(argv)
        except SystemExit as e:  # argparse: --help (0) or a usage error (2)
            return int(e.code or 0)
    if resume is not None:
        parse(argv, stored={})  # the flags allowed with --resume, before reading anything
        manifest = _resume_manifest(world, resume)
        cfg = parse(argv, stored=manifest["config"])
        if manifest["world_size"] != world.Get_size():
            roles = [x["role"] for x in manifest["layout"]]
            raise ConfigError(
                f"--resume {resume!r}: the run was checkpointed by {manifest['world_size']} "
                f"ranks (1 learner, {roles.count('buffer')} buffer(s), "
                f"{roles.count('actor')} actors) and this job has {world.Get_size()}; "
                f"resume it with `mpirun -n {manifest['world_size']} python -m mpirl.main "
                f"--resume {resume}`"
            )
    else:
        cfg = _parse_shared(world, argv)
    cfg.validate(world.Get_size())
    auto = None
    if cfg.replay_at == "auto":  # resolved once, before the resources that depend on it
        from mpirl.wiring import resolve_replay_at

        cfg, auto = resolve_replay_at(world, cfg)
        cfg.validate(world.Get_size())
    # --device: a host check of every learner rank, in the gathered verdict (resources)
    spec, record = _check_resources(world, cfg, resumed=manifest is not None)
    refset = None
    if cfg.reference_set and cfg.reference_set != "auto":  # a bad file: before any folder
        refset = _reference_set(world, cfg, None, spec)
    if manifest is None:
        run_dir = _prepare_run_dir(world, cfg)
        part = None
    else:
        assert cfg.run_dir is not None  # --resume sets it to the run folder
        run_dir = Path(cfg.run_dir)
        part = _resume_parts(
            world,
            run_dir,
            manifest,
            topology.layout(world.Get_size(), cfg.buffers, cfg.learners),
            cfg,
            spec,
            record,
        )
    if cfg.reference_set == "auto":  # cached beside the run folder: after it is known
        refset = _reference_set(world, cfg, run_dir, spec)
    return _Setup(cfg, spec, record, manifest, run_dir, part, refset, auto)


def _parse_shared(world: MPI.Comm, argv: list[str] | None) -> Config:
    """`mpirl.run.config.parse` on every rank, with ``--config`` read by rank 0 only and its
    text sent to every rank: the file may exist on the learner's host alone (a rank that could
    not read it would exit while the others wait for it), and every rank must run the same
    configuration, not each its own host's copy of the file."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        path = vars(build_parser().parse_args(argv)).get("config")  # (usage errors: resume_dir)
    if not path:
        return parse(argv)
    text = None
    if world.Get_rank() == 0:
        try:
            text = "T" + Path(path).read_text()
        except FileNotFoundError:
            text = f"Econfig={path!r}: no such file; pass an existing TOML file"
        except (OSError, UnicodeDecodeError) as e:
            text = f"Econfig={path!r} cannot be read ({type(e).__name__}: {e}); pass a TOML file"
    got = _bcast_text(world, text)
    if got[:1] != "T":
        raise ConfigError(got[1:])
    fd, copy = tempfile.mkstemp(prefix="mpirl-config-", suffix=".toml")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(got[1:])
        # the last --config wins (argparse); the run records the path it was given
        cfg = parse([*(sys.argv[1:] if argv is None else argv), "--config", copy])
    except ConfigError as e:  # named as the user gave it
        raise ConfigError(str(e).replace(repr(copy), repr(path))) from None
    finally:
        os.unlink(copy)
    return dataclasses.replace(cfg, config=path)


def _check_resources(world: MPI.Comm, cfg: Config, resumed: bool) -> tuple[EnvSpec, np.dtype]:
    """Each rank checks on its host what its role uses (the env, replay memory summed per host,
    tensorboard, zstandard, the learners' device), and every rank gets the same verdict
    (mpirl.run.resources.check); then image runs must be able to start learning.  Returns the
    env spec and the transition record dtype."""
    spec = resources.check(world, cfg)
    # (not on --resume: the restored memory holds what it had reached)
    if not resumed and cfg.learning_starts > (most := max_learning_starts(cfg, spec)):
        raise ConfigError(
            f"learning_starts={cfg.learning_starts} is too close to replay_capacity="
            f"{cfg.replay_capacity} for image observations: the frame ring can keep the "
            f"memory ~{FRAME_HEADROOM:.0%} below its capacity (more frames per transition "
            "than planned, e.g. short episodes), and sampling would never start while the "
            f"actors wait for it; use --learning-starts at most {most} (or raise "
            "--replay-capacity)"
        )
    return spec, record_dtype(cfg, spec)


def _run(world: MPI.Comm, setup: _Setup) -> int:
    """From here on, any exception on any rank aborts the whole job promptly."""
    from mpirl.wiring import make_wire, run_role  # imports mpi4py, which `mpirl play` must not

    cfg, spec, run_dir, part = setup.cfg, setup.spec, setup.run_dir, setup.part
    rank = world.Get_rank()
    topo = topology.build(world, cfg.buffers, cfg.learners)
    who = f"rank {rank} ({topo.role}" + (
        f" of site {topo.place.site})" if topo.place.site >= 0 else ")"
    )
    failure.install(world, who)
    failure.install_fault(topo.role, rank)  # test-only MPIRL_FAULT; inert otherwise
    # a clean stop writes a final checkpoint: its watchdog allows for the replay memory's size
    stop_signal = failure.StopSignal(
        world, who, grace_s=failure.STOP_GRACE_S + write_allowance_s(replay_footprint(cfg, spec))
    )
    hosts = _hostnames(world)
    profile = resolve_profile(cfg)
    versions = _versions()
    if rank == 0:
        _banner(setup, topo, hosts, profile, versions)
    wire = make_wire(cfg, spec, setup.record, topo.role)
    layout = [
        {"rank": p.rank, "role": p.role, "site": p.site, "host": h}
        for p, h in zip(topo.places, hosts, strict=True)
    ]
    attrs = _file_attrs(world, cfg, topo, hosts, layout, profile, versions, part)
    if setup.auto is not None:  # docs/hdf5.md: how --replay-at auto chose
        attrs["replay_at_auto_json"] = json.dumps(setup.auto)
    name = part_name(topo.role, topo.place.site, rank)
    profiler = None
    if os.environ.get("MPIRL_PROFILE"):  # cProfile every rank: <run_dir>/profile-<name>.pstats
        profiler = cProfile.Profile()
        profiler.enable()
    ckpt = Checkpointer(
        run_dir,
        name,
        failure.FAULT,
        info={
            "config": to_dict(cfg),
            "world_size": world.Get_size(),
            "layout": [{k: x[k] for k in ("rank", "role", "site")} for x in layout],
        },
    )
    with RunLog(
        run_dir / f"{name}.h5", attrs, flush_seconds=cfg.flush_seconds, resume=part is not None
    ) as log:
        ckpt.log = log
        if cfg.tensorboard and (topo.lead or topo.role == "buffer"):  # buffers: a run each
            tb = run_dir / "tensorboard" / ("" if topo.role == "learner" else name)
            log.mirror = TensorBoardMirror(tb, log, topo.role)
        if part is not None:
            assert setup.manifest is not None  # a part comes from a manifest
            _note_resume(log, part, setup.manifest)
        summary = run_role(topo, cfg, spec, wire, log, ckpt, stop_signal, part, setup.refset)
    if summary is not None:  # the lead learner
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(run_dir / f"profile-{name}.pstats")
    return 0


def _banner(
    setup: _Setup,
    topo: Topology,
    hosts: list[str],
    profile: LinkProfile,
    versions: dict[str, str],
) -> None:
    """Rank 0's start-up lines: what runs where, over which link."""
    cfg, spec, part, manifest = setup.cfg, setup.spec, setup.part, setup.manifest
    if part is not None:
        assert manifest is not None  # a part comes from a manifest
        c = manifest.get("counters", {})
        print(
            f"mpirl: resuming {setup.run_dir} from checkpoint {part.id} "
            f"({manifest.get('reason', '?')}): {c.get('updates', 0):,} updates, "
            f"{c.get('env_steps', 0):,} env steps"
        )
    print(
        f"mpirl: {cfg.env}, replay at {cfg.replay_at}, link {cfg.link} "
        f"({profile.describe()}), run folder {setup.run_dir}"
    )
    if setup.auto is not None:
        print(f"mpirl: --replay-at auto: {setup.auto['sentence']}")
        for note in setup.auto["inputs"]["notes"]:
            print(f"mpirl: --replay-at auto: {note}")
    print(f"mpirl: MPI library: {versions['mpi_library']}")
    if spec.image:
        assert spec.frame_shape is not None  # set for image envs
        print(
            f"mpirl: {spec.family} observations uint8 {list(spec.obs_shape)} = "
            f"{spec.stack} x frame {list(spec.frame_shape)}; replay memory "
            f"{replay_footprint(cfg, spec) / 2**30:.2f} GiB for "
            f"{cfg.replay_capacity:,} transitions (each frame stored once); link "
            f"compression {'on (zstd)' if cfg.compress_for(True) else 'off'}"
        )
    print(topology.format_table(topo.places, hosts))
    for w in topology.placement_warnings(topo.places, hosts, profile.emulated):
        print(f"mpirl: warning: {w}")
    sys.stdout.flush()


def _file_attrs(
    world: MPI.Comm,
    cfg: Config,
    topo: Topology,
    hosts: list[str],
    layout: list[dict[str, Any]],
    profile: LinkProfile,
    versions: dict[str, str],
    part: Part | None,
) -> dict[str, Any]:
    """Run-level attributes of this rank's HDF5 file (docs/hdf5.md)."""
    rank = world.Get_rank()
    return {
        "config_json": json.dumps(to_dict(cfg)),
        "versions_json": json.dumps(versions),
        "slurm_json": json.dumps(slurm_info()),
        "layout_json": json.dumps(layout),
        "rank": rank,
        "role": topo.role,
        "site": topo.place.site,
        "host": hosts[rank],
        "world_size": world.Get_size(),
        "link_profile": profile.describe(),
        "seeds_json": json.dumps(seeds.of_rank(cfg, topo, None if part is None else part.id)),
    }


def _note_resume(log: RunLog, part: Part, manifest: dict) -> None:
    """Where this launch continues: rows past the part's log_rows were written by the launch
    before, after its part of the checkpoint (kept; docs/reliability.md says which to cut)."""
    resumes = json.loads(log.file.attrs.get("resumes_json", "[]"))
    resumes.append(
        {
            "checkpoint": part.id,
            "reason": manifest.get("reason"),
            "unix": time.time(),
            "rows_at_checkpoint": part.meta.get("log_rows", {}),
            "rows_before_resume": file_rows(log.file),
        }
    )
    log.set_attrs(resumes_json=json.dumps(resumes))


if __name__ == "__main__":
    sys.exit(main())
