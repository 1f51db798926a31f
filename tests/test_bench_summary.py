"""The benches' own output. bench/time_to_target.py's summary: a seed that never reached the
target is reported and counted, never dropped (a NaN inside statistics.median can vanish,
depending on the order). bench/learner_loop.py's dry run."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "time_to_target", Path(__file__).resolve().parents[1] / "bench" / "time_to_target.py"
)
ttt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ttt)


def ok(s, steps=1000):
    return {"reached": True, "seconds": s, "env_steps": steps}


def failed(why="max_seconds after 600 s"):
    return {"reached": False, "seconds": None, "env_steps": None, "why": why}


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 0, 2), (1, 2, 0)])
def test_a_failed_seed_moves_the_median_in_any_order(order):
    runs = [ok(10.0), ok(30.0), failed()]
    values = [runs[i]["seconds"] for i in order]
    # 10, 30, not reached: the failure is the slowest, so the median is 30 whatever the order
    # (statistics.median with NaN gave 10, 30 or NaN depending on where the NaN sat)
    assert ttt.median_not_reached_last(values) == 30.0
    assert ttt.median_not_reached_last([10.0, None, None]) == float("inf")
    assert ttt.median_not_reached_last([10.0, 20.0, 30.0, None]) == 25.0


def test_table_lists_failures_and_never_divides_by_a_missing_median():
    results = {
        "mpirl buffer": [ok(20.0, 1e5), failed("max_seconds after 600 s"), ok(30.0, 2e5)],
        "mpirl learner": [failed(), ok(40.0), failed()],
        "SB3 DQN": [ok(100.0), ok(110.0), ok(120.0)],
    }
    table = ttt.summary_table(results, [0, 1, 2])
    rows = {ln.split(" | ")[0][2:]: ln for ln in table.splitlines() if ln.startswith("| ")}
    assert "| 2/3 | 30.0 | 20, not reached, 30 | 200,000 | 0.27 |" in rows["mpirl buffer"]
    assert "| 1/3 | not reached | not reached, 40, not reached |" in rows["mpirl learner"]
    assert "n/a (its median seed did not reach the target)" in rows["mpirl learner"]
    assert "| 3/3 | 110.0 |" in rows["SB3 DQN"] and rows["SB3 DQN"].endswith(" 1.00 |")
    assert "- mpirl buffer, seed 1: not reached (max_seconds after 600 s)" in table
    assert sum(ln.startswith("- mpirl learner, seed ") for ln in table.splitlines()) == 2
    sb3_failed = dict(results, **{"SB3 DQN": [failed(), failed(), ok(5.0)]})
    row = next(
        ln
        for ln in ttt.summary_table(sb3_failed, [0, 1, 2]).splitlines()
        if ln.startswith("| mpirl buffer")
    )
    assert row.endswith("n/a (the reference median seed did not reach the target) |")


def test_learner_loop_bench_dry_run():
    """bench/learner_loop.py --dry-run: the learner's real loop against a scripted link trains
    (its updates per CPU second are a real fraction of TrainStep's) and times its steps."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run(
        [sys.executable, str(root / "bench" / "learner_loop.py"), "--dry-run", "--steps"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        check=False,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    median = re.search(r"\| median \| ([\d,]+) \| ([\d,]+) \| \*\*([\d.]+)\*\* \|", p.stdout)
    assert median, p.stdout
    loop, ref, ratio = (float(x.replace(",", "")) for x in median.groups())
    assert loop > 0 and ref > 0 and 0.2 < ratio < 2.0, p.stdout
    assert "|   train: TrainStep.launch |" in p.stdout
