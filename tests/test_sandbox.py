"""The sandbox for code a model wrote (``sweep.tasks.sandbox``), fed hostile programs: each ends as a failed
problem, and the test process, its files, its environment and the machine are unharmed."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from sweep.errors import ConfigError
from sweep.tasks.sandbox import FIRST_UID, Limits, pids_of, require_allowed, run_program, run_programs

pytestmark = pytest.mark.faults  # hostile programs, and the sandbox's kills of their process trees

LIMITS = Limits(timeout_s=3.0, cpu_s=3, memory_bytes=512 << 20, output_bytes=4096)


def _ends_failed(source: str, limits: Limits = LIMITS):
    outcome = run_program(source, limits)
    assert outcome.status != "passed", outcome
    assert not pids_of(FIRST_UID)  # nothing of it left running
    return outcome


def test_a_plain_program_passes_and_says_what_isolated_it():
    outcome = run_program("import math\nassert math.isqrt(16) == 4\nprint('ok')\n", LIMITS)
    assert outcome.passed and outcome.stdout == "ok\n" and outcome.returncode == 0
    assert "limits (cpu, memory, file size, open files, processes)" in outcome.isolation
    if os.geteuid() == 0:
        assert "network namespace" in outcome.isolation and "unprivileged uid" in outcome.isolation
    assert run_program("assert 1 == 2\n", LIMITS).status == "failed"


def test_an_endless_loop_is_killed_at_its_timeout():
    outcome = _ends_failed("while True:\n    pass\n")
    assert outcome.status in ("timeout", "failed")  # the wall clock, or the CPU-seconds limit, whichever first


def test_a_fork_bomb_is_bounded_and_its_whole_tree_dies():
    from helpers.waiting import wait_for

    slot = 7  # its own user: whatever it leaves while the kernel reaps it never meets another test's program
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    outcome = run_program(bomb, LIMITS, slot=slot)
    assert outcome.status != "passed"
    wait_for(lambda: not pids_of(FIRST_UID + slot), "the fork bomb's processes to be gone")


def test_ten_gigabytes_of_memory_are_refused():
    outcome = _ends_failed("x = bytearray(10 * 1024 ** 3)\nprint(len(x))\n")
    assert "MemoryError" in outcome.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox switches user only when it runs as root")
def test_a_write_to_the_home_directory_is_refused():
    target = Path.home() / "sweep-sandbox-was-here"
    outcome = _ends_failed(f"open({str(target)!r}, 'w').write('x')\n")
    assert not target.exists() and "PermissionError" in outcome.stderr


def test_the_environment_holds_none_of_the_callers_secrets(monkeypatch):
    monkeypatch.setenv("SWEEP_TEST_SECRET", "s3cr3t-value")
    outcome = _ends_failed("import os\nprint(dict(os.environ))\nraise SystemExit(1)\n")
    assert "s3cr3t-value" not in outcome.stdout and "SWEEP_TEST_SECRET" not in outcome.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace needs root here")
def test_a_socket_to_the_loopback_reaches_nothing():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.setblocking(False)
        port = server.getsockname()[1]
        _ends_failed(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')\n")
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected


def test_a_kill_of_the_parent_misses():
    outcome = _ends_failed(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\n")
    assert ("PermissionError" in outcome.stderr) or ("ProcessLookupError" in outcome.stderr)


def test_a_gigabyte_of_output_is_capped_and_the_program_killed():
    outcome = _ends_failed("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    assert outcome.status == "output_limit" and len(outcome.stdout) <= LIMITS.output_bytes


def test_a_bounded_pool_keeps_the_programs_order():
    sources = [f"print({i})\nraise SystemExit({i % 2})\n" for i in range(5)]
    outcomes = run_programs(sources, LIMITS, workers=2)
    assert [o.stdout for o in outcomes] == [f"{i}\n" for i in range(5)]
    assert [o.passed for o in outcomes] == [i % 2 == 0 for i in range(5)]


def test_code_execution_is_opt_in():
    with pytest.raises(ConfigError) as info:
        require_allowed(False)
    assert str(info.value).startswith("eval.allow_code_execution=false: ")
    require_allowed(True)
