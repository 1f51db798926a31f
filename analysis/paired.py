"""The names experiments/weights_delta.py imports from here; the statistics live in
`analysis.stats`."""

from analysis.stats import LogRatio, log_ratio_t

__all__ = ["LogRatio", "log_ratio_t"]
