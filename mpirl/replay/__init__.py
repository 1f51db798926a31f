"""Prioritized replay memory: ring storage of structured records, vectorized sum/min trees."""

from mpirl.replay.frames import FrameReplay, frame_footprint_bytes
from mpirl.replay.memory import PrioritizedReplay, Sample, footprint_bytes

__all__ = ["FrameReplay", "PrioritizedReplay", "Sample", "footprint_bytes", "frame_footprint_bytes"]
