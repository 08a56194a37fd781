"""What a sandbox slot holds on the machine (as root): an unprivileged user no other evaluation on the machine has
while it is leased (an exclusive lock on a file under ``/run/lock/sweep-sandbox``, released by the kernel when its
process ends, however it ends), and per program a memory cgroup of its own that limits the whole process tree and
a cpu cgroup that gives the tree one fair share of the processors.

Whatever a dead holder of a user left (processes, a cgroup) is removed when the user is next leased: the lock says
nobody else has it.
"""

from __future__ import annotations

import fcntl
import functools
import grp
import os
import pwd
import signal
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sweep.errors import SweepError

# the sandbox's users; each slot of every evaluation on the machine has its own. Outside the ranges a Linux machine
# gives out: login.defs's users (at most 60000 by default), systemd's (60001..60577 for systemd-homed and nspawn,
# 61184..65519 for DynamicUser= services, which appear in the user database only while they run) and the subordinate
# ids of rootless containers (/etc/subuid, from 100000 by default)
FIRST_UID = 70000
UIDS = 1024
LOCK_DIRS = ("/run/lock", "/var/lock")
CGROUP_NAME = "sweep-sandbox"  # a program's cgroups: sweep-sandbox-<uid> at the top of each hierarchy
KILL_S = 10.0  # the kernel reaps a killed tree in milliseconds; past this, cleanup has failed


@contextmanager
def lease(n: int) -> Iterator[list[int]]:
    """``n`` users (uids) that no other evaluation on this machine holds until the block ends."""
    held: list[tuple[int, int]] = []
    try:
        if n:
            where = _lock_dir()
            for uid in range(FIRST_UID, FIRST_UID + UIDS):
                if len(held) == n:
                    break
                fd = _try_lock(where / str(uid), uid)
                if fd is not None:
                    held.append((uid, fd))
                    reclaim(uid)
            if len(held) < n:
                raise SweepError(
                    f"sandbox: {n} users wanted, {len(held)} of uids {FIRST_UID}..{FIRST_UID + UIDS - 1} free "
                    f"(each sandbox slot on this machine holds one); lower eval.workers or wait for other evaluations"
                )
        yield [uid for uid, _ in held]
    finally:
        for _, fd in held:
            os.close(fd)  # the lock goes with the descriptor


def _lock_dir() -> Path:
    base = next((Path(d) for d in LOCK_DIRS if os.path.isdir(d)), None) or Path("/tmp")
    where = base / "sweep-sandbox"
    try:
        where.mkdir(mode=0o755, exist_ok=True)
        st = os.lstat(where)
    except OSError as exc:
        raise SweepError(f"sandbox: {where}: {exc.strerror}; the sandbox keeps its users' locks there") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise SweepError(f"sandbox: {where} is not a directory of root's that only root can write; remove it")
    return where


def _try_lock(path: Path, uid: int) -> int | None:
    if _known(pwd.getpwuid, uid) or _known(grp.getgrgid, uid):
        return None  # a real user of this machine, or a real group (the program's gid is its uid): never the sandbox's
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


def _known(lookup, uid: int) -> bool:
    try:
        lookup(uid)
        return True
    except KeyError:
        return False


def reclaim(uid: int) -> None:
    """Whatever a dead holder of ``uid`` left: its processes, its cgroup."""
    kill_all(lambda: pids_of(uid))
    remove_cgroup(uid)


def pids_of(uid: int) -> list[int]:
    """The pids of every process whose real user is ``uid`` (from /proc)."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"Uid:"):
                            if int(line.split()[1]) == uid:
                                out.append(int(entry.name))
                            break
            except (OSError, ValueError, IndexError):
                pass
    return out


def kill_all(pids, deadline_s: float = KILL_S) -> bool:
    """SIGKILL every pid ``pids()`` names until it names none: False if some are still there at the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        left = pids()
        if not left:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)


# -- the cgroups: memory (a limit on the whole tree) and cpu (one fair share, however many sessions the tree makes)

CONTROLLERS = ("memory", "cpu")


@functools.cache
def hierarchy(controller: str) -> Path | None:
    """The writable cgroup v1 hierarchy of ``controller``, or None."""
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                _, where, kind, options = line.split()[:4]
                if kind == "cgroup" and controller in options.split(","):
                    root = Path(where.replace("\\040", " "))
                    return root if os.access(root, os.W_OK) else None
    except OSError:
        pass
    return None


def memory_root() -> Path | None:
    return hierarchy("memory")


def controllers() -> tuple[str, ...]:
    """The controllers a program's cgroups can have here (as root, where their v1 hierarchies are writable)."""
    return tuple(c for c in CONTROLLERS if hierarchy(c) is not None) if os.geteuid() == 0 else ()


def _group(controller: str, uid: int) -> Path | None:
    """``uid``'s cgroup in ``controller``'s hierarchy: at its top (``sweep-sandbox-<uid>``), so that to the scheduler
    each program is one group beside the machine's others, as its session was before (under a parent of their own,
    every program of the machine together would have one share); None where that hierarchy is not writable."""
    root = hierarchy(controller)
    return None if root is None else root / f"{CGROUP_NAME}-{uid}"


def make_cgroup(uid: int, memory_bytes: int) -> dict[str, Path]:
    """Fresh cgroups for one program of ``uid``: memory, its limit (memory and swap) on the whole tree, and cpu, a
    group of its own that the scheduler gives one share, so the processes and sessions a program makes compete as
    one beside the other programs (without one, each session it makes is a group of the scheduler's own). Their
    ``cgroup.procs`` files by controller, to move the program's first process into; none where none can be made.
    Controllers mounted together share one group, made once (the memory limit kept)."""
    made: dict[str, Path] = {}
    for controller in controllers():
        group = _group(controller, uid)
        procs = group / "cgroup.procs"
        if procs in made.values():  # co-mounted with a controller already made
            made[controller] = procs
            continue
        try:
            _remove(controller, uid)
            group.mkdir()
            if controller == "memory":
                (group / "memory.limit_in_bytes").write_text(str(memory_bytes))
                swap = group / "memory.memsw.limit_in_bytes"
                if swap.exists():
                    swap.write_text(str(memory_bytes))
        except OSError:
            _remove(controller, uid)
            continue
        made[controller] = procs
    return made


def cgroup_pids(uid: int, controller: str = "memory") -> list[int]:
    group = _group(controller, uid)
    try:
        text = (group / "cgroup.procs").read_text() if group else ""
    except OSError:
        return []
    return [int(p) for p in text.split()]


def remove_cgroup(uid: int) -> bool:
    """Kill what is in ``uid``'s cgroups and remove them: False if one is still there."""
    return all([_remove(controller, uid) for controller in CONTROLLERS])


def _force_empty(group: Path) -> None:
    """Reclaim what ``group`` is charged (cgroup v1; a task still in it makes the kernel refuse: the next try)."""
    try:
        (group / "memory.force_empty").write_text("0")
    except OSError:
        pass


def _remove(controller: str, uid: int) -> bool:
    group = _group(controller, uid)
    if group is None or not group.exists():
        return True
    deadline = time.monotonic() + KILL_S
    while True:
        kill_all(lambda: cgroup_pids(uid, controller))
        if controller == "memory":  # the page cache its reads were charged: else a removed group lives on, dying
            _force_empty(group)
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY while the kernel finishes its last task
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
