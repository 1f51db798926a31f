"""`python -m mpirl.reference`, the one-process loop, learns CartPole-v1 and is deterministic.

One process with fixed seeds makes the same run whatever the machine's load (no MPI, no timing
in the loop), so the learning test stops on an update budget, not on the clock: a loaded machine
makes it slower, never flaky.  It is the same run on one host only: torch picks its float kernels
by CPU (AVX2, AVX512; Intel, AMD), and a DQN run amplifies a last-bit difference into another
trajectory.  So the learning test asserts what every host gave, not one host's trajectory.
A random policy scores ~20.  Seed 1, ``--target-return 200 --max-updates 10000``: the host
the budget was sized on (2026-12) reached 200 by about 5,000 updates; an AMD EPYC host (AVX512)
on 2026-12-07 gave 19.6 at the first evaluation (500 updates) and a best of 133.7 (108-119 from
1,500 to 9,500 updates; seeds 0-5 there: best 131, 134, 238, 200, 265, 212).  The test asks for
a first evaluation under 100 and a best of at least 100 and at least twice the first (five times
random), which both hosts met.
"""

from __future__ import annotations

from mpirl.reference import main, run
from mpirl.run.config import parse

CPU = ["--device", "cpu"]  # the figures below are CPU torch's; a GPU host would pick CUDA


def test_reference_learns_cartpole() -> None:
    cfg = parse(["--seed", "1", "--target-return", "200", "--max-updates", "10000", *CPU])
    summary = run(cfg, say=lambda line: None)
    assert summary["stop_reason"] in ("target_return", "max_updates"), summary["stop_reason"]
    first = summary["evals"][0][2]
    assert first < 100, summary["evals"]  # it started from (near) random
    assert summary["best_eval"] >= max(100, 2 * first), summary["evals"]  # and the rise is real
    assert summary["env_steps"] > summary["updates"] > 0


def test_one_seed_makes_one_run() -> None:
    argv = ["--seed", "5", "--max-updates", "400", "--eval-every", "200", "--eval-episodes", "3"]
    argv += CPU
    first, second = (run(parse(argv), say=lambda line: None) for _ in range(2))
    assert first["stop_reason"] == "max_updates"
    assert (first["env_steps"], first["evals"]) == (second["env_steps"], second["evals"])


def test_main_prints_the_stop_line(capsys) -> None:
    assert main(["--max-updates", "1", "--learning-starts", "64", "--progress-seconds", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mpirl: stopping (max_updates) after ")
    assert "1 updates, best eval" in out


def test_main_reports_a_bad_flag(capsys) -> None:
    assert main(["--n-step", "0"]) == 2
    assert "n_step=0 must be" in capsys.readouterr().err


def test_main_refuses_an_image_env(capsys) -> None:
    assert main(["--env", "MinAtar/Breakout-v1"]) == 2
    assert "MinAtar/Breakout-v1" in capsys.readouterr().err
