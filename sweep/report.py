"""`sweep analyze`: the analysis tables beside the data, and a report with figures.

Reads every trial and profile row under results.root; writes pareto.parquet,
knees.parquet and targets.parquet there, and <results.root>/report/report.md with PNG
figures: each model's trials with the Pareto front and its knee, the per-layer curves with
the post-mortem's thresholds, EAS per layer, and the best speedup at each agreement target.
The report is a list of sections (``sweep.report_sections.SECTIONS``) over one
``ReportContext``, assembled and written once.
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from sweep.analysis import (
    best_at_targets,
    fronts,
    knees_table,
    load_profiles,
    load_trials,
    ok_trials,
    params_text,
    with_confidence,
)
from sweep.errors import InputError
from sweep.report_sections import SECTIONS, ReportContext, Section, verdict

__all__ = ["CI_ROWS", "ReportContext", "Section", "analyse", "render", "run_analyze", "verdict", "write_report"]

log = logging.getLogger("sweep.report")

CI_ROWS = 20000  # above this many ok trials, intervals are computed for front and target rows only


def run_analyze(cfg) -> tuple[Path, list[str]]:
    """Compute and write everything; returns (report path, one verdict line per model)."""
    ctx = analyse(cfg)
    return write_report(ctx), ctx.verdicts


def analyse(cfg) -> ReportContext:
    """Load the rows, compute fronts, knees and targets, write them beside the data; the report's context."""
    from sweep.store import write_table

    root = Path(cfg.results.root)
    trials = load_trials(root).collect()
    profiles = load_profiles(root)
    has_profiles = profiles.select(pl.len()).collect().item() > 0
    if trials.height == 0 and not has_profiles:
        raise InputError(
            f"results.root={root}: no trials or profiles there to analyze (run `sweep run` or `sweep profile` first)"
        )
    a = cfg.analysis
    conf = {"metric": a.speedup, "n_boot": a.n_boot, "seed": a.seed, "min_prompts": a.ci_min_prompts}
    ok = ok_trials(trials, a.speedup).collect()
    if ok.height <= CI_ROWS:
        ok = with_confidence(ok, **conf)
    front = fronts(ok, a.speedup) if ok.height else pl.DataFrame()
    if ok.height > CI_ROWS and front.height:  # intervals are seeded per trial: the same as on all rows
        front = with_confidence(front, **conf)
    knees = knees_table(front) if front.height else pl.DataFrame()
    targets = _targets(ok, tuple(a.targets), conf)
    if front.height:
        write_table("pareto", _declared(front.drop("gate_scope"), "pareto"), root=root, provenance={})
        write_table("knees", knees, root=root, provenance={})
        write_table("targets", targets, root=root, provenance={})
    return ReportContext(
        root=root,
        out=Path(a.out) if a.out else root / "report",
        trials=trials,
        ok=ok,
        front=front,
        knees=knees,
        targets=targets,
        profiles=profiles if has_profiles else None,
        alpha=cfg.eas.alpha,
        min_prompts=a.ci_min_prompts,
    )


def render(ctx: ReportContext) -> tuple[str, list[str]]:
    """Every section in order over one context: (the Markdown text, the figures written into ctx.out)."""
    sections = [section(ctx) for section in SECTIONS]
    return "\n".join(line for s in sections for line in s.lines), [name for s in sections for name in s.figures]


def write_report(ctx: ReportContext) -> Path:
    """Render the report and write report.md once, atomically."""
    text, made = render(ctx)
    path = ctx.out / "report.md"
    ctx.out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".report.md.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    log.debug("report %s with %d figures", path, len(made))
    return path


def _targets(ok: pl.DataFrame, targets: tuple[float, ...], conf: dict) -> pl.DataFrame:
    if not ok.height:
        return pl.DataFrame()
    best = best_at_targets(ok, targets, metric=conf["metric"])
    if "agreement_lo" not in best.columns:
        best = with_confidence(best.filter(pl.col("trial_id").is_not_null()), **conf).join(
            best.select("model", "target"), on=["model", "target"], how="right"
        )
    params = [params_text(r) if r["trial_id"] else None for r in best.iter_rows(named=True)]
    return (
        best.with_columns(params=pl.Series(params, dtype=pl.String))
        .select(_declared_names("targets"))
        .sort("model", "target")
    )


def _declared_names(table: str) -> list[str]:
    from sweep.store import TABLES

    return [c.name for c in TABLES[table].columns if c.name not in ("schema_version", "created_at")]


def _declared(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    return frame.select(_declared_names(table))
