"""The report's per-model tables: the A/A noise floor, the best speedup at each target (full depth
among the candidates, the best setting beside it) and the knees of the fronts; Markdown helpers
the sections share."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from sweep.analysis import FULL_DEPTH_ID, KNEE_MIN_POINTS
from sweep.textfit import wrap

if TYPE_CHECKING:
    from sweep.report.context import ReportContext


def floor_of(ctx: ReportContext, model: str) -> float | None:
    rows = ctx.floors.filter(pl.col("model") == model) if ctx.floors.height else ctx.floors
    return rows["floor"][0] if rows.height else None


def floor_lines(ctx: ReportContext, model: str) -> list[str]:
    """The model's A/A noise floor: what was measured, the floor at the trials' rounds, and the rounds
    the target floor needs."""
    rows = ctx.floors.filter(pl.col("model") == model) if ctx.floors.height else ctx.floors
    if not rows.height:  # no floor: a model with measured trials from before schema 7, or with none (traced only)
        measured = ctx.ok.height and model in ctx.ok["model"].to_list()
        return ["Noise floor: no trial of this model timed an A/A control (rows from before schema 7).", ""] * measured
    r = rows.row(0, named=True)
    need = (
        f"about {r['rounds_for_target']} timed rounds (bench.repeats; projected from the floor at {r['repeats']}: "
        "its spread shrinks as 1/sqrt(rounds), the A/A's offset from 1x does not)"
        if r["rounds_for_target"] is not None
        else "more than any number of rounds: the A/A's own offset from 1x is that large and does not average away"
    )
    own = f"; the trials' own floors: median ±{100 * r['trial_floor_median']:.1f}%" if r["trial_floor_median"] else ""
    return [
        (
            f"Noise floor (A/A control: full depth timed against full depth in the same rounds as each trial): "
            f"{r['aa_controls']} controls, {r['aa_rounds']} rounds; A/A speedup median {r['aa_median']:.3f}x "
            f"(least {r['aa_min']:.3f}x, greatest {r['aa_max']:.3f}x). Pooled over those rounds the floor at "
            f"{r['repeats']} rounds is **±{100 * r['floor']:.1f}%**{own}: a speedup inside its trial's own floor "
            f"cannot be told from 1x and counts as 1x (≈1x below). A floor of ±{100 * r['floor_target']:g}% "
            f"(analysis.floor_target) needs {need} at these prompts and tokens."
        ),
        "",
    ]


def speedup_text(r: dict) -> str:
    """A ranked speedup with what made it: full depth, capped, inside the floor, or a real slowdown."""
    if r["trial_id"] == FULL_DEPTH_ID:
        return f"{r['speedup']:.3f} (full depth)"
    measured = r.get(r["speedup_metric"])
    if r.get("capped"):
        return f"{r['speedup']:.3f} (capped: skipped no compute, measured {num(measured)})"
    if r.get("within_noise"):
        return f"≈1x (measured {num(measured)}, inside ±{100 * r['speedup_floor']:.1f}%)"
    if not r.get("skipped_compute"):
        return f"{r['speedup']:.3f} (skipped no compute: probe and head cost)"
    return f"{r['speedup']:.3f}"


def targets_table(ctx: ReportContext, model: str) -> list[str]:
    if not ctx.targets.height or model not in ctx.targets["model"].to_list():
        return []
    settings = {}
    if ctx.settings.height:
        sub = ctx.settings.filter((pl.col("model") == model) & pl.col("trial_id").is_not_null())
        settings = {r["target"]: r for r in sub.iter_rows(named=True)}
    lines = [
        "Best speedup at each agreement target (full depth among the candidates; the best setting beside it):",
        "",
        *table_head(
            "agreement >=", "speedup", "CI", "agreement", "CI", "gate", "parameters", "trial", "best setting there"
        ),
    ]
    for r in ctx.targets.filter(pl.col("model") == model).iter_rows(named=True):
        if r["trial_id"] is None:
            lines.append(f"| {r['target']:g} | none | | | | | | | |")
            continue
        other = settings.get(r["target"])
        beside = (
            "none reaches it"
            if other is None
            else "this one"
            if other["trial_id"] == r["trial_id"]
            else f"{other['gate']} {other['params']}: {speedup_text(other)}"
        )
        lines.append(
            f"| {r['target']:g} | {speedup_text(r)} | {ci(r, 'speedup')} | {r['agreement']:.3f} | "
            f"{ci(r, 'agreement')} | {r['gate']} | {r['params']} | `{r['trial_id']}` | {beside} |"
        )
    return lines + [""]


def knees_table(ctx: ReportContext, model: str) -> list[str]:
    front, knees = ctx.front, ctx.knees
    sizes = (
        front.filter(pl.col("model") == model)
        .group_by("front", "front_gate")
        .len()
        .sort("front", "front_gate", nulls_last=False)
        if front.height
        else front
    )
    if not sizes.height:
        return []
    floor = ctx.knee_min_agreement
    lines = [
        (
            f"Knees of the fronts (chord method over the front points with agreement >= {floor:g}, "
            f"analysis.knee_min_agreement; fronts of {KNEE_MIN_POINTS}+ points, full depth counted; the unrestricted "
            "knee over all points beside it; Kneedle cross-check with 12+ points):"
        ),
        "",
        *table_head(
            "front", "points", "knee speedup", "knee agreement", "gate", "parameters", "Kneedle", "unrestricted knee"
        ),
    ]
    rows = knees.filter(pl.col("model") == model).iter_rows(named=True) if knees.height else []
    by_front = {(r["front"], r["front_gate"]): r for r in rows}
    for f in sizes.iter_rows(named=True):
        r = by_front.get((f["front"], f["front_gate"]))
        label = f["front_gate"] or "all"
        if r is None:
            lines.append(f"| {label} | {f['len']} | no knee (fewer than {KNEE_MIN_POINTS} points) | | | | | |")
            continue
        name = (
            "full depth" if r["knee_all_trial_id"] == FULL_DEPTH_ID else f"{r['knee_all_gate']} {r['knee_all_params']}"
        )
        whole = f"{name}: {r['knee_all_speedup']:.3f}x / {r['knee_all_agreement']:.3f}"
        if r["trial_id"] is None:
            lines.append(
                f"| {label} | {r['front_points']} | no knee (fewer than {KNEE_MIN_POINTS} points at agreement >= "
                f"{floor:g}: {r['knee_points']}) "
                f"| | | | | {whole} |"
            )
            continue
        kneedle = f"{r['kneedle_speedup']:.3f}x / {r['kneedle_agreement']:.3f}" if r["kneedle_trial_id"] else "n/a"
        lines.append(
            f"| {label} | {r['front_points']} | {r['speedup']:.3f} | {r['agreement']:.3f} | "
            f"{r['gate']} | {r['params']} | {kneedle} | {whole} |"
        )
    return lines + [""]


def table_head(*columns: str) -> list[str]:
    """A Markdown table's header and separator rows."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def num(value, fmt: str = ".3f") -> str:
    return "n/a" if value is None else format(value, fmt)


def ci(row: dict, metric: str) -> str:
    lo, hi = row.get(f"{metric}_lo"), row.get(f"{metric}_hi")
    if lo is None or hi is None:
        return ""
    return f"{lo:.3f}-{hi:.3f}" + (" †" if row.get("ci_few_prompts") else "")


def stopped_lines(rows: list[dict]) -> list[str]:
    """How many settings stopped early (``search.min_agreement``), after how many prompts, and the bench seconds
    they spent: measured figures only. What stopping saved is not estimated: a stopped setting's time to the end
    depends on its own exits and its bundle, and the sweep's wall time on its slowest worker
    (``benchmarks/early_stop.py`` measures it)."""
    stopped = [r for r in rows if r.get("status") == "stopped"]
    if not stopped:
        return []
    spent = sum(r.get("bench_seconds") or 0.0 for r in stopped)
    at = sorted({r["stopped_at_prompts"] for r in stopped if r.get("stopped_at_prompts") is not None})
    after = f"after their first {' or '.join(map(str, at))} prompts" if at else "after their first prompts"
    return wrap(
        f"{len(stopped)} of {len(rows)} settings stopped early: {after}, their agreement's bootstrap interval ended "
        f"below search.min_agreement, so they are never ranked and none was timed; they spent {spent:.1f} s of "
        "bench in all. What that saved is not measured: the settings that went on kept their bundles' shared "
        "baselines, and a sweep's wall time follows its slowest worker (docs/sweeps.md)."
    )
