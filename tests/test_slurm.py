"""The job scripts and sweeps under a real Slurm (22.05, Debian's packages): a one-node cluster
brought up for this module (tests/slurm_cluster.py), real sbatch jobs, the run folders read back.

Marked ``slurm``: left out of the default run (pyproject addopts) and run by `.ci/run` as a step
of its own, ``python -m pytest -m slurm -p no:xdist tests/test_slurm.py``. Skips with the reason
where no cluster can come up (not root, no package access); with ``MPIRL_REQUIRE_SLURM=1`` (set by
`.ci/run`) that is a failure instead.

Each job runs the worktree's code with this Python's venv (``VENV``), from the repository root,
its run folders and Slurm output under the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from slurm_cluster import Node, ShapedLink, SlurmCluster, two_hosts_unavailable, unavailable

pytestmark = [pytest.mark.slurm, pytest.mark.mpi]

REPO = Path(__file__).resolve().parent.parent
VENV = sys.prefix
#: CartPole-v1's reward threshold, the default --target-return
TARGET = 475.0
#: a stop by Slurm's TERM: the ranks get it from Slurm or as USR1 from mpirl.launch, whichever
#: comes first (both, when Slurm signals every process of the job)
STOPS = {"SIGTERM", "SIGUSR1"}


def _env(**kw) -> dict[str, str]:
    """The job's environment: this venv, the worktree first on the path."""
    path = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)
    return {"VENV": VENV, "PYTHONPATH": path, **{k: str(v) for k, v in kw.items()}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = unavailable()
    if why and os.environ.get("MPIRL_REQUIRE_SLURM"):  # .ci/run: these tests must run
        pytest.fail(f"MPIRL_REQUIRE_SLURM is set but no real Slurm can come up: {why}")
    if why:
        pytest.skip(f"no real Slurm here: {why}")
    c = SlurmCluster(tmp_path_factory.mktemp("slurm") / "cluster", [Node("n1", "127.0.0.1")])
    try:
        c.start()
    except Exception:
        c.stop()
        raise
    yield c
    c.stop()


def _evals(run: Path) -> np.ndarray:
    try:
        with h5py.File(run / "learner.h5", "r", locking=False) as f:
            return f["evals/ret_mean"][()] if "evals" in f else np.zeros(0)
    except (OSError, KeyError):  # not created yet, or the read overlapped a flush
        return np.zeros(0)


def _rows(run: Path) -> dict[str, dict[str, int]]:
    """Rows per stream of every HDF5 file of a run."""
    out = {}
    for p in sorted(run.glob("*.h5")):
        with h5py.File(p, "r", locking=False) as f:
            out[p.stem] = {
                k: len(next(iter(g.values()))) for k, g in f.items() if isinstance(g, h5py.Group)
            }
    return out


def _out(cluster: SlurmCluster, job: int, tmp: Path) -> str:
    text = "\n".join(p.read_text(errors="replace") for p in sorted(tmp.glob(f"*{job}*.out")))
    return f"--- job {job} output\n{text[-6000:]}\n{cluster.logs(1500)}"


def _submit(cluster, tmp: Path, script: str, *sbatch: str, **env) -> int:
    return cluster.sbatch(
        f"--output={tmp}/slurm-%x-%j.out",
        *sbatch,
        str(REPO / script),
        cwd=REPO,
        env=_env(RUN_ROOT=tmp / "runs", **env),
    )


def test_single_node_reaches_the_target(cluster, tmp_path):
    """`sbatch jobs/single-node.sbatch`, as a user runs it: the run stops at the target return
    (475) and writes its summary and a checkpoint."""
    job = _submit(cluster, tmp_path, "jobs/single-node.sbatch", MAX_SECONDS=120)
    rec = cluster.wait_done(job, 200)[0]
    out = _out(cluster, job, tmp_path)
    assert rec["JobState"] == "COMPLETED", out
    run = tmp_path / "runs" / f"mpirl-1node-{job}-r0"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return", (summary, out)
    assert _evals(run).max() >= TARGET, out
    assert list(run.glob("checkpoint/manifest-*.json")), out
    with h5py.File(run / "learner.h5", "r") as f:
        assert json.loads(f.attrs["layout_json"])  # the rank -> host table is there


def _wait(ok, timeout: float, what: str, cluster=None, job=None, tmp=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.5)
    raise AssertionError(
        f"no {what} after {timeout:.0f} s\n{_out(cluster, job, tmp) if job else ''}"
    )


def _updates(run: Path) -> int:
    try:
        with h5py.File(run / "learner.h5", "r", locking=False) as f:
            return len(f["updates/update"]) if "updates" in f else 0
    except (OSError, KeyError):
        return 0


def test_requeue_mid_run_resumes_the_run_folder(cluster, tmp_path):
    """`scontrol requeuehold` mid-run (requeue, held so the files can be read between the two
    tries; `release` starts the second): Slurm's TERM stops every rank with a final checkpoint,
    and the requeued job resumes the same folder, counters continuing and no row lost."""
    job = _submit(
        cluster,
        tmp_path,
        "jobs/single-node.sbatch",
        MAX_SECONDS=25,
        MPIRL_ARGS="--target-return 100000",  # no early stop: the requeue is mid-run
    )
    run = tmp_path / "runs" / f"mpirl-1node-{job}-r0"
    _wait(
        lambda: _updates(run) >= 200,
        90,
        "learner updates before the requeue",
        cluster,
        job,
        tmp_path,
    )
    cluster.run(["scontrol", "requeuehold", str(job)])
    _wait(
        lambda: cluster.job(job).get("JobState") == "PENDING" and not cluster.tagged_pids(),
        60,
        "the first try's end",
        cluster,
        job,
        tmp_path,
    )
    first = json.loads((run / "summary.json").read_text())
    assert first["stop_reason"] in STOPS, first
    manifests = sorted(run.glob("checkpoint/manifest-*.json"))
    assert manifests, _out(cluster, job, tmp_path)
    rows_before = _rows(run)
    with h5py.File(run / "learner.h5", "r") as f:
        old_updates = f["updates/update"][()]
    cluster.run(["scontrol", "release", str(job)])
    rec = cluster.wait_done(job, 150)[0]
    out = _out(cluster, job, tmp_path)
    assert rec["JobState"] == "COMPLETED" and rec["Restarts"] == "1", (rec, out)
    assert not (tmp_path / "runs" / f"mpirl-1node-{job}-r1").exists(), out  # the same folder
    second = json.loads((run / "summary.json").read_text())
    assert second["resumed_from"] == first["checkpoint"], (second, out)
    assert second["stop_reason"] == "max_seconds", second
    # every file: the resume saw exactly the rows the first try left, and appended to them
    rows_after = _rows(run)
    for name, streams in rows_before.items():
        with h5py.File(run / f"{name}.h5", "r") as f:
            resume = json.loads(f.attrs["resumes_json"])[-1]
        assert (
            resume["checkpoint"] == first["checkpoint"] and resume["reason"] == first["stop_reason"]
        )
        assert resume["rows_before_resume"] == streams, name
        for stream, n in streams.items():
            assert rows_after[name][stream] >= n, (name, stream)
    with h5py.File(run / "learner.h5", "r") as f:
        upd = f["updates/update"][()]
    assert len(upd) > len(old_updates)
    np.testing.assert_array_equal(upd[: len(old_updates)], old_updates)
    assert np.all(np.diff(upd) == 1)  # the update counter continues: no gap, no repeat
    assert second["updates"] > first["updates"] and second["env_steps"] > first["env_steps"]


def test_time_limit_signal_ends_in_a_final_checkpoint(cluster, tmp_path):
    """`--signal=B:TERM@N` with a short `--time`: the batch shell (mpirl.launch, exec'd by the
    script) gets TERM before the limit and every rank writes its part of a final checkpoint."""
    job = _submit(
        cluster,
        tmp_path,
        "jobs/single-node.sbatch",
        "--time=2",
        "--signal=B:TERM@70",
        MAX_SECONDS=300,
        MPIRL_ARGS="--target-return 100000",
    )
    t0 = time.monotonic()
    rec = cluster.wait_done(job, 200)[0]
    took = time.monotonic() - t0
    out = _out(cluster, job, tmp_path)
    assert rec["JobState"] == "COMPLETED", (rec, out)  # ended by itself, not by the limit
    run = tmp_path / "runs" / f"mpirl-1node-{job}-r0"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] in STOPS, (summary, out)
    manifest = json.loads(
        (run / "checkpoint" / f"manifest-{summary['checkpoint']:06d}.json").read_text()
    )
    assert (
        manifest["reason"] == summary["stop_reason"]
        and manifest["counters"]["updates"] == summary["updates"]
    )
    assert sorted(manifest["parts"]) == [
        "actor-2",
        "actor-3",
        "actor-4",
        "actor-5",
        "actor-6",
        "actor-7",
        "actor-8",
        "buffer-0",
        "learner",
    ]
    assert took < 120, took


def test_srun_launcher_starts_and_learns(cluster, tmp_path):
    """`LAUNCHER=srun`: `srun --mpi=pmi2` starts the 9 ranks (the mpich wheel on PMI-1) and
    the run learns."""
    job = _submit(cluster, tmp_path, "jobs/single-node.sbatch", LAUNCHER="srun", MAX_SECONDS=60)
    rec = cluster.wait_done(job, 150)[0]
    out = _out(cluster, job, tmp_path)
    assert rec["JobState"] == "COMPLETED", (rec, out)
    assert "srun --mpi=pmi2 -n 9" in out
    run = tmp_path / "runs" / f"mpirl-1node-{job}-r0"
    summary = json.loads((run / "summary.json").read_text())
    with h5py.File(run / "learner.h5", "r") as f:
        layout = json.loads(f.attrs["layout_json"])
    assert len(layout) == 9, layout
    evals = _evals(run)
    # random greedy nets score 9-20 on CartPole
    assert summary["stop_reason"] == "target_return" or evals.max() >= 150, (evals, out)


def test_sweep_array_runs_every_task_and_exports_once(cluster, tmp_path):
    """`python -m mpirl.sweep SPEC --slurm --write x.sbatch`, `sbatch x.sbatch`: every array
    task runs its run and merges its row into the export; submitting it again merges nothing
    twice (the runs are skipped)."""
    spec = tmp_path / "spec.toml"
    spec.write_text(
        textwrap.dedent(f"""\
        out = "{tmp_path}/sweep"
        export = "{tmp_path}/export"
        ranks = 4
        [flags]
        link = "none"
        [budget]
        max_seconds = 15
        [axes]
        replay_at = ["learner", "buffer"]
        [slurm]
        time = "00:05:00"
        setup = ["source {VENV}/bin/activate", "export PYTHONPATH={REPO}"]
        """)
    )
    script = tmp_path / "x.sbatch"
    p = cluster.run(
        [sys.executable, "-m", "mpirl.sweep", str(spec), "--slurm", "--write", str(script)],
        cwd=REPO,
        env=_env(),
    )
    assert "#SBATCH --array=0-1" in script.read_text(), p.stdout
    for attempt in (1, 2):
        job = cluster.sbatch(
            f"--output={tmp_path}/slurm-%x-%A_%a.out", str(script), cwd=REPO, env=_env()
        )
        recs = cluster.wait_done(job, 150)
        out = _out(cluster, job, tmp_path)
        assert len(recs) == 2 and all(r["JobState"] == "COMPLETED" for r in recs), (recs, out)
        with open(tmp_path / "export" / "runs.csv") as f:
            rows = f.read().splitlines()[1:]
        assert len(rows) == 2, (attempt, rows, out)
        assert len(list((tmp_path / "sweep").glob("*/seed0/summary.json"))) == 2, out
    assert out.count("skipped") == 2, out


def test_placement_reads_the_real_allocation(cluster, tmp_path):
    """`python -m mpirl.placement` inside a real allocation reads the variables Slurm sets; one
    node has no edge host, which it says naming the allocation (two nodes: test_two_hosts)."""
    job = cluster.sbatch(
        f"--output={tmp_path}/slurm-%j.out",
        "-n9",
        "--wrap",
        f"{sys.executable} -m mpirl.placement --buffers 1 --ntasks 9; echo rc=$?",
        cwd=REPO,
        env=_env(),
    )
    cluster.wait_done(job, 60)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert "rc=2" in out and "SLURM_JOB_NODELIST=n1 SLURM_TASKS_PER_NODE=9" in out, out
    assert "no edge host besides the cloud host 'n1'" in out, out


# ---- two hosts: cloud and edge namespaces, a shaped link ---------------------------------------

#: The mpich wheel's default netmod, UCX, sees one machine (one kernel, one boot id) behind both
#: namespaces and moves the cloud <-> edge messages through shared memory: 40 MB of mpirl link
#: traffic put 52 kB on the veth. Its ofi netmod (libfabric's tcp provider) uses the veth
#: address; MPICH's own shared memory still joins the ranks of one host (measured, mpich 5.0.2).
ACROSS = {"MPIR_CVAR_CH4_NETMOD": "ofi"}


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """A two-node Slurm: slurmctld and slurmd ``cloud`` in one network namespace, slurmd
    ``edge`` in another, joined by a veth shaped with tbf (100 Mbit/s each way)."""
    why = two_hosts_unavailable()
    if why and os.environ.get("MPIRL_REQUIRE_SLURM"):
        pytest.fail(f"MPIRL_REQUIRE_SLURM is set but two namespaced hosts cannot come up: {why}")
    if why:
        pytest.skip(f"no two-host Slurm here: {why}")
    link = ShapedLink(f"t{os.getpid()}")
    c = None
    try:
        link.create()
        c = SlurmCluster(
            tmp_path_factory.mktemp("slurm2") / "cluster",
            [
                Node("cloud", link.addrs[0], link.netns[0]),
                Node("edge", link.addrs[1], link.netns[1]),
            ],
        )
        c.start()
        yield c, link
    finally:
        try:
            if c is not None:
                c.stop()
        finally:
            link.remove()


def _hosts(run: Path) -> tuple[dict[int, str], dict[str, str]]:
    """rank -> host from the learner's ``layout_json``, and each file's own ``host`` attr."""
    with h5py.File(run / "learner.h5", "r") as f:
        layout = {p["rank"]: p["host"] for p in json.loads(f.attrs["layout_json"])}
    own = {}
    for p in run.glob("*.h5"):
        with h5py.File(p, "r") as f:
            own[p.stem] = str(f.attrs["host"])
    return layout, own


def _check_across(run: Path, link: ShapedLink, before: dict, after: dict, out: str) -> None:
    """The learner ran on the cloud host, the buffer and its actors on the edge host, and the
    run's own link bytes crossed the shaped veth."""
    layout, own = _hosts(run)
    assert layout == {0: "cloud", **{r: "edge" for r in range(1, 9)}}, (layout, out)
    assert own["learner"] == "cloud" and own["buffer-0"] == "edge", own
    assert all(h == "edge" for k, h in own.items() if k.startswith("actor")), own
    summary = json.loads((run / "summary.json").read_text())
    crossed = {k: after[k] - before[k] for k in after}
    logged = summary["link_bytes_in"] + summary["link_bytes_out"]
    # every logged byte crossed the veth (with MPI's and TCP's framing on top)
    assert crossed["rx_bytes"] + crossed["tx_bytes"] >= logged > 0, (crossed, summary)
    assert crossed["rx_bytes"] >= summary["link_bytes_in"], (crossed, summary)
    print(f"{run.name}: veth {crossed}, mpirl link bytes in {summary['link_bytes_in']} "
          f"out {summary['link_bytes_out']}, {link.qdisc().strip()}")  # fmt: skip


def test_edge_cloud_across_two_hosts(two_hosts, tmp_path):
    """`jobs/edge-cloud.sbatch` on 2 nodes x 8 tasks: mpirl.placement writes cloud:1, edge:8
    from the real allocation, Hydra's mpirun starts the ranks there, and MPI runs over the
    shaped veth."""
    cluster, link = two_hosts
    before = link.counters()
    job = _submit(
        cluster,
        tmp_path,
        "jobs/edge-cloud.sbatch",
        "--nodes=2",
        "--ntasks-per-node=8",
        BUFFERS=1,
        MAX_SECONDS=20,
        **ACROSS,
    )
    rec = cluster.wait_done(job, 150)[0]
    after = link.counters()
    out = _out(cluster, job, tmp_path)
    assert rec["JobState"] == "COMPLETED", (rec, out)
    run = tmp_path / "runs" / f"mpirl-edge-cloud-{job}-r0"
    hostfile = Path(f"{run}.hostfile").read_text().splitlines()
    assert [x for x in hostfile if not x.startswith("#")] == ["cloud:1", "edge:8"], out
    assert "# from SLURM_JOB_NODELIST=cloud,edge SLURM_TASKS_PER_NODE=8(x2)" in hostfile
    _check_across(run, link, before, after, out)


def test_hetjob_across_two_hosts(two_hosts, tmp_path):
    """`jobs/edge-cloud-hetjob.sbatch` (srun --het-group=0,1 --mpi=pmi2), its components pinned
    to the two nodes (a real site does that with partitions): rank 0 on the cloud node."""
    cluster, link = two_hosts
    text = (REPO / "jobs/edge-cloud-hetjob.sbatch").read_text()
    head, _, edge = text.partition("#SBATCH hetjob\n")
    head = head.replace("#SBATCH --nodes=1\n", "#SBATCH --nodes=1\n#SBATCH --nodelist=cloud\n")
    edge = edge.replace("#SBATCH --nodes=2\n", "#SBATCH --nodes=1\n#SBATCH --nodelist=edge\n")
    script = tmp_path / "hetjob.sbatch"
    script.write_text(head + "#SBATCH hetjob\n" + edge)
    before = link.counters()
    job = cluster.sbatch(
        f"--output={tmp_path}/slurm-%x-%j.out",
        str(script),
        cwd=REPO,
        env=_env(RUN_ROOT=tmp_path / "runs", BUFFERS=1, MAX_SECONDS=20, **ACROSS),
    )
    recs = cluster.wait_done(job, 150)
    after = link.counters()
    out = _out(cluster, job, tmp_path)
    assert all(r["JobState"] == "COMPLETED" for r in recs), (recs, out)
    run = tmp_path / "runs" / f"mpirl-hetjob-{job}-r0"
    _check_across(run, link, before, after, out)
