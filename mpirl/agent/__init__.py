"""The learning agent, no MPI: Q-network, DQN loss and train step, GBA, n-step returns, frames,
environments, the torch device."""
