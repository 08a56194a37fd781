"""What a sandboxed program could leave on the machine, as a snapshot to take before and after it: the processes,
the files and folders under /tmp, /dev/shm and /var/tmp, the SysV IPC objects (shared memory, semaphores, message
queues) and the memory cgroups of the sandbox's users. The machine is shared: what others do meanwhile is told
apart by owner (``left_behind`` keeps what the given users own)."""

from __future__ import annotations

import os
from pathlib import Path

from sweep.tasks.sandbox import FIRST_UID, UIDS

ROOTS = ("/tmp", "/dev/shm", "/var/tmp")
DEPTH = 4  # a program's leftovers begin near the top; other users' trees below are not walked
CGROUPS = Path("/sys/fs/cgroup/memory/sweep-sandbox")


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
    if CGROUPS.is_dir():
        found |= {("cgroup", p.name, int(p.name)) for p in CGROUPS.iterdir() if p.is_dir() and p.name.isdigit()}
    return frozenset(found)


def sandbox_processes() -> set[int]:
    """The pids the sandbox's users run now."""
    uids = range(FIRST_UID, FIRST_UID + UIDS)
    return {pid for pid, uid in _processes() if uid in uids}


def left_behind(before: frozenset, after: frozenset, uids) -> set:
    """What ``uids`` own now and did not before."""
    return {item for item in after - before if item[2] in set(uids)}


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
