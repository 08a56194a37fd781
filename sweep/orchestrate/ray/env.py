"""The environment Ray must see when it is imported (it reads these variables then), the
embedded cluster's own token, and the leftovers of embedded clusters whose driver was killed.

Private state lives in ``state_dir()`` (mode 0700): per driver pid, ``PID.token`` (mode
0600, the embedded cluster's token) and ``PID.session.json`` (the session it started).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path

from sweep.config import ClusterConfig
from sweep.tasks.sandbox import pids_of
from sweep.errors import SweepError

log = logging.getLogger("sweep.orchestrate.ray.env")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
STATE_DIR_ENV = "SWEEP_STATE_DIR"  # overrides where the embedded clusters' tokens and records live
AUTH_DISABLED_WARNING = (
    "cluster.auth=disabled: any process that can reach the cluster's ports can run code in it, with the "
    "access of the user running Ray; use cluster.auth=token unless every such process is trusted"
)
_TOKEN_PATH: Path | None = None  # this process's embedded-cluster token, made once
_MADE: set[Path] = set()  # the token files this process wrote (one per state directory it used)


def is_loopback(address: str | None) -> bool:
    """An embedded Ray (None) or a cluster address on this machine's loopback."""
    if address is None:
        return True
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def ray_environment(cluster: ClusterConfig) -> None:
    """Set the auth mode explicitly, and for a Ray on loopback, Ray's single-machine mode.

    That mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the one Ray uses on macOS and
    Windows) makes every Ray server bind to 127.0.0.1 and clients connect over 127.0.0.1;
    otherwise Ray's gRPC servers listen on all interfaces and clients rewrite 127.0.0.1 to
    the machine's address. Ray reads both variables at import (``sweep.orchestrate.ray.start.start_ray``
    also sets the flag in an already imported Ray). An embedded cluster with token auth
    gets its own token (``embedded_token``), never ``~/.ray/auth_token``; ``disabled``
    logs a warning naming the risk. Call before anything imports ``ray``.
    """
    os.environ["RAY_AUTH_MODE"] = cluster.auth
    if cluster.auth == "disabled":
        log.warning(AUTH_DISABLED_WARNING)
    if is_loopback(cluster.address):
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if cluster.address is None and cluster.auth == "token":
        embedded_token()
    elif _is_own_token(os.environ.get("RAY_AUTH_TOKEN_PATH")):
        del os.environ["RAY_AUTH_TOKEN_PATH"]  # an existing cluster has its own token, not ours


def state_dir() -> Path:
    """This user's private directory (mode 0700) for embedded clusters' tokens and records:
    ``$SWEEP_STATE_DIR``, else ``$XDG_RUNTIME_DIR/sweep-ray``, else ``TMPDIR/sweep-ray-UID``."""
    from sweep.config.paths import check_writable_dir

    path = _state_path()
    given = bool(os.environ.get(STATE_DIR_ENV))
    key = STATE_DIR_ENV if given else "XDG_RUNTIME_DIR" if os.environ.get("XDG_RUNTIME_DIR") else "TMPDIR"
    check_writable_dir(key, path)  # a file in the way: one line naming it, exit code 2, before any work
    try:
        if given:
            path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SweepError(f"{key}: cannot create {path} ({exc.strerror or exc})") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise SweepError(f"{path}: not a directory owned by this user; refusing to keep Ray's token there")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def embedded_token() -> Path:
    """A random token (256 bits) for the embedded cluster this process starts, in
    ``state_dir()/PID.token`` (mode 0600), made once per process. Ray reads it through
    ``RAY_AUTH_TOKEN_PATH`` (``RAY_AUTH_TOKEN`` would take precedence, so it is dropped here);
    the cluster's processes inherit the variable. Ray's own ``~/.ray/auth_token``, shared by
    every cluster of the user, is neither read nor written. While a Ray this process started runs, its token
    file stays what it was: the raylet reads it each time it starts a worker process, and a worker with another
    token never registers (Ray then gives up: "worker startup repeatedly failed")."""
    global _TOKEN_PATH
    running = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    if running and _TOKEN_PATH is not None and _TOKEN_PATH.is_file():
        path = _TOKEN_PATH  # a Ray this process runs reads its token when it starts a worker: never rotated under it
    else:
        path = state_dir() / f"{os.getpid()}.token"
    if _TOKEN_PATH != path or not path.is_file():
        if path.is_file() and path in _MADE:
            pass  # made by this process (another state directory was used meanwhile): the same token again
        else:
            path.unlink(missing_ok=True)  # a dead process's file with this pid
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
            _MADE.add(path)
        if _TOKEN_PATH is None:
            atexit.register(_remove_own_state)
        _TOKEN_PATH = path
        _reset_ray_token_cache()
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
    return path


def record_embedded_session() -> Path:
    """Record the embedded cluster this driver just started (Ray's session directory, the
    driver's pid and the pids of the cluster's processes, each with its start time) in
    ``state_dir()/PID.session.json``, for ``stop_leftover_sessions`` after a killed driver."""
    from sweep.orchestrate.ray import internals as _ray_private

    session_dir, started = _ray_private.embedded_session()
    pids = {pid for group in started.values() for pid in group}
    pids |= {child for pid in list(pids) for child in descendants(pid)}  # the raylet's agents and workers
    record = {
        "driver_pid": os.getpid(),
        "driver_start": _start_time(os.getpid()),
        "session_dir": os.path.realpath(session_dir),
        "processes": [{"pid": pid, "start": _start_time(pid)} for pid in sorted(pids) if _start_time(pid)],
    }
    path = state_dir() / f"{os.getpid()}.session.json"
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)
    return path


def stop_leftover_sessions(grace_s: float = 2.0) -> list[dict]:
    """Stop what is left of embedded clusters whose driver died (SIGKILL leaves Ray's
    DashboardAgent and RuntimeEnvAgent running), as recorded by ``record_embedded_session``.

    Only sessions whose driver pid is gone (or now a different process) are touched. A process
    is stopped only if it still belongs to the recorded session: a recorded pid with the same
    start time, or any process of this user, and in both cases its command line or one of its
    open files is inside the session's directory; a reused pid never matches. Never by process
    name. SIGTERM, then SIGKILL after ``grace_s``. Returns one dict per session cleaned up
    (``session_dir``, ``driver_pid``, ``stopped``: the pids stopped)."""
    from sweep.userfiles import read_json

    directory = state_dir()
    cleaned = []
    for path in sorted(directory.glob("*.session.json")):
        try:
            record = read_json(path)  # a regular file of a capped size, JSON of bounded depth (sweep.userfiles)
            driver, session_dir = int(record["driver_pid"]), str(record["session_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("%s: unreadable record of an embedded Ray session; removed", path)
            path.unlink(missing_ok=True)
            continue
        if _running(driver, record.get("driver_start")):
            continue
        victims = {
            int(p["pid"])
            for p in record.get("processes", [])
            if _running(int(p["pid"]), p.get("start")) and _belongs(int(p["pid"]), session_dir)
        }
        victims |= {pid for pid in _own_pids() if _belongs(pid, session_dir)}
        victims.discard(os.getpid())
        _stop(victims, grace_s)
        path.unlink(missing_ok=True)
        (directory / f"{driver}.token").unlink(missing_ok=True)
        if victims:
            log.info(
                "stopped %d leftover process(es) of embedded Ray session %s (driver pid %d is gone)",
                len(victims),
                os.path.basename(session_dir),
                driver,
            )
        cleaned.append({"session_dir": session_dir, "driver_pid": driver, "stopped": sorted(victims)})
    for token in directory.glob("*.token"):  # tokens of drivers that died before recording a session
        pid = token.name.split(".", 1)[0]
        if pid.isdigit() and not _running(int(pid), None):
            token.unlink(missing_ok=True)
    return cleaned


def _state_path() -> Path:
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV]).absolute()
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "sweep-ray"
    return Path(tempfile.gettempdir()) / f"sweep-ray-{os.geteuid()}"


def _is_own_token(path: str | None) -> bool:
    return bool(path) and Path(path).parent == _state_path() and Path(path).name.endswith(".token")


def _reset_ray_token_cache() -> None:
    """An already imported, not yet started Ray may have cached another token: drop it."""
    if "ray._raylet" in sys.modules and not sys.modules["ray"].is_initialized():
        from sweep.orchestrate.ray import internals as _ray_private

        _ray_private.reset_token_cache()


def _remove_own_state() -> None:
    """At exit, once this process's Ray is shut down: its token and session record."""
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        return  # still running: the next stop_leftover_sessions removes them
    directory = _state_path()
    for name in (f"{os.getpid()}.token", f"{os.getpid()}.session.json"):
        (directory / name).unlink(missing_ok=True)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with the pid, its identity."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _running(pid: int, start: int | None) -> bool:
    """``pid`` is a live process (not a zombie) and, if ``start`` is given, the same one."""
    fields = _stat_fields(pid)
    if not fields or fields[0] == "Z":
        return False
    return start is None or int(fields[19]) == int(start)


def _own_pids() -> list[int]:
    return pids_of(os.geteuid())


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` among this user's processes (from /proc)."""
    children: dict[int, list[int]] = {}
    for child in _own_pids():
        fields = _stat_fields(child)
        if fields:
            children.setdefault(int(fields[1]), []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _belongs(pid: int, session_dir: str) -> bool:
    """The process's command line names ``session_dir`` or it has a file open inside it."""
    proc = Path("/proc") / str(pid)
    try:
        if session_dir in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
            return True
        for fd in (proc / "fd").iterdir():
            try:
                if os.readlink(fd).startswith(session_dir + os.sep):
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False


def _stop(pids: set[int], grace_s: float) -> None:
    starts = {pid: _start_time(pid) for pid in pids}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            if _running(pid, starts[pid]):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        deadline = time.monotonic() + grace_s
        while any(_running(pid, starts[pid]) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
