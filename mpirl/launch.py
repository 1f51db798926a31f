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

The exit status is the launcher's (128 + N when it died of signal N).

Finding the launcher (`mpirun_cmd`, used by the tests and the benches): the venv's ``mpirun``
(the ``mpich`` wheel puts it beside this Python), else the one on PATH. Open MPI refuses more
ranks than cores unless told ``--oversubscribe``, so `mpirun_cmd` adds it there; a clean stop of
a bare Open MPI mpirun is asked for with SIGUSR1 (`stop_signal`), of MPICH's Hydra with SIGTERM.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from mpirl.run.failure import REPEAT_S

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


def pending(pid: int) -> set[int]:
    """The signals pending at process ``pid``: /proc's ShdPnd | SigPnd masks (empty off Linux)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return set()
    bits = 0
    for line in lines:
        if line.startswith(("ShdPnd:", "SigPnd:")):
            bits |= int(line.split()[1], 16)
    return {n for n in range(1, 65) if bits >> (n - 1) & 1}


class Relay:
    """A signal handler: a stop signal, here or pending at the launcher -> SIGUSR1 to the launcher.

    ``signal`` holds the first one (the sweep then starts no further run). Every signal here is
    relayed, so a second one, after ``mpirl.run.failure.REPEAT_S``, ends the job at once.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.signal: int | None = None
        self._seen: set[int] = set()  # pending at the launcher: a bit stays set, so relay once
        self._relayed_at = -REPEAT_S

    def __call__(self, signum: int, _frame: FrameType | None = None) -> None:
        if self.signal is None:
            self.signal = signum
        proc = self.proc
        if proc is not None and proc.poll() is None:
            self._relayed_at = time.monotonic()
            # os.write: a handler must not print into a buffered stream it may have interrupted
            os.write(
                2,
                f"mpirl.launch: {signal.Signals(signum).name}: {RELAYED.name} to the "
                f"launcher (pid {proc.pid}) for a clean stop\n".encode(),
            )
            proc.send_signal(RELAYED)

    def start(self, cmd: list[str], **popen_kw: Any) -> subprocess.Popen:
        self._seen = set()
        self.proc = spawn(cmd, **popen_kw)
        if self.signal is not None:  # it came before the launcher existed
            self(self.signal)
        return self.proc

    def poll(self) -> None:
        """Relay a stop signal that was sent to the launcher itself (once per signal number)."""
        if self.proc is None:
            return
        new = (pending(self.proc.pid) & set(BLOCKED)) - self._seen
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
