"""The error a user can fix: raised while checking the configuration, the environment or a
checkpoint, printed once by rank 0 (``mpirl: error: ...``), exit status 2."""


class ConfigError(ValueError):
    """A bad configuration value; the message names the value and the fix."""
