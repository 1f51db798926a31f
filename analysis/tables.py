"""Numbers as the reports print them, the markdown table and the CSV writer of every report.

Numbers: 3 significant digits, thousands separated from 1,000 on (`num`); byte counts in
B/kB/MB/GB with the same digits (`nbytes`); NaN and None print as ``n/a``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PAPER_TERM", "md_table", "nbytes", "num", "sort_key", "write_csv"]

# The paper's name of each placement (replay_at): for report text only.
PAPER_TERM = {"learner": "existing", "buffer": "proposed"}


def num(v: float | None, digits: int = 3) -> str:
    """``v`` to ``digits`` significant digits (integers from 1,000 on, with separators)."""
    if v is None or not np.isfinite(v):
        return "n/a"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a == 0:
        return "0"
    dec = max(0, digits - 1 - math.floor(math.log10(a)))
    return f"{v:.{dec}f}"


def nbytes(v: float | None) -> str:
    """A byte count in GB, MB, kB or B (`num` digits)."""
    if v is None or not np.isfinite(v):
        return "n/a"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= f:
            return f"{num(v / f)} {unit}"
    return f"{num(v)} B"


def md_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table: the header, its rule, one line per row (cells joined by `` | ``)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, rows: list[dict[str, Any]], fields: Sequence[str] | None = None) -> None:
    """``rows`` into ``path`` (nothing when there are none); the columns: ``fields``, else every
    key in the order of first appearance."""
    if not rows:
        return
    keys = list(fields) if fields is not None else list(dict.fromkeys(k for m in rows for k in m))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def sort_key(v: str) -> tuple[int, float, str]:
    """Numbers first, in numeric order, then the other strings in their order."""
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, v)
