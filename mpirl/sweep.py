"""Sweeps over any mpirl flags: a TOML spec -> one run per (seed, combination of axis values).

    python -m mpirl.sweep SPEC --dry-run          # every run: index, status, run folder, command
    python -m mpirl.sweep SPEC                    # run them here, one after another (resumable)
    python -m mpirl.sweep SPEC --index I          # run only run I (what a SLURM array task does)
    python -m mpirl.sweep SPEC --slurm [--write F]  # the sbatch array script, one task per run

The spec (every key but ``out`` optional; flag names as in ``python -m mpirl.main --help``, with
underscores or dashes)::

    out = "runs/my-sweep"          # output root (relative to the current folder)
    ranks = 5                      # mpirun -n (1 learner + buffers + actors), default 9
    seeds = [0, 1, 2]              # default [0]; --seed of each run
    launcher = ["mpirun", "-n", "{ranks}"]   # the default; srun works too
    resume = false                 # true: an interrupted run continues from its checkpoint
    export = "docs/results/data/x" # after each finished run, its row and curves are merged into
                                   # x/runs.csv and x/curves.csv (python -m analysis.export)

    [flags]                        # the same in every run
    env = "CartPole-v1"
    hidden = [64, 64]              # a list for a flag that takes several values
    dueling = true                 # a boolean flag: --dueling / --no-dueling

    [budget]                       # flags too, kept apart so the analysis knows the budget
    max_seconds = 300

    [axes]                         # every combination; the last axis varies fastest
    replay_at = ["learner", "buffer"]
    bandwidth_mbps = [100, 1]
    pace = [{label = "slow", actor_steps_per_s = 100}, {label = "fast", actor_steps_per_s = 400}]

    [slurm]                        # only for --slurm
    time = "00:30:00"              # per array task (one run)
    max_parallel = 4               # --array=0-(N-1)%4
    sbatch = ["--partition=cpu"]   # more #SBATCH options
    setup = ["source .venv/bin/activate"]   # shell lines before the run (the default)

An axis is a flag and its values, or, when its values are tables, a group of flags set together
(each table is one value; ``label`` names it in the run folder, else its values do). Runs are
ordered seed-major (every combination for seed 0, then for seed 1, ...), so a sweep stopped early
has whole seeds; put ``replay_at`` last and each pair of placements runs back to back.

Each run's folder is ``OUT/<axis>=<value>,<axis>=<value>/seed<k>`` (``OUT/seed<k>`` without axes).
A run is *complete* when its folder has ``summary.json`` with a stop that was not a signal; those
are skipped, so rerunning the same command continues a sweep. With ``export``, a run whose row
is already in the export's runs.csv is skipped too (it finished in an earlier sitting, maybe on
another machine, and its row was committed; delete the row to run it again). An incomplete folder
is renamed
``<folder>.incomplete-<n>`` (kept, never deleted; analysis skips it, `analysis.runs.find_runs`)
and the run starts over, or, with
``resume = true`` and a complete checkpoint in it, continues with ``--resume`` (``--max-seconds``
then counts the new launch only). After each run, ``sweep.json`` in its folder records the
command, exit status, times, host and the load average sampled every 5 s while it ran (its own
ranks included). The run's output goes to ``<folder>.log``.

Every run's flags are checked with mpirl's own parser (``mpirl.run.config.parse``) and layout check
before anything starts, so an unknown flag or a bad value is one error naming the run, the flag
and the value. Exit status: 0 = every run complete, 1 = some run failed, 2 = a bad spec.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import io
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpirl.run.config import RESUME_FLAGS, Config, ConfigError, parse
from mpirl.transport.topology import LayoutError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from mpirl.launch import Relay
from mpirl.run.failure import STOP_SIGNALS

__all__ = [
    "Run",
    "Spec",
    "SpecError",
    "expand",
    "exported",
    "load_spec",
    "main",
    "run_key",
    "run_status",
    "slurm_script",
]

TOP_KEYS = {
    "out",
    "ranks",
    "seeds",
    "launcher",
    "resume",
    "export",
    "flags",
    "budget",
    "axes",
    "slurm",
}
SLURM_KEYS = {"time", "max_parallel", "sbatch", "setup", "job_name"}
#: set by the sweep for each run: never a fixed flag or an axis
RESERVED = {"seed", "run_dir", "config", "resume"}
DEFAULT_LAUNCHER = ("mpirun", "-n", "{ranks}")
SIGNAL_STOPS = {s.name for s in STOP_SIGNALS}  # a run stopped by one of these is not complete
LOAD_SAMPLE_S = 5.0


class SpecError(ValueError):
    """A bad sweep spec; the message names the key and value."""


@dataclass(frozen=True)
class Spec:
    path: Path
    out: Path
    ranks: int = 9
    seeds: tuple[int, ...] = (0,)
    launcher: tuple[str, ...] = DEFAULT_LAUNCHER
    resume: bool = False
    export: Path | None = None  # after each finished run: python -m analysis.export into it
    flags: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    #: axis name -> list of values; a value is {flag: value} (one flag, or a group)
    axes: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    slurm: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Run:
    index: int
    seed: int
    cell: dict[str, str]  # axis -> value label
    flags: dict[str, Any]  # every mpirl flag of this run but run_dir (seed included)
    run_dir: Path

    def mpirl_args(self) -> list[str]:
        return flag_args({**self.flags, "run_dir": str(self.run_dir)})

    def command(self, spec: Spec, python: str | None = None) -> list[str]:
        launcher = [a.replace("{ranks}", str(spec.ranks)) for a in spec.launcher]
        return [*launcher, python or sys.executable, "-m", "mpirl.main", *self.mpirl_args()]


# --- the spec ------------------------------------------------------------------------------------


def _flag_name(key: str, where: str) -> str:
    name = key.replace("-", "_")
    if name in RESERVED:
        raise SpecError(
            f"{where}: {key!r} is set by the sweep for each run (seeds = [...] for "
            "the seeds; folders come from out); remove it"
        )
    return name


def _check_value(v: Any, where: str) -> Any:
    if isinstance(v, bool | int | float | str):
        return v
    if (
        isinstance(v, list)
        and v
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
    ):
        return list(v)
    raise SpecError(
        f"{where} = {v!r}: a flag value must be a string, number, boolean or a "
        "non-empty list of numbers"
    )


def _flags_table(t: Any, where: str) -> dict[str, Any]:
    if not isinstance(t, dict):
        raise SpecError(f"[{where}] must be a table of flag = value, not {t!r}")
    out = {}
    for k, v in t.items():
        name = _flag_name(k, f"[{where}]")
        if name in out:
            raise SpecError(
                f"[{where}]: {k!r} is given twice (dashes and underscores are the same flag)"
            )
        out[name] = _check_value(v, f"[{where}] {k}")
    return out


def label(v: Any) -> str:
    """A value as it appears in a run folder name."""
    if isinstance(v, bool):
        s = str(v).lower()
    elif isinstance(v, float):
        s = f"{v:g}"
    elif isinstance(v, list):
        s = "-".join(label(x) for x in v)
    else:
        s = str(v)
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", s) or "_"


def _axis(name: str, values: Any) -> list[tuple[str, dict[str, Any]]]:
    where = f"[axes] {name}"
    if not isinstance(values, list) or not values:
        raise SpecError(f"{where} = {values!r}: an axis is a non-empty list of values")
    out = []
    if all(isinstance(v, dict) for v in values):  # a group of flags set together
        keys = None
        for i, v in enumerate(values):
            v = dict(v)
            lab = v.pop("label", None)
            if lab is not None and not isinstance(lab, str | int | float):
                raise SpecError(f"{where}[{i}].label = {lab!r} must be a string or number")
            flags = _flags_table(v, f"axes.{name}[{i}]")
            if not flags:
                raise SpecError(f"{where}[{i}] sets no flag")
            if keys is not None and set(flags) != keys:
                raise SpecError(
                    f"{where}[{i}] sets {sorted(flags)} but {where}[0] sets "
                    f"{sorted(keys)}: every value of a group axis sets the same flags"
                )
            keys = set(flags)
            out.append(
                (
                    label(lab) if lab is not None else "-".join(label(x) for x in flags.values()),
                    flags,
                )
            )
    elif any(isinstance(v, dict) for v in values):
        raise SpecError(
            f"{where}: mix of tables and plain values; use tables for every value "
            "(a group of flags) or none"
        )
    else:
        flag = _flag_name(name, "[axes]")
        out = [(label(v), {flag: _check_value(v, f"{where}[{i}]")}) for i, v in enumerate(values)]
    labels = [lab for lab, _ in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise SpecError(
            f"{where}: values {dup} repeat (or name the same run folder); each value once"
        )
    return out


def load_spec(path: str | Path) -> Spec:
    """Read and check a spec (its structure; the flags are checked against mpirl in `check`)."""
    path = Path(path)
    try:
        return _load_spec(path)
    except SpecError as e:
        if str(e).startswith(str(path)):
            raise
        raise SpecError(f"{path}: {e}") from None


def _slurm_table(path: Path, slurm: Any) -> dict:
    """A spec's checked [slurm] table."""
    if not isinstance(slurm, dict):
        raise SpecError(f"{path}: [slurm] must be a table")
    bad = sorted(set(slurm) - SLURM_KEYS)
    if bad:
        raise SpecError(f"{path}: unknown key(s) {bad} in [slurm]; it has {sorted(SLURM_KEYS)}")
    if "time" in slurm and not (isinstance(slurm["time"], str) and slurm["time"].strip()):
        raise SpecError(
            f'{path}: [slurm] time = {slurm["time"]!r} must be a SLURM time string, e.g. "00:30:00"'
        )
    mp = slurm.get("max_parallel")
    if mp is not None and (not isinstance(mp, int) or isinstance(mp, bool) or mp < 1):
        raise SpecError(f"{path}: [slurm] max_parallel = {mp!r} must be an integer >= 1")
    for key in ("sbatch", "setup"):
        v = slurm.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise SpecError(f"{path}: [slurm] {key} = {v!r} must be a list of strings")
    if "job_name" in slurm and not (
        isinstance(slurm["job_name"], str) and re.fullmatch(r"[A-Za-z0-9._-]+", slurm["job_name"])
    ):
        raise SpecError(
            f"{path}: [slurm] job_name = {slurm['job_name']!r} must be letters, "
            "digits, '.', '_' or '-'"
        )
    return slurm


def _load_spec(path: Path) -> Spec:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path} is not valid TOML: {e}") from None
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise SpecError(
            f"{path}: unknown key(s) {unknown}; a spec has {sorted(TOP_KEYS)} "
            "(mpirl flags go in [flags], [budget] or [axes])"
        )
    out = data.get("out")
    if not isinstance(out, str) or not out.strip():
        raise SpecError(f'{path}: out = {out!r}: give the output root, e.g. out = "runs/sweep"')
    ranks = data.get("ranks", 9)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 3:
        raise SpecError(
            f"{path}: ranks = {ranks!r} must be an integer >= 3 (1 learner, 1 "
            "buffer, at least 1 actor)"
        )
    seeds = data.get("seeds", [0])
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
    ):
        raise SpecError(f"{path}: seeds = {seeds!r} must be a non-empty list of integers >= 0")
    if len(set(seeds)) != len(seeds):
        raise SpecError(f"{path}: seeds = {seeds!r} repeat a seed")
    launcher = data.get("launcher", list(DEFAULT_LAUNCHER))
    if (
        not isinstance(launcher, list)
        or not launcher
        or not all(isinstance(a, str) for a in launcher)
    ):
        raise SpecError(
            f"{path}: launcher = {launcher!r} must be a non-empty list of strings, "
            'e.g. ["mpirun", "-n", "{ranks}"]'
        )
    resume = data.get("resume", False)
    if not isinstance(resume, bool):
        raise SpecError(f"{path}: resume = {resume!r} must be true or false")
    export = data.get("export")
    if export is not None and not (isinstance(export, str) and export.strip()):
        raise SpecError(
            f"{path}: export = {export!r} must be a folder, e.g. "
            'export = "docs/results/data/my-sweep"'
        )
    flags = _flags_table(data.get("flags", {}), "flags")
    budget = _flags_table(data.get("budget", {}), "budget")
    axes_t = data.get("axes", {})
    if not isinstance(axes_t, dict):
        raise SpecError(f"{path}: [axes] must be a table of axis = [values]")
    axes = {name: _axis(name, v) for name, v in axes_t.items()}
    seen: dict[str, str] = {}
    for where, names in [
        ("[flags]", flags),
        ("[budget]", budget),
        *((f"[axes] {a}", set(vs[0][1])) for a, vs in axes.items()),
    ]:
        for n in names:
            if n in seen:
                raise SpecError(
                    f"{path}: flag {n!r} is set in {seen[n]} and in {where}; set it in one place"
                )
            seen[n] = where
    slurm = _slurm_table(path, data.get("slurm", {}))
    return Spec(
        path=path,
        out=Path(out),
        ranks=ranks,
        seeds=tuple(seeds),
        launcher=tuple(launcher),
        resume=resume,
        export=Path(export) if export else None,
        flags=flags,
        budget=budget,
        axes=axes,
        slurm=slurm,
    )


def expand(spec: Spec) -> list[Run]:
    """Every run of the spec, in order: seed-major, then the axes as written (last fastest)."""
    runs: list[Run] = []
    names = list(spec.axes)
    for seed in spec.seeds:
        for combo in itertools.product(*(spec.axes[n] for n in names)):
            flags = {**spec.flags, **spec.budget}
            cell = {}
            for name, (lab, fl) in zip(names, combo, strict=True):
                flags.update(fl)
                cell[name] = lab
            flags["seed"] = seed
            cell_dir = ",".join(f"{label(n)}={lab}" for n, lab in cell.items())
            run_dir = spec.out / cell_dir / f"seed{seed}" if cell_dir else spec.out / f"seed{seed}"
            runs.append(Run(len(runs), seed, cell, flags, run_dir))
    return runs


def flag_args(flags: dict[str, Any]) -> list[str]:
    """{flag: value} -> mpirl's command-line arguments."""
    args = []
    for name, v in flags.items():
        opt = "--" + name.replace("_", "-")
        if isinstance(v, bool):
            args.append(opt if v else "--no-" + opt[2:])
        elif isinstance(v, list):
            args += [opt, *(str(x) for x in v)]
        else:
            args += [opt, str(v)]
    return args


def check(spec: Spec, runs: list[Run]) -> list[str]:
    """Check every run's flags with mpirl's own parser and layout check (``mpirl.run.config``):
    one line per problem, naming a run it applies to (empty = all good)."""
    known = {f.name for f in dataclasses.fields(Config)}
    where = {
        **{n: "[flags]" for n in spec.flags},
        **{n: "[budget]" for n in spec.budget},
        **{n: f"[axes] {a}" for a, vs in spec.axes.items() for n in vs[0][1]},
    }
    unknown = [n for n in where if n not in known]
    if unknown:  # one line per flag, not per run
        return [
            f"--{n.replace('_', '-')} (in {where[n]}): not an option of this mpirl "
            "(python -m mpirl.main --help)"
            for n in unknown
        ]
    problems: dict[str, list[str]] = {}  # message -> the runs it applies to
    seen = set()
    for r in runs:
        key = json.dumps({k: v for k, v in r.flags.items() if k != "seed"}, sort_keys=True)
        if key in seen:  # the same flags with another seed
            continue
        seen.add(key)
        err = io.StringIO()
        msg = None
        try:
            with contextlib.redirect_stderr(err):
                cfg = parse(r.mpirl_args())
            cfg.validate(spec.ranks)
        except SystemExit:  # argparse: a value of the wrong type or not among the choices
            lines = err.getvalue().strip().splitlines()
            msg = lines[-1] if lines else "rejected by mpirl"
        except (ConfigError, LayoutError) as e:
            msg = str(e)
        if msg is not None:
            cell = ", ".join(f"{k}={v}" for k, v in r.cell.items()) or "no axes"
            problems.setdefault(msg, []).append(f"run {r.index} ({cell})")
    return [
        f"{who[0]}{f' and {len(who) - 1} more' if len(who) > 1 else ''}: {msg}"
        for msg, who in problems.items()
    ]


# --- runs -----------------------------------------------------------------------------------


def run_status(run_dir: Path) -> str:
    """'done' (summary.json, not stopped by a signal), 'todo' (no folder or an empty one),
    'resumable' (a complete checkpoint), 'incomplete' (anything else)."""
    sj = run_dir / "summary.json"
    if sj.is_file():
        try:
            s = json.loads(sj.read_text())
        except ValueError:
            s = None
        if isinstance(s, dict) and s.get("stop_reason") not in SIGNAL_STOPS:
            return "done"
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return "todo"
    if any(run_dir.glob("checkpoint/manifest-*.json")):
        return "resumable"
    return "incomplete"


def exported(spec: Spec) -> frozenset[str]:
    """The runs whose rows ``spec.export``'s runs.csv holds, by its ``run`` column (the folder
    relative to the current folder, as analysis.export writes it; see `run_key`)."""
    if spec.export is None or not (spec.export / "runs.csv").is_file():
        return frozenset()
    with open(spec.export / "runs.csv", newline="") as f:
        return frozenset(row.get("run") or "" for row in csv.DictReader(f)) - {""}


def run_key(run_dir: Path) -> str:
    """A run folder as the export's ``run`` column names it (analysis.export.run_id)."""
    try:
        return str(run_dir.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(run_dir)


def _set_aside(run_dir: Path) -> Path:
    for n in itertools.count(1):
        dest = run_dir.with_name(f"{run_dir.name}.incomplete-{n}")
        if not dest.exists():
            run_dir.rename(dest)
            return dest
    raise AssertionError  # pragma: no cover


def _resolve(cmd: list[str]) -> list[str]:
    """The launcher from PATH, else from this Python's folder (the venv's mpirun)."""
    if shutil.which(cmd[0]) is None:
        here = Path(sys.executable).parent / cmd[0]
        if here.exists():
            return [str(here), *cmd[1:]]
    return cmd


def execute(spec: Spec, run: Run, stop: Relay, say: Callable[[str], object] = print) -> int:
    """Run one run (see the module docstring for complete, incomplete and resumed folders)."""
    status = run_status(run.run_dir)
    if status == "done":
        say(f"[{run.index}] {run.run_dir}: complete, skipped")
        return 0
    if run_key(run.run_dir) in exported(spec):
        say(f"[{run.index}] {run.run_dir}: its row is in {spec.export}/runs.csv, skipped")
        return 0
    args = run.mpirl_args()
    if status == "resumable" and spec.resume:
        keep = {k: v for k, v in run.flags.items() if k in RESUME_FLAGS}
        args = ["--resume", str(run.run_dir), *flag_args(keep)]
        say(f"[{run.index}] {run.run_dir}: continuing from its checkpoint")
    elif status in ("resumable", "incomplete"):
        say(f"[{run.index}] {run.run_dir}: incomplete, moved to {_set_aside(run.run_dir)}")
    launcher = [a.replace("{ranks}", str(spec.ranks)) for a in spec.launcher]
    cmd = _resolve([*launcher, sys.executable, "-m", "mpirl.main", *args])
    run.run_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = run.run_dir.with_name(run.run_dir.name + ".log")
    say(f"[{run.index}] {shlex.join(cmd)}")
    loads, t0 = [os.getloadavg()[0]], time.time()
    with open(log_path, "a") as log:
        log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n")
        log.flush()
        # a stop signal reaches the launcher only as the relay's SIGUSR1 (mpirl.launch)
        stop.start(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        while (rc := stop.wait(timeout=LOAD_SAMPLE_S)) is None:
            loads.append(os.getloadavg()[0])
        stop.proc = None
    loads.append(os.getloadavg()[0])
    record = {
        "index": run.index,
        "seed": run.seed,
        "cell": run.cell,
        "command": cmd,
        "returncode": rc,
        "start_unix": t0,
        "end_unix": time.time(),
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "loadavg_1min": {
            "samples": len(loads),
            "min": min(loads),
            "max": max(loads),
            "mean": sum(loads) / len(loads),
            "every_s": LOAD_SAMPLE_S,
        },
        "spec": str(spec.path),
    }
    if run.run_dir.is_dir():
        (run.run_dir / "sweep.json").write_text(json.dumps(record, indent=2) + "\n")
    # a clean stop (the sweep's own SIGTERM relayed, a scancel) exits 0 too: only a run that
    # reached its end is complete, and only its row is exported (an exported row is never run
    # again, so a stopped run's row would stay in the data)
    done = run_status(run.run_dir) == "done"
    if rc != 0:
        verdict = f"FAILED (exit {rc}; see {log_path})"
    else:
        verdict = "ok" if done else "stopped by a signal, not complete (the next sweep reruns it)"
    say(
        f"[{run.index}] {run.run_dir}: {verdict}, {time.time() - t0:.0f} s, "
        f"load {min(loads):.1f}-{max(loads):.1f}"
    )
    if rc == 0 and done and spec.export is not None:
        export_run(spec, run, say)
    return rc


def export_run(spec: Spec, run: Run, say: Callable[[str], object] = print) -> None:
    """Merge a finished run's row and curves into ``spec.export`` (analysis.export, in its own
    process: mpirl does not import analysis/), so the rows to commit grow run by run."""
    # cells are named from the folders below out's parent: out = "runs/x/cell=A" names cell=A
    cmd = [
        sys.executable,
        "-m",
        "analysis.export",
        str(spec.out.parent),
        "--run",
        str(run.run_dir),
        "--into",
        str(spec.export),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    say(f"[{run.index}] " + (p.stdout.strip() or p.stderr.strip()))


# --- SLURM ------------------------------------------------------------------------------------


def slurm_script(spec: Spec, n_runs: int) -> str:
    """An sbatch array script: task I runs ``python -m mpirl.sweep SPEC --index I``."""
    s = spec.slurm
    arr = f"0-{n_runs - 1}" + (f"%{s['max_parallel']}" if s.get("max_parallel") else "")
    name = s.get("job_name") or f"mpirl-{label(spec.path.stem)}"
    setup = s.get("setup", ["source .venv/bin/activate"])
    lines = [
        "#!/bin/bash",
        f"# Generated by: python -m mpirl.sweep {shlex.quote(str(spec.path))} --slurm",
        f"# {n_runs} runs, one per array task; task I runs run I of the spec (see --dry-run).",
        "# A task stopped by preemption or the time limit (TERM 120 s before it) is requeued; the",
        "# sweep then starts that run over in a fresh folder (or continues its checkpoint when the",
        "# spec says resume = true). Submit from the folder the spec's paths are relative to.",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --array={arr}",
        "#SBATCH --nodes=1",
        f"#SBATCH --ntasks={spec.ranks}",
        "#SBATCH --cpus-per-task=1",
        f"#SBATCH --time={s.get('time', '00:30:00')}",
        "#SBATCH --output=slurm-%x-%A_%a.out",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:TERM@120",
        *(f"#SBATCH {x}" for x in s.get("sbatch", [])),
        "",
        "set -euo pipefail",
        'cd "${SLURM_SUBMIT_DIR:-.}"',
        *setup,
        "# one node per task: MPICH's mpirun starts the ranks itself rather than through srun,",
        "# which some SLURM versions bind to one CPU (docs/cluster.md); other launchers ignore it",
        "export HYDRA_LAUNCHER=fork",
        "# exec: SLURM's TERM reaches the sweep, which relays it to the launcher as USR1 (see",
        "# mpirl.launch); every rank then writes its part of a final checkpoint",
        f'exec python -m mpirl.sweep {shlex.quote(str(spec.path))} --index "$SLURM_ARRAY_TASK_ID"',
        "",
    ]
    return "\n".join(lines)


# --- command line -----------------------------------------------------------------------------


def _dry_run(spec: Spec, runs: list[Run]) -> None:
    shape = " x ".join(
        [f"{len(spec.seeds)} seeds"] + [f"{len(v)} {a}" for a, v in spec.axes.items()]
    )
    print(f"# {spec.path}: {len(runs)} runs ({shape}), {spec.ranks} ranks each, out {spec.out}")
    counts: dict[str, int] = {}
    rows = exported(spec)
    for r in runs:
        st = run_status(r.run_dir)
        if st != "done" and run_key(r.run_dir) in rows:
            st = "exported"
        counts[st] = counts.get(st, 0) + 1
        what = {
            "done": "done (skipped)",
            "exported": "exported (skipped: its row is committed)",
            "todo": "todo",
            "resumable": "resume" if spec.resume else "incomplete (set aside, rerun)",
            "incomplete": "incomplete (set aside, rerun)",
        }[st]
        print(f"[{r.index}] {what}  {r.run_dir}")
        print(f"    {shlex.join(r.command(spec, python='python'))}")
    print("# " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mpirl.sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("spec", help="the sweep spec (TOML)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run",
        action="store_true",
        help="list every run (index, status, folder, command); run nothing",
    )
    mode.add_argument("--index", type=int, metavar="I", help="run only run I (0-based)")
    mode.add_argument(
        "--slurm", action="store_true", help="print the sbatch array script (one task per run)"
    )
    ap.add_argument("--write", metavar="FILE", help="with --slurm: write the script to FILE")
    a = ap.parse_args(argv)
    if a.write and not a.slurm:
        ap.error("--write goes with --slurm")
    try:
        spec = load_spec(a.spec)
    except SpecError as e:
        print(f"mpirl.sweep: error: {e}", file=sys.stderr)
        return 2
    runs = expand(spec)
    dirs = [str(r.run_dir) for r in runs]
    assert len(set(dirs)) == len(dirs), "two runs share a folder"  # labels are unique per axis
    problems = check(spec, runs)
    if a.dry_run:
        _dry_run(spec, runs)
    if problems:
        print(
            f"mpirl.sweep: error: {spec.path}: mpirl rejects these flags:",
            *problems,
            sep="\n  ",
            file=sys.stderr,
        )
        return 2
    if a.dry_run:
        return 0
    if a.slurm:
        text = slurm_script(spec, len(runs))
        if a.write:
            Path(a.write).write_text(text)
            print(f"wrote {a.write}: sbatch {a.write}   # {len(runs)} array tasks")
        else:
            sys.stdout.write(text)
        return 0
    if a.index is not None and not 0 <= a.index < len(runs):
        print(
            f"mpirl.sweep: error: --index {a.index}: {spec.path} has runs 0-{len(runs) - 1}",
            file=sys.stderr,
        )
        return 2
    todo = [runs[a.index]] if a.index is not None else runs
    spec.out.mkdir(parents=True, exist_ok=True)
    copy = spec.out / "spec.toml"
    if not copy.exists():
        shutil.copyfile(spec.path, copy)
    elif copy.read_bytes() != spec.path.read_bytes():
        print(
            f"mpirl.sweep: note: {spec.path} differs from {copy}, the spec this output root "
            "was started with; runs are matched by their folder names",
            file=sys.stderr,
        )
    stop = Relay()  # SIGTERM/SIGINT: a clean stop of the running run, start no further run
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    failed = []
    try:
        for r in todo:
            if stop.signal is not None:
                break
            if execute(spec, r, stop) != 0:
                failed.append(r.index)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if stop.signal is not None:
        print(
            f"mpirl.sweep: stopped by {signal.Signals(stop.signal).name}; rerun the same "
            "command to continue",
            file=sys.stderr,
        )
        return 128 + stop.signal
    if failed:
        print(f"mpirl.sweep: {len(failed)} of {len(todo)} run(s) failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
