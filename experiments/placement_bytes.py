"""The pilot on bytes for a third placement (issue 47): predicted link bytes per *produced*
transition, toward the learner, for the two placements and the three candidates, from the bytes
rule (`mpirl.advise`: the wire's layouts) over the map's link rates and replay ratios.

    python experiments/placement_bytes.py [--env CartPole-v1] [--production 12000]

A model, no run.  Per produced transition, with F / S / R the bytes of a forwarded, a sampled
and a priority-update transition (`mpirl.advise.env_bytes`) and rho the samples per produced
transition:

* learner (``--replay-at learner``): F;
* buffer (``--replay-at buffer``): rho S (and rho R back);
* (a) sampled once, cached at the learner: the first sample of a transition ships it whole (S),
  a later one only its key and weight (`CACHED_ITEM`); under uniform-ish sampling the fraction
  ever sampled is 1 - exp(-rho), so (1 - e^-rho) S + (rho - 1 + e^-rho) CACHED_ITEM (and rho R
  back);
* (b) prioritized forwarding: F, as the learner placement (it changes which transitions a
  capped link keeps, not how many bytes each costs);
* (c) prioritized thinning (``--replay-at thinned``): forwards the fraction
  b = min(1, RHO_SHARE rho), each with its probability (a byte) when b < 1: b (F + 1).  Image runs:
  a thinned transition shares fewer frames with its neighbours; a frame is sent when one of the
  ``w`` transitions that need it is kept, 1 - (1 - b)^w of them (at most ``per_sample`` frames per
  kept transition).

Where a link rate is given, a design whose demand exceeds it crosses ``min(demand, link)``:
the learner and (b) lose experiences, the buffer and (a) lose updates, (c) thins further to
`thinned.LINK_SHARE` of the link (by priority, no update lost; the table gives the fraction of
produced transitions it then forwards).  Image bytes are uncompressed
(an upper bound; the committed cell M compressed them).
"""

from __future__ import annotations

import argparse
import math

#: (a): bytes per sampled transition the learner already holds: its serial number (i8: the
#: slot follows from it) and its importance weight (f4)
CACHED_ITEM = 8 + 4
RHOS = (0.25, 1.0, 4.0)
LINKS_MBPS = (100.0, 5.0, 1.25)
DESIGNS = ("learner", "buffer", "(a) cached", "(b) prio-fwd", "(c) thinned")


def per_transition(env: str, batch: int = 64) -> dict[str, float]:
    """F, S, R, the frames' part of F, the frame size, frames per sampled transition and the
    window ``w`` of transitions that need one frame (0s for vector envs)."""
    from mpirl.advise import env_bytes, transition_bytes
    from mpirl.agent import frames as frames_mod
    from mpirl.agent.envs import inspect
    from mpirl.run.config import Config

    b = env_bytes(env, batch)
    out = {"F": b.forward, "S": b.batch, "R": b.priorities, "frame": 0.0, "fpt": 0.0}
    spec = inspect(env)
    if spec.image:
        cfg = Config(env=env)
        assert spec.frame_shape is not None
        rec = frames_mod.record_dtype(spec.stack).itemsize
        out["frame"] = float(math.prod(spec.frame_shape))
        out["fpt"] = (b.forward - transition_bytes(rec, batch, cfg.forward_chunk, "").forward) / (
            out["frame"]
        )
        out["per_sample"] = float(min(2 * spec.stack, spec.stack + cfg.n_step))
        out["w"] = float(2 * spec.stack)  # transitions whose obs or next_obs hold a given frame
    return out


def thinned_bytes(t: dict[str, float], b: float) -> float:
    """(c)'s bytes per produced transition when it forwards the fraction ``b``."""
    if b >= 1:
        return t["F"]
    rest = t["F"] - t["fpt"] * t["frame"]  # record, |td| and header share
    frames = 0.0
    if t["frame"]:
        frames = min(b * t["per_sample"], t["fpt"] * (1 - (1 - b) ** t["w"])) * t["frame"]
    return b * (rest + 1) + frames


def fraction_for(t: dict[str, float], nbytes: float) -> float:
    """The fraction (c) forwards when its link-budget allows ``nbytes`` per produced one."""
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if thinned_bytes(t, mid) < nbytes else (lo, mid)
    return lo


def demand(t: dict[str, float], rho: float) -> dict[str, tuple[float, float]]:
    """Bytes per produced transition, (toward the learner, back), per design."""
    from mpirl.roles.placements.thinned import RHO_SHARE

    seen = 1 - math.exp(-rho)
    return {
        "learner": (t["F"], 0.0),
        "buffer": (rho * t["S"], rho * t["R"]),
        "(a) cached": (seen * t["S"] + (rho - seen) * CACHED_ITEM, rho * t["R"]),
        "(b) prio-fwd": (t["F"], 0.0),
        "(c) thinned": (thinned_bytes(t, min(1.0, RHO_SHARE * rho)), 0.0),
    }


def cell(t: dict[str, float], rho: float, link_mbps: float, production: float) -> dict[str, str]:
    """Each design's bytes per produced transition over this link, and what it keeps."""
    from mpirl.advise import CAPPED_BELOW
    from mpirl.roles.placements.thinned import LINK_SHARE

    cap = link_mbps * 1e6 / 8 / production  # bytes per produced transition the link carries
    out = {}
    for d, (toward, back) in demand(t, rho).items():
        if d == "(c) thinned" and toward > LINK_SHARE * cap:
            out[d] = f"{LINK_SHARE * cap:.1f}, forwards {fraction_for(t, LINK_SHARE * cap):.0%}"
        elif toward <= cap or cap / toward >= CAPPED_BELOW:
            out[d] = f"{min(toward, cap):.1f}" + (f" (+{back:.1f})" if back else "")
        else:
            lost = "experiences" if d in ("learner", "(b) prio-fwd") else "updates"
            out[d] = f"{cap:.1f}, capped: {cap / toward:.0%} of {lost}"
    return out


def table(env: str, production: float, batch: int = 64) -> str:
    t = per_transition(env, batch)
    lines = [
        f"{env}: F {t['F']:.1f}, S {t['S']:.1f}, R {t['R']:.1f} B per transition; "
        f"P {production:,.0f} env steps/s",
        "",
        "| link | rho | " + " | ".join(DESIGNS) + " |",
        "|---|---|" + "---|" * len(DESIGNS),
    ]
    for rho in RHOS:
        lines.append(
            "| any | "
            + f"{rho:g} | "
            + " | ".join(
                f"{v[0]:.1f}" + (f" (+{v[1]:.1f})" if v[1] else "") for v in demand(t, rho).values()
            )
            + " |"
        )
    for link in LINKS_MBPS:
        for rho in RHOS:
            c = cell(t, rho, link, production)
            lines.append(f"| {link:g} Mb/s | {rho:g} | " + " | ".join(c.values()) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--production", type=float, default=12_000.0, help="env steps/s (P)")
    a = ap.parse_args(argv)
    print(table(a.env, a.production))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
