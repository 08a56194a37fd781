"""jobs/submit.py ships an allowlist of the checkout, never its secrets: the package Ray
would build for the job's working directory is built here, with Ray's own code. The job gets
the submitter's commit and its own submission id (its rows carry both) and metadata naming the
sweep; the job server's address comes from --address, RAY_API_SERVER_ADDRESS or RAY_ADDRESS."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT
from sweep.orchestrate.submit import SHIPPED, shipped_files

PLANTED = [
    ".git/config",
    ".env",
    "credentials.yaml",
    "id_rsa",
    "shared/notes.txt",
    ".venv/bin/python",
    "results/x.parquet",
]
OVERRIDES = ["model=tiny-llama", "results.root=/shared/results"]


def dry_run(*flags: str, root: Path = ROOT, **env_extra: str) -> subprocess.CompletedProcess:
    """`jobs/submit.py --dry-run FLAGS -- OVERRIDES` of the checkout at ``root``, in a subprocess."""
    env = {k: v for k, v in os.environ.items() if k not in ("SWEEP_DEBUG", "RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")}
    command = [sys.executable, str(root / "jobs" / "submit.py"), "--dry-run", *flags, "--", *OVERRIDES]
    return subprocess.run(command, env={**env, **env_extra}, capture_output=True, text=True, timeout=60, cwd=root)


PLANTED_INSIDE = ["sweep/.env", "sweep/__pycache__/cli.cpython-311.pyc", "conf/.secret.yaml", "sweep/stale.pyc"]


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A copy of this checkout's allowlisted files, with secrets and clutter planted around
    and inside them, and a symlink from the package to a key."""
    root = tmp_path / "checkout"
    for rel in shipped_files(ROOT):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, root / rel)
    for rel in PLANTED + PLANTED_INSIDE:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("SECRET\n")
    (root / "sweep" / "key_link").symlink_to(root / "id_rsa")
    (root / ".gitignore").write_text("")  # nothing ignored; and RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1 below
    return root


def packaged_entries(monkeypatch, tmp_path, root: Path, submitted: list | None = None, **kwargs) -> list[str]:
    """`sweep.orchestrate.submit.submit_job` against a job client whose upload is Ray's own: Ray's
    working-dir logic (its excludes, the gitignore switch) and ``create_package`` build the zip
    that would be uploaded; nothing is contacted. Returns the zip's file entries; ``submitted``
    gets the keyword arguments the job client's submit_job received."""
    from sweep.orchestrate.ray.env import ray_environment
    from sweep.config import ClusterConfig

    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):  # restored afterwards:
        # an existing cluster's environment drops this process's own token path, which an embedded Ray it runs reads
        if var in os.environ:
            monkeypatch.setenv(var, os.environ[var])
        else:
            monkeypatch.delenv(var, raising=False)
    ray_environment(ClusterConfig(address="http://127.0.0.1:9", auth="token", dashboard=False))
    monkeypatch.setenv("RAY_AUTH_TOKEN", "a-token-of-the-tests-own")  # token auth needs one (never ~/.ray's)
    import ray.job_submission
    from ray._private.runtime_env.packaging import create_package

    zips: list[Path] = []

    class PackagingClient(ray.job_submission.JobSubmissionClient):
        def __init__(self, address):  # no connection
            pass

        def _upload_package_if_needed(
            self, package_path, include_gitignore, include_parent_dir=False, excludes=None, is_file=False
        ):
            target = tmp_path / f"package{len(zips)}.zip"
            create_package(
                package_path,
                target,
                include_gitignore=include_gitignore,
                include_parent_dir=include_parent_dir,
                excludes=excludes,
            )
            zips.append(target)

        def submit_job(self, *, entrypoint, runtime_env, submission_id=None, metadata=None):
            self._upload_working_dir_if_needed(runtime_env)  # what JobSubmissionClient.submit_job does
            assert runtime_env["working_dir"].startswith("gcs://")
            if submitted is not None:
                submitted.append(dict(runtime_env=runtime_env, submission_id=submission_id, metadata=metadata))
            return submission_id

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", PackagingClient)
    from sweep.orchestrate.ray.jobs import submit_job

    kwargs.setdefault("submission_id", "raysubmit_test")
    assert submit_job("http://127.0.0.1:9", ["model=tiny-llama"], root, **kwargs) == kwargs["submission_id"]
    assert len(zips) == 1
    with zipfile.ZipFile(zips[0]) as z:
        return sorted(n for n in z.namelist() if not n.endswith("/"))


def test_the_job_package_holds_only_the_allowlist(monkeypatch, tmp_path, checkout):
    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")
    monkeypatch.setenv("RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES", "")  # not even Ray's own .git/.venv excludes
    entries = packaged_entries(monkeypatch, tmp_path, checkout)
    assert "sweep/cli/commands.py" in entries and "conf/config.yaml" in entries and "pyproject.toml" in entries
    assert entries == shipped_files(ROOT)
    assert {e.split("/")[0] for e in entries} <= set(SHIPPED)
    leaked = [e for e in entries if e in PLANTED + PLANTED_INSIDE or "key_link" in e or "/." in f"/{e}"]
    assert leaked == []
    assert not [e for e in entries if e.endswith(".pyc") or "__pycache__" in e]


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_dry_run_lists_the_files_and_contacts_nothing(checkout):
    res = dry_run("--address", "http://127.0.0.1:9", root=checkout, PYTHONPATH=str(checkout), SWEEP_GIT_SHA="0123abc")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    files = [line for line in lines if "/" in line and " " not in line or line in SHIPPED]
    assert "sweep/cli/commands.py" in files and "conf/config.yaml" in files and "jobs/submit.py" in files
    assert files == shipped_files(checkout)
    assert not [f for f in files if f in PLANTED + PLANTED_INSIDE or "key_link" in f]
    size = sum((checkout / f).stat().st_size for f in files)
    assert f"{len(files)} files, {size} bytes" in res.stdout
    entry = next(line for line in lines if line.startswith("entrypoint: "))
    assert entry == (
        "entrypoint: python -m sweep.cli run model=tiny-llama results.root=/shared/results "
        "cluster=existing cluster.auth=token"
    )
    assert "submitted" not in res.stdout and "no Ray job server" not in res.stderr
    # the copy is no git checkout: the commit is the one the environment names
    assert "commit: 0123abc" in lines
    metadata = json.loads(next(line for line in lines if line.startswith("metadata: ")).split(" ", 1)[1])
    assert metadata["git_sha"] == "0123abc" and metadata["sweep_model"] == "tiny-llama"
    assert metadata["sweep_search"] == "saturation-grid" and metadata["results_root"] == "/shared/results"


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_jobs_submit_warns_when_auth_is_disabled():
    res = dry_run("--auth", "disabled")
    assert res.returncode == 0, res.stderr
    assert "cluster.auth=disabled: any process that can reach the cluster's ports can run code in it" in res.stderr
    assert res.stdout.rstrip().endswith("cluster=existing cluster.auth=disabled")


# --- where the job came from: commit, submission id, metadata (issue 13, item 6) ---


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git checkout holding a copy of this project's shipped files, committed."""
    root = tmp_path / "repo"
    for rel in shipped_files(ROOT):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, root / rel)
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "c")
    return root


def test_the_job_gets_the_commit_and_its_submission_id(monkeypatch, tmp_path, repo):
    sha = git(repo, "rev-parse", "HEAD")
    submitted: list = []
    metadata = {"sweep_experiment": "cluster-gpu"}
    packaged_entries(monkeypatch, tmp_path, repo, submitted, submission_id="raysubmit_abc", metadata=metadata)
    (job,) = submitted
    assert job["submission_id"] == "raysubmit_abc"
    env_vars = job["runtime_env"]["env_vars"]
    assert env_vars["SWEEP_GIT_SHA"] == sha and env_vars["SWEEP_SUBMISSION_ID"] == "raysubmit_abc"
    assert int(env_vars["RAY_JOB_STOP_WAIT_TIME_S"]) >= 30  # `ray job stop`'s SIGKILL waits for the sweep's own stop
    assert job["metadata"] == {"sweep_experiment": "cluster-gpu", "git_sha": sha}


def test_submitted_commit_is_dirty_when_the_shipped_files_differ(repo, tmp_path, monkeypatch):
    from sweep.config.provenance import checkout_commit
    from sweep.orchestrate.submit import submitted_commit

    sha = git(repo, "rev-parse", "HEAD")
    assert submitted_commit(repo) == checkout_commit(repo) == sha
    (repo / "notes.txt").write_text("not shipped\n")
    assert submitted_commit(repo) == sha  # an untracked file that is not shipped changes nothing
    (repo / "sweep" / "new_module.py").write_text("X = 1\n")
    assert submitted_commit(repo) == sha + "-dirty"  # shipped, but in no commit
    (repo / "sweep" / "new_module.py").unlink()
    (repo / "README.md").write_text("changed\n")
    assert submitted_commit(repo) == checkout_commit(repo) == sha + "-dirty"
    # not a checkout: the commit the environment names, else unknown
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.delenv("SWEEP_GIT_SHA", raising=False)
    assert checkout_commit(plain) is None and submitted_commit(plain) == "unknown"
    monkeypatch.setenv("SWEEP_GIT_SHA", "feedbeef")
    assert submitted_commit(plain) == "feedbeef"


def test_a_staged_copy_takes_its_commit_from_the_environment(tmp_path):
    """The job's working directory is a staged copy without .git, possibly inside some other
    checkout: git_sha() there is $SWEEP_GIT_SHA, never the enclosing repository's commit."""
    from sweep.orchestrate.submit import staged_project

    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "-q")
    git(outer, "commit", "-q", "--allow-empty", "-m", "outer")
    code = "from sweep.config.provenance import git_sha, submission_id; print(git_sha(), submission_id())"
    with staged_project(ROOT) as (staged, _):
        inside = outer / "project"
        shutil.copytree(staged, inside)
        for where in (staged, inside):
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SWEEP_DEBUG")}
            res = subprocess.run(
                [sys.executable, "-c", code],
                cwd=where,
                env={**env, "SWEEP_GIT_SHA": "abc123-dirty", "SWEEP_SUBMISSION_ID": "raysubmit_x"},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert res.returncode == 0, res.stderr
            assert res.stdout.split() == ["abc123-dirty", "raysubmit_x"], where
            res = subprocess.run(
                [sys.executable, "-c", code], cwd=where, env=env, capture_output=True, text=True, timeout=60
            )
            assert res.stdout.split() == ["unknown", "None"], where


def test_rows_carry_the_submission_id_only_inside_a_job(tmp_path, monkeypatch):
    """The in-process twin of the cluster test: the same bench row, outside and inside a job."""
    from conftest import compose
    from sweep.bench.command import run_bench
    from sweep.config.provenance import checkout_commit, git_sha
    from sweep.store import read

    base = ["model=tiny-llama", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0"]
    monkeypatch.delenv("SWEEP_SUBMISSION_ID", raising=False)
    run_bench(compose(*base, f"results.root={tmp_path / 'local'}"))
    monkeypatch.setenv("SWEEP_SUBMISSION_ID", "raysubmit_inside")
    run_bench(compose(*base, f"results.root={tmp_path / 'job'}"))
    local, job = read("trials", tmp_path / "local"), read("trials", tmp_path / "job")
    assert local["submission_id"].to_list() == [None] and job["submission_id"].to_list() == ["raysubmit_inside"]
    assert local["git_sha"].to_list() == job["git_sha"].to_list() == [git_sha()]
    assert git_sha() == (checkout_commit(ROOT) or os.environ.get("SWEEP_GIT_SHA") or "unknown")


def test_job_metadata_names_the_sweep():
    from conftest import compose
    from sweep.orchestrate.submit import job_metadata

    overrides = ["experiment=cluster-gpu", "results.root=/mnt/results", "sweep.name=nightly"]
    metadata = job_metadata(compose(*overrides), overrides, "abc-dirty")
    assert metadata == {
        "sweep_experiment": "cluster-gpu",
        "sweep_name": "nightly",
        "sweep_search": "saturation-grid",
        "sweep_model": "smollm2-135m",
        "git_sha": "abc-dirty",
        "results_root": "/mnt/results",
        "sweep_overrides": "experiment=cluster-gpu results.root=/mnt/results sweep.name=nightly",
    }
    assert all(isinstance(v, str) for v in metadata.values())  # Ray's job metadata is Dict[str, str]


def test_submission_ids_look_like_rays_own():
    from sweep.orchestrate.submit import new_submission_id

    ids = {new_submission_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"raysubmit_[A-Za-z1-9]{16}", i) for i in ids)


# --- the job server's address: --address, RAY_API_SERVER_ADDRESS, RAY_ADDRESS (item 8) ---


@pytest.mark.parametrize(
    "flag, environ, expected",
    [
        (None, {}, "http://127.0.0.1:8265"),
        (None, {"RAY_ADDRESS": "http://10.0.0.5:8265"}, "http://10.0.0.5:8265"),
        (None, {"RAY_ADDRESS": "https://ray.example.com/"}, "https://ray.example.com"),
        (None, {"RAY_API_SERVER_ADDRESS": "http://a:8265", "RAY_ADDRESS": "http://b:8265"}, "http://a:8265"),
        (None, {"RAY_API_SERVER_ADDRESS": "", "RAY_ADDRESS": "http://b:8265"}, "http://b:8265"),
        ("http://c:8265", {"RAY_API_SERVER_ADDRESS": "http://a:8265", "RAY_ADDRESS": "10.0.0.5:6379"}, "http://c:8265"),
    ],
)
def test_the_address_comes_from_the_flag_then_rays_variables(flag, environ, expected):
    from sweep.orchestrate.submit import resolve_address

    assert resolve_address(flag, environ) == expected


@pytest.mark.parametrize(
    "flag, environ, message",
    [
        (None, {"RAY_ADDRESS": "10.0.0.5:6379"}, "$RAY_ADDRESS=10.0.0.5:6379: a cluster (GCS) address"),
        (None, {"RAY_ADDRESS": "auto"}, "$RAY_ADDRESS=auto: a cluster (GCS) address"),
        (None, {"RAY_ADDRESS": "ray://10.0.0.5:10001"}, "$RAY_ADDRESS=ray://10.0.0.5:10001: a Ray Client address"),
        ("127.0.0.1:6379", {}, "--address=127.0.0.1:6379: a cluster (GCS) address"),
        (None, {"RAY_API_SERVER_ADDRESS": "ftp://x"}, "$RAY_API_SERVER_ADDRESS=ftp://x: a ftp:// address"),
    ],
)
def test_a_cluster_address_is_refused_with_the_url_to_pass(flag, environ, message):
    from sweep.errors import ConfigError
    from sweep.orchestrate.submit import resolve_address

    with pytest.raises(ConfigError) as err:
        resolve_address(flag, environ)
    assert message in str(err.value) and "pass --address http://" in str(err.value)


def test_rays_client_gets_exactly_the_resolved_address(monkeypatch):
    """Ray's JobSubmissionClient prefers $RAY_API_SERVER_ADDRESS / $RAY_ADDRESS over the address it
    is given (ray.dashboard.utils.get_address_for_submission_client): both are hidden from it."""
    import ray.job_submission

    seen = []

    class Recorder:
        def __init__(self, address):
            seen.append((address, os.environ.get("RAY_ADDRESS"), os.environ.get("RAY_API_SERVER_ADDRESS")))

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://elsewhere:8265")
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Recorder)
    from sweep.orchestrate.ray.jobs import job_client

    job_client("http://127.0.0.1:8265")
    assert seen == [("http://127.0.0.1:8265", None, None)]
    assert os.environ["RAY_ADDRESS"] == "10.0.0.5:6379"  # restored


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_jobs_submit_reads_ray_address():
    ok = dry_run(RAY_ADDRESS="http://10.1.2.3:8265")
    assert ok.returncode == 0, ok.stderr
    assert "would be shipped to http://10.1.2.3:8265" in ok.stdout
    gcs = dry_run(RAY_ADDRESS="10.1.2.3:6379")
    assert gcs.returncode == 2 and "pass --address http://10.1.2.3:8265" in gcs.stderr
    assert "would be shipped" not in gcs.stdout


def test_a_stopped_jobs_resume_line_names_a_submission_that_submit_takes(monkeypatch):
    """A job stopped by `ray job stop` logged `sweep run ... cluster=existing cluster.auth=token resume=true ...`,
    which jobs/submit.py refuses (the job joins the cluster it is sent to). In a job, the line also names the
    submission, which submit takes as it is."""
    import shlex

    from sweep.orchestrate.interrupt import resume_line

    monkeypatch.setenv("SWEEP_SUBMISSION_ID", "raysubmit_0123456789abcdef")
    root = "results.root='/shared/my results'"  # (a path with a space, quoted for Hydra as a sweep's plan quotes it)
    job = ["model=tiny-llama", root, "cluster=existing", "cluster.auth=disabled", "run_id=r"]
    line = resume_line(job, "job4")
    ran = f"sweep run model=tiny-llama {shlex.quote(root)} cluster=existing cluster.auth=disabled"
    again = f"python jobs/submit.py --auth disabled --python {sys.executable} -- model=tiny-llama {shlex.quote(root)}"
    assert line == (
        f"resume with `{ran} resume=true sweep.name=job4` on a node of the cluster, or submit it again: "
        f"`{again} resume=true sweep.name=job4`"
    )
    argv = shlex.split(line.split("`")[3])[2:]
    env = {k: v for k, v in os.environ.items() if k not in ("SWEEP_DEBUG", "SWEEP_SUBMISSION_ID")}
    res = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "submit.py"), "--dry-run", *argv],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    entry = next(line for line in res.stdout.splitlines() if line.startswith("entrypoint: "))
    assert shlex.split(entry.removeprefix("entrypoint: ")) == [
        sys.executable, "-m", "sweep.cli", "run", "model=tiny-llama", root, "resume=true", "sweep.name=job4",
        "cluster=existing", "cluster.auth=disabled",
    ]  # fmt: skip
    monkeypatch.delenv("SWEEP_SUBMISSION_ID")
    assert resume_line(job, "s") == f"resume with `{ran} resume=true sweep.name=s`"
