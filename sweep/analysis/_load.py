"""Every stored trial and profile row under a results root, whatever schema version wrote it."""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from sweep.store import broken_identity, scan

log = logging.getLogger("sweep.analysis")


def load_trials(root: str | Path) -> pl.LazyFrame:
    """All trial rows under ``root`` (all runs), in the current schema; older files' missing
    columns are null."""
    return scan("trials", root)


def load_profiles(root: str | Path) -> pl.LazyFrame:
    """All profile-trace rows under ``root`` (all runs), in the current schema."""
    return scan("profile", root)


def distinct_trials(trials: pl.DataFrame) -> pl.DataFrame:
    """One row per ``trial_id`` (each trial has one file; a copy of it under another name or partition
    would count it twice; a setting measured again by another run, here or on another machine, has its id too):
    the newest row of each id kept, the ids found more than once named in a warning, copies apart from ids measured
    by several runs. ``trials`` as it is when no id repeats."""
    hosts = [c for c in ("env_cpu", "env_threads", "env_gpu") if c in trials.columns]
    repeated = (
        trials.group_by("trial_id")
        .agg(
            len=pl.len(),
            runs=pl.col("run_id").n_unique() if "run_id" in trials.columns else pl.lit(1),
            hosts=pl.struct(hosts).filter(pl.col(hosts[0]).is_not_null()).n_unique() if hosts else pl.lit(1),
        )
        .filter(pl.col("len") > 1)
        .sort("trial_id")
    )
    if repeated.height == 0:
        return trials
    copies, again = repeated.filter(pl.col("runs") <= 1), repeated.filter(pl.col("runs") > 1)
    if copies.height:
        log.warning(
            "%d trial ids have more than one row (copies of a trial's file): each counted once, its newest row "
            "kept: %s",
            copies.height,
            _shown(copies, lambda r: f"{r['trial_id']} ({r['len']} rows)"),
        )
    if again.height:
        log.warning(
            "%d trial ids were measured by more than one run (a trial id names the setting, not the run or the "
            "machine): each counted once, its newest row kept and the others not ranked: %s",
            again.height,
            _shown(again, _measured),
        )
    holds = ~broken_identity(trials, ids=False)  # a copy under another setting's name never wins over the trial's own
    return (
        trials.with_columns(_holds=holds)
        .sort("_holds", "created_at", nulls_last=False)
        .unique(subset="trial_id", keep="last", maintain_order=True)
        .drop("_holds")
    )


def _shown(repeated: pl.DataFrame, text) -> str:
    more = f" and {repeated.height - 5} more" if repeated.height > 5 else ""
    return ", ".join(text(r) for r in repeated.head(5).iter_rows(named=True)) + more


def _measured(r: dict) -> str:
    """A trial id measured by several runs as the warning names it: its rows, runs and machines."""
    hosts = f" on {r['hosts']} machines" if r["hosts"] > 1 else ""
    return f"{r['trial_id']} ({r['len']} rows from {r['runs']} runs{hosts})"


# what makes two traces of a prompt the same measurement: the prompt (its set, id and tokens: two prompts of one
# text are two), the model's content, its dtype and the trace's own options (K of topk_overlap, k of pca_delta, the
# readouts of the tuned_* columns)
_SAME_TRACE = ("model", "prompt_set", "prompt_id", "tokens", "model_hash", "dtype", "topk", "pca_k", "readouts_id")
_ROW = ("model", "run_id", "prompt_set", "prompt_id", "position", "layer")  # one row of one trace


def distinct_profiles(profiles: pl.LazyFrame) -> pl.LazyFrame:
    """Each traced prompt once: a prompt traced by more than one `sweep profile` run (the same command run again,
    a screen under ``sweep.rerun=true``) on the same model content, dtype and trace options keeps its newest trace
    only, and a trace file stored twice counts once, so no position is counted twice; what repeated is named in
    one warning. Traces of other prompts, models, dtypes or options are all kept. ``profiles`` as it is when
    nothing repeats."""
    given, profiles = profiles, profiles.unique(subset=list(_ROW), keep="first", maintain_order=True)
    copied = given.select(pl.len()).collect().item() - profiles.select(pl.len()).collect().item()
    prompts = (
        profiles.filter((pl.col("layer") == 1) & (pl.col("phase") == "prefill"))
        .group_by(*_ROW[:4], *[c for c in _SAME_TRACE if c not in _ROW and c != "tokens"])
        .agg(
            tokens=pl.col("token_id").sort_by("position").cast(pl.String).str.join(" "),
            created=pl.col("created_at").max(),
        )
        .collect()
    )
    kept = prompts.sort("created", "run_id").unique(subset=list(_SAME_TRACE), keep="last")
    repeated = prompts.height - kept.height
    if not repeated and not copied:
        return given
    said = [f"{repeated} traced again (the same prompt, model content, dtype and trace options)"] * bool(repeated)
    said += [f"{copied} rows stored twice (a copied trace file)"] * bool(copied)
    log.warning(
        "profile traces of %s: %s: each prompt and position counted once, its newest trace kept",
        ", ".join(sorted(set(prompts["model"]))),
        " and ".join(said),
    )
    return profiles.join(kept.lazy().select(_ROW[:4]), on=list(_ROW[:4]), how="semi").collect().lazy()  # once


def warn_shared_names(*tables: pl.LazyFrame | pl.DataFrame) -> None:
    """One warning naming each model label whose rows measured more than one model: a user's own directories or
    GGUF files of one name (``checkpoint-1000`` under two runs), one directory whose files changed, or a tiny model
    built with another seed or depth, have other ``model_hash`` values under one label, and every table (the fronts,
    the EAS and oracle tables) pools them by label."""
    seen = [
        t.lazy()
        .filter(pl.col("model_hash").is_not_null() & ~pl.col("model_hash").is_in(["unknown"]))
        .select("model", "model_hash")
        for t in tables
        if {"model", "model_hash"} <= set(t.collect_schema().names())
    ]
    if not seen:
        return
    hashes = pl.concat(seen).unique().group_by("model").agg(pl.col("model_hash").sort())
    shared = hashes.filter(pl.col("model_hash").list.len() > 1).collect().sort("model")
    if shared.height:
        log.warning(
            "rows of more than one model share a label, and the tables pool them: %s; give each model its own "
            "results.root (or directory name) so that each is analysed alone",
            "; ".join(
                f"{r['model']} ({len(r['model_hash'])} models: model_hash {', '.join(h[:24] for h in r['model_hash'])})"
                for r in shared.iter_rows(named=True)
            ),
        )
