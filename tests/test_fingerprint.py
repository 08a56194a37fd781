"""The environment fingerprint every row carries (schema 14) and the report's environment line and warning: CPU,
cores and threads against lscpu's own reading, versions against the libraries', the attention implementation the
model ran."""

from __future__ import annotations

import os
import shutil
import subprocess

import polars as pl
import pytest
import torch
import transformers

from conftest import compose, load, run_cli

BENCH = ("prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0")


def _lscpu() -> dict[str, str]:
    out = subprocess.run(
        ["lscpu"], capture_output=True, text=True, check=True, env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"}
    )
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in out.stdout.splitlines() if ":" in line)}


@pytest.mark.skipif(shutil.which("lscpu") is None, reason="lscpu is not installed")
def test_every_row_carries_the_fingerprint(tmp_path):
    from sweep.bench.command import run_bench

    row = run_bench(compose("model=tiny-llama", "gate=full", *BENCH, f"results.root={tmp_path}"))[1]
    cpu = _lscpu()
    assert row["env_cpu"] == cpu["Model name"]
    assert row["env_cores"] == int(cpu["Core(s) per socket"]) * int(cpu["Socket(s)"])
    assert row["env_threads"] == int(cpu["CPU(s)"]) == os.cpu_count()
    assert row["env_torch_threads"] == torch.get_num_threads()
    assert row["env_gpu"] is None and row["env_gpu_memory_gib"] is None  # this machine has none
    assert row["torch_version"] == torch.__version__ and row["transformers_version"] == transformers.__version__
    assert row["cuda_version"] == torch.version.cuda
    lm = load("model=tiny-llama")
    assert row["attn_implementation"] == lm.model.config._attn_implementation and row["dtype"] == "float32"
    assert row["fidelity_rollback_err"] is not None and row["fidelity_rollback_err"] <= 1e-5


def test_the_report_names_the_environment_and_warns_when_a_front_mixes_two(tmp_path):
    from sweep.bench.command import run_bench

    root = tmp_path / "results"
    for eps in (0.3, 0.6):
        run_bench(compose("model=tiny-llama", "gate=saturation", f"gate.eps={eps}", *BENCH, f"results.root={root}"))
    done = run_cli("analyze", f"results.root={root}")
    assert done.returncode == 0, done.stderr
    report = (root / "report" / "report.md").read_text()
    assert f"Environment: {_lscpu()['Model name']}" in report and "Warning:" not in report
    # one row as if measured with another torch thread count: the front now mixes two environments
    path = sorted(root.rglob("trials/**/*.parquet"))[0]
    frame = pl.read_parquet(path).with_columns(env_torch_threads=pl.lit(64, pl.Int32))
    frame.write_parquet(path)
    done = run_cli("analyze", f"results.root={root}")
    assert done.returncode == 0, done.stderr
    report = (root / "report" / "report.md").read_text()
    assert "Environments:" in report
    assert "tiny-llama's front mixes rows that differ in env_torch_threads" in report
