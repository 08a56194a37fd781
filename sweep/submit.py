"""Ray Jobs: submit `sweep run` to a running cluster's job server and follow it (jobs/submit.py).

Ray's job client is imported when called: call ``sweep.cluster_env.ray_environment`` first.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from sweep.errors import ConfigError, SweepError

log = logging.getLogger("sweep.submit")

JOB_EXCLUDES = ["results", "**/__pycache__", "*.egg-info", ".pytest_cache", "outputs", "multirun"]


def submit_job(
    dashboard: str, overrides: list[str], working_dir: Path, *, auth: str = "token", python: str = "python"
) -> str:
    """Submit `sweep run OVERRIDES cluster=existing cluster.auth=AUTH` to the cluster's job
    server, shipping ``working_dir`` (the project, without venvs, results or git data, which
    Ray leaves out by default or by JOB_EXCLUDES); returns the submission id."""
    import shlex

    from ray.job_submission import JobSubmissionClient

    args = [*overrides, "cluster=existing", f"cluster.auth={auth}"]
    entrypoint = " ".join([python, "-m", "sweep.cli", "run", *map(shlex.quote, args)])
    try:
        client = JobSubmissionClient(dashboard)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"--address {dashboard}: no Ray job server answers there ({_first_line(exc)})") from None
    runtime_env: dict[str, Any] = {"working_dir": str(working_dir), "excludes": JOB_EXCLUDES}
    if os.environ.get("SWEEP_DEBUG"):
        runtime_env["env_vars"] = {"SWEEP_DEBUG": os.environ["SWEEP_DEBUG"]}
    deadline = time.monotonic() + 60
    while True:
        try:
            return client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
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
