"""Group an experiment's runs into cells, and a cell's runs into its placements' seeds.

A **cell** is one combination of the experiment's axes other than the placement; its runs are
split by **placement** (``replay_at``: ``learner`` first, then ``buffer``), and the runs of a
placement are its seeds, paired across placements by ``seed``. The axes are either

- the **link keys** (``by="link"``, the profile report): config ``env``, ``link`` and the overrides
  ``latency_ms``, ``bandwidth_mbps``, ``jitter_ms``, ``link_change`` when set; a cell of these axes
  is a *link profile*. A config key (other than seeds, budgets, output settings and the link keys)
  that differs between runs of one placement splits it into variants (``inflight=1``, ...); or
- the **sweep's axes** (``by="sweep"``, the paper report): the folder names
  ``OUT/<axis>=<v>,<axis>=<v>/seed<k>`` of mpirl.sweep (``replay_at=...`` dropped), or, for run
  folders without ``=`` in their names, the config keys that differ between runs (placement-only
  and output settings left out); no variants.

Cells come in the order of their axes' values, numbers numerically (`analysis.tables.sort_key`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analysis.runs import Run
from analysis.tables import PAPER_TERM, sort_key

__all__ = [
    "LINK_KEYS",
    "PAPER_TERM",
    "Cell",
    "Group",
    "cell_label",
    "cell_of",
    "group",
    "link_label",
    "slugify",
]

Key = tuple[tuple[str, str], ...]
LINK_KEYS = ("env", "link", "latency_ms", "bandwidth_mbps", "jitter_ms", "link_change")
# Keys that never split runs into groups: seeds, budgets, output and logging settings.
NOT_A_VARIANT = {
    "seed",
    "run_dir",
    "config",
    "max_env_steps",
    "max_seconds",
    "max_updates",
    "target_return",
    "progress_seconds",
    "flush_seconds",
    "torch_threads",
    "replay_at",
    *LINK_KEYS,
}
# Settings that only one placement has: they neither split cells nor tell placements apart.
PLACEMENT_ONLY = {
    "inflight",
    "max_staleness",
    "forward_chunk",
    "forward_credits",
    "forward_overflow",
}
ORDER = {"learner": 0, "buffer": 1}


@dataclass
class Group:
    """The seeds of one placement (variant) in one cell."""

    label: str  # e.g. "existing (replay_at=learner)"
    replay_at: str
    runs: list[Run]
    metrics: list[dict[str, Any]] = field(default_factory=list)  # per run, `run_metrics`

    def values(self, key: str) -> np.ndarray:
        return np.array(
            [float(m[key]) if m.get(key) is not None else np.nan for m in self.metrics], "f8"
        )

    def mean(self, key: str) -> float:
        v = self.values(key)
        v = v[np.isfinite(v)]
        return float(np.mean(v)) if len(v) else float("nan")


@dataclass
class Cell:
    """One cell: its axes' values, its placement groups; what a report adds about it."""

    key: Key
    label: str
    slug: str
    groups: list[Group]
    warnings: list[str] = field(default_factory=list)
    table: str = ""  # the profile report's table
    plots: dict[str, Path] = field(default_factory=dict)
    ratios: dict[str, Any] = field(default_factory=dict)  # the paper report: metric -> Ratio
    ttt: dict[str, Any] = field(default_factory=dict)  # replay_at -> stats.TimeToTarget
    budget_s: float = float("nan")
    decision: Any = None
    crossover: dict[str, str] = field(default_factory=dict)

    @property
    def runs(self) -> list[Run]:
        return [r for g in self.groups for r in g.runs]

    def at(self, replay_at: str) -> list[dict[str, Any]]:
        """The per-run metrics of every run of one placement."""
        return [m for g in self.groups if g.replay_at == replay_at for m in g.metrics]


def _fmt_key(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


SLUG_MAX = 100  # characters: a file name (with its prefix and suffix) stays under 255 bytes


def slugify(s: str) -> str:
    """A file-name part for a label: runs of other characters than letters, digits and dots
    become ``-``, lower case; a longer one keeps its first ``SLUG_MAX - 9`` characters and a
    hash of the whole (labels of many varying keys would exceed the file system's limit)."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", s).strip("-").lower() or "profile"
    if len(slug) <= SLUG_MAX:
        return slug
    return f"{slug[: SLUG_MAX - 9].rstrip('-')}-{hashlib.sha1(slug.encode()).hexdigest()[:8]}"


def link_label(key: Key) -> str:
    """``CartPole-v1, link wan-1g-10ms, latency_ms=5``: the link keys that are set."""
    d = dict(key)
    parts = [d["env"], f"link {d['link']}"]
    parts += [f"{k}={d[k]}" for k in LINK_KEYS[2:] if d[k] != "None"]
    return ", ".join(parts)


def cell_label(cell: Key) -> str:
    return ", ".join(f"{k}={v}" for k, v in cell) or "all runs"


def cell_of(run: Run, root: Path) -> Key | None:
    """The cell from the sweep's folder names (None when no folder of the path has ``k=v``)."""
    try:
        parts = run.path.resolve().relative_to(root.resolve()).parts
    except ValueError:
        parts = run.path.parts
    pairs = []
    for part in parts:
        for item in part.split(","):
            k, eq, v = item.partition("=")
            if eq and k != "replay_at":
                pairs.append((k, v))
    return tuple(pairs) if any("=" in p for p in parts) else None


def _sweep_keys(runs: list[Run], root: Path) -> dict[int, Key]:
    keys = {id(r): cell_of(r, root) for r in runs}
    if all(v is not None for v in keys.values()):
        return keys
    names = sorted(
        {k for r in runs for k in r.config} - NOT_A_VARIANT - PLACEMENT_ONLY - {"reference_set"}
    )
    varying = [k for k in names if len({_fmt_key(r.config.get(k)) for r in runs}) > 1]
    return {id(r): tuple((k, _fmt_key(r.config.get(k))) for k in varying) for r in runs}


def _placement_groups(runs: list[Run], variants: bool) -> tuple[list[Group], dict]:
    """The groups of one cell (placement, then variant), and each placement's fixed keys."""
    placements: dict[str, list[Run]] = {}
    for r in runs:
        placements.setdefault(r.replay_at, []).append(r)
    groups, fixed = [], {}
    for place in sorted(placements, key=lambda p: (ORDER.get(p, 2), p)):
        rs = placements[place]
        keys = sorted({k for r in rs for k in r.config} - NOT_A_VARIANT) if variants else []
        varying = [k for k in keys if len({_fmt_key(r.config.get(k)) for r in rs}) > 1]
        fixed[place] = {k: _fmt_key(rs[0].config.get(k)) for k in keys if k not in varying}
        by_variant: dict[tuple, list[Run]] = {}
        for r in rs:
            by_variant.setdefault(tuple(_fmt_key(r.config.get(k)) for k in varying), []).append(r)
        for vkey in sorted(by_variant):
            name = f"{PAPER_TERM.get(place, place)} (replay_at={place}"
            name += "".join(f", {k}={v}" for k, v in zip(varying, vkey, strict=True)) + ")"
            seeds = sorted(by_variant[vkey], key=lambda r: (str(r.seed), str(r.path)))
            groups.append(Group(name, place, seeds))
    return groups, fixed


def _warnings(groups: list[Group], fixed: dict[str, dict[str, str]]) -> list[str]:
    """Placements that differ in more than ``replay_at``, repeated seeds, unfinished runs."""
    out = []
    if len(fixed) > 1:
        (pa, a), (pb, b) = list(fixed.items())[:2]
        diff = [k for k in sorted(a.keys() & b.keys()) if a[k] != b[k] and k not in PLACEMENT_ONLY]
        if diff:
            out.append(
                "the placements also differ in "
                + ", ".join(f"{k} ({pa}: {a[k]}, {pb}: {b[k]})" for k in diff)
            )
    for g in groups:
        seeds = [r.seed for r in g.runs]
        if len(set(map(str, seeds))) < len(seeds):
            out.append(f"{g.label}: repeated seeds {seeds}")
        unfinished = [r.path.name for r in g.runs if not r.finished]
        if unfinished:
            out.append(
                f"{g.label}: unfinished (live or killed) runs, summary derived "
                f"from the streams: {', '.join(unfinished)}"
            )
    return out


def group(runs: list[Run], root: Path | None = None, by: str = "link") -> list[Cell]:
    """Runs -> cells (axes: ``by`` = "link" or "sweep", see the module docstring) -> placement
    groups (``learner`` first), seeds within a group."""
    if by == "link":
        keys = {id(r): tuple((k, _fmt_key(r.config.get(k))) for k in LINK_KEYS) for r in runs}
    elif by == "sweep":
        keys = _sweep_keys(runs, Path(root) if root is not None else Path("."))
    else:
        raise ValueError(f"by={by!r} must be 'link' or 'sweep'")
    by_key: dict[Key, list[Run]] = {}
    for r in runs:
        by_key.setdefault(keys[id(r)], []).append(r)
    cells, slugs = [], set()
    for key in sorted(by_key, key=lambda k: [sort_key(v) for _, v in k]):
        label = link_label(key) if by == "link" else cell_label(key)
        slug = slugify(label)
        while slug in slugs:
            slug += "-x"
        slugs.add(slug)
        groups, fixed = _placement_groups(by_key[key], variants=by == "link")
        cells.append(Cell(key, label, slug, groups, _warnings(groups, fixed)))
    return cells
