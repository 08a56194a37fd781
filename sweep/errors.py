"""Errors a user can act on. The CLI prints their message as one line and exits."""


class SweepError(Exception):
    """A failure with a message fit to show a user as it is (exit code 1)."""

    exit_code = 1


class ConfigError(SweepError):
    """Bad input: a config key, value or option that is not allowed (exit code 2).

    The message names the key (or file) and what is allowed.
    """

    exit_code = 2


class InputError(ConfigError):
    """Bad input that is a file or a model rather than a config value (exit code 2)."""
