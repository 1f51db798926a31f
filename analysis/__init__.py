"""Turn mpirl run folders into tables and plots that compare the two replay placements.

Reads only the run's HDF5 files and ``summary.json`` (h5py + numpy; matplotlib for plots), never
``mpirl`` itself, so it works on a machine that has only the run folders.

- `analysis.runs`: find run folders, read them (live, finished or killed runs).
- `analysis.metrics`: the "after convergence" window and the per-run metrics.
- `analysis.plots`: loss, transferred priority, return and link throughput against time, one curve
  per placement, seeds as a min..max band (matplotlib, imported only when drawing).
- `analysis.compare`: group runs by link profile and placement, tables, plots, ``report.md``
  (``python -m analysis.compare EXPERIMENT_DIR``).
- `analysis.stats`: proposed/existing as a ratio of geometric means with a paired bootstrap
  interval (scipy), the decision rule against the paper's 0.26 and 3.92, censored time to target,
  the forest plot.
- `analysis.schema`: the HDF5 layout of a run as markdown (``python -m analysis.schema RUN_DIR``).
- `analysis.to_tensorboard`: TensorBoard event files from a run's ``learner.h5`` and
  ``buffer-<s>.h5`` files (``python -m analysis.to_tensorboard RUN_DIR``; also the mapping behind
  mpirl's live ``--tensorboard``).
"""
