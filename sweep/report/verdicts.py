"""The report's verdicts: one sentence per model at the headline agreement target, read from the
targets table (full depth among its candidates) and, where full depth wins, from the best setting
there (``ReportContext.settings``), in the terms of that setting's own evidence: a ratio inside its
A/A noise floor, a capped one (no compute skipped, measured above 1x), a real slowdown (probes and
heads), or drafts that cost more than they save."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from sweep.analysis import FULL_DEPTH_ID
from sweep.report.plotting import HEADLINE_TARGET

SURE_AMONG = 64  # the verdict seeks a setting distinguishable from 1x among this many of the fastest at its target

if TYPE_CHECKING:
    from sweep.report.context import ReportContext


def verdicts(ctx: ReportContext) -> list[str]:
    """One line per model: the verdict at the headline target, or EAS for models only profiled."""
    trials = ctx.trials
    models = sorted(set(trials["model"].unique().to_list()) if trials.height else set())
    metric = ctx.ok["speedup_metric"][0] if ctx.ok.height else "speedup_wall"
    lines = model_verdicts(
        trials, ctx.targets, ctx.settings, ctx.min_prompts, target=ctx.headline, metric=metric, sure=ctx.sure
    )
    if ctx.profiles is not None:
        for model in sorted(set(ctx.eas["model"].to_list()) - set(models)):
            e = {r["variant"]: r["eas"] for r in ctx.eas.filter(pl.col("model") == model).iter_rows(named=True)}
            lines.append(
                f"{model}: profiled only; EAS hidden {e['hidden']:.3f}, logits {e['logits']:.3f}, top-K {e['topk']:.3f}"
            )
    return lines


def model_verdicts(
    trials: pl.DataFrame,
    targets: pl.DataFrame,
    settings: pl.DataFrame,
    min_prompts: int,
    noun: str = "trials",
    target: float = HEADLINE_TARGET,
    metric: str = "speedup_wall",
    sure: pl.DataFrame | None = None,
) -> list[str]:
    """One line per model of ``trials``: ``verdict`` on its pick in ``targets`` (full depth among the
    candidates), its best setting in ``settings`` at agreement ``target`` and, where the pick's interval reaches 1x,
    the fastest setting there whose interval lies above it (``sure``, ``build.sure_at``), and its count of ok
    ``noun`` that the tables judge (``counted`` on ``metric``: a row left out for a non-finite or non-positive speedup
    is not)."""
    from sweep.analysis import counted

    lines = []
    for model in sorted(set(trials["model"].unique().to_list()) if trials.height else set()):
        n_ok = trials.filter((pl.col("model") == model) & counted(metric)).height
        if not n_ok:
            lines.append(f"{model}: no ok {noun} to judge")
            continue
        best, setting = _at(targets, model, target), _at(settings, model, target)
        if best is None or best["trial_id"] is None:
            lines.append(f"{model}: no gate reaches agreement >= {target} ({n_ok} ok {noun})")
            continue
        above = _of(sure, model) if sure is not None else None
        lines.append(f"{model}: {verdict(best, min_prompts, setting, target, above)} ({n_ok} ok {noun})")
    return lines


def _at(table: pl.DataFrame, model: str, target: float) -> dict | None:
    return _of(table.filter(pl.col("target") == target) if table.height else table, model)


def _of(table: pl.DataFrame, model: str) -> dict | None:
    """``table``'s first row of ``model``, or None."""
    rows = table.filter(pl.col("model") == model) if table.height else table
    return rows.row(0, named=True) if rows.height else None


def verdict(
    best: dict, min_prompts: int, setting: dict | None = None, target: float = HEADLINE_TARGET, sure: dict | None = None
) -> str:
    """One sentence on the best at the headline target, from the figures its table row shows (the
    ranked speedup and its interval). ``best`` full depth (``FULL_DEPTH_ID``): no setting beats it, and
    ``setting`` (the best setting there, if any) says why, in the terms of its own evidence. ``best`` a setting whose
    interval includes 1x: the answer is ``sure``, the fastest there whose interval lies above 1x, if any."""
    head = f"agreement >= {target}"
    if best["trial_id"] == FULL_DEPTH_ID:
        if setting is None or setting.get("trial_id") is None:
            return f"no setting reaches {head}; full depth (1x) is the only choice there"
        return (
            f"no setting beats full depth at {head} (best setting there: {_what(setting, min_prompts)}; "
            f"{why_not(setting)})"
        )
    what = _what(best, min_prompts)
    lo = best.get("speedup_lo")
    if lo is None or lo > 1.0:
        return f"{head} with a speedup: {what}"
    unsure = f"{what}, is faster by its point, but its interval includes 1x"
    if sure is not None:
        return f"{head} with a speedup: {_what(sure, min_prompts)} (the fastest there, {unsure})"
    return (
        f"no gate reaches {head} with a speedup distinguishable from 1x (the fastest there, {unsure}; no slower "
        f"setting's lies above 1x, of the {SURE_AMONG} fastest)"
    )


def _what(row: dict, min_prompts: int) -> str:
    """A setting's name and its figures: the measured ratio, the ranked one and its interval."""
    metric, speedup, lo, hi = row["speedup_metric"], row["speedup"], row.get("speedup_lo"), row.get("speedup_hi")
    ci = f", 95% CI {lo:.2f}-{hi:.2f}x" if lo is not None and hi is not None else ""
    few = ""
    if row.get("ci_few_prompts"):
        prompts, units = row.get("ci_prompts"), row.get("ci_units")
        batched = units is not None and (prompts is None or units < prompts)
        counted = f"{units} batches" if batched else f"{prompts} prompts"
        few = f" [interval from {counted}, fewer than {min_prompts}: too coarse to trust]"
    measured = row.get(metric)
    shown = f"{metric} {speedup:.3f}x{ci}"
    if measured is not None and abs(measured - speedup) > 1e-12:
        shown = f"{metric} ranked {speedup:.3f}x (measured {measured:.3f}x){ci}"  # the column holds the measured
    if row.get("mode") == "self_speculative":
        accept = row.get("acceptance_rate")
        return (
            f"lossless self-speculation {row['params']}, {shown}, acceptance rate "
            f"{'n/a' if accept is None else format(accept, '.2f')}{few}"
        )
    return f"{row['gate']} {row['params']}, {shown}, exit rate {row['exit_rate']:.2f}{few}"


def why_not(row: dict) -> str:
    """Why a setting does not beat full depth, from its own figures."""
    floor = row.get("speedup_floor")
    if row.get("capped"):
        return "it skipped no compute, so its measured ratio above 1x is timing noise and counts as 1x"
    if row.get("within_noise"):
        return f"its speedup lies inside its A/A noise floor of +-{100 * floor:.1f}%: indistinguishable from 1x"
    if not row.get("skipped_compute"):
        return "it skipped no compute; its probes and heads cost real time"
    if row.get("mode") == "self_speculative":
        return "drafting and verifying cost more than the accepted drafts save"
    return "its probes and K/V fills cost more than the skipped layers save"
