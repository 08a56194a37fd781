"""Ray Jobs, the job server: submit `sweep run` as staged by ``sweep.orchestrate.submit`` and follow it
(jobs/submit.py). Ray's job client is imported when called: call ``sweep.orchestrate.ray.env.ray_environment``
first."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path

from sweep.errors import ConfigError, SweepError
from sweep.orchestrate.submit import (
    ADDRESS_ENV,
    first_line,
    job_entrypoint,
    job_runtime_env,
    new_submission_id,
    require_token,
    staged_project,
    submitted_commit,
)

log = logging.getLogger("sweep.orchestrate.ray.jobs")


def job_client(dashboard: str):
    """Ray's job client for exactly ``dashboard``: Ray's constructor prefers ``$RAY_API_SERVER_ADDRESS``
    and ``$RAY_ADDRESS`` over the address it is given, so both are hidden from it meanwhile
    (``resolve_address`` has already weighed them)."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    hidden = {name: os.environ.pop(name) for name in ADDRESS_ENV if name in os.environ}
    try:
        return JobSubmissionClient(dashboard)
    except AuthenticationError as exc:  # another token, or none where the cluster wants one
        raise ConfigError(
            f"--address {dashboard}: the job server refused this client ({first_line(exc)}); set --auth to the "
            "cluster's RAY_AUTH_MODE and give its token (RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH; docs/cluster.md)"
        ) from None
    finally:
        os.environ.update(hidden)


def submit_job(
    dashboard: str,
    overrides: list[str],
    root: Path,
    *,
    auth: str = "token",
    python: str = "python",
    submission_id: str | None = None,
    git_sha: str | None = None,
    metadata: dict[str, str] | None = None,
) -> str:
    """Submit ``job_entrypoint(overrides)`` to the cluster's job server, shipping a staged copy
    of ``shipped_files(root)`` as its working directory, under ``submission_id`` (a fresh one by
    default), with ``git_sha`` (``submitted_commit(root)`` by default) in its environment;
    returns the submission id."""
    entrypoint = job_entrypoint(overrides, auth, python)
    submission_id = submission_id or new_submission_id()
    git_sha = git_sha or submitted_commit(root)
    if auth == "token":
        require_token()
    _check_auth_mode(dashboard, auth)
    try:
        client = job_client(dashboard)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"--address {dashboard}: no Ray job server answers there ({first_line(exc)})") from None
    with staged_project(root) as (staged, _):
        runtime_env = job_runtime_env(staged, git_sha, submission_id)
        deadline = time.monotonic() + 180  # a loaded head can take minutes to register its job agent
        while True:
            try:
                return client.submit_job(
                    entrypoint=entrypoint,
                    runtime_env=json.loads(json.dumps(runtime_env)),  # the client rewrites working_dir in place
                    submission_id=submission_id,
                    metadata=dict(metadata or {}, git_sha=git_sha),
                )
            except RuntimeError as exc:  # a cluster that just started has no job agent yet
                if "No available agent" not in str(exc) or time.monotonic() > deadline:
                    raise SweepError(
                        f"--address {dashboard}: the job server refused the job ({first_line(exc)})"
                    ) from None
                log.info("the cluster's job agent is not up yet; retrying")
                time.sleep(2)


def _check_auth_mode(dashboard: str, auth: str) -> None:
    """The cluster's RAY_AUTH_MODE, as its dashboard tells anyone (``/api/authentication_mode``), is ``auth``: a job
    sent with token auth to a cluster without it starts, and every trial of it fails (its workers never register).
    Nothing is said where the dashboard does not tell (an older Ray) or cannot be reached (the client says so)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{dashboard.rstrip('/')}/api/authentication_mode", timeout=10) as reply:
            mode = json.loads(reply.read(4096)).get("authentication_mode")
    except (OSError, ValueError, AttributeError):
        return
    if isinstance(mode, str) and mode in ("token", "disabled") and mode != auth:
        raise ConfigError(
            f"--auth {auth}: the cluster at {dashboard} runs with RAY_AUTH_MODE={mode}; pass --auth {mode}"
        )


def follow_job(dashboard: str, submission_id: str, out) -> tuple[str, str]:
    """Stream the job's logs to ``out`` until it ends; returns its final status and what the job server says of it
    (why it failed: an entrypoint's exit code, a runtime environment that could not be set up)."""
    from ray.job_submission import JobStatus

    client = job_client(dashboard)

    async def tail() -> None:
        async for lines in client.tail_job_logs(submission_id):
            out.write(lines)
            out.flush()

    ended = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    try:
        asyncio.run(tail())
        while (status := client.get_job_status(submission_id)) not in ended:
            time.sleep(1)
        message = client.get_job_info(submission_id).message or ""
    except KeyboardInterrupt:
        stopped = SweepError(
            f"stopped following; job {submission_id} keeps running "
            f"(`ray job stop --address {dashboard} {submission_id}` stops it)"
        )
        stopped.exit_code = 130  # 128 + SIGINT, as `sweep run` ends on Ctrl-C
        raise stopped from None
    except (ConnectionError, OSError, RuntimeError) as exc:
        raise SweepError(
            f"lost the job server while following {submission_id} ({first_line(exc)}); the job may still be running"
        ) from None
    return str(status.value if hasattr(status, "value") else status), message
