"""jobs/submit.py ships an allowlist of the checkout, never its secrets: the package Ray
would build for the job's working directory is built here, with Ray's own code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT
from sweep.submit import SHIPPED, shipped_files

PLANTED = [
    ".git/config",
    ".env",
    "credentials.yaml",
    "id_rsa",
    "shared/notes.txt",
    ".venv/bin/python",
    "results/x.parquet",
]
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


def packaged_entries(monkeypatch, tmp_path, root: Path) -> list[str]:
    """`sweep.submit.submit_job` against a job client whose upload is Ray's own: Ray's
    working-dir logic (its excludes, the gitignore switch) and ``create_package`` build the zip
    that would be uploaded; nothing is contacted. Returns the zip's file entries."""
    from sweep.cluster_env import ray_environment
    from sweep.config import ClusterConfig

    ray_environment(ClusterConfig(address="http://127.0.0.1:9", auth="token", dashboard=False))
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

        def submit_job(self, *, entrypoint, runtime_env):
            self._upload_working_dir_if_needed(runtime_env)  # what JobSubmissionClient.submit_job does
            assert runtime_env["working_dir"].startswith("gcs://")
            return "raysubmit_test"

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", PackagingClient)
    from sweep.submit import submit_job

    assert submit_job("http://127.0.0.1:9", ["model=tiny-llama"], root) == "raysubmit_test"
    assert len(zips) == 1
    with zipfile.ZipFile(zips[0]) as z:
        return sorted(n for n in z.namelist() if not n.endswith("/"))


def test_the_job_package_holds_only_the_allowlist(monkeypatch, tmp_path, checkout):
    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")
    monkeypatch.setenv("RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES", "")  # not even Ray's own .git/.venv excludes
    entries = packaged_entries(monkeypatch, tmp_path, checkout)
    assert "sweep/cli.py" in entries and "conf/config.yaml" in entries and "pyproject.toml" in entries
    assert entries == shipped_files(ROOT)
    assert {e.split("/")[0] for e in entries} <= set(SHIPPED)
    leaked = [e for e in entries if e in PLANTED + PLANTED_INSIDE or "key_link" in e or "/." in f"/{e}"]
    assert leaked == []
    assert not [e for e in entries if e.endswith(".pyc") or "__pycache__" in e]


def test_dry_run_lists_the_files_and_contacts_nothing(checkout):
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    env.pop("SWEEP_DEBUG", None)
    command = [sys.executable, str(checkout / "jobs" / "submit.py"), "--dry-run", "--address", "http://127.0.0.1:9"]
    t0 = time.perf_counter()
    res = subprocess.run(
        [*command, "--", "model=tiny-llama", "results.root=/shared/results"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=checkout,
    )
    assert res.returncode == 0, res.stderr
    assert time.perf_counter() - t0 < 30
    lines = res.stdout.splitlines()
    files = [line for line in lines if "/" in line and " " not in line or line in SHIPPED]
    assert "sweep/cli.py" in files and "conf/config.yaml" in files and "jobs/submit.py" in files
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


def test_jobs_submit_warns_when_auth_is_disabled():
    command = [sys.executable, str(ROOT / "jobs" / "submit.py"), "--dry-run", "--auth", "disabled"]
    env = {k: v for k, v in os.environ.items() if k != "SWEEP_DEBUG"}
    res = subprocess.run(
        [*command, "--", "model=tiny-llama", "results.root=/shared/results"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "cluster.auth=disabled: any process that can reach the cluster's ports can run code in it" in res.stderr
    assert res.stdout.rstrip().endswith("cluster=existing cluster.auth=disabled")
