"""The report's environment line: the fingerprint every row carries (``sweep.config.provenance.FINGERPRINT``: CPU,
cores and threads, GPU, torch, transformers and CUDA versions, attention implementation, dtype), and a warning per
front whose rows differ in any of it (Draft&Verify's reproduction issues turned on exactly these), in the model's
content or in the workload measured, or mix rows with and without an A/A noise floor."""

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


# what makes two rows of one setting different measurements: the prompts (their set and how many), the tokens
# decoded, the dtype, the device, the seed (the report's batching section keeps such rows' series apart)
WORKLOAD = ("prompt_set", "n_prompts", "gen_tokens", "dtype", "device", "seed")
# beside the environment, what the rows of one front must share to be one comparison: the model's content (one label
# can name two models: a user's directories of one name, a tiny model of another seed or depth) and the workload;
# a batch size is a setting a search may vary (search=batching-grid), so it is not among them
SAME = ("model_hash", *WORKLOAD)
# which prompts, as each was given to the model (its id, and its tokens: a chat template or a cut applied); compared
# among rows of one batch size, as a batch drops the prompts past its last full batch
SAME_PER_BATCH = ("n_prompts", "prompt_ids", "prompt_input_tokens")


def _differs(rows: pl.DataFrame, column: str) -> bool:
    values = rows[column].drop_nulls()
    if isinstance(values.dtype, pl.List):
        values = values.cast(pl.List(pl.String)).list.join(" ")
    return values.n_unique() > 1


def _differ(rows: pl.DataFrame, column: str) -> bool:
    if column not in SAME_PER_BATCH or "batch_size" not in rows.columns:
        return _differs(rows, column)
    return any(_differs(group, column) for _, group in rows.group_by("batch_size"))


def front_mixes(ok: pl.DataFrame) -> list[str]:
    """Per model whose front (its ok rows) mixes rows that do not compare like with like, one sentence saying how:
    the environment columns they differ in (among rows that carry the fingerprint, schema 14 on; rows without it are
    counted), the model content and workload columns they differ in (``SAME``; the prompts, ``SAME_PER_BATCH``,
    among rows of one batch size; each among the rows that hold it), and rows without an A/A noise floor (schema 7
    and older: ranked at their measured speedup) beside rows with one."""
    if not ok.height or "model" not in ok.columns:
        return []
    env = [c for c in FINGERPRINT if c != "dtype" and c in ok.columns]
    same = [c for c in dict.fromkeys((*SAME, *SAME_PER_BATCH)) if c in ok.columns]
    said = []
    for model in sorted(ok["model"].unique().to_list()):
        rows = ok.filter(pl.col("model") == model)
        fingerprinted = rows.filter(pl.col("env_cpu").is_not_null()) if "env_cpu" in env else rows.clear()
        differ = [c for c in env if _differs(fingerprinted, c)] + [c for c in same if _differ(rows, c)]
        unknown = rows.height - fingerprinted.height if fingerprinted.height else 0
        floorless = rows["speedup_floor"].null_count() if "speedup_floor" in rows.columns else 0
        parts = [f"rows that differ in {', '.join(differ)}"] if differ else []
        if unknown:
            parts.append(f"{unknown} row(s) without the environment fingerprint (written before schema 14)")
        if 0 < floorless < rows.height:
            parts.append(
                f"{floorless} row(s) without an A/A noise floor (written before schema 8: ranked at their measured "
                "speedup, with no floor to hold it to)"
            )
        if parts:
            said.append(
                f"{model}'s front mixes {' and '.join(parts)}: they were not measured alike and do not compare like "
                "with like (each results.root one model and workload; `sweep analyze` pools what one holds)"
            )
    return said


def environment_lines(trials: pl.DataFrame, mixes: tuple[str, ...]) -> list[str]:
    """One line naming the environment (each one, where rows come from several), then a warning for each front
    whose rows do not compare like with like (``mixes``: ``front_mixes``, as the analysis computed them)."""
    cols = [c for c in FINGERPRINT if c in trials.columns]
    lines = []
    if trials.height and "env_cpu" in cols:
        kinds = trials.filter(pl.col("env_cpu").is_not_null()).select(cols).unique().sort(cols, nulls_last=True)
        if kinds.height:
            named = "; ".join(_text(r) for r in kinds.iter_rows(named=True))
            lines = [f"Environment{'s' if kinds.height > 1 else ''}: {named}.", ""]
    for said in mixes:
        lines += [f"**Warning:** {said}.", ""]
    return lines
