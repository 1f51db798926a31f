"""Who is who, and who talks to whom.

World ranks are assigned from rank order (never from host names), so a hostfile or a SLURM
heterogeneous job places them::

    rank 0                  learner            (the cloud)
    then, for each site s:  buffer s, its actors (the edge; sites are contiguous rank blocks)

Actors are spread over the B buffers as evenly as possible (the first sites get one more).
Two kinds of communicator are split from COMM_WORLD:

* ``site``  : buffer s (site rank 0) + its actors (site ranks 1..k). The edge network.
* ``link``  : learner (link rank 0) + every buffer (buffer s is link rank s + 1). The long haul.

The learner never talks to actors: weights go learner -> buffer (link) -> actors (site).
"""

from __future__ import annotations

from dataclasses import dataclass

LEARNER, BUFFER, ACTOR = "learner", "buffer", "actor"


class LayoutError(ValueError):
    """The world size cannot hold the requested layout; the message says what to change."""


def check_layout(world_size: int, buffers: int) -> None:
    if buffers < 1:
        raise LayoutError(f"buffers={buffers} must be >= 1")
    need = 1 + 2 * buffers
    if world_size < need:
        fix = f"run with `mpirun -n {need}` or more"
        if world_size >= 3:
            fix += f", or use fewer buffers (--buffers {(world_size - 1) // 2})"
        raise LayoutError(
            f"{world_size} MPI ranks cannot hold 1 learner + {buffers} buffer(s) with at least "
            f"one actor each (needs >= {need} ranks); {fix}"
        )


def site_sizes(world_size: int, buffers: int) -> list[int]:
    """Number of actors in each site."""
    check_layout(world_size, buffers)
    actors = world_size - 1 - buffers
    return [actors // buffers + (1 if s < actors % buffers else 0) for s in range(buffers)]


@dataclass(frozen=True)
class Place:
    """One world rank's place in the layout."""

    rank: int
    role: str
    site: int  # -1 for the learner
    index: int  # actor index within all actors (0..A-1); site index for a buffer; 0 for learner


def layout(world_size: int, buffers: int) -> list[Place]:
    """The full rank layout; pure, so every rank computes the same table without talking."""
    places = [Place(0, LEARNER, -1, 0)]
    rank, actor = 1, 0
    for s, n in enumerate(site_sizes(world_size, buffers)):
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

    world: object
    place: Place
    places: list[Place]
    site: object | None  # site communicator (buffer + its actors), None on the learner
    link: object | None  # link communicator (learner + buffers), None on actors

    @property
    def role(self) -> str:
        return self.place.role

    @property
    def n_actors(self) -> int:
        return sum(p.role == ACTOR for p in self.places)

    @property
    def n_buffers(self) -> int:
        return sum(p.role == BUFFER for p in self.places)

    def actors_of(self, site: int) -> list[Place]:
        return [p for p in self.places if p.role == ACTOR and p.site == site]


def build(world, buffers: int) -> Topology:
    """Split COMM_WORLD into site and link communicators (collective over ``world``)."""
    from mpi4py import MPI

    places = layout(world.Get_size(), buffers)
    me = places[world.Get_rank()]
    # Site: color = site id; key orders the buffer first (it is the lower world rank anyway).
    site = world.Split(me.site if me.role != LEARNER else MPI.UNDEFINED, me.rank)
    link = world.Split(0 if me.role != ACTOR else MPI.UNDEFINED, me.rank)
    site = None if site == MPI.COMM_NULL else site
    link = None if link == MPI.COMM_NULL else link
    return Topology(world=world, place=me, places=places, site=site, link=link)


def format_table(places: list[Place], hosts: list[str]) -> str:
    lines = ["rank  role     site  host"]
    for p, h in zip(places, hosts):
        site = "-" if p.site < 0 else str(p.site)
        lines.append(f"{p.rank:>4}  {p.role:<7}  {site:>4}  {h}")
    return "\n".join(lines)


def placement_warnings(places: list[Place], hosts: list[str], link_emulated: bool) -> list[str]:
    """Hints when the placement does not look like edge + cloud."""
    out = []
    for p in places:
        if p.role == BUFFER:
            apart = [a.rank for a in places if a.role == ACTOR and a.site == p.site
                     and hosts[a.rank] != hosts[p.rank]]
            if apart:
                out.append(f"buffer {p.site} (rank {p.rank}, {hosts[p.rank]}) does not share a "
                           f"host with its actors {apart}: the edge network is not local")
    learner_host = hosts[0]
    if not link_emulated and any(hosts[a.rank] == learner_host for a in places
                                 if a.role == ACTOR):
        out.append(f"the learner shares host {learner_host} with actors and --link none: the "
                   "real link is not long-haul; place the learner on its own host or emulate "
                   "the link with --link PROFILE")
    return out
