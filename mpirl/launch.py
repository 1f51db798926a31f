"""Run an MPI launcher so that SIGTERM, SIGINT and SIGHUP end in a clean stop and a checkpoint.

    python -m mpirl.launch mpirun -n 9 python -m mpirl.main [flags]

Why: Open MPI's mpirun (PRRTE, the 5.0.x wheel) answers SIGTERM, SIGINT and SIGHUP by killing
the job: SIGCONT to every rank, SIGTERM 0.25 s later, then SIGKILL (measured). No MCA parameter
sets that delay, and those three are always handled so (``prte_info``: see
``ess_base_forward_signals``); SIGUSR1 it forwards to every rank and waits. SLURM's scancel and
preemption signal every process of the job, mpirun included, so a job script that forwards
another signal is not enough.

Protocol:

1. The launcher starts with SIGTERM, SIGINT and SIGHUP blocked. A signal mask survives exec, and
   neither Open MPI's nor MPICH's mpirun unblocks them (measured), so a stop signal sent to the
   launcher stays pending there and does nothing.
2. This process takes those signals (and SIGUSR1) itself: from a job script, the sweep, Ctrl-C
   (the terminal signals the whole foreground group, the launcher included). Every ``POLL_S`` it
   also reads the launcher's pending signals (Linux: ``/proc/PID/status``) to catch one sent to
   the launcher itself (``kill <mpirun pid>``, scancel).
3. Either way it sends SIGUSR1 to the launcher, which Hydra, Open MPI's mpirun and srun forward
   to every rank; ``mpirl.run.failure.StopSignal`` makes it the clean stop, unblocks the signals
   (Hydra passes the mask on), and takes the burst a scancel causes (TERM from SLURM, USR1 from
   here) as one request.
4. A launcher forwards a signal only to the ranks it has started: one sent in the first second
   of a launch was lost (a sweep's stop; the run went to its end). So before it signals, the
   relay writes the request to a file named in the ranks' environment (``MPIRL_STOP_FILE``), and
   a rank reads it once its handler is in place (``mpirl.run.failure``); a rank that is still
   importing takes the signal in an early handler instead of dying of it. The file is seen by
   the ranks on the relay's own host (every rank of a one-node job; a rank elsewhere is started
   long before anyone stops it, or gets the signal).

The exit status is the launcher's (128 + N when it died of signal N).

Finding the launcher (`mpirun_cmd`, used by the tests and the benches): the venv's ``mpirun``
(the ``mpich`` wheel puts it beside this Python), else the one on PATH. Open MPI refuses more
ranks than cores unless told ``--oversubscribe``, so `mpirun_cmd` adds it there; a clean stop of
a bare Open MPI mpirun is asked for with SIGUSR1 (`stop_signal`), of MPICH's Hydra with SIGTERM.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from mpirl.run.failure import REPEAT_S, STOP_FILE_ENV

#: the signals the launcher must not see (Open MPI's mpirun kills the job on each)
BLOCKED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: the signal the launcher gets instead; every launcher forwards it and the ranks stop on it
RELAYED = signal.SIGUSR1
POLL_S = 0.2


def mpirun_path() -> str:
    """The venv's ``mpirun``, else the one on PATH."""
    here = Path(sys.executable).parent / "mpirun"
    found = str(here) if here.exists() else shutil.which("mpirun")
    if not found:
        raise RuntimeError("mpirun not found: install mpirl into a venv (pip install -e .)")
    return found


@functools.cache
def launcher() -> str:
    """'openmpi' or 'mpich' (anything that is not Open MPI: Hydra, and its derivatives)."""
    out = subprocess.run([mpirun_path(), "--version"], capture_output=True, text=True, timeout=30)
    return "openmpi" if "Open MPI" in out.stdout + out.stderr else "mpich"


def mpirun_cmd(n: int) -> list[str]:
    """``mpirun [launcher flags] -n N``, ready for the program and its arguments."""
    flags = ["--oversubscribe"] if launcher() == "openmpi" else []
    return [mpirun_path(), *flags, "-n", str(n)]


def stop_signal() -> signal.Signals:
    """The signal that asks a bare ``mpirun`` for a clean stop (every rank checkpoints)."""
    return RELAYED if launcher() == "openmpi" else signal.SIGTERM


def spawn(cmd: list[str], **popen_kw: Any) -> subprocess.Popen:
    """``subprocess.Popen(cmd)`` with ``BLOCKED`` blocked in the child (and, meanwhile, here)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
    try:
        return subprocess.Popen(cmd, **popen_kw)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _status_mask(pid: int, *fields: str) -> set[int] | None:
    """The signal numbers in /proc/PID/status's ``fields`` masks, OR-ed; None off Linux."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    bits = 0
    for line in lines:
        if line.startswith(fields):
            bits |= int(line.split()[1], 16)
    return {n for n in range(1, 65) if bits >> (n - 1) & 1}


def pending(pid: int) -> set[int]:
    """The signals pending at process ``pid``: /proc's ShdPnd | SigPnd masks (empty off Linux)."""
    return _status_mask(pid, "ShdPnd:", "SigPnd:") or set()


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; none elsewhere), parents before children."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(0), [])
        out += kids
        todo += kids
    return out


def ready_for(pid: int, sig: int) -> frozenset[int] | None:
    """``pid`` and the processes below it, if every one handles or ignores ``sig`` (/proc's
    SigCgt, SigIgn); None while one would die of it (a rank still starting, a launcher that has
    not set its handler yet)."""
    procs = [pid, *descendants(pid)]
    for p in procs:
        taken = _status_mask(p, "SigCgt:", "SigIgn:")
        if taken is not None and sig not in taken:  # (None: gone, or not Linux)
            return None
    return frozenset(procs)


#: how long a stop waits for the launch to be ready for SIGUSR1 (its default action kills)
#: before it is sent anyway; the ranks take it within a second of their start
READY_WAIT_S = 10.0


class Relay:
    """A signal handler: a stop signal, here or pending at the launcher -> SIGUSR1 to the launcher.

    ``signal`` holds the first one (the sweep then starts no further run). Every signal here is
    relayed, so a second one, after ``mpirl.run.failure.REPEAT_S``, ends the job at once. The
    stop is written to ``stop_file`` first (the ranks not yet started read it there), and held
    until the launch is ready for SIGUSR1 (`ready_for`; ``READY_WAIT_S`` at most; `poll` sends
    it).
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.signal: int | None = None
        self._seen: set[int] = set()  # pending at the launcher: a bit stays set, so relay once
        self._relayed_at = -REPEAT_S
        self._dir: str | None = None  # holds each launch's stop file; removed at exit
        self.stop_file: Path | None = None  # this launch's (MPIRL_STOP_FILE in its environment)
        self._held: int | None = None  # a stop the launch is not ready for yet
        self._ready: frozenset[int] | None = None  # the launch's processes, when last ready
        self._started = 0.0

    def __call__(self, signum: int, _frame: FrameType | None = None) -> None:
        if self.signal is None:
            self.signal = signum
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        self._relayed_at = time.monotonic()
        if self.stop_file is not None and not self.stop_file.exists():
            # for the ranks the launcher has not started yet (see the module docstring); in
            # place (renamed, so never read half-written) before the signal goes
            part = self.stop_file.with_suffix(".part")
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, signal.Signals(signum).name.encode())
            os.close(fd)
            os.rename(part, self.stop_file)
        self._held = signum
        self._send_when_ready(proc)

    def _send_when_ready(self, proc: subprocess.Popen) -> None:
        """Send the held stop once every process of the launch on this host takes SIGUSR1, the
        same processes on two looks ``POLL_S`` apart (a launcher forks its ranks in a burst);
        at once on a launch that has run ``READY_WAIT_S``."""
        held = self._held  # (read once: the handler may send it meanwhile, then it is None)
        if held is None or proc.poll() is not None:
            return
        ready, last = ready_for(proc.pid, RELAYED), self._ready
        self._ready = ready
        if time.monotonic() - self._started > READY_WAIT_S or (ready is not None and ready == last):
            self._send(proc, held)

    def _send(self, proc: subprocess.Popen, signum: int) -> None:
        self._held = None
        # os.write: a handler must not print into a buffered stream it may have interrupted
        os.write(
            2,
            f"mpirl.launch: {signal.Signals(signum).name}: {RELAYED.name} to the "
            f"launcher (pid {proc.pid}) for a clean stop\n".encode(),
        )
        proc.send_signal(RELAYED)

    def start(self, cmd: list[str], **popen_kw: Any) -> subprocess.Popen:
        self._seen, self._held, self._ready = set(), None, None
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="mpirl-launch-")
            atexit.register(shutil.rmtree, self._dir, ignore_errors=True)
        if self.stop_file is not None:  # the last launch's (a sweep starts one after another)
            self.stop_file.unlink(missing_ok=True)
        self.stop_file = Path(self._dir) / f"stop-{time.monotonic_ns()}"
        given = popen_kw.pop("env", None)
        env = dict(os.environ if given is None else given)
        env[STOP_FILE_ENV] = str(self.stop_file)
        self._started = time.monotonic()
        self.proc = spawn(cmd, env=env, **popen_kw)
        if self.signal is not None:  # it came before the launcher existed
            self(self.signal)
        return self.proc

    def poll(self) -> None:
        """Send a held stop once the launcher takes it; relay a stop signal that was sent to
        the launcher itself (once per signal number)."""
        proc = self.proc
        if proc is None:
            return
        self._send_when_ready(proc)
        new = (pending(proc.pid) & set(BLOCKED)) - self._seen
        if new:
            self._seen |= new
            # the same request as one relayed just now (Ctrl-C and scancel signal us both)
            if time.monotonic() - self._relayed_at > REPEAT_S:
                self(min(new))

    def wait(self, timeout: float | None = None) -> int | None:
        """The launcher's return code, polling its pending signals; None after ``timeout``."""
        assert self.proc is not None, "start() comes first"
        waited = 0.0
        while timeout is None or waited < timeout:
            step = POLL_S if timeout is None else min(POLL_S, timeout - waited)
            try:
                return self.proc.wait(timeout=step)
            except subprocess.TimeoutExpired:
                waited += step
                self.poll()
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    relay = Relay()
    for s in (*BLOCKED, RELAYED):
        signal.signal(s, relay)
    try:
        relay.start(argv)
    except OSError as e:
        print(
            f"mpirl.launch: error: cannot start {argv[0]!r}: {e.strerror}; give the launcher "
            "and its arguments, e.g. mpirun -n 9 python -m mpirl.main",
            file=sys.stderr,
        )
        return 127
    rc = relay.wait()
    assert rc is not None  # no timeout
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
