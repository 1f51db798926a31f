"""Numbers as the reports print them, the markdown table, and the per-run CSV rows every report
writes or reads.

Numbers (`num`): 3 significant digits, an integer with thousands separators from 1,000 on,
scientific notation from 10**9 on (an interval at n = 2 has one degree of freedom and can end at
``2.9e+21``, which reads better than 22 digits); the reports of run folders keep trailing zeros
and print NaN and None as ``n/a``, docs/results.md's generated sections drop them and print ``-``
(`brief`). Byte counts in B/kB/MB/GB with the same digits (`nbytes`).

Per-run rows: one dict per run; `field` writes a value into a CSV, `read_rows` reads the rows
back with numbers as floats (NaN for a blank), `by_cell` groups them into cells of paired seeds
for `analysis.stats`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "PAPER_TERM",
    "brief",
    "by_cell",
    "field",
    "md_table",
    "nbytes",
    "num",
    "read_rows",
    "sort_key",
    "value",
    "write_csv",
]

# The paper's name of each placement (replay_at): for report text only.
PAPER_TERM = {"learner": "existing", "buffer": "proposed"}


def num(v: float | None, digits: int = 3, *, pad: bool = True, missing: str = "n/a") -> str:
    """``v`` to ``digits`` significant digits, an integer with thousands separators from
    10**digits on, scientific notation (``2.9e+21``) from 10**9 on. ``pad``: fixed decimals that
    keep trailing zeros (``1.50``); otherwise Python's ``g`` format (``1.5``). None, NaN and inf
    print as ``missing``."""
    if v is None or not np.isfinite(v):
        return missing
    a = abs(v)
    if a >= 1e9:
        return f"{v:.{digits}g}"
    if a >= 10**digits:
        return f"{v:,.0f}"
    if not pad:
        return f"{v:.{digits}g}"
    if a == 0:
        return "0"
    dec = max(0, digits - 1 - math.floor(math.log10(a)))
    return f"{v:.{dec}f}"


#: `num` as docs/results.md's generated sections print numbers: ``1.5``, ``-`` for none
brief = partial(num, pad=False, missing="-")


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


def value(v: str) -> float | str:
    """One CSV field of a per-run row: a number as a float, a blank as NaN, other text as is."""
    if v == "":
        return math.nan
    try:
        return float(v)
    except ValueError:
        return v


def field(v: Any) -> str:
    """One CSV field of a per-run row as `analysis.export` writes it (`value` reads it back): a
    float to 6 significant digits, NaN and None blank, a bool as 0 or 1."""
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return "" if v is None else str(v)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The per-run rows of a committed CSV (`value` for every field), in the file's order."""
    with Path(path).open(newline="") as f:
        return [{k: value(v) for k, v in r.items()} for r in csv.DictReader(f)]


def by_cell(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[int, dict]]]:
    """``{cell: {"learner": {seed: row}, "buffer": {seed: row}, ...}}``, cells in the rows'
    order: one side per ``replay_at`` (``learner`` and ``buffer`` always there, ``thinned``
    where a cell ran it), so a third placement's rows never pose as one of the two."""
    out: dict[str, dict[str, dict[int, dict]]] = {}
    for r in rows:
        sides = out.setdefault(r["cell"], {"learner": {}, "buffer": {}})
        sides.setdefault(str(r["replay_at"]), {})[int(r["seed"])] = r
    return out
