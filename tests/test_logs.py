"""Run logs: HDF5 round trip, resume, SIGKILL and live reading with plain h5py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpirl.logs.runlog import Field, RunLog, open_for_reading, read_stream

REPO = Path(__file__).resolve().parents[1]

LEARNER = [
    Field("step", "i8", "1", "learner update index"),
    Field("loss", "f4", "1", "weighted Huber loss"),
    Field("q", "f8", "1", "mean Q"),
    Field("done", "u1", "1", "episode end flag"),
]


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run" / "rank0.h5"
    attrs = {
        "config_json": {"lr": 1e-3, "env": "CartPole-v1"},
        "hosts": ["a", "b"],
        "ranks": np.arange(3),
        "n_actors": 7,
        "lr": 0.5,
        "dueling": True,
        "stop_reason": None,
    }
    with RunLog(path, attrs, flush_seconds=3600) as log:
        s = log.stream("learner", LEARNER, doc="one row per update")
        v = log.stream("obs", [Field("x", "f4", "1", "observation", (4,))])
        for i in range(10_000):
            s.append(step=i, loss=0.5 * i, q=-i, done=i % 2 == 0)
        s.append(step=10_000, loss=1.0, q=2.0, done=1, t=123.0)
        s.extend(step=np.arange(5) + 20_000, loss=np.ones(5), q=[1, 2, 3, 4, 5], done=np.zeros(5))
        v.append(x=np.arange(4))
        v.extend(x=np.ones((3, 4)), t=[1.0, 2.0, 3.0])
        assert s.rows_written == 0 and s.rows_pending == 10_006
        log.flush()
        assert s.rows_written == 10_006 and s.rows_pending == 0
        log.set_attrs(status="ok", final={"steps": 5})
        assert log.elapsed() >= 0
    log.close()  # idempotent

    with h5py.File(path, "r") as f:  # plain h5py, no mpirl
        assert json.loads(f.attrs["config_json"]) == attrs["config_json"]
        assert list(f.attrs["hosts"]) == ["a", "b"]
        assert list(f.attrs["ranks"]) == [0, 1, 2]
        assert f.attrs["n_actors"] == 7 and f.attrs["lr"] == 0.5 and f.attrs["dueling"]
        assert json.loads(f.attrs["stop_reason"]) is None
        assert f.attrs["status"] == "ok" and json.loads(f.attrs["final"]) == {"steps": 5}
        assert f.attrs["t0_unix"] > 1e9
        g = f["learner"]
        assert g.attrs["doc"] == "one row per update"
        assert list(g.attrs["fields"]) == ["t", "step", "loss", "q", "done"]
        assert g["loss"].attrs["units"] == "1" and g["loss"].attrs["doc"] == "weighted Huber loss"
        assert g["t"].attrs["units"] == "s" and g["t"].dtype == np.float64
        assert g["loss"].dtype == np.float32 and g["done"].dtype == np.uint8
        assert g["step"].maxshape == (None,) and g["step"].chunks is not None
        for ds in g.values():
            assert ds.shape == (10_006,)
        assert list(g["step"][:3]) == [0, 1, 2] and g["step"][10_000] == 10_000
        assert list(g["step"][-5:]) == list(range(20_000, 20_005))
        assert list(g["q"][-5:]) == [1, 2, 3, 4, 5]
        t = g["t"][:]
        assert t[10_000] == 123.0
        assert np.all(np.diff(t[:10_000]) >= 0) and 0 <= t[0] < 60
        assert list(g["done"][:4]) == [1, 0, 1, 0]
        x = f["obs/x"]
        assert x.shape == (4, 4) and x.maxshape == (None, 4) and x.dtype == np.float32
        assert list(x[0]) == [0, 1, 2, 3] and list(f["obs/t"][1:]) == [1.0, 2.0, 3.0]


def test_bad_rows_and_arguments(tmp_path: Path) -> None:
    with RunLog(tmp_path / "a.h5", {}, flush_seconds=3600) as log:
        s = log.stream("learner", LEARNER)
        with pytest.raises(ValueError, match=r"missing fields \['q'\].*unknown fields \['qq'\]"):
            s.append(step=1, loss=0.0, qq=1.0, done=0)
        with pytest.raises(ValueError, match="equal lengths"):
            s.extend(step=[1, 2], loss=[1.0], q=[1.0, 2.0], done=[0, 0])
        with pytest.raises(TypeError, match=r"'step'.*not all integers in \[-9223"):
            s.extend(step=[1.5], loss=[1.0], q=[1.0], done=[0])
        with pytest.raises(TypeError, match=r"'done'.*not all integers in \[0, 255\]"):
            s.extend(step=[1], loss=[1.0], q=[1.0], done=[300])
        with pytest.raises(TypeError, match=r"'done'.*not all integers"):
            s.extend(step=[1], loss=[1.0], q=[1.0], done=[np.nan])
        with pytest.raises(ValueError, match="expected \\(1, 4\\)"):
            log.stream("v", [Field("x", "f4", "1", "", (4,))]).extend(x=[[1.0, 2.0]])
        # A bad appended row is reported at flush, dropped, and the good rows are kept.
        s.append(step=1, loss=0.0, q=1.0, done=0)
        s.append(step=2, loss=0.0, q="high", done=0)
        with pytest.raises((TypeError, ValueError), match="dropped 1 of 2 buffered rows"):
            log.flush()
        log.flush()
        assert s.rows_written == 1
        with pytest.raises(ValueError, match="'t' must be a scalar 'f8'"):
            log.stream("x", [Field("t", "i8", "s", "")])
        with pytest.raises(ValueError, match="cannot be logged"):
            log.stream("x", [Field("name", "U8", "", "")])
        assert log.stream("learner", LEARNER) is s  # same declaration: same stream
        with pytest.raises(ValueError, match="exists with other fields"):
            log.stream("learner", LEARNER[:2])
        with pytest.raises(TypeError, match="run attribute obj="):
            log.set_attrs(obj=object())
    with pytest.raises(RuntimeError, match="after RunLog.close"):
        s.append(step=1, loss=0.0, q=1.0, done=0)
    with pytest.raises(ValueError, match="flush_seconds=-1"):
        RunLog(tmp_path / "b.h5", {}, flush_seconds=-1)
    assert not (tmp_path / "b.h5").exists()


def test_refuses_overwrite_and_resumes(tmp_path: Path) -> None:
    path = tmp_path / "r.h5"
    with RunLog(path, {"config_json": "{}"}) as log:
        s = log.stream("learner", LEARNER)
        s.extend(step=np.arange(7), loss=np.zeros(7), q=np.zeros(7), done=np.zeros(7))
        with pytest.raises(RuntimeError, match="already open for writing"):
            RunLog(path, {}, resume=True)
    t0_unix = h5py.File(path, "r").attrs["t0_unix"]
    with pytest.raises(FileExistsError, match="resume=True"):
        RunLog(path, {})
    with pytest.raises(FileNotFoundError, match="resume=False"):
        RunLog(tmp_path / "missing.h5", {}, resume=True)

    with RunLog(path, {"attempt": 2}, resume=True) as log:
        s = log.stream("learner", LEARNER)
        assert s.rows_written == 7
        for i in range(5):
            s.append(step=7 + i, loss=1.0, q=1.0, done=0)
        with pytest.raises(ValueError, match=r"'loss': \(\('float32', '1', \(\)\), \('float64'"):
            log.stream("learner", [*LEARNER[:1], Field("loss", "f8", "1", ""), *LEARNER[2:]])
        with pytest.raises(ValueError, match=r"'extra': \(None"):
            log.stream("learner", [*LEARNER, Field("extra", "f8", "1", "")])
        log.stream("eval", [Field("ret", "f8", "1", "episode return")]).append(ret=1.0)

    with h5py.File(path, "r") as f:
        assert f.attrs["t0_unix"] == t0_unix and len(f.attrs["resumed_unix"]) == 1
        assert f.attrs["attempt"] == 2 and f.attrs["config_json"] == "{}"
        assert list(f["learner/step"][:]) == list(range(12))
        assert f["learner/t"].shape == (12,) and f["eval/ret"].shape == (1,)
        assert np.all(np.diff(f["learner/t"][:]) >= 0)  # t continues from the first run


def test_resume_cuts_fields_to_shortest(tmp_path: Path) -> None:
    """A writer killed during a flush can leave one field longer; resume realigns them."""
    path = tmp_path / "r.h5"
    with RunLog(path, {}) as log:
        log.stream("learner", LEARNER).extend(
            step=np.arange(4), loss=np.zeros(4), q=np.zeros(4), done=np.zeros(4)
        )
    with h5py.File(path, "r+") as f:
        f["learner/q"].resize((6,))
    with RunLog(path, {}, resume=True) as log:
        s = log.stream("learner", LEARNER)
        assert s.rows_written == 4
        s.append(step=4, loss=0.0, q=9.0, done=0)
    with h5py.File(path, "r") as f:
        assert {ds.shape for ds in f["learner"].values()} == {(5,)}
        assert f["learner/q"][4] == 9.0


def test_resume_adds_the_fields_a_newer_version_logs(tmp_path: Path) -> None:
    """A run begun by a version whose stream lacked a field resumes under one that logs it (the
    learner's /progress gained ``delivered`` on 2026-12-05, and such runs failed to resume with
    "exists with other fields"): the rows already written hold the missing value (NaN, -1);
    a field the file has and the code does not, or another dtype, is still an error."""
    path = tmp_path / "r.h5"
    old = [f for f in LEARNER if f.name != "q"]
    with RunLog(path, {}) as log:
        log.stream("learner", old).extend(step=np.arange(3), loss=np.zeros(3), done=np.zeros(3))
    new = [*LEARNER, Field("n", "i8", "1", "a count")]
    with RunLog(path, {}, resume=True) as log:
        s = log.stream("learner", new)
        assert s.rows_written == 3
        s.append(step=3, loss=0.0, q=9.0, done=1, n=5)
    with h5py.File(path, "r") as f:
        g = f["learner"]
        assert {ds.shape for ds in g.values()} == {(4,)}
        assert np.isnan(g["q"][:3]).all() and g["q"][3] == 9.0
        assert list(g["n"][:]) == [-1, -1, -1, 5] and g["n"].attrs["added_at_row"] == 3
        assert list(g.attrs["fields"]) == ["t", *(f.name for f in new)]
    with RunLog(path, {}, resume=True) as log, pytest.raises(ValueError, match="other fields"):
        log.stream("learner", old)  # the file's q and n, which this declaration lacks
    with RunLog(path, {}, resume=True) as log, pytest.raises(ValueError, match="other fields"):
        log.stream("learner", [*LEARNER[:2], Field("q", "f4", "1", "mean Q"), *LEARNER[3:]])


WRITER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from mpirl.logs.runlog import Field, RunLog

    log = RunLog(sys.argv[1], {"role": "test"}, flush_seconds=0.05)
    a = log.stream("a", [Field("i", "i8", "1", ""), Field("v", "f4", "1", "", (3,))])
    b = log.stream("b", [Field("i", "i8", "1", ""), Field("x", "f8", "1", "")])
    i = 0
    while True:
        for _ in range(50):
            a.append(i=i, v=np.full(3, i))
            b.append(i=i, x=2.0 * i)
            i += 1
            time.sleep(0.0005)
        if i % 1000 == 0:
            log.flush()
            print("flushed", i, flush=True)
    """
)


def _start_writer(path: Path) -> subprocess.Popen:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=env
    )


def _flushed(proc: subprocess.Popen, at_least: int) -> int:
    while True:
        line = proc.stdout.readline()
        assert line, f"writer exited early with code {proc.wait()}"
        n = int(line.split()[1])
        if n >= at_least:
            return n


def _check_rows(f: h5py.File, n: int) -> None:
    for name in ("a", "b"):
        g = f[name]
        lengths = {k: d.shape[0] for k, d in g.items()}
        assert min(lengths.values()) >= n, lengths
        cols = read_stream(f, name)
        m = len(cols["i"])
        assert all(len(c) == m for c in cols.values())
        assert np.array_equal(cols["i"], np.arange(m))
    assert np.array_equal(f["a/v"][:n, 2], np.arange(n))


def test_sigkill_leaves_readable_file(tmp_path: Path) -> None:
    path = tmp_path / "killed.h5"
    proc = _start_writer(path)
    try:
        n = _flushed(proc, 2000)
        time.sleep(0.1)  # keep appending and flushing on the cadence
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with h5py.File(path, "r") as f:  # plain default open: the dead writer holds no lock
        assert f.attrs["role"] == "test"
        _check_rows(f, n)
    with RunLog(path, {}, resume=True) as log:  # and it can be continued
        assert (
            log.stream("b", [Field("i", "i8", "1", ""), Field("x", "f8", "1", "")]).rows_written
            >= n
        )


def _read_live(f: h5py.File, n: int) -> None:
    with f:
        _check_rows(f, n)


def _retry(read: object, tries: int = 5) -> None:
    """A read that overlaps one of the writer's flushes can fail: retry, as documented."""
    for i in range(tries):
        try:
            return read()  # type: ignore[operator]
        except (OSError, KeyError):
            if i == tries - 1:
                raise
            time.sleep(0.02)


def test_live_read_while_writer_runs(tmp_path: Path) -> None:
    path = tmp_path / "live.h5"
    proc = _start_writer(path)
    try:
        n = _flushed(proc, 1000)
        _retry(lambda: _read_live(open_for_reading(path), n))
        n2 = _flushed(proc, n + 1000)
        # The plain-h5py spelling, and the default open (the writer takes no HDF5 lock).
        _retry(lambda: _read_live(h5py.File(path, "r", locking=False), n2))
        _retry(lambda: _read_live(h5py.File(path, "r"), n2))
        with pytest.raises(RuntimeError, match="being written by another process"):
            RunLog(path, {}, resume=True)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_memory_stays_flat_while_a_long_run_logs(tmp_path: Path) -> None:
    """A writer's memory does not grow with what it has written (h5py's default chunk cache kept
    ~8 MiB of every dataset in memory: ~45 MB here, with 14 fields and 400k rows)."""
    code = textwrap.dedent(f"""
        from mpirl.logs.runlog import Field, RunLog
        def rss():
            return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
        with RunLog({str(tmp_path / "grow.h5")!r}, {{}}, flush_seconds=3600) as log:
            u = log.stream("u", [Field(n, "f8", "", "") for n in "abcd"])
            x = log.stream("x", [Field(n, "f8", "", "") for n in "abcdefgh"])
            for i in range(400_001):
                u.append(a=1.0, b=2.0, c=3.0, d=4.0)
                x.append(a=1.0, b=2.0, c=3.0, d=4.0, e=5.0, f=6.0, g=7.0, h=8.0)
                if i % 400 == 0:
                    log.flush()
                if i == 20_000:
                    start = rss()
        print(rss() - start)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    grew = float(p.stdout.split()[-1])
    assert grew < 15, f"RSS grew {grew:.1f} MB while logging 400k rows"


def test_before_flush_hands_held_rows_over(tmp_path: Path) -> None:
    """A writer that holds rows back (the learner's per-update rows) registers a callback: it
    runs at every flush, before the streams are written, and at close; its own appends (which
    may find a flush due) do not recurse; a bad row it hands over still lets the others reach
    the file before the error is raised."""
    held: list[int] = []
    calls = []
    log = RunLog(tmp_path / "run.h5", {}, flush_seconds=0)  # every append finds a flush due
    s = log.stream("learner", LEARNER)

    def hand_over():
        calls.append(len(held))
        for i in held:
            s.append(step=i, loss=0.5, q=1.0, done=0)
        held.clear()

    log.before_flush(hand_over)
    held += [1, 2]
    log.flush()
    assert read_stream(log.file, "learner")["step"].tolist() == [1, 2]
    held += [3]
    log.close()
    with h5py.File(tmp_path / "run.h5", "r") as f:
        assert f["learner/step"][()].tolist() == [1, 2, 3]
    assert calls == [2, 1]

    log = RunLog(tmp_path / "bad.h5", {}, flush_seconds=1e9)
    s = log.stream("learner", LEARNER)
    log.before_flush(lambda: s.append(step=1.5, loss=0.5, q=1.0, done=0))  # not an integer
    other = log.stream("other", LEARNER)
    other.append(step=7, loss=0.5, q=1.0, done=0)
    with pytest.raises(TypeError):
        log.flush()
    assert read_stream(log.file, "other")["step"].tolist() == [7]
    log._before.clear()
    log.close()


KILLED_AFTER_CHECKPOINT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from mpirl.logs import schema
    from mpirl.run.checkpoint import Checkpointer
    from mpirl.roles.learner_rows import HeldRows
    from mpirl.logs.runlog import RunLog

    run = sys.argv[1]
    log = RunLog(run + "/learner.h5", {}, flush_seconds=3600)  # no flush on the cadence
    logs = schema.open_streams(log, "learner")
    rows = HeldRows(logs, log, alpha=0.6, eps=1e-6)
    td = np.ones(32, np.float32)
    for u in range(200):
        rows.update(u, 0.5, td, 0.4)
        if u % 4 == 0:
            rows.batch(0, u, 32, 1000, 1000, 2, td, td[:8])
    for _ in range(3):
        logs["link"].append(buffer=0, bytes_out=1, msgs_out=1, bytes_in=1, msgs_in=1,
                            queue_s=0.0, interval_s=1.0, utilization=0.0)
    Checkpointer(run, "learner", log=log).write(1, {})
    os.kill(os.getpid(), signal.SIGKILL)  # a kill just after the checkpoint
    """
)


def test_checkpoint_counts_held_rows_and_puts_them_on_disk(tmp_path: Path) -> None:
    """A checkpoint's row counts cover every row appended before it, also the learner's held
    /updates and /transfers rows (`HeldRows`), and those rows are on disk when the part is: a
    kill just after a checkpoint, within --flush-seconds, loses no row from before it."""
    from mpirl.run import checkpoint as ck

    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    p = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_CHECKPOINT, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    part = json.loads((ck.root(tmp_path) / "000001" / "learner.json").read_text())
    counted = part["meta"]["log_rows"]
    assert (counted["updates"], counted["transfers"], counted["link"]) == (200, 50, 3)
    with h5py.File(tmp_path / "learner.h5", "r") as f:
        assert ck.file_rows(f) == counted
        assert f["updates/update"][()].tolist() == list(range(200))


def test_td_abs_uniform_estimates_the_memory_mean_a_uniform_draw_would_meet():
    """/updates td_abs_uniform (learner_rows.uniform_means): a PER batch's |td| weighted by
    1 / p_i estimates the mean |td| over the whole memory, which td_abs_mean (the batch's own
    mean) overstates by construction; NaN where what the batch was drawn as is not known."""
    from mpirl.replay.memory import PrioritizedReplay
    from mpirl.roles.learner_rows import uniform_means

    rng = np.random.default_rng(3)
    td = rng.lognormal(0, 1.2, 8192).astype(np.float32)
    dtype = np.dtype([("x", "f4")])
    mem = PrioritizedReplay(8192, dtype, alpha=0.6, beta=0.4, eps=1e-6, seed=1)
    rec = np.zeros(td.size, dtype)
    rec["x"] = td
    mem.add(rec, td)
    est, own = [], []
    for _ in range(3000):
        s = mem.sample(64)
        est.append(uniform_means(s.records["x"][None, :], s.priorities[None, :])[0])
        own.append(float(s.records["x"].mean()))
    assert float(np.mean(est)) == pytest.approx(float(td.mean()), rel=0.05)
    assert float(np.mean(own)) > 1.5 * float(td.mean())  # the prioritized batch's own mean
    nan = uniform_means(np.ones((2, 4), np.float32), np.full((2, 4), np.nan, np.float32))
    assert np.isnan(nan).all()
