"""bench/learner_group.py: its points (a straggler on the lead and on another learner, K skipped
without the cores), its t-intervals and ratios to allreduce, and its --quick run end to end."""

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("learner_group", ROOT / "bench" / "learner_group.py")
lg = importlib.util.module_from_spec(spec)
sys.modules["learner_group"] = lg  # its dataclasses look their module up there
spec.loader.exec_module(lg)


def test_points_put_the_straggler_on_the_lead_and_on_another_learner():
    pts = lg.points([1, 2], ["allreduce", "gba"], [2.0, 4.0], ["lead", "other"])
    assert lg.Point(1, "-", 1.0, "-") not in pts  # the baseline runs first, on its own
    assert lg.Point(1, "-", 4.0, "lead") in pts and lg.Point(1, "-", 4.0, "other") not in pts
    assert len(pts) == 2 + 2 * (1 + 2 * 2)  # K = 1: 2x, 4x; K = 2: 2 modes x (none + 4)
    lead, other = lg.Point(2, "gba", 4.0, "lead"), lg.Point(2, "gba", 4.0, "other")
    assert lead.straggle(4.5) == "0:4.500" and other.straggle(4.5) == "1:4.500"
    assert lg.Point(4, "gba", 2.0, "other").straggle(1.0) == "3:1.000"
    assert lg.Point(2, "gba", 1.0, "-").straggle(4.5) is None
    cmd = lg.command(Path("/x"), lead, 5.0, 4.5, 400.0, 3)
    assert cmd[cmd.index("--straggle") + 1] == "0:4.500"
    assert cmd[cmd.index("--learner-sync") + 1] == "gba" and cmd[cmd.index("--learners") + 1] == "2"
    assert "--straggle" not in lg.command(Path("/x"), lg.Point(2, "gba", 1.0, "-"), 5, 0, 400, 3)


def test_the_lead_straggles_through_the_config_as_another_learner_does():
    """--straggle 0:MS (the lead) passes the config check at K = 2 and sleeps on learner 0
    only; the window applies to it as to any learner."""
    from mpirl.run.config import parse
    from mpirl.wiring import straggle_of

    cfg = parse(["--learners", "2", "--learner-sync", "switch", "--straggle", "0:4.5@40-80"])
    assert straggle_of(cfg, 0) == (0.0045, (40.0, 80.0))
    assert straggle_of(cfg, 1)[0] == 0.0


def test_k_without_the_cores_is_skipped_and_said():
    assert lg.runnable([1, 2, 4], 2) == (
        [1, 2],
        ["K = 4 skipped: 2 cores here (os.cpu_count()), K = 4 needs 4, one per learner"],
    )
    assert lg.runnable([1, 2, 4], 16) == ([1, 2, 4], [])


def test_table_gives_t_intervals_and_paired_ratios_to_allreduce():
    from scipy import stats

    def runs(p, ups, load=(1.0, 2.0, 1.5)):
        r = lg.Runs(p, list(ups), [u * 64 * p.k for u in ups], list(load))
        r.first_gba = [2.5, math.nan, 3.5] if p.mode == "switch" else [math.nan] * 3
        return r

    solo = runs(lg.Point(1, "-", 1.0, "-"), [600.0, 620.0, 640.0])
    ar = runs(lg.Point(2, "allreduce", 4.0, "lead"), [100.0, 110.0, 90.0])
    gba = runs(lg.Point(2, "gba", 4.0, "lead"), [400.0, 440.0, 360.0])  # 4x in every repeat
    sw = runs(lg.Point(2, "switch", 4.0, "lead"), [200.0, 330.0, 180.0])
    other = runs(lg.Point(2, "gba", 4.0, "other"), [500.0, 500.0, 500.0])  # no allreduce here
    text = lg.table([solo, ar, gba, sw, other], {4.0: 4.5})
    rows = {ln.split(" | ")[1] + ln.split(" | ")[2]: ln for ln in text.splitlines()[2:]}
    half = stats.t.ppf(0.975, 2) * 20.0 / 3**0.5  # sd of 600, 620, 640 is 20
    assert f"| 620 ± {half:.0f} |" in rows["-none"]
    g = rows["gba4x on lead (0), 4.5 ms"]
    assert "| 4.00 [4.00, 4.00] | 4.00 [4.00, 4.00] |" in g  # the paired ratio, exact
    assert f"| {400 * 128 / (2 * 620 * 64):.2f} |" in g  # parallel efficiency
    assert g.endswith("| - | 1.00-2.00 |")
    s = rows["switch4x on lead (0), 4.5 ms"]
    assert "| 3.0 (2/3) |" in s  # first to GBA: mean of the runs that went, and how many
    ratios = [200 / 100, 330 / 110, 180 / 90]
    est = math.exp(sum(math.log(x) for x in ratios) / 3)
    assert f"| {est:.2f} [" in s
    assert "| - | - |" in rows["gba4x on other (1), 4.5 ms"]  # no allreduce point: no ratio
    assert "| - | - |" in rows["allreduce4x on lead (0), 4.5 ms"]
    sw.first_gba = [math.nan] * 3  # no run went GBA: "never", not "nan" and a numpy warning
    text = lg.table([solo, ar, sw], {4.0: 4.5})
    assert "| never (0/3) |" in text and "nan" not in text


@pytest.mark.mpi
@pytest.mark.slow
def test_quick_mode_runs_and_prints_the_table(tmp_path):
    """--quick end to end: real mpirun runs of K = 1 and 2, allreduce and gba, a 4x straggler on
    the lead (about 1.5 minutes on 2 cores, 2.5 on a loaded one: slow)."""
    out = tmp_path / "table.md"
    p = subprocess.run(
        [sys.executable, "bench/learner_group.py", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    text = out.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert len(lines) == 1 + 1 + 1 + 2 * 2  # header, K = 1 none and 4x, K = 2: 2 modes x 2
    assert any("| gba | 4x on lead (0)" in ln for ln in lines)
    gba = next(ln for ln in lines if "| gba | 4x on lead (0)" in ln)
    assert gba.split(" | ")[5].count("[") == 1  # a ratio to allreduce with its interval
    assert "2 repeats per point" in text
