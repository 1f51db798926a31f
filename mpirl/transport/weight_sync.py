"""The learner's weight broadcasts: when (``--weights-every``), in which encoding
(``--weights-encoding``, `mpirl.transport.weight_codec`), and the policy lag the sites report.

When.  ``--weights-every N`` broadcasts every N updates.  ``auto`` keeps the weight traffic at or
below ``--weights-link-share`` of the slowest site's link: a broadcast of ``n`` bytes (the last
one's size, the largest over sites) takes ``n * 8 / rate`` on the wire, so the next one waits
until ``now - t_last >= n * 8 / (rate * share)``, and never less than `AUTO_MIN_UPDATES` updates.
``rate`` is the link's measured rate (`LinkEnd.latest_rate_bps`: from the receiver's
acknowledgements of weight pieces on a real link, `link.AckRate`; the modelled rate under
emulation), else the profile's.  Whatever the
cadence, each link end holds at most one waiting broadcast (`LinkEnd.post_latest`: latest wins).

Policy lag: every EXPERIENCE carries the learner update count of the weights its actor acts
with, and every STATS the latest count of each actor of the site; lag = the learner's updates
when the STATS arrives minus that count (like Sample Factory's ``version_diff``).  The progress
row logs min, median and max over the interval and every actor (/lag has each actor's).
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from mpirl.transport import weight_codec as wc
from mpirl.transport.wire import Tag, Wire

if TYPE_CHECKING:
    from collections.abc import Callable

    from mpirl.run.config import Config
    from mpirl.transport.link import LinkEnd

AUTO_MIN_UPDATES = 100  # --weights-every auto: never more often than this many updates
LAGS_KEPT = 100_000  # the policy lags an interval keeps (the latest)


class _SiteSync:
    """What the learner knows of one site's weights: ``base`` = (version, vector) the site will
    hold once every weight message on the wire has arrived; the keyframe schedule."""

    def __init__(self, key_every: int) -> None:
        self.base: tuple[int, np.ndarray] | None = None
        self.keys = wc.KeyframeSchedule(key_every)
        self.key_version = -1  # the version of the last keyframe that entered the wire


class WeightSync:
    """Decides when the learner broadcasts and encodes each site's message."""

    def __init__(
        self, cfg: Config, wire: Wire, links: dict[int, LinkEnd], done: Callable[[int], bool]
    ) -> None:
        """``links``: link rank -> the end toward that site; ``done(rank)``: the site has left
        (nothing more is sent to it)."""
        self.wire, self.links, self.done = wire, links, done
        self.every = cfg.weights_every_fixed()
        self.share = cfg.weights_link_share
        self.encoding = cfg.weights_encoding
        self.state = {r: _SiteSync(cfg.weights_keyframe_every) for r in links}
        self.last_updates = -1
        self.t_last = -math.inf
        self.last_bytes = 0  # the largest site message of the last broadcast
        self.replaced_before = 0  # broadcasts replaced before leaving, in earlier launches
        # over the progress interval
        self.made = self.made_updates = 0
        self.sent_msgs = self.sent_bytes = self.keyframes = 0
        #: the interval's policy lags, bounded: nothing takes them without progress rows
        self.lags: deque[int] = deque(maxlen=LAGS_KEPT)

    # ---- when ---------------------------------------------------------------------------------
    def rate_bps(self) -> float:
        """The slowest site's measured rate for weights (its profile's until measured)."""
        rates = []
        for link in self.links.values():
            r = link.latest_rate_bps
            rates.append(link.profile.rate_bps if math.isnan(r) else r)
        return min(rates, default=math.inf)

    def due(self, updates: int, now: float) -> bool:
        since = updates - self.last_updates
        if self.every is not None:
            return since >= self.every
        if since < AUTO_MIN_UPDATES:
            return False
        rate = self.rate_bps()
        if math.isinf(rate) or not self.last_bytes:
            return True
        return now - self.t_last >= self.last_bytes * 8.0 / (rate * self.share)

    # ---- how ----------------------------------------------------------------------------------
    def broadcast(self, params: np.ndarray, version: int, updates: int, now: float) -> None:
        """One broadcast to every site still serving, each message latest-wins on its link."""
        params = np.asarray(params, np.float32)
        shared: dict[Any, Any] = {}  # encodings that do not depend on the site: made once

        def full() -> np.ndarray:
            if "full" not in shared:
                shared["full"] = self.wire.weights(params, version, updates)
            return shared["full"]

        if self.made and updates > self.last_updates >= 0:
            self.made_updates += updates - self.last_updates
        self.made += 1
        self.last_updates, self.t_last, self.last_bytes = updates, now, 0
        for rank, link in self.links.items():
            if self.done(rank):
                continue
            st = self.state[rank]

            def make(st: _SiteSync = st) -> tuple[np.ndarray, Callable[[], None]]:
                buf, key, base = self._encode(st, params, version, updates, full, shared)
                self.last_bytes = max(self.last_bytes, buf.nbytes)
                return buf, lambda: self._committed(st, buf, key, base, version)

            link.post_latest(Tag.WEIGHTS, make, now)

    def _encode(
        self,
        st: _SiteSync,
        params: np.ndarray,
        version: int,
        updates: int,
        full: Callable[[], np.ndarray],
        shared: dict[Any, Any],
    ) -> tuple[np.ndarray, bool, tuple[int, np.ndarray] | None]:
        """(message, keyframe?, the site's next base)."""
        if self.encoding == "full":
            return full(), True, None
        if self.encoding == "bf16":
            if "bf16" not in shared:
                shared["bf16"] = self.wire.weights_bf16(wc.to_bf16(params), version, updates)
            return shared["bf16"], True, None
        if st.keys.key_due(st.base is not None):
            return full(), True, (version, params)
        assert st.base is not None  # key_due is true while the site has no base
        base_version, base = st.base
        # sites that hold the same vector share the message (the same version reached by a delta
        # or by a keyframe is not the same vector)
        key = ("delta", base_version, id(base))
        if key not in shared:
            scales, q, rebuilt = wc.encode_delta(params, base)
            shared[key] = (
                self.wire.weights_delta(
                    scales, q, base_version, wc.checksum(rebuilt), version, updates
                ),
                rebuilt,
            )
        buf, rebuilt = shared[key]
        return buf, False, (version, rebuilt)

    def _committed(
        self,
        st: _SiteSync,
        buf: np.ndarray,
        key: bool,
        base: tuple[int, np.ndarray] | None,
        version: int,
    ) -> None:
        """A site's message entered the wire: the site will hold ``base`` next."""
        st.base = base
        st.keys.sent(key)
        if key:
            st.key_version = version
        self.sent_msgs += 1
        self.sent_bytes += buf.nbytes
        self.keyframes += key

    def request_keyframe(self, rank: int, held: int) -> None:
        """The site's delta did not apply (KEYFRAME; it holds version ``held``): its next message
        is a full one, unless a keyframe newer than ``held`` is already on its way (the request
        came from a delta sent before it)."""
        st = self.state[rank]
        if st.key_version <= held:
            st.keys.requested = True

    # ---- report -------------------------------------------------------------------------------
    def observe_lags(self, lags: np.ndarray) -> None:
        """Policy lags (learner updates) of actors, for the interval's min / median / max."""
        self.lags.extend(np.maximum(0, np.asarray(lags, np.int64)).tolist())

    def replaced(self) -> int:
        return self.replaced_before + sum(link.latest_replaced for link in self.links.values())

    def take(self) -> dict:
        """The /progress fields of the interval since the last call."""
        lags = np.asarray(self.lags, np.float64)
        row = {
            "weights_interval": (self.made_updates / (self.made - 1) if self.made > 1 else np.nan),
            "weights_bytes": self.sent_bytes / self.sent_msgs if self.sent_msgs else np.nan,
            "weights_sent": self.sent_msgs,
            "weights_keyframes": self.keyframes,
            "weights_replaced": self.replaced(),
            "lag_min": lags.min() if lags.size else np.nan,
            "lag_median": float(np.median(lags)) if lags.size else np.nan,
            "lag_max": lags.max() if lags.size else np.nan,
        }
        self.made = 1 if self.made else 0  # the last broadcast starts the next interval
        self.made_updates = 0
        self.sent_msgs = self.sent_bytes = self.keyframes = 0
        self.lags.clear()
        return row
