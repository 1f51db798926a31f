"""The learner group's parameter server as a thread of the lead's rank (``--learner-sync async``,
``gba``, and ``switch`` while in GBA): docs/design.md, "Where the server runs".

`ServerThread` runs the lead group's serving round (`mpirl.roles.group_lead.LeadGroup`: take the
other learners' replies, apply each assembled global batch, hand out orders) as they come,
whatever the lead's loop is doing.  Between the lead's turns the thread owns the master weights
and Adam state; the loop holds `ServerThread.lock` for the rest of its turn (`hold`) and lets go
while it computes its own batch on a copy of the networks (``compute``, `load_compute`) or naps
(`let_go`).  While updates are synchronous the thread sleeps on `serving` (an idle thread
polling beside an all-reduce step took the GIL the step needs).  An exception in the thread
stops it and is raised again in the lead's loop (`check`), which ends the job.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING

from mpirl.run.failure import Fault
from mpirl.transport.waiting import Backoff

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from mpirl.agent.train_step import TrainStep


class ServerThread:
    """The server thread and the lock the lead's loop shares with it."""

    def __init__(
        self,
        compute: TrainStep | None,
        serve_once: Callable[[float], bool],
        torch_threads: int,
        serving: bool,
    ) -> None:
        """``compute``: the lead's second train step of the same network (None: no thread, the
        group serves in the lead's loop); ``serve_once(now)``: one serving round, under the
        lock, True when it did something; ``serving``: updates are not synchronous now."""
        self.compute, self.serve_once, self.torch_threads = compute, serve_once, torch_threads
        #: the version of the master weights the compute copy holds (-1: to be loaded)
        self.compute_version = -1
        #: guards everything the thread and the lead's loop share: the group, the master weights
        #: and Adam state, the batch source, the /group rows.  The lead's loop holds it except
        #: while it computes its own batch or naps (`let_go`)
        self.lock = threading.Lock()
        self.holder: int | None = None  # the thread id of the lead's loop while it holds it
        self.thread: threading.Thread | None = None
        self.halting = threading.Event()
        #: set while updates are not synchronous: the thread sleeps on it otherwise
        self.serving = threading.Event()
        if serving:
            self.serving.set()
        self.error: BaseException | None = None  # what ended the thread
        self.rounds = 0  # the thread's serving rounds (under the lock)

    @property
    def running(self) -> bool:
        return self.thread is not None

    def start(self) -> None:
        """Start the thread (with a compute copy only)."""
        if self.compute is not None:
            self.thread = threading.Thread(target=self._run, name="gba-server", daemon=True)
            self.thread.start()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """The lead's loop holds the shared state (`lock`) for the length of the block."""
        self.lock.acquire()
        self.holder = threading.get_ident()
        try:
            yield
        finally:
            self.holder = None
            self.lock.release()

    @contextlib.contextmanager
    def let_go(self) -> Iterator[None]:
        """Inside `hold`: the thread may run for the length of the block (the lead's own
        compute, its naps); elsewhere (a bench that calls the loop's turn alone) nothing."""
        mine = self.holder == threading.get_ident()
        if mine:
            self.holder = None
            self.lock.release()
        try:
            yield
        finally:
            if mine:
                self.lock.acquire()
                self.holder = threading.get_ident()

    def _run(self) -> None:
        """Serving rounds until `halt`; an exception ends the thread and `check` raises it."""
        import torch

        torch.set_num_threads(self.torch_threads)  # a thread's own intra-op setting
        # idle naps up to 2 ms as the loop's: a shorter ceiling (0.5 ms) woke the thread for
        # the GIL often enough that the lead's own compute took 10-20% more CPU than the other
        # learner's (the switch rule's margin to come back is 1.2); after work it naps 50 us
        backoff = Backoff()
        fault = Fault("server", 0)  # MPIRL_FAULT=server:0:SECONDS (the lead is world rank 0)
        try:
            while not self.halting.is_set():
                fault.check()
                if not self.serving.is_set():
                    self.serving.wait(0.05)  # all-reduce: nothing to serve (`halt` wakes it)
                    continue
                with self.lock:
                    did = self.serve_once(time.monotonic())
                    self.rounds += 1
                backoff.work() if did else backoff.idle()
        except BaseException as e:  # noqa: BLE001 - raised again in the lead's loop
            self.error = e

    def check(self) -> None:
        """An exception ended the thread: raise it in the lead's loop, which ends the job
        (`mpirl.run.failure`)."""
        if self.error is not None:
            raise RuntimeError(
                f"learner: the GBA server thread failed: {type(self.error).__name__}: {self.error}"
            ) from self.error

    def halt(self) -> None:
        """Stop the thread and join it (the lead's loop, holding `lock`, lets go while it
        joins); from here on the group serves in the loop.  Raises what ended the thread."""
        if self.thread is not None:
            self.halting.set()
            self.serving.set()
            with self.let_go():
                self.thread.join()
            self.thread = None
        self.check()

    def load_compute(self, master: TrainStep) -> int:
        """The master weights into the compute copy when it holds an older version; returns
        the version the lead's batch is computed on."""
        step = master.updates
        c = self.compute
        if c is not None and self.thread is not None and self.compute_version != step:
            with c.torch.no_grad():
                for dst, src in zip(
                    [*c.online.parameters(), *c.target.parameters()],
                    [*master.online.parameters(), *master.target.parameters()],
                    strict=True,
                ):
                    dst.copy_(src)
            self.compute_version = step
        return step
