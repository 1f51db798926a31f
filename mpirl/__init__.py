"""mpirl: distributed DQN with prioritized replay over MPI, edge actors and a cloud learner."""

__version__ = "0.1.0"
