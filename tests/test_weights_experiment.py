"""experiments/weights-delta.toml (the learning comparison of issue 26) is a valid sweep of
paired seeds, and its analysis reads the sweep's folders."""

import importlib.util
from pathlib import Path

from mpirl import sweep as S

ROOT = Path(__file__).resolve().parents[1]


def test_spec_pairs_full_and_delta_per_seed():
    spec = S.load_spec(ROOT / "experiments" / "weights-delta.toml")
    runs = S.expand(spec)
    assert S.check(spec, runs) == []
    assert len(spec.seeds) >= 10 and list(spec.axes)[-1] == "weights_encoding"
    assert [lab for lab, _ in spec.axes["weights_encoding"]] == ["full", "delta"]
    assert len(runs) == len(spec.seeds) * 2 * 2


def test_analysis_finds_cells(tmp_path):
    mod = importlib.util.spec_from_file_location(
        "weights_delta", ROOT / "experiments" / "weights_delta.py"
    )
    wd = importlib.util.module_from_spec(mod)
    mod.loader.exec_module(wd)
    for enc in ("full", "delta"):
        for seed in (0, 1):
            d = tmp_path / f"env=minatar,weights_encoding={enc}" / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "summary.json").write_text("{}")
    (tmp_path / "env=minatar,weights_encoding=delta" / "seed2").mkdir()  # unfinished: skipped
    cells = wd.cells(tmp_path)
    assert sorted(cells) == ["minatar"] and sorted(cells["minatar"]["delta"]) == [0, 1]
