"""TensorBoard event files from a run's HDF5 logs, offline (compute nodes often have no internet
and no TensorBoard; HDF5 stays the source of truth)::

    python -m analysis.to_tensorboard RUN_DIR             # writes RUN_DIR/tensorboard-offline
    tensorboard --logdir RUN_DIR

Works on a finished, a live or a killed run (the rows up to the writers' last flush; run it again
for newer rows: it rewrites its folder). The scalars are those of the live ``--tensorboard``
mirror, made by the same `mpirl.logs.dashboard.Scalars` from ``learner.h5`` (the folder itself) and
`mpirl.logs.dashboard.BufferScalars` from each ``buffer-<s>.h5`` (its subfolder ``buffer-<s>``, a
TensorBoard run of its own: the sites' curves share one chart per tag); the tags, steps and
downsampling are in mpirl.logs.dashboard's docstring. This is the one module of analysis that
imports mpirl: the mapping lives with the live mirror (mpirl does not import analysis). Needs the
tensorboard package (``pip install -e ".[tensorboard]"``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np

from mpirl.logs.dashboard import SCALARS, EventWriter

__all__ = ["convert"]


def _read(f: h5py.File, name: str) -> dict[str, np.ndarray]:
    g = f[name]
    n = min((d.shape[0] for d in g.values()), default=0)
    return {k: d[:n] for k, d in g.items()}


def _convert_file(src: Path, role: str, logdir: Path) -> None:
    writer = EventWriter(logdir)
    kind, streams = SCALARS[role]
    with h5py.File(src, "r", locking=False) as f:
        scalars = kind(f.attrs["t0_unix"])
        for name in streams:
            if name in f:
                writer.add(scalars.rows(name, _read(f, name)))
    writer.add(scalars.finish())
    writer.close()


def convert(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the scalars of ``run_dir``'s learner.h5 into ``out`` (default
    RUN_DIR/tensorboard-offline, replaced), and those of each buffer-<s>.h5 into
    ``out/buffer-<s>``; returns the folder."""
    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / "tensorboard-offline"
    src = run_dir / "learner.h5"
    if not src.is_file():
        raise FileNotFoundError(
            f"{src} does not exist: not a run folder, or its learner has not started"
        )
    writer_dir = out.with_name(out.name + ".tmp")
    shutil.rmtree(writer_dir, ignore_errors=True)
    _convert_file(src, "learner", writer_dir)
    for buf in sorted(run_dir.glob("buffer-*.h5")):
        _convert_file(buf, "buffer", writer_dir / buf.stem)
    shutil.rmtree(out, ignore_errors=True)
    writer_dir.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.to_tensorboard", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument(
        "--out", default=None, help="output folder (default RUN_DIR/tensorboard-offline; replaced)"
    )
    args = ap.parse_args(argv)
    try:
        out = convert(args.run_dir, args.out)
    except (OSError, ImportError) as e:
        print(f"analysis.to_tensorboard: {e}", file=sys.stderr)
        return 2
    print(f"analysis.to_tensorboard: wrote {out}; view with: tensorboard --logdir {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
