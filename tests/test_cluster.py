"""Fault tolerance and clusters, with real processes: an interrupted driver resumes, a
killed worker's trial is retried, a two-node Ray cluster on 127.0.0.1 runs a sweep
submitted through jobs/, and a node removed mid-sweep loses no trial."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.rows import wait_for_rows
from helpers.signals import takes_ctrl_c
from conftest import ROOT, descendants, subprocess_env
from sweep.store import files, read

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]  # whole sweeps on real clusters

# trials of a few seconds each (a fault must meet one running); four settings, one per Tune trial and one at a
# time, so rows land one by one and a fault after the first meets the next one running and two still to run
SLOW_TRIALS = ["model=tiny-llama", "prompts.n=2", "bench.gen_tokens=40", "bench.repeats=8", "bench.warmup=0"]
FOUR = [
    "search.spaces=[{gate: saturation, gate.min_layer: 2, gate.eps: 'choice(0.05,0.1,0.2,0.4)'}]",
    "sweep.shared_baseline=1",
    "sweep.max_concurrent=1",
]
SWEEP = str(Path(sys.executable).with_name("sweep"))


env = subprocess_env


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def assert_each_trial_once(root: Path, n: int) -> None:
    df = read("trials", root)
    assert df.height == n and df["trial_id"].n_unique() == n, df.select("trial_id", "status")
    assert len(files("trials", root)) == n
    assert set(df["status"]) == {"ok"}


@pytest.mark.faults
def test_an_interrupted_driver_resumes_without_losing_or_repeating_a_trial(tmp_path):
    args = [SWEEP, "run", *SLOW_TRIALS, *FOUR, f"results.root={tmp_path}"]
    proc = subprocess.Popen(
        args, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=takes_ctrl_c
    )
    wait_for_rows(tmp_path, 1, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted: resume with" in err
    # said when the first Ctrl-C lands, before the seconds its stop takes
    assert err.index("interrupted: stopping the running settings") < err.index("interrupted: resume with")
    assert "(Ctrl-C again to stop sooner)" in err
    done_before = len(files("trials", tmp_path))
    assert 1 <= done_before < 4
    resumed = subprocess.run([*args, "resume=true"], env=env(), capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming sweep saturation-grid-" in resumed.stderr
    assert_each_trial_once(tmp_path, 4)


@pytest.mark.faults
def test_a_killed_worker_is_retried(tmp_path):
    # one setting per Tune trial, so rows land one by one and a worker is busy when killed
    args = [SWEEP, "run", *SLOW_TRIALS, *FOUR, f"results.root={tmp_path}", "sweep.max_failures=3"]
    proc = subprocess.Popen(args, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_rows(tmp_path, 1, proc)
    victims = [p for p in descendants(proc.pid) if "ray::ImplicitFunc" in cmdline(p)]
    assert victims, "no trial worker found"
    os.kill(victims[0], signal.SIGKILL)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-2000:]
    assert "lost its worker; retrying it" in err
    assert "Traceback" not in err and "Trial task failed" not in err  # the sweep's line, not Tune's 40
    assert_each_trial_once(tmp_path, 4)
    assert len(set(read("trials", tmp_path)["worker_pid"])) >= 2  # a new worker took over


def own_token(directory: Path) -> str:
    """A token file of the test's own (never ~/.ray/auth_token, which CI has not got)."""
    import secrets

    token = directory / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    return str(token)


def _local_cluster(workers: int, cluster_env: dict):
    """A head and ``workers`` worker nodes on 127.0.0.1 in a helper process (tests/helpers/local_cluster.py) under
    ``cluster_env``; yields what it prints (gcs, dashboard), its process and that environment, and shuts it down."""
    helper = ROOT / "tests" / "helpers" / "local_cluster.py"
    proc = subprocess.Popen(
        [sys.executable, str(helper), str(workers)],
        env=cluster_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line, proc.stderr.read()[-2000:]
    info = json.loads(line)
    info["proc"], info["env"] = proc, cluster_env
    yield info
    proc.stdin.close()
    proc.wait(timeout=60)


def _two_node_cluster(tmp_path_factory):
    """A head and one worker node on 127.0.0.1 (token auth with a token of its own), in a helper
    process; ``env`` is the environment of a driver or submitter that talks to it."""
    yield from _local_cluster(1, env(RAY_AUTH_TOKEN_PATH=own_token(tmp_path_factory.mktemp("token"))))


# the tests that leave the cluster as they found it share one; the one that removes a node has its own (it comes
# first in this file: the shared one starts at its first use, after it)
two_node_cluster = pytest.fixture(scope="module")(_two_node_cluster)
own_two_node_cluster = pytest.fixture()(_two_node_cluster)


@pytest.mark.faults
def test_removing_a_node_mid_sweep_loses_no_trial(own_two_node_cluster, tmp_path):
    cluster = own_two_node_cluster  # its own: it removes a node
    args = [
        SWEEP,
        "run",
        *SLOW_TRIALS,
        *FOUR,
        "cluster=existing",
        f"cluster.address={cluster['gcs']}",
        f"results.root={tmp_path}",
        "sweep.max_failures=3",
    ]
    proc = subprocess.Popen(args, env=cluster["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_rows(tmp_path, 1, proc)
    helper = cluster["proc"]
    helper.stdin.write("remove-worker\n")
    helper.stdin.flush()
    assert helper.stdout.readline().strip() == "removed"
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-2000:]
    assert_each_trial_once(tmp_path, 4)


def test_a_sweep_submitted_through_jobs_finds_every_row(two_node_cluster, tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "jobs" / "submit.py"),
            "--address",
            two_node_cluster["dashboard"],
            "--",
            "model=tiny-llama",
            "prompts.n=1",
            "bench.gen_tokens=4",
            "bench.repeats=1",
            "bench.warmup=0",
            f"results.root={tmp_path}",
        ],
        env=two_node_cluster["env"],
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert "submitted raysubmit_" in res.stdout and "SUCCEEDED" in res.stdout
    assert f"rows under {tmp_path}/trials" in res.stdout
    assert_each_trial_once(tmp_path, 8)
    rows = read("trials", tmp_path)
    nodes = rows["worker_pid"].n_unique()
    assert nodes >= 2  # both nodes' workers ran trials
    # the job ran from a staged copy without .git: its rows carry the submitter's commit and the job's id
    submission_id, commit = re.search(r"submitted (raysubmit_\w+) to \S+ \(commit (\S+)\)", res.stdout).groups()
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit), commit  # this checkout is a git checkout
    assert set(rows["git_sha"]) == {commit}
    assert set(rows["submission_id"]) == {submission_id}


def _submit(cluster: dict, *args: str, **extra: str) -> subprocess.CompletedProcess:
    """jobs/submit.py to the test cluster's job server, with ``args`` (flags, then `--` and overrides)."""
    command = [sys.executable, str(ROOT / "jobs" / "submit.py"), "--address", cluster["dashboard"], *args]
    return subprocess.run(command, env={**cluster["env"], **extra}, capture_output=True, text=True, timeout=500)


def test_a_skipset_screen_reads_its_sub_spaces_relative_paths_where_sweep_run_ran(two_node_cluster, tmp_path):
    """A skip-set search's sub-space names `prompts.path: p.jsonl` relative to where `sweep run` ran; the cluster's
    workers run elsewhere. Before: the screen's Ray task composed the raw path in its own working directory
    ("prompts.path=...: no such file") and the sweep failed before any setting ran."""
    lines = [json.dumps({"id": "p0", "prompt": "def add(a, b):"})]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    space = "search.spaces=[{gate: skip, bench.mode: self_speculative, prompts: jsonl, prompts.path: p.jsonl}]"
    args = ["model=tiny-llama", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0", space]
    args += ["search=skipset-random", "search.n_trials=2", "search.closed_loop=1", "search.skip_ratio=[0,1]"]
    args += ["cluster=existing", f"cluster.address={two_node_cluster['gcs']}", "results.root=r"]
    done = subprocess.run(
        [SWEEP, "run", *args], env=two_node_cluster["env"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read("trials", tmp_path / "r")
    assert rows.height == 1 and set(rows["status"]) == {"ok"} and rows["prompt_set"].to_list() == ["jsonl"]
    assert str((tmp_path / "p.jsonl").resolve()) in rows["trial_key"][0]


def test_jobs_submit_with_another_token_is_one_line(two_node_cluster, tmp_path):
    (tmp_path / "other").mkdir()
    res = _submit(two_node_cluster, "--", "model=tiny-llama", f"results.root={tmp_path}",
                  RAY_AUTH_TOKEN_PATH=own_token(tmp_path / "other"))  # fmt: skip
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    [line] = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: --address {two_node_cluster['dashboard']}: the job server refused this client")


def test_a_failed_job_says_why(two_node_cluster, tmp_path):
    res = _submit(two_node_cluster, "--python", str(tmp_path / "no-python"), "--", "model=tiny-llama",
                  f"results.root={tmp_path}")  # fmt: skip
    assert res.returncode == 1, (res.stdout + res.stderr)[-2000:]
    [line] = [line for line in res.stdout.splitlines() if line.startswith("job raysubmit_")]
    assert ": FAILED (" in line and "exit code 127" in line, line  # the job server's reason, not only "FAILED"
    assert "last available logs" not in line and "exit code 127; its log is above)" in line, line


def test_ctrl_c_while_following_a_job_leaves_it_running_and_names_the_stop_command(two_node_cluster, tmp_path):
    """Ctrl-C stops following, not the job: rc 130 (as `sweep run` ends on Ctrl-C) and the stop command with the
    address; the job then stopped by it."""
    import threading

    from helpers.waiting import wait_for

    root = tmp_path / "r"
    command = [sys.executable, str(ROOT / "jobs" / "submit.py"), "--address", two_node_cluster["dashboard"], "--",
               *SLOW_TRIALS, *FOUR, f"results.root={root}"]  # fmt: skip
    proc = subprocess.Popen(command, env=two_node_cluster["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=takes_ctrl_c)  # fmt: skip
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    wait_for(lambda: files("trials", root), "the job's first row", timeout=400, poll=0.5)  # it is being followed
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    reader.join(timeout=30)
    assert proc.returncode == 130, err[-2000:]
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    job = re.search(r"submitted (raysubmit_\w+)", "".join(out)).group(1)
    stop = f"`ray job stop --address {two_node_cluster['dashboard']} {job}` stops it"
    assert line == f"error: stopped following; job {job} keeps running ({stop})", line
    done = subprocess.run([str(Path(sys.executable).with_name("ray")), "job", "stop", "--address",
                           two_node_cluster["dashboard"], job], env=two_node_cluster["env"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]  # it was still running


def test_ray_job_stop_lets_the_sweep_release_its_claims_and_print_its_resume_line(two_node_cluster, tmp_path):
    """`ray job stop` sends SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (3 s by Ray's default, too short
    for a sweep to stop its trials on a loaded machine): the job's environment gives it the time to end as it does on
    any SIGTERM. (With the wait set to 0 this fails: the setting reaches Ray's job supervisor; checked.)"""
    from helpers.waiting import wait_for

    root = tmp_path / "r"
    res = _submit(two_node_cluster, "--no-follow", "--", *SLOW_TRIALS, *FOUR, f"results.root={root}")
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    job = re.search(r"submitted (raysubmit_\w+)", res.stdout).group(1)
    wait_for(lambda: files("trials", root), "the job's first row", timeout=400, poll=0.5)

    def ray_job(*args: str) -> str:  # the command `submit.py` names, as a user runs it
        command = [str(Path(sys.executable).with_name("ray")), "job", *args, "--address", two_node_cluster["dashboard"]]
        done = subprocess.run(command, env=two_node_cluster["env"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
        return done.stdout

    ray_job("stop", job)  # returns once the job has stopped
    logs = ray_job("logs", job)
    assert "stopped by SIGTERM: resume with `sweep run " in logs, logs[-3000:]
    assert not list((root / "claims").glob("*.json")), "the stopped job's claims were not released"


def _submit_to_nothing(*overrides: str, **extra: str) -> subprocess.CompletedProcess:
    """jobs/submit.py against an address where no job server answers."""
    command = [sys.executable, str(ROOT / "jobs" / "submit.py"), "--address", "http://127.0.0.1:9", "--", *overrides]
    return subprocess.run(command, env=env(**extra), capture_output=True, text=True, timeout=120)


def test_jobs_submit_rejects_bad_input_before_contacting_a_cluster():
    res = _submit_to_nothing("model=tiny-llama", "results.root=results")
    assert res.returncode == 2 and "results.root: pass an absolute path" in res.stderr
    for other in ("cluster=local", "cluster.address=10.0.0.5:6379"):  # the job joins the cluster it is sent to
        res = _submit_to_nothing("model=tiny-llama", "results.root=/tmp/x", other)
        assert res.returncode == 2 and f"error: {other}: the job joins the cluster it is submitted to" in res.stderr
    res = _submit_to_nothing("model=nope", "results.root=/tmp/x")
    assert res.returncode == 2 and "model=nope: unknown option" in res.stderr
    # a setting's gate past its model's depth, as `sweep run` finds it before Ray (before: submitted, failed there)
    space = "search.spaces=[{gate: saturation, gate.min_layer: 'choice(1,99)'}]"
    res = _submit_to_nothing("model=tiny-llama", "results.root=/tmp/x", space)
    assert res.returncode == 2 and "error: gate.min_layer=99: must be in 1..4 (L=4 for this model)" in res.stderr
    # a key that walks into a list by a name: one line naming it (before: a 44-line traceback)
    res = _submit_to_nothing("model=tiny-llama", "results.root=/tmp/x", "search.spaces.saturation.eps=1")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    [line] = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: search.spaces.saturation.eps=1: cannot be set (Index 'saturation' (str) is not")


def test_jobs_submit_without_a_token_says_where_one_goes(tmp_path):
    res = _submit_to_nothing("model=tiny-llama", f"results.root={tmp_path}", HOME=str(tmp_path))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    [line] = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: --auth token: no Ray auth token here: set RAY_AUTH_TOKEN_PATH"), line
    missing = tmp_path / "nowhere"
    res = _submit_to_nothing("model=tiny-llama", f"results.root={tmp_path}", RAY_AUTH_TOKEN_PATH=str(missing))
    assert res.returncode == 2 and f"error: RAY_AUTH_TOKEN_PATH={missing}: no such file" in res.stderr


def test_jobs_submit_to_nothing_fails_fast(tmp_path):
    res = _submit_to_nothing("model=tiny-llama", f"results.root={tmp_path}", RAY_AUTH_TOKEN_PATH=own_token(tmp_path))
    assert res.returncode == 2 and "--address http://127.0.0.1:9: no Ray job server answers there" in res.stderr


def test_joining_a_token_protected_cluster_with_another_token_is_one_line(two_node_cluster, tmp_path):
    """A client whose token is not the cluster's: refused by the cluster, said in one line naming the key and the
    refusal (asked of the cluster before ray.init, which retries a refused token for about 20 seconds)."""
    exe = Path(sys.executable).with_name("sweep")
    (tmp_path / "other").mkdir()
    wrong = env(RAY_AUTH_TOKEN_PATH=own_token(tmp_path / "other"))
    res = subprocess.run(
        [str(exe), "run", "cluster=existing", f"cluster.address={two_node_cluster['gcs']}", "model=tiny-llama",
         f"results.root={tmp_path / 'r'}", "--quiet"],
        env=wrong, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    [line] = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert f"cluster.address={two_node_cluster['gcs']}" in line and "unexpected" not in res.stderr
    assert "the Ray cluster there refused this client's token" in line  # said so, not a connection that failed


def test_joining_with_no_token_at_all_is_one_line(tmp_path):
    """Token auth and no token anywhere (no RAY_AUTH_TOKEN, no RAY_AUTH_TOKEN_PATH, no ~/.ray/auth_token): one line
    naming cluster.address, rc 2, nothing written; Ray sends nothing (a plain listener stands where the GCS would)."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        res = subprocess.run(
            [SWEEP, "run", "cluster=existing", f"cluster.address={address}", "model=tiny-llama",
             f"results.root={tmp_path / 'r'}", "--quiet"],
            env=env(HOME=str(tmp_path)), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    [line] = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: cluster.address={address}: Ray would not connect without a token ("), line
    assert "unexpected" not in res.stderr and not (tmp_path / "r").exists()


@pytest.fixture(scope="module")
def cluster_without_auth():
    """A head node on 127.0.0.1 with token auth off (RAY_AUTH_MODE=disabled), in a helper process."""
    yield from _local_cluster(0, env(RAY_AUTH_MODE="disabled"))


def test_token_auth_against_a_cluster_without_it_is_one_line_before_any_work(cluster_without_auth, tmp_path):
    """The default cluster.auth=token joined a cluster without token auth in silence; its trials' workers never
    registered ("lost its worker; retrying", "cancelled before it started running") and a failed row was written per
    setting, rc 1; jobs/submit.py's job failed the same way. Both are one line now, rc 2, nothing written."""
    token = env(RAY_AUTH_TOKEN_PATH=own_token(tmp_path))
    res = subprocess.run(
        [SWEEP, "run", "cluster=existing", f"cluster.address={cluster_without_auth['gcs']}", "model=tiny-llama",
         f"results.root={tmp_path / 'r'}", "--quiet"],
        env=token, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    [line] = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(
        f"error: cluster.address={cluster_without_auth['gcs']}: the Ray cluster there runs without token auth"
    ), line
    assert "set cluster.auth=disabled" in line and not (tmp_path / "r").exists()
    dashboard = cluster_without_auth["dashboard"]
    res = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "submit.py"), "--address", dashboard, "--", "model=tiny-llama",
         f"results.root={tmp_path / 'r'}"],
        env=token, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert res.returncode == 2, (res.stdout + res.stderr)[-2000:]
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: --auth token: the cluster at {dashboard} runs with RAY_AUTH_MODE=disabled; pass --auth disabled"
    )
    assert "submitted" not in res.stdout and not (tmp_path / "r").exists()
