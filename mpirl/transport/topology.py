"""Who is who, and who talks to whom.

World ranks are assigned from rank order (never from host names), so a hostfile or a SLURM
heterogeneous job places them::

    ranks 0..K-1            learners           (the cloud; --learners K, rank 0 the lead)
    then, for each site s:  buffer s, its actors (the edge; sites are contiguous rank blocks)

Actors are spread over the B buffers as evenly as possible (the first sites get one more).
Three kinds of communicator are split from COMM_WORLD:

* ``site``  : buffer s (site rank 0) + its actors (site ranks 1..k). The edge network.
* ``link``  : the lead learner (link rank 0) + every buffer (buffer s is link rank s + 1). The
  long haul.
* ``learners``: the K learners (learner j is rank j), the cloud's own network; only with K > 1
  does anything travel on it (mpirl.transport.group).

The learner never talks to actors: weights go learner -> buffer (link) -> actors (site).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpi4py import MPI

    from mpirl.transport.inbox import Inbox, SitePort
    from mpirl.transport.link import LinkEnd

LEARNER, BUFFER, ACTOR = "learner", "buffer", "actor"


class LayoutError(ValueError):
    """The world size cannot hold the requested layout; the message says what to change."""


def check_layout(world_size: int, buffers: int, learners: int = 1) -> None:
    if buffers < 1:
        raise LayoutError(f"buffers={buffers} must be >= 1")
    if learners < 1:
        raise LayoutError(f"learners={learners} must be >= 1")
    need = learners + 2 * buffers
    if world_size < need:
        fix = f"run with `mpirun -n {need}` or more"
        if world_size >= learners + 2:
            fix += f", or use fewer buffers (--buffers {(world_size - learners) // 2})"
        if learners > 1:
            fix += f", or fewer learners (--learners {max(1, world_size - 2 * buffers)})"
        what = "1 learner" if learners == 1 else f"{learners} learners"
        raise LayoutError(
            f"{world_size} MPI ranks cannot hold {what} + {buffers} buffer(s) with at least "
            f"one actor each (needs >= {need} ranks); {fix}"
        )


def site_sizes(world_size: int, buffers: int, learners: int = 1) -> list[int]:
    """Number of actors in each site."""
    check_layout(world_size, buffers, learners)
    actors = world_size - learners - buffers
    return [actors // buffers + (1 if s < actors % buffers else 0) for s in range(buffers)]


@dataclass(frozen=True)
class Place:
    """One world rank's place in the layout."""

    rank: int
    role: str
    site: int  # -1 for the learner
    index: int  # actor index within all actors (0..A-1); site index for a buffer; learner j: j


def layout(world_size: int, buffers: int, learners: int = 1) -> list[Place]:
    """The full rank layout; pure, so every rank computes the same table without talking."""
    places = [Place(j, LEARNER, -1, j) for j in range(learners)]
    rank, actor = learners, 0
    for s, n in enumerate(site_sizes(world_size, buffers, learners)):
        places.append(Place(rank, BUFFER, s, s))
        rank += 1
        for _ in range(n):
            places.append(Place(rank, ACTOR, s, actor))
            rank += 1
            actor += 1
    return places


@dataclass
class Topology:
    """This rank's place plus the communicators it uses."""

    world: MPI.Comm
    place: Place
    places: list[Place]
    site: MPI.Comm | None  # site communicator (buffer + its actors), None on learners
    link: MPI.Comm | None  # link communicator (lead learner + buffers), None on the others
    learners: MPI.Comm | None = None  # the learners' communicator, None on buffers and actors

    @property
    def role(self) -> str:
        return self.place.role

    @property
    def lead(self) -> bool:
        """The lead learner (learner 0): the one that talks to the buffers."""
        return self.place.role == LEARNER and self.place.index == 0

    @property
    def n_actors(self) -> int:
        return sum(p.role == ACTOR for p in self.places)


def build(world: MPI.Comm, buffers: int, learners: int = 1) -> Topology:
    """Split COMM_WORLD into site, link and learners communicators (collective over
    ``world``)."""
    from mpi4py import MPI

    places = layout(world.Get_size(), buffers, learners)
    me = places[world.Get_rank()]
    # Site: color = site id; key orders the buffer first (it is the lower world rank anyway).
    site = world.Split(me.site if me.role != LEARNER else MPI.UNDEFINED, me.rank)
    on_link = me.role == BUFFER or (me.role == LEARNER and me.index == 0)
    link = world.Split(0 if on_link else MPI.UNDEFINED, me.rank)
    group = world.Split(0 if me.role == LEARNER else MPI.UNDEFINED, me.rank)
    return Topology(
        world=world,
        place=me,
        places=places,
        site=None if site == MPI.COMM_NULL else site,
        link=None if link == MPI.COMM_NULL else link,
        learners=None if group == MPI.COMM_NULL else group,
    )


@dataclass
class Ends:
    """What `mpirl.wiring.connect` hands a role: its ends of the networks it uses and their inboxes.

    ``site``   actor, buffer: the site network (`mpirl.transport.inbox.SitePort`: Isend + an inbox
               that probes the site communicator)
    ``links``  peer rank -> `mpirl.transport.link.LinkEnd`: the lead learner's, one per buffer (link
               rank b = buffer b - 1); a buffer's, ``{0: the learner}``
    ``inbox``  unpacks and dispatches what the links deliver
    ``group``  --learners K: learner j -> end on ``learners`` (the lead's: every other learner;
               a worker's: ``{0: the lead}``), unemulated; ``group_inbox`` for their messages
    """

    site: SitePort | None = None
    links: dict[int, LinkEnd] = field(default_factory=dict)
    inbox: Inbox | None = None
    group: dict[int, LinkEnd] = field(default_factory=dict)
    group_inbox: Inbox | None = None


def format_table(places: list[Place], hosts: list[str]) -> str:
    lines = ["rank  role     site  host"]
    for p, h in zip(places, hosts, strict=True):
        site = "-" if p.site < 0 else str(p.site)
        lines.append(f"{p.rank:>4}  {p.role:<7}  {site:>4}  {h}")
    return "\n".join(lines)


def placement_warnings(places: list[Place], hosts: list[str], link_emulated: bool) -> list[str]:
    """Hints when the placement does not look like edge + cloud."""
    out = []
    for p in places:
        if p.role == BUFFER:
            apart = [
                a.rank
                for a in places
                if a.role == ACTOR and a.site == p.site and hosts[a.rank] != hosts[p.rank]
            ]
            if apart:
                out.append(
                    f"buffer {p.site} (rank {p.rank}, {hosts[p.rank]}) does not share a "
                    f"host with its actors {apart}: the edge network is not local"
                )
    learner_host = hosts[0]
    if not link_emulated and any(hosts[a.rank] == learner_host for a in places if a.role == ACTOR):
        out.append(
            f"the learner shares host {learner_host} with actors and --link none: the "
            "real link is not long-haul; place the learner on its own host or emulate "
            "the link with --link PROFILE"
        )
    return out
