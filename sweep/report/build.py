"""`sweep analyze`: the analysis tables beside the data, and a report with figures.

Reads every trial and profile row under results.root; writes the pareto, knees and targets
tables there (``<root>/<table>/<table>.parquet``), and <results.root>/report/report.md with PNG
figures: each model's trials with the Pareto front and its knee, the per-layer curves with
the post-mortem's thresholds, EAS per layer, the learned readouts against the logit lens (for
traces taken with profile.readouts), and the best speedup at each agreement target.
The report is a list of sections (``sweep.report.sections.SECTIONS``) over one
``ReportContext``, assembled and written once.

Nothing is written until everything is computed: ``analyse`` only computes; ``write_report``
renders the sections (their figures into a hidden staging directory beside the report's),
and only then writes the tables, moves the figures into place and writes report.md, so a
failure anywhere before leaves the root as it was.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

import polars as pl

from sweep.analysis import (
    counted,
    FULL_DEPTH_ID,
    best_at_targets,
    distinct_profiles,
    distinct_trials,
    fronts,
    knees_table,
    load_profiles,
    load_trials,
    noise_floors,
    ok_trials,
    params_text,
    warn_shared_names,
    with_confidence,
)
from sweep.errors import ConfigError, InputError, SweepError, os_error
from sweep.report.context import ReportContext
from sweep.report.environment import front_mixes
from sweep.report.plotting import headline_target
from sweep.store import TABLES, atomic_write, tell_empty_files, trusted_rows
from sweep.report.sections import SECTIONS, Section
from sweep.report.verdicts import SURE_AMONG, verdict, verdicts

__all__ = ["ReportContext", "Section", "analyse", "render", "run_analyze", "verdict", "write_report"]

log = logging.getLogger("sweep.report.build")


def run_analyze(cfg) -> tuple[Path, list[str]]:
    """`sweep analyze` as a library call (``sweep.cli.verbs``' four steps): compute everything, then write
    it; returns (report path, one verdict line per model)."""
    ctx = analyse(cfg)
    return write_report(ctx), verdicts(ctx)


def prepare(cfg, _session=None) -> tuple[Path, pl.DataFrame, pl.LazyFrame | None, Path]:
    """The rows under results.root (each trial once), its profiles, and where the report goes (inside
    the root unless analysis.out names a place); refused in one line when there is nothing to analyze."""
    from sweep.config.paths import check_writable_dir, inside

    root = Path(cfg.results.root)
    out = Path(cfg.analysis.out) if cfg.analysis.out else root / "report"
    for name in (*TABLES, "claims", "ray"):  # the readers open a table's directory whole: a report there breaks them
        if out == root / name or out.is_relative_to(root / name):
            raise ConfigError(
                f"analysis.out={out}: inside the results' {name}/ directory, which readers open whole (a report "
                "there breaks them); name a directory of its own (the default: results.root/report)"
            )
    read = load_trials(root).collect()
    tell_empty_files("trials", root, read.height)
    trials = trusted_rows(distinct_trials(read), root, ids=False)
    _warn_non_finite(trials, cfg.analysis.speedup)
    profiles = distinct_profiles(load_profiles(root))
    warn_shared_names(trials, profiles)
    has_profiles = profiles.select(pl.len()).collect().item() > 0
    if trials.height == 0 and not has_profiles:
        raise InputError(
            f"results.root={root}: no trials or profiles there to analyze (run `sweep run` or `sweep profile` first)"
        )
    if not cfg.analysis.out:
        inside(root, out)  # <root>/report, not a symlink to elsewhere
        try:  # as analysis.out is checked when it is given: a file in its place is refused before any work
            check_writable_dir("analysis.out", out)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (analysis.out is unset: the report goes to results.root/report)") from None
    return root, trials, profiles if has_profiles else None, out


def write(cfg, prepared, ctx: ReportContext) -> Path:
    """The report and its tables; a write the system refuses (a full disk) is one line naming the path."""

    try:
        return write_report(ctx)
    except OSError as exc:
        raise SweepError(f"cannot write the report: {os_error(exc, exc.filename or ctx.out)}") from exc


def render(cfg, prepared, ctx: ReportContext, path: Path) -> tuple[list[str], int]:
    """One verdict line per model, and the report's path."""
    from sweep.textfit import fit_lines

    from sweep.report.tasks import task_verdict_lines

    said = [*verdicts(ctx), *task_verdict_lines(ctx.ok)]  # the accuracy verdicts too, as `sweep run` ends with them
    return [*map(fit_lines, said), f"report: {path}"], 0


def analyse(cfg) -> ReportContext:
    """Load the rows, compute fronts, knees and targets: the report's context. Writes nothing."""
    return compute(cfg, prepare(cfg))


def compute(cfg, prepared) -> ReportContext:
    """Fronts (full depth on each), knees, targets with intervals and noise floors: the report's context."""
    root, trials, profiles, out = prepared
    a = cfg.analysis
    conf = {"metric": a.speedup, "n_boot": a.n_boot, "seed": a.seed, "min_prompts": a.ci_min_prompts}
    ok = ok_trials(trials, a.speedup, ranks=True).collect()
    mixes = tuple(front_mixes(ok))
    for said in mixes:  # the report's first lines say it too; the verdicts below rank what it pools
        log.warning("%s", said)
    front = fronts(ok, a.speedup) if ok.height else pl.DataFrame()
    if front.height:  # intervals for the rows the tables show; seeded per trial, the same as on all rows
        front = _measured_intervals(front, conf)
    knees = knees_table(front, min_agreement=a.knee_min_agreement) if front.height else pl.DataFrame()
    targets = targets_at(ok, tuple(a.targets), conf)
    settings = targets_at(ok, tuple(a.targets), conf, reference=False)  # the best setting, beating full depth or not
    sure = sure_at(ok, targets, headline_target(a.targets), conf)  # where the pick's interval reaches 1x
    ok = _front_intervals(ok, front)  # (after the targets: theirs are bootstrapped for their picks)
    return ReportContext(
        root=root,
        out=out,
        trials=trials,
        ok=ok,
        front=front,
        knees=knees,
        targets=targets,
        profiles=profiles,
        alpha=cfg.eas.alpha,
        min_prompts=a.ci_min_prompts,
        settings=settings,
        sure=sure,
        floors=noise_floors(ok, a.speedup, a.floor_target) if ok.height else pl.DataFrame(),
        knee_min_agreement=a.knee_min_agreement,
        headline=headline_target(a.targets),
        mixes=mixes,
    )


def _warn_non_finite(trials: pl.DataFrame, metric: str) -> None:
    """Name the ok rows whose speedup or agreement is not a finite number, or whose speedup is not above 0 (edited
    files): they are left out of fronts, knees and targets (``ok_trials``)."""
    if not trials.height:
        return
    bad = trials.filter((pl.col("status") == "ok") & ~counted(metric))
    if bad.height:
        ids = ", ".join(bad["trial_id"].head(5).to_list()) + (" ..." if bad.height > 5 else "")
        log.warning(
            "%d ok rows have a %s (a ratio of times, above 0) or agreement that is not a finite number; left out: %s",
            bad.height,
            metric,
            ids,
        )


def markdown(ctx: ReportContext) -> tuple[str, list[str]]:
    """Every section in order over one context: (the Markdown text, the figures written into ctx.out)."""
    sections = [section(ctx) for section in SECTIONS]
    return "\n".join(line for s in sections for line in s.lines), [name for s in sections for name in s.figures]


def write_report(ctx: ReportContext) -> Path:
    """Render the report, then write everything: the analysis tables beside the data (when there
    is a front), the figures and report.md (last, atomically) into ``ctx.out``.

    The sections draw their figures into a hidden staging directory beside ``ctx.out``; a
    failure while rendering removes it and leaves every output as it was.
    """
    _remove_stale_staging(ctx.out)
    staging = ctx.out.parent / f".{ctx.out.name}.{uuid.uuid4().hex[:12]}.tmp"
    staging.mkdir(parents=True)
    try:
        staged = _with_out(ctx, staging)
        text, made = markdown(staged)
        _carry_cache(staged, ctx)  # the profiles' curves and the like, computed once
        ctx.out.mkdir(parents=True, exist_ok=True)  # before the tables: a report that cannot be written leaves them
        _write_tables(ctx)
        for entry in sorted(staging.iterdir()):
            os.replace(entry, ctx.out / entry.name)
        path = atomic_write(ctx.out / "report.md", lambda tmp: tmp.write_text(text))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.debug("report %s with %d figures", path, len(made))
    return path


def _remove_stale_staging(out: Path) -> None:
    """Staging directories an analyze killed mid-render left beside ``out`` (older than an hour)."""
    from sweep.store import STALE_AFTER_S

    if not out.parent.is_dir():
        return
    for old in out.parent.glob(f".{glob.escape(out.name)}.*.tmp"):
        try:
            if old.is_dir() and time.time() - old.stat().st_mtime > STALE_AFTER_S:
                shutil.rmtree(old, ignore_errors=True)
                log.info("removed the orphaned staging directory %s", old)
        except OSError:
            continue


def _write_tables(ctx: ReportContext) -> None:
    from sweep.store import write_table

    if ctx.front.height:
        write_table("pareto", _declared(ctx.front, "pareto"), root=ctx.root, provenance={})
        write_table("knees", ctx.knees, root=ctx.root, provenance={})
        write_table("targets", ctx.targets, root=ctx.root, provenance={})


_CACHED = ("curves", "eas", "lens", "models")  # ReportContext's cached properties


def _with_out(ctx: ReportContext, out: Path) -> ReportContext:
    """``ctx`` drawing its figures into ``out``, with what it has already computed."""
    other = dataclasses.replace(ctx, out=out)
    _carry_cache(ctx, other)
    return other


def _carry_cache(src: ReportContext, dst: ReportContext) -> None:
    for name in _CACHED:
        if name in src.__dict__ and name not in dst.__dict__:
            dst.__dict__[name] = src.__dict__[name]


CI_COLUMNS = (
    "agreement_lo", "agreement_hi", "speedup_lo", "speedup_hi", "ci_level", "ci_prompts", "ci_units", "ci_few_prompts"
)  # fmt: skip


def _measured_intervals(front: pl.DataFrame, conf: dict) -> pl.DataFrame:
    """``front`` with the intervals of its measured rows bootstrapped; the full-depth reference
    keeps its own (1.0-1.0: it is the definition of 1.0), in the front's order."""
    front = front.with_row_index("_order")
    reference = pl.col("trial_id") == FULL_DEPTH_ID
    ci = [c for c in ("agreement_lo", "agreement_hi", "speedup_lo", "speedup_hi") if c in front.columns]
    picked = with_confidence(front.filter(~reference).drop(ci), **conf)
    return pl.concat([picked, front.filter(reference)], how="diagonal_relaxed").sort("_order").drop("_order")


def _front_intervals(ok: pl.DataFrame, front: pl.DataFrame) -> pl.DataFrame:
    """``ok`` with the intervals of its front trials (null elsewhere: bootstrapping thousands of
    trials nobody reads took most of an analysis of 10,000 trials)."""
    if not front.height:  # (no ok trials)
        return ok
    cols = [c for c in CI_COLUMNS if c in front.columns]
    measured = front.filter(pl.col("trial_id") != FULL_DEPTH_ID)
    return ok.join(measured.select("trial_id", *cols).unique("trial_id"), on="trial_id", how="left")


def targets_at(ok: pl.DataFrame, targets: tuple[float, ...], conf: dict, *, reference: bool = True) -> pl.DataFrame:
    """The targets table: the best at each target, full depth among the candidates (``reference``), with
    the intervals of its picks (bootstrapped here: ``ok`` carries none)."""
    if not ok.height:
        return pl.DataFrame()
    best = best_at_targets(ok, targets, metric=conf["metric"], reference=reference)
    if "agreement_lo" not in ok.columns:
        measured = (pl.col("trial_id").is_not_null() & (pl.col("trial_id") != FULL_DEPTH_ID)).fill_null(False)
        ci = [c for c in ("agreement_lo", "agreement_hi", "speedup_lo", "speedup_hi") if c in best.columns]
        picked = with_confidence(best.filter(measured).drop(ci), **conf)
        best = pl.concat([picked, best.filter(~measured)], how="diagonal_relaxed")
    params = [
        "full depth" if r["trial_id"] == FULL_DEPTH_ID else params_text(r) if r["trial_id"] else None
        for r in best.iter_rows(named=True)
    ]
    return (
        best.with_columns(params=pl.Series(params, dtype=pl.String))
        .select(_declared_names("targets"))
        .sort("model", "target")
    )


def sure_at(ok: pl.DataFrame, targets: pl.DataFrame, target: float, conf: dict) -> pl.DataFrame:
    """Per model whose pick at ``target`` in ``targets`` is a setting whose speedup's interval reaches 1x: the fastest
    other setting at that agreement whose interval lies above 1x, ranked as the targets table ranks, its interval
    bootstrapped (the candidates in that order, a few at a time, until one is; at most the ``SURE_AMONG`` fastest, so
    a noisy sweep of thousands bootstraps no more). Models with none are absent."""
    if not targets.height or "speedup_lo" not in targets.columns:
        return pl.DataFrame()
    unsure = targets.filter(
        (pl.col("target") == target) & (pl.col("trial_id") != FULL_DEPTH_ID) & (pl.col("speedup_lo") <= 1.0)
    )
    metric, found = conf["metric"], []
    ci = [c for c in CI_COLUMNS if c in ok.columns]
    for pick in unsure.iter_rows(named=True):
        candidates = ok.filter(
            (pl.col("model") == pick["model"])
            & (pl.col("agreement") >= target)
            & (pl.col("speedup") > 1.0)
            & (pl.col("trial_id") != pick["trial_id"])
        ).sort(["speedup", metric, "agreement", "trial_id"], descending=[True, True, True, False])
        for start in range(0, min(candidates.height, SURE_AMONG), 8):
            sure = with_confidence(candidates.slice(start, 8).drop(ci), **conf).filter(pl.col("speedup_lo") > 1.0)
            if sure.height:
                found.append(sure.head(1))
                break
    if not found:
        return pl.DataFrame()
    sure = pl.concat(found, how="diagonal_relaxed")
    return sure.with_columns(params=pl.Series([params_text(r) for r in sure.iter_rows(named=True)], dtype=pl.String))


def _declared_names(table: str) -> list[str]:
    from sweep.store import TABLES

    return [c.name for c in TABLES[table].columns if c.name not in ("schema_version", "created_at")]


def _declared(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    return frame.select(_declared_names(table))
