"""The environment fingerprint every row carries (schema 14) and the report's environment line and warning: CPU,
cores and threads against lscpu's own reading, versions against the libraries', the attention implementation the
model ran."""

from __future__ import annotations

import os
from pathlib import Path
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


def _said(root) -> tuple[str, str]:
    """`sweep analyze`'s stderr and report, each on one line."""
    done = run_cli("analyze", f"results.root={root}")
    assert done.returncode == 0, done.stderr
    report = (root / "report" / "report.md").read_text()
    return " ".join(done.stderr.split()), " ".join(report.split())


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_a_front_of_rows_measured_on_other_workloads_or_models_is_warned_on_stderr_and_in_the_report(tmp_path):
    """One setting benched on 1 prompt and on 2, with 4 tokens and with 8, and a tiny model of another seed under the
    same label: the analysis ranked them in one front and the verdict named one, with no word (the warning looked at
    the environment only, and a label shared by two models was said only for a user's own files). Now the front's
    warning names each column they differ in, on stderr and in the report, and the shared label is said."""
    from sweep.bench.command import run_bench

    root = tmp_path / "results"
    setting = ("model=tiny-llama", "gate=saturation", "gate.eps=0.3", "bench.repeats=1", "bench.warmup=0")
    run_bench(compose(*setting, "prompts.n=1", "bench.gen_tokens=4", f"results.root={root}"))
    stderr, report = _said(root)
    assert "front mixes" not in stderr and "Warning:" not in report  # one row: nothing to mix
    run_bench(compose(*setting, "prompts.n=2", "bench.gen_tokens=8", f"results.root={root}"))
    stderr, report = _said(root)
    said = (
        "tiny-llama's front mixes rows that differ in n_prompts, gen_tokens, prompt_ids, prompt_input_tokens: they "
        "were not measured alike"
    )
    assert said in stderr and f"**Warning:** {said}" in report
    assert "share a label" not in stderr
    run_bench(compose(*setting, "prompts.n=1", "bench.gen_tokens=4", "seed=1", f"results.root={root}"))
    stderr, report = _said(root)
    assert "tiny-llama's front mixes rows that differ in model_hash, n_prompts, gen_tokens, seed, prompt_ids" in stderr
    assert "rows of more than one model share a label, and the tables pool them: tiny-llama (2 models" in stderr


def test_a_front_mixing_rows_without_the_fingerprint_or_the_floor_is_warned(tmp_path):
    """A row of an older schema (no environment fingerprint, another dtype) ranked beside today's: the environment
    warning looked only at rows with a fingerprint, so the dtype went unsaid; and a row with no A/A noise floor
    (schema 6) was ranked at its measured speedup beside rows held to their floors, with no word."""
    from sweep.bench.command import run_bench

    root = tmp_path / "results"
    for eps in (0.3, 0.6):
        run_bench(compose("model=tiny-llama", "gate=saturation", f"gate.eps={eps}", *BENCH, f"results.root={root}"))
    first, second = sorted(root.rglob("trials/**/*.parquet"))
    env = ["env_cpu", "env_cores", "env_threads", "env_torch_threads", "cuda_version", "attn_implementation"]
    frame = pl.read_parquet(first)
    frame.with_columns(*(pl.lit(None, frame.schema[c]).alias(c) for c in env), dtype=pl.lit("bfloat16")).write_parquet(
        first
    )
    stderr, report = _said(root)
    assert "differ in dtype and 1 row(s) without the environment fingerprint (written before schema 14)" in stderr
    frame = pl.read_parquet(second)
    frame.with_columns(pl.lit(None, pl.Float64).alias("noise_floor")).write_parquet(second)
    stderr, report = _said(root)
    assert "1 row(s) without an A/A noise floor (written before schema 8" in stderr and "A/A noise floor" in report


def test_one_setting_measured_by_two_runs_on_two_machines_is_not_called_a_copy(tmp_path):
    """A downstream team merging two machines' roots: the same setting measured on each has one trial id (it names
    the setting), so the analysis keeps the newest row; the warning called the other a copy of a trial's file."""
    import shutil

    from sweep.bench.command import run_bench

    here, there = tmp_path / "here", tmp_path / "there"
    setting = ("model=tiny-llama", "gate=saturation", "gate.eps=0.3", *BENCH)
    mine = Path(run_bench(compose(*setting, f"results.root={here}"))[0])
    theirs = Path(run_bench(compose(*setting, f"results.root={there}"))[0])
    assert mine.stem == theirs.stem
    merged = mine.with_name(f"from-there-{theirs.name}")
    shutil.copy(theirs, merged)
    pl.read_parquet(merged).with_columns(env_cpu=pl.lit("Another CPU")).write_parquet(merged)
    stderr, _ = _said(here)
    assert "1 trial ids were measured by more than one run" in stderr
    assert f"{mine.stem} (2 rows from 2 runs on 2 machines)" in stderr and "copies of a trial's file" not in stderr


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_other_prompts_of_one_set_are_warned_and_a_batchs_dropped_prompts_are_not(tmp_path):
    """Two benches of one setting on the set's prompts 0-1 and 2-3 (`prompts.start`): the same set name and count,
    no warning. And a batching sweep's rows: batch 2 over 3 prompts drops the third (a batch is decoded whole), so its
    rows hold 2 prompts beside batch 1's 3, one workload; that is not a mix."""
    from sweep.bench.command import run_bench

    root = tmp_path / "results"
    setting = ("model=tiny-llama", "gate=saturation", "gate.eps=0.3", "bench.repeats=1", "bench.warmup=0")
    for start in (0, 2):
        run_bench(compose(*setting, "prompts.n=2", f"prompts.start={start}", f"results.root={root}"))
    stderr, _ = _said(root)
    assert "tiny-llama's front mixes rows that differ in prompt_ids, prompt_input_tokens" in stderr
    batched = tmp_path / "batched"
    for batch in (1, 2):
        run_bench(compose(*setting, "prompts.n=3", f"bench.batch_size={batch}", f"results.root={batched}"))
    assert sorted(pl.read_parquet(list(batched.rglob("*.parquet")))["n_prompts"].to_list()) == [2, 3]
    stderr, report = _said(batched)
    assert "front mixes" not in stderr and "Warning:" not in report
