"""Greedy evaluation off the learner's update loop (``--evaluator {process,thread,inline}``).

The learner hands a snapshot of its weights (the flat WEIGHTS vector) to an evaluation runner and
keeps training; it polls for the result once per loop turn and handles it in one place
(``Learner.evaluated``).  At most one evaluation is in flight: one that is due while
another runs waits for it.  Episode ``i`` of evaluation round ``k`` resets with seed
``mpirl.seeds.evaluation(seed, episodes, k)[i]`` (mpirl.agent.envs.Evaluator), whichever runner
plays it.

* ``process`` (default): a child process (``python -m mpirl.roles.evaluation``) with its own envs
  and network; weights in and returns out over its stdin/stdout pipes as raw bytes (fixed int64
  headers, float32 weights, float64 returns: no pickle).  It runs in parallel with the learner,
  on whatever core is free.  A writer thread feeds the pipe: the weights (530 KB MinAtar, 6.75
  MB Atari) exceed the pipe's 64 KB, and the child reads only once it has imported its modules
  and built its envs, so a write from the loop would hold the learner until then.  The child
  gets the learner's environment less the MPI launcher's (`child_environ`).
* ``thread``: a thread of the learner.  torch releases the GIL inside its kernels, but
  gymnasium's CartPole and the numpy forward are Python that holds it, so the learner's Python
  (the loop, torch's dispatch) waits for the GIL while the thread plays.
* ``inline``: in the update loop, which waits for it (the baseline the other two are measured
  against).

docs/design.md ("Evaluation off the update loop") has the measurement behind the default.

With ``--reference-set`` every runner also computes the reference loss of the weights it played
(`mpirl.refloss.reference_loss` over the whole set, unweighted), with those weights as
their own target network.  The learner's target at that time is not used: it would need a
second weight vector per request, and the value would then depend on where in the target-sync
cycle (``--target-update``) the evaluation fell, a phase unrelated to the placement being
compared.  It is computed in numpy on the runner's own network (`mpirl.refloss.
reference_loss_self`): a vector run's evaluation process stays free of torch (whose import
would delay its first evaluations by seconds).  The process runner appends the two numbers
(loss, mean |td|) to its result as float64, so the reference loss never costs the learner's loop
a forward pass.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, NamedTuple

import numpy as np

from mpirl import refloss
from mpirl.agent import envs
from mpirl.agent.qnet import make_q
from mpirl.run.failure import STOP_SIGNALS

if TYPE_CHECKING:
    from mpirl.agent.envs import EnvSpec, Evaluator
    from mpirl.agent.qnet import NumpyQ, TorchActorQ
    from mpirl.run.config import Config

_REQ = 2  # int64 header of a request: round, n_params
_RES = 3  # int64 header of a result: round, n_episodes, eval time in ns
_REF = 3  # float64 after the returns: reference loss, mean |td|, mean Q^2 (NaN: no set)


class EvalResult(NamedTuple):
    round: int  # evaluation round (seeds its episodes)
    update: int  # learner updates when the weights were taken
    env_steps: int  # env steps of all actors then
    returns: np.ndarray  # undiscounted return of each episode (float64)
    eval_s: float  # seconds the evaluation itself ran
    params: np.ndarray  # the flat weights evaluated
    reference_loss: float = float("nan")  # on the --reference-set (NaN: none)
    reference_td: float = float("nan")  # mean |td| on it
    reference_q_sq: float = float("nan")  # mean Q(s, a)^2 on it (the Q scale)


def settings(cfg: Config, spec: EnvSpec, refset: tuple[str, str] | None = None) -> dict:
    """What an evaluation runner needs to build its envs and network (JSON-able); ``refset``:
    (path, sha256) of the reference set (mpirl.refloss), or None."""
    return {
        "reference": None
        if refset is None
        else {"path": str(refset[0]), "sha256": refset[1], "huber_delta": cfg.huber_delta},
        "env": cfg.env,
        "episodes": cfg.eval_episodes,
        "seed": cfg.seed,
        "max_steps": cfg.eval_max_steps,
        "hidden": list(cfg.hidden),
        "dueling": cfg.dueling,
        "kwargs": cfg.env_kwargs,
        "wrappers": cfg.wrapper_specs(),
    }


class _Reference:
    """The reference loss of evaluated weights: `mpirl.refloss.reference_loss_self`
    on the evaluator's own network, just loaded with the weights it played (online = target =
    those weights), so the value depends on them only, not on where the learner's target-sync
    cycle was; numpy, so a vector run's evaluation process still never imports torch."""

    def __init__(self, r: dict) -> None:
        self.refset = refloss.load(r["path"], sha256=r["sha256"])
        self.delta = r["huber_delta"]

    def __call__(self, q: NumpyQ | TorchActorQ) -> tuple[float, float, float]:
        out = refloss.reference_loss_self(q, self.refset, huber_delta=self.delta)
        return out["loss"], out["td_abs_mean"], out["q_sq_mean"]


def _play(
    evaluator: Evaluator,
    q: NumpyQ | TorchActorQ,
    flat: np.ndarray,
    rnd: int,
    ref: _Reference | None = None,
) -> tuple:
    """(returns, seconds, reference loss, reference mean |td|, reference mean Q^2) of one
    evaluation round."""
    t0 = time.monotonic()
    q.load(flat)
    evaluator.round = rnd
    returns = evaluator.run(q)
    rl, rt, rq = ref(q) if ref is not None else (float("nan"),) * _REF
    return returns, time.monotonic() - t0, rl, rt, rq


def _build(
    s: dict, threads: int | None
) -> tuple[Evaluator, NumpyQ | TorchActorQ, _Reference | None]:
    spec = envs.inspect(s["env"], s["kwargs"], s["wrappers"])
    evaluator = envs.Evaluator(
        s["env"],
        s["episodes"],
        seed=s["seed"],
        max_steps=s["max_steps"],
        kwargs=s["kwargs"],
        wrappers=s["wrappers"],
    )
    ref = None if s.get("reference") is None else _Reference(s["reference"])
    return evaluator, make_q(spec, tuple(s["hidden"]), s["dueling"], threads=threads), ref


class _Runner:
    """Common part: one evaluation in flight, its request kept for the result."""

    def __init__(self) -> None:
        self._pending: tuple[int, int, int, np.ndarray] | None = None  # (round, update,
        # env_steps, params)

    @property
    def busy(self) -> bool:
        return self._pending is not None

    def request(self, params: np.ndarray, rnd: int, update: int, env_steps: int) -> None:
        if self._pending is not None:
            raise RuntimeError("evaluation requested while one is in flight")
        # Its own copy: the writer thread and best.pt read it later, and the caller's weight
        # buffer may be refilled by the next broadcast meanwhile (a few ms for Atari's 6.7 MB).
        params = np.array(params, copy=True)
        self._pending = (rnd, update, env_steps, params)
        self._start(params, rnd)

    def _start(self, params: np.ndarray, rnd: int) -> None:
        """Start evaluating ``params`` (each runner's own way)."""
        raise NotImplementedError

    def _finish(
        self,
        returns: np.ndarray,
        eval_s: float,
        ref_loss: float = float("nan"),
        ref_td: float = float("nan"),
        ref_q_sq: float = float("nan"),
    ) -> EvalResult:
        assert self._pending is not None  # a result answers the request in flight
        rnd, update, steps, params = self._pending
        self._pending = None
        return EvalResult(rnd, update, steps, returns, eval_s, params, ref_loss, ref_td, ref_q_sq)


class InlineRunner(_Runner):
    def __init__(self, s: dict) -> None:
        super().__init__()
        self.evaluator, self.q, self.ref = _build(s, threads=None)
        self._done: tuple | None = None

    def _start(self, params: np.ndarray, rnd: int) -> None:
        self._done = _play(self.evaluator, self.q, params, rnd, self.ref)

    def poll(self) -> EvalResult | None:
        if self._done is None:
            return None
        done, self._done = self._done, None
        return self._finish(*done)

    def close(self) -> None:
        self.evaluator.close()


class ThreadRunner(_Runner):
    def __init__(self, s: dict) -> None:
        super().__init__()
        self.evaluator, self.q, self.ref = _build(s, threads=None)
        self._thread: threading.Thread | None = None
        self._done: tuple | None = None

    def _start(self, params: np.ndarray, rnd: int) -> None:
        def work() -> None:
            self._done = _play(self.evaluator, self.q, params, rnd, self.ref)

        self._thread = threading.Thread(target=work, name="mpirl-eval", daemon=True)
        self._thread.start()

    def poll(self) -> EvalResult | None:
        if self._thread is None or self._thread.is_alive():
            return None
        self._thread.join()
        self._thread = None
        if self._done is None:  # the thread raised (threading.excepthook reports it)
            raise RuntimeError("the evaluation thread failed")
        done, self._done = self._done, None
        return self._finish(*done)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()
        self.evaluator.close()


LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "PRTE_", "HYDRA_", "MPIR_")
LAUNCHER_NAMES = ("MPI_LOCALNRANKS", "MPI_LOCALRANKID")


def child_environ(environ: dict | None = None) -> dict[str, str]:
    """``environ`` (default os.environ) less what an MPI launcher sets for its ranks: Hydra's and
    SLURM's ``PMI_*`` (PMI_RANK, PMI_FD: a descriptor the child does not have), Open MPI's
    ``OMPI_*``, ``PMIX_*``, ``PRTE_*``, MPICH's ``HYDRA_*``, ``MPIR_*`` and ``MPI_LOCAL*``.  With
    them, a user's env module that imports mpi4py would try to join the job as the learner's
    rank; without them it starts a one-process MPI of its own."""
    env = os.environ if environ is None else environ
    return {
        k: v
        for k, v in env.items()
        if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_NAMES
    }


def _write_all(f: IO[bytes], data: np.ndarray) -> None:
    view = data.data.cast("B")
    while view:
        view = view[f.write(view) :]


class ProcessRunner(_Runner):
    """The evaluation in a child process; see the module docstring for the protocol.

    `_start` puts the request in a one-request slot (at most one evaluation is in flight) and
    returns; the writer thread writes it to the child's stdin, waiting for the child to read."""

    def __init__(self, s: dict) -> None:
        super().__init__()
        # the child starts with the stop signals blocked, until it ignores them: one that comes
        # while it imports (launchers signal each rank's process group) would kill it
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mpirl.roles.evaluation", json.dumps(s), str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
                env=child_environ(),
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        assert self.proc.stdout is not None  # a PIPE
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._buf = bytearray()
        self._slot: tuple | None = None  # (round, params) not yet written
        self._closing = False
        self._wake = threading.Condition()
        self._writer = threading.Thread(
            target=self._write_requests, name="mpirl-eval-writer", daemon=True
        )
        self._writer.start()

    def _start(self, params: np.ndarray, rnd: int) -> None:
        with self._wake:
            self._slot = (rnd, params)
            self._wake.notify()

    def _write_requests(self) -> None:
        """The writer thread: each request (int64 round, n; float32 weights) to stdin, until
        close; a child that died ends it (poll reports the exit)."""
        while True:
            with self._wake:
                while self._slot is None and not self._closing:
                    self._wake.wait()
                if self._slot is None:
                    return
                (rnd, params), self._slot = self._slot, None
            flat = np.ascontiguousarray(params, np.float32)
            assert self.proc.stdin is not None  # a PIPE
            try:
                _write_all(self.proc.stdin, np.array([rnd, flat.size], np.int64))
                _write_all(self.proc.stdin, flat)
            except (OSError, ValueError):  # broken pipe: the child is gone
                return

    def poll(self) -> EvalResult | None:
        if self._pending is None:
            return None
        assert self.proc.stdout is not None  # a PIPE
        try:
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
        except BlockingIOError:
            return None
        if not chunk:
            code = self.proc.wait()
            raise RuntimeError(f"the evaluation process exited (code {code}); its error is above")
        self._buf += chunk
        if len(self._buf) < 8 * _RES:
            return None
        rnd, n, ns = np.frombuffer(bytes(self._buf[: 8 * _RES]), np.int64)
        end = 8 * _RES + 8 * (int(n) + _REF)
        if len(self._buf) < end:
            return None
        tail = np.frombuffer(bytes(self._buf[8 * _RES : end]), np.float64)
        returns, ref = tail[: int(n)].copy(), tail[int(n) :]
        del self._buf[:end]
        if rnd != self._pending[0]:
            raise RuntimeError(
                f"evaluation process answered round {rnd}, expected {self._pending[0]}"
            )
        return self._finish(returns, ns / 1e9, *(float(x) for x in ref))

    def close(self, timeout: float = 30.0) -> None:
        """A request not yet written is dropped; one being written is finished, then EOF on
        stdin ends the child; killed if that takes over ``timeout`` s in all."""
        end = time.monotonic() + timeout
        with self._wake:
            self._closing, self._slot = True, None
            self._wake.notify()
        self._writer.join(timeout=timeout)
        try:
            if self._writer.is_alive():  # a child that does not read
                raise subprocess.TimeoutExpired(self.proc.args, timeout)
            assert self.proc.stdin is not None  # a PIPE
            self.proc.stdin.close()
            self.proc.wait(timeout=max(0.0, end - time.monotonic()))
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


RUNNERS: dict[str, type[InlineRunner] | type[ThreadRunner] | type[ProcessRunner]] = {
    "process": ProcessRunner,
    "thread": ThreadRunner,
    "inline": InlineRunner,
}


def make_runner(
    kind: str, cfg: Config, spec: EnvSpec, refset: tuple[str, str] | None = None
) -> InlineRunner | ThreadRunner | ProcessRunner:
    return RUNNERS[kind](settings(cfg, spec, refset))


def _read(f: IO[bytes], n: int) -> bytes | None:
    out = bytearray()
    while len(out) < n:
        got = f.read(n - len(out))
        if not got:
            return None
        out += got
    return bytes(out)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the learner dies (MPI_Abort kills the learner; a long
    Atari evaluation would otherwise play on, holding the job's output pipes open)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def child(argv: list[str], parent: int) -> int:
    """The evaluation process: read requests from stdin until EOF, answer each on stdout.

    The stop signals are ignored: Ctrl-C (the terminal's process group), SLURM's SIGTERM (every
    process of the step) and the SIGUSR1 Hydra forwards to each rank's process group reach the
    learner too, whose clean stop closes stdin."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)  # discards one pending since the start
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    _die_with_parent()
    if os.getppid() != parent:  # the learner died before prctl
        return 0
    fout = os.fdopen(os.dup(1), "wb")  # the protocol's; anything printed goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    s = json.loads(argv[0])
    evaluator, q, ref = _build(s, threads=1)
    fin = sys.stdin.buffer
    while True:
        head = _read(fin, 8 * _REQ)
        if head is None:
            break
        rnd, n = np.frombuffer(head, np.int64)
        raw = _read(fin, 4 * int(n))
        if raw is None:
            break
        returns, secs, *reference = _play(
            evaluator, q, np.frombuffer(raw, np.float32), int(rnd), ref
        )
        try:
            fout.write(
                np.array([rnd, returns.size, int(secs * 1e9)], np.int64).tobytes()
                + returns.astype(np.float64).tobytes()
                + np.array(reference, np.float64).tobytes()
            )
            fout.flush()
        except BrokenPipeError:  # the learner is gone
            break
    evaluator.close()
    return 0


if __name__ == "__main__":  # the learner's environment has one BLAS thread (mpirl.main)
    sys.exit(child(sys.argv[1:2], int(sys.argv[2])))
