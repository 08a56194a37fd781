"""Ray Jobs, what is sent: `sweep run` staged for a running cluster's job server (jobs/submit.py).

What the job gets as its working directory is an allowlist (``SHIPPED``), copied into a fresh
temporary directory: never the checkout itself, so its ``.git``, ``.env``, keys, venvs and
results stay here whatever .gitignore or ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE`` say.

The submitter records where the job came from, since the staged copy has no .git: it picks the
submission id itself, and passes it and this checkout's commit (``-dirty`` when the shipped files
differ from it) in the job's runtime_env (``SWEEP_SUBMISSION_ID``, ``SWEEP_GIT_SHA``: every process
of the job, driver and workers, sees them, and every row it writes carries them) and in the job's
metadata (with the experiment, search and sweep name), which `ray job list` and the dashboard show.

Talking to the job server (submitting, following) is ``sweep.orchestrate.ray.jobs``: call
``sweep.orchestrate.ray.env.ray_environment`` first.
"""

from __future__ import annotations

import os
import random
import shlex
import string
import subprocess
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sweep.config import override_key
from sweep.errors import ConfigError

# What `python -m sweep.cli run ...` needs on the cluster: the package, its configs, the job
# tooling, and the project metadata (pyproject.toml names README.md; constraints.txt pins installs).
SHIPPED = ("sweep", "conf", "jobs", "pyproject.toml", "README.md", "constraints.txt")
SKIPPED_DIRS = ("__pycache__",)
SKIPPED_SUFFIXES = (".pyc", ".pyo")
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
# where the job server's address comes from, in Ray's own order (ray.dashboard.utils.get_address_for_submission_client)
ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")


def resolve_address(flag: str | None, environ: dict[str, str] | None = None) -> str:
    """The job server's URL: ``--address``, else ``$RAY_API_SERVER_ADDRESS``, else ``$RAY_ADDRESS``,
    else http://127.0.0.1:8265.

    Job submission talks HTTP to the dashboard (`RAY_ADDRESS=http://HEAD:8265`, as `ray job submit`
    documents it). ``RAY_ADDRESS`` is also the variable `ray.init` reads a cluster (GCS) address
    from (``HOST:6379``, ``auto``); Ray's job client would then look the dashboard up through the GCS
    (and retry for a while when none answers). That is refused here, with the address to pass
    instead, as is a Ray Client address (``ray://``). ConfigError when the address is not an
    http(s) URL."""
    environ = os.environ if environ is None else environ
    source, value = "--address", (flag or "").strip()
    if not value:
        for name in ADDRESS_ENV:
            if environ.get(name, "").strip():
                source, value = f"${name}", environ[name].strip()
                break
        else:
            return DEFAULT_ADDRESS
    scheme, sep, rest = value.partition("://")
    if sep and scheme.lower() in ("http", "https") and rest.strip("/"):
        return value.rstrip("/")
    host = (rest if sep else value).split("/")[0].rsplit(":", 1)[0] or "HEAD"
    if host == "auto":
        host = "HEAD"
    if sep and scheme.lower() == "ray":
        kind = "a Ray Client address (ray://)"
    elif sep:
        kind = f"a {scheme}:// address"
    else:
        kind = "a cluster (GCS) address, the kind `ray start --address` and `ray.init` take"
    raise ConfigError(
        f"{source}={value}: {kind}; jobs are submitted to the cluster's job server, the dashboard's HTTP URL: "
        f"pass --address http://{host}:8265 (8265 unless the head set --dashboard-port)"
    )


def new_submission_id() -> str:
    """A fresh id of the form Ray gives one itself (``raysubmit_`` and 16 letters and digits;
    ray/dashboard/modules/job/job_manager.py generate_job_id)."""
    alphabet = sorted(set(string.ascii_letters + string.digits) - set("IloO0"))
    return "raysubmit_" + "".join(random.SystemRandom().choices(alphabet, k=16))


def submitted_commit(root: Path) -> str:
    """The commit the job's code comes from: ``root``'s checked-out commit, with ``-dirty`` when a
    tracked file has changes or a shipped file is not in git (untracked or ignored: shipping ignores
    .gitignore); ``$SWEEP_GIT_SHA`` where ``root`` is not a git checkout; else 'unknown'."""
    from sweep.config.provenance import GIT_SHA_ENV, checkout_commit

    commit = checkout_commit(root)
    if commit is None:
        return os.environ.get(GIT_SHA_ENV) or "unknown"
    if not commit.endswith("-dirty"):
        try:
            others = subprocess.run(
                ["git", "-C", str(root), "ls-files", "--others", "-z", "--", *SHIPPED],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            others = ""
        if set(filter(None, others.split("\0"))) & set(shipped_files(root)):
            commit += "-dirty"
    return commit


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


JOB_STOP_WAIT_S = 60


def check_job_overrides(overrides: list[str]) -> None:
    """The job joins the cluster it is submitted to (its entrypoint sets ``cluster=existing`` and ``cluster.auth``):
    an override of the cluster group or a ``cluster.*`` key would send it elsewhere, and is refused naming it."""
    for o in overrides:
        key = override_key(o)
        if key == "cluster" or key.startswith("cluster."):
            raise ConfigError(
                f"{o}: the job joins the cluster it is submitted to (--address; its auth: --auth); drop {key}"
            )


def job_entrypoint(overrides: list[str], auth: str = "token", python: str = "python") -> str:
    """The job's command: `sweep run OVERRIDES cluster=existing cluster.auth=AUTH` from its working directory."""
    args = [*overrides, "cluster=existing", f"cluster.auth={auth}"]
    return " ".join([python, "-m", "sweep.cli", "run", *map(shlex.quote, args)])


def job_runtime_env(staged: Path, git_sha: str = "unknown", submission_id: str | None = None) -> dict[str, Any]:
    """The job's runtime_env: the staged copy as its working directory, and the commit and
    submission id as environment variables of every process of the job (``sweep.config.provenance``)."""
    from sweep.config.provenance import GIT_SHA_ENV, SUBMISSION_ID_ENV

    # `ray job stop` sends SIGTERM, then SIGKILL after this many seconds (Ray's default, 3, is read by the job's
    # supervisor, which runs in this environment): time for `sweep run` to stop its trials, release its claims and
    # print its resume line, as it does on any SIGTERM
    env_vars = {GIT_SHA_ENV: git_sha, "RAY_JOB_STOP_WAIT_TIME_S": str(JOB_STOP_WAIT_S)}
    if submission_id:
        env_vars[SUBMISSION_ID_ENV] = submission_id
    if os.environ.get("SWEEP_DEBUG"):
        env_vars["SWEEP_DEBUG"] = os.environ["SWEEP_DEBUG"]
    return {"working_dir": str(staged), "env_vars": env_vars}


def job_metadata(cfg, overrides: list[str], git_sha: str) -> dict[str, str]:
    """The Ray job's metadata (strings; `ray job list`, the dashboard and the job's driver see
    them): the sweep's experiment, search, model and name (when set), the commit, where rows go."""
    experiments = [o.split("=", 1)[1] for o in overrides if "=" in o and override_key(o) == "experiment"]
    metadata = {
        "sweep_search": cfg.search.name,
        "sweep_model": cfg.model.name or "model",
        "git_sha": git_sha,
        "results_root": cfg.results.root,
        "sweep_overrides": " ".join(overrides),
    }
    if experiments:
        metadata["sweep_experiment"] = experiments[-1]
    if cfg.sweep.name:
        metadata["sweep_name"] = cfg.sweep.name
    return metadata


def require_token() -> None:
    """Token auth needs the cluster's token here (Ray's client looks in ``$RAY_AUTH_TOKEN``, the
    file ``$RAY_AUTH_TOKEN_PATH`` names, then ``~/.ray/auth_token``): one line when none is found."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if os.environ.get("RAY_AUTH_TOKEN"):
        return
    if path:
        if not Path(path).is_file():
            raise ConfigError(f"RAY_AUTH_TOKEN_PATH={path}: no such file (it names the cluster's token file)")
        return
    if not (Path.home() / ".ray" / "auth_token").is_file():
        raise ConfigError(
            "--auth token: no Ray auth token here: set RAY_AUTH_TOKEN_PATH to the cluster's token file (or "
            "RAY_AUTH_TOKEN, or put it at ~/.ray/auth_token); --auth disabled for a cluster without token auth"
        )


def first_line(exc: BaseException) -> str:
    return next(iter(str(exc).splitlines()), type(exc).__name__)


def _shipped_name(name: str) -> bool:
    return not name.startswith(".") and not name.endswith(".egg-info")
