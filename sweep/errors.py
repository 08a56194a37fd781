"""Errors a user can act on. The CLI prints their message as one line and exits.

A message quotes values from anywhere (the command line, a file, the system): whatever it quotes, its control
characters are escaped as ``repr`` writes them (``\\n``, ``\\t``, ``\\x00``), here and only here, so that a
newline in a ``run_id`` or a skip set shows whole instead of cutting the line.
"""


def escape_controls(text: str) -> str:
    """``text`` with every character that is not printable (newlines, tabs, NUL, other control and separator
    characters) written as ``repr`` writes it; printable text, non-ASCII letters included, as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class SweepError(Exception):
    """A failure with a message fit to show a user as it is (exit code 1). The message's control characters are
    escaped (``escape_controls``): it is one line whatever values it quotes."""

    exit_code = 1

    def __init__(self, *args) -> None:
        super().__init__(*(escape_controls(a) if isinstance(a, str) else a for a in args))


class ConfigError(SweepError):
    """Bad input: a config key, value or option that is not allowed (exit code 2).

    The message names the key (or file) and what is allowed.
    """

    exit_code = 2


class InputError(ConfigError):
    """Bad input that is a file or a model rather than a config value (exit code 2)."""


def first_line(exc: BaseException, limit: int | None = 200) -> str:
    """The first line of what ``exc`` says (its type's name when it says nothing), at most ``limit`` characters
    (None: all of it)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]


def unexpected(exc: BaseException) -> str:
    """A bug's one line, as a command prints it: ``unexpected <type> at <file>:<line>: <what it says> (set
    SWEEP_DEBUG=1 for the traceback)``, its control characters escaped."""
    import os
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?"
    said = escape_controls((str(exc).strip().splitlines() or [""])[0])
    return f"unexpected {type(exc).__name__} at {where}: {said} (set SWEEP_DEBUG=1 for the traceback)"


def os_error(exc: OSError, path) -> str:
    """``<path>: <what the system said>`` (``no space left on device``), in one line."""
    import os
    import re

    code = exc.errno
    if code is None:  # pyarrow's OSError names its errno only in the message ("[errno 28] ...")
        found = re.search(r"\[errno (\d+)\]", str(exc), re.IGNORECASE)
        code = int(found.group(1)) if found else None
    what = os.strerror(code) if code else first_line(exc, limit=None)
    return f"{path}: {what[:1].lower()}{what[1:]}"
