"""The replay ratio as one object, in the spirit of Reverb's ``RateLimiter``: it decides when
transitions may be inserted and when a batch may be sampled, wherever the memory lives.

``ratio`` (``--replay-ratio``, rho) is sampled transitions per inserted one past
``learning_starts``; 0 turns the limiter off.  Inserts wait while
``inserted > learning_starts + sampled / ratio``; samples wait while
``sampled > ratio * (inserted - learning_starts)``.  Each side holds only itself, so one of the
two can always move.
"""

from __future__ import annotations


class RateLimiter:
    """Counts inserts and samples and says which may go next."""

    def __init__(self, ratio: float, learning_starts: int) -> None:
        self.ratio, self.learning_starts = ratio, learning_starts
        self.inserted = 0  # transitions inserted (or forwarded and received)
        self.sampled = 0  # transitions sampled (or trained on)

    def may_insert(self) -> bool:
        """Whether more inserts keep the sampled / inserted ratio at ``ratio`` or above."""
        return self.ratio == 0 or self.inserted <= self.learning_starts + self.sampled / self.ratio

    def may_sample(self) -> bool:
        """Whether one more batch keeps sampling at ``ratio`` per insert or below."""
        return self.ratio == 0 or self.sampled <= self.ratio * (
            self.inserted - self.learning_starts
        )
