"""mpirl.sweep: spec expansion, the dry-run listing, bad specs, the SLURM array script, resuming
a sweep, and one tiny real sweep (2 runs under mpirun -n 3)."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mpirun import mpirun_cmd

from mpirl import sweep as S

ROOT = Path(__file__).resolve().parents[1]


def spec_file(tmp_path: Path, body: str, name: str = "spec.toml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body).replace("OUT", str(tmp_path / "out")))
    return p


BASIC = """
    out = "OUT"
    ranks = 3
    seeds = [0, 1]
    [flags]
    env = "CartPole-v1"
    hidden = [32, 32]
    dueling = false
    [budget]
    max_seconds = 5
    [axes]
    bandwidth_mbps = [100, 0.5]
    replay_at = ["learner", "buffer"]
"""


def test_expansion_order_folders_and_arguments(tmp_path):
    spec = S.load_spec(spec_file(tmp_path, BASIC))
    runs = S.expand(spec)
    assert len(runs) == 2 * 2 * 2
    assert [r.index for r in runs] == list(range(8))
    # seed-major; then the axes as written, the last fastest
    assert [(r.seed, r.cell["bandwidth_mbps"], r.cell["replay_at"]) for r in runs[:4]] == [
        (0, "100", "learner"),
        (0, "100", "buffer"),
        (0, "0.5", "learner"),
        (0, "0.5", "buffer"),
    ]
    assert {r.seed for r in runs[4:]} == {1}
    out = tmp_path / "out"
    assert runs[3].run_dir == out / "bandwidth_mbps=0.5,replay_at=buffer" / "seed0"
    assert len({r.run_dir for r in runs}) == 8
    assert runs[3].mpirl_args() == [
        "--env",
        "CartPole-v1",
        "--hidden",
        "32",
        "32",
        "--no-dueling",
        "--max-seconds",
        "5",
        "--bandwidth-mbps",
        "0.5",
        "--replay-at",
        "buffer",
        "--seed",
        "0",
        "--run-dir",
        str(runs[3].run_dir),
    ]
    cmd = runs[3].command(spec, python="python")
    assert cmd[:6] == ["mpirun", "-n", "3", "python", "-m", "mpirl.main"]
    assert S.check(spec, runs) == []


def test_group_axis_and_no_axes(tmp_path):
    spec = S.load_spec(
        spec_file(
            tmp_path,
            """
        out = "OUT"
        seeds = [3]
        [axes]
        link = [{label = "slow", link = "wan-100m-30ms", bandwidth_mbps = 1},
                {link = "none", bandwidth_mbps = 1000}]
    """,
        )
    )
    runs = S.expand(spec)
    assert [r.cell["link"] for r in runs] == ["slow", "none-1000"]
    assert runs[0].flags == {"link": "wan-100m-30ms", "bandwidth_mbps": 1, "seed": 3}
    assert runs[0].run_dir == tmp_path / "out" / "link=slow" / "seed3"
    assert S.check(spec, runs) == []
    plain = S.expand(S.load_spec(spec_file(tmp_path, 'out = "OUT"', "plain.toml")))
    assert len(plain) == 1 and plain[0].run_dir == tmp_path / "out" / "seed0"
    assert plain[0].mpirl_args() == ["--seed", "0", "--run-dir", str(plain[0].run_dir)]


@pytest.mark.parametrize(
    "body, needle",
    [
        ("ranks = 3", "out = None"),
        ('out = "OUT"\nflags = 3', "[flags] must be a table"),
        ('out = "OUT"\nmystery = 1', "unknown key(s) ['mystery']"),
        ('out = "OUT"\nranks = 2', "ranks = 2 must be an integer >= 3"),
        ('out = "OUT"\nexport = 1', "export = 1 must be a folder"),
        ('out = "OUT"\nseeds = []', "seeds = [] must be a non-empty list"),
        ('out = "OUT"\nseeds = [0, 0]', "repeat a seed"),
        ('out = "OUT"\nseeds = [-1]', "integers >= 0"),
        ('out = "OUT"\nlauncher = "mpirun"', "launcher = 'mpirun' must be a non-empty list"),
        ('out = "OUT"\n[flags]\nseed = 3', "'seed' is set by the sweep"),
        ('out = "OUT"\n[flags]\nrun-dir = "x"', "'run-dir' is set by the sweep"),
        ('out = "OUT"\n[flags]\nlr = {a = 1}', "[flags] lr = {'a': 1}: a flag value must be"),
        ('out = "OUT"\n[flags]\nlr-x = 1\nlr_x = 2', "'lr_x' is given twice"),
        ('out = "OUT"\n[axes]\nlr = []', "[axes] lr = []: an axis is a non-empty list"),
        ('out = "OUT"\n[axes]\nlr = 0.1', "[axes] lr = 0.1: an axis is a non-empty list"),
        ('out = "OUT"\n[axes]\nlr = [0.1, 0.1]', "[axes] lr: values ['0.1'] repeat"),
        ('out = "OUT"\n[axes]\nx = [{lr = 1}, 2]', "[axes] x: mix of tables"),
        ('out = "OUT"\n[axes]\nx = [{lr = 1}, {gamma = 1}]', "every value of a group axis sets"),
        ('out = "OUT"\n[flags]\nlr = 1\n[axes]\nlr = [1, 2]', "flag 'lr' is set in [flags] and in"),
        (
            'out = "OUT"\n[budget]\nmax_seconds = 1\n[axes]\nx = [{max_seconds = 2}]',
            "'max_seconds' is set in [budget] and in [axes] x",
        ),
        ('out = "OUT"\n[slurm]\nqueue = "x"', "unknown key(s) ['queue'] in [slurm]"),
        ('out = "OUT"\n[slurm]\nmax_parallel = 0', "max_parallel = 0 must be an integer >= 1"),
        ('out = "OUT"\n[slurm]\nsbatch = "--x"', "[slurm] sbatch = '--x' must be a list"),
        ("out = [", "is not valid TOML"),
    ],
)
def test_bad_spec_names_the_key(tmp_path, body, needle):
    with pytest.raises(S.SpecError) as e:
        S.load_spec(spec_file(tmp_path, body))
    assert needle in str(e.value)


def test_missing_spec_file(tmp_path):
    with pytest.raises(S.SpecError, match="no such file"):
        S.load_spec(tmp_path / "nope.toml")


def test_flags_are_checked_by_mpirls_parser(tmp_path, capsys):
    p = spec_file(tmp_path, BASIC.replace("[axes]", "[axes]\nlr = [0.001, -1]"))
    assert S.main([str(p)]) == 2
    err = capsys.readouterr().err
    assert "lr=-1.0 must be > 0" in err and "run 4 (lr=-1, " in err and "and 3 more" in err
    p = spec_file(tmp_path, BASIC + "    warp_speed = [1, 2]\n")
    assert S.main([str(p), "--dry-run"]) == 2  # the listing still prints, then the error
    out, err = capsys.readouterr()
    assert "[0] todo" in out
    assert "--warp-speed (in [axes] warp_speed): not an option of this mpirl" in err
    p = spec_file(tmp_path, BASIC.replace('"buffer"]', '"cloud"]'))
    assert S.main([str(p)]) == 2
    assert "--replay-at: invalid choice: 'cloud'" in capsys.readouterr().err
    p = spec_file(tmp_path, BASIC.replace("ranks = 3", "ranks = 3\n    [flags.x]"))
    with pytest.raises(S.SpecError):  # a table as a flag value
        S.load_spec(p)
    p = spec_file(tmp_path, BASIC.replace("[budget]", "buffers = 2\n    [budget]"))
    assert S.main([str(p)]) == 2  # 3 ranks cannot hold 2 buffers and their actors
    assert "buffers" in capsys.readouterr().err


def _summary(run_dir: Path, stop: str) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "learner.h5").write_bytes(b"")
    (run_dir / "summary.json").write_text(json.dumps({"stop_reason": stop}))


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT", "SIGUSR1"])
def test_a_run_stopped_by_a_signal_is_not_complete(tmp_path, stop):
    """SIGUSR1 too: it is the clean stop under Open MPI (mpirl.run.failure.STOP_SIGNALS)."""
    _summary(tmp_path / "run", stop)
    assert S.run_status(tmp_path / "run") != "done"


def test_dry_run_lists_every_run_and_its_status(tmp_path, capsys):
    p = spec_file(tmp_path, BASIC)
    runs = S.expand(S.load_spec(p))
    _summary(runs[0].run_dir, "max_seconds")  # complete
    _summary(runs[1].run_dir, "SIGTERM")  # stopped by a signal: not complete
    runs[2].run_dir.mkdir(parents=True)
    (runs[2].run_dir / "learner.h5").write_bytes(b"")  # killed: incomplete
    runs[3].run_dir.mkdir(parents=True)  # empty: as good as new
    assert S.main([str(p), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"# {p}: 8 runs (2 seeds x 2 bandwidth_mbps x 2 replay_at)")
    listed = [x for x in lines if x.startswith("[")]
    assert len(listed) == 8
    for r, line in zip(runs, listed, strict=True):
        assert line.startswith(f"[{r.index}] ") and line.endswith(f"  {r.run_dir}")
    assert "done (skipped)" in listed[0] and "incomplete (set aside" in listed[1]
    assert "incomplete (set aside" in listed[2] and "todo" in listed[3]
    cmds = [x.strip() for x in lines if x.startswith("    ")]
    assert cmds[5].startswith("mpirun -n 3 python -m mpirl.main --env CartPole-v1")
    assert cmds[5].endswith(f"--seed 1 --run-dir {runs[5].run_dir}")
    assert lines[-1] == "# 1 done, 2 incomplete, 5 todo"
    assert not (tmp_path / "out" / "spec.toml").exists()  # a dry run writes nothing


def test_slurm_array_script(tmp_path, capsys):
    p = spec_file(
        tmp_path,
        BASIC
        + """
    [slurm]
    time = "01:00:00"
    max_parallel = 3
    sbatch = ["--partition=cpu", "--account=rl"]
    setup = ["module load openmpi", "source .venv-sysmpi/bin/activate"]
    """,
    )
    assert S.main([str(p), "--slurm"]) == 0
    text = capsys.readouterr().out
    for needed in (
        "#SBATCH --array=0-7%3",
        "#SBATCH --ntasks=3",
        "#SBATCH --time=01:00:00",
        "#SBATCH --partition=cpu",
        "#SBATCH --account=rl",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:TERM@120",
        "module load openmpi\n",
        "export HYDRA_LAUNCHER=fork\n",
        f'exec python -m mpirl.sweep {p} --index "$SLURM_ARRAY_TASK_ID"',
    ):
        assert needed in text
    lines = text.splitlines()
    first_cmd = next(i for i, x in enumerate(lines[1:], 1) if x.strip() and not x.startswith("#"))
    assert all(i < first_cmd for i, x in enumerate(lines) if x.startswith("#SBATCH"))
    out = tmp_path / "array.sbatch"
    assert S.main([str(p), "--slurm", "--write", str(out)]) == 0
    assert out.read_text() == text
    r = subprocess.run(["bash", "-n", str(out)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert S.main([str(p), "--index", "8"]) == 2
    assert "has runs 0-7" in capsys.readouterr().err


def test_incomplete_runs_are_set_aside_or_resumed(tmp_path, capsys):
    """With a launcher that runs nothing (`true`), what the sweep does with old folders."""
    body = BASIC.replace("ranks = 3", 'ranks = 3\n    launcher = ["true"]')
    p = spec_file(tmp_path, body)
    runs = S.expand(S.load_spec(p))
    _summary(runs[0].run_dir, "target_return")
    runs[1].run_dir.mkdir(parents=True)
    (runs[1].run_dir / "learner.h5").write_bytes(b"x")
    assert S.main([str(p), "--index", "0"]) == 0
    assert "complete, skipped" in capsys.readouterr().out
    assert S.main([str(p), "--index", "1"]) == 0
    moved = runs[1].run_dir.with_name("seed0.incomplete-1")
    assert (moved / "learner.h5").read_bytes() == b"x"  # kept, never deleted
    assert (tmp_path / "out" / "spec.toml").read_text() == p.read_text()
    # resume = true and a complete checkpoint: --resume with the budget flags only
    p = spec_file(tmp_path, body.replace("ranks = 3", "ranks = 3\n    resume = true"))
    ck = runs[2].run_dir / "checkpoint"
    ck.mkdir(parents=True)
    (ck / "manifest-000003.json").write_text("{}")
    assert S.main([str(p), "--index", "2"]) == 0
    assert "differs from" in capsys.readouterr().err  # the spec changed since the first run
    log = runs[2].run_dir.with_name("seed0.log").read_text()
    assert f"-m mpirl.main --resume {runs[2].run_dir} --max-seconds 5\n" in log
    rec = json.loads((runs[2].run_dir / "sweep.json").read_text())
    assert rec["returncode"] == 0 and rec["index"] == 2 and rec["loadavg_1min"]["samples"] >= 2


def test_a_failed_run_does_not_stop_the_sweep(tmp_path, capsys):
    p = spec_file(tmp_path, BASIC.replace("ranks = 3", 'ranks = 3\n    launcher = ["false"]'))
    assert S.main([str(p)]) == 1
    out, err = capsys.readouterr()
    assert out.count("FAILED (exit 1") == 8 and "8 of 8 run(s) failed" in err


def test_a_run_stopped_by_a_signal_is_not_exported_and_runs_again(tmp_path, monkeypatch, capsys):
    """A stop signal mid-run (the sweep's SIGTERM, relayed as a clean stop) ends the run with
    exit 0 and a summary whose stop is the signal.  Its row must not be exported: an exported
    row is skipped by every later sweep, so the stopped run would stay in the data (it did: a
    4 s run of a 360 s cell).  The next sweep sets the folder aside and runs it again."""
    fake = tmp_path / "fake_mpirun.py"
    fake.write_text(
        "import json, pathlib, sys\n"
        "d = pathlib.Path(sys.argv[sys.argv.index('--run-dir') + 1])\n"
        "d.mkdir(parents=True, exist_ok=True)\n"
        "(d / 'summary.json').write_text(json.dumps({'stop_reason': 'SIGUSR1'}))\n"
    )
    extra = f'ranks = 3\n    launcher = ["{sys.executable}", "{fake}"]\n    export = "data"'
    monkeypatch.chdir(tmp_path)
    p = spec_file(tmp_path, BASIC.replace('"OUT"', '"out"').replace("ranks = 3", extra))
    exports = []
    monkeypatch.setattr(S, "export_run", lambda spec, run, say=print: exports.append(run.index))
    assert S.main([str(p), "--index", "0"]) == 0
    assert exports == [] and "stopped by a signal, not complete" in capsys.readouterr().out
    assert S.main([str(p), "--index", "0"]) == 0
    out = capsys.readouterr().out
    assert "incomplete, moved to" in out and "skipped" not in out and exports == []


def test_runs_whose_rows_are_exported_are_skipped(tmp_path, monkeypatch, capsys):
    """A sweep continued on another machine (no runs/ folder) skips the runs whose rows the
    spec's export already holds, by the export's own run key; the rest still run (here the
    launcher `false` fails them)."""
    from types import SimpleNamespace

    from analysis.export import run_id

    monkeypatch.chdir(tmp_path)
    extra = 'ranks = 3\n    launcher = ["false"]\n    export = "data"'
    p = spec_file(tmp_path, BASIC.replace('"OUT"', '"out"').replace("ranks = 3", extra))
    spec = S.load_spec(p)
    runs = S.expand(spec)
    assert S.exported(spec) == frozenset()  # no runs.csv yet
    (tmp_path / "data").mkdir()
    keys = [run_id(SimpleNamespace(path=r.run_dir)) for r in runs[:3]]
    assert keys[0] == str(Path("out") / runs[0].run_dir.relative_to("out"))
    assert [S.run_key(r.run_dir) for r in runs[:3]] == keys
    with open(tmp_path / "data" / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["run", "seed"])
        w.writeheader()
        w.writerows({"run": k, "seed": 0} for k in keys)
    assert S.exported(spec) == frozenset(keys)
    assert S.main([str(p), "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "# 3 exported, 5 todo"
    assert S.main([str(p), "--index", "1"]) == 0  # exported: not launched
    assert "its row is in data/runs.csv, skipped" in capsys.readouterr().out
    assert S.main([str(p)]) == 1
    out, err = capsys.readouterr()
    assert out.count("skipped") == 3 and "5 of 8 run(s) failed: [3, 4, 5, 6, 7]" in err


def test_repository_specs_pass_the_flag_check():
    """The repository's specs are valid (the paper's pacing flags and budgets included) and pin
    the learner with jobs/pin.sh; the equal-wall-time ones give both placements the
    same T and no other stop, and export their rows."""
    fixed = ROOT / "experiments" / "fixed-updates"
    for path in (
        fixed / "paper.toml",
        fixed / "paper-minatar.toml",
        ROOT / "experiments" / "matrix.toml",
    ):
        spec = S.load_spec(path)
        assert S.check(spec, S.expand(spec)) == [], path
    paper = S.load_spec(fixed / "paper.toml")
    assert paper.launcher[-1] == "jobs/pin.sh" and "max_updates" in paper.budget
    assert len(S.expand(S.load_spec(ROOT / "experiments" / "matrix.toml"))) == 24
    equal = sorted((ROOT / "experiments" / "equal-time").glob("*.toml"))
    assert {p.stem for p in equal} >= {"A", "B", "C", "M", "map", "pilot"}
    for path in equal:
        spec = S.load_spec(path)
        runs = S.expand(spec)
        assert S.check(spec, runs) == [], path
        assert spec.launcher[-1] == "jobs/pin.sh" and spec.export is not None, path
        for run in runs:
            assert run.flags["max_updates"] == 0 and run.flags["max_env_steps"] == 0, path
            assert run.flags["max_seconds"] > 0 and run.flags["target_return"] == "none", path
    seeds = {p.stem: len(S.load_spec(p).seeds) for p in equal}
    assert seeds["A"] >= 20 and seeds["B"] >= 20 and seeds["C"] >= 20 and seeds["M"] >= 10
    assert seeds["map"] >= 10


@pytest.mark.mpi
def test_tiny_real_sweep_runs_and_resumes(tmp_path):
    """Two runs of a few seconds under mpirun -n 3, one after another; the second invocation
    skips both. Each finished run's row lands in the spec's export folder (analysis.export)."""
    launcher = json.dumps([*mpirun_cmd(3)[:-1], "{ranks}"])  # Open MPI: --oversubscribe
    p = spec_file(
        tmp_path,
        f"""
        out = "OUT"
        export = "OUT-data"
        ranks = 3
        launcher = {launcher}
        [flags]
        target_return = "none"
        hidden = [16]
        learning_starts = 100
        eval_every = 100
        eval_episodes = 2
        progress_seconds = 0
        checkpoint_seconds = 0
        [budget]
        max_seconds = 2
        [axes]
        replay_at = ["learner", "buffer"]
    """,
    )
    cmd = [sys.executable, "-m", "mpirl.sweep", str(p)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, check=False)
    runs = S.expand(S.load_spec(p))
    logs = "\n".join(
        x.run_dir.with_name("seed0.log").read_text()
        for x in runs
        if x.run_dir.with_name("seed0.log").exists()
    )
    assert r.returncode == 0, r.stdout + r.stderr + logs
    for run in runs:
        summary = json.loads((run.run_dir / "summary.json").read_text())
        assert summary["stop_reason"] == "max_seconds" and summary["updates"] > 0
        assert json.loads((run.run_dir / "sweep.json").read_text())["returncode"] == 0
        assert (run.run_dir / "learner.h5").exists()
    with (tmp_path / "out-data" / "runs.csv").open() as f:
        rows = {r["replay_at"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"learner", "buffer"}, rows
    assert all(
        float(r["T"]) == pytest.approx(2, abs=0.5) and int(r["updates"]) > 0 for r in rows.values()
    )
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert r.returncode == 0 and r.stdout.count("complete, skipped") == 2, r.stdout + r.stderr
    shutil.rmtree(tmp_path / "out")


def test_the_documented_example_spec_is_valid(tmp_path):
    text = (ROOT / "jobs" / "README.md").read_text()
    block = text.split("```toml\n", 1)[1].split("```", 1)[0]
    p = tmp_path / "example.toml"
    p.write_text(block.replace("runs/my-sweep", str(tmp_path / "out")))
    spec = S.load_spec(p)
    runs = S.expand(spec)
    assert len(runs) == 3 * 2 * 2 * 2 and S.check(spec, runs) == []
