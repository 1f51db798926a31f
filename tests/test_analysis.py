"""analysis/: tables, ratios, plots and report from short REAL runs of both placements, also while
a writer still holds a file open, without summary.json, and with fields cut by a kill."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpirun import run_mpirl

from analysis import metrics as M
from analysis import profile as P
from analysis.runs import find_runs, load_run, read_h5

ROOT = Path(__file__).resolve().parents[1]
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None  # the optional analysis extra
SHORT = [
    "--max-updates",
    "600",
    "--target-return",
    "none",
    "--flush-seconds",
    "1",
    "--progress-seconds",
    "2",
    "--hidden",
    "32",
    "32",
    "--learning-starts",
    "200",
    "--eval-every",
    "100",
    "--eval-episodes",
    "3",
    "--reference-set",
    "auto",
    "--reference-size",
    "500",
]


@pytest.fixture(scope="session")
def experiment(tmp_path_factory) -> Path:
    """One short real run per placement, side by side: <exp>/existing, <exp>/proposed/seed0."""
    exp = tmp_path_factory.mktemp("exp")
    dirs = {"learner": exp / "existing", "buffer": exp / "proposed" / "seed0"}

    def one(replay_at: str):
        return run_mpirl(
            3, "--replay-at", replay_at, "--run-dir", str(dirs[replay_at]), *SHORT, timeout=120
        )

    with ThreadPoolExecutor(2) as pool:  # both at once: the test suite's time, not CPU, is short
        done = dict(zip(dirs, pool.map(one, dirs), strict=True))
    for replay_at, p in done.items():
        assert p.returncode == 0, f"{replay_at}:\n{p.stdout}\n{p.stderr}"
    return exp


@pytest.fixture(scope="session")
def compared(experiment, tmp_path_factory):
    out = tmp_path_factory.mktemp("analysis")
    return P.profile_report(experiment, out, plots=HAVE_MPL), out


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --- no mpirl in analysis/ -----------------------------------------------------------------------


def test_analysis_never_imports_mpirl():
    for path in sorted((ROOT / "analysis").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if path.name == "to_tensorboard.py":  # the live mirror's mapping, mpirl.logs.dashboard
                names = [n for n in names if n != "mpirl.logs.dashboard"]
            assert not any(n == "mpirl" or n.startswith("mpirl.") for n in names), (
                f"{path.name} imports {names}"
            )
    code = (
        "import sys; sys.modules['mpirl'] = None\n"  # any import of mpirl now fails
        "import analysis.compare, analysis.schema, analysis.plots, analysis.metrics\n"
        "analysis.compare.main(['--help'])"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert p.returncode == 0 and "EXPERIMENT_DIR" in p.stdout, p.stderr


def test_transfer_kinds_are_the_wire_tags():
    """analysis names /transfers/kind by the wire's tags without importing mpirl."""
    from mpirl.transport.wire import Tag

    assert {k.name: int(k) for k in M.Kind} == {k.name: int(Tag[k.name]) for k in M.Kind}


# --- the after-convergence window (pure) ---------------------------------------------------------


def test_settle_index_finds_the_plateau_or_falls_back():
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.01, 4000)
    fall_then_flat = np.concatenate([np.linspace(1.0, 0.1, 1000), np.full(3000, 0.1)]) + noise
    start, method, w = M.settle_index(fall_then_flat, window=200, tol=0.2)
    assert method == "settled" and w == 200 and 800 <= start <= 1000
    rise_then_flat = np.concatenate([np.linspace(0.1, 1.0, 1000), np.full(3000, 1.0)]) + noise
    start, method, _ = M.settle_index(rise_then_flat, window=200)
    assert method == "settled" and 600 <= start <= 1000
    still_falling = np.linspace(1.0, 0.05, 4000) + noise
    assert M.settle_index(still_falling, window=200) == (3000, "fallback", 200)
    assert M.settle_index(np.ones(30), window=20)[1] == "fallback"  # fewer than 2 W updates
    assert M.settle_index(np.zeros(0))[1] == "none"
    with_nan = fall_then_flat.copy()
    with_nan[2000] = np.nan
    assert M.settle_index(with_nan, window=200)[1] == "settled"


# --- tables, ratios, plots on real runs ----------------------------------------------------------


def test_table_has_one_profile_two_placements_and_every_row(experiment, compared):
    profiles, out = compared
    assert len(find_runs(experiment)) == 2
    assert len(profiles) == 1
    p = profiles[0]
    assert p.label == "CartPole-v1, link none"
    assert [g.label for g in p.groups] == [
        "existing (replay_at=learner)",
        "proposed (replay_at=buffer)",
    ]
    lines = p.table.splitlines()
    header = lines[0]
    assert "proposed / existing" in header and "paper (proposed / existing)" in header
    rows = [ln for ln in lines[2:] if ln.startswith("| ")]
    assert len(rows) == len(P.ROWS)
    for (key, label, _), row in zip(P.ROWS, rows, strict=True):
        assert row.startswith(f"| {label}"), (key, row)
        assert row.count(" | ") == header.count(" | ")
    # the computed cells (existing, proposed, ratio) against the metrics computed by hand from
    # the files; the paper's figures only in the last column
    he, hp = _hand(experiment / "existing"), _hand(experiment / "proposed" / "seed0")
    for key, start in (
        ("train_loss_conv", "training loss after convergence"),
        ("prio_held_conv", "transferred priority after convergence: held"),
    ):
        cells = _cells(next(r for r in rows if r.startswith(f"| {start}")))
        assert len(cells) == 5, cells
        assert cells[1].endswith(" (n=1)") and cells[2].endswith(" (n=1)"), cells
        _close(cells[1], he[key])
        _close(cells[2], hp[key])
        _close(cells[3], hp[key] / he[key])
        assert cells[4] == {"train_loss_conv": "0.260", "prio_held_conv": "3.92"}[key], cells
    conv_row = next(r for r in rows if r.startswith("| after-convergence window"))
    assert ("settled" in conv_row) or ("fallback: last 25%" in conv_row)
    # 600 updates may or may not reach 475 on a 3-episode evaluation: either
    # way each placement's cell says how many of its runs reached it
    tt = next(r for r in rows if "wall time to target" in r).split(" | ")[1:3]
    assert all(re.fullmatch(r"not reached \(0/1\)|[\d.]+, 1/1 reached", c) for c in tt), tt
    assert (out / f"{p.slug}.md").read_text().count("| training loss after convergence") == 1
    report = (out / "report.md").read_text()
    assert p.table in report and "## Runs" in report
    csv = (out / "runs.csv").read_text().splitlines()
    assert len(csv) == 3 and "train_loss_conv" in csv[0]


def _cells(row: str) -> list[str]:
    """A markdown table row's cells, without the outer pipes."""
    return row.strip().strip("|").strip().split(" | ")


def _close(cell: str, want: float) -> None:
    """``cell`` starts with ``want`` as analysis prints it: 3 significant digits (<= 0.5% off)."""
    got = float(cell.split()[0].replace(",", ""))
    assert abs(got - want) <= 5e-3 * abs(want), (cell, want)


def _hand(run_dir: Path) -> dict:
    """The metrics again, straight from the files with h5py (the window start from analysis)."""
    with h5py.File(run_dir / "learner.h5", "r", locking=False) as f:
        loss, t = f["updates/loss"][:], f["updates/t"][:]
        x = {k: f["transfers"][k][:] for k in ("t", "n", "priority_mean")}
    summary = json.loads((run_dir / "summary.json").read_text())
    start, _, _ = M.settle_index(loss)
    after = x["t"] >= t[start]
    return {
        "train_loss_conv": float(np.mean(loss[start:].astype("f8"))),
        "prio_held_conv": float(
            np.sum(x["priority_mean"][after] * x["n"][after]) / np.sum(x["n"][after])
        ),
        "link_bytes_per_update": (summary["link_bytes_in"] + summary["link_bytes_out"])
        / summary["updates"],
    }


def test_ratios_are_computed_from_the_data(experiment, compared):
    profiles, _ = compared
    existing, proposed = profiles[0].groups
    he, hp = _hand(experiment / "existing"), _hand(experiment / "proposed" / "seed0")
    for key in ("train_loss_conv", "prio_held_conv", "link_bytes_per_update"):
        assert existing.mean(key) == pytest.approx(he[key], rel=1e-6), key
        assert proposed.mean(key) == pytest.approx(hp[key], rel=1e-6), key
        want = hp[key] / he[key]
        assert P.mean_ratio(proposed, existing, key) == pytest.approx(want, rel=1e-6), key
    row = next(r for r in profiles[0].table.splitlines() if "held by sender" in r)
    ratio_cell = row.strip("| ").split(" | ")[3]
    assert float(ratio_cell) == pytest.approx(hp["prio_held_conv"] / he["prio_held_conv"], rel=5e-3)


@pytest.mark.skipif(not HAVE_MPL, reason="matplotlib not installed: pip install -e '.[analysis]'")
def test_plots_are_written(compared):
    profiles, out = compared
    p = profiles[0]
    assert set(p.plots) == {"loss", "priority", "return", "link"}
    report = (out / "report.md").read_text()
    for path in p.plots.values():
        data = Path(path).read_bytes()
        assert len(data) > 5000 and data[:8] == b"\x89PNG\r\n\x1a\n", path
        assert f"]({Path(path).name})" in report


def test_cli_writes_report_into_the_default_folder(experiment, tmp_path):
    exp = tmp_path / "exp"
    shutil.copytree(experiment, exp)
    p = subprocess.run(
        [sys.executable, "-m", "analysis.compare", str(exp), "--no-plots", "--target", "5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert "| training loss after convergence" in p.stdout
    assert (exp / "analysis" / "report.md").exists()
    # --target 5: the runs had no target, so time and env steps come from the first /evals row
    # with ret_mean >= 5, time on the learner's loop clock (evals t - the loop_start_t attribute)
    lines = p.stdout.splitlines()
    row = _cells(next(ln for ln in lines if ln.startswith("| wall time to target")))
    steps_row = _cells(next(ln for ln in lines if ln.startswith("| env steps to target")))
    assert "R = 5" in row[0] and "R = 5" in steps_row[0]
    for col, run in ((1, "existing"), (2, "proposed/seed0")):
        with h5py.File(exp / run / "learner.h5", "r") as f:
            rets, t = f["evals/ret_mean"][()], f["evals/t"][()]
            steps = f["evals/env_steps"][()]
            loop_start = f.attrs["loop_start_t"]
            assert "time_to_target_s" not in f.attrs  # not from the summary: it has none
        first = int(np.flatnonzero(rets >= 5)[0])
        assert row[col].endswith(", 1/1 reached") and steps_row[col].endswith(", 1/1 reached")
        want = t[first] - loop_start
        got = float(row[col].split(",")[0])
        # the report rounds to 3 significant digits; the loop start is the recorded attribute
        assert abs(got - want) <= 5e-3 * want, (run, row[col], want)
        assert float(steps_row[col].split(", 1/1")[0].replace(",", "")) == steps[first], run


def test_loop_start_is_the_recorded_attribute_else_the_estimate(experiment, tmp_path):
    """The recorded ``loop_start_t`` decides the clock; the /link estimate only serves runs
    without it (it can be tens of ms late on a loaded machine)."""
    run = _copy_run(experiment / "existing", tmp_path / "r")
    with h5py.File(run / "learner.h5", "r+", locking=False) as f:
        recorded = float(f.attrs["loop_start_t"])
        link_t, interval = f["link/t"][0], f["link/interval_s"][0]
        f.attrs["loop_start_t"] = recorded + 0.25  # far from any estimate
    assert load_run(run).loop_start == pytest.approx(recorded + 0.25, abs=1e-9)
    with h5py.File(run / "learner.h5", "r+", locking=False) as f:
        del f.attrs["loop_start_t"]  # a run written before the attribute existed
    assert load_run(run).loop_start == pytest.approx(link_t - interval, abs=1e-9)


# --- runs that are not finished ------------------------------------------------------------------


def test_run_without_summary_json(experiment, tmp_path):
    run = _copy_run(experiment / "existing", tmp_path / "exp" / "r")
    full = json.loads((run / "summary.json").read_text())
    (run / "summary.json").unlink()
    r = load_run(run)
    assert r.summary_source == "learner.h5 attrs"
    assert r.summary["updates"] == full["updates"]
    with h5py.File(run / "learner.h5", "r+", locking=False) as f:  # as if killed before the end
        for k in list(f.attrs):
            if k in full:
                del f.attrs[k]
    r = load_run(run)
    assert r.summary_source == "derived from streams" and not r.finished
    assert r.summary["updates"] == len(r.learner.stream("updates")["loss"])
    assert r.summary["env_steps"] > 0 and r.summary["link_bytes_in"] > 0
    profiles = P.profile_report(tmp_path / "exp", tmp_path / "out", plots=False)
    assert "unfinished" in " ".join(profiles[0].warnings)
    assert "n/a" not in next(ln for ln in profiles[0].table.splitlines() if "training loss" in ln)


def test_fields_of_different_lengths_are_cut_to_the_shortest(experiment, tmp_path):
    run = _copy_run(experiment / "proposed" / "seed0", tmp_path / "r")
    with h5py.File(run / "learner.h5", "r+", locking=False) as f:
        n = f["updates/loss"].shape[0]
        f["updates/loss"].resize(n - 3, axis=0)  # a kill between two fields' writes
    r = load_run(run)
    assert {len(v) for v in r.learner.stream("updates").values()} == {n - 3}
    assert np.isfinite(M.run_metrics(r)["train_loss_conv"])


WRITER = textwrap.dedent("""
    import sys, h5py, numpy as np
    from mpirl.logs.runlog import Field, RunLog
    src, dst = sys.argv[1], sys.argv[2]
    with h5py.File(src, "r") as f:
        attrs = {k: v for k, v in f.attrs.items()
                 if k in ("config_json", "versions_json", "layout_json", "rank", "role")}
        streams = {}
        for name, g in f.items():
            cols = {k: g[k][:] for k in g.attrs["fields"]}
            fields = [Field(k, g[k].dtype.str, g[k].attrs["units"], g[k].attrs["doc"])
                      for k in g.attrs["fields"] if k != "t"]
            streams[name] = (fields, cols)
    log = RunLog(dst, attrs, flush_seconds=3600)
    for half in (0, 1):
        for name, (fields, cols) in streams.items():
            n = len(cols["t"])
            sl = slice(0, n // 2) if half == 0 else slice(n // 2, n)
            log.stream(name, fields).extend(**{k: v[sl] for k, v in cols.items()})
        log.flush()
        print("flushed", flush=True)
        sys.stdin.readline()
    log.close()
""")


def test_reads_a_run_while_the_writer_holds_its_file_open(experiment, tmp_path):
    """A live learner.h5 (a RunLog in another process, open, flushed): analysis sees the
    flushed rows, then more after the next flush, and never blocks the writer."""
    exp = tmp_path / "exp"
    run = _copy_run(experiment / "proposed" / "seed0", exp / "live")
    (run / "summary.json").unlink()
    src = run / "learner.h5"
    src.rename(run / "finished.h5")
    w = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(run / "finished.h5"), str(src)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert w.stdout.readline().strip() == "flushed"
        with h5py.File(run / "finished.h5", "r") as f:
            n_all = f["updates/loss"].shape[0]
        r1 = load_run(run)
        assert r1.summary_source == "derived from streams"
        assert len(r1.learner.stream("updates")["loss"]) == n_all // 2
        p1 = P.profile_report(exp, tmp_path / "out1", plots=False)
        assert np.isfinite(p1[0].groups[0].mean("train_loss_conv"))
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().strip() == "flushed"
        r2 = load_run(run)
        assert len(r2.learner.stream("updates")["loss"]) == n_all
        assert read_h5(src).attrs["role"] == "learner"
    finally:
        w.stdin.write("go\n")
        w.stdin.close()
        assert w.wait(timeout=30) == 0


# --- metrics defined the same way in both placements -----------------------


def test_reference_loss_and_arrival_subsample_are_logged_alike(experiment):
    """Both placements: the same reference set contents (hash checked), a finite reference loss
    at every evaluation; arrival |td| over min(n, 64) transitions of every message (forwarded
    chunks of 256 and batches of 64 alike); median <= p90 of each message's priorities."""
    from mpirl import refloss

    shas = set()
    for run in (experiment / "existing", experiment / "proposed" / "seed0"):
        with h5py.File(run / "learner.h5", "r") as f:
            path, sha = f.attrs["reference_set"], f.attrs["reference_set_sha256"]
            assert len(refloss.load(path, sha256=sha)) == 500
            shas.add(sha)
            ev = {k: f["evals"][k][:] for k in ("reference_loss", "reference_td_abs_mean")}
            tr = {k: f["transfers"][k][:] for k in f["transfers"]}
        assert len(ev["reference_loss"]) and np.isfinite(ev["reference_loss"]).all()
        assert (ev["reference_loss"] > 0).all() and (ev["reference_td_abs_mean"] > 0).all()
        assert len(tr["n"]) and (tr["arrival_n"] == np.minimum(tr["n"], 64)).all()
        assert np.isfinite(tr["arrival_td_mean"]).all()
        assert (tr["priority_median"] <= tr["priority_p90"] + 1e-6).all()
    assert len(shas) == 1  # same env, seed, size, n_step, gamma: the same contents


# --- the schema doc ------------------------------------------------------------------------------


def test_schema_markdown_and_docs_cover_every_dataset(experiment):
    from analysis.schema import describe_run

    run = experiment / "proposed" / "seed0"
    md = describe_run(run)
    assert "### `learner.h5`" in md and "### `buffer-<site>.h5`" in md
    assert "### `actor-<rank>.h5`" in md and "### `summary.json`" in md
    assert "| `loss` | f4 | scalar | - | weighted Huber loss of the update |" in md
    docs = (ROOT / "docs" / "hdf5.md").read_text()
    sections = {sec.split("`")[1]: sec for sec in docs.split("\n### ")[1:]}
    missing = []
    for label, name in (
        ("learner.h5", "learner.h5"),
        ("buffer-<site>.h5", "buffer-0.h5"),
        ("actor-<rank>.h5", "actor-2.h5"),
    ):
        streams = {part.split("`")[0]: part for part in sections.get(label, "").split("**`/")[1:]}
        with h5py.File(run / name, "r") as f:
            for g in f.values():
                for k in g:
                    if f"| `{k}` |" not in streams.get(g.name.lstrip("/"), ""):
                        missing.append(f"{name}:{g.name}/{k}")
    assert not missing, f"docs/hdf5.md lacks {missing}: run python -m analysis.schema RUN_DIR"
