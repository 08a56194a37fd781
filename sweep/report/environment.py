"""The report's environment line: the fingerprint every row carries (``sweep.config.provenance.FINGERPRINT``: CPU,
cores and threads, GPU, torch, transformers and CUDA versions, attention implementation, dtype), and a warning per
front whose rows differ in any of it (Draft&Verify's reproduction issues turned on exactly these)."""

from __future__ import annotations

import polars as pl

from sweep.config.provenance import FINGERPRINT


def _text(r: dict) -> str:
    gpu = "no GPU" if r.get("env_gpu") is None else f"{r['env_gpu']} ({r.get('env_gpu_memory_gib')} GiB)"
    return (
        f"{r.get('env_cpu') or 'unknown CPU'} ({r.get('env_cores')} cores, {r.get('env_threads')} threads; torch uses "
        f"{r.get('env_torch_threads')}), {gpu}; torch {r.get('torch_version')}, transformers "
        f"{r.get('transformers_version')}, CUDA {r.get('cuda_version') or 'none'}; attention "
        f"{r.get('attn_implementation')}, {r.get('dtype')}"
    )


def environment_lines(trials: pl.DataFrame, ok: pl.DataFrame) -> list[str]:
    """One line naming the environment (each one, where rows come from several), then a warning for each front
    (a model's ok rows) whose rows differ in a fingerprint column, naming the columns."""
    cols = [c for c in FINGERPRINT if c in trials.columns]
    if not trials.height or "env_cpu" not in cols:
        return []
    kinds = trials.filter(pl.col("env_cpu").is_not_null()).select(cols).unique().sort(cols, nulls_last=True)
    if not kinds.height:
        return []
    named = "; ".join(_text(r) for r in kinds.iter_rows(named=True))
    lines = [f"Environment{'s' if kinds.height > 1 else ''}: {named}.", ""]
    for model in sorted(ok["model"].unique().to_list()) if ok.height and "env_cpu" in ok.columns else []:
        rows = ok.filter((pl.col("model") == model) & pl.col("env_cpu").is_not_null())
        differ = [c for c in cols if rows[c].n_unique() > 1]
        if differ:
            lines += [
                f"**Warning:** {model}'s front mixes rows that differ in {', '.join(differ)}: their speedups were "
                "measured in different environments and do not compare like with like.",
                "",
            ]
    return lines
