"""What the learner posts to each buffer and trains on, recorded step by step: the real learner
loop (torch, gymnasium, HDF5) against scripted links that stand in for the buffers."""

import numpy as np

from mpirl.fakes import ScriptedLink, make_learner, wire_of
from mpirl.logs.runlog import RunLog
from mpirl.replay import Sample
from mpirl.roles import learner_rows
from mpirl.run.config import Config
from mpirl.transport.wire import Tag


def test_learner_placement_posts_nothing_to_a_buffer_after_its_done(tmp_path):
    """replay_at=learner: a buffer's last FORWARD arrives in the same turn as its DONE (it
    hands over its queue, then says DONE).  The learner owes a token for that FORWARD; it must
    not post it after the DONE it sends back: the buffer has left and never receives it."""
    cfg = Config(
        replay_at="learner",
        buffers=2,
        hidden=(16,),
        max_env_steps=100,
        progress_seconds=0,
        target_return=float("nan"),
    )
    spec, wire = wire_of(cfg)
    record = wire.record

    def forward(seq):
        return Tag.FORWARD, wire.forward(np.zeros(64, record), np.ones(64, np.float32), seq)

    def on_post(link, tag):
        if tag == Tag.STOP:  # the buffer forwards what it still holds, then says DONE
            tail = [forward(1)] if link.peer == 1 else []
            link.inbox += tail + [
                (Tag.STATS, wire.stats([], 100, 0)),
                (Tag.DONE, wire.done(100, 0)),
            ]

    posts = []
    links = {
        1: ScriptedLink(1, on_post, [forward(0), (Tag.STATS, wire.stats([], 60, 0))], posts),
        2: ScriptedLink(2, on_post, [(Tag.STATS, wire.stats([], 60, 0))], posts),
    }
    with RunLog(tmp_path / "learner.h5", {}, flush_seconds=1) as log:
        summary = make_learner(cfg, spec, wire, log, links).run()
    assert summary["stop_reason"] == "max_env_steps"
    for b in (1, 2):
        mine = [tag for peer, tag in posts if peer == b]
        assert mine.count(Tag.DONE) == 1 and Tag.STOP in mine, mine
        after = mine[mine.index(Tag.DONE) + 1 :]
        assert not after, f"posted to buffer {b - 1} after its DONE: {[t.name for t in after]}"


def test_batches_of_several_sites_are_weighted_on_one_scale(tmp_path):
    """replay_at=buffer, 2 sites: each buffer divides its importance weights by its own max
    weight (BATCH.b); the learner trains every site's batch on the scale of the largest max
    weight, so a transition's weight is (N P(i))^-beta of its site over one common figure."""
    cfg = Config(
        replay_at="buffer",
        buffers=2,
        hidden=(16,),
        max_env_steps=100,
        progress_seconds=0,
        target_return=float("nan"),
    )
    spec, wire = wire_of(cfg)
    record = wire.record
    site_w = {
        1: np.linspace(0.1, 1, 8, dtype=np.float32),
        2: np.linspace(0.5, 1, 8, dtype=np.float32),
    }
    site_max = {1: 4.0, 2: 1.5}  # max weights of the two memories

    def batch(b):
        s = Sample(
            indices=np.arange(8),
            generations=np.arange(8),
            weights=site_w[b],
            priorities=np.ones(8),
            records=np.zeros(8, record),
        )
        return Tag.BATCH, wire.batch(s, 0, 0.0, max_weight=site_max[b])

    def on_post(link, tag):
        if tag == Tag.PRIORITIES:  # after the first update: the run is over
            link.inbox.append((Tag.STATS, wire.stats([], 100, 0)))
        if tag == Tag.STOP:
            link.inbox.append((Tag.DONE, wire.done(100, 0)))

    posts, trained = [], []
    links = {b: ScriptedLink(b, on_post, [batch(b)], posts) for b in (1, 2)}
    with RunLog(tmp_path / "learner.h5", {}, flush_seconds=1) as log:
        lrn = make_learner(cfg, spec, wire, log, links)
        put = lrn.trainer.put  # where a batch's weights enter the train step
        lrn.trainer.put = lambda records, weights, frames=None: (
            trained.append(np.array(weights)),
            put(records, weights, frames),
        )[1]
        lrn.run()
    assert len(trained) == 2  # site 0 first (fair queueing, tie), then site 1
    top = max(site_max.values())
    for got, b in zip(trained, (1, 2), strict=True):
        np.testing.assert_allclose(
            got, site_w[b] * site_max[b] / top, rtol=1e-6, err_msg=f"site {b - 1}'s weights"
        )


def test_one_sites_queued_batches_keep_their_own_normaliser(tmp_path):
    """replay_at=buffer, 1 site: each batch's weights are divided by the max weight of the
    memory it was sampled from (BATCH.b), so the learner's rescale is exactly 1, however many
    batches wait.  Two batches queued in one turn, max weights 2 then 5: the older one must not
    be scaled by 2 / 5 (the newer batch's figure)."""
    cfg = Config(
        replay_at="buffer",
        buffers=1,
        hidden=(16,),
        max_env_steps=100,
        progress_seconds=0,
        target_return=float("nan"),
    )
    spec, wire = wire_of(cfg)
    record = wire.record
    w = np.linspace(0.1, 1, 8, dtype=np.float32)

    def batch(max_weight, batch_id):
        s = Sample(
            indices=np.arange(8),
            generations=np.arange(8),
            weights=w,
            priorities=np.ones(8),
            records=np.zeros(8, record),
        )
        return Tag.BATCH, wire.batch(s, batch_id, 0.0, max_weight=max_weight)

    updates = []

    def on_post(link, tag):
        if tag == Tag.PRIORITIES:
            updates.append(tag)
            if len(updates) == 2:  # both batches trained: the run is over
                link.inbox.append((Tag.STATS, wire.stats([], 100, 0)))
        if tag == Tag.STOP:
            link.inbox.append((Tag.DONE, wire.done(100, 0)))

    posts, trained = [], []
    links = {1: ScriptedLink(1, on_post, [batch(2.0, 0), batch(5.0, 1)], posts)}
    with RunLog(tmp_path / "learner.h5", {}, flush_seconds=1) as log:
        lrn = make_learner(cfg, spec, wire, log, links)
        put = lrn.trainer.put  # where a batch's weights enter the train step
        lrn.trainer.put = lambda records, weights, frames=None: (
            trained.append(np.array(weights)),
            put(records, weights, frames),
        )[1]
        lrn.run()
    assert len(trained) == 2
    for i, got in enumerate(trained):
        np.testing.assert_array_equal(got, w, err_msg=f"batch {i}'s weights were rescaled")


def test_priority_spread_is_numpys_linear_percentile():
    """/transfers/priority_median and priority_p90: np.percentile's values, by hand
    on a small case, and on random messages of several sizes."""
    got = learner_rows.spread(np.array([4.0, 1.0, 3.0, 2.0], np.float32))
    # sorted 1 2 3 4: median at h = 1.5 -> 2.5; p90 at h = 2.7 -> 3 + 0.7 * (4 - 3) = 3.7
    assert got["priority_median"] == 2.5 and abs(got["priority_p90"] - 3.7) < 1e-12
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 64, 256):
        p = rng.random(n).astype(np.float32) ** 3
        got = learner_rows.spread(p)
        np.testing.assert_allclose(
            [got["priority_median"], got["priority_p90"]],
            np.percentile(p.astype(np.float64), (50, 90)),
            rtol=1e-6,
        )
    assert np.isnan(learner_rows.spread(np.zeros(0, np.float32))["priority_p90"])


def test_held_rows_match_one_row_at_a_time(tmp_path):
    """The learner's /updates and /transfers rows are held back and written in blocks
    (~30 us of statistics per update one at a time).  Every row on disk must hold what
    the one-at-a-time code wrote: the means, the linear median / p90, the arrival means over the
    subsample (NaN and n 0 without one), in order, across blocks, a change of batch width and
    the log's flushes; nothing may be left behind at close."""
    from mpirl.logs import schema

    rng = np.random.default_rng(1)
    alpha, eps = 0.6, 1e-3
    want_u, want_b = [], []
    with RunLog(tmp_path / "learner.h5", {}, flush_seconds=1e9) as log:
        rows = learner_rows.HeldRows(schema.open_streams(log, "learner"), log, alpha, eps)
        for i in range(2 * learner_rows.HeldRows.BLOCK + 37):
            n = 64 if i < 300 else 32  # a change of batch width mid-block
            td = rng.random(n).astype(np.float32)
            pr = (rng.random(n) ** 2).astype(np.float32)
            sub = None if i % 7 == 3 else td[: n // 2]  # --arrival-sample 0 / a subsample
            rows.update(i, float(i) / 10, td, 0.4)
            rows.batch(i % 3, i, n, 1000 + i, 2000 + i, i % 5, pr, sub)
            huber = np.where(td <= 1.0, 0.5 * td.astype(np.float64) ** 2, td - 0.5)
            want_u.append((i, float(i) / 10, learner_rows.small_mean(td), 0.4, huber.mean()))
            arrival = {"arrival_td_mean": np.nan, "arrival_priority_mean": np.nan, "arrival_n": 0}
            if sub is not None:
                arrival = {
                    "arrival_td_mean": learner_rows.small_mean(sub),
                    "arrival_priority_mean": learner_rows.small_mean((sub + eps) ** alpha),
                    "arrival_n": len(sub),
                }
            want_b.append(
                {
                    "buffer": i % 3,
                    "update": i,
                    "kind": int(Tag.BATCH),
                    "n": n,
                    "nbytes": 1000 + i,
                    "raw_nbytes": 2000 + i,
                    "priority_mean": learner_rows.small_mean(pr),
                    **learner_rows.spread(pr),
                    "priority_td_mean": np.mean(pr.astype(np.float64) ** (1 / alpha)),
                    **arrival,
                    "window": i % 5,
                }
            )
            if i == 100:
                log.flush()  # a flush in the middle hands over what is held
                assert log.file["updates/update"].shape[0] == 101
    import h5py

    with h5py.File(tmp_path / "learner.h5", "r") as f:
        u = {
            k: f["updates"][k][()]
            for k in ("update", "loss", "td_abs_mean", "beta", "loss_unweighted")
        }
        b = {k: f["transfers"][k][()] for k in want_b[0]}
        t = f["updates/t"][()]
    assert len(u["update"]) == len(want_u) and len(b["n"]) == len(want_b)
    assert np.all(np.diff(t) >= 0)
    for k, col in enumerate(("update", "loss", "td_abs_mean", "beta", "loss_unweighted")):
        np.testing.assert_allclose(u[col], [w[k] for w in want_u], rtol=1e-5, err_msg=col)
    for col in want_b[0]:
        np.testing.assert_allclose(b[col], [w[col] for w in want_b], rtol=1e-5, err_msg=col)


def test_evaluation_in_flight_at_the_stop_is_kept(tmp_path):
    """The evaluation runs off the update loop; one requested in the turn the run stops is
    waited for after the final checkpoint, so its /evals row and best.pt are kept (dropping it
    would lose the run's last and possibly best evaluation)."""
    import h5py

    cfg = Config(
        replay_at="buffer",
        hidden=(16,),
        max_updates=1,
        eval_every=1,
        eval_episodes=2,
        evaluator="thread",
        progress_seconds=0,
        target_return=float("nan"),
    )
    spec, wire = wire_of(cfg)
    record = wire.record
    s = Sample(
        indices=np.arange(8),
        generations=np.arange(8),
        weights=np.ones(8, np.float32),
        priorities=np.ones(8, np.float32),
        records=np.zeros(8, record),
    )

    def on_post(link, tag):
        if tag == Tag.STOP:
            link.inbox.append((Tag.DONE, wire.done(100, 0)))

    posts = []
    links = {1: ScriptedLink(1, on_post, [(Tag.BATCH, wire.batch(s, 0, 0.0))], posts)}
    with RunLog(tmp_path / "learner.h5", {}, flush_seconds=1) as log:
        summary = make_learner(cfg, spec, wire, log, links).run()
    assert summary["stop_reason"] == "max_updates" and summary["updates"] == 1
    with h5py.File(tmp_path / "learner.h5", "r") as f:
        assert f["evals/update"][()].tolist() == [1]
    assert np.isfinite(summary["best_eval"])
    assert (tmp_path / "best.pt").exists()


def test_weights_replaced_continues_across_a_resume(tmp_path):
    """/progress/weights_replaced counts every broadcast a newer one replaced before it left,
    over the whole run: a resumed learner starts from the checkpoint's count, not from 0."""
    import json

    from mpirl.run.checkpoint import Checkpointer, load_part

    cfg = Config(replay_at="buffer", buffers=1, hidden=(16,), progress_seconds=0)
    spec, wire = wire_of(cfg)
    with RunLog(tmp_path / "learner.h5", {}, flush_seconds=1) as log:
        ck = Checkpointer(tmp_path, "learner", log=log)
        lrn = make_learner(cfg, spec, wire, log, {1: ScriptedLink(1)}, ckpt=ck)
        lrn.checkpoints.part_names = ["learner"]  # no buffer or actor parts in this test
        lrn.weights.replaced_before = 7  # as if 7 broadcasts were replaced so far
        lrn.save(1, "periodic")
        lrn.evaluation.start()
        lrn.evaluation.close()
    (manifest,) = (tmp_path / "checkpoint").glob("manifest-*.json")
    part = load_part(tmp_path, json.loads(manifest.read_text()), "learner")
    with RunLog(tmp_path / "learner.h5", {}, flush_seconds=1, resume=True) as log:
        again = make_learner(cfg, spec, wire, log, {1: ScriptedLink(1)}, resume=part)
        again.start()
        assert again.weights.replaced() == 7
        again.evaluation.close()


def test_policy_lag_is_logged_per_actor_and_site(tmp_path):
    """/lag: one row per actor a site's STATS reports on, lag = the learner's updates minus
    those of the weights the actor acts with; /progress pools them."""
    import h5py

    cfg = Config(replay_at="buffer", buffers=2, hidden=(16,), max_env_steps=100)
    spec, wire = wire_of(cfg)

    def on_post(link, tag):
        if tag == Tag.STOP:
            link.inbox.append((Tag.DONE, wire.done(100, 0)))

    links = {
        1: ScriptedLink(1, on_post, [(Tag.STATS, wire.stats([], 100, 0, 0, {1: 0, 2: 0}))]),
        2: ScriptedLink(2, on_post, [(Tag.STATS, wire.stats([], 100, 0, 0, {1: 0}))]),
    }
    with RunLog(tmp_path / "learner.h5", {}, flush_seconds=1) as log:
        lrn = make_learner(cfg, spec, wire, log, links)
        lrn.state.updates = 30  # the weights the actors act with are 30 updates old
        lrn.run()
    with h5py.File(tmp_path / "learner.h5", "r") as f:
        lag = {k: f["lag"][k][()].tolist() for k in ("buffer", "actor", "lag_updates")}
    assert lag == {"buffer": [0, 0, 1], "actor": [1, 2, 1], "lag_updates": [30, 30, 30]}


def test_progress_rho_counts_every_learners_samples():
    """rho is transitions trained per env step: with K learners each global update trains K
    batches (allreduce, gba), so updates x batch read K times too small."""
    from types import SimpleNamespace

    from mpirl.roles.learner_parts import Report
    from mpirl.roles.learner_state import LearnerState
    from mpirl.roles.placements.common import Site

    rows = []
    stream = SimpleNamespace(append=lambda **row: rows.append(row))
    cfg = Config(batch_size=64, progress_seconds=1)
    site = Site(1, ScriptedLink(1), 1.0)
    source = SimpleNamespace(sampled=0, delivered=lambda: None)
    weights = SimpleNamespace(take=lambda: {"lag_median": 0.0})
    report = Report(
        cfg, {"progress": stream}, {1: site}, source, weights, SimpleNamespace(idle_s=0.0),
        lambda s: None, 0.0,
    )  # fmt: skip
    state = LearnerState(beta=0.4, t_start=0.0)
    report.mark(state)
    state.updates, source.sampled, site.steps = 10, 10 * 2 * 64, 1280  # K = 2 learners
    report.progress(1.0, state, 0.0)
    assert rows[-1]["rho"] == 1.0


def test_evaluation_on_wall_clock_time(tmp_path):
    """--eval-every-s: evaluations follow wall time, not updates, so two placements whose
    update rates differ are evaluated as often (a link-capped one was evaluated every 15 s
    against 0.7 s for the other)."""
    import h5py

    cfg = Config(
        replay_at="buffer", buffers=1, hidden=(16,), evaluator="inline", eval_episodes=1,
        eval_every=10**9, eval_every_s=0.2, max_seconds=1.5, target_return=float("nan"),
        progress_seconds=0,
    )  # fmt: skip
    spec, wire = wire_of(cfg)
    record = wire.record

    def batch() -> list:
        s = Sample(
            indices=np.arange(8),
            generations=np.arange(8),
            weights=np.ones(8, np.float32),
            priorities=np.ones(8, np.float32),
            records=np.zeros(8, record),
        )
        return [(Tag.BATCH, wire.batch(s, 0, 0.0))]

    def on_post(link, tag):
        if tag == Tag.STOP:
            link.inbox.append((Tag.DONE, wire.done(100, 0)))

    link = ScriptedLink(1, on_post)

    def feed() -> list:  # a batch whenever the learner asks, then DONE after its STOP
        out, link.inbox = link.inbox or batch(), []
        return out

    link.feed = feed
    links = {1: link}
    with RunLog(tmp_path / "learner.h5", {}, flush_seconds=1) as log:
        make_learner(cfg, spec, wire, log, links).run()
    with h5py.File(tmp_path / "learner.h5", "r") as f:
        n = len(f["evals/update"])
    assert 4 <= n <= 9, n  # about one every 0.2 s of a 1.5 s run, none from the update count
