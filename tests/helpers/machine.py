"""What a sandboxed program could leave on the machine, as a snapshot to take before and after it: the processes,
the files and folders under /tmp, /dev/shm and /var/tmp, the SysV IPC objects (shared memory, semaphores, message
queues) and the memory and cpu cgroups of the sandbox's users. The machine is shared: what others do meanwhile is told
apart by owner (``left_behind`` keeps what the given users own) and by lease (a user another evaluation holds now,
another test process's among them, owns what it has for that evaluation)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from sweep.tasks._slots import LOCK_DIRS
from sweep.tasks.sandbox import FIRST_UID, UIDS

ROOTS = ("/tmp", "/dev/shm", "/var/tmp")
DEPTH = 4  # a program's leftovers begin near the top; other users' trees below are not walked
CGROUPS = tuple(Path("/sys/fs/cgroup", c) for c in ("memory", "cpu"))  # a program's: sweep-sandbox-<uid> at the top
LOCKS = tuple(Path(d) / "sweep-sandbox" for d in (*LOCK_DIRS, "/tmp"))  # where the sandbox locks its users


def snapshot() -> frozenset[tuple]:
    """(kind, what, owner) of everything the sandbox's users own now."""
    uids = range(FIRST_UID, FIRST_UID + UIDS)
    found: set[tuple] = set()
    for pid, uid in _processes():
        if uid in uids:
            found.add(("process", pid, uid))
    for root in ROOTS:
        for path, uid in _files(root, DEPTH):
            if uid in uids:
                found.add(("file", path, uid))
    for kind in ("shm", "sem", "msg"):
        for ident, uid in _ipc(kind):
            if uid in uids:
                found.add((f"ipc {kind}", ident, uid))
    for where in (c for c in CGROUPS if c.is_dir()):
        groups = [p for p in where.glob("sweep-sandbox-*") if p.is_dir() and p.name.rsplit("-", 1)[1].isdigit()]
        found |= {("cgroup", str(p), int(p.name.rsplit("-", 1)[1])) for p in groups}
    return frozenset(found)


def sandbox_processes(under: int | None = None) -> set[int]:
    """The pids the sandbox's users run now (those descended from the process ``under``, when given)."""
    uids = range(FIRST_UID, FIRST_UID + UIDS)
    pids = {pid for pid, uid in _processes() if uid in uids}
    return pids if under is None else {pid for pid in pids if under in _ancestors(pid)}


def _ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1 and len(out) < 64:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])  # the field after the state: the parent
        except (OSError, IndexError, ValueError):
            break
        out.append(pid)
    return out


def left_behind(before: frozenset, after: frozenset, uids) -> set:
    """What ``uids`` own now and did not before, less what a user owns while another evaluation holds it (asked
    before and after a second look, which a leftover must survive too)."""
    mine = set(uids) - held(uids)
    left = {item for item in after - before if item[2] in mine}
    if left:
        mine -= held(uids)
        left &= {item for item in snapshot() - before if item[2] in mine}
        mine -= held(uids)
        left = {item for item in left if item[2] in mine}
    return left


def held(uids) -> set[int]:
    """Which of ``uids`` an evaluation on this machine holds now (the sandbox's lock on the user is taken)."""
    where = next((d for d in LOCKS if d.is_dir()), None)
    out = set()
    for uid in set(uids) if where else ():
        try:
            fd = os.open(where / str(uid), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # never leased
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            out.add(uid)
        finally:
            os.close(fd)  # (a lock taken here goes with it)
    return out


def _processes():
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/status", "rb") as f:
                    uid = next(int(line.split()[1]) for line in f if line.startswith(b"Uid:"))
                yield int(entry.name), uid
            except (OSError, StopIteration, ValueError):
                pass


def _files(root: str, depth: int):
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        yield entry.path, st.st_uid
        if depth > 1 and entry.is_dir(follow_symlinks=False):
            yield from _files(entry.path, depth - 1)


def _ipc(kind: str):
    try:
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
    except OSError:
        return
    if not lines:
        return
    header = lines[0].split()
    at_id, at_uid = header.index({"shm": "shmid", "sem": "semid", "msg": "msqid"}[kind]), header.index("uid")
    for line in lines[1:]:
        fields = line.split()
        yield int(fields[at_id]), int(fields[at_uid])


def unchanged():
    """A test's fixture (``machine = pytest.fixture(unchanged)``): the machine as the test found it; whatever the
    sandbox's users own that they did not before the test (of the users its programs ran as) fails it.
    ``machine(outcome)`` records a program's outcome."""
    before, ran = snapshot(), []
    yield lambda outcome: ran.append(outcome) or outcome
    assert not left_behind(before, snapshot(), {o.uid for o in ran if o.uid is not None})
