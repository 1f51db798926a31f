"""Prioritized replay memory: ring storage of structured records, vectorized sum/min trees."""

from mpirl.replay.memory import PrioritizedReplay, Sample, footprint_bytes

__all__ = ["PrioritizedReplay", "Sample", "footprint_bytes"]
