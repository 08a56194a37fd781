"""The launcher of one sandboxed program (``sweep.tasks.sandbox``), run as a plain file by a fresh interpreter
(``python -I _jail.py SPEC_JSON PROGRAM``): it imports nothing of the project.

In order: its own session (the sandbox kills the whole group); where the machine allows, new network and PID
namespaces (no network but a loopback that is down; the program's processes die with its namespace's first
process); the resource limits; an unprivileged user where it runs as root (then the limit on processes holds, and
the user's files and processes are out of reach); then the program, in its own directory, with the environment the
spec gives. It writes one line to the report pipe first (``report_fd``): the isolation that applied.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000


def _unshare(flags: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.unshare(flags) == 0
    except (OSError, AttributeError):
        return False


def main() -> None:
    spec, program = json.loads(sys.argv[1]), sys.argv[2]
    os.setsid()
    applied = []
    if _unshare(CLONE_NEWNET):
        applied.append("network namespace")
    pid_ns = _unshare(CLONE_NEWPID)  # the next child is the namespace's first process
    if pid_ns:
        applied.append("pid namespace")
        child = os.fork()
        if child:  # the launcher waits and passes the program's exit status on
            os.close(spec["report_fd"])
            _, status = os.waitpid(child, 0)
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)
    limits = {
        resource.RLIMIT_CPU: spec["cpu_s"],
        resource.RLIMIT_AS: spec["memory_bytes"],
        resource.RLIMIT_FSIZE: spec["file_bytes"],
        resource.RLIMIT_NOFILE: spec["open_files"],
        resource.RLIMIT_CORE: 0,
    }
    uid = spec.get("uid")
    root = os.geteuid() == 0
    if root and uid is not None:
        os.setgroups([])
        os.setgid(uid)
        limits[resource.RLIMIT_NPROC] = spec["processes"]
    else:  # the limit counts every process of this user: room for the program's own above what runs now
        limits[resource.RLIMIT_NPROC] = spec["processes"] + spec.get("user_processes", 0)
    for kind, value in limits.items():
        resource.setrlimit(kind, (value, value))
    applied.append("limits (cpu, memory, file size, open files, processes)")
    if root and uid is not None:
        os.setuid(uid)
        applied.append(f"unprivileged uid {uid}")
    with os.fdopen(spec["report_fd"], "w") as report:
        report.write(", ".join(applied) + "\n")
    os.chdir(spec["cwd"])
    python = spec.get("python") or sys.executable
    os.execve(python, [python, "-I", "-S", program], spec["env"])


if __name__ == "__main__":
    main()
