"""Run ids and the provenance values every row of a run carries."""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from typing import Any

from sweep.config.provenance import git_sha, library_versions, machine, submission_id


def new_run_id() -> str:
    """Sortable and unique: UTC time plus a random suffix."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def provenance(cfg, lm, run_id: str) -> dict[str, Any]:
    """The provenance columns of the results schema, for rows of ``lm`` written by this run."""
    return {
        "run_id": run_id,
        **lm.provenance(),
        "seed": cfg.seed,
        "git_sha": git_sha(),
        "submission_id": submission_id(),
        **library_versions(),
        **machine(),
    }


def provenance_unloaded(cfg, run_id: str) -> dict[str, Any]:
    """Provenance for a row whose model never loaded (a failed trial): what the config says."""
    m = cfg.model
    return {
        "run_id": run_id,
        "model": m.name or "model",
        "model_source": m.source,
        "model_hash": "unknown",
        "model_revision": m.revision,
        "family": m.family or "unknown",
        "model_kind": None,
        "adapter_path": None,
        "fidelity_lens_err": None,
        "fidelity_kv_err": None,
        "fidelity_step_err": None,
        "fidelity_batch_err": None,
        "fidelity_rollback_err": None,
        "attn_implementation": None,
        "num_layers": 0,
        "device": cfg.device,
        "dtype": cfg.dtype,
        "seed": cfg.seed,
        "git_sha": git_sha(),
        "submission_id": submission_id(),
        **library_versions(),
        **machine(),
    }
