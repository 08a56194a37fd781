"""A sandbox for code a model wrote: each program in its own subprocess, in a fresh temporary directory, with limits
on CPU seconds, address space, file size, open files and processes, its output capped, and its whole process tree
killed on timeout. Where the machine allows: no network (a network namespace), its processes in a PID namespace of
their own, and an unprivileged user (run as root). ``Outcome.isolation`` says which applied.

Opt-in: the caller checks ``eval.allow_code_execution`` first (``require_allowed``). docs/tasks.md describes what
each measure stops and what it does not.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sweep.config import CODE_EXECUTION_OPT_IN
from sweep.errors import ConfigError, SweepError

JAIL = Path(__file__).with_name("_jail.py")
FIRST_UID = 61000  # a pool slot's unprivileged user (as root): distinct per slot, so one slot's cleanup spares others


@dataclass(frozen=True)
class Limits:
    """What one program may use (``eval.*`` keys)."""

    timeout_s: float = 10.0  # wall clock, then its whole process tree is killed
    cpu_s: int = 10
    memory_bytes: int = 1 << 30  # address space
    file_bytes: int = 16 << 20  # the largest file it may write
    open_files: int = 64
    processes: int = 16
    output_bytes: int = 64 << 10  # stdout and stderr each; beyond it the program is killed


@dataclass(frozen=True)
class Outcome:
    """How a program ended: ``passed`` (exit 0), ``failed`` (any other exit), ``timeout``, ``output_limit``."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    isolation: str  # what applied, e.g. "network namespace, pid namespace, limits (...), unprivileged uid 61000"

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def require_allowed(allowed: bool) -> None:
    """The opt-in: running model-written code needs ``eval.allow_code_execution=true``."""
    if not allowed:
        raise ConfigError(CODE_EXECUTION_OPT_IN)


def run_program(source: str, limits: Limits = Limits(), slot: int = 0) -> Outcome:
    """Run ``source`` (a whole Python program) in the sandbox; never raises for anything the program does."""
    work = Path(tempfile.mkdtemp(prefix="sweep-sandbox-"))
    try:
        return _run(source, limits, slot, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_programs(sources: list[str], limits: Limits = Limits(), workers: int = 2) -> list[Outcome]:
    """Each program in its own sandbox, at most ``workers`` at once (``eval.workers``), in order of ``sources``."""
    slots = list(range(max(1, workers)))
    lock = threading.Lock()

    def one(source: str) -> Outcome:
        with lock:
            slot = slots.pop()
        try:
            return run_program(source, limits, slot)
        finally:
            with lock:
                slots.append(slot)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(slots)) as pool:
        return list(pool.map(one, sources))


def _run(source: str, limits: Limits, slot: int, work: Path) -> Outcome:
    program = work / "program.py"
    program.write_text(source)
    interpreter, switch = _interpreter()
    root = os.geteuid() == 0
    uid = FIRST_UID + slot if root and switch else None
    if uid is not None:
        os.chown(work, uid, uid)
        os.chown(program, uid, uid)
    os.chmod(work, 0o700)
    spec = {
        "cpu_s": int(limits.cpu_s),
        "memory_bytes": int(limits.memory_bytes),
        "file_bytes": int(limits.file_bytes),
        "open_files": int(limits.open_files),
        "processes": int(limits.processes),
        "user_processes": 0 if root else _user_processes(),
        "uid": uid,
        "cwd": str(work),
        "python": interpreter,
        "env": {"PATH": "/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8"},
    }
    report_r, report_w = os.pipe()
    spec["report_fd"] = report_w  # kept open in the launcher under the same number (pass_fds)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-I", str(JAIL), json.dumps(spec), str(program)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(report_w,),
        env={"PATH": "/usr/bin:/bin"},
        cwd=str(work),
        close_fds=True,
    )
    os.close(report_w)
    over = threading.Event()
    out, err = bytearray(), bytearray()
    readers = [
        threading.Thread(target=_drain, args=(stream, buf, limits.output_bytes, over), daemon=True)
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
        if time.perf_counter() >= deadline:
            status = "timeout"
            break
        over.wait(0.05)
    _kill_tree(proc, uid)
    for r in readers:
        r.join(timeout=5)
    with os.fdopen(report_r) as f:
        isolation = f.read().strip() or "none (the launcher failed before it applied any)"
    code = proc.returncode
    if status is None:
        status = "passed" if code == 0 else "failed"
    return Outcome(
        status,
        code,
        bytes(out[: limits.output_bytes]).decode(errors="replace"),
        bytes(err[: limits.output_bytes]).decode(errors="replace"),
        time.perf_counter() - t0,
        isolation,
    )


def _drain(stream, buf: bytearray, cap: int, over: threading.Event) -> None:
    """Read ``stream`` to its end, keeping the first ``cap`` bytes; past them, say so (the program is killed)."""
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            return
        if len(buf) < cap:
            buf.extend(chunk[: cap - len(buf)])
        if len(buf) >= cap and chunk:
            over.set()


def _kill_tree(proc: subprocess.Popen, uid: int | None) -> None:
    """The program's whole tree: its session's process group, and with it (where the launcher made one) its PID
    namespace, whose first process's death ends every process in it; then the launcher is reaped."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if uid is None:
        return
    deadline = time.monotonic() + 10.0  # its slot's user: whatever escaped the group, until the kernel has them all
    while time.monotonic() < deadline:
        left = pids_of(uid)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)


def pids_of(uid: int) -> list[int]:
    """The pids of every process ``uid`` runs now (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


_FOUND: tuple[str, bool] | None = None


def _interpreter() -> tuple[str, bool]:
    """The Python that runs programs, and whether the sandbox may switch to an unprivileged user for it: as root,
    the first of this interpreter and the system's that such a user can start (its files readable by others),
    found once by running a program that imports from the standard library; none is a SweepError (never as root)."""
    global _FOUND
    if _FOUND is None:
        if os.geteuid() != 0:
            _FOUND = (sys.executable, False)
            return _FOUND
        candidates = (os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3")
        for candidate in candidates:
            if os.path.exists(candidate) and _starts(candidate):
                _FOUND = (candidate, True)  # found: kept; not found is asked again next time (a probe may time out)
                return _FOUND
        raise SweepError(  # never as root: a program of the model's would own the machine
            f"sandbox: running as root, and no Python an unprivileged user (uid {FIRST_UID}) can start was found "
            f"among {', '.join(candidates)}; make one readable by others, or run sweep as an unprivileged user"
        )
    return _FOUND


def _starts(python: str) -> bool:
    work = Path(tempfile.mkdtemp(prefix="sweep-sandbox-probe-"))
    try:
        os.chown(work, FIRST_UID, FIRST_UID)
        (work / "p.py").write_text("import json, math, re, collections\n")
        os.chown(work / "p.py", FIRST_UID, FIRST_UID)
        spec = {
            "cpu_s": 10,
            "memory_bytes": 1 << 30,
            "file_bytes": 1 << 20,
            "open_files": 64,
            "processes": 16,
            "uid": FIRST_UID,
            "cwd": str(work),
            "python": python,
            "env": {"PATH": "/usr/bin:/bin"},
        }
        r, w = os.pipe()
        spec["report_fd"] = w
        done = subprocess.run(
            [sys.executable, "-I", str(JAIL), json.dumps(spec), str(work / "p.py")],
            pass_fds=(w,),
            capture_output=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
            cwd=str(work),
        )
        os.close(w)
        os.close(r)
        return done.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _user_processes() -> int:
    """Processes this user runs now (the limit on processes counts them all where the sandbox cannot switch user)."""
    return len(pids_of(os.geteuid()))
