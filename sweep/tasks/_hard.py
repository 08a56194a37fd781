"""What the caller's own hard limits allow a sandboxed program (``sweep.tasks.sandbox``): the launcher cannot raise a
hard limit it inherits (bubblewrap drops the privilege first), so a program is refused before any work where the
trial's limits are above one."""

from __future__ import annotations

import os
import resource

from sweep.errors import SweepError
from sweep.tasks._slots import pids_of

# a program's limit, the resource limit it is set as, what that counts, the ulimit flag that shows it
_HARD = (
    ("cpu_s", resource.RLIMIT_CPU, "CPU seconds", "-Ht"),
    ("memory_bytes", resource.RLIMIT_AS, "address space in bytes", "-Hv, in KiB"),
    ("file_bytes", resource.RLIMIT_FSIZE, "file size in bytes", "-Hf, in bash in KiB"),
    ("open_files", resource.RLIMIT_NOFILE, "open files", "-Hn"),
    ("processes", resource.RLIMIT_NPROC, "processes", "-Hu"),
)


def check_limits(limits) -> None:
    """A SweepError (one line) where this process's own hard limit (a ``ulimit -H`` of the shell that started it) is
    below what a program may use: no program can be given more than it (the launcher keeps the lower one, and a
    program would fail or time out where the trial's settings say it may go on). ``cpu_s`` is ``eval.timeout_s``'s."""
    root = os.geteuid() == 0
    for field, kind, what, flag in _HARD:
        want = int(getattr(limits, field))
        if field == "processes" and not root:  # counted with the caller's own (its user's processes)
            want += len(pids_of(os.getuid()))
        hard = resource.getrlimit(kind)[1]
        if hard != resource.RLIM_INFINITY and hard < want:
            fix = (
                f"lower eval.timeout_s to {hard} or less, or raise the limit"
                if field == "cpu_s"
                else "raise it (the sandbox's own limit)"
            )
            raise SweepError(
                f"sandbox: this process's hard limit on {what} (ulimit {flag}) is {hard}, below the {want} a program "
                f"may use; {fix}"
            )
