"""The report's task section and verdict lines (trials with ``eval.task``): accuracy under each gate beside full
depth's, the best speedup within 1% and 5% accuracy loss, the front of speedup against accuracy, and the EAS paper's
table (``sweep.analysis._tasks``)."""

from __future__ import annotations

import polars as pl

from sweep.analysis import FULL_DEPTH_ID, accuracy_front, accuracy_targets, oracle_bound, task_eas, task_trials
from sweep.report.context import ReportContext


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _acc(r: dict) -> str:
    lo, hi = r.get("accuracy_loss_lo"), r.get("accuracy_loss_hi")
    ci = f" [{_pct(lo)}, {_pct(hi)}]" if lo is not None and hi is not None and r["trial_id"] != FULL_DEPTH_ID else ""
    return f"{r['accuracy']:.3f} (loss {_pct(r['accuracy_loss'])}{ci})"


def _name(r: dict) -> str:
    if r["trial_id"] == FULL_DEPTH_ID:
        return "full depth"
    return f"{r['gate']} {r.get('params') or ''}".strip()


def task_verdict_lines(ok: pl.DataFrame) -> list[str]:
    """Per model and task: the best speedup within 1% and 5% accuracy loss (full depth when no setting beats it)."""
    targets = accuracy_targets(ok)
    lines = []
    for (model, task), group in targets.group_by(["model", "task"], maintain_order=True) if targets.height else []:
        parts = []
        for r in group.iter_rows(named=True):
            parts.append(
                f"within {100 * r['max_loss']:.0f}% loss: {_name(r)}, {r['speedup']:.3f}x, {r['task_metric']} {_acc(r)}"
            )
        full = group.row(0, named=True)["accuracy_full"]
        lines.append(
            f"{model} on {task} ({group.row(0, named=True)['task_metric']} {full:.3f} at full depth): "
            + "; ".join(parts)
        )
    return lines


def task_section(ctx: ReportContext) -> list[str]:
    """Markdown lines: every task trial, the fronts of speedup against accuracy, the targets, the EAS paper's table."""
    rows = task_trials(ctx.ok)
    if not rows.height:
        return []
    lines = [
        "## Task accuracy",
        "",
        "Accuracy under each setting beside full depth's on the same problems (greedy, same run); loss = full minus "
        "gated, its 95% interval from problems resampled in pairs. Speedups are the ranked ones of the tables above.",
        "",
        "| model | task | setting | speedup | agreement | accuracy [95% CI] | full depth | loss [95% CI] "
        "| layers skipped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows.sort("model", "task", "speedup", descending=[False, False, True]).iter_rows(named=True):
        saved = r.get("task_layers_saved")
        lines.append(
            f"| {r['model']} | {r['task']} | {_name(r)} | {r['speedup']:.3f}x | {r['agreement']:.3f} | "
            f"{r['accuracy']:.3f} [{r['accuracy_lo']:.3f}, {r['accuracy_hi']:.3f}] | {r['accuracy_full']:.3f} | "
            f"{_pct(r['accuracy_loss'])} [{_pct(r['accuracy_loss_lo'])}, {_pct(r['accuracy_loss_hi'])}] | "
            f"{'n/a' if saved is None else f'{100 * saved:.1f}%'} |"
        )
    front = accuracy_front(ctx.ok)
    lines += ["", "Fronts of speedup against accuracy (full depth a candidate on each):", ""]
    for (model, task), group in front.group_by(["model", "task"], maintain_order=True):
        points = ", ".join(
            f"{_name(r)} {r['speedup']:.3f}x at {r['accuracy']:.3f}" for r in group.iter_rows(named=True)
        )
        lines.append(f"- {model} on {task}: {points}")
    lines += ["", "Best speedup within an accuracy loss:", ""] + [f"- {line}" for line in task_verdict_lines(ctx.ok)]
    oracle = oracle_bound(ctx.profiles) if ctx.profiles is not None else None
    table = task_eas(ctx.ok, ctx.eas if ctx.profiles is not None else None, oracle)
    lines += [
        "",
        "Layers skipped at <= 5% accuracy loss (the EAS paper's bound, measured: the setting that skips most of the "
        "task's own tokens' layers within that loss), beside the oracle bound at agreement 1.0 and EAS where the "
        "model was profiled:",
        "",
        "| model | task | layers skipped at <= 5% loss | by | speedup | loss | oracle at agreement 1.0 | EAS hidden "
        "| EAS logits | EAS top-K |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.iter_rows(named=True):

        def get(key, fmt="{:.3f}"):
            v = r.get(key)
            return "n/a" if v is None else fmt.format(v)

        lines.append(
            f"| {r['model']} | {r['task']} | {100 * r['layers_skipped_5pct']:.1f}% | "
            f"{'full depth' if r['setting'] == FULL_DEPTH_ID else r['setting']} | {r['speedup']:.3f}x | "
            f"{_pct(r['accuracy_loss'])} | {get('oracle_skippable', '{:.1%}')} | {get('eas_hidden')} | "
            f"{get('eas_logits')} | {get('eas_topk')} |"
        )
    return lines + [""]


def run_task_lines(ok: pl.DataFrame, rows: list[dict], oracle: pl.DataFrame | None = None) -> list[str]:
    """What `sweep run` ends with where its settings measured a task: each setting's accuracy and loss with their
    intervals beside its ranked speedup (a stopped setting with its certain bound), the best speedup within 1% and
    5% loss, and the layers skipped at <= 5% loss beside the oracle bound at agreement 1.0 (the EAS paper's table)."""
    from sweep.textfit import table, wrap

    measured = task_trials(ok)
    stopped = [r for r in rows if r.get("accuracy_loss_min") is not None]
    if not measured.height and not stopped:
        return []
    lines = wrap(
        "task accuracy (loss = full depth minus the setting, its 95% interval over problems resampled in pairs; "
        "speedup: the ranked one):"
    )
    if measured.height:
        df = measured.sort("model", "task", "speedup", descending=[False, False, True]).select(
            "model",
            "task",
            setting=pl.struct("gate", "trial_id").map_elements(lambda r: f"{r['gate']} {r['trial_id']}", pl.String),
            problems=pl.col("task_problems"),
            speedup=pl.col("speedup"),
            agreement=pl.col("agreement"),
            accuracy=pl.col("accuracy"),
            acc_lo=pl.col("accuracy_lo"),
            acc_hi=pl.col("accuracy_hi"),
            full_depth=pl.col("accuracy_full"),
            loss=pl.col("accuracy_loss"),
            loss_lo=pl.col("accuracy_loss_lo"),
            loss_hi=pl.col("accuracy_loss_hi"),
            layers_skipped=pl.col("task_layers_saved"),
        )
        lines += table(df, keys=("setting",))
    for r in stopped:
        lines += wrap(
            f"  stopped: {r['gate']} {r['trial_id']} after {r['task_problems']} problems: its loss over all of them "
            f"is at least {_pct(r['accuracy_loss_min'])} (above search.max_accuracy_loss)"
        )
    lines += [line for v in task_verdict_lines(ok) for line in wrap(f"  {v}")]
    eas = task_eas(ok, None, oracle)
    for r in eas.iter_rows(named=True) if eas.height else []:
        bound = r.get("oracle_skippable")
        beside = f", beside an oracle bound of {100 * bound:.1f}% at agreement 1.0" if bound is not None else ""
        lines += wrap(
            f"  {r['model']} on {r['task']}: {100 * r['layers_skipped_5pct']:.1f}% of the completions' layers skipped "
            f"at <= 5% loss ({'full depth' if r['setting'] == FULL_DEPTH_ID else r['setting']}){beside}"
        )
    return lines
