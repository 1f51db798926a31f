"""What the learner posts to each buffer, recorded post by post: the real learner loop (torch,
gymnasium, HDF5) against scripted links that stand in for the buffers."""
from types import SimpleNamespace

import numpy as np

from mpirl import learner
from mpirl.config import Config
from mpirl.envs import inspect
from mpirl.link import LinkStats
from mpirl.logs import RunLog
from mpirl.qnet import param_count
from mpirl.topology import layout
from mpirl.wire import Tag, Wire, transition_dtype


class ScriptedLink:
    """A LinkEnd toward one buffer: records every post in ``log`` and hands the learner what
    ``script`` queues (``script(link, tag)`` runs on every post, ``inbox`` starts it)."""

    def __init__(self, log, script, inbox):
        self.log, self.script, self.inbox = log, script, list(inbox)
        self.sent, self.received = LinkStats(), LinkStats()
        self.backlog = 0

    def bind(self, comm, peer, profile, seed=0):
        self.peer, self.profile = peer, profile
        return self

    def post(self, buf, tag, now=None):
        self.log.append((self.peer, Tag(tag)))
        self.sent.count(buf.nbytes)
        self.script(self, Tag(tag))
        return 0.0

    def receive(self, now=None):
        out, self.inbox = self.inbox, []
        for _, buf in out:
            self.received.count(buf.nbytes)
        return out

    def poll(self, now=None):
        pass

    def next_departure(self):
        return None

    def set_profile(self, profile):
        self.profile = profile


def test_learner_placement_posts_nothing_to_a_buffer_after_its_done(tmp_path, monkeypatch):
    """replay_at=learner: a buffer's last FORWARD arrives in the same turn as its DONE (it
    hands over its queue, then says DONE).  The learner owes a token for that FORWARD; it must
    not post it after the DONE it sends back: the buffer has left and never receives it."""
    cfg = Config(replay_at="learner", buffers=2, hidden=(16,), max_env_steps=100,
                 progress_seconds=0, target_return=float("nan"))
    spec = inspect(cfg.env)
    record = transition_dtype(spec.obs_shape, spec.obs_dtype)
    wire = Wire(record, param_count(spec.obs_shape, spec.n_actions, cfg.hidden, cfg.dueling))

    def forward(seq):
        return Tag.FORWARD, wire.forward(np.zeros(64, record), np.ones(64, np.float32), seq)

    def on_post(link, tag):
        if tag == Tag.STOP:  # the buffer forwards what it still holds, then says DONE
            tail = [forward(1)] if link.peer == 1 else []
            link.inbox += tail + [(Tag.STATS, wire.stats([], 100, 0)),
                                  (Tag.DONE, wire.done(100, 0))]

    posts = []
    links = {1: ScriptedLink(posts, on_post, [forward(0), (Tag.STATS, wire.stats([], 60, 0))]),
             2: ScriptedLink(posts, on_post, [(Tag.STATS, wire.stats([], 60, 0))])}
    monkeypatch.setattr(learner, "LinkEnd", lambda comm, peer, *a, **k: links[peer].bind(
        comm, peer, *a, **k))
    topo = SimpleNamespace(link=SimpleNamespace(Get_size=lambda: 3), places=layout(5, 2))
    with RunLog(tmp_path / "learner.h5", {}, flush_seconds=1) as log:
        summary = learner.run(cfg, topo, spec, wire, log, say=lambda s: None)
    assert summary["stop_reason"] == "max_env_steps"
    for b in (1, 2):
        mine = [tag for peer, tag in posts if peer == b]
        assert mine.count(Tag.DONE) == 1 and Tag.STOP in mine, mine
        after = mine[mine.index(Tag.DONE) + 1:]
        assert not after, f"posted to buffer {b - 1} after its DONE: {[t.name for t in after]}"
