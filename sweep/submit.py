"""Ray Jobs: submit `sweep run` to a running cluster's job server and follow it (jobs/submit.py).

What the job gets as its working directory is an allowlist (``SHIPPED``), copied into a fresh
temporary directory: never the checkout itself, so its ``.git``, ``.env``, keys, venvs and
results stay here whatever .gitignore or ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE`` say.
Ray's job client is imported when called: call ``sweep.cluster_env.ray_environment`` first.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sweep.errors import ConfigError, SweepError

log = logging.getLogger("sweep.submit")

# What `python -m sweep.cli run ...` needs on the cluster: the package, its configs, the job
# tooling, and the project metadata (pyproject.toml names README.md; constraints.txt pins installs).
SHIPPED = ("sweep", "conf", "jobs", "pyproject.toml", "README.md", "constraints.txt")
SKIPPED_DIRS = ("__pycache__",)
SKIPPED_SUFFIXES = (".pyc", ".pyo")


def shipped_files(root: Path) -> list[str]:
    """The files of ``SHIPPED`` under ``root`` (relative, sorted): regular files only (no
    symlinks), no hidden files or directories, no ``__pycache__`` or compiled Python."""
    root = Path(root)
    out = []
    for name in SHIPPED:
        top = root / name
        if top.is_symlink():
            continue
        if top.is_file():
            out.append(name)
            continue
        if not top.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if _shipped_name(d) and d not in SKIPPED_DIRS)
            for f in sorted(filenames):
                path = Path(dirpath) / f
                if _shipped_name(f) and not f.endswith(SKIPPED_SUFFIXES) and stat.S_ISREG(os.lstat(path).st_mode):
                    out.append(path.relative_to(root).as_posix())
    return sorted(out)


@contextmanager
def staged_project(root: Path) -> Iterator[tuple[Path, list[str]]]:
    """A fresh temporary directory holding a copy of ``shipped_files(root)`` (removed on exit),
    with that list."""
    files = shipped_files(root)
    with tempfile.TemporaryDirectory(prefix="sweep-job-") as tmp:
        staged = Path(tmp) / "project"
        for rel in files:
            dest = staged / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(root) / rel, dest, follow_symlinks=False)
        staged.mkdir(exist_ok=True)
        yield staged, files


def job_entrypoint(overrides: list[str], auth: str = "token", python: str = "python") -> str:
    """The job's command: `sweep run OVERRIDES cluster=existing cluster.auth=AUTH` from its working directory."""
    args = [*overrides, "cluster=existing", f"cluster.auth={auth}"]
    return " ".join([python, "-m", "sweep.cli", "run", *map(shlex.quote, args)])


def job_runtime_env(staged: Path) -> dict[str, Any]:
    """The job's runtime_env: the staged copy as its working directory."""
    runtime_env: dict[str, Any] = {"working_dir": str(staged)}
    if os.environ.get("SWEEP_DEBUG"):
        runtime_env["env_vars"] = {"SWEEP_DEBUG": os.environ["SWEEP_DEBUG"]}
    return runtime_env


def submit_job(dashboard: str, overrides: list[str], root: Path, *, auth: str = "token", python: str = "python") -> str:
    """Submit ``job_entrypoint(overrides)`` to the cluster's job server, shipping a staged copy
    of ``shipped_files(root)`` as its working directory; returns the submission id."""
    from ray.job_submission import JobSubmissionClient

    entrypoint = job_entrypoint(overrides, auth, python)
    try:
        client = JobSubmissionClient(dashboard)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"--address {dashboard}: no Ray job server answers there ({_first_line(exc)})") from None
    with staged_project(root) as (staged, _):
        runtime_env = job_runtime_env(staged)
        deadline = time.monotonic() + 60
        while True:
            try:
                return client.submit_job(entrypoint=entrypoint, runtime_env=dict(runtime_env))
            except RuntimeError as exc:  # a cluster that just started has no job agent yet
                if "No available agent" not in str(exc) or time.monotonic() > deadline:
                    raise SweepError(
                        f"--address {dashboard}: the job server refused the job ({_first_line(exc)})"
                    ) from None
                log.info("the cluster's job agent is not up yet; retrying")
                time.sleep(2)


def follow_job(dashboard: str, submission_id: str, out) -> str:
    """Stream the job's logs to ``out`` until it ends; returns its final status."""
    import asyncio

    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(dashboard)

    async def tail() -> None:
        async for lines in client.tail_job_logs(submission_id):
            out.write(lines)
            out.flush()

    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        raise SweepError(
            f"stopped following; job {submission_id} keeps running (`ray job stop {submission_id}` stops it)"
        ) from None
    except (ConnectionError, OSError, RuntimeError) as exc:
        raise SweepError(
            f"lost the job server while following {submission_id} ({_first_line(exc)}); the job may still be running"
        ) from None
    ended = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    while (status := client.get_job_status(submission_id)) not in ended:
        time.sleep(1)
    return str(status.value if hasattr(status, "value") else status)


def _first_line(exc: BaseException) -> str:
    return next(iter(str(exc).splitlines()), type(exc).__name__)


def _shipped_name(name: str) -> bool:
    return not name.startswith(".") and not name.endswith(".egg-info")
