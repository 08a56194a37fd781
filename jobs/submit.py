"""Submit a sweep to a running Ray cluster through its job server.

    python jobs/submit.py --address http://127.0.0.1:8265 -- \
        model=smollm2-135m search=saturation-grid results.root=/shared/results

Ships an allowlist of this checkout (sweep/, conf/, jobs/, pyproject.toml, README.md,
constraints.txt; no hidden files, caches or symlinks), copied into a fresh temporary
directory, as the job's working directory: nothing else of the checkout (.git, .env, keys,
.venv, results) leaves this machine, whatever .gitignore says. Runs `sweep run OVERRIDES
cluster=existing` there, prints the submission id and commit, follows the logs until the job ends,
and says where the rows are. results.root must be an absolute path on storage every node shares.

The job server is --address, else $RAY_API_SERVER_ADDRESS, else $RAY_ADDRESS (Ray's variables, in
Ray's order), else http://127.0.0.1:8265; it must be the dashboard's http(s):// URL: a cluster (GCS)
address such as RAY_ADDRESS=10.0.0.5:6379 is refused with the URL to pass instead.

The job's rows carry this checkout's commit (git_sha, `-dirty` when a tracked file has changes or a
shipped file is not in git) and the submission id, which this script chooses and passes to the job (SWEEP_GIT_SHA,
SWEEP_SUBMISSION_ID); the Ray job's metadata names the experiment, search, model and commit.

    python jobs/submit.py --dry-run -- OVERRIDES

prints the files it would ship, their count and size, the entrypoint, the commit and the job's
metadata, and contacts nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Submit `sweep run` to a Ray cluster's job server.")
    parser.add_argument(
        "--address",
        default=None,
        help="the job server's (dashboard's) http(s) URL; default: $RAY_API_SERVER_ADDRESS, else $RAY_ADDRESS, "
        "else http://127.0.0.1:8265",
    )
    parser.add_argument("--auth", choices=("token", "disabled"), default="token", help="the cluster's RAY_AUTH_MODE")
    parser.add_argument("--no-follow", action="store_true", help="print the submission id and return")
    parser.add_argument("--python", default="python", help="the Python on the cluster's nodes")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the files that would be shipped and the entrypoint; submit nothing",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for `sweep run` (after --)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="sweep: %(message)s", stream=sys.stderr)

    from sweep.orchestrate.ray.env import ray_environment
    from sweep.config import ClusterConfig, compose, override_key
    from sweep.errors import ConfigError, SweepError, unexpected
    from sweep.orchestrate.plan import foresee_settings
    from sweep.orchestrate.submit import check_job_overrides, job_metadata, resolve_address, submitted_commit

    try:
        args.address = resolve_address(args.address)
        check_job_overrides(args.overrides)
        roots = [o.split("=", 1)[1] for o in args.overrides if "=" in o and override_key(o) == "results.root"]
        roots = [r[1:-1] if len(r) >= 2 and r[0] == r[-1] and r[0] in "'\"" else r for r in roots]  # Hydra's quotes
        if not roots or not os.path.isabs(roots[-1]):
            raise ConfigError(
                "results.root: pass an absolute path on storage shared by the cluster's nodes "
                "(results.root=/shared/results)"
            )
        # bad overrides fail here, not on the cluster
        cfg = compose([*args.overrides, "cluster=existing", f"cluster.auth={args.auth}"])
        foresee_settings(cfg, args.overrides)  # and every setting the search can foresee, as `sweep run` would
        ray_environment(ClusterConfig(address=args.address, auth=args.auth, dashboard=False))
        commit = submitted_commit(ROOT)
        metadata = job_metadata(cfg, args.overrides, commit)
        if args.dry_run:
            return _dry_run(args, commit, metadata)
        from sweep.orchestrate.ray.jobs import follow_job, submit_job
        from sweep.orchestrate.submit import new_submission_id

        submission_id = submit_job(
            args.address,
            args.overrides,
            ROOT,
            auth=args.auth,
            python=args.python,
            submission_id=new_submission_id(),
            git_sha=commit,
            metadata=metadata,
        )
        print(f"submitted {submission_id} to {args.address} (commit {commit})", flush=True)
        if args.no_follow:
            return 0
        status, message = follow_job(args.address, submission_id, sys.stdout)
    except SweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # a bug: one line and where, as `sweep run` says it (the traceback with SWEEP_DEBUG=1)
        if os.environ.get("SWEEP_DEBUG"):
            raise
        print(f"error: {unexpected(exc)}", file=sys.stderr)
        return 1
    if status == "SUCCEEDED":
        print(f"job {submission_id}: {status}; rows under {roots[-1]}/trials")
        return 0
    why = (message.strip().splitlines() or ["the job server gave no reason"])[0][:300]
    cut = why.split(", last available logs")[0]  # (Ray's "..., last available logs (truncated ...):" ends there)
    why = f"{cut}; its log is above" if cut != why else why
    print(f"job {submission_id}: {status} ({why}); rows it wrote, if any, are under {roots[-1]}/trials")
    return 1


def _dry_run(args, commit: str, metadata: dict[str, str]) -> int:
    """What a submission would ship and run; contacts no cluster."""
    from sweep.orchestrate.submit import job_entrypoint, shipped_files

    files = shipped_files(ROOT)
    for rel in files:
        print(rel)
    size = sum((ROOT / rel).stat().st_size for rel in files)
    print(f"{len(files)} files, {size} bytes ({size / 1024:.1f} KiB) from {ROOT} would be shipped to {args.address}")
    print(f"commit: {commit}")
    print(f"metadata: {json.dumps(metadata, sort_keys=True)}")
    print(f"entrypoint: {job_entrypoint(args.overrides, args.auth, args.python)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
