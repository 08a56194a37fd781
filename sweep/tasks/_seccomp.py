"""The system-call filter of each sandboxed program (``sweep.tasks.sandbox``): a classic BPF program that bubblewrap
hands the kernel (``bwrap --seccomp FD``) just before the launcher starts, and that the kernel runs on every
system call of the program and its children. It refuses what the namespaces leave shared with the machine:

- a socket of any address family but AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK (those the network namespace
  makes the sandbox's own): vsock, for one, is not namespaced, so a program could take the machine's vsock ports
  or listen on them (EAFNOSUPPORT);
- the kernel's keys (``add_key``, ``keyctl``, ``request_key``): a key outlives the program and is seen by every
  later process of its user (EPERM);
- ``io_uring`` (its operations, sockets included, are not system calls the filter sees), ``bpf``,
  ``perf_event_open`` and ``userfaultfd``: kernel interfaces no program of a benchmark needs (EPERM).

A system call of another ABI than the interpreter's (x32 on x86-64, or a 32-bit program) kills the process: its
calls have other numbers. Built for x86-64 and AArch64; elsewhere there is no filter and the sandbox says so.
"""

from __future__ import annotations

import errno
import platform
import struct

SOCKET_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
DENIED = ("add_key", "keyctl", "request_key", "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf")
DENIED += ("perf_event_open", "userfaultfd")

# per machine: the audit architecture the kernel reports, the first number of another ABI sharing it (x32), and
# the system calls' numbers (the kernel's unistd tables: arch/x86/entry/syscalls/syscall_64.tbl, asm-generic)
_ARCHES = {
    "x86_64": (0xC000003E, 0x40000000, {"socket": 41, "socketpair": 53, "add_key": 248, "request_key": 249,
               "keyctl": 250, "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
               "io_uring_enter": 426, "io_uring_register": 427}),
    "aarch64": (0xC00000B7, None, {"socket": 198, "socketpair": 199, "add_key": 217, "request_key": 218,
                "keyctl": 219, "perf_event_open": 241, "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425,
                "io_uring_enter": 426, "io_uring_register": 427}),
}  # fmt: skip

# classic BPF: load a word of struct seccomp_data, compare, return
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in seccomp_data (args[0]'s low word: little-endian machines only)
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
    for call in DENIED:
        code.append((_JEQ, numbers[call], "deny", None))
    code += [(_JEQ, numbers["socket"], "family", None), (_JEQ, numbers["socketpair"], "family", None)]
    code += [(_RET, ALLOW), ("family",), (_LD, _ARG0)]
    code += [(_JEQ, family, "allow", None) for family in SOCKET_FAMILIES]
    code += [(_RET, _errno(errno.EAFNOSUPPORT)), ("deny",), (_RET, _errno(errno.EPERM)), ("allow",), (_RET, ALLOW)]
    code += [("kill",), (_RET, KILL)]
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
        if op[0] in (_JEQ, _JGE):
            jt, jf = (0 if t is None else at[t] - i - 1 for t in op[2:])
            out.append(struct.pack("<HBBI", op[0], jt, jf, op[1]))
        else:
            out.append(struct.pack("<HBBI", op[0], 0, 0, op[1]))
        i += 1
    return b"".join(out)
