"""Factories of store rows for the tests: the provenance columns and a profile table's rows."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from sweep.store import files

from sweep.trace.profile import READOUT_COLUMNS

PROV = {
    "run_id": "r1",
    "model": "m-1",
    "model_source": "tiny",
    "model_hash": "sha256:x",
    "model_revision": None,
    "family": "llama",
    "model_kind": "attention",
    "adapter_path": "fast",
    "fidelity_lens_err": 0.0,
    "fidelity_kv_err": 0.0,
    "fidelity_step_err": 0.0,
    "fidelity_batch_err": 0.0,
    "fidelity_rollback_err": 0.0,
    "attn_implementation": "sdpa",
    "num_layers": 2,
    "device": "cpu",
    "dtype": "float32",
    "seed": 0,
    "git_sha": "abc",
    "submission_id": None,
    "sweep_version": "0",
    "torch_version": "t",
    "transformers_version": "t",
    "python_version": "3",
    "env_cpu": "cpu",
    "env_cores": 2,
    "env_threads": 2,
    "env_torch_threads": 1,
    "env_gpu": None,
    "env_gpu_memory_gib": None,
    "cuda_version": None,
}


def profile_rows(n: int = 4) -> dict:
    return {
        "prompt_id": ["p"] * n,
        "prompt_set": ["chat"] * n,
        "position": list(range(n)),
        "phase": ["prefill"] * n,
        "layer": [1, 2] * (n // 2),
        "token_id": [5] * n,
        "delta": [0.5] * n,
        "margin": [1.0] * n,
        "top1": [3] * n,
        "top1_final": [3] * n,
        "top1_match": [True] * n,
        "residual_inf": [0.1] * n,
        "cos_hidden": [0.9] * n,
        "cos_logits": [0.8] * n,
        "topk_overlap": [0.7] * n,
        "topk": [10] * n,
        "prob_margin": [0.5] * n,
        "entropy": [1.0] * n,
        "cos_prev": [0.9] * n,
        "pca_delta": [0.2] * n,
        "pca_k": [64] * n,
        "kl_final": [0.3] * n,
        **{c: [None] * n for c in READOUT_COLUMNS},
    }


def wait_for_rows(root: Path, n: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Wait until ``root`` holds ``n`` trial files, failing if the sweep ``proc`` ends first or time runs out."""
    deadline = time.time() + timeout
    while len(files("trials", root)) < n:
        assert proc.poll() is None, f"sweep ended early: {proc.communicate()[1][-3000:]}"
        assert time.time() < deadline, "timed out waiting for rows"
        time.sleep(0.2)
