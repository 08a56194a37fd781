"""What a test's child process starts with."""

from __future__ import annotations

import signal


def takes_ctrl_c() -> None:
    """A child's SIGINT at its default (a `preexec_fn`), whatever this run inherited: a suite started as a shell's
    background job ignores SIGINT, its children inherit that, and a Python process started ignoring SIGINT keeps
    ignoring it, as it should (a test of Ctrl-C then sends a signal nothing takes)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
