"""The Q-network (torch and numpy agree) and the DQN loss."""

import numpy as np
import pytest
import torch

from mpirl.agent.dqn import dqn_loss
from mpirl.agent.qnet import NumpyQ, make_torch_q, n_params


@pytest.mark.parametrize("dueling", [False, True])
def test_numpy_forward_matches_torch(dueling):
    torch.manual_seed(0)
    net = make_torch_q(4, 3, (16, 8), dueling)
    flat = net.flat_params()
    assert flat.size == n_params(4, 3, (16, 8), dueling)
    q = NumpyQ(4, 3, (16, 8), dueling)
    q.load(flat)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(
        q(x), net(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6
    )


def test_numpy_q_rejects_wrong_size():
    with pytest.raises(ValueError, match="same --hidden"):
        NumpyQ(4, 2, (8,), False).load(np.zeros(3, np.float32))


def test_double_dqn_loss_by_hand():
    class Table(torch.nn.Module):
        def __init__(self, table):
            super().__init__()
            self.table = torch.nn.Parameter(torch.tensor(table))

        def forward(self, s):  # s holds a state index
            return self.table[s[:, 0].long()]

    online = Table([[1.0, 2.0], [3.0, 0.5]])
    target = Table([[10.0, 20.0], [30.0, 40.0]])
    obs = torch.tensor([[0.0]])
    nxt = torch.tensor([[1.0]])
    # online picks action 0 at s'=1 (3.0 > 0.5); target values it at 30 -> y = 1 + 0.5 * 30 = 16
    loss, td = dqn_loss(
        online,
        target,
        obs,
        torch.tensor([1]),
        torch.tensor([1.0]),
        nxt,
        torch.tensor([0.5]),
        torch.tensor([2.0]),
        huber_delta=1.0,
    )
    assert td.item() == pytest.approx(14.0)  # |2 - 16|
    assert loss.item() == pytest.approx(2.0 * (14.0 - 0.5))  # weighted Huber, linear part
    loss.backward()
    assert online.table.grad[0, 1].item() == pytest.approx(-2.0)
    assert target.table.grad is None


def test_terminal_discount_zero_ignores_bootstrap():
    online = torch.nn.Linear(2, 2)
    target = torch.nn.Linear(2, 2)
    obs = torch.zeros(3, 2)
    _, td = dqn_loss(
        online,
        target,
        obs,
        torch.zeros(3, dtype=torch.long),
        torch.ones(3),
        torch.randn(3, 2) * 100,
        torch.zeros(3),
        torch.ones(3),
    )
    q = online(obs)[:, 0]
    np.testing.assert_allclose(td.numpy(), (q - 1).abs().detach().numpy(), rtol=1e-6)


def test_train_step_runs_standalone():
    """The learner's train step without MPI (bench/overheads.py times it so): it learns from a
    batch of structured transition records, and sync_target copies the online network."""
    from mpirl.agent.envs import inspect
    from mpirl.agent.train_step import TrainStep
    from mpirl.run.config import Config
    from mpirl.transport.wire import transition_dtype

    cfg = Config(hidden=(16,), lr=1e-2)
    spec = inspect(cfg.env)
    rng = np.random.default_rng(0)
    rec = np.zeros(32, transition_dtype(spec.obs_shape, spec.obs_dtype))
    rec["obs"] = rng.normal(size=rec["obs"].shape)
    rec["next_obs"] = rng.normal(size=rec["obs"].shape)
    rec["action"] = rng.integers(0, spec.n_actions, 32)
    rec["reward"] = 1.0
    torch.manual_seed(0)
    step = TrainStep(cfg, spec)
    before = step.online.flat_params()
    losses = [step.step(rec, np.ones(32, np.float32))[0] for _ in range(30)]
    loss, td = step.step(rec, np.ones(32, np.float32))
    assert td.shape == (32,) and np.isfinite(td).all() and (td >= 0).all()
    assert loss < losses[0]  # discount 0: it regresses Q(s, a) onto the reward
    assert not np.array_equal(step.online.flat_params(), before)
    assert not np.array_equal(step.target.flat_params(), step.online.flat_params())
    step.sync_target()
    np.testing.assert_array_equal(step.target.flat_params(), step.online.flat_params())


def test_adam_matches_torch_and_checkpoints_either_way():
    """mpirl.agent.dqn.Adam is torch.optim.Adam's update (same kernel) with its
    state_dict format."""
    import copy

    from mpirl.agent.dqn import Adam

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ref_net = copy.deepcopy(net)
    ours, ref = Adam(net.parameters(), lr=1e-2), torch.optim.Adam(ref_net.parameters(), lr=1e-2)
    x = torch.randn(32, 4)
    for _ in range(20):
        for n, o in ((net, ours), (ref_net, ref)):
            o.zero_grad()
            n(x).pow(2).mean().backward()
            o.step()
    for p, q in zip(net.parameters(), ref_net.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    back = Adam(copy.deepcopy(ref_net).parameters(), lr=1e-2)
    back.load_state_dict(ref.state_dict())  # a checkpoint written by torch's Adam
    assert float(back.steps[0]) == 20
    torch.testing.assert_close(back.exp_avg_sq[2], ref.state_dict()["state"][2]["exp_avg_sq"])
    fresh = torch.optim.Adam(copy.deepcopy(net).parameters(), lr=1e-2)
    fresh.load_state_dict(ours.state_dict())  # and the other way
    torch.testing.assert_close(fresh.state_dict()["state"][0]["exp_avg"], ours.exp_avg[0])


def test_learner_train_step_does_not_import_dynamo():
    """Start-up: torch.optim.Optimizer imports torch._dynamo (seconds on a loaded 2-core box);
    the learner's train step must not pull it in (checked on the torch CI installs; releases
    before 2.4 may import it from torch.compiler.is_compiling, which costs time, not results)."""
    import subprocess
    import sys

    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 4):
        pytest.skip(f"torch {torch.__version__}: not checked before 2.4")

    code = (
        "import sys, numpy as np\n"
        "from mpirl.run.config import Config\nfrom mpirl.agent.envs import inspect\n"
        "from mpirl.agent.train_step import TrainStep\n"
        "from mpirl.transport.wire import transition_dtype\n"
        "cfg = Config(hidden=(16,)); spec = inspect(cfg.env)\n"
        "rec = np.zeros(8, transition_dtype(spec.obs_shape, spec.obs_dtype))\n"
        "s = TrainStep(cfg, spec); s.step(rec, np.ones(8, np.float32)); s.sync_target()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


_ADAM_FALLBACK = """
import copy, sys, torch, torch.optim.adam as A
real = A.adam  # torch.optim.Adam's step needs it: hidden while mpirl imports and builds its Adam
if sys.argv[1] == "missing":
    del A.adam  # a torch without the semi-private kernel
else:
    def adam(params, grads, *, renamed_option):  # a torch whose kernel's signature changed
        raise AssertionError("mpirl called a kernel whose signature it does not know")
    A.adam = adam
from mpirl.agent.dqn import Adam
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
ref_net = copy.deepcopy(net)
ours = Adam(net.parameters(), lr=1e-2)
A.adam = real
ref = torch.optim.Adam(ref_net.parameters(), lr=1e-2)
x = torch.randn(32, 4)
def train(n, o, k):
    for _ in range(k):
        o.zero_grad()
        n(x).pow(2).mean().backward()
        o.step()
for n, o in ((net, ours), (ref_net, ref)):
    train(n, o, 10)
for p, q in zip(net.parameters(), ref_net.parameters()):
    assert torch.equal(p, q), (p - q).abs().max()
assert not ours.kernel, "the fallback is torch.optim.Adam, not the kernel"
# state_dict round trip through a checkpoint's torch.save / torch.load: ours -> torch's and
# torch's -> ours continue identically
import io
def saved(sd):
    f = io.BytesIO(); torch.save(sd, f); f.seek(0)
    return torch.load(f, weights_only=True)
back, ref_back = copy.deepcopy(net), copy.deepcopy(ref_net)
o2 = Adam(back.parameters(), lr=1e-2); o2.load_state_dict(saved(ref.state_dict()))
r2 = torch.optim.Adam(ref_back.parameters(), lr=1e-2); r2.load_state_dict(saved(ours.state_dict()))
assert float(o2.steps[0]) == 10
train(back, o2, 5); train(ref_back, r2, 5); train(net, ours, 5); train(ref_net, ref, 5)
for a, b, c, d in zip(back.parameters(), ref_back.parameters(), net.parameters(),
                      ref_net.parameters()):
    assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)
torch.testing.assert_close(ours.state_dict()["state"][2]["exp_avg_sq"],
                           ref.state_dict()["state"][2]["exp_avg_sq"], rtol=0, atol=0)
print("ok")
"""


@pytest.mark.parametrize("how", ["missing", "signature"])
def test_adam_falls_back_to_torch_optim_adam(how):
    """Without torch.optim.adam.adam (semi-private), or with a signature mpirl does not know,
    mpirl.agent.dqn.Adam is torch.optim.Adam: identical parameters, state_dict both ways."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _ADAM_FALLBACK, how], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def _cartpole_batch(n: int = 32, reward: float = 1.0, seed: int = 0):
    from mpirl.agent.envs import inspect
    from mpirl.transport.wire import transition_dtype

    spec = inspect("CartPole-v1")
    rng = np.random.default_rng(seed)
    rec = np.zeros(n, transition_dtype(spec.obs_shape, spec.obs_dtype))
    rec["obs"] = rng.normal(size=rec["obs"].shape)
    rec["next_obs"] = rng.normal(size=rec["obs"].shape)
    rec["action"] = rng.integers(0, spec.n_actions, n)
    rec["reward"] = reward
    rec["discount"] = 0.9
    return spec, rec


def _grads_by_hand(step, rec, weights):
    """The gradients of one update computed again on copies of the networks, unclipped."""
    import copy

    from mpirl.agent.train_step import _batch_tensors

    online, target = copy.deepcopy(step.online), copy.deepcopy(step.target)
    obs, act, rew, nxt, disc = _batch_tensors(torch, rec)
    loss, _ = dqn_loss(
        online, target, obs, act, rew, nxt, disc, torch.from_numpy(weights), step.huber_delta
    )
    loss.backward()
    return [p.grad.clone() for p in online.parameters()]


@pytest.mark.parametrize("reward, weight, clipped", [(1000.0, 100.0, True), (0.0, 1.0, False)])
def test_gradients_above_the_clip_are_scaled_to_the_clip_norm(reward, weight, clipped):
    """grad_clip 0.5: TD errors in the Huber loss's linear part with importance weights of 100
    give a gradient norm far above it, which the update scales (same direction) to norm 0.5
    before Adam sees it; a gradient below the clip is left as it is."""
    from mpirl.agent.train_step import TrainStep
    from mpirl.run.config import Config

    spec, rec = _cartpole_batch(reward=reward)
    w = np.full(len(rec), weight, np.float32)
    torch.manual_seed(0)
    step = TrainStep(Config(hidden=(16,), grad_clip=0.5), spec)
    raw = _grads_by_hand(step, rec, w)
    norm = float(torch.sqrt(sum((g**2).sum() for g in raw)))
    step.step(rec, w)
    want = [g * (0.5 / norm) for g in raw] if clipped else raw
    assert (norm > 50) if clipped else (norm < 0.5), norm
    got = [p.grad for p in step.online.parameters()]
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-7)
    if clipped:
        assert float(torch.sqrt(sum((g**2).sum() for g in got))) == pytest.approx(0.5, rel=1e-4)
    # Adam took the clipped gradient: its first moment after one step is (1 - beta1) * g
    state = step.opt.state_dict()["state"]
    for i, e in enumerate(want):
        torch.testing.assert_close(state[i]["exp_avg"], 0.1 * e, rtol=1e-4, atol=1e-8)


def test_grad_clip_zero_leaves_gradients_alone():
    from mpirl.agent.train_step import TrainStep
    from mpirl.run.config import Config

    spec, rec = _cartpole_batch(reward=1000.0)
    w = np.full(len(rec), 100.0, np.float32)
    torch.manual_seed(0)
    step = TrainStep(Config(hidden=(16,), grad_clip=0.0), spec)
    raw = _grads_by_hand(step, rec, w)
    step.step(rec, w)
    for g, e in zip((p.grad for p in step.online.parameters()), raw, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-7)


def test_target_network_copied_exactly_every_target_update():
    """target_update 3: the target holds the online network of update 3, 6, 9, ... and does not
    change in between; a resumed step counter keeps the cadence (next copy at 12 from 10)."""
    from mpirl.agent.train_step import TrainStep
    from mpirl.run.config import Config

    spec, rec = _cartpole_batch()
    w = np.ones(len(rec), np.float32)
    torch.manual_seed(0)
    step = TrainStep(Config(hidden=(16,), lr=1e-2, target_update=3), spec)
    initial = step.target.flat_params()
    np.testing.assert_array_equal(initial, step.online.flat_params())  # a copy at the start
    held, copies = initial, []
    for u in range(1, 11):
        step.step(rec, w)
        assert step.updates == u
        online, target = step.online.flat_params(), step.target.flat_params()
        assert not np.array_equal(online, held)  # every update changes the online network
        if np.array_equal(target, online):
            copies.append(u)
            held = target
        else:
            np.testing.assert_array_equal(target, held)  # unchanged since the last copy
    assert copies == [3, 6, 9]
    step.updates = 10  # as a resumed learner sets it
    held = step.target.flat_params()
    step.step(rec, w)
    np.testing.assert_array_equal(step.target.flat_params(), held)  # 11: no copy
    step.step(rec, w)
    np.testing.assert_array_equal(step.target.flat_params(), step.online.flat_params())  # 12


@pytest.mark.parametrize("delta", [1.0, 0.3])
def test_logged_unweighted_loss_is_dqn_loss_with_unit_weights(delta):
    """/updates/loss_unweighted is computed in the learner's held rows from the batch's |td|
    (learner_rows.huber), not by the train step: it must be the loss dqn_loss gives with every
    importance weight 1, for any --huber-delta, while /updates/loss is the weighted one."""
    from mpirl.roles.learner_rows import huber

    torch.manual_seed(0)
    online, target = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    n = 64
    obs, nxt = torch.randn(n, 4) * 3, torch.randn(n, 4) * 3
    act, rew = torch.randint(0, 3, (n,)), torch.randn(n) * 2
    disc = torch.full((n,), 0.9)
    w = torch.rand(n) * 0.1  # IS weights (p / p_min)^-beta: small when p_min is tiny
    with torch.no_grad():
        weighted, td = dqn_loss(online, target, obs, act, rew, nxt, disc, w, delta)
        unit, _ = dqn_loss(online, target, obs, act, rew, nxt, disc, torch.ones(n), delta)
    logged = huber(td.numpy().astype(np.float32), delta).mean(dtype=np.float64)
    assert logged == pytest.approx(float(unit), rel=1e-5)
    assert float(weighted) < 0.2 * float(unit)  # the weighted loss is not a TD-error scale
