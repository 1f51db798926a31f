"""Turn mpirl run folders into the tables, plots and pages that compare the two replay placements.

analysis needs h5py, numpy, scipy and lifelines (matplotlib for plots), never ``mpirl``, so it
works on a machine that has only the run folders or only the committed rows; the one exception
is `analysis.to_tensorboard`, which uses the live dashboard's scalars (`mpirl.logs.dashboard`).
The statistics of every report are in `analysis.stats`; the number formatter, the row reader and
the grouping of rows into cells are in `analysis.tables`.

**docs/results.md (the equal-wall-time design) is built on per-run rows.** `analysis.export`
reads each run folder's HDF5 files once into one row per run and its curves, merged into the
committed ``docs/results/data/NAME/runs.csv`` and ``curves.csv`` (the sweep calls it after every
run). `analysis.equal_time` and `analysis.verdict` read only those CSVs, never HDF5, so the page
regenerates from the repository alone and a test checks it is current.

**The profile report and the fixed-update appendix read the run folders themselves.**
`analysis.compare` reads the HDF5 of an experiment into per-run metrics (`analysis.metrics`) and
writes the profile report (`analysis.profile`) and the paper report (`analysis.paper`, with
bootstrap intervals); the paper report's per-run rows, ``paper-cells.csv``, are committed under
docs/results/appendix/fixed-updates/, and `analysis.verdict` re-analyses them with the
equal-wall-time statistics. This path is an appendix and stays apart from the export: its
metrics (the settle rule's after-convergence window, per-message priorities, updates to target)
are not ``runs.csv`` columns, and its committed reports are the record of the withdrawn
fixed-update design, kept as they were generated.

Modules:

- `analysis.runs`: find run folders, read them (live, finished or killed runs).
- `analysis.metrics`: per-run metrics from the HDF5 (the fixed window, the settle rule's "after
  convergence" window, the one time-to-target rule, link MB over time).
- `analysis.cells`: group runs into cells (a link profile is a cell whose axes are the link
  keys; the sweep's cells) and placements; seeds within a placement.
- `analysis.export`: run folders -> per-run rows and curves (``python -m analysis.export``).
- `analysis.tables`: the number formatter, the markdown table, and per-run CSV rows (write a
  field, read the rows back, group them into cells of paired seeds).
- `analysis.stats`: seed pairing; paired t-intervals on log ratios, Holm, the equal-wall-time
  decision, time to target as survival; the appendix's bootstrap ratios, its decision rule,
  censored time to target and forest plot.
- `analysis.equal_time`: docs/results.md's equal-wall-time section and figures, from the rows.
- `analysis.verdict`: rewrites (or checks) docs/results.md's generated sections from the
  committed rows (``python -m analysis.verdict [--check]``).
- `analysis.compare`: the command of the appendix path (``python -m analysis.compare
  EXPERIMENT_DIR``); `analysis.profile`, `analysis.paper`: its reports; `analysis.plots`: their
  time-series figures (matplotlib, imported only when drawing).
- `analysis.schema`: the HDF5 layout of a run as markdown (``python -m analysis.schema RUN_DIR``).
- `analysis.to_tensorboard`: TensorBoard event files from a run's ``learner.h5`` and
  ``buffer-<s>.h5`` files (``python -m analysis.to_tensorboard RUN_DIR``).
"""
