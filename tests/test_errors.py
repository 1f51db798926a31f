"""Bad input: one clear line from one rank, naming the value and the fix; non-zero exit; no hang."""

import json
from pathlib import Path

import numpy as np
import pytest
from mpirun import one_error, run_mpirl

CASES = [
    # (ranks, args, text the error must contain)
    (2, [], "needs >= 3 ranks"),
    (4, ["--buffers", "2"], "needs >= 5 ranks"),
    (3, ["--env", "Pendulum-v1"], "needs a Discrete action space"),
    (3, ["--env", "NoSuchEnv-v0"], "is not a gymnasium environment id"),
    (3, ["--batch-size", "0"], "batch_size=0 must be an integer > 0"),
    (3, ["--replay-capacity", "100000000000"], "lower --replay-capacity"),
    (3, ["--link", "carrier-pigeon"], "link='carrier-pigeon' is not a known profile"),
    (3, ["--config", "/nonexistent.toml"], "no such file"),
    (3, ["--gamma", "2"], "gamma=2.0 must be in (0, 1]"),
    # the user's own env (tests/toy_env.py, importable from the tests folder)
    (3, ["--env", "no_such_pkg.envs:Foo-v0"], "cannot import module 'no_such_pkg.envs'"),
    (3, ["--env-kwargs", '{"n": 3,}'], "is not valid JSON"),
    (
        3,
        ["--env", "toy_env:MpirlSignal-v0", "--env-kwargs", '{"colour": 1}'],
        "takes no keyword argument 'colour'",
    ),
    (
        3,
        ["--env", "toy_env:MpirlSignal-v0", "--env-kwargs", '{"continuous": true}'],
        "needs a Discrete action space",
    ),
    (3, ["--env-wrappers", "toy_env:NOT_CALLABLE"], "'toy_env:NOT_CALLABLE' is not callable"),
    (3, ["--env-wrappers", "toy_env:plus_one,nowhere:fn"], "cannot import module 'nowhere'"),
]
TESTS = str(Path(__file__).parent)


def config_error(n: int, *argv: str) -> str:
    """The error ``mpirun -n N python -m mpirl.main ARGV`` stops with, found in-process the way
    every rank finds it (mpirl.main): parse, validate for N ranks, each rank's host checks
    (`mpirl.run.resources.local_row`, every rank on this host) and the verdict all of them reach
    from the gathered rows.  "" when the configuration passes."""
    from mpirl.run import resources
    from mpirl.run.config import ConfigError, parse
    from mpirl.transport import topology

    try:
        cfg = parse(list(argv))
        cfg.validate(n)
        places = topology.layout(n, cfg.buffers)  # as resources.check lays them out
        rows = np.stack([resources.local_row(cfg, p.role, "localhost")[0] for p in places])
        resources.decide(rows, places, cfg)
    except (ConfigError, topology.LayoutError) as e:
        return str(e)
    return ""


@pytest.mark.parametrize("n, args, text", CASES, ids=[c[2][:30] for c in CASES])
def test_bad_input_is_one_clear_error(monkeypatch, n, args, text):
    monkeypatch.syspath_prepend(TESTS)  # toy_env
    err = config_error(n, *args)
    assert text in err and "\n" not in err, err


def test_a_good_configuration_passes():
    assert config_error(3) == "" and config_error(5, "--buffers", "2") == ""


# Under mpirun: the error is printed once (rank 0), the exit status is 2, nothing hangs and no
# run folder is made: a bad value every rank finds alike (validate), and a host check whose
# verdict the ranks reach from gathered rows (the env builds on the learner and the actors).
MPI_CASES = [CASES[0], CASES[3]]


@pytest.mark.mpi
@pytest.mark.parametrize("n, args, text", MPI_CASES, ids=[c[2][:30] for c in MPI_CASES])
def test_bad_input_one_line_from_rank_0_under_mpirun(tmp_path, n, args, text):
    p = run_mpirl(n, *args, "--run-dir", str(tmp_path / "run"), timeout=60)
    assert text in one_error(p)
    assert not (tmp_path / "run").exists()


@pytest.mark.mpi
def test_unknown_option_usage_once(tmp_path):
    p = run_mpirl(3, "--bogus", timeout=60)
    assert p.returncode == 2
    assert p.stderr.count("unrecognized arguments: --bogus") == 1


@pytest.mark.mpi
def test_existing_run_dir_is_never_overwritten(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "keep.txt").write_text("mine")
    p = run_mpirl(3, "--run-dir", str(run), timeout=60)
    assert p.returncode != 0 and "exists and is not an empty folder" in p.stderr
    assert sorted(x.name for x in run.iterdir()) == ["keep.txt"]


@pytest.mark.mpi
def test_help_once(tmp_path):
    p = run_mpirl(3, "--help", timeout=60)
    assert p.returncode == 0
    assert p.stdout.count("usage:") == 1 and "wan-100m-30ms" in p.stdout


@pytest.mark.mpi
def test_sigterm_stops_cleanly(tmp_path):
    """SLURM preemption / Ctrl-C: SIGTERM to mpirun -> every rank stops cleanly, files complete."""
    import json
    import subprocess
    import sys

    from mpirun import mpirun_cmd, stop_signal, wait_for_training

    run = tmp_path / "run"
    proc = subprocess.Popen(
        [
            *mpirun_cmd(4),
            sys.executable,
            "-m",
            "mpirl.main",
            "--run-dir",
            str(run),
            "--max-seconds",
            "120",
            "--progress-seconds",
            "1",
            "--target-return",
            "none",
            "--hidden",
            "16",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_training(proc, run)
    proc.send_signal(stop_signal())  # SIGTERM; Open MPI: SIGUSR1
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == stop_signal().name
    import h5py
    import numpy as np

    files = {}
    for f in sorted(run.glob("*.h5")):
        with h5py.File(f, "r") as h:
            assert len(h.attrs["config_json"]) > 0
            data = {}
            for g in h.values():  # every stream complete: its fields of one length
                lengths = {k: len(g[k]) for k in g}
                assert len(set(lengths.values())) == 1, (f.name, g.name, lengths)
                data.update({f"{g.name[1:]}/{k}": g[k][()] for k in g})
            files[f.name] = data, dict(h.attrs)
    assert sorted(files) == ["actor-2.h5", "actor-3.h5", "buffer-0.h5", "learner.h5"]
    # the counters agree: each rank's final attributes with its own last row, and across ranks
    # (what the actors stepped = what the buffer counted = what the learner reported)
    steps = 0
    for a in ("actor-2.h5", "actor-3.h5"):
        data, attrs = files[a]
        assert data["actor/env_steps"].size > 0, f"{a}: no /actor rows reached the file"
        assert attrs["env_steps"] == data["actor/env_steps"][-1] > 0, a
        assert attrs["episodes"] == len(data["episodes/ret"]), a
        steps += attrs["env_steps"]
    buf, battrs = files["buffer-0.h5"]
    assert battrs["env_steps"] == buf["site/env_steps"][-1] == steps
    assert battrs["inserted"] == buf["site/inserted"][-1] > 0
    assert battrs["sampled"] == buf["site/sampled"][-1]
    learner, lattrs = files["learner.h5"]
    assert summary["env_steps"] == lattrs["env_steps"] == steps
    assert summary["updates"] == lattrs["updates"] == len(learner["updates/update"]) > 0
    np.testing.assert_array_equal(learner["updates/update"], np.arange(1, summary["updates"] + 1))


# ---- --resume: the same contract (one line from rank 0, non-zero exit, no hang) ---------------


def _fake_run(path, world_size: int, garbage_part: str | None = None):
    """A run folder with a checkpoint written by mpirl.run.checkpoint, without running anything."""
    import numpy as np

    from mpirl.run import checkpoint as ck
    from mpirl.run.config import parse, to_dict
    from mpirl.transport.topology import layout

    places = layout(world_size, 1)
    names = [ck.part_name(p.role, p.site, p.rank) for p in places]
    for name in names:
        (path / f"{name}.h5").parent.mkdir(parents=True, exist_ok=True)
        (path / f"{name}.h5").write_bytes(b"")
        ck.write_part(path, 1, name, {}, {"x": np.arange(3)} if name == garbage_part else None)
    if garbage_part:  # readable bytes that match their hash, but not an .npz
        f = ck.root(path) / "000001" / f"{garbage_part}.npz"
        f.write_bytes(b"not a zip file" * 10)
        part = json.loads(f.with_suffix(".json").read_text())
        part["files"][f.name] = {"bytes": f.stat().st_size, "sha256": ck._sha256(f)}
        f.with_suffix(".json").write_text(json.dumps(part))
    ck.write_manifest(
        path,
        1,
        names,
        {
            "config": to_dict(parse(["--hidden", "32", "32"])),
            "world_size": world_size,
            "layout": [{"rank": p.rank, "role": p.role, "site": p.site} for p in places],
            "reason": "test",
            "counters": {},
        },
    )
    return path


RESUME_CASES = [
    # (ranks, how to make RUN_DIR, extra args, text the one error line must contain)
    (3, "missing", [], "no such run folder"),
    (3, "empty", [], "has no complete checkpoint"),
    (3, "fake3", ["--lr", "0.1"], "only --max-seconds, --max-env-steps"),
    (
        3,
        "fake4",
        [],
        "checkpointed by 4 ranks (1 learner, 1 buffer(s), 2 actors) and this job has 3",
    ),
    (3, "corrupt", [], "no usable checkpoint"),
    (3, "garbage", [], "rank 1: checkpoint 1: buffer-0's files cannot be read"),
]


@pytest.mark.mpi
@pytest.mark.parametrize("n, make, args, text", RESUME_CASES, ids=[c[1] for c in RESUME_CASES])
def test_bad_resume_one_clear_error(tmp_path, n, make, args, text):
    run = tmp_path / "run"
    if make == "empty":
        run.mkdir()
    elif make in ("fake3", "fake4"):
        _fake_run(run, int(make[-1]))
    elif make == "corrupt":
        _fake_run(run, 3, garbage_part="buffer-0")
        f = run / "checkpoint" / "000001" / "buffer-0.npz"
        f.write_bytes(f.read_bytes() + b"x")
    elif make == "garbage":
        _fake_run(run, 3, garbage_part="buffer-0")
    p = run_mpirl(n, "--resume", str(run), *args, timeout=60)
    assert text in one_error(p)
