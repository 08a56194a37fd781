"""The results contract, declared once: every table, column, type, unit and meaning.

docs/schema.md is generated from this module (``sweep schema``) and a test keeps the
two equal. Add columns freely; renaming a column or changing its meaning bumps
``SCHEMA_VERSION``.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Column:
    name: str
    dtype: pl.DataType
    unit: str
    meaning: str
    nullable: bool = False


@dataclass(frozen=True)
class Table:
    name: str
    partition_by: tuple[str, ...]  # hive directories, in order: root/<table>/<col>=<value>/...
    unit_of_work: str  # what one file holds
    description: str
    columns: tuple[Column, ...]

    @property
    def schema(self) -> pl.Schema:
        return pl.Schema({c.name: c.dtype for c in self.columns})


PROVENANCE: tuple[Column, ...] = (
    Column("schema_version", pl.Int32(), "", "version of this schema the row was written under"),
    Column("run_id", pl.String(), "", "id of the command run that wrote the row"),
    Column("created_at", pl.Datetime("us", "UTC"), "UTC", "when the row's file was written"),
    Column("model", pl.String(), "", "model label (conf/model name or derived from model.path)"),
    Column("model_source", pl.String(), "", "packaged | gguf | hf | tiny"),
    Column("model_hash", pl.String(), "", "content hash of the weights (sha256 of the file, sampled above 256 MiB; hub:ID@commit for hub models)"),
    Column("model_revision", pl.String(), "", "hub commit or revision, null when not from a hub", nullable=True),
    Column("family", pl.String(), "", "model family (llama, mistral, qwen2, qwen3, gemma3)"),
    Column("num_layers", pl.Int32(), "layers", "L, the number of decoder layers"),
    Column("device", pl.String(), "", "cpu or cuda:N (GPU name)"),
    Column("dtype", pl.String(), "", "weights and activations dtype"),
    Column("seed", pl.Int64(), "", "config seed"),
    Column("git_sha", pl.String(), "", "project commit, '-dirty' when the checkout had changes"),
    Column("sweep_version", pl.String(), "", "version of this package"),
    Column("torch_version", pl.String(), "", "torch version"),
    Column("transformers_version", pl.String(), "", "transformers version"),
    Column("python_version", pl.String(), "", "Python version"),
)

PROFILE = Table(
    name="profile",
    partition_by=("model",),
    unit_of_work="one `sweep profile` run (all its prompts)",
    description=(
        "Per-layer trace of greedy full-depth decoding: one row per (prompt, position, layer). "
        "Position p's hidden states predict the token at p+1; `phase` says whether p was part of the "
        "prompt (prefill) or a generated token fed back (decode). Layers are 1-indexed; layer L is full depth. "
        "All positions of a prompt come from one teacher-forced forward pass over prompt + generated tokens."
    ),
    columns=PROVENANCE
    + (
        Column("prompt_id", pl.String(), "", "prompt id within its set (chat/3, HumanEval/0, a JSONL id)"),
        Column("prompt_set", pl.String(), "", "chat | humaneval | jsonl"),
        Column("position", pl.Int32(), "tokens", "0-based position in prompt + generation"),
        Column("phase", pl.String(), "", "prefill | decode"),
        Column("layer", pl.Int32(), "", "exit layer l in 1..L (layers 1..l ran)"),
        Column("token_id", pl.Int64(), "", "input token at this position (rebuilds the sequence)"),
        Column("delta", pl.Float64(), "ratio", "saturation delta ||h_l - h_{l-1}||_2 / ||h_l||_2 (h_0 = embedding output)"),
        Column("margin", pl.Float64(), "logits", "gamma_l: top1 - top2 of z_l = lm_head(final_norm(h_l))"),
        Column("top1", pl.Int64(), "", "argmax of z_l"),
        Column("top1_final", pl.Int64(), "", "argmax of z_L (the model's greedy token)"),
        Column("top1_match", pl.Boolean(), "", "top1 == top1_final"),
        Column("residual_inf", pl.Float64(), "logits", "tau_l: ||z_l - z_L||_inf"),
        Column("cos_hidden", pl.Float64(), "", "cosine of final_norm(h_l) and final_norm(h_L)"),
        Column("cos_logits", pl.Float64(), "", "cosine of the mean-centred logits z_l and z_L (softmax ignores a constant shift; raw logit cosines are dominated by it)"),
        Column("topk_overlap", pl.Float64(), "fraction", "|topK(z_l) & topK(z_L)| / K"),
        Column("topk", pl.Int32(), "tokens", "K of topk_overlap"),
    ),
)

TABLES: dict[str, Table] = {t.name: t for t in (PROFILE,)}


def markdown() -> str:
    """docs/schema.md: the contract as a document."""
    lines = [
        "# Results schema",
        "",
        f"Schema version: **{SCHEMA_VERSION}**. Generated from `sweep/store/_schema.py` by `sweep schema`; "
        "a test keeps this file and the code equal.",
        "",
        "Every table lives under `results.root`, one directory per table, hive-partitioned "
        "(`<root>/<table>/<column>=<value>/<file>.parquet`); the partition columns are also stored in the "
        "files. Each file is written to a hidden temporary name and renamed into place, so a reader never "
        "sees a half-written file; files whose names start with `.` are never results. Every file carries "
        "key-value metadata `sweep.schema_version` and `sweep.table`.",
        "",
        "Compatibility: columns are only ever added under one version. Renaming a column or changing its "
        "meaning or unit bumps the version. Read with the schema of the newest version and "
        "`missing_columns=\"insert\"` so older files load with nulls in newer columns (`sweep.store.scan` does).",
        "",
    ]
    for table in TABLES.values():
        lines += [
            f"## `{table.name}`",
            "",
            table.description,
            "",
            f"One file per {table.unit_of_work}; partitioned by {', '.join(f'`{p}`' for p in table.partition_by)}.",
            "",
            "| column | type | unit | nullable | meaning |",
            "|---|---|---|---|---|",
        ]
        for c in table.columns:
            lines.append(f"| `{c.name}` | {c.dtype} | {c.unit} | {'yes' if c.nullable else 'no'} | {c.meaning} |")
        lines.append("")
    return "\n".join(lines)
