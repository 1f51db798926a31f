"""mpirl.refloss: the held-out reference set (deterministic, n-step as the run's, hash stable)
and the reference loss against a hand computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpirl import refloss as R


def tiny() -> R.RefSet:
    return R.RefSet(
        obs=np.array([[1, 1], [3, 0], [0, -1]], np.float32),
        action=np.array([1, 0, 1], np.int64),
        reward=np.array([0.5, 0.0, 1.0], np.float32),
        next_obs=np.array([[2, 0.5], [0, 1], [1, 1]], np.float32),
        discount=np.array([0.9, 0.5, 0.0], np.float32),
        meta={"format": 1, "env": "hand-made"},
    )


PINNED = "93f693c7f28525cd61cb544eb81b72118f8ed139b6983d329be9ecae880c66fe"


def linear(w) -> torch.nn.Module:
    net = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor(w, dtype=torch.float32))
    return net


def test_reference_loss_equals_a_hand_computation():
    online = linear([[1, 0], [0, 2]])  # Q(s) = [s0, 2 s1]
    target = linear([[0.5, 0], [0, 1]])  # Q'(s) = [0.5 s0, s1]
    # 1: q = Q([1,1])[1] = 2; argmax Q([2,.5]) = 0; Q'([2,.5])[0] = 1; y = .5 + .9 = 1.4;
    #    td = .6, huber = .5 * .36 = .18
    # 2: q = 3; argmax Q([0,1]) = 1; Q'([0,1])[1] = 1; y = 0 + .5 = .5; td = 2.5, huber = 2.0
    # 3: q = -2; terminal: y = 1; td = -3, huber = 2.5
    want_loss, want_td = (0.18 + 2.0 + 2.5) / 3, (0.6 + 2.5 + 3.0) / 3
    for chunk in (4096, 2, 1):
        got = R.reference_loss(online, target, tiny(), huber_delta=1.0, chunk=chunk)
        assert got["n"] == 3
        assert got["loss"] == pytest.approx(want_loss, rel=1e-6)
        assert got["td_abs_mean"] == pytest.approx(want_td, rel=1e-6)
    assert online.weight.grad is None  # no gradients, nothing changed
    # delta 10: every |td| < delta, so the loss is half the mean squared td
    got = R.reference_loss(online, target, tiny(), huber_delta=10.0)
    assert got["loss"] == pytest.approx((0.36 + 6.25 + 9.0) / 2 / 3, rel=1e-6)


def test_reference_loss_with_the_network_as_its_own_target_by_hand():
    """What the evaluation computes (numpy, one network as online and target)."""
    net = linear([[1, 0], [0, 2]])  # Q(s) = [s0, 2 s1]

    # 1: q = 2; Q([2,.5]) = [2, 1]: a* = 0, y = .5 + .9 * 2 = 2.3, td = .3, huber .045
    # 2: q = 3; Q([0,1]) = [0, 2]: a* = 1, y = .5 * 2 = 1, td = 2, huber 1.5
    # 3: q = -2; terminal: y = 1, td = 3, huber 2.5
    def q(x):
        with torch.no_grad():
            return net(torch.from_numpy(x)).numpy()

    for chunk in (4096, 2):
        got = R.reference_loss_self(q, tiny(), huber_delta=1.0, chunk=chunk)
        assert got["loss"] == pytest.approx((0.045 + 1.5 + 2.5) / 3, rel=1e-6)
        assert got["td_abs_mean"] == pytest.approx((0.3 + 2 + 3) / 3, rel=1e-6)
        assert got["q_sq_mean"] == pytest.approx((2**2 + 3**2 + 2**2) / 3, rel=1e-6)
    q_sq = got.pop("q_sq_mean")  # the Q scale: only the evaluation's numpy form gives it
    assert got == pytest.approx(R.reference_loss(net, net, tiny(), huber_delta=1.0))
    assert q_sq > 0


def test_hash_is_over_contents_and_pinned(tmp_path):
    rs = tiny()
    # pinned: a change of the hashing scheme would orphan every stored set's recorded hash
    assert rs.sha256 == PINNED
    a, b = tmp_path / "a.npz", tmp_path / "sub" / "b.npz"
    assert R.save(rs, a) == R.save(rs, b) == PINNED
    back = R.load(b, sha256=PINNED)
    for k in R.ARRAYS:
        np.testing.assert_array_equal(getattr(back, k), getattr(rs, k))
        assert getattr(back, k).dtype == getattr(rs, k).dtype
    assert back.meta == rs.meta
    changed = R.RefSet(**{**rs.__dict__, "reward": rs.reward + np.float32(1e-3)})
    R.save(changed, a)
    with pytest.raises(ValueError, match="sha256 .* but .* was expected"):
        R.load(a, sha256=PINNED)
    np.savez(tmp_path / "other.npz", x=np.zeros(2))
    with pytest.raises(ValueError, match="not a reference set"):
        R.load(tmp_path / "other.npz")


def test_collection_is_deterministic_and_n_step_consistent(tmp_path):
    a = R.collect("CartPole-v1", seed=5, size=300, n_step=3, gamma=0.9)
    b = R.collect("CartPole-v1", seed=5, size=300, n_step=3, gamma=0.9)
    c = R.collect("CartPole-v1", seed=6, size=300, n_step=3, gamma=0.9)
    assert len(a) == 300 and a.obs.shape == (300, 4) and a.obs.dtype == np.float32
    assert a.sha256 == b.sha256 and a.sha256 != c.sha256
    assert a.meta["policy"] == "random" and a.meta["n_step"] == 3 and a.meta["seed"] == 5
    # CartPole pays 1 per step: R = sum_{i<k} 0.9^i, discount 0.9^k or 0 (terminated)
    k = np.arange(1, 4)
    sums = {round(float(x), 5) for x in np.cumsum(0.9 ** (k - 1))}
    assert {round(float(x), 5) for x in a.reward} <= sums
    full = a.discount > 0
    assert full.any() and (~full).any()  # random play ends episodes
    np.testing.assert_allclose(a.reward[full], 1 + 0.9 + 0.81, rtol=1e-6)
    np.testing.assert_allclose(a.discount[full], 0.9**3, rtol=1e-6)

    # epsilon-greedy with a Q-function: greedy steps follow it
    def always_left(x):
        return np.tile([1.0, 0.0], (len(x), 1))

    g = R.collect("CartPole-v1", seed=5, size=50, n_step=1, gamma=0.9, q=always_left, epsilon=0.0)
    assert (g.action == 0).all() and g.meta["policy"] == "epsilon-greedy"
    p = tmp_path / "ref.npz"
    assert (
        R.main(
            [
                "--env",
                "CartPole-v1",
                "--seed",
                "5",
                "--size",
                "300",
                "--n-step",
                "3",
                "--gamma",
                "0.9",
                "--out",
                str(p),
            ]
        )
        == 0
    )
    assert R.load(p, sha256=a.sha256).meta == a.meta


@pytest.mark.parametrize(
    "env_id, extra", [("CartPole-v1", None), ("MinAtar/Breakout-v1", "minatar")]
)
def test_reference_loss_of_the_learners_network(env_id, extra):
    if extra:
        pytest.importorskip(extra)
    from mpirl.agent import envs, qnet

    spec = envs.inspect(env_id)
    rs = R.collect(env_id, seed=1, size=64, n_step=5, gamma=0.99)
    assert rs.obs.dtype == spec.obs_dtype and rs.obs.shape[1:] == spec.obs_shape
    assert rs.meta["clip_rewards"] == spec.clip_rewards
    online = qnet.make_learner_q(spec, (16,), dueling=True)
    target = qnet.make_learner_q(spec, (16,), dueling=True)
    got = R.reference_loss(online, target, rs, chunk=20)
    assert got["n"] == 64 and np.isfinite(got["loss"]) and got["td_abs_mean"] > 0
    # what the evaluation computes: the acting network (numpy MLP / torch CNN on numpy) loaded
    # with the learner's flat weights, as its own target
    q = qnet.make_q(spec, (16,), True, threads=None)
    q.load(online.flat_params())
    mine = R.reference_loss_self(q, rs, chunk=20)
    want = R.reference_loss(online, online, rs)
    assert mine["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert mine["td_abs_mean"] == pytest.approx(want["td_abs_mean"], rel=1e-5)


# --- --reference-set: resolution and the evaluation runners -----------------------------------


def test_resolve_auto_collects_once_into_the_shared_cache(tmp_path):
    from mpirl import seeds
    from mpirl.run.config import Config

    cfg = Config(seed=3, reference_size=40)
    path, sha = R.resolve("auto", cfg, tmp_path / "cell" / "seed3")
    name = f"CartPole-v1-seed{seeds.reference(3)}-n5-g0.99-40.npz"
    assert path == tmp_path / "cell" / ".refsets" / name
    rs = R.load(path, sha256=sha)
    assert len(rs) == 40 and rs.meta["seed"] == seeds.reference(3)
    assert (rs.meta["n_step"], rs.meta["gamma"]) == (cfg.n_step, cfg.gamma)
    stamp = path.stat().st_mtime_ns
    # the paired run of the other placement: the same file, not collected again
    assert R.resolve("auto", cfg, tmp_path / "cell" / "seed3b") == (path, sha)
    assert path.stat().st_mtime_ns == stamp
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
    # a PATH is checked against the run
    assert R.resolve(str(path), cfg, tmp_path / "x") == (path, sha)
    with pytest.raises(ValueError, match="gamma"):
        R.resolve(str(path), Config(gamma=0.9), tmp_path / "x")
    with pytest.raises(ValueError, match="no such file"):
        R.resolve(str(tmp_path / "nope.npz"), cfg, tmp_path / "x")


@pytest.mark.parametrize("kind", ["inline", "process"])
def test_evaluation_reports_the_reference_loss_of_the_weights_it_played(kind, tmp_path):
    """The runner's reference loss is the learner network's, with the evaluated weights as both
    online and target (the flat WEIGHTS vector's order included); NaN without a set."""
    import time

    from mpirl.agent import envs, qnet
    from mpirl.roles.evaluation import make_runner
    from mpirl.run.config import Config

    cfg = Config(eval_episodes=1, hidden=(16,), huber_delta=0.5, eval_max_steps=20)
    spec = envs.inspect(cfg.env)
    rs = R.collect(cfg.env, seed=5, size=50, n_step=cfg.n_step, gamma=cfg.gamma)
    path = tmp_path / "ref.npz"
    sha = R.save(rs, path)
    nets = [qnet.make_learner_q(spec, cfg.hidden, cfg.dueling) for _ in range(2)]
    want = [R.reference_loss(n, n, rs, huber_delta=0.5) for n in nets]
    for w, n in zip(want, nets, strict=True):  # the Q scale: mean Q(s, a)^2 of the taken actions
        with torch.no_grad():
            q_a = n(torch.from_numpy(rs.obs)).gather(
                1, torch.from_numpy(rs.action).long().view(-1, 1)
            )
        w["q_sq_mean"] = float((q_a.double() ** 2).mean())
    assert want[0]["loss"] != pytest.approx(want[1]["loss"])  # the test can tell them apart
    for refset in ((str(path), sha), None):
        r = make_runner(kind, cfg, spec, refset)
        try:
            for rnd, net in enumerate(nets):
                r.request(net.flat_params(), rnd, rnd, 0)
                for _ in range(3000):
                    res = r.poll()
                    if res is not None:
                        break
                    time.sleep(0.005)
                assert res is not None
                if refset is None:
                    assert np.isnan(res.reference_loss) and np.isnan(res.reference_td)
                    assert np.isnan(res.reference_q_sq)
                else:
                    assert res.reference_loss == pytest.approx(want[rnd]["loss"], rel=1e-5)
                    assert res.reference_td == pytest.approx(want[rnd]["td_abs_mean"], rel=1e-5)
                    assert res.reference_q_sq == pytest.approx(want[rnd]["q_sq_mean"], rel=1e-4)
        finally:
            r.close()


@pytest.mark.mpi
def test_a_missing_reference_set_is_one_error_before_the_run(tmp_path):
    from mpirun import run_mpirl

    p = run_mpirl(
        3,
        "--reference-set",
        str(tmp_path / "nope.npz"),
        "--run-dir",
        str(tmp_path / "run"),
        timeout=120,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("mpirl: error: reference_set=") == 1, p.stderr
    assert "no such file" in p.stderr
    assert not (tmp_path / "run").exists()  # checked before the run folder is made


# --- the run's own env: --env-kwargs and --env-wrappers ---------------------------------------

TOY = "toy_env:MpirlSignal-v0"  # tests/toy_env.py: the observation is one-hot of n signals


def test_auto_sets_are_collected_on_the_runs_env_and_never_shared_across_kwargs(tmp_path):
    """The set is collected with the run's kwargs and wrappers, and they are part of its cache
    name: runs that differ only in them get sets of their own env."""
    from mpirl import seeds
    from mpirl.run.config import Config

    run = tmp_path / "cell" / "seed0"
    made = {}
    for name, kw in [
        ("plain", {}),
        ("n3", {"env_kwargs": {"n": 3}}),
        ("n4", {"env_kwargs": {"n": 4}}),
        ("n3+1", {"env_kwargs": {"n": 3}, "env_wrappers": "toy_env:plus_one"}),
    ]:
        cfg = Config(env=TOY, reference_size=30, n_step=1, **kw)
        made[name] = path, sha = R.resolve("auto", cfg, run)
        rs = R.load(path, sha256=sha)
        assert rs.obs.shape == (30, cfg.env_kwargs.get("n", 2) if cfg.env_kwargs else 2)
        assert rs.meta["env_kwargs"] == (cfg.env_kwargs or {})
        assert rs.meta["env_wrappers"] == cfg.wrapper_specs()
        want = {1.0, 2.0} if cfg.env_wrappers else {0.0, 1.0}  # plus_one adds 1 to each reward
        assert set(rs.reward.tolist()) == want, name
    assert len({p for p, _ in made.values()}) == 4
    seed = seeds.reference(0)
    assert made["plain"][0].name == f"toy_env_MpirlSignal-v0-seed{seed}-n1-g0.99-30.npz"
    assert made["n3"][0].name == (
        f"toy_env_MpirlSignal-v0-e{R.env_key({'n': 3}, [])}-seed{seed}-n1-g0.99-30.npz"
    )
    # the key is the canonical JSON: the order kwargs are written in does not matter
    assert R.env_key({"n": 3, "length": 7}, []) == R.env_key({"length": 7, "n": 3}, [])
    assert R.env_key({}, []) == "" and R.env_key({"n": 3}, []) != R.env_key({}, ["m:f"])


def test_a_set_of_another_env_is_one_clear_error(tmp_path):
    from mpirl.agent import envs
    from mpirl.run.config import Config

    n3 = Config(env=TOY, env_kwargs={"n": 3}, n_step=1, reference_size=20)
    n4 = Config(env=TOY, env_kwargs={"n": 4}, n_step=1, reference_size=20)
    path, _ = R.resolve("auto", n3, tmp_path / "run")
    with pytest.raises(
        ValueError,
        match=r"collected with \{'env_kwargs': \{'n': 3\}\}, the run "
        r"uses \{'env_kwargs': \{'n': 4\}\}",
    ):
        R.resolve(str(path), n4, tmp_path / "x", envs.inspect(TOY, {"n": 4}))
    # a set from before kwargs were recorded was collected without any: fine for a run without
    plain = Config(env=TOY, n_step=1)
    rs = R.collect(TOY, seed=1, size=20, n_step=1, gamma=plain.gamma)
    old = R.RefSet(
        **{
            **rs.__dict__,
            "meta": {k: v for k, v in rs.meta.items() if k not in ("env_kwargs", "env_wrappers")},
        }
    )
    R.save(old, tmp_path / "old.npz")
    spec = envs.inspect(TOY)
    assert R.resolve(str(tmp_path / "old.npz"), plain, None, spec)[0] == tmp_path / "old.npz"
    with pytest.raises(ValueError, match="env_kwargs"):
        R.resolve(str(tmp_path / "old.npz"), n3, None)
    # observations that do not fit the run's env (the env changed since): refused, not a crash
    # of the evaluation process later
    with pytest.raises(
        ValueError,
        match=r"holds observations of shape \(2,\) float32, the "
        r"run's env 'toy_env:MpirlSignal-v0' gives \(3,\)",
    ):
        R.resolve(str(tmp_path / "old.npz"), plain, None, envs.inspect(TOY, {"n": 3}))
    assert (
        R.main(
            [
                "--env",
                TOY,
                "--env-kwargs",
                '{"n": 3}',
                "--env-wrappers",
                "toy_env:plus_one",
                "--seed",
                "1",
                "--size",
                "20",
                "--n-step",
                "1",
                "--gamma",
                "0.99",
                "--out",
                str(tmp_path / "cli.npz"),
            ]
        )
        == 0
    )
    cli = R.load(tmp_path / "cli.npz")
    assert cli.obs.shape == (20, 3) and cli.meta["env_wrappers"] == ["toy_env:plus_one"]


@pytest.mark.mpi
def test_a_run_with_env_kwargs_measures_the_reference_loss_on_its_own_env(tmp_path, tests_on_path):
    """--env-kwargs that change the observation: the auto set is the run's env's, and every
    evaluation reports a finite reference loss (a set of the default env crashed the
    evaluation process, which aborted the job)."""
    import h5py
    from mpirun import run_mpirl

    run = tmp_path / "run"
    p = run_mpirl(
        3,
        "--env",
        TOY,
        "--env-kwargs",
        '{"n": 5}',
        "--reference-set",
        "auto",
        "--reference-size",
        "200",
        "--max-updates",
        "300",
        "--eval-every",
        "100",
        "--eval-episodes",
        "2",
        "--learning-starts",
        "100",
        "--hidden",
        "16",
        "--target-return",
        "none",
        "--max-seconds",
        "60",
        "--run-dir",
        str(run),
        timeout=180,
        env=tests_on_path,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    with h5py.File(run / "learner.h5", "r") as f:
        loss = f["evals/reference_loss"][()]
        ref = R.load(f.attrs["reference_set"], sha256=f.attrs["reference_set_sha256"])
    assert len(loss) >= 1 and np.isfinite(loss).all(), loss
    assert ref.obs.shape[1:] == (5,) and ref.meta["env_kwargs"] == {"n": 5}
