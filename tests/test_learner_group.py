"""The learner group's pure parts and its allreduce under real mpirun."""

import json
import subprocess
import sys
import time

import pytest
from mpirun import mpirun_cmd

from mpirl.run.config import ConfigError, parse, parse_straggle
from mpirl.transport.topology import LayoutError, check_layout, layout


def _run_ranks(k, script, *args):
    """``mpirun -n K python tests/SCRIPT ARGS``: it must exit 0; returns (its last stdout
    line as JSON, its stderr)."""
    p = subprocess.run(
        [*mpirun_cmd(k), sys.executable, f"tests/{script}", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


@pytest.mark.mpi
@pytest.mark.parametrize(
    "args", [[], ["uneven"], ["uneven", "mpi"]], ids=["full", "uneven", "uneven-mpi"]
)
def test_allreduce_equals_one_learner_on_the_concatenated_batches(args):
    """3 learners (a mean hard-wired to 2 learners shows here, not with 2), 5 updates, through
    the node's shared memory (one node here) or, ``mpi``, MPI's persistent all-reduce (MPICH
    has it), which MPI_Finalize finds freed; either way every learner ends bitwise equal.
    Uneven: the last learner's batches are half size, so its gradient counts half (a plain
    mean of the three gradients would differ from the lone learner's)."""
    from mpirl.launch import launcher

    out, stderr = _run_ranks(3, "group_allreduce.py", "16", "5", *args)
    assert out["updates"] == 5
    assert out["moved"] > 1e-3  # the updates did something (clip and target copy included)
    assert out["param_diff"] < 1e-5 and out["target_diff"] < 1e-5, out
    assert out["same_on_every_learner"], out
    assert out["summed_w"] == (2.5 if "uneven" in args else 3.0)  # full batches weigh 1
    if "mpi" not in args:
        assert out["sum"] == "NodeSum", out
    elif launcher() == "mpich":
        assert out["sum"] == "Prequest", out
    assert "persistent request" not in stderr, stderr


@pytest.mark.mpi
def test_switch_without_a_straggler_makes_exactly_the_updates_of_allreduce(tmp_path):
    """The tuning-free claim by mechanism (docs/benchmarks.md, H5): the real learner group, K =
    2 (the lead's loop and learner 1, as mpirl.wiring builds them), fed the same batches in the
    same order by a scripted buffer, 120 updates with ``--learner-sync allreduce`` and with
    ``switch``.  Without a straggler switch never leaves all-reduce, and its updates are
    allreduce's to the bit: the same network and Adam state at the end, on both learners.  So
    its return per update is allreduce's; what differs between two real runs is the timing of
    their data, which differs as much between two runs of allreduce.  (tests/mutations.py: a
    switch that starts in GBA fails it.)"""
    out = {
        m: _run_ranks(2, "group_scripted.py", m, "120", str(tmp_path / m))[0]
        for m in ("allreduce", "switch")
    }
    # its first switch waits 2 s (SwitchRule.hold_s): the updates take ~0.3 s here, so even a
    # machine 5x slower in a moment cannot flap the group into GBA on its own timing
    assert out["switch"]["switches"] == 0, out
    assert out["allreduce"]["updates"] == out["switch"]["updates"] == 120, out
    for m in ("allreduce", "switch"):
        assert out[m]["crc_learner_1"] == out[m]["crc"], out  # one state on both learners
    assert out["switch"]["crc"] == out["allreduce"]["crc"], out


@pytest.mark.mpi
def test_the_node_sum_is_exact_with_learners_an_update_apart():
    """3 ranks, 300 sums through the node's shared memory at uneven paces (one rank often an
    update ahead, reusing its other slot): every sum exact on every rank; a Start before the
    last sum completed is refused."""
    out, _ = _run_ranks(3, "node_sum_run.py", "300")
    assert out == {
        "rounds": 300,
        "wrong": 0,
        "twice": "NodeSum.Start before the last sum completed",
    }, out


def test_learners_are_the_first_ranks():
    places = layout(9, 2, learners=3)
    assert [p.role for p in places[:3]] == ["learner"] * 3
    assert [p.index for p in places[:3]] == [0, 1, 2]
    assert places[3].role == "buffer" and places[3].site == 0
    assert sum(p.role == "actor" for p in places) == 4
    with pytest.raises(LayoutError, match="fewer learners"):
        check_layout(4, 1, learners=3)


def test_group_messages_round_trip():
    """ORDER, GRAD and SHARD are kinds of the run's wire: same magic, version and WireError."""
    import numpy as np

    from mpirl.transport.wire import Tag, Wire, WireError, kind_of, transition_dtype

    wire = Wire(transition_dtype((4,), np.float32), n_params=3)
    td = np.array([0.5, 1.5], np.float32)
    grad = np.array([1.0, 2.0, 3.0], np.float32)
    g = wire.unpack(wire.grad(7, 3, td, 0.5, 0.25, grad), Tag.GRAD)
    assert (g.id, g.version, g.n, g.loss, g.compute_s, g.has_grad) == (7, 3, 2, 0.5, 0.25, True)
    np.testing.assert_array_equal(g.td_abs, td)
    np.testing.assert_array_equal(g.grad(), grad)
    assert wire.unpack(wire.grad(8, 3, td, 0.5, 0.25), Tag.GRAD).grad() is None
    online, target = grad, grad * 2
    batch = np.arange(5, dtype=np.uint8)
    buf = wire.order(9, 64, 0.4, 0.5, (online, target), 11, batch)
    assert kind_of(buf) == Tag.ORDER
    o = wire.unpack(buf, Tag.ORDER)
    assert (o.id, o.n, o.beta, o.scale, o.version, o.relayed) == (9, 64, 0.4, 0.5, 11, True)
    w = o.weights(3)
    assert w is not None
    np.testing.assert_array_equal(w[1], target)
    np.testing.assert_array_equal(o.batch_buf(3), batch)
    bare = wire.unpack(wire.order(10, 64, 0.4), Tag.ORDER)
    assert bare.weights(3) is None and not bare.relayed and bare.version == -1
    s = wire.unpack(wire.shard(batch), Tag.SHARD)
    np.testing.assert_array_equal(s.forward_buf, batch)
    bad = wire.grad(7, 3, td, 0.5, 0.25, grad)
    bad[6:8] = np.frombuffer(np.uint16(99).tobytes(), np.uint8)
    with pytest.raises(WireError, match="wire version 99"):
        wire.unpack(bad, Tag.GRAD, "learner 1")


def test_flags_are_checked():
    cfg = parse(["--learners", "2", "--learner-sync", "allreduce", "--straggle", "1:20"])
    assert cfg.learners == 2 and cfg.learner_sync == "allreduce"
    assert parse_straggle(cfg.straggle) == (1, 20.0, 0.0, float("inf"))
    assert parse_straggle("1:20@5-10") == (1, 20.0, 5.0, 10.0)
    assert parse([]).learners == 1 and parse([]).learner_sync == "switch"
    for bad in ("2:20", "x", "1:-3", "1", "1:20@5", "1:20@9-3"):
        with pytest.raises(ConfigError, match="straggle="):
            parse(["--learners", "2", "--straggle", bad])
    with pytest.raises(ConfigError, match="learners=0"):
        parse(["--learners", "0"])
    with pytest.raises(LayoutError, match="needs >= 6 ranks"):
        parse(["--learners", "4"]).validate(5)


def test_placement_puts_every_learner_on_the_cloud_host():
    from mpirl import placement as pl

    alloc = pl.allocation_from_nodes("cloud1,node[01-02]", 4, None)
    p = pl.plan(10, 2, alloc, learners=2)
    assert p.lines[0] == ("cloud1", 2) and sum(n for _, n in p.lines) == 10
    hosts = p.hosts()
    assert pl.check_hosts(hosts, 2, learners=2) == []
    assert pl.check_hosts(["cloud1"] * 3 + hosts[3:], 2, learners=2)  # a buffer on the cloud
    assert "2 learners" in pl.render(p)


def test_straggle_sleeps_in_every_update_of_its_rank_only():
    import time

    from mpi4py import MPI

    from mpirl.transport.group import make_sync
    from mpirl.wiring import straggle_s

    class Trainer:
        steps = 0

        def apply_step(self):
            self.steps += 1

    cfg = parse(["--learners", "2", "--straggle", "0:30"])
    slow = make_sync(cfg.learner_sync, None, 0, None, straggle_s(cfg, 0))  # learner 0
    t, t0 = Trainer(), time.monotonic()
    for _ in range(3):
        slow.step(t, None, None)
    assert t.steps == 3 and time.monotonic() - t0 >= 0.09
    other = parse(["--learners", "2", "--straggle", "1:30"])
    sync = make_sync(other.learner_sync, MPI.COMM_SELF, 0, None, straggle_s(other, 0))
    assert sync.straggle_s == 0.0  # learner 0 does not straggle


@pytest.mark.mpi
def test_the_process_group_rendezvous_and_the_devices_every_learner_reports():
    """The torch.distributed rendezvous of CUDA learners (a TCPStore rank 0 keeps open: no
    free-port race), run with gloo on CPUs under mpirun; CPU learners never take NCCL."""
    p = subprocess.run(
        [*mpirun_cmd(3), sys.executable, "tests/group_rendezvous.py"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["sum"] == 6.0 and len(out["devices"]) == 3 and not out["nccl"]


def test_nccl_only_when_every_learner_has_a_gpu_of_its_own():
    from mpirl.transport.group import nccl_usable

    assert nccl_usable(["a/cuda:0", "a/cuda:1", "b/cuda:0"])
    assert not nccl_usable(["a/cuda:0", "a/cuda:0"])  # two learners on one GPU
    assert not nccl_usable(["a/cuda:0", "a/cpu"])  # CPU and CUDA mixed
    assert not nccl_usable(["a/cpu", "b/cpu"])


class _Clock:
    """A fake monotonic clock: each Test() costs 1 us, each sleep its nap."""

    def __init__(self) -> None:
        self.t = 0.0
        self.naps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.naps.append(s)
        self.t += s


class _Request:
    """Completes on its ``after``-th Test() (or once the clock passes ``at``)."""

    def __init__(self, clock: _Clock, after: int = 10**9, at: float = float("inf")) -> None:
        self.clock, self.after, self.at, self.tests = clock, after, at, 0

    def Test(self) -> bool:
        self.tests += 1
        self.clock.t += 1e-6
        return self.tests >= self.after or self.clock.t >= self.at


def test_allreduce_wait_spins_within_its_budget_then_naps_and_adapts():
    from mpirl.transport.waiting import SpinThenNap

    clock = _Clock()
    w = SpinThenNap(spin_cap=1e-3, burst=5e-5, clock=clock, sleep=clock.sleep)
    # a short wait (the partner arrives soon): Test in a loop, never a sleep
    assert w.wait(_Request(clock, after=40)) == pytest.approx(40e-6)
    assert clock.naps == [] and w.budget == 1e-3
    # a long wait (4 ms: a straggler, or a partner off its core): spin the budget, then nap
    t0 = clock.t
    waited = w.wait(_Request(clock, at=t0 + 4e-3))
    assert waited == pytest.approx(4e-3, abs=6e-4)  # within a nap and a burst of the end
    assert w.spun_s == pytest.approx(40e-6 + 1e-3, abs=2e-6)  # the spin stopped at the budget
    assert clock.naps[:6] == pytest.approx([2e-5, 4e-5, 8e-5, 1.6e-4, 3.2e-4, 5e-4])
    assert max(clock.naps) == 5e-4  # naps double up to the ceiling
    assert w.budget == 5e-4  # a wait longer than the cap halves the spin budget
    for _ in range(10):  # long waits again and again: the spin shrinks to its floor
        w.wait(_Request(clock, at=clock.t + 4e-3))
    assert w.budget == w.spin_floor
    clock.naps.clear()
    spun = w.spun_s
    w.wait(_Request(clock, at=clock.t + 4e-3))
    assert w.spun_s - spun == pytest.approx(w.spin_floor, abs=2e-6)  # a long wait costs ~no spin
    # short waits again (a quiet machine): they are past the small budget but within the cap,
    # so the spin comes back
    w.wait(_Request(clock, at=clock.t + 3e-4))
    assert w.budget == 2 * w.spin_floor
    for _ in range(8):
        w.wait(_Request(clock, at=clock.t + 3e-4))
    assert w.budget == 1e-3
    naps = len(clock.naps)
    w.wait(_Request(clock, at=clock.t + 3e-4))
    assert len(clock.naps) == naps  # within the budget again: no sleep


def test_allreduce_wait_polls_in_a_burst_after_each_nap():
    """After a nap the wait polls Test for ``burst`` seconds before the next nap, so a
    collective whose partner has arrived completes in that burst instead of a nap later."""
    from mpirl.transport.waiting import SpinThenNap

    clock = _Clock()
    w = SpinThenNap(spin_cap=1e-4, spin_floor=1e-4, burst=5e-5, clock=clock, sleep=clock.sleep)
    req = _Request(clock, at=1e-4 + 2e-5 + 3e-5)  # 30 us into the first burst
    w.wait(req)
    assert clock.naps == [2e-5]
    assert w.napped_s == pytest.approx(2e-5 + 3e-5, abs=2e-6)


def test_allreduce_sync_completes_its_request_with_the_adaptive_wait():
    from mpi4py import MPI

    from mpirl.transport.group import AllreduceSync, make_sync
    from mpirl.transport.waiting import SpinThenNap

    sync = AllreduceSync(MPI.COMM_SELF, 3)
    assert isinstance(getattr(sync.wait, "__self__", None), SpinThenNap)
    assert not isinstance(make_sync("allreduce", MPI.COMM_SELF, 3, None), AllreduceSync)


def _step_both(group, lone, spec, rng):
    """One update of both train steps on the same random CartPole batch of 16."""
    import numpy as np

    from mpirl.transport.wire import transition_dtype

    rec = np.zeros(16, transition_dtype(spec.obs_shape, np.float32))
    rec["obs"], rec["next_obs"] = rng.normal(size=(2, 16, 4))
    rec["action"], rec["reward"] = rng.integers(0, 2, 16), rng.normal(size=16)
    rec["discount"] = 0.99
    w = rng.uniform(0.2, 1.0, 16).astype(np.float32)
    group.step(rec, w)
    lone.step(rec, w)


@pytest.mark.mpi
def test_the_allreduce_trains_in_its_buffer_without_a_copy():
    """On a CPU learner every ``.grad`` is a view of the sync's buffer: backward writes there,
    the all-reduce sums there, and the step reads the mean there (before, the gradients were
    concatenated into a send buffer and the sum copied back, ~50 us of a 0.64 ms update).  One
    learner over COMM_SELF steps exactly as a lone learner does; a gradient replaced from
    outside (as `set_grads` on an unbound network) is bound again, with its values."""
    import numpy as np
    import torch
    from mpi4py import MPI

    from mpirl.agent.envs import inspect
    from mpirl.agent.grads import bind_grads
    from mpirl.agent.train_step import TrainStep
    from mpirl.run.config import Config
    from mpirl.transport.group import AllreduceSync

    cfg, spec = Config(hidden=(8,), grad_clip=0.5), inspect("CartPole-v1")
    torch.manual_seed(0)
    group = TrainStep(cfg, spec)
    lone = TrainStep(cfg, spec)
    lone.online.load_state_dict(group.online.state_dict())
    lone.target.load_state_dict(group.target.state_dict())
    sync = group.sync = AllreduceSync(MPI.COMM_SELF, sum(p.numel() for p in group.params))
    rng = np.random.default_rng(0)
    for _ in range(4):
        _step_both(group, lone, spec, rng)
        at = sync.buf.ctypes.data
        assert all(p.grad.data_ptr() - at in range(0, 4 * sync.buf.size) for p in group.params)
        for a, b in zip(group.params, lone.params, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)
        assert sync.buf[-1] == 16  # the count summed beside the gradient
    # replaced from outside: bound again, keeping the values
    p0 = group.params[0]
    p0.grad = torch.full_like(p0, 3.0)
    assert not bind_grads(group.params, sync.buf) and bind_grads(group.params, sync.buf)
    assert sync.buf[0] == 3.0 and p0.grad.data_ptr() == sync.buf.ctypes.data
    group.opt.zero_grad()  # zeroes the buffer and keeps the views
    assert not sync.buf[:-1].any() and p0.grad.data_ptr() == sync.buf.ctypes.data
    # one replaced after binding is dropped at zero_grad (not added onto by the next backward)
    p0.grad = torch.full_like(p0, 3.0)
    group.opt.zero_grad()
    assert p0.grad is None and group.params[1].grad is not None


@pytest.mark.mpi
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "iallreduce"])
def test_the_allreduce_weighs_a_short_batch_and_binds_a_replaced_gradient_again(persistent):
    """Told the learners' batch (32), a batch of 16 is sent weighted 1/2 and the step scales
    the sum by 1 / (summed weights) in its clip: one learner over COMM_SELF still steps as a
    lone learner does, through the persistent request or an Iallreduce.  A gradient dropped
    and made anew by backward (not a view of the buffer) is bound again before the sum: the
    binding is checked every step, not trusted once."""
    import numpy as np
    import torch
    from mpi4py import MPI

    from mpirl.agent.envs import inspect
    from mpirl.agent.train_step import TrainStep
    from mpirl.run.config import Config
    from mpirl.transport.group import AllreduceSync

    cfg, spec = Config(hidden=(8,), grad_clip=0.5), inspect("CartPole-v1")
    torch.manual_seed(1)
    group, lone = TrainStep(cfg, spec), TrainStep(cfg, spec)
    lone.online.load_state_dict(group.online.state_dict())
    lone.target.load_state_dict(group.target.state_dict())
    n_params = sum(p.numel() for p in group.params)
    sync = group.sync = AllreduceSync(MPI.COMM_SELF, n_params, batch=32)
    first = sync.request
    if not persistent:
        sync.request = None
    rng = np.random.default_rng(1)
    for i in range(5):
        if i == 3:  # replaced from outside, then dropped at zero_grad: backward makes a new one
            group.params[0].grad = torch.ones_like(group.params[0])
        _step_both(group, lone, spec, rng)
        assert sync.buf[-1] == 0.5  # 16 of 32
        at = sync.buf.ctypes.data
        assert all(p.grad.data_ptr() - at in range(0, 4 * sync.buf.size) for p in group.params)
        for a, b in zip(group.params, lone.params, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)
    assert (sync.request is first) if persistent else sync.request is None


class _End:
    """A lead's end toward another learner: what the lead posts, what the test delivers."""

    def __init__(self):
        self.posted, self.inbox = [], []

    def post(self, buf):
        self.posted.append(buf)

    def poll(self, now):
        pass

    def receive(self, now):
        out, self.inbox = self.inbox, []
        return out


def _lead(sync, compute=False):
    """A LeadGroup of K = 2 on a real train step, its other learner behind an `_End`
    (``compute``: with the lead's compute copy, so `start` runs the server thread)."""
    from mpirl.agent.envs import inspect
    from mpirl.agent.train_step import TrainStep
    from mpirl.roles.group_lead import LeadGroup
    from mpirl.run.config import Config
    from mpirl.transport.group import LocalSync, SubmitSync
    from mpirl.transport.inbox import Inbox
    from mpirl.transport.wire import ALLREDUCE, SUBMIT, Wire, transition_dtype

    cfg = Config(hidden=(8,), learners=2, learner_sync=sync)
    spec = inspect(cfg.env)
    trainer = TrainStep(cfg, spec)
    n_params = sum(p.numel() for p in trainer.params)
    wire = Wire(transition_dtype(spec.obs_shape, spec.obs_dtype), n_params=n_params)

    class Comm:
        def Get_size(self):
            return 2

        def Bcast(self, buf, root=0):  # the start's weights: the lead's own
            pass

    end = _End()
    lead = LeadGroup(
        cfg, Comm(), {1: end}, Inbox(wire, "lead", lambda r: f"learner {r}"), trainer,
        {ALLREDUCE: LocalSync(), SUBMIT: SubmitSync()}, wire, None, None,
        TrainStep(cfg, spec) if compute else None,
    )  # fmt: skip
    return lead, end, wire, trainer


def test_the_lead_does_not_wait_for_another_learners_checkpoint_part():
    """The lead asks for the other learner's part and returns at once; the checkpoint is
    written (its parts all in) only when the acknowledgement comes, however late, and an
    acknowledgement whose crc32 differs from the lead's state at the request (synchronous
    updates) fails the run, as does one for a checkpoint never asked."""
    from mpirl.transport.group import state_crc
    from mpirl.transport.wire import Tag, kind_of

    lead, end, wire, trainer = _lead("allreduce")
    t0 = time.monotonic()
    assert lead.checkpoint(3) == {"group_shards": {"1": 0}}
    assert time.monotonic() - t0 < 1.0 and [kind_of(b) for b in end.posted] == [Tag.CHECKPOINT]
    crc = state_crc(trainer)
    for _ in range(3):  # no acknowledgement yet: nothing waits, nothing times out
        lead._receive(lead.handlers, time.monotonic())
        assert not lead.written(3)
    end.inbox.append((Tag.CHECKPOINT, wire.checkpoint(3, crc)))
    lead._receive(lead.handlers, time.monotonic())
    assert lead.written(3)
    lead.checkpoint(4)
    end.inbox.append((Tag.CHECKPOINT, wire.checkpoint(4, crc ^ 1)))
    with pytest.raises(RuntimeError, match="diverged"):
        lead._receive(lead.handlers, time.monotonic())
    end.inbox.append((Tag.CHECKPOINT, wire.checkpoint(9, crc)))
    with pytest.raises(RuntimeError, match="unexpected CHECKPOINT 9"):
        lead._receive(lead.handlers, time.monotonic())


def test_a_manifest_waits_for_every_learners_part_in_order(tmp_path):
    """LearnerCheckpoint.commit writes a checkpoint's manifest only once the group says every
    other learner's part is written, oldest first; a checkpoint without its manifest is not
    one a resume can take."""
    from mpirl.roles.learner_parts import LearnerCheckpoint, Unfinished
    from mpirl.run import checkpoint as ck

    class Group:
        done: set = set()

        def written(self, cid):
            return cid in self.done

    c = ck.Checkpointer(tmp_path, "learner", info={"config": {}, "world_size": 2, "layout": []})
    parts = LearnerCheckpoint(c, None, ["learner"], None, None, None)
    for cid in (1, 2):
        c.write(cid, {"updates": cid})
        parts.pending.append(Unfinished(cid, "periodic", {"updates": cid}, 0.0, 0.0))
    group = Group()
    assert parts.commit(group) == [] and ck.ids(tmp_path)[0] == []
    with pytest.raises(ck.CheckpointError, match="no complete checkpoint"):
        ck.select(tmp_path)
    group.done = {2}  # acknowledgements come in order: 1 before 2
    assert parts.commit(group) == [] and ck.ids(tmp_path)[0] == []
    group.done = {1, 2}
    assert [u.id for u in parts.commit(group)] == [1, 2] and not parts.pending
    assert ck.select(tmp_path)[0]["id"] == 2


def _lead_group(sync, k=3):
    """A LeadGroup on fakes: a communicator of size ``k``, ends that keep what is posted."""
    from types import SimpleNamespace

    import numpy as np

    from mpirl.roles.group_lead import LeadGroup
    from mpirl.run.config import Config
    from mpirl.transport.wire import ALLREDUCE, SUBMIT, Wire, transition_dtype

    class End:
        def __init__(self):
            self.posted = []

        def post(self, buf):
            self.posted.append(buf)

    comm = SimpleNamespace(Get_size=lambda: k)
    net = SimpleNamespace(flat_params=lambda: np.arange(3, dtype=np.float32))
    trainer = SimpleNamespace(
        params=[SimpleNamespace(numel=lambda: 3)], sync=None, updates=0, online=net, target=net
    )
    wire = Wire(transition_dtype((4,), np.float32), n_params=3)
    ends = {j: End() for j in range(1, k)}
    syncs = {ALLREDUCE: object(), SUBMIT: object()}
    cfg = Config(learners=k, learner_sync=sync)
    return LeadGroup(cfg, comm, ends, None, trainer, syncs, wire, None, None), ends


def test_a_resumed_lead_keeps_the_shard_counts_of_its_checkpoint():
    """The lead gates the orders to each other learner on the transitions it sent to that
    learner's shard; its checkpoint part keeps the counts and a resume restores them (they
    restarted at 0, and a resumed lead held every all-reduce update until each shard had been
    sent its start again, though every learner had restored its shard)."""
    from types import SimpleNamespace

    import numpy as np

    lead, ends = _lead_group("allreduce")
    for n in (30, 40, 50, 60, 70, 80):  # round robin: 0 (the lead), 1, 2, 0, 1, 2
        lead.route(SimpleNamespace(buf=np.zeros(4, np.uint8), n=n))
    assert [o.shard for o in lead.others] == [40 + 70, 50 + 80]
    meta = json.loads(json.dumps(lead.saved()))  # as the checkpoint's JSON part keeps it
    back, _ = _lead_group("allreduce")
    source = SimpleNamespace(members_ready=lambda lens: all(n >= 100 for n in lens))
    back.attach(source)
    assert not back.ready()  # nothing sent to the shards yet
    back.resume(meta)
    assert [o.shard for o in back.others] == [110, 130] and back.ready()
    back.resume({})  # a checkpoint from before the counts were kept: 0, as before
    assert [o.shard for o in back.others] == [0, 0]


def test_an_order_is_labelled_with_the_version_of_the_weights_it_carries():
    """Orders handed out in `serve` right after it applied updates carry the trainer's
    weights: their version is the trainer's update count, not the learner loop's, which
    catches up only when `serve` returns (labelled with it, a gradient was logged 1-2 updates
    staler than it was).  Each takes a token of the current step (gba), and another learner
    holds two orders (pipelining)."""
    from types import SimpleNamespace

    from mpirl.roles.placements.common import Drawn
    from mpirl.transport.wire import Tag

    lead, ends = _lead_group("gba", k=2)
    lead.attach(SimpleNamespace(for_member=lambda j, n: Drawn(None, member=j)))
    lead.trainer.updates = 5  # two updates applied in this serve
    state = SimpleNamespace(updates=3, beta=0.4, stop_reason=None)
    assert lead._hand_out(state)
    orders = [lead.wire.unpack(b, Tag.ORDER) for b in ends[1].posted]
    assert orders[0].version == 5 and orders[0].weights(3) is not None
    assert orders[1].weights(3) is None  # the learner's copy is current: no weights again
    assert [t for *_, t in lead.others[0].orders] == [5, 5]  # tokens of step 5 (K = 2)


def test_an_exception_in_the_gba_server_thread_ends_the_lead_loop_with_its_cause():
    """The server thread (gba, async) serves the other learners beside the lead's loop; an
    exception there stops it and is raised again, with its cause, in the loop's next `serve`
    and in `halt` (the loop's exception ends the job: mpirl.run.failure).  Without this the
    thread died alone and the group waited for orders that never came."""
    from types import SimpleNamespace

    lead, end, wire, trainer = _lead("gba", compute=True)

    def broken(member, shard_len):
        raise ValueError("no batch for you")

    lead.attach(SimpleNamespace(for_member=broken))
    state = SimpleNamespace(updates=0, beta=0.4, stop_reason=None)
    with lead.hold():
        lead.start(0)
        assert lead.server.thread is not None and lead.server.thread.is_alive()
        assert lead.serve(time.monotonic(), state) == []  # hands the state to the thread
        with lead.let_go():
            lead.server.thread.join(timeout=10)  # it hands out an order: the source raises
        assert not lead.server.thread.is_alive()
        with pytest.raises(RuntimeError, match="GBA server thread failed.*no batch for you"):
            lead.serve(time.monotonic(), state)
        with pytest.raises(RuntimeError, match="GBA server thread failed"):
            lead.halt()
    assert lead.server.thread is None


def test_the_lead_computes_on_its_copy_while_the_server_thread_owns_the_master_weights():
    """With the server thread the lead's own batch is computed on the compute copy, loaded
    with the master weights (``trainer``) it starts from, and its gradient is labelled with
    that version; the master is stepped only by the server (no race with the backward pass).
    allreduce has no thread: the lead computes on ``trainer`` itself."""
    from types import SimpleNamespace

    import numpy as np

    lead, end, wire, trainer = _lead("gba", compute=True)
    state = SimpleNamespace(updates=0, beta=0.4, stop_reason=None)
    with lead.hold():
        lead.start(0)
        try:
            c = lead.compute_step(trainer)
            assert c is lead.server.compute and c is not trainer
            with trainer.torch.no_grad():
                trainer.params[0].add_(1.0)  # the master moved on: version 3
            trainer.updates = 3
            lead.before_update(state)
            assert lead.lead_version == 3 and lead.lead_token == 3
            assert np.array_equal(c.online.flat_params(), trainer.online.flat_params())
        finally:
            lead.halt()
    plain, *_ = _lead("allreduce")
    assert plain.compute_step(plain.trainer) is plain.trainer


def test_the_server_thread_sleeps_while_updates_are_synchronous():
    """--learner-sync switch starts in all-reduce, where the thread has nothing to serve: it
    sleeps (an idle thread polling beside the all-reduce step took the GIL the step needs,
    and the switch rule took the lead for a straggler); a switch to GBA wakes it."""
    from mpirl.transport.wire import SUBMIT

    lead, end, wire, trainer = _lead("switch", compute=True)
    with lead.hold():
        lead.start(0)
        try:
            with lead.let_go():
                time.sleep(0.3)
            assert lead.server.rounds == 0
            lead.how = SUBMIT  # as `_switch` does
            lead.server.serving.set()
            with lead.let_go():
                time.sleep(0.3)
            assert lead.server.rounds > 10
        finally:
            lead.halt()
