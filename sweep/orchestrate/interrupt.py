"""How a command stops early: SIGTERM and SIGHUP handled as SIGINT, the resume command, and the system
error behind a failed write.

``timeout``, Kubernetes and systemd stop a process with SIGTERM, a closed terminal with SIGHUP. Ray's driver
installs a handler for SIGTERM (a stack dump, then abort: exit code 134) and Tune handles only SIGINT, so within
``sigterm_as_sigint`` either raises SIGINT in this process: Tune ends its run the way Ctrl-C does (or, outside
Tune's loop, KeyboardInterrupt), the driver stops Ray and releases its claims, and `sweep run` prints one line with
the resume command (exit code 128 + the signal: 143, 129). Every command runs inside it (``sweep.cli.commands``),
so each stops as on Ctrl-C, in one line; ``sweep.orchestrate.driver`` enters it again around a sweep's run.
Ray-free.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import threading
from typing import Callable, Iterator

from sweep.config import override_key

_received: list[int] = []  # the stop signals received within sigterm_as_sigint, in order
_active: list[bool] = []  # inside sigterm_as_sigint (in the main thread)
# the signals that stop a command as Ctrl-C does: SIGTERM (timeout, Kubernetes, systemd) and SIGHUP (its terminal
# closed); a process's default on either is to die at once, its claims, staging files and sandboxes left behind
STOPS = (signal.SIGTERM, signal.SIGHUP)


def _on_sigterm(signum, frame) -> None:
    _received.append(signum)
    if callable(signal.getsignal(signal.SIGINT)):
        signal.raise_signal(signal.SIGINT)  # whatever handles SIGINT now: Tune's, else KeyboardInterrupt
    else:  # SIGINT ignored (a job a script started in the background inherits that): the stop goes on as Ctrl-C's
        raise KeyboardInterrupt


def _ours(sig: int) -> bool:
    """Whether a stop signal is ours to handle: not one this process was started ignoring (``nohup`` ignores
    SIGHUP so that a closed terminal leaves the command running)."""
    return signal.getsignal(sig) is not signal.SIG_IGN


@contextlib.contextmanager
def sigterm_as_sigint() -> Iterator[None]:
    """Within this block (entered in the main thread), SIGTERM and SIGHUP stop the process as SIGINT does;
    the previous handlers are restored after. Elsewhere (a worker thread) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOPS if _ours(sig)}
    if not _active:
        _received.clear()
    _active.append(True)
    for sig in previous:
        signal.signal(sig, _on_sigterm)
    try:
        yield
    finally:
        _active.pop()
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def stopped_during_start(exc: SystemExit) -> bool:
    """Whether ``exc`` is Ray's own SIGTERM handler ending the process (``sys.exit(SIGTERM)``) while it started,
    within ``sigterm_as_sigint``: then the sweep stops as on any SIGTERM (recorded here; the caller raises
    KeyboardInterrupt)."""
    if not _active or exc.code != signal.SIGTERM:
        return False
    _received.append(signal.SIGTERM)
    return True


def keep_sigterm() -> None:
    """Install the handler again: ``ray.init`` replaces the process's SIGTERM handler with its own."""
    if _active and threading.current_thread() is threading.main_thread():
        for sig in STOPS:
            if _ours(sig):
                signal.signal(sig, _on_sigterm)


@contextlib.contextmanager
def stop_said(say: Callable[[str], None]) -> Iterator[Callable[[], None]]:
    """Around one Tune run, in the main thread: yields ``announce``, to call once Tune's SIGINT handler is in place
    (its callbacks' setup). That handler stops the run after its trials, silently here (Tune's logger is off); with
    ``announce`` the first stop signal says so and that a second stops sooner, and the second reaches the handler
    from before the run: Tune leaves its own installed after the run, and it is put back here. A sweep started
    ignoring SIGINT (a script's background job: Ctrl-C at that terminal is not for it) keeps ignoring it while Tune
    runs, as outside Tune; SIGTERM and SIGHUP reach Tune's stop."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None  # None too where Python did not set it

    def announce() -> None:
        inner = signal.getsignal(signal.SIGINT)
        if before is None or not callable(inner):
            return

        def first(signum, frame) -> None:
            stopped = stop_signal()
            again = f"{'Ctrl-C' if stopped == signal.SIGINT else signal.Signals(stopped).name} again"
            say(f"{stopped_by()}: stopping the running settings and Ray ({again} to stop sooner)")
            inner(signum, frame)
            signal.signal(signal.SIGINT, before)

        if callable(before):
            signal.signal(signal.SIGINT, first)
            return
        signal.signal(signal.SIGINT, before)  # Tune's handler took the ignored SIGINT over: ignored again

        def stop(signum, frame) -> None:
            _received.append(signum)
            first(signal.SIGINT, frame)
            keep_sigterm()  # the same signal again stops sooner, as outside Tune

        for sig in STOPS:
            if signal.getsignal(sig) is _on_sigterm:
                signal.signal(sig, stop)

    try:
        yield announce
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)
            keep_sigterm()


def stop_signal() -> int:
    """The signal that stopped the command: the first SIGTERM or SIGHUP received, else SIGINT."""
    return next((sig for sig in _received if sig in STOPS), signal.SIGINT)


def stopped_by() -> str:
    """What stopped the command, as its last line says it: ``stopped by SIGTERM`` (or SIGHUP), else
    ``interrupted`` (Ctrl-C)."""
    stopped = stop_signal()
    return f"stopped by {signal.Signals(stopped).name}" if stopped in STOPS else "interrupted"


def resume_command(overrides: list[str], name: str) -> str:
    """The `sweep run` command that resumes sweep ``name``: ``overrides`` without the keys a resume
    sets itself (resume, sweep.name, run_id), then ``resume=true sweep.name=NAME``, each once."""
    drop = ("resume", "sweep.name", "run_id")
    kept = [o for o in overrides if override_key(o) not in drop]
    return "sweep run " + shlex.join([*kept, "resume=true", f"sweep.name={name}"])


def resume_line(overrides: list[str], name: str) -> str:
    """``resume with `sweep run ...``` (``resume_command``); in a Ray job (jobs/submit.py's), also the submission
    that resumes it from where it was submitted: without the cluster keys, which jobs/submit.py refuses (the job
    joins the cluster it is sent to)."""
    import os

    from sweep.config.provenance import SUBMISSION_ID_ENV

    line = f"resume with `{resume_command(overrides, name)}`"
    if not os.environ.get(SUBMISSION_ID_ENV):
        return line
    auth = next((o.split("=", 1)[1] for o in overrides if override_key(o) == "cluster.auth"), "token")
    job = [o for o in overrides if override_key(o) != "cluster" and not override_key(o).startswith("cluster.")]
    again = resume_command(job, name).removeprefix("sweep run ")
    python = shlex.quote(sys.executable)  # (the job's, on the cluster's nodes: jobs/submit.py's --python)
    return (
        f"{line} on a node of the cluster, or submit it again: "
        f"`python jobs/submit.py --auth {auth} --python {python} -- {again}`"
    )


def resume_hint(plan) -> str:
    """``resume_line`` for the sweep of ``plan`` (``sweep.orchestrate.plan.Plan``)."""
    return resume_line(plan.base, plan.name)


def os_cause(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc`` (its causes and contexts, as Tune wraps errors), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and not isinstance(exc, (ConnectionError, TimeoutError)):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
