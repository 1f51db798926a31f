"""Fail fast: one failing rank brings the whole job down promptly, with one clear message.

MPI's default is to hang: a rank that raises sits in MPI_Finalize while the others wait forever.
``install(world, who)`` sets ``sys.excepthook`` and ``threading.excepthook`` to print the error
(naming the rank and role) and call ``MPI.COMM_WORLD.Abort(1)``: measured, a 9-rank job ended
0.4 s after the raise.  ``Watchdog`` aborts if a clean shutdown takes too long.
``Fault`` is the test-only injection hook (``MPIRL_FAULT``) the fault tests use to check all this;
``forced_checks`` (``MPIRL_FAULT_CHECK``) makes a host check of mpirl.run.resources
fail on one rank.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpi4py import MPI

#: Pause between printing the error and aborting: MPI_Abort tears down Hydra's output forwarding,
#: and on a loaded machine the flushed line naming the rank can be lost without it (seen in a full
#: test run at load ~7.5 on 2 cores: only the line before it arrived).  Costs this much per abort.
FORWARD_GRACE_S = 0.25


def install(world: MPI.Comm, who: str) -> None:
    def hook(
        exc_type: type[BaseException], exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is KeyboardInterrupt:
            msg = f"mpirl: {who}: interrupted\n"
        else:
            msg = f"mpirl: {who} failed: {exc_type.__name__}: {exc}\n"
            if os.environ.get("MPIRL_TRACEBACK", "1") != "0":
                msg += "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write(msg)
        sys.stderr.flush()
        time.sleep(FORWARD_GRACE_S)
        world.Abort(1)

    sys.excepthook = hook
    threading.excepthook = lambda args: hook(args.exc_type, args.exc_value, args.exc_traceback)


class Watchdog:
    """Abort the job if ``disarm()`` is not called within ``seconds`` of ``arm()``."""

    def __init__(self, world: MPI.Comm, who: str) -> None:
        self.world, self.who = world, who
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float, what: str) -> None:
        self.disarm()

        def fire() -> None:
            sys.stderr.write(
                f"mpirl: {self.who}: {what} took longer than {seconds:g} s; aborting the job\n"
            )
            sys.stderr.flush()
            time.sleep(FORWARD_GRACE_S)
            self.world.Abort(2)

        self._timer = threading.Timer(seconds, fire)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


STOP_GRACE_S = 60.0  # a clean stop after SIGTERM/SIGINT, before the checkpoint's allowance

#: a stop signal this soon after the first is the same request: SLURM's scancel and preemption
#: signal every process of the job (the ranks, the launcher, mpirl.launch), and the launcher
#: relays the one it gets, so each rank sees a burst of two or three within milliseconds
REPEAT_S = 2.0

#: the signals that ask for a clean stop; a run's stop_reason is then one of their names
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

#: where a relay (mpirl.launch, the sweep) writes a stop before it signals one: a launcher
#: forwards a signal only to the ranks it has started, so a rank started after it reads it there
STOP_FILE_ENV = "MPIRL_STOP_FILE"

_early: tuple[str, float] | None = None  # a stop taken before StopSignal: (name, monotonic)


def catch_stop_early() -> None:
    """A rank's first lines: a relayed stop (SIGUSR1) that comes while the rank is still
    starting (imports, MPI, the env: seconds) is kept for `StopSignal` instead of killing the
    rank, SIGUSR1's default action. A second one after ``REPEAT_S`` ends the rank, as later."""
    signal.signal(signal.SIGUSR1, _take_early)


def _take_early(signum: int, _frame: FrameType | None) -> None:
    global _early
    now = time.monotonic()
    if _early is None:
        _early = (signal.Signals(signum).name, now)
    elif now - _early[1] > REPEAT_S:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def stop_asked_at_start() -> tuple[str, float] | None:
    """A stop asked for before `StopSignal` took the signals: one the early handler took, else
    the relay's file (``STOP_FILE_ENV``) for a signal sent before this rank was started."""
    if _early is not None:
        return _early
    path = os.environ.get(STOP_FILE_ENV)
    if not path:
        return None
    try:
        name = Path(path).read_text().strip()
    except OSError:  # none asked for (or the file is on the relay's host, not this one)
        return None
    return (name if name in {s.name for s in STOP_SIGNALS} else "SIGUSR1", time.monotonic())


class StopSignal:
    """SIGTERM/SIGINT/SIGUSR1 (SLURM preemption, Ctrl-C, job scripts) -> a clean, coordinated stop.

    The learner turns the first signal into its normal STOP protocol (every rank finishes its
    sends, closes its files, exits 0); other ranks ignore the first signal because the stop
    reaches them through the pipeline, and arm a watchdog in case it does not.  Signals within
    ``repeat_s`` of the first are the same request; a signal after that ends the job at once.

    The signals are unblocked first: ``mpirl.launch`` starts the launcher with them blocked (so
    that Open MPI's mpirun cannot act on them, see there), and Hydra passes that mask on to the
    ranks. At exit they are ignored, so that one still on its way cannot kill a finished rank.
    A stop asked for while the rank was starting (`stop_asked_at_start`) is taken as the first.
    """

    def __init__(
        self, world: MPI.Comm, who: str, grace_s: float = STOP_GRACE_S, repeat_s: float = REPEAT_S
    ) -> None:
        self.requested: str | None = None
        self._watchdog = Watchdog(world, who)
        self._grace, self._repeat = grace_s, repeat_s
        self._first_at = 0.0
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        if (asked := stop_asked_at_start()) is not None and self.requested is None:
            self.requested, self._first_at = asked
            self._watchdog.arm(self._grace, f"a clean stop after {asked[0]}")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        atexit.register(self._ignore)  # runs before mpi4py's MPI_Finalize (registered earlier)

    @staticmethod
    def _ignore() -> None:
        """At exit: a stop signal still on its way (relayed twice, or sent by SLURM and by the
        launcher) must not kill a rank that has finished; Python would reset the handler to the
        default action, which ends the process."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        now = time.monotonic()
        if self.requested is not None:
            if now - self._first_at <= self._repeat:
                return
            raise KeyboardInterrupt(f"second {name}")
        self.requested, self._first_at = name, now
        self._watchdog.arm(self._grace, f"a clean stop after {name}")


class Fault:
    """Test-only fault injection: ``MPIRL_FAULT="ROLE:RANK:SECONDS[:ACTION]"`` (several: comma).

    The rank with world rank RANK and role ROLE acts SECONDS after its role loop started (its
    first `check`; ROLE ``server``: GBA's server thread on the lead, rank 0):

    - ``raise`` (default): raises RuntimeError in its role loop (fail fast must abort the job);
    - ``kill``: SIGKILLs itself in its role loop (no Python cleanup, like an OOM kill);
    - ``checkpoint``: SIGKILLs itself while writing its next checkpoint part, after the temp
      files are written and before they are renamed (the previous checkpoint must stay usable);
    - ``wire``: (actor) its next experience message goes out with a wrong wire version.

    Role loops call `check` once per turn: one comparison when no fault is set.
    """

    ACTIONS = ("raise", "kill", "checkpoint", "wire")

    def __init__(self, role: str = "", rank: int = -1, spec: str | None = None) -> None:
        self.spec = spec if spec is not None else os.environ.get("MPIRL_FAULT", "")
        self.action: str | None = None
        self.delay = 0.0
        self.at: float | None = None  # set by the first check()
        for item in filter(None, (x.strip() for x in self.spec.split(","))):
            parts = item.split(":")
            try:
                r, k, s = parts[0], int(parts[1]), float(parts[2])
                act = parts[3] if len(parts) > 3 else "raise"
                if act not in self.ACTIONS or len(parts) > 4:
                    raise ValueError
            except (ValueError, IndexError):
                raise ValueError(
                    f"MPIRL_FAULT={self.spec!r}: each item must be "
                    "ROLE:RANK:SECONDS[:ACTION] with ACTION one of "
                    f"{', '.join(self.ACTIONS)}"
                ) from None
            if r == role and k == rank:
                self.action, self.delay = act, s

    def check(self, now: float | None = None) -> None:
        """Once per role-loop turn: start the clock, fire a due ``raise`` or ``kill``."""
        if self.action is None:
            return
        now = time.monotonic() if now is None else now
        if self.at is None:
            self.at = now + self.delay
        if now >= self.at and self.action in ("raise", "kill"):
            self._fire()

    def due(self, action: str) -> bool:
        """True once (then disarmed) when ``action`` is set and its time has come."""
        if self.action != action or self.at is None or time.monotonic() < self.at:
            return False
        self.action = None
        return True

    def in_checkpoint(self) -> None:
        """Between a checkpoint's temp files and their rename."""
        if self.due("checkpoint"):
            sys.stderr.write(
                f"mpirl: injected fault: SIGKILL while writing a checkpoint "
                f"(MPIRL_FAULT={self.spec!r})\n"
            )
            sys.stderr.flush()
            time.sleep(FORWARD_GRACE_S)  # so that the line reaches mpirun's output
            os.kill(os.getpid(), signal.SIGKILL)

    def _fire(self) -> None:
        action, self.action = self.action, None
        # a kill happens FORWARD_GRACE_S after its line, so that the line reaches mpirun's
        # output; the time printed is the time of the raise or of the kill itself
        at = time.time() + (FORWARD_GRACE_S if action == "kill" else 0.0)
        sys.stderr.write(
            f"mpirl: injected fault: {action} at unix {at:.3f} (MPIRL_FAULT={self.spec!r})\n"
        )
        sys.stderr.flush()
        if action == "kill":
            time.sleep(max(0.0, at - time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected fault (MPIRL_FAULT={self.spec!r})")


#: set by mpirl.main for this rank; inert unless MPIRL_FAULT names it
FAULT = Fault(spec="")


def forced_checks(rank: int, checks: tuple[str, ...], spec: str | None = None) -> frozenset[str]:
    """Test-only: ``MPIRL_FAULT_CHECK="RANK:CHECK"`` (several: comma) makes host check CHECK
    (one of ``checks``: mpirl.run.resources.CHECKS) fail on world rank RANK, as if that host lacked
    it.  Returns this rank's forced checks (empty without the variable); says so on stderr with
    the time, from which the fault test measures how soon the job ends."""
    spec = spec if spec is not None else os.environ.get("MPIRL_FAULT_CHECK", "")
    out = set()
    for item in filter(None, (x.strip() for x in spec.split(","))):
        r, _, check = item.partition(":")
        if not r.strip().isdigit() or check not in checks:
            raise ValueError(
                f"MPIRL_FAULT_CHECK={spec!r}: each item must be RANK:CHECK with "
                f"CHECK one of {', '.join(checks)}"
            )
        if int(r) == rank:
            out.add(check)
    if out:
        sys.stderr.write(
            f"mpirl: injected check failure: {', '.join(sorted(out))} on rank "
            f"{rank} at unix {time.time():.3f} (MPIRL_FAULT_CHECK={spec!r})\n"
        )
        sys.stderr.flush()
    return frozenset(out)


def install_fault(role: str, rank: int) -> Fault:
    global FAULT
    FAULT = Fault(role, rank)
    return FAULT
