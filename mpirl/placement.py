"""Hostfiles that put the learner in the cloud and each site's buffer with its actors at the edge.

Pure Python (no MPI, no torch): reads a SLURM allocation from the environment (or a node list
given by hand) and writes a hostfile for ``mpirun -f`` (MPICH/Hydra, ``host:slots``) or
``mpirun --hostfile`` (Open MPI, ``host slots=N``), or one host per rank for ``SLURM_HOSTFILE``
with ``srun --distribution=arbitrary``. The launchers fill hosts in file order, so
the file *is* the rank -> host map, and rank order is the role map
(``mpirl.transport.topology.layout``)::

    ranks 0..K-1              learners     -> the cloud host, alone (--learners K, default 1)
    per site s: buffer, actors             -> edge hosts, a site on one host when slots allow

Usage inside a job (see jobs/edge-cloud.sbatch)::

    python -m mpirl.placement --buffers 2 --ntasks 17 > hostfile
    mpirun -f hostfile -n 17 python -m mpirl.main --buffers 2

Each host holds one contiguous block of ranks (a host never appears twice: Open MPI would merge
the lines). Among all such files the chosen one keeps the most sites whole on one host, then
puts the most actors next to their buffer, then mixes the fewest sites on one host.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from mpirl.transport.topology import ACTOR, BUFFER, LEARNER, LayoutError, Place, layout

FORMATS = ("hydra", "openmpi", "slurm")
_MAX_HOSTS = 100_000  # guards against typos such as node[0-99999999]


class PlacementError(ValueError):
    """The allocation or the hostfile cannot hold the layout; the message names the value and
    the fix."""


# ---- SLURM syntax ---------------------------------------------------------------------------


def _split_top(expr: str) -> list[str]:
    """Split on commas and whitespace outside brackets."""
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise PlacementError(
                    f"nodelist {expr!r}: nested '[' is not valid; write ranges as prefix[01-04,07]"
                )
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise PlacementError(f"nodelist {expr!r}: ']' without '['; check the brackets")
        if depth == 0 and (ch == "," or ch.isspace()):
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise PlacementError(f"nodelist {expr!r}: '[' is never closed; check the brackets")
    items.append("".join(cur))
    return [i for i in items if i]


def _expand_group(group: str, expr: str) -> list[str]:
    out: list[str] = []
    for part in group.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            raise PlacementError(
                f"nodelist {expr!r}: range {part!r} in [{group}] is not N or "
                "N-M with digits; write e.g. node[01-04,07]"
            )
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise PlacementError(
                f"nodelist {expr!r}: range {part!r} runs backwards; write {hi}-{lo}"
            )
        if int(hi) - int(lo) >= _MAX_HOSTS:
            raise PlacementError(
                f"nodelist {expr!r}: range {part!r} has more than "
                f"{_MAX_HOSTS:,} hosts; check the numbers"
            )
        width = len(lo)  # SLURM keeps the zero padding of the lower bound: [08-10] -> 08 09 10
        out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return out


def expand_nodelist(expr: str) -> list[str]:
    """Expand a SLURM node list, e.g. ``node[01-03,07],cloud1`` or ``r[1-2]n[1-2]``.

    Several bracket groups in one name expand as a product (leftmost slowest). Host order is
    kept; a host named twice is an error.
    """
    hosts: list[str] = []
    for item in _split_top(expr.strip()):
        pieces = re.split(r"(\[[^\]]*\])", item)
        choices = []
        for p in pieces:
            if p.startswith("["):
                if p == "[]":
                    raise PlacementError(f"nodelist {expr!r}: empty brackets in {item!r}")
                choices.append(_expand_group(p[1:-1], expr))
            elif p:
                choices.append([p])
        for combo in itertools.product(*choices):
            hosts.append("".join(combo))
            if len(hosts) > _MAX_HOSTS:
                raise PlacementError(
                    f"nodelist {expr!r} expands to more than {_MAX_HOSTS:,} hosts; check the ranges"
                )
    if not hosts:
        raise PlacementError(f"nodelist {expr!r} names no host; pass e.g. 'cloud1,node[01-02]'")
    seen: set[str] = set()
    for h in hosts:
        if h in seen:
            raise PlacementError(f"nodelist {expr!r} names host {h!r} twice; list each host once")
        seen.add(h)
    return hosts


def expand_counts(expr: str, what: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand a SLURM per-node count list, e.g. ``8(x3),4`` -> [8, 8, 8, 4]."""
    out: list[int] = []
    for part in expr.replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not m:
            raise PlacementError(
                f"{what}={expr!r}: {part!r} is not N or N(xK); expected e.g. '8(x3),4'"
            )
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


# ---- the allocation -------------------------------------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """Where ranks may go: one cloud host and the edge hosts with their slots (tasks)."""

    cloud: str
    edge: tuple[tuple[str, int], ...]
    source: str  # the variables it came from, quoted in error messages

    @property
    def edge_slots(self) -> int:
        return sum(s for _, s in self.edge)


def _slots_for(
    hosts: list[str], env: Mapping[str, str], suffix: str, slots: int | None
) -> tuple[list[int], str]:
    """Per-host task slots: --slots, else SLURM_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE."""
    if slots is not None:
        if slots < 1:
            raise PlacementError(f"slots={slots} must be >= 1 task per edge host")
        return [slots] * len(hosts), f"--slots {slots}"
    tpn = env.get("SLURM_TASKS_PER_NODE" + suffix)
    if tpn:
        counts = expand_counts(tpn, "SLURM_TASKS_PER_NODE" + suffix)
        if len(counts) != len(hosts):
            raise PlacementError(
                f"SLURM_TASKS_PER_NODE{suffix}={tpn!r} gives {len(counts)} counts for "
                f"{len(hosts)} nodes; pass --slots N (tasks per edge host) instead"
            )
        return counts, f"SLURM_TASKS_PER_NODE{suffix}={tpn}"
    ntpn = env.get("SLURM_NTASKS_PER_NODE" + suffix)
    if ntpn:
        counts = expand_counts(ntpn, "SLURM_NTASKS_PER_NODE" + suffix)
        if len(counts) == 1:
            counts *= len(hosts)
        if len(counts) != len(hosts):
            raise PlacementError(
                f"SLURM_NTASKS_PER_NODE{suffix}={ntpn!r} does not match "
                f"{len(hosts)} nodes; pass --slots N instead"
            )
        return counts, f"SLURM_NTASKS_PER_NODE{suffix}={ntpn}"
    raise PlacementError(
        f"no task count per node (SLURM_TASKS_PER_NODE{suffix} and SLURM_NTASKS_PER_NODE"
        f"{suffix} are unset); request tasks with #SBATCH --ntasks-per-node=N or pass --slots N"
    )


def _pick_cloud(cloud: str | None, default: str, hosts: list[str], where: str) -> str:
    if cloud is None:
        return default
    if cloud not in hosts:
        raise PlacementError(
            f"cloud={cloud!r} is not in the allocation ({where}: "
            f"{', '.join(hosts[:8])}{' ...' if len(hosts) > 8 else ''}); pass "
            "one of these hosts to --cloud"
        )
    return cloud


def allocation_from_nodes(
    nodelist: str, slots: int | Sequence[int], cloud: str | None = None
) -> Allocation:
    """An allocation from a node list by hand: the cloud is ``cloud`` or the first host."""
    hosts = expand_nodelist(nodelist)
    counts = [slots] * len(hosts) if isinstance(slots, int) else list(slots)
    if len(counts) != len(hosts):
        raise PlacementError(
            f"{len(counts)} slot counts for {len(hosts)} hosts in {nodelist!r}; "
            "give one count per host or a single count for all"
        )
    if any(c < 1 for c in counts):
        raise PlacementError(f"slots={counts} must all be >= 1")
    c = _pick_cloud(cloud, hosts[0], hosts, f"--nodelist {nodelist}")
    edge = tuple((h, n) for h, n in zip(hosts, counts, strict=True) if h != c)
    return Allocation(c, edge, f"--nodelist {nodelist}")


def allocation_from_slurm(
    env: Mapping[str, str] | None = None, cloud: str | None = None, slots: int | None = None
) -> Allocation:
    """The allocation of the SLURM job this runs in (no scontrol needed).

    Heterogeneous job (``SLURM_JOB_NODELIST_HET_GROUP_0``, ``_1``, ... set): the cloud is the
    first node of component 0, the edge is every node of components 1, 2, ... . Plain job: the
    cloud is ``cloud`` or the first node of ``SLURM_JOB_NODELIST``, the edge is the other nodes.
    Edge slots come from ``--slots``, ``SLURM_TASKS_PER_NODE`` or ``SLURM_NTASKS_PER_NODE``.
    """
    env = os.environ if env is None else env
    if "SLURM_JOB_NODELIST_HET_GROUP_0" in env:
        groups = []
        for g in itertools.count():
            nl = env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{g}")
            if nl is None:
                break
            groups.append(expand_nodelist(nl))
        if len(groups) < 2:
            raise PlacementError(
                "heterogeneous job with one component (SLURM_JOB_NODELIST_HET_GROUP_1 is unset); "
                "add '#SBATCH hetjob' and a second component for the edge, or use a plain job"
            )
        everyone = [h for grp in groups for h in grp]
        c = _pick_cloud(cloud, groups[0][0], everyone, "SLURM_JOB_NODELIST_HET_GROUP_*")
        edge: list[tuple[str, int]] = []
        src = [f"SLURM_JOB_NODELIST_HET_GROUP_0={env['SLURM_JOB_NODELIST_HET_GROUP_0']}"]
        for g, hosts in enumerate(groups[1:], start=1):
            counts, how = _slots_for(hosts, env, f"_HET_GROUP_{g}", slots)
            edge += [(h, n) for h, n in zip(hosts, counts, strict=True) if h != c]
            src += [
                f"SLURM_JOB_NODELIST_HET_GROUP_{g}={env[f'SLURM_JOB_NODELIST_HET_GROUP_{g}']}",
                how,
            ]
        return Allocation(c, tuple(edge), " ".join(src))
    var = "SLURM_JOB_NODELIST" if "SLURM_JOB_NODELIST" in env else "SLURM_NODELIST"
    if var not in env:
        raise PlacementError(
            "not inside a SLURM job (SLURM_JOB_NODELIST is unset); run this in an sbatch script "
            "or salloc, or pass the hosts by hand: --nodelist 'cloud1,node[01-02]' --slots 8"
        )
    hosts = expand_nodelist(env[var])
    counts, how = _slots_for(hosts, env, "", slots)
    c = _pick_cloud(cloud, hosts[0], hosts, var)
    edge = [(h, n) for h, n in zip(hosts, counts, strict=True) if h != c]
    return Allocation(c, tuple(edge), f"{var}={env[var]} {how}")


def slurm_info(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The SLURM job identity worth storing with a run (empty outside SLURM)."""
    env = os.environ if env is None else env
    keys = (
        "SLURM_JOB_ID",
        "SLURM_ARRAY_JOB_ID",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_RESTART_COUNT",
        "SLURM_JOB_NODELIST",
        "SLURM_JOB_PARTITION",
        "SLURM_CLUSTER_NAME",
        "SLURM_HET_SIZE",
    )
    return {k: env[k] for k in keys if k in env}


# ---- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Hostfile lines in rank order: line i holds the next ``count`` ranks."""

    world_size: int
    buffers: int
    lines: tuple[tuple[str, int], ...]
    learners: int = 1

    @property
    def places(self) -> list[Place]:
        return layout(self.world_size, self.buffers, self.learners)

    def hosts(self) -> list[str]:
        """The host of every rank."""
        return [h for h, n in self.lines for _ in range(n)]


def _sites(world_size: int, buffers: int, learners: int = 1) -> list[tuple[int, int]]:
    """[start, end) rank block of each site (buffer first)."""
    places = layout(world_size, buffers, learners)
    out = []
    for s in range(buffers):
        ranks = [p.rank for p in places if p.site == s]
        out.append((ranks[0], ranks[-1] + 1))
    return out


def require_edge(alloc: Allocation) -> None:
    """Raise PlacementError when the allocation has no host besides the cloud host."""
    if not alloc.edge:
        raise PlacementError(
            f"the allocation has no edge host besides the cloud host {alloc.cloud!r} "
            f"({alloc.source}); request one more node (#SBATCH --nodes=2 or more), or run on "
            "one node with jobs/single-node.sbatch"
        )


def plan(world_size: int, buffers: int, alloc: Allocation, learners: int = 1) -> Plan:
    """Place the learners (ranks 0..K-1) alone on the cloud host and the sites on the edge
    hosts.

    Raises PlacementError (naming the numbers and the fix) when the edge cannot hold the ranks.
    """
    try:
        layout(world_size, buffers, learners)
    except LayoutError as e:
        raise PlacementError(f"ntasks={world_size}: {e}") from None
    need = world_size - learners
    require_edge(alloc)
    have = alloc.edge_slots
    if need > have:
        per = ", ".join(f"{h}:{n}" for h, n in alloc.edge[:6]) + (
            " ..." if len(alloc.edge) > 6 else ""
        )
        fix = (
            f"lower --ntasks to {have + learners}, or "
            if have + learners >= learners + 2 * buffers
            else ""
        )
        raise PlacementError(
            f"ntasks={world_size} needs {need} edge slots (every rank but the learners) but the "
            f"edge hosts have {have} ({per}; from {alloc.source}); {fix}request more edge "
            "nodes or tasks per node (#SBATCH --ntasks-per-node)"
        )
    chunks = _best_chunks(world_size, buffers, tuple(n for _, n in alloc.edge), learners)
    # Hand out actual hosts: each capacity class in allocation order.
    pools: dict[int, list[str]] = {}
    for h, n in alloc.edge:
        pools.setdefault(n, []).append(h)
    lines = [(alloc.cloud, learners)]
    for cap, count in chunks:
        lines.append((pools[cap].pop(0), count))
    return Plan(world_size, buffers, tuple(lines), learners)


def _chunk_score(a: int, b: int, sites: list[tuple[int, int]]) -> tuple[int, int, int, int]:
    """(whole sites, actors next to their buffer, -mixed, -hosts) for ranks [a, b) on one host."""
    whole = coloc = touched = 0
    for s0, s1 in sites:
        lo, hi = max(a, s0), min(b, s1)
        if lo >= hi:
            continue
        touched += 1
        if a <= s0 and s1 <= b:
            whole += 1
        if a <= s0 < b:  # this host holds the site's buffer
            coloc += hi - lo - 1
    return whole, coloc, -(touched > 1), -1


def _best_chunks(
    world_size: int, buffers: int, caps: tuple[int, ...], learners: int = 1
) -> list[tuple[int, int]]:
    """Best split of ranks K..N-1 into contiguous blocks, one per host: [(capacity, count)].

    Dynamic programming over (next rank, hosts left per capacity class). A block ends at a site
    boundary or at its host's capacity: ending anywhere else is never better (extend it).
    """
    sites = _sites(world_size, buffers, learners)
    bounds = sorted({s1 for _, s1 in sites})
    classes = sorted(set(caps), reverse=True)
    counts0 = tuple(caps.count(c) for c in classes)
    n = world_size
    states = 1
    for k in counts0:
        states *= k + 1
    if states * len(bounds) > 200_000 or len(caps) > 400:  # too big to search: fill big first
        out, r = [], learners
        for cap in sorted(caps, reverse=True):
            if r >= n:
                break
            out.append((cap, min(cap, n - r)))
            r += out[-1][1]
        return out

    @cache
    def best(
        r: int, left: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]] | None:
        if r == n:
            return (0, 0, 0, 0), ()
        top: tuple[tuple[int, ...], tuple[tuple[int, int], ...]] | None = None
        for k, cap in enumerate(classes):
            if not left[k]:
                continue
            rest = left[:k] + (left[k] - 1,) + left[k + 1 :]
            ends = {min(r + cap, n)} | {b for b in bounds if r < b <= r + cap}
            for e in sorted(ends, reverse=True):
                sub = best(e, rest)
                if sub is None:
                    continue
                score = tuple(x + y for x, y in zip(_chunk_score(r, e, sites), sub[0], strict=True))
                if top is None or score > top[0]:
                    top = (score, ((cap, e - r),) + sub[1])
        return top

    result = best(learners, counts0)
    best.cache_clear()
    if result is None:  # unreachable: capacity was checked
        raise PlacementError(f"no placement of {n} ranks on edge slots {list(caps)}")
    return list(result[1])


# ---- hostfiles ------------------------------------------------------------------------------


def describe(p: Plan) -> list[str]:
    """One line per host: which ranks and roles it holds."""
    places = p.places
    out, r = [], 0
    width = max(len(h) for h, _ in p.lines)
    for host, count in p.lines:
        block = places[r : r + count]
        ranks = f"rank {r}" if count == 1 else f"ranks {r}-{r + count - 1}"
        parts = []
        n_learners = sum(q.role == LEARNER for q in block)
        if n_learners:
            parts.append("learner" if n_learners == 1 else f"{n_learners} learners")
        for s in sorted({q.site for q in block if q.site >= 0}):
            mine = [q for q in block if q.site == s]
            buf = [q for q in mine if q.role == BUFFER]
            acts = sum(q.role == ACTOR for q in mine)
            what = f"buffer (rank {buf[0].rank})" if buf else ""
            if acts:
                what += (" + " if what else "") + f"{acts} actor{'s' * (acts != 1)}"
            parts.append(f"site {s}: {what}")
        out.append(f"{host:<{width}}  {ranks:<12} {'; '.join(parts)}")
        r += count
    return out


def render(p: Plan, fmt: str = "hydra", source: str = "") -> str:
    """The hostfile text: full-line '#' comments, then one line per host in rank order.

    Hydra rejects a '#' after a host on the same line, so comments stay on lines of their own.
    ``slurm`` is one host per rank and no comments, for ``SLURM_HOSTFILE`` with
    ``srun --distribution=arbitrary``.
    """
    if fmt not in FORMATS:
        raise PlacementError(f"format={fmt!r} is not one of {', '.join(FORMATS)}")
    if fmt == "slurm":
        return "".join(f"{h}\n" for h in p.hosts())
    n_act = p.world_size - p.learners - p.buffers
    who = "1 learner" if p.learners == 1 else f"{p.learners} learners"
    run = (
        f"mpirun -f FILE -n {p.world_size}"
        if fmt == "hydra"
        else f"mpirun --hostfile FILE -np {p.world_size} --map-by slot"
    )
    head = [
        f"# mpirl hostfile ({fmt}): {who} + {p.buffers} buffer(s) + {n_act} actors = "
        f"{p.world_size} ranks; {run}",
        "# ranks fill the hosts in file order; -n must equal the slot total "
        f"({p.world_size}) or ranks wrap back onto the cloud host",
    ]
    if source:
        head.append(f"# from {source}")
    head += [f"#   {line}" for line in describe(p)]
    body = [f"{h}:{n}" if fmt == "hydra" else f"{h} slots={n}" for h, n in p.lines]
    return "\n".join(head + body) + "\n"


_HYDRA_LINE = r"([A-Za-z0-9_.\-]+)(?::(\d+))?"
_OPENMPI_LINE = r"([A-Za-z0-9_.\-]+)(?:\s+slots\s*=\s*(\d+))?(?:\s+max_slots\s*=\s*\d+)?"


def parse_hostfile(text: str) -> list[tuple[str, int]]:
    """Read a Hydra (``host[:slots]``) or Open MPI (``host [slots=N]``) hostfile."""
    out: list[tuple[str, int]] = []
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(_HYDRA_LINE, line) or re.fullmatch(_OPENMPI_LINE, line)
        if not m:
            raise PlacementError(
                f"hostfile line {no} {raw!r} is not 'host:slots' (Hydra) or "
                "'host slots=N' (Open MPI); put comments on lines of their own"
            )
        out.append((m.group(1), int(m.group(2) or 1)))
    if not out:
        raise PlacementError("the hostfile names no host; add lines such as 'cloud1:1'")
    return out


def rank_hosts(entries: Sequence[tuple[str, int]], world_size: int) -> list[str]:
    """The host of each rank as Hydra fills a hostfile: in file order, wrapping around when
    ``-n`` exceeds the slot total (measured with the mpich 5.0.2 wheel)."""
    seq = [h for h, n in entries for _ in range(n)]
    return [seq[r % len(seq)] for r in range(world_size)]


def check_hosts(hosts: Sequence[str], buffers: int, learners: int = 1) -> list[str]:
    """Problems with a rank -> host map for the edge/cloud layout (empty when it fits)."""
    places = layout(len(hosts), buffers, learners)
    out = []
    cloud = set(hosts[:learners])
    shared = [p.rank for p in places[learners:] if hosts[p.rank] in cloud]
    if shared:
        which = "learner's host" if learners == 1 else "learners' hosts"
        out.append(
            f"the {which} {', '.join(sorted(cloud))} also hold(s) ranks {shared}: the "
            "cloud is not alone"
        )
    for s in range(buffers):
        site = [p for p in places if p.site == s]
        apart = [p.rank for p in site[1:] if hosts[p.rank] != hosts[site[0].rank]]
        if apart:
            out.append(
                f"site {s}: actors {apart} are not on their buffer's host "
                f"{hosts[site[0].rank]} (rank {site[0].rank})"
            )
    return out


# ---- CLI ------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m mpirl.placement",
        description="Write a hostfile that puts the learners (ranks 0..K-1) alone on the cloud "
        "host and each site's buffer with its actors on edge hosts. Reads the SLURM "
        "allocation from the environment (plain or heterogeneous job) unless "
        "--nodelist is given.",
    )
    ap.add_argument("--buffers", type=int, default=1, help="edge sites, as mpirl's --buffers")
    ap.add_argument(
        "--learners",
        type=int,
        default=1,
        help="learner ranks on the cloud host, as mpirl's --learners",
    )
    ap.add_argument(
        "--ntasks",
        type=int,
        default=None,
        help="MPI world size (mpirun -n); default: 1 + every edge slot",
    )
    ap.add_argument(
        "--cloud",
        default=None,
        help="the learner's host (default: first node of "
        "the job, or of component 0 in a heterogeneous job)",
    )
    ap.add_argument(
        "--format",
        choices=FORMATS,
        default="hydra",
        help="hydra: 'host:slots' for MPICH mpirun -f; openmpi: 'host slots=N' for "
        "Open MPI mpirun --hostfile; slurm: one host per rank for SLURM_HOSTFILE with "
        "srun --distribution=arbitrary",
    )
    ap.add_argument(
        "--nodelist", default=None, help="hosts by hand instead of SLURM, e.g. 'cloud1,node[01-02]'"
    )
    ap.add_argument(
        "--slots",
        type=int,
        default=None,
        help="tasks per edge host (default: SLURM_TASKS_PER_NODE)",
    )
    ap.add_argument(
        "--check",
        metavar="HOSTFILE",
        default=None,
        help="instead of writing: print the rank -> role -> host map of HOSTFILE "
        "(needs --ntasks) and exit 1 if the layout does not fit edge + cloud",
    )
    ap.add_argument("--json", action="store_true", help="print the plan as JSON instead")
    ap.add_argument(
        "--world-size",
        action="store_true",
        help="print the largest world size the allocation holds with the learner "
        "alone on the cloud host (1 + every edge slot) and exit",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.check:
            return _check(args)
        if args.nodelist is not None:
            if args.slots is None:
                raise PlacementError("--nodelist needs --slots N (tasks per edge host)")
            alloc = allocation_from_nodes(args.nodelist, args.slots, args.cloud)
        else:
            alloc = allocation_from_slurm(cloud=args.cloud, slots=args.slots)
        if args.world_size:
            require_edge(alloc)
            print(args.learners + alloc.edge_slots)
            return 0
        ntasks = args.ntasks if args.ntasks is not None else args.learners + alloc.edge_slots
        p = plan(ntasks, args.buffers, alloc, args.learners)
    except (PlacementError, LayoutError) as e:
        sys.stderr.write(f"mpirl.placement: error: {e}\n")
        return 2
    if args.json:
        print(
            json.dumps(
                {
                    "world_size": p.world_size,
                    "buffers": p.buffers,
                    "learners": p.learners,
                    "lines": p.lines,
                    "hosts": p.hosts(),
                }
            )
        )
    else:
        sys.stdout.write(render(p, args.format, alloc.source))
    sys.stderr.write(
        f"mpirl.placement: {p.world_size} ranks on {len(p.lines)} hosts "
        f"(learner on {alloc.cloud}); problems: "
        f"{'; '.join(check_hosts(p.hosts(), p.buffers, p.learners)) or 'none'}\n"
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    try:
        with open(args.check) as f:
            entries = parse_hostfile(f.read())
    except OSError as e:
        raise PlacementError(
            f"hostfile {args.check!r} cannot be read ({e.strerror}); pass an "
            "existing file to --check"
        ) from None
    total = sum(n for _, n in entries)
    n = args.ntasks if args.ntasks is not None else total
    hosts = rank_hosts(entries, n)
    try:
        places = layout(n, args.buffers, args.learners)
    except LayoutError as e:
        raise PlacementError(str(e)) from None
    for p_, h in zip(places, hosts, strict=True):
        site = "-" if p_.site < 0 else str(p_.site)
        print(f"{p_.rank:>5}  {p_.role:<7}  {site:>4}  {h}")
    problems = check_hosts(hosts, args.buffers, args.learners)
    if n > total:
        problems.insert(
            0,
            f"ntasks={n} but the hostfile has {total} slots: ranks wrap back "
            f"onto the first hosts; pass -n {total} or add slots",
        )
    elif n < total:
        print(
            f"mpirl.placement: note: ntasks={n} leaves {total - n} of {total} slots empty",
            file=sys.stderr,
        )
    for msg in problems:
        print(f"mpirl.placement: {msg}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
