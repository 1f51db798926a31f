"""What both placements share: the learner's record of a site, a drawn batch that carries its
own origin, and the two sides' interfaces (`SiteSide` at the buffer, `BatchSource` at the
learner)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from mpirl.transport.link import LinkEnd
    from mpirl.transport.wire import Batch, Experience, Tag


class Site:
    """What the learner keeps per buffer (one edge site), ``rank`` its link rank."""

    def __init__(self, rank: int, link: LinkEnd, weight: float) -> None:
        self.rank, self.index, self.link, self.weight = rank, rank - 1, link, weight
        self.steps = 0  # env steps of its actors, as last reported
        self.served = 0  # batches trained (replay at the buffer) / transitions inserted (learner)
        self.done = False  # it sent DONE: nothing more is posted to it

    def share(self) -> float:
        """How far it is behind its --site-weights share: the smallest goes next."""
        return self.served / self.weight


@dataclass
class Drawn:
    """A batch to train, with where it came from, so that its priorities go back (and its rows
    are written) by the placement that made it, whoever trains it.

    ``records`` None: an order for a group learner to sample its own shard."""

    records: np.ndarray | None
    weights: np.ndarray | None = None
    frames: np.ndarray | None = None
    indices: np.ndarray | None = None  # slots in this learner's memory
    generations: np.ndarray | None = None
    site: Site | None = None  # a buffer's batch: its priorities go back there
    batch: Batch | None = None  # that BATCH message, as received
    scale: float = 1.0  # the importance-weight scale applied to it
    member: int | None = None  # an order for learner ``member`` of the group to sample its shard
    max_weight: float = 0.0  # that shard's max importance weight, as its GRAD reported
    #: what each transition was drawn in proportion to, over the transitions the placement's
    #: memory stands for (PER's p_i; thinned: p_i f_i, every produced one): /updates
    #: td_abs_uniform weighs the batch's |td| by its inverse (None: not known here)
    drawn_as: np.ndarray | None = None

    @property
    def n(self) -> int:
        return 0 if self.records is None else len(self.records)


Handlers = dict["Tag", Callable[[Any], None]]


class SiteSide(Protocol):
    """The buffer's side of a placement: what it does with its actors' experiences."""

    handlers: Handlers  # the kinds from the learner this side handles

    def add(self, m: Experience) -> None: ...
    def may_grant(self) -> bool: ...
    def weights_arrived(self, updates: int) -> None: ...
    def ship(self, now: float, stopping: bool) -> bool: ...
    def drained(self) -> bool: ...
    def counters(self) -> dict[str, float]: ...
    def save(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]: ...
    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None: ...
    def site_row(self) -> dict[str, float]: ...


class BatchSource(Protocol):
    """The learner's side of a placement: where its batches come from and where their
    priorities go."""

    handlers: Handlers  # the kinds from the buffers this side handles
    inserted: int
    sampled: int

    def start(self, now: float) -> None: ...
    def stop(self) -> None: ...
    def draw(self, beta: float) -> Drawn | None: ...
    def trained(self, drawn: Drawn, td: np.ndarray, spent: float, updates: int) -> None: ...
    def for_member(self, member: int, shard_len: int) -> Drawn | None: ...
    def members_ready(self, shard_lens: list[int]) -> bool: ...
    def grant_tokens(self, now: float, stopping: bool) -> None: ...
    def delivered(self) -> int | None: ...
    def save(self) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]: ...
    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None: ...


@dataclass
class SiteContext:
    """What a placement's buffer side may be built from (`mpirl.wiring.build_buffer`)."""

    cfg: Any
    spec: Any
    wire: Any
    link: Any  # the long-haul link toward the learner
    streams: dict[str, Any]
    on_raw: Callable[[np.ndarray], None]  # counts what compression saved
    seed: int  # the site's replay seed
    actors: int = 0  # the run's actors, all sites (the thinned placement's rho from pacing)


@dataclass
class LearnerContext:
    """What a placement's learner side may be built from (`mpirl.wiring.build_learner`)."""

    cfg: Any
    spec: Any
    wire: Any
    sites: dict[int, Site]
    rows: Any  # the held /updates and /transfers rows
    arrivals: Any
    streams: dict[str, Any]
    updates: Callable[[], int]  # the learner's update count
    group: Any  # the learner group (route, k)
    seed: int  # the learner's replay seed
