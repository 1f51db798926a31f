"""Figures that two ranks log about the same thing agree: the importance-sampling beta
of every buffer and of the learner, the weights versions the actors see and the broadcasts the
learner made, the progress line's link rate and the /link rows.  One real 2-site run serves
these checks."""

import json

import numpy as np
import pytest
from mpirun import read_h5 as read
from mpirun import run_mpirl

WEIGHTS_EVERY = 5
BETA0, BETA_STEPS = 0.4, 1000
INFLIGHT = 2
pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def two_sites(tmp_path_factory):
    """learner + 2 buffers (replay at the buffers) + 1 actor each, beta annealed fast enough
    to see a difference within the run, weights every 5 updates; 500 updates (beta moves by
    0.3), a progress row every 0.1 s (at least 3 rows on a quiet machine, where the run lasts
    under a second)."""
    run_dir = tmp_path_factory.mktemp("figures") / "run"
    p = run_mpirl(
        5,
        "--buffers",
        "2",
        "--replay-at",
        "buffer",
        "--run-dir",
        str(run_dir),
        "--max-updates",
        "500",
        "--progress-seconds",
        "0.1",
        "--flush-seconds",
        "1",
        "--target-return",
        "none",
        "--learning-starts",
        "200",
        "--hidden",
        "32",
        "32",
        "--beta",
        str(BETA0),
        "--beta-steps",
        str(BETA_STEPS),
        "--weights-every",
        str(WEIGHTS_EVERY),
        "--inflight",
        str(INFLIGHT),
        timeout=240,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return run_dir, p.stdout


def test_buffers_sample_with_the_learners_beta(two_sites):
    """Each buffer's /batches/beta is the learner's beta at the update that trained the batch,
    up to the updates that happen while it crosses the link (the in-flight batches of both
    sites, and the priority update on its way back)."""
    run_dir, _ = two_sites
    learner, _ = read(run_dir / "learner.h5")
    upd_beta = dict(
        zip(learner["updates/update"].tolist(), learner["updates/beta"].tolist(), strict=True)
    )
    slope = (1 - BETA0) / BETA_STEPS
    lag = 20  # updates between sampling at a buffer and training at the learner: the batches
    # in flight of both sites and the priority update on its way back (a few), with room for
    # the fair queueing that lets one site's batches wait while the other catches up
    assert max(upd_beta.values()) > BETA0 + 100 * slope  # beta did anneal during the run
    for s in range(2):
        buf, _ = read(run_dir / f"buffer-{s}.h5")
        mine = learner["transfers/buffer"] == s
        trained_at = learner["transfers/update"][mine]  # FIFO per site: k-th sent, k-th trained
        used = buf["batches/beta"][: len(trained_at)]
        assert len(used) == len(trained_at) > 50
        at_learner = np.array([upd_beta[u] for u in trained_at.tolist()])
        gap = at_learner - used
        worst = int(np.argmax(np.abs(gap)))
        assert np.all(gap > -1e-6) and np.all(gap <= lag * slope + 1e-6), (
            f"buffer {s}: sampled batch {worst} with beta {used[worst]:.3f}, the learner trained "
            f"it at update {trained_at[worst]} with beta {at_learner[worst]:.3f}"
        )


def test_weights_are_broadcast_only_after_an_update(two_sites):
    """The actors' newest weights version is updates // weights_every (version 0 is the initial
    broadcast): no version was sent on a turn without an update."""
    run_dir, _ = two_sites
    summary = json.loads((run_dir / "summary.json").read_text())
    newest = max(read(f)[0]["actor/weights_version"].max() for f in run_dir.glob("actor-*.h5"))
    assert summary["updates"] > 10 * WEIGHTS_EVERY
    assert newest == summary["updates"] // WEIGHTS_EVERY, (newest, summary["updates"])


def test_progress_link_rate_matches_the_link_rows(two_sites):
    """Bytes the progress rows report (rate x interval) add up to the /link rows' bytes: at
    every progress row, the running sum lies between the /link totals just before and just
    after it (both read the same counters)."""
    run_dir, _ = two_sites
    learner, _ = read(run_dir / "learner.h5")
    prog = np.cumsum(learner["progress/link_bytes_per_s"] * learner["progress/interval_s"])
    sites = len(set(learner["link/buffer"].tolist()))  # one row per site per interval
    t_link = learner["link/t"].reshape(-1, sites)[:, 0]
    link = np.cumsum(
        (learner["link/bytes_in"] + learner["link/bytes_out"]).reshape(-1, sites).sum(axis=1)
    )
    assert len(prog) >= 3 and link[-1] > 0, f"{len(prog)} progress rows"
    for t, got in zip(learner["progress/t"], prog, strict=True):
        before = link[t_link <= t][-1] if (t_link <= t).any() else 0
        after = link[t_link >= t][0]
        assert before * 0.99 <= got <= after * 1.01, (
            f"progress row at t={t:.2f}: {got:,.0f} bytes so far, /link rows {before:,} "
            f"(before) .. {after:,} (after)"
        )


@pytest.mark.parametrize("replay_at", ["buffer", "learner"])
def test_sampling_holds_the_replay_ratio(tmp_path, replay_at):
    """One actor with one env and a learner faster than it: the replay ratio also holds the
    sampling side, so samples stay within one batch of replay_ratio x (inserted -
    learning_starts) at every moment (actors were the only side throttled)."""
    ratio, starts, batch = 0.5, 200, 64
    run_dir = tmp_path / "run"
    p = run_mpirl(
        3,
        "--replay-at",
        replay_at,
        "--run-dir",
        str(run_dir),
        "--max-updates",
        "40",
        "--flush-seconds",
        "1",
        "--target-return",
        "none",
        "--hidden",
        "32",
        "32",
        "--envs-per-actor",
        "1",
        "--replay-ratio",
        str(ratio),
        "--learning-starts",
        str(starts),
        "--batch-size",
        str(batch),
        timeout=240,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    if replay_at == "buffer":  # the buffer samples: its counters, row by row
        site, _ = read(run_dir / "buffer-0.h5")
        sampled, inserted = site["site/sampled"], site["site/inserted"]
    else:  # the learner samples: before its k-th update, what had arrived by then
        learner, _ = read(run_dir / "learner.h5")
        arrived = np.cumsum(learner["transfers/n"])
        k = np.arange(1, len(learner["updates/update"]) + 1)
        seen = np.searchsorted(learner["transfers/update"], k - 1, side="right")
        inserted = np.where(seen > 0, arrived[np.maximum(seen - 1, 0)], 0)
        sampled = (k - 1) * batch
    assert sampled[-1] > 20 * batch
    over = sampled - (np.maximum(ratio * (inserted - starts), 0) + batch)
    worst = int(np.argmax(over))
    assert over[worst] <= 0, (
        f"{sampled[worst]:,} sampled after {inserted[worst]:,} inserted: "
        f"ratio {sampled[worst] / max(inserted[worst] - starts, 1):.2f} "
        f"> {ratio}"
    )
