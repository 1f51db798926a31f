"""Where should the replay memory live on my link?  ``python -m mpirl.advise``: a pure model, no
MPI.  ``--replay-at auto`` (mpirl.wiring.resolve_replay_at) asks the same question at start.

    python -m mpirl.advise --link-mbps 1.25 --latency-ms 30 --production 12000 \\
        --updates-per-s 187.5 --batch 64 --env CartPole-v1 [--json]
    python -m mpirl.advise --run-dir RUN          # inputs from a run's files

**The bytes rule** (docs/results.md; the bytes per transition as experiments/link_bytes.py
measures them, computed here from the wire's layouts, mpirl.transport.wire).  With the memory
at the learner every produced transition crosses the link once, P x F bytes/s toward the learner
(F: a FORWARD transition: the record and its initial priority, plus the message header over
``forward_chunk`` transitions); the link delivers the fraction min(1, capacity / demand) of
them.  With the memory in the buffer every update ships a sampled batch, U x B x S bytes/s (S: a
BATCH transition: the record, index, generation, weight and priority, plus the header and the
window slot over B), and U x B x R bytes/s of priority updates come back; the learner achieves
the fraction min(1, capacity / demand) of its update rate U.  A placement is **capped** when it
keeps less than `CAPPED_BELOW` of its demand (an emulated link delivers ~99.6% of a demand equal
to its rate).  Latency does not enter the rule: the committed map held it at 30 ms.

**The decision** follows the committed evidence (docs/results.md, family U):

1. the link carries both placements: no return or time-to-target difference was shown in any
   such cell, so choose the one with **fewer link bytes** toward the learner;
2. the link caps one placement: choose **the other** (the existing placement won every test
   where the proposed one was capped);
3. the link caps both: choose **the replay at the learner**.  Every committed cell where both
   were capped (1.25 Mb/s at rho 0.25, 1 and 4; 5 Mb/s at rho 1 and 4) favoured it or showed
   no difference: it keeps its update rate and loses fresh data, while the buffer placement
   loses updates.  (The bytes rule alone would choose the one that keeps more of its demand;
   at 1.25 Mb/s, rho 0.25 that is the buffer placement, and the data disagree.)

**The third placement** (``--replay-at thinned``, docs/design.md "A third placement") is
predicted beside the two and never advised: its learning has no committed evidence yet (the
pre-registered comparison, experiments/placement-3/plan.md, has not run).  It forwards the
fraction ``b = min(1, RHO_SHARE x rho, LINK_SHARE x capacity / demand)`` of the experiences,
each with its one-byte ``f`` (mpirl.roles.placements.thinned), so it asks for P x (F + 1) x b
bytes/s and is never capped by the link: it thins instead.

**How sure**: the nearest committed cell (cells A, B and the 9-cell crossover map: CartPole,
12,000 env steps/s) by the link loads of the two placements (demand / capacity, which is the
link rate and rho = U x B / P in CartPole units), and the placement the committed data favour
there: family U's winner on return or time to target, else on return per link MB (read from
docs/results.md's generated table, itself generated from runs.csv), else the one with fewer mean
link MB in ``docs/results/data/equal-time/runs.csv``.  **measured**: both loads lie inside the
map's range and that cell favours the advised placement; **extrapolated** otherwise.  Without
the committed files (an installed package without docs/), the advice rests on the bytes rule
alone and says so.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpirl.agent import frames as frames_mod
from mpirl.agent.envs import inspect
from mpirl.errors import ConfigError
from mpirl.roles.placements.thinned import LINK_SHARE, RHO_SHARE
from mpirl.run.config import Config
from mpirl.transport.link import PROFILES
from mpirl.transport.wire import HEADER, transition_dtype

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MAP_CSV = ROOT / "docs" / "results" / "data" / "equal-time" / "runs.csv"
RESULTS_MD = ROOT / "docs" / "results.md"
CELLS_TOML = ROOT / "experiments" / "equal-time"
#: a placement keeping less than this of its demand is capped by the link
CAPPED_BELOW = 0.95
#: the committed map's env: its cells' loads are computed with its bytes
MAP_ENV = "CartPole-v1"
#: the cells that compare both placements at the same rates (C is a one-arm control, M another
#: env whose frames the CartPole loads do not describe)
MAP_SKIP = ("cell=C", "cell=M")
LEARNER, BUFFER, THINNED = "learner", "buffer", "thinned"
NAMES = {
    LEARNER: "replay at the learner (existing)",
    BUFFER: "replay in the buffer (proposed)",
    THINNED: "thinned at the edge (new; not advised: no evidence yet)",
}


@dataclass(frozen=True)
class Bytes:
    """Bytes per transition on the link: FORWARD (toward the learner, replay at the learner),
    BATCH (toward the learner, replay in the buffer), PRIORITIES (back, replay in the buffer)."""

    forward: float
    batch: float
    priorities: float
    source: str


def record_bytes(obs_shape: tuple[int, ...], obs_dtype: Any) -> int:
    """One record on the wire: obs, action i8, reward f4, next_obs, discount f4."""
    return int(transition_dtype(tuple(obs_shape), obs_dtype).itemsize)


def transition_bytes(record: int, batch: int, chunk: int, source: str) -> Bytes:
    """The wire's layouts (mpirl.transport.wire) per transition, uncompressed."""
    h = HEADER.itemsize
    return Bytes(
        forward=record + 4 + h / chunk,  # td_abs f4; one header per forward_chunk
        batch=record + 8 + 8 + 4 + 4 + (h + 8) / batch,  # indices, generations, weights,
        # priorities; header and window i8[1] per batch
        priorities=8 + 8 + 4 + (h + 16) / batch,  # indices, generations, td_abs; timing f8[2]
        source=source,
    )


def env_bytes(env_id: str, batch: int, chunk: int | None = None) -> Bytes:
    """Bytes per transition of ``env_id`` (made once, as every run does).  Image envs: the
    frame-index record plus the frames, uncompressed (an upper bound with --compress; measure
    with experiments/link_bytes.py and pass --forward-bytes / --batch-bytes)."""
    cfg = Config(env=env_id)
    chunk = cfg.forward_chunk if chunk is None else chunk
    spec = inspect(env_id)
    if not spec.image:
        rec = record_bytes(spec.obs_shape, spec.obs_dtype)
        return transition_bytes(rec, batch, chunk, f"{env_id}: wire layout, {rec} B records")
    assert spec.frame_shape is not None  # image envs have one
    frame = int(np.prod(spec.frame_shape))
    rec = frames_mod.record_dtype(spec.stack).itemsize
    fpt = frames_mod.frames_per_transition(
        spec.stack, cfg.n_step, cfg.envs_per_actor, cfg.actor_chunk
    )
    per_sample = min(2 * spec.stack, spec.stack + cfg.n_step)  # frames a sampled one needs
    b = transition_bytes(rec, batch, chunk, "")
    return Bytes(
        forward=b.forward + fpt * frame,
        batch=b.batch + per_sample * frame,
        priorities=b.priorities,
        source=f"{env_id}: frames uncompressed ({frame} B each), an upper bound",
    )


@dataclass(frozen=True)
class Inputs:
    link_mbps: float  # inf: unlimited
    latency_ms: float
    production: float  # env steps/s of all actors (P)
    updates_per_s: float  # U
    batch: int  # B
    bytes: Bytes
    notes: tuple[str, ...] = ()

    @property
    def rho(self) -> float:
        return self.updates_per_s * self.batch / self.production


@dataclass(frozen=True)
class Prediction:
    placement: str
    demand_Bps: float  # bytes/s toward the learner the placement asks for
    link_Bps: float  # what crosses: min(demand, capacity)
    back_Bps: float  # bytes/s of priority updates back (the buffer placement)
    fraction: float  # delivered fraction (learner) or achieved update rate fraction (buffer)
    capped: bool

    @property
    def what(self) -> str:
        return {
            LEARNER: "delivered fraction",
            BUFFER: "update rate fraction",
            THINNED: "forwarded fraction",
        }[self.placement]


def predict(inp: Inputs) -> dict[str, Prediction]:
    """The bytes rule for both placements, and the thinned placement's budget beside them
    (module docstring)."""
    cap = inp.link_mbps * 1e6 / 8
    out = {}
    for where, demand, back_per_s in (
        (LEARNER, inp.production * inp.bytes.forward, 0.0),
        (BUFFER, inp.updates_per_s * inp.batch * inp.bytes.batch, inp.bytes.priorities),
    ):
        frac = min(1.0, cap / demand) if demand > 0 else 1.0
        back = back_per_s * inp.updates_per_s * inp.batch * frac
        out[where] = Prediction(
            where, demand, demand * frac, back, frac, capped=frac < CAPPED_BELOW
        )
    out[THINNED] = predict_thinned(inp)
    return out


def predict_thinned(inp: Inputs) -> Prediction:
    """``--replay-at thinned``: the budget b its edge forwards (the rho-budget and the
    link-budget of mpirl.roles.placements.thinned) and the bytes that takes; it thins rather
    than queue, so it is not capped."""
    cap = inp.link_mbps * 1e6 / 8
    per = inp.bytes.forward + 1.0  # each forwarded one carries its f code, one byte
    full = inp.production * per
    b = min(1.0, RHO_SHARE * inp.rho, LINK_SHARE * cap / full if full > 0 else 1.0)
    return Prediction(THINNED, full * b, full * b, 0.0, b, capped=False)


def decide(pred: dict[str, Prediction]) -> tuple[str, str]:
    """(placement, why): the decision of the module docstring."""
    lp, bp = pred[LEARNER], pred[BUFFER]
    if not lp.capped and not bp.capped:
        pick = LEARNER if lp.demand_Bps <= bp.demand_Bps else BUFFER
        other = bp if pick == LEARNER else lp
        mine = lp if pick == LEARNER else bp
        return pick, (
            f"the link carries both placements, where the committed runs showed no return or "
            f"time difference, so the one with fewer link bytes "
            f"({_rate(mine.demand_Bps)} against {_rate(other.demand_Bps)})"
        )
    if lp.capped and bp.capped:
        return LEARNER, (
            f"the link caps both (the learner would get {lp.fraction:.0%} of the experiences, "
            f"the buffer placement {bp.fraction:.0%} of its updates); where both were capped "
            "the committed runs favoured the replay at the learner or showed no difference: "
            "it keeps its update rate and loses fresh data, the other loses updates"
        )
    if bp.capped:
        return LEARNER, (
            f"the link caps the buffer placement at {bp.fraction:.0%} of its update rate and "
            f"carries the experiences ({lp.fraction:.0%} delivered); the existing placement "
            "won every committed test where the proposed one was capped"
        )
    return BUFFER, (
        f"the link caps the learner placement at {lp.fraction:.0%} of the experiences and "
        f"carries the sampled batches ({bp.fraction:.0%} of the update rate)"
    )


def _rate(bps: float) -> str:
    """Bytes/s in words (Mb/s on the wire)."""
    return f"{bps * 8 / 1e6:.3g} Mb/s"


# --- the committed map --------------------------------------------------------------------------


@dataclass
class Cell:
    """One committed cell: its link and rates, per placement its mean link MB, AUC and kept
    fraction over its runs, and the placement its data favour (and why)."""

    name: str
    link_mbps: float
    production: float
    updates_per_s: float
    batch: int
    runs: dict[str, int] = field(default_factory=dict)
    link_mb: dict[str, float] = field(default_factory=dict)
    auc_return: dict[str, float] = field(default_factory=dict)
    fraction: dict[str, float] = field(default_factory=dict)
    favoured: str = ""
    why: str = ""

    @property
    def rho(self) -> float:
        return self.updates_per_s * self.batch / self.production


def _cell_link_mbps(name: str, toml_dir: Path) -> float | None:
    """A cell's link rate: in its name (the map's axis) or its spec (cells A, B)."""
    m = re.search(r"bandwidth_mbps=([0-9.]+)", name)
    if m:
        return float(m.group(1))
    letter = re.fullmatch(r"cell=(\w+)", name)
    spec = toml_dir / f"{letter.group(1)}.toml" if letter else None
    if spec is None or not spec.is_file():
        return None
    flags = tomllib.loads(spec.read_text()).get("flags", {})
    if flags.get("bandwidth_mbps") is not None:
        return float(flags["bandwidth_mbps"])
    profile = PROFILES.get(flags.get("link", "none"), PROFILES["none"])
    return profile.rate_bps / 1e6


def _family_u(results_md: Path) -> dict[str, tuple[str, str]]:
    """cell -> (placement, outcome) of family U's generated table in docs/results.md: the
    winner on return AUC or time to target, else on return per MB; cells with no winner are
    left out."""
    if not results_md.is_file():
        return {}
    text = results_md.read_text()
    if "**Where should the replay memory live?**" not in text:
        return {}
    table = text.split("**Where should the replay memory live?**", 1)[1].split("\n\n", 2)[1]
    out: dict[str, tuple[str, str]] = {}
    for line in table.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) != 4 or cols[0] in ("cell", "---"):
            continue
        for col, outcome in ((1, "return AUC"), (2, "time to target"), (3, "return per MB")):
            won = re.match(r"\*\*(existing|proposed)\*\*", cols[col])
            if won and (col < 3 or cols[0] not in out):
                where = LEARNER if won.group(1) == "existing" else BUFFER
                out.setdefault(cols[0], (where, f"family U: {won.group(1)} wins {outcome}"))
    return out


def load_map(
    csv_path: Path = MAP_CSV, results_md: Path = RESULTS_MD, toml_dir: Path = CELLS_TOML
) -> list[Cell] | None:
    """The committed cells with both placements (None: no committed data here)."""
    if not csv_path.is_file():
        return None
    rows: dict[str, dict[str, list[dict[str, str]]]] = {}
    with csv_path.open(newline="") as f:
        for r in csv.DictReader(f):
            if r["cell"] not in MAP_SKIP:
                rows.setdefault(r["cell"], {}).setdefault(r["replay_at"], []).append(r)
    verdicts = _family_u(results_md)
    cells = []
    for name, by in sorted(rows.items()):
        rate = _cell_link_mbps(name, toml_dir)
        if rate is None or set(by) != {LEARNER, BUFFER}:
            continue
        ref = by[BUFFER][0]
        cell = Cell(name, rate, float(ref["P_requested"]), float(ref["U_requested"]), 64)
        for where, rs in by.items():
            cell.runs[where] = len(rs)
            cell.link_mb[where] = _mean(rs, "link_mb")
            cell.auc_return[where] = _mean(rs, "auc_return")
            cell.fraction[where] = (
                _mean(rs, "delivered_fraction")
                if where == LEARNER
                else _mean(rs, "U") / float(ref["U_requested"])
            )
        fewer = min((LEARNER, BUFFER), key=lambda w: cell.link_mb[w])
        cell.favoured, cell.why = verdicts.get(
            name, (fewer, "no difference shown on return or time; fewer mean link MB")
        )
        cells.append(cell)
    return cells


def _mean(rows: list[dict[str, str]], key: str) -> float:
    vals = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return sum(vals) / len(vals) if vals else float("nan")


def _loads(inp: Inputs) -> tuple[float, float]:
    """log2 of each placement's demand / link capacity: the map's coordinates."""
    p = predict(inp)
    cap = inp.link_mbps * 1e6 / 8
    return tuple(  # type: ignore[return-value]
        math.log2(max(p[w].demand_Bps / cap, 1e-12)) for w in (LEARNER, BUFFER)
    )


def nearest(cells: list[Cell], inp: Inputs, cell_bytes: Bytes) -> tuple[Cell, float, bool]:
    """The cell nearest to ``inp`` by the two link loads, its distance (log2 units) and whether
    ``inp`` lies inside the map's range of loads."""
    at = {
        id(c): _loads(Inputs(c.link_mbps, 30.0, c.production, c.updates_per_s, c.batch, cell_bytes))
        for c in cells
    }
    me = _loads(inp)
    best = min(cells, key=lambda c: math.dist(me, at[id(c)]))
    inside = all(
        min(v[i] for v in at.values()) <= me[i] <= max(v[i] for v in at.values()) for i in (0, 1)
    )
    return best, math.dist(me, at[id(best)]), inside


# --- the advice ---------------------------------------------------------------------------------


def advise(inp: Inputs, cells: list[Cell] | None, cell_bytes: Bytes | None = None) -> dict:
    """The advice as a JSON-able dict: the inputs, both predictions, the choice and why, and how
    sure (the nearest committed cell)."""
    pred = predict(inp)
    pick, why = decide(pred)
    out: dict[str, Any] = {
        "replay_at": pick,
        "why": why,
        "inputs": {**asdict(inp), "rho": inp.rho, "notes": list(inp.notes)},
        "predictions": {
            w: {**asdict(p), "what": p.what, "link_mbps": p.link_Bps * 8 / 1e6}
            for w, p in pred.items()
        },
    }
    if not cells:
        out["confidence"] = "bytes rule only"
        out["evidence"] = None
        out["sentence"] = (
            f"Use --replay-at {pick}: {why}. (The committed map is not available here: this "
            "rests on the bytes rule alone.)"
        )
        return out
    cell_bytes = cell_bytes or env_bytes(MAP_ENV, 64)
    cell, dist, inside = nearest(cells, inp, cell_bytes)
    agrees = cell.favoured == pick
    out["confidence"] = "measured" if inside and agrees else "extrapolated"
    out["evidence"] = {
        "cell": cell.name,
        "link_mbps": cell.link_mbps,
        "rho": cell.rho,
        "distance_log2": dist,
        "inside_map": inside,
        "favoured": cell.favoured,
        "because": cell.why,
        "agrees": agrees,
        "runs": cell.runs,
        "link_mb": cell.link_mb,
        "auc_return": cell.auc_return,
        "fraction": cell.fraction,
    }
    where = "inside the map" if inside else "outside the map's range"
    verdict = "favoured it" if agrees else f"favoured --replay-at {cell.favoured}"
    out["sentence"] = (
        f"Use --replay-at {pick}: {why}. {out['confidence'].capitalize()}: the nearest "
        f"committed cell ({cell.name}: {cell.link_mbps:g} Mb/s, rho {cell.rho:g}; {where}) "
        f"{verdict} ({cell.why})."
    )
    return out


def format_advice(a: dict) -> str:
    """The human-readable table and the sentence."""
    i = a["inputs"]
    lines = [
        f"link {i['link_mbps']:g} Mb/s, {i['latency_ms']:g} ms; P {i['production']:,.0f} env "
        f"steps/s, U {i['updates_per_s']:g} updates/s, batch {i['batch']}, rho {i['rho']:.3g}",
        f"bytes per transition: forwarded {i['bytes']['forward']:.1f}, sampled "
        f"{i['bytes']['batch']:.1f}, priorities back {i['bytes']['priorities']:.1f} "
        f"({i['bytes']['source']})",
        *(f"note: {n}" for n in i["notes"]),
        "",
        "| placement | toward the learner (demand) | back | kept | capped |",
        "|---|---|---|---|---|",
    ]
    for w, p in a["predictions"].items():
        lines.append(  # (thinned's "kept": the fraction its edge forwards, by design)
            f"| {NAMES[w]} | {p['link_mbps']:.3g} Mb/s ({_rate(p['demand_Bps'])}) | "
            f"{_rate(p['back_Bps'])} | {p['what']} {p['fraction']:.3g} | "
            f"{'yes' if p['capped'] else 'no'} |"
        )
    ev = a["evidence"]
    if ev is not None:
        lines.append(
            f"\nnearest committed cell {ev['cell']} ({ev['runs'][LEARNER]} + "
            f"{ev['runs'][BUFFER]} runs): link MB existing {ev['link_mb'][LEARNER]:.3g}, "
            f"proposed {ev['link_mb'][BUFFER]:.3g}; return AUC {ev['auc_return'][LEARNER]:.0f} / "
            f"{ev['auc_return'][BUFFER]:.0f}; existing delivered {ev['fraction'][LEARNER]:.2f}, "
            f"proposed held {ev['fraction'][BUFFER]:.2f} of its U"
        )
    lines += ["", a["sentence"]]
    return "\n".join(lines)


# --- inputs -------------------------------------------------------------------------------------


def from_run(run_dir: Path) -> dict[str, Any]:
    """The advisor's inputs from a run folder: its config (learner.h5's config_json) and its
    achieved P and U (medians of /progress over the run's last 90%)."""
    with h5py.File(run_dir / "learner.h5", "r") as f:
        cfg = json.loads(f.attrs["config_json"])
        prog = f["progress"]
        t = prog["t"][:]
        keep = t >= 0.1 * (t.max() if len(t) else 0.0)
        p = float(np.median(prog["env_steps_per_s"][:][keep])) if keep.any() else 0.0
        u = float(np.median(prog["updates_per_s"][:][keep])) if keep.any() else 0.0
    profile = PROFILES.get(cfg.get("link", "none"), PROFILES["none"])
    rate = cfg.get("bandwidth_mbps") or profile.rate_bps / 1e6
    lat = cfg.get("latency_ms")
    out = {
        "env": cfg.get("env", MAP_ENV),
        "batch": int(cfg.get("batch_size", 64)),
        "production": p,
        "updates_per_s": u,
        "link_mbps": rate,
        "latency_ms": profile.latency_s * 1e3 if lat is None else lat,
        "replay_at": cfg.get("replay_at"),
    }
    summary = run_dir / "summary.json"
    if summary.is_file():
        out["summary"] = json.loads(summary.read_text())
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m mpirl.advise",
        description="Which placement of the replay memory for my link and rates "
        "(the bytes rule and the committed map; docs/results.md).",
    )
    ap.add_argument("--run-dir", help="read the inputs from a run folder (flags override)")
    ap.add_argument("--link-mbps", type=float, help="link rate toward the learner, Mbit/s")
    ap.add_argument("--latency-ms", type=float, help="one-way latency, ms (reported only)")
    ap.add_argument("--production", type=float, help="env steps/s of all actors (P)")
    ap.add_argument("--updates-per-s", type=float, help="learner updates/s (U)")
    ap.add_argument("--batch", type=int, help="batch size B (default 64)")
    ap.add_argument("--env", help="env id: bytes per transition from its observations")
    ap.add_argument("--obs-bytes", type=int, help="bytes of one float32/uint8 observation")
    ap.add_argument("--forward-bytes", type=float, help="measured bytes per forwarded transition")
    ap.add_argument("--batch-bytes", type=float, help="measured bytes per sampled transition")
    ap.add_argument("--map", type=Path, default=MAP_CSV, help="committed runs.csv")
    ap.add_argument("--json", action="store_true", help="print the advice as JSON")
    return ap


def inputs_from_args(a: argparse.Namespace) -> Inputs:
    """The flags (over a run folder's figures) -> Inputs; ConfigError names what is missing."""
    got: dict[str, Any] = from_run(Path(a.run_dir)) if a.run_dir else {}
    notes = []
    if a.run_dir:
        notes.append(f"from {a.run_dir}: achieved rates, ran with replay at {got['replay_at']}")
    for k in ("link_mbps", "latency_ms", "production", "updates_per_s", "batch", "env"):
        if getattr(a, k) is not None:
            got[k] = getattr(a, k)
    missing = [k for k in ("link_mbps", "production", "updates_per_s") if not got.get(k)]
    if missing:
        raise ConfigError(
            "the advisor needs " + ", ".join("--" + k.replace("_", "-") for k in missing)
        )
    batch = int(got.get("batch") or 64)
    if a.obs_bytes is not None:
        b = transition_bytes(
            2 * a.obs_bytes + 16, batch, Config().forward_chunk, f"{a.obs_bytes} B observations"
        )
    else:
        b = env_bytes(got.get("env") or MAP_ENV, batch)
    if a.forward_bytes or a.batch_bytes:
        b = Bytes(
            a.forward_bytes or b.forward,
            a.batch_bytes or b.batch,
            b.priorities,
            b.source + ", measured overrides",
        )
    return Inputs(
        float(got["link_mbps"]),
        float(got.get("latency_ms") or 0.0),
        float(got["production"]),
        float(got["updates_per_s"]),
        batch,
        b,
        tuple(notes),
    )


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        inp = inputs_from_args(a)
    except (ConfigError, OSError, KeyError) as e:
        print(f"advise: {e}", file=sys.stderr)
        return 2
    cells = load_map(a.map)
    adv = advise(inp, cells)
    print(json.dumps(adv, indent=2) if a.json else format_advice(adv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
