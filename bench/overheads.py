"""Component overheads: each part of mpirl against its raw reference, measured in one invocation.

    python bench/overheads.py [--seconds 15] [--out FILE.md]
                              [--only actor learner reference transport startup] [--keep DIR]
                              [--mpirl-args "FLAGS"] [--rounds N] [--batch-size B]

Four components, each a ratio of mpirl's figure to a reference measured by the same invocation
(with their targets), and the whole loop against ``python -m mpirl.reference``:

1. **actor** -- env steps/s of the one actor rank of ``mpirun -n 3 python -m mpirl.main`` (learner,
   buffer, actor; ``--replay-ratio 0`` so the actor is never throttled by the rate limiter) against
   a bare loop in one process: the same gymnasium env (CartPole-v1), ``envs_per_actor`` envs
   stepped in lockstep after one batched forward of mpirl's ``NumpyQ`` (random weights), the same
   Ape-X epsilon-greedy choice.  No n-step returns, priorities, messages or logs: those are the
   overhead being measured.  Target >= 0.85.
2. **learner** -- updates/s of the learner rank of the same job, learner the bottleneck (actors
   unthrottled, ``--replay-ratio 0``, as bench/link.py), with greedy evaluation off
   (``--eval-every`` 10**9: the reference does not evaluate either), against a loop of
   ``mpirl.agent.train_step.TrainStep`` -- the learner's own train step, not a copy (same network,
   batch size, Adam, gradient clip, target copy every ``target_update``) -- on batches of the same
   form the learner gets (structured records viewed out of a BATCH message).  Target >= 0.9.
   Evaluation's share is reported beside it, from a second run of the same job with the default
   evaluation on (``--eval-every``, ``--evaluator`` as configured): its updates/s against the
   run without, and the evaluations' own time (``/evals/eval_s``, in whichever runner played
   them) as a fraction of the same steady window.  The child process of ``--evaluator process``
   inherits the learner's pinning to core A, so it competes with the learner there.
3. **transport** -- actor -> buffer payload bytes/s over mpirl's transport path against a raw
   uppercase mpi4py stream of messages of the same size, both under ``mpirun -n 2`` (this file's
   ``_transport`` mode).  The mpirl side sends synthetic EXPERIENCE messages of the real size (one
   ``actor_chunk`` of CartPole transitions, no episode returns), packed by ``Wire.experience`` for
   every message, as fast as tokens allow, through the roles' own transport
   (`mpirl.transport.inbox`: ``Inbox.serve``, matched ``Improbe``/``Recv`` into a fresh buffer,
   ``Wire.unpack``, the handler of the kind; ``SitePort``: ``Isend`` kept until ``Test``) driven as
   ``Actor.receive``/``Actor.send_chunk`` and ``Buffer.receive_actors`` drive it: ``actor_credits``
   tokens, one CREDIT per buffer turn of at most 8 messages, the ``Backoff`` naps when a turn did
   nothing).  The raw stream: ``Isend`` of one preallocated uint8 buffer in windows of 64
   (``Waitall`` per window), blocking ``Recv`` into one preallocated buffer.  Phases alternate raw,
   mpirl, no-nap, credits, twice (``--seconds`` / 8 each); rates are bytes received after the first
   message / time from first to last.  Two variants of the mpirl path, for the notes only: no-nap
   (``Backoff(0, 0)``: idle turns only yield the CPU), which separates the cost of the calls from
   the latency of the naps, and credits (64 tokens, the raw stream's window, as
   ``--actor-credits 64`` would give).
   Target >= 0.8.
4. **whole loop** (``reference``; no target) -- the learner run's updates/s and the actor run's
   env steps/s (the median rounds of 1 and 2) against ``python -m mpirl.reference`` run for
   ``--seconds`` with the same flags (``run_flags``: seed, ``--replay-ratio 0``, evaluation off,
   ``--batch-size``): the same envs, n-step returns, prioritized memory and ``TrainStep`` in one
   process, no MPI, which acts and learns on one core (at ``--replay-ratio 0`` one update per
   turn of ``envs_per_actor`` env steps) while the pipeline's measured rank has a core of its
   own.  Its rates come from its progress rows after the first third, as the pipeline runs'; it
   runs once, after the learner rounds, pinned and ballasted as the references of 1 and 2.  The
   ratios say what distributing the loop gives on this machine, not an overhead.
5. **start-up** -- seconds from launching ``mpirun -n 9 python -m mpirl.main`` until every actor
   has made its first env step (the latest of the actors' HDF5 attribute ``first_step_unix``,
   minus the launch time), against the seconds from launching ``mpirun -n 9 python -c ...``
   until every rank has imported torch, gymnasium and mpi4py, passed ``MPI_Init`` and a
   ``Barrier`` (the latest rank's clock right after it).  Both end where every rank is ready to
   work; neither counts teardown.  Target <= 1.5x.  Not pinned: both oversubscribe the 2 cores in
   the same way.

Fairness on a small machine (designed for 2 cores; 3 ranks oversubscribe it): for 1 and 2 the
measured rank gets a core to itself.  The job is launched MPMD, each rank through this file's
``_rank`` mode, which pins the rank (``os.sched_setaffinity``, as ``taskset -c``) and runs
``mpirl.main.main`` in-process::

    actor run:   mpirun -n 2 python bench/overheads.py _rank B ... \
                   : -n 1 python bench/overheads.py _rank A ...
                 (ranks 0 learner and 1 buffer on core B, rank 2 the actor alone on core A)
    learner run: mpirun -n 1 ... _rank A ... : -n 2 ... _rank B ...
                 (rank 0 the learner alone on core A, buffer and actor on core B)

(rank order: learner, buffer, then its actors; ``mpirl/transport/topology.py``).  Each reference
runs in a subprocess pinned to the same core A, with one BLAS/torch thread as mpirl's ranks, while a
spinning "ballast" process is pinned to core B: on a shared machine the scheduler moves other
processes to the less busy core, so without the ballast core A would be crowded during the
pipeline run (its core B busy with two ranks) and not during the reference.  The reference runs
half its time just before the pipeline run and half just after; its rates are the mean of the two.
``_rank`` also samples its process's CPU time every 0.2 s, so the table reports per-CPU-second
figures too (env steps per CPU second of the actor process, updates per CPU second of the learner
process): they do not depend on how much of core A the measured process got (they do on cache
and frequency effects of sharing it).  Rates of the pipeline runs come from their HDF5 logs over
the steady part of the run (rows after the first third): the actor's ``/actor`` rows (one per
flush; the actor run passes ``--flush-seconds 0.25`` to get 4 a second, and its final row, written
after the stop, is left out) and the learner's ``/progress`` rows (1 s).  The transport ranks are
pinned to cores A and B.  With ``MPIRL_PROFILE=1`` in the environment every pipeline rank and
(with ``--keep``) both transport ranks dump a cProfile, kept with ``--keep DIR``; profiling slows
them, so do not quote those figures.

Time: about 3 x ``--seconds`` for the references and transport, 3 x (``--seconds`` + start-up)
for the pipeline runs (actor, learner, learner with evaluation), plus the two start-up
launches: 3-3.5 minutes at ``--seconds 15`` on a loaded 2-core machine.  Every mpirun runs alone
(one after the other).  ``--rounds N`` repeats the actor and learner measurements (each with its
own reference before and after) and reports the median round: one round's ratio moved by
+-0.07 between invocations on the shared development machine (docs/benchmarks.md).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # as mpirl.main does; children inherit it

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
COMPONENTS = ("actor", "learner", "reference", "transport", "startup")
RAW_WINDOW = 64
BENCH_MEMORY = 4096  # transitions the learner benches sample their batches from
EXTRA: list[str] = []  # more mpirl.main flags for the pipeline runs (--mpirl-args)


# ---- helpers ------------------------------------------------------------------------------------


def mpirun() -> str:
    from mpirl.launch import mpirun_path

    return mpirun_path()


def cores() -> tuple[int | None, int | None]:
    """(A, B): the measured rank's core and the other ranks' core; None, None = no pinning."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)


def pin(cpu) -> None:
    if cpu is not None and str(cpu) != "-":
        os.sched_setaffinity(0, {int(cpu)})


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)
    if p.returncode:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        )
    return p


def last_json(text: str) -> dict:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def default_cfg():
    """mpirl's defaults, with ``--batch-size`` (passed to the reference subprocesses in the
    environment) applied."""
    from mpirl.run.config import Config

    batch = os.environ.get("MPIRL_OVERHEADS_BATCH")
    return Config(batch_size=int(batch)) if batch else Config()


# ---- _rank: one pinned mpirl rank that records its CPU time -------------------------------------


def rank_mode(argv: list[str]) -> int:
    """``_rank CPU CPU_PREFIX -- <mpirl.main args>``."""
    cpu, prefix = argv[0], argv[1]
    args = argv[argv.index("--") + 1 :]
    pin(cpu)
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", str(os.getpid())))

    def sample() -> None:  # (unix time, process CPU seconds), 5 per second
        with open(f"{prefix}-{rank}.txt", "w") as f:
            while True:
                f.write(f"{time.time():.6f} {time.process_time():.6f}\n")
                f.flush()
                time.sleep(0.2)

    threading.Thread(target=sample, daemon=True).start()
    import mpirl.main

    return mpirl.main.main(args)


def cpu_at(prefix: Path, rank: int, unix):
    import numpy as np

    rows = []
    for line in Path(f"{prefix}-{rank}.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:  # the last line may be cut short by the process's exit
            rows.append((float(parts[0]), float(parts[1])))
    data = np.array(rows)
    return np.interp(unix, data[:, 0], data[:, 1])


def run_flags(seconds: float, evaluate: bool = False) -> list[str]:
    """The mpirl.main flags of the pipeline runs that ``python -m mpirl.reference`` shares: the
    budget, no target, no rate limit, progress rows every second, seed 3, evaluation off unless
    ``evaluate``, ``--batch-size`` (not ``--mpirl-args``: the references do not change)."""
    args = ["--max-seconds", str(seconds)]
    args += "--target-return none --replay-ratio 0 --progress-seconds 1".split()
    args += "--checkpoint-seconds 0 --seed 3".split()
    if not evaluate:  # the references never evaluate: like with like
        args += ["--eval-every", str(10**9)]
    if os.environ.get("MPIRL_OVERHEADS_BATCH"):  # --batch-size: the references use it too
        args += ["--batch-size", os.environ["MPIRL_OVERHEADS_BATCH"]]
    return args


def pipeline(
    tmp: Path, name: str, seconds: float, measured: str, keep: Path | None, evaluate: bool = False
) -> dict:
    """mpirun -n 3, the measured rank (learner or actor) alone on core A; greedy evaluation at
    the learner off unless ``evaluate`` (then the default ``--eval-every``)."""
    import h5py
    import numpy as np

    a, b = cores()
    a, b = ("-" if a is None else a), ("-" if b is None else b)
    run_dir, prefix = tmp / name, tmp / f"{name}-cpu"
    args = ["--run-dir", str(run_dir), *run_flags(seconds, evaluate)]
    if measured == "actor":  # an /actor row per flush: 4 a second, not one per 2 s
        args += ["--flush-seconds", "0.25"]
    args += EXTRA  # --mpirl-args

    def block(n: int, cpu) -> list[str]:
        return [
            "-n",
            str(n),
            sys.executable,
            str(HERE),
            "_rank",
            str(cpu),
            str(prefix),
            "--",
            *args,
        ]

    if measured == "actor":  # ranks 0, 1 (learner, buffer) on B; rank 2 (the actor) on A
        cmd = [mpirun(), *block(2, b), ":", *block(1, a)]
    else:  # rank 0 (the learner) on A; ranks 1, 2 on B
        cmd = [mpirun(), *block(1, a), ":", *block(2, b)]
    run(cmd, timeout=seconds + 180)
    if keep is not None:
        shutil.copytree(run_dir, keep / name, dirs_exist_ok=True)
    out: dict = {
        "cmd": " ".join(cmd[:1] + [c if c != str(HERE) else "bench/overheads.py" for c in cmd[1:]])
    }
    if measured == "actor":
        with h5py.File(run_dir / "actor-2.h5", "r") as f:
            t0 = float(f.attrs["t0_unix"])
            t = f["actor/t"][()][:-1]  # the last row is written after the stop
            steps = f["actor/env_steps"][()][:-1]
            thr = f["actor/throttled_s"][()][:-1]
        i = int(np.argmax(t >= t[0] + (t[-1] - t[0]) / 3))
        wall = t[-1] - t[i]
        cpu = cpu_at(prefix, 2, t[[i, -1]] + t0)
        n = steps[-1] - steps[i]
        out.update(
            rate=n / wall,
            per_cpu=n / (cpu[1] - cpu[0]),
            cpu_share=(cpu[1] - cpu[0]) / wall,
            throttled=(thr[-1] - thr[i]) / wall,
            window_s=wall,
        )
    else:
        with h5py.File(run_dir / "learner.h5", "r") as f:
            t0 = float(f.attrs["t0_unix"])
            t = f["progress/t"][()]
            upd = f["progress/updates"][()]
            busy = f["progress/busy_fraction"][()]
            idle = f["progress/idle_fraction"][()]
            ev_t = f["evals/t"][()] if "evals" in f else np.zeros(0)
            ev_s = f["evals/eval_s"][()] if "evals" in f else np.zeros(0)
        while len(upd) > 3 and upd[-1] == upd[-2]:  # rows written while stopping: no updates
            t, upd, busy, idle = t[:-1], upd[:-1], busy[:-1], idle[:-1]
        i = int(np.argmax(t >= t[0] + (t[-1] - t[0]) / 3))
        wall = t[-1] - t[i]
        cpu = cpu_at(prefix, 0, t[[i, -1]] + t0)
        n = upd[-1] - upd[i]
        # the evaluations whose results came in during the steady window, and their own time
        inside = (ev_t > t[i]) & (ev_t <= t[-1])
        eval_s, n_evals = float(np.sum(ev_s[inside])), int(np.sum(inside))
        out.update(
            rate=n / wall,
            per_cpu=n / (cpu[1] - cpu[0]),
            cpu_share=(cpu[1] - cpu[0]) / wall,
            busy=float(np.mean(busy[i + 1 :])),
            idle=float(np.mean(idle[i + 1 :])),
            window_s=wall,
            eval_share=eval_s / wall,
            evals=n_evals,
            eval_ms=1e3 * eval_s / n_evals if n_evals else float("nan"),
        )
    return out


# ---- references ----------------------------------------------------------------------------------


def ref_actor_mode(argv: list[str]) -> int:
    """``_ref_actor CPU SECONDS``: the bare env + policy loop, one process."""
    pin(argv[0])
    seconds = float(argv[1])
    import numpy as np

    from mpirl.agent import envs as envs_mod
    from mpirl.agent.qnet import make_q
    from mpirl.roles.actor import epsilon

    cfg = default_cfg()
    spec = envs_mod.inspect(cfg.env)
    m = cfg.envs_per_actor
    rng = np.random.default_rng(cfg.seed + 2000)
    envs = [envs_mod.make(cfg.env, seed=j) for j in range(m)]
    eps = [epsilon(j, m, cfg.eps_base, cfg.eps_alpha) for j in range(m)]  # 1 actor
    n_act = spec.n_actions
    q = make_q(spec, cfg.hidden, cfg.dueling)
    q.load(rng.normal(0, 0.3, q.size).astype(np.float32))
    obs = np.stack([e.reset(seed=j)[0] for j, e in enumerate(envs)])
    env_action = [envs[0].action_space.dtype.type(i) for i in range(n_act)]  # as the actor
    steps = 0
    t_warm = time.monotonic() + min(1.0, seconds / 5)
    t0 = c0 = None
    while True:
        now = time.monotonic()
        if t0 is None and now >= t_warm:
            t0, c0, steps = now, time.process_time(), 0
        elif t0 is not None and now - t0 >= seconds:
            break
        qv = q(obs)
        actions = qv.argmax(axis=1).tolist()
        u = rng.random(2 * m).tolist()  # the actor's draw (mpirl.roles.actor.Actor.act)
        for j, env in enumerate(envs):
            a = actions[j] if u[j] >= eps[j] else min(int(u[m + j] * n_act), n_act - 1)
            nxt, _, term, trunc, _ = env.step(env_action[a])
            steps += 1
            if term or trunc:
                nxt, _ = env.reset()
            obs[j] = nxt
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    print(json.dumps({"rate": steps / wall, "per_cpu": steps / cpu, "cpu_share": cpu / wall}))
    return 0


def batch_messages(cfg, spec, wire, count: int = 64) -> list:
    """BATCH messages as the learner receives them (`mpirl.fakes.batch_messages` from a memory of
    BENCH_MEMORY; also bench/learner_loop.py's)."""
    from mpirl import fakes

    return fakes.batch_messages(cfg, spec, wire, count, BENCH_MEMORY)


def ref_learner_mode(argv: list[str]) -> int:
    """``_ref_learner CPU SECONDS``: mpirl.agent.train_step.TrainStep in a loop, one process."""
    pin(argv[0])
    seconds = float(argv[1])
    import torch

    from mpirl.agent import envs as envs_mod
    from mpirl.agent.qnet import param_count
    from mpirl.agent.train_step import TrainStep
    from mpirl.replay.build import record_dtype
    from mpirl.transport.wire import Tag, Wire

    cfg = default_cfg()
    spec = envs_mod.inspect(cfg.env)
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    wire = Wire(
        record_dtype(cfg, spec),
        param_count(spec.obs_shape, spec.n_actions, cfg.hidden, cfg.dueling),
    )
    batches = [
        wire.unpack(buf, Tag.BATCH, "bench").arrays for buf in batch_messages(cfg, spec, wire)
    ]
    step = TrainStep(cfg, spec)
    updates = 0
    t_warm = time.monotonic() + min(1.0, seconds / 5)
    t0 = c0 = None
    while True:
        now = time.monotonic()
        if t0 is None and now >= t_warm:
            t0, c0, counted = now, time.process_time(), updates
        elif t0 is not None and now - t0 >= seconds:
            break
        arr = batches[updates % len(batches)]
        step.step(arr["records"], arr["weights"])  # copies the target every target_update
        updates += 1
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    n = updates - counted
    print(json.dumps({"rate": n / wall, "per_cpu": n / cpu, "cpu_share": cpu / wall}))
    return 0


def ref_whole_mode(argv: list[str]) -> int:
    """``_ref_whole CPU SECONDS``: ``python -m mpirl.reference`` (the whole DQN in one process)
    with the pipeline runs' flags; its rates over its progress rows after the first third."""
    pin(argv[0])
    import numpy as np

    from mpirl import reference
    from mpirl.run.config import parse

    summary = reference.run(parse(run_flags(float(argv[1]))), say=lambda line: None)
    t, steps, updates, cpu = np.array(summary["progress"]).T
    i = int(np.argmax(t >= t[0] + (t[-1] - t[0]) / 3))
    wall, used = t[-1] - t[i], cpu[-1] - cpu[i]
    n, k = updates[-1] - updates[i], steps[-1] - steps[i]
    out = {"rate": n / wall, "per_cpu": n / used, "env_rate": k / wall, "env_per_cpu": k / used}
    print(json.dumps({**out, "cpu_share": used / wall, "window_s": wall}))
    return 0


BALLAST = (
    "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nend = time.monotonic() + "
    "float(sys.argv[2])\nwhile time.monotonic() < end:\n    pass\n"
)


def reference(kind: str, seconds: float) -> dict:
    """One reference run on core A, with core B kept busy by a spinning process (ballast) as the
    pipeline's other ranks keep it busy, so that other processes on the machine crowd core A
    as much during the reference as during the pipeline run."""
    a, b = cores()
    cmd = [sys.executable, str(HERE), f"_ref_{kind}", "-" if a is None else str(a), str(seconds)]
    ballast = None
    if b is not None:
        ballast = subprocess.Popen([sys.executable, "-c", BALLAST, str(b), str(seconds + 60)])
    try:
        return last_json(run(cmd, timeout=seconds + 120).stdout)
    finally:
        if ballast is not None:
            ballast.kill()
            ballast.wait()


def references(kind: str, seconds: float, between) -> tuple[dict, dict]:
    """Half the reference before ``between()`` (the pipeline run), half after; rates averaged."""
    before = reference(kind, seconds / 2)
    got = between()
    after = reference(kind, seconds / 2)
    ref = {k: (before[k] + after[k]) / 2 for k in before}
    ref["before"], ref["after"] = before["rate"], after["rate"]
    return got, ref


# ---- transport: mpirun -n 2 ----------------------------------------------------------------------

RAW, END = 101, 102  # tags of the raw stream


def experience_payload(cfg, spec, wire):
    """One actor_chunk of CartPole-like transitions and their |td| (no episode returns)."""
    import numpy as np

    rng = np.random.default_rng(0)
    k = cfg.actor_chunk
    rec = np.zeros(k, wire.record)
    rec["obs"] = rng.normal(size=rec["obs"].shape)
    rec["next_obs"] = rng.normal(size=rec["obs"].shape)
    rec["action"] = rng.integers(0, spec.n_actions, k)
    rec["reward"] = 1.0
    rec["discount"] = cfg.gamma**cfg.n_step
    return rec, rng.random(k)


def raw_phase(comm, size: int, secs: float):
    """Rank 0: Isend windows of one preallocated buffer; rank 1: blocking Recv into one."""
    import numpy as np
    from mpi4py import MPI

    buf = np.zeros(size, np.uint8)
    comm.Barrier()
    if comm.Get_rank() == 0:
        t_end = time.monotonic() + secs
        while time.monotonic() < t_end:
            reqs = [comm.Isend([buf, MPI.BYTE], dest=1, tag=RAW) for _ in range(RAW_WINDOW)]
            MPI.Request.Waitall(reqs)
        comm.Send([buf[:0], MPI.BYTE], dest=1, tag=END)
        return None
    st = MPI.Status()
    n, t_first, t_last = 0, None, None
    while True:
        comm.Recv([buf, MPI.BYTE], source=0, tag=MPI.ANY_TAG, status=st)
        if st.Get_tag() == END:
            break
        t_last = time.monotonic()
        if t_first is None:
            t_first = t_last
        n += 1
    return {"bytes": (n - 1) * size, "s": t_last - t_first, "msgs": n - 1}


class TransportActor:
    """Rank 0 of the mpirl phase: the actor's calls (`mpirl.transport.inbox` for the buffer's
    CREDIT, `SitePort` sends kept until ``Test``, the ``Backoff`` wait without a token), sending one
    freshly packed EXPERIENCE per token."""

    def __init__(self, port, wire, payload, credits: int, backoff):
        self.port, self.wire, self.payload, self.backoff = port, wire, payload, backoff
        self.tokens, self.seq, self.idle, self.acked = credits, 0, 0.0, False

    def run(self, secs: float) -> dict:
        from mpirl.transport.wire import Tag

        BUFFER = 1

        inbox, rec, td_abs = self.port.inbox, *self.payload
        handlers = {Tag.CREDIT: self.on_credit}
        t_end = time.monotonic() + secs
        while time.monotonic() < t_end:
            inbox.serve(handlers, source=BUFFER)
            self.port.poll()
            if self.tokens <= 0:  # no token: the actor's wait (throttled time)
                t0 = time.monotonic()
                self.backoff.idle()
                self.idle += time.monotonic() - t0
                continue
            self.backoff.work()
            while self.tokens > 0:  # send_chunk while tokens last
                buf = self.wire.experience(rec, td_abs, [], len(rec), self.seq)
                self.port.post(buf, BUFFER)
                self.seq += 1
                self.tokens -= 1
        self.port.post(self.wire.done(0, 0), BUFFER)
        drain = {t: (self.on_done if t == Tag.DONE else lambda m: None) for t in Tag}
        while not self.acked or self.port.backlog:  # until the buffer's DONE
            if not inbox.serve(drain, source=BUFFER):
                self.port.poll()
                time.sleep(1e-4)
        return {"token_wait_s": self.idle, "msgs_sent": self.seq}

    def on_credit(self, m) -> None:
        self.tokens += m.tokens

    def on_done(self, m) -> None:
        self.acked = True


class TransportBuffer:
    """Rank 1 of the mpirl phase: the buffer's site part (`mpirl.transport.inbox`, at most
    MAX_ACTOR_MSGS_PER_TURN per turn, one CREDIT per turn; replay_ratio 0: never held back)."""

    def __init__(self, port, wire, backoff):
        self.port, self.wire, self.backoff = port, wire, backoff
        self.owed = self.n = self.nbytes = self.env_steps = 0
        self.t_first = self.t_last = None
        self.returns: list = []
        self.done = False

    def run(self) -> dict:
        from mpirl.roles.buffer import MAX_ACTOR_MSGS_PER_TURN
        from mpirl.transport.wire import Tag

        handlers = {Tag.EXPERIENCE: self.on_experience, Tag.DONE: self.on_done}
        while not self.done:
            did = self.port.inbox.serve(handlers, limit=MAX_ACTOR_MSGS_PER_TURN)
            if self.owed:  # grant_tokens
                self.port.post(self.wire.credit(self.owed), 0)
                self.owed = 0
            self.port.poll()
            self.backoff.work() if did else self.backoff.idle()
        self.port.post(self.wire.done(0, 0), 0)
        while self.port.backlog:
            self.port.poll()
            time.sleep(1e-4)
        return {"bytes": self.nbytes, "s": self.t_last - self.t_first, "msgs": self.n}

    def on_experience(self, m) -> None:
        self.env_steps += m.env_steps
        self.returns.extend(m.arrays["returns"].tolist())
        self.t_last = time.monotonic()
        if self.t_first is None:
            self.t_first = self.t_last
        else:
            self.n += 1
            self.nbytes += m.nbytes
        self.owed += 1

    def on_done(self, m) -> None:
        self.done = True


def mpirl_phase(comm, wire, payload, secs: float, profiler, nap: bool, credits: int) -> dict:
    """The actor's (rank 0) and the buffer's (rank 1) calls through mpirl's own inbox and site
    port (`mpirl.transport.inbox`); ``nap=False``: Backoff(0, 0), idle turns only yield the CPU."""
    from mpirl.transport.inbox import Inbox, SitePort
    from mpirl.transport.waiting import Backoff

    rank = comm.Get_rank()
    port = SitePort(comm, Inbox(wire, f"rank {rank}", lambda r: f"rank {r}", comm))
    backoff = Backoff() if nap else Backoff(0.0, 0.0)
    comm.Barrier()
    if profiler is not None:
        profiler.enable()
    if rank == 0:
        out = TransportActor(port, wire, payload, credits, backoff).run(secs)
    else:
        out = TransportBuffer(port, wire, backoff).run()
    if profiler is not None:
        profiler.disable()
    return out


def transport_mode(argv: list[str]) -> int:
    """``_transport SECONDS PROFILE_DIR|-``, under mpirun -n 2: alternating raw / mpirl phases."""
    seconds, prof_dir = float(argv[0]), argv[1]
    from mpi4py import MPI

    from mpirl.agent import envs as envs_mod
    from mpirl.agent.qnet import param_count
    from mpirl.replay.build import record_dtype
    from mpirl.transport.wire import Wire

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    a, b = cores()
    pin(a if rank == 0 else b)
    cfg = default_cfg()
    spec = envs_mod.inspect(cfg.env)
    wire = Wire(
        record_dtype(cfg, spec),
        param_count(spec.obs_shape, spec.n_actions, cfg.hidden, cfg.dueling),
    )
    payload = experience_payload(cfg, spec, wire)
    size = wire.experience(*payload, [], cfg.actor_chunk, 0).nbytes
    profiler = None
    if prof_dir != "-":
        import cProfile

        profiler = cProfile.Profile()
    phase = seconds / 8
    got = {"raw": [], "mpirl": [], "nonap": [], "credits": []}
    for kind in ("raw", "mpirl", "nonap", "credits") * 2:
        if kind == "raw":
            r = raw_phase(comm, size, phase)
        else:
            r = mpirl_phase(
                comm,
                wire,
                payload,
                phase,
                profiler,
                nap=kind != "nonap",
                credits=RAW_WINDOW if kind == "credits" else cfg.actor_credits,
            )
        r = comm.gather(r, root=1)  # small dicts, once per phase
        if rank == 1:
            got[kind].append({**r[1], **({} if r[0] is None else r[0])})
    comm.Barrier()
    if profiler is not None:
        profiler.dump_stats(Path(prof_dir) / f"transport-rank{rank}.pstats")
    if rank == 1:
        res = {"size": size}
        for kind, rows in got.items():
            res[kind] = {
                "rate": sum(x["bytes"] for x in rows) / sum(x["s"] for x in rows),
                "msgs_per_s": sum(x["msgs"] for x in rows) / sum(x["s"] for x in rows),
            }
        for kind in ("mpirl", "nonap", "credits"):
            res[kind]["token_wait_s"] = sum(x["token_wait_s"] for x in got[kind])
            res[kind]["s"] = sum(x["s"] for x in got[kind])
        print(json.dumps(res), flush=True)
    return 0


def transport(seconds: float, keep: Path | None) -> dict:
    prof = "-"
    if os.environ.get("MPIRL_PROFILE") and keep is not None:
        prof = str(keep)
    cmd = [mpirun(), "-n", "2", sys.executable, str(HERE), "_transport", str(seconds), prof]
    return last_json(run(cmd, timeout=seconds + 120).stdout)


# ---- start-up ------------------------------------------------------------------------------------

#: The start-up reference: every rank imports what mpirl's ranks need, passes MPI_Init (the
#: mpi4py.MPI import) and a barrier and reads its clock; rank 0 prints every rank's reading
#: (gathered after the readings, so no teardown and no printing is counted).
STARTUP_REF = (
    "import time, torch, gymnasium\nfrom mpi4py import MPI\nMPI.COMM_WORLD.Barrier()\n"
    "t = time.time()\nts = MPI.COMM_WORLD.gather(t, root=0)\n"
    "if ts is not None:\n    print('READY', *map(repr, ts), flush=True)\n"
)


def startup(tmp: Path, ranks: int = 9) -> dict:
    import h5py

    ref_cmd = [mpirun(), "-n", str(ranks), sys.executable, "-c", STARTUP_REF]
    t = time.time()
    p = run(ref_cmd, timeout=300)
    ref_total = time.time() - t
    ready = [
        float(x) - t
        for line in p.stdout.splitlines()
        if line.startswith("READY ")
        for x in line.split()[1:]
    ]
    if len(ready) != ranks:
        raise RuntimeError(
            f"start-up reference: {len(ready)} of {ranks} ranks reported:\n"
            f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        )
    run_dir = tmp / "startup"
    cmd = [
        mpirun(),
        "-n",
        str(ranks),
        sys.executable,
        "-m",
        "mpirl.main",
        "--run-dir",
        str(run_dir),
        "--max-seconds",
        "1",
        "--target-return",
        "none",
        "--progress-seconds",
        "0",
    ]
    t = time.time()
    run(cmd, timeout=300)
    total = time.time() - t
    firsts = []
    for p in sorted(run_dir.glob("actor-*.h5")):
        with h5py.File(p, "r") as f:
            firsts.append(float(f.attrs["first_step_unix"]) - t)
    return {
        "rate": max(firsts),
        "first_actor": min(firsts),
        "total": total,
        "ref": max(ready),
        "ref_first": min(ready),
        "ref_total": ref_total,
    }


# ---- the table -----------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--seconds",
        type=float,
        default=15,
        help="length of each measurement (pipeline runs, references, transport)",
    )
    ap.add_argument(
        "--only",
        nargs="+",
        choices=COMPONENTS,
        default=list(COMPONENTS),
        help="the components to measure (reference: python -m mpirl.reference, compared with "
        "the actor and learner runs measured in the same invocation)",
    )
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    ap.add_argument(
        "--keep",
        default=None,
        help="keep the run folders (and MPIRL_PROFILE=1 profiles) in this folder",
    )
    ap.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="learner batch size for the pipeline runs and the TrainStep reference "
        "alike (default mpirl's, 64): the loop's cost per update is fixed, its "
        "train step grows with the batch",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="actor and learner: measure each this many times (its reference half "
        "before and half after each pipeline run) and report the median ratio "
        "with the range: on a shared machine one round's ratio moves by "
        "+-0.07 between invocations",
    )
    ap.add_argument(
        "--mpirl-args",
        default="",
        help="more mpirl.main flags for the actor and learner pipeline runs, one "
        'string (e.g. "--inflight 16"); the references do not change',
    )
    a = ap.parse_args()
    EXTRA[:] = shlex.split(a.mpirl_args)
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: give a number of rounds >= 1")
    if a.batch_size is not None:
        if not 1 <= a.batch_size <= BENCH_MEMORY:
            ap.error(
                f"--batch-size {a.batch_size}: give a batch size from 1 to {BENCH_MEMORY} "
                "(the transitions the reference samples from)"
            )
        os.environ["MPIRL_OVERHEADS_BATCH"] = str(a.batch_size)
    return a


def measure(a: argparse.Namespace, keep: Path | None) -> dict:
    """Every component asked for, one mpirun at a time."""
    res: dict = {}
    with tempfile.TemporaryDirectory() as tmpname:
        tmp = Path(tmpname)
        for kind in ("actor", "learner"):
            if kind in a.only:
                res[kind] = []
                for i in range(a.rounds):
                    name = f"{kind}-run" + (f"-{i}" if i else "")
                    got, ref = references(
                        kind,
                        a.seconds,
                        lambda kind=kind, name=name: pipeline(tmp, name, a.seconds, kind, keep),
                    )
                    res[kind].append((got, ref))
                    print(json.dumps({kind: got, "reference": ref, "round": i}), flush=True)
        if "reference" in a.only:  # after the pipeline runs it is compared with
            res["reference"] = reference("whole", a.seconds)
            print(json.dumps({"mpirl.reference": res["reference"]}), flush=True)
        if "learner" in a.only:  # the same job with the default greedy evaluation on
            res["learner_eval"] = pipeline(
                tmp, "learner-eval-run", a.seconds, "learner", keep, evaluate=True
            )
            print(json.dumps({"learner with evaluation": res["learner_eval"]}), flush=True)
        if "transport" in a.only:
            t = transport(a.seconds, keep)
            res["transport"] = (t["mpirl"], t["raw"], t["size"])
            res["transport_nonap"], res["transport_credits"] = t["nonap"], t["credits"]
            print(json.dumps({"transport": t}), flush=True)
        if "startup" in a.only:
            s = startup(tmp)
            res["startup"] = s
            print(json.dumps({"startup": s}), flush=True)
    return res


def yes(ok: bool) -> str:
    return "**yes**" if ok else "**no**"


def median_round(pairs: list):
    """(median round's pipeline figures, its reference's, median ratio, ratios text)."""
    ratios = [g["rate"] / f["rate"] for g, f in pairs]
    mid = sorted(range(len(pairs)), key=lambda i: ratios[i])[len(pairs) // 2]
    text = (
        ""
        if len(pairs) == 1
        else (
            f"; {len(pairs)} rounds, ratio per round "
            + ", ".join(f"{x:.2f}" for x in ratios)
            + f" (median {ratios[mid]:.2f}, the round shown)"
        )
    )
    return pairs[mid][0], pairs[mid][1], ratios[mid], text


def actor_rows(res: dict, cfg, rows: list, cpu_rows: list, notes: list) -> None:
    got, ref, r, per_round = median_round(res["actor"])
    rows.append(
        f"| actor: env steps/s of 1 actor rank ({cfg.env}, {cfg.envs_per_actor} envs) |"
        f" {got['rate']:,.0f} | {ref['rate']:,.0f} (bare env + policy loop) | "
        f"{r:.2f} | >= 0.85 | {yes(r >= 0.85)} |"
    )
    cpu_rows.append(
        f"| actor: env steps | {got['per_cpu']:,.0f} | {ref['per_cpu']:,.0f} | "
        f"{got['per_cpu'] / ref['per_cpu']:.2f} |"
    )
    notes.append(
        f"actor: steady window {got['window_s']:.1f} s; the actor process used "
        f"{got['cpu_share']:.0%} of a core (reference {ref['cpu_share']:.0%}); "
        f"waited for tokens {got['throttled']:.1%} of the time; reference "
        f"{ref['before']:,.0f}/s before, {ref['after']:,.0f}/s after the run" + per_round
    )


def learner_rows(res: dict, cfg, rows: list, cpu_rows: list, notes: list) -> None:
    got, ref, r, per_round = median_round(res["learner"])
    busy = ", ".join(f"{g['busy']:.2f}" for g, _ in res["learner"])
    rows.append(
        f"| learner: updates/s (batch {cfg.batch_size}, learner the bottleneck, "
        f"evaluation off as in the reference) | "
        f"{got['rate']:,.0f} | {ref['rate']:,.0f} (TrainStep loop) | {r:.2f} | "
        f">= 0.9 | {yes(r >= 0.9)} |"
    )
    cpu_rows.append(
        f"| learner: updates | {got['per_cpu']:,.0f} | {ref['per_cpu']:,.0f} | "
        f"{got['per_cpu'] / ref['per_cpu']:.2f} |"
    )
    notes.append(
        f"learner: steady window {got['window_s']:.1f} s; busy fraction (time in "
        f"train steps) {got['busy']:.2f}, idle fraction (napping: a turn found "
        f"no batch and no message) {got['idle']:.2f}; the learner process used "
        f"{got['cpu_share']:.0%} of a core (reference {ref['cpu_share']:.0%}); "
        f"reference {ref['before']:,.0f}/s before, {ref['after']:,.0f}/s after the run"
        + (per_round + f"; busy fraction per round {busy}" if per_round else "")
    )
    ev = res["learner_eval"]
    notes.append(
        f"learner with greedy evaluation on (--eval-every {cfg.eval_every}, "
        f"{cfg.eval_episodes} episodes, --evaluator {cfg.evaluator}; not in the "
        f"ratio above): {ev['rate']:,.0f} updates/s ({ev['rate'] / got['rate']:.2f}x "
        f"the run without); {ev['evals']} evaluations in the steady window, "
        f"{ev['eval_ms']:.0f} ms each on average, together {ev['eval_share']:.1%} "
        f"of the window's wall time"
    )


def whole_rows(res: dict, cfg, rows: list, cpu_rows: list, notes: list) -> None:
    """The pipeline runs' updates/s and env steps/s against ``python -m mpirl.reference``."""
    ref = res["reference"]
    for what, kind, key, ref_key in (
        ("updates", "learner", "rate", "rate"),
        ("env steps", "actor", "rate", "env_rate"),
    ):
        got = median_round(res[kind])[0] if kind in res else None
        mine = "-" if got is None else f"{got[key]:,.0f} ({kind} run)"
        ratio = "-" if got is None else f"{got[key] / ref[ref_key]:.2f}"
        rows.append(
            f"| whole loop: {what}/s, `python -m mpirl.reference` with the runs' flags "
            f"(one process, one core) | {mine} | {ref[ref_key]:,.0f} | {ratio} | - | - |"
        )
        per_cpu = "per_cpu" if ref_key == "rate" else "env_per_cpu"
        got_cpu = "-" if got is None else f"{got['per_cpu']:,.0f}"
        ratio_cpu = "-" if got is None else f"{got['per_cpu'] / ref[per_cpu]:.2f}"
        cpu_rows.append(f"| whole loop: {what} | {got_cpu} | {ref[per_cpu]:,.0f} | {ratio_cpu} |")
    notes.append(
        f"whole loop: `python -m mpirl.reference` acts and learns on one core ({cfg.envs_per_actor}"
        " envs, one update per env turn at --replay-ratio 0, evaluation off), so its updates/s"
        " and env steps/s share that core; the pipeline's learner and actor each had a core of"
        " their own: the ratios say what the distribution gives on this machine, not an"
        f" overhead. Steady window {ref['window_s']:.1f} s; it used {ref['cpu_share']:.0%} of a"
        " core"
    )


def transport_rows(res: dict, rows: list, notes: list) -> None:
    got, ref, size = res["transport"]
    r = got["rate"] / ref["rate"]
    rows.append(
        f"| transport: actor -> buffer MB/s ({size:,}-byte EXPERIENCE messages) | "
        f"{got['rate'] / 1e6:,.1f} | {ref['rate'] / 1e6:,.1f} (raw Isend/Recv) | "
        f"{r:.3f} | >= 0.8 | {yes(r >= 0.8)} |"
    )
    nonap, cred = res["transport_nonap"], res["transport_credits"]
    notes.append(
        f"transport: {got['msgs_per_s']:,.0f} messages/s against "
        f"{ref['msgs_per_s']:,.0f} raw; the sender waited for tokens "
        f"{got['token_wait_s'] / got['s']:.0%} of the time.  The same path with "
        f"the idle naps off (Backoff(0, 0): idle turns only yield): "
        f"{nonap['rate'] / 1e6:,.1f} MB/s, {nonap['rate'] / ref['rate']:.2f}x raw, "
        f"{nonap['msgs_per_s']:,.0f} messages/s.  With {RAW_WINDOW} tokens (the raw "
        f"stream's window; `--actor-credits {RAW_WINDOW}`) and the naps on: "
        f"{cred['rate'] / 1e6:,.1f} MB/s, {cred['rate'] / ref['rate']:.2f}x raw"
    )


def startup_rows(s: dict, rows: list, notes: list) -> None:
    r = s["rate"] / s["ref"]
    rows.append(
        f"| start-up: s from launch until every actor has stepped, `mpirun -n 9` | "
        f"{s['rate']:.1f} s | {s['ref']:.1f} s (every rank past `import torch, "
        f"gymnasium`, `MPI_Init` and a barrier) | "
        f"{r:.2f}x | <= 1.5x | {yes(r <= 1.5)} |"
    )
    notes.append(
        f"start-up: the first actor's first step at {s['first_actor']:.1f} s; the "
        f"whole 1-s run took {s['total']:.1f} s; the reference's first rank was "
        f"ready at {s['ref_first']:.1f} s, its whole launch with teardown took "
        f"{s['ref_total']:.1f} s"
    )


def report(res: dict, a: argparse.Namespace, loads: tuple) -> str:
    """The markdown tables and notes."""
    cfg = default_cfg()
    ca, cb = cores()
    rows = [
        "| component | mpirl | reference | ratio | target | met? |",
        "|---|---|---|---|---|---|",
    ]
    cpu_rows = [
        "| component | mpirl per CPU second | reference per CPU second | ratio |",
        "|---|---|---|---|",
    ]
    notes: list = []
    if "actor" in res:
        actor_rows(res, cfg, rows, cpu_rows, notes)
    if "learner" in res:
        learner_rows(res, cfg, rows, cpu_rows, notes)
    if "reference" in res:
        whole_rows(res, cfg, rows, cpu_rows, notes)
    if "transport" in res:
        transport_rows(res, rows, notes)
    if "startup" in res:
        startup_rows(res["startup"], rows, notes)
    pinned = (
        (
            f"actor, learner: the measured rank and the reference (also the whole loop's) on "
            f"core {ca}, the other ranks and the reference's ballast on core {cb}; transport: "
            f"ranks on cores {ca} "
            f"and {cb}"
        )
        if ca is not None
        else "no pinning (fewer than 2 cores)"
    )
    notes.append(
        f"{pinned}; load average {loads[0][0]:.2f} at start, {loads[1][0]:.2f} at the "
        f"end; --seconds {a.seconds:g}"
    )
    text = "\n".join(rows)
    if len(cpu_rows) > 2:
        text += "\n\n" + "\n".join(cpu_rows)
    return text + "\n\n" + "\n".join(f"* {n}" for n in notes)


def main() -> None:
    a = parse_args()
    keep = Path(a.keep) if a.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    res = measure(a, keep)
    text = report(res, a, (load0, os.getloadavg()))
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    modes = {
        "_rank": rank_mode,
        "_ref_actor": ref_actor_mode,
        "_ref_learner": ref_learner_mode,
        "_ref_whole": ref_whole_mode,
        "_transport": transport_mode,
    }
    if len(sys.argv) > 1 and sys.argv[1] in modes:
        sys.path.insert(0, str(ROOT))
        sys.exit(modes[sys.argv[1]](sys.argv[2:]) or 0)
    main()
