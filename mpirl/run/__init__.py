"""Run plumbing: configuration, errors, seeds, checkpoints, failure handling, host checks."""
