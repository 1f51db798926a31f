"""Turn mpirl run folders into tables and plots that compare the two replay placements.

Reads only the run's HDF5 files and ``summary.json`` (h5py + numpy; matplotlib for plots), never
``mpirl`` itself, so it works on a machine that has only the run folders; the one exception is
`analysis.to_tensorboard`, which uses the live dashboard's scalars (`mpirl.logs.dashboard`).

- `analysis.runs`: find run folders, read them (live, finished or killed runs).
- `analysis.metrics`: the per-run metrics (`run_metrics`) over the fixed window and the settle
  rule's "after convergence" window, and the one time-to-target rule.
- `analysis.cells`: group runs into cells (a link profile is a cell whose axes are the link
  keys; the sweep's cells) and placements; seeds within a placement.
- `analysis.tables`: number formats, the markdown table and the CSV writer of every report.
- `analysis.profile`: the profile report (``report.md``, a table per link profile, ``runs.csv``).
- `analysis.paper`: the paper report (``paper.md``: per-cell ratios with intervals, decisions,
  the crossover map, ``paper-cells.csv``).
- `analysis.compare`: the command for both (``python -m analysis.compare EXPERIMENT_DIR``).
- `analysis.plots`: loss, transferred priority, return and link throughput against time, one
  curve per placement, seeds as a min..max band; the paper report's figures (matplotlib,
  imported only when drawing).
- `analysis.stats`: replay_at=buffer / replay_at=learner as a ratio of geometric means with a
  paired bootstrap interval (scipy), the decision rule against the paper's 0.26 and 3.92,
  censored time to target, the forest plot.
- `analysis.paired`, `analysis.equal_time`, `analysis.export`, `analysis.verdict`: the
  equal-wall-time design's rows, statistics and docs/results.md's generated sections.
- `analysis.schema`: the HDF5 layout of a run as markdown (``python -m analysis.schema RUN_DIR``).
- `analysis.to_tensorboard`: TensorBoard event files from a run's ``learner.h5`` and
  ``buffer-<s>.h5`` files (``python -m analysis.to_tensorboard RUN_DIR``).
"""
