"""A classic BPF interpreter for the sandbox's seccomp filter tests: what the kernel would answer, independent of
the filter's own assembler."""

from __future__ import annotations

import struct


def decide(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """A classic BPF interpreter of the few instructions a seccomp filter uses, run on one system call: what the
    kernel would answer (independent of the filter's own assembler)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    ops = [struct.unpack_from("<HBBI", program, at) for at in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = ops[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:  # ret k
            return k
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            hit = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += jt if hit else jf
        else:
            raise AssertionError(f"instruction {code:#x}")
        pc += 1
