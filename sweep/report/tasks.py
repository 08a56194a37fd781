"""The report's task section and verdict lines (trials with ``eval.task``): accuracy under each gate beside full
depth's, the best speedup within 1% and 5% accuracy loss, the front of speedup against accuracy, and the EAS paper's
table (``sweep.analysis._tasks``). A loss is in points of the task's metric (full depth's minus the setting's)."""

from __future__ import annotations

import polars as pl

from sweep.analysis import TASK_KEYS as KEYS
from sweep.analysis import (
    FULL_DEPTH_ID,
    accuracy_front,
    accuracy_targets,
    oracle_bound,
    setting_name,
    stopped_task_rows,
    task_eas,
    task_trials,
)
from sweep.report.context import ReportContext


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _num(x, fmt: str = "{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _speed(r: dict) -> str:
    """The ranked speedup as the report writes it: ≈1x inside the trial's A/A noise floor."""
    return "≈1x" if r.get("within_noise") and r["trial_id"] != FULL_DEPTH_ID else f"{r['speedup']:.3f}x"


def _acc(r: dict) -> str:
    lo, hi = r.get("accuracy_loss_lo"), r.get("accuracy_loss_hi")
    ci = f" [{_pct(lo)}, {_pct(hi)}]" if lo is not None and hi is not None and r["trial_id"] != FULL_DEPTH_ID else ""
    return f"{_num(r['accuracy'])} (loss {_pct(r['accuracy_loss'])}{ci})"


def _group(r: dict, several: set) -> str:
    """A group as the lines name it: model and task, with its problem set where the model and task have several
    (``several``: those pairs, ``_several``)."""
    n, samples = r.get("problem_set"), r.get("task_samples")
    over = f", {n} problems" if n is not None and (r["model"], r["task"]) in several else ""
    over += f" x {samples} completions" if over and samples is not None and samples > 1 else ""
    return f"{r['model']} on {r['task']}{over}"


def _several(frame: pl.DataFrame) -> set:
    """The (model, task) pairs of ``frame`` measured over more than one problem set."""
    if not frame.height:
        return set()
    sets = frame.group_by("model", "task").agg(pl.struct("problem_set", "task_samples").n_unique().alias("n"))
    return {(r["model"], r["task"]) for r in sets.filter(pl.col("n") > 1).iter_rows(named=True)}


def _said(r: dict) -> str:
    return f"{setting_name(r)}, {_speed(r)}, {r['task_metric']} {_acc(r)}"


def _unsure(r: dict) -> bool:
    """A setting whose speedup's bootstrap interval reaches 1x (full depth is 1x exactly)."""
    return r["trial_id"] != FULL_DEPTH_ID and r.get("speedup_lo") is not None and r["speedup_lo"] <= 1.0


def _pick(r: dict, sure: dict | None) -> str:
    """One target's pick: the fastest setting within the loss; where its speedup's interval includes 1x, the fastest
    whose interval lies above 1x (``sure``; full depth where none does), beside it."""
    if not _unsure(r):
        return _said(r)
    why = f"{setting_name(r)} is faster by its point, {_speed(r)}, but its interval [{r['speedup_lo']:.3f}, "
    why += f"{_num(r.get('speedup_hi'))}] includes 1x"
    return f"{_said(sure) if sure is not None else 'full depth, 1.000x'} ({why})"


def task_verdict_lines(ok: pl.DataFrame) -> list[str]:
    """Per group: the best speedup within 1% and 5% accuracy loss (full depth when no setting beats it), judged as the
    agreement verdicts judge: a setting whose speedup's bootstrap interval includes 1x is not the answer; the fastest
    whose interval lies above it is (full depth where none does), the other named beside it."""
    targets = accuracy_targets(ok)
    if not targets.height:
        return []
    sure_rows = task_trials(ok)
    sure_rows = sure_rows.filter(pl.col("speedup_lo") > 1.0) if "speedup_lo" in sure_rows.columns else sure_rows

    def key(r: dict) -> tuple:  # a group and its allowed loss
        return (*(r[k] for k in KEYS), r["max_loss"])

    sure = {
        key(r): r
        for r in (accuracy_targets(sure_rows).iter_rows(named=True) if sure_rows.height else [])
        if r["trial_id"] != FULL_DEPTH_ID
    }
    lines, several = [], _several(targets)
    for _, group in targets.group_by(list(KEYS), maintain_order=True):
        first = group.row(0, named=True)
        parts = [
            f"within {100 * r['max_loss']:.0f}% loss: {_pick(r, sure.get(key(r)))}" for r in group.iter_rows(named=True)
        ]
        full = first["accuracy_full"]
        vacuous = "; it solves none: no loss can show" if full == 0 else ""
        said = f"{_group(first, several)} ({first['task_metric']} {full:.3f} at full depth{vacuous}): "
        lines.append(said + "; ".join(parts))
    return lines


def _stopped(r: dict) -> str:
    """A setting stopped once its loss over all problems was certain to exceed search.max_accuracy_loss."""
    return (
        f"stopped: {setting_name(r)} {r['trial_id']} after {r['task_problems']} problems: its loss over all of them "
        f"is at least {_pct(r['accuracy_loss_min'])} (above search.max_accuracy_loss)"
    )


def stopped_task_lines(ok: pl.DataFrame) -> list[str]:
    """A line per setting of ``ok`` stopped on its accuracy loss (``_stopped``)."""
    rows = stopped_task_rows(ok)
    return [_stopped(r) for r in (rows.sort("model", "trial_id").iter_rows(named=True) if rows.height else [])]


def task_section(ctx: ReportContext) -> list[str]:
    """Markdown lines: every task trial, the fronts of speedup against accuracy, the targets, the EAS paper's table."""
    rows, stopped = task_trials(ctx.ok), stopped_task_lines(ctx.ok)
    if not rows.height and not stopped:
        return []
    lines = [
        "## Task accuracy",
        "",
        "Accuracy under each setting beside full depth's on the same problems (greedy, same run); loss = full minus "
        "gated, in points of the task's metric, its 95% interval from problems resampled in pairs. Speedups are the "
        "ranked ones of the tables above; agreement is on the timed prompts, task agreement on the task's own "
        "completions (the fraction of full depth's tokens the setting's completion has at the same position; "
        "greedy decoding only).",
        "",
        "| model | task | problems | setting | speedup | agreement | task agreement | accuracy [95% CI] | full depth "
        "| loss [95% CI] | layers skipped |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows.sort("model", "task", "speedup", descending=[False, False, True]).iter_rows(named=True):
        saved = r.get("task_layers_saved")
        lines.append(
            f"| {r['model']} | {r['task']} | {_num(r.get('task_problems'), '{}')} | {setting_name(r)} | {_speed(r)} | "
            f"{_num(r['agreement'])} | {_num(r.get('task_agreement'))} | {_num(r['accuracy'])} "
            f"[{_num(r.get('accuracy_lo'))}, "
            f"{_num(r.get('accuracy_hi'))}] | {_num(r['accuracy_full'])} | {_pct(r['accuracy_loss'])} "
            f"[{_pct(r.get('accuracy_loss_lo'))}, {_pct(r.get('accuracy_loss_hi'))}] | "
            f"{'n/a' if saved is None else f'{100 * saved:.1f}%'} |"
        )
    lines += ["", *[f"- {line}" for line in stopped]] if stopped else []
    front = accuracy_front(ctx.ok)
    lines += ["", "Fronts of speedup against accuracy (full depth a candidate on each):", ""]
    several = _several(front)
    for _, group in front.group_by(list(KEYS), maintain_order=True) if front.height else []:
        points = ", ".join(f"{setting_name(r)} {_speed(r)} at {r['accuracy']:.3f}" for r in group.iter_rows(named=True))
        lines.append(f"- {_group(group.row(0, named=True), several)}: {points}")
    lines += ["", "Best speedup within an accuracy loss:", ""] + [f"- {line}" for line in task_verdict_lines(ctx.ok)]
    oracle = oracle_bound(ctx.profiles) if ctx.profiles is not None else None
    table = task_eas(ctx.ok, ctx.eas if ctx.profiles is not None else None, oracle)
    lines += [
        "",
        "Layers skipped at <= 5% accuracy loss (the EAS paper's bound, measured: the setting that skips most of the "
        "task's own tokens' layers within that loss), beside the oracle bound at agreement 1.0 and EAS where the "
        "model was profiled (on the profiled prompts, which need not be the task's):",
        "",
        "| model | task | problems | layers skipped at <= 5% loss | by | speedup | loss | oracle at agreement 1.0 "
        "| EAS hidden | EAS logits | EAS top-K |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.iter_rows(named=True) if table.height else []:

        def get(key, fmt="{:.3f}"):
            v = r.get(key)
            return "n/a" if v is None else fmt.format(v)

        lines.append(
            f"| {r['model']} | {r['task']} | {get('problem_set', '{}')} | {100 * r['layers_skipped_5pct']:.1f}% | "
            f"{r['name']} | {r['speedup']:.3f}x | {_pct(r['accuracy_loss'])} | {get('oracle_skippable', '{:.1%}')} | "
            f"{get('eas_hidden')} | {get('eas_logits')} | {get('eas_topk')} |"
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
        "task accuracy (loss = full depth minus the setting, in points of the task's metric, its 95% interval over "
        "problems resampled in pairs; speedup: the ranked one; agreement: on the timed prompts; task_agreement: on "
        "the task's completions):"
    )
    if measured.height:
        df = measured.sort("model", "task", "speedup", descending=[False, False, True]).select(
            "model",
            "task",
            setting=pl.struct(pl.all()).map_elements(setting_name, return_dtype=pl.String),
            trial_id=pl.col("trial_id"),
            problems=pl.col("task_problems"),
            speedup=pl.col("speedup"),
            agreement=pl.col("agreement"),
            task_agreement=pl.col("task_agreement") if "task_agreement" in measured.columns else pl.lit(None),
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
        lines += wrap(f"  {_stopped(r)}")
    lines += [line for v in task_verdict_lines(ok) for line in wrap(f"  {v}")]
    eas = task_eas(ok, None, oracle)
    several = _several(eas)
    for r in eas.iter_rows(named=True) if eas.height else []:
        bound = r.get("oracle_skippable")
        beside = f", beside an oracle bound of {100 * bound:.1f}% at agreement 1.0" if bound is not None else ""
        by = "full depth" if r["setting"] == FULL_DEPTH_ID else f"{r['setting']}) by ({r['name']}"
        share = f"{100 * r['layers_skipped_5pct']:.1f}%"
        lines += wrap(
            f"  {_group(r, several)}: {share} of the completions' layers skipped at <= 5% loss ({by}){beside}"
        )
    return lines
