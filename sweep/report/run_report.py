"""What `sweep run` prints at its end: the settings' table and Pareto front, the verdict on them, and
where to go next (`sweep analyze` and its report); every line within 120 columns (``sweep.textfit``).

"Setting": one point of the search (one gate and its thresholds), one row in the results. "Tune
trial": what Ray Tune schedules, one setting or a bundle of settings timed against one shared
baseline (``sweep.shared_baseline``).
"""

from __future__ import annotations

from pathlib import Path

from sweep.report.tables import stopped_lines
from sweep.textfit import counted, table, wrap

TABLE_COLUMNS = (
    "model",
    "gate",
    "min_layer",
    "GATE_COLUMNS",
    "kv_policy",
    "mode",
    "draft_len",
    "draft_stop",
    "batch_size",
    "repeats",
    "status",
    "agreement",
    "speedup_wall",
    "speedup_model",
    "speedup_e2e_wall",
    "speedup_aa",
    "noise_floor",
    "exit_rate",
    "step_layers_saved",
    "trial_id",
)


def sweep_report(outcome, analysis=None, bar: float | None = None) -> str:
    """The settings of this sweep (measured now, or whose rows an earlier run wrote), their Pareto front
    (speedup_wall, agreement), the verdict at the headline target with ``analysis`` (the config's
    analysis section; None: no verdict), and at ``bar`` too (the search's own agreement constraint) where it is
    another, and the pointer to `sweep analyze` and its report."""
    import polars as pl

    from sweep.analysis import pareto_front
    from sweep.gates import GATE_COLUMNS

    lines = [
        *wrap(
            f"sweep {outcome.name}: {counted(outcome.written, 'setting')} measured and written, "
            f"{outcome.skipped} skipped "
            f"(their rows exist), {failures(outcome)} failed"
            # (stdout alone, as a log keeps it, must not read as a whole sweep)
            + (
                "; stopped before its end: the rest are measured on the resume (the last line, on stderr)"
                * bool(outcome.interrupted)
            )
        ),
        *wrap(
            f"rows: {outcome.root}/trials (one Parquet file per setting); Tune state"
            # an Optuna or skip-set search's study, where it keeps it (sweep.orchestrate.searches.study.study_file)
            + (" and Optuna study" if (Path(outcome.path) / "optuna.db").is_file() else "")
            + f": {outcome.path}"
        ),
    ]
    if not outcome.rows:
        return "\n".join(lines)
    if outcome.simulated is not None:
        lines += screen_report(outcome)
    cols = [c for name in TABLE_COLUMNS for c in (GATE_COLUMNS if name == "GATE_COLUMNS" else [name])]
    df = pl.DataFrame([{c: r.get(c) for c in cols} for r in outcome.rows], infer_schema_length=None)
    df = df.sort("model", "gate", "min_layer", *GATE_COLUMNS, "batch_size", nulls_last=True)
    new = outcome.written
    lines += [f"settings ({df.height}; {df.height - new} with rows from an earlier run or another sweep):"]
    lines += table(df, keys=("gate",))
    lines += stopped_lines(outcome.rows)
    front = pareto_front(df, by=("model",)).select(
        "model", "gate", "min_layer", *GATE_COLUMNS, "agreement", "speedup", "speedup_wall", "trial_id"
    )
    lines += wrap(
        "Pareto front (speedup and agreement, both maximised; status ok; full depth, 1x at agreement 1, a candidate: "
        "on it unless a setting at agreement 1 ranks above 1x; speedup = speedup_wall capped at 1 from above where "
        "no compute was skipped, and 1 inside the trial's A/A noise floor):"
    )
    lines += table(front, keys=("gate",)) if front.height else ["(no ok settings)"]
    if analysis is not None:
        lines += knee_lines(front, analysis.knee_min_agreement, outcome.simulated)
        lines += verdict_lines(outcome, analysis, bar)
    return "\n".join(lines)


def knee_lines(front, min_agreement: float, simulated=None) -> list[str]:
    """The knee of each model's front (the chord method over its points at agreement >= ``min_agreement``, as
    `sweep analyze` takes it), or why there is none; where the sweep replayed its settings on a trace
    (``simulated``: a screen's or a bracket's table), also the fastest the cost model predicts among them at that
    agreement, so a user sees whether any could have beaten full depth by more than a timing floor."""
    import polars as pl

    from sweep.analysis import KNEE_MIN_POINTS, chord_knees, params_text

    lines = []
    for model in sorted(set(front["model"].to_list())):
        points = front.filter((pl.col("model") == model) & (pl.col("agreement") >= min_agreement))
        knees = chord_knees(points, by=("model",))
        if knees.height:
            k = knees.row(0, named=True)
            what = f"{k['gate']} {params_text(k)}".strip()
            lines += wrap(
                f"knee of {model}'s front: {what}, speedup {k['speedup']:.3f}x, agreement {k['agreement']:.3f}"
            )
        else:
            # full depth is on the front unless a setting at agreement 1 ranks above 1x (a point at 1x and agreement
            # 1, the reference or a setting that ties it, is full depth's)
            full = points.filter(
                (pl.col("gate") == "full") | ((pl.col("speedup") <= 1.0) & (pl.col("agreement") >= 1.0))
            )
            among = (
                "full depth among them" if full.height else "not full depth: a setting at agreement 1 ranks above 1x"
            )
            lines += wrap(
                f"no knee on {model}'s front: {points.height} point(s) at agreement >= {min_agreement} ({among}), "
                f"a knee needs {KNEE_MIN_POINTS}; a setting ranks on it only where it beats full depth"
            )
            lines += replay_bound(simulated, model, min_agreement)
    return lines


def replay_bound(simulated, model: str, min_agreement: float) -> list[str]:
    """The replay's fastest setting of ``model`` at agreement >= ``min_agreement`` (its teacher-forced
    agreement) and its cost-model speedup, or that none reaches it."""
    import polars as pl

    from sweep.analysis import params_text

    if simulated is None or not {"speedup_model", "agreement_tf"} <= set(simulated.columns):
        return []
    mine = simulated.filter((pl.col("model") == model) & pl.col("speedup_model").is_not_null())
    mine = mine.unique("trial_id", keep="first", maintain_order=True)  # one per setting (two texts, one gate: one)
    if not mine.height:
        return []
    able = mine.filter(pl.col("agreement_tf") >= min_agreement).sort("speedup_model", descending=True)
    if not able.height:
        return wrap(
            f"replayed on the trace, none of the sweep's {mine.height} settings keeps agreement >= {min_agreement} "
            f"(teacher-forced)"
        )
    r = able.row(0, named=True)
    what = f"{r['gate']} {params_text(r)}".strip()
    return wrap(
        f"replayed on the trace, {able.height} of the sweep's {mine.height} settings keep agreement >= {min_agreement} "
        f"(teacher-forced; a closed loop's errors cascade, so it usually keeps less); the fastest is {what}: "
        f"{r['speedup_model']:.3f}x by the cost model, exit rate {r['exit_rate']:.3f}"
    )


def failures(outcome) -> int:
    """This sweep's failed trials: failed rows, and trials whose config did not compose (no row)."""
    return sum(r.get("status") == "failed" for r in outcome.rows) + outcome.unrowed


def verdict_lines(outcome, analysis, bar: float | None = None) -> list[str]:
    """The verdict `sweep analyze` gives, on this sweep's settings only, and where the full report is; where the
    search sought settings at another agreement (``bar``: its ``search.constraints.agreement``), the verdict there
    too, as `sweep analyze analysis.targets=[bar]` judges a root's settings."""
    from sweep.report.plotting import headline_target

    root = Path(outcome.root)
    report = Path(analysis.out) if analysis.out else root / "report"
    headline, ids = headline_target(analysis.targets), [r["trial_id"] for r in outcome.rows]
    sought = bar is not None and bar != headline
    said = verdicts(root, ids, analysis, (headline, bar) if sought else (headline,))
    lines = [f"verdict on this sweep's {len(outcome.rows)} settings (agreement >= {headline}):"]
    lines += [line for v in said[0] for line in wrap(f"  {v}")]
    if sought:
        lines += wrap(
            f"and at the agreement this search sought (search.constraints.agreement={bar}), on its settings as "
            f"`sweep analyze analysis.targets=[{bar}]` judges a root's:"
        )
        lines += [line for v in said[1] for line in wrap(f"  {v}")]
    for bound in oracle_lines(outcome):
        lines += wrap(f"  {bound}")
    lines += task_lines(outcome, analysis)
    if any(r.get("model") == "smollm2-135m" for r in outcome.rows) and not any(r.get("task") for r in outcome.rows):
        lines += wrap(
            "at what accuracy cost? SmolLM2-135M solves none of HumanEval's problems, so it cannot say; "
            "`sweep run experiment=qwen-coder eval.allow_code_execution=true` measures Qwen2.5-Coder-0.5B-Instruct's "
            "HumanEval pass@1 under three exits beside full depth, with intervals (docs/tasks.md)"
        )
    lines += wrap(
        f"next: `sweep analyze results.root={root}` analyses every row under {root} (fronts, knees, targets with "
        f"intervals, EAS) and writes the report: {report / 'report.md'}"
    )
    return lines


def task_lines(outcome, analysis) -> list[str]:
    """Where the sweep's settings measured a task: their accuracy table and the accuracy verdicts
    (``sweep.report.tasks.run_task_lines``), ranked as `sweep analyze` ranks them."""
    import polars as pl

    from sweep.analysis import load_trials, ok_trials, oracle_bound
    from sweep.report.tasks import run_task_lines
    from sweep.store import trusted_rows

    if not any(r.get("task") for r in outcome.rows):
        return []
    ids = [r["trial_id"] for r in outcome.rows]
    trials = load_trials(Path(outcome.root)).filter(pl.col("trial_id").is_in(ids)).collect()
    trials = trusted_rows(trials, outcome.root, ids=False)
    ok = ok_trials(trials, analysis.speedup, ranks=True).collect()
    return run_task_lines(ok, outcome.rows, _trace_bound(outcome, oracle_bound))


def _trace_bound(outcome, oracle_bound):
    """The oracle bound of the sweep's own trace (a screen's, a bracket's), or None."""
    import polars as pl

    from sweep.store import scan

    if outcome.simulated is None or "trace_run_id" not in outcome.simulated.columns:
        return None
    runs = outcome.simulated["trace_run_id"].unique().to_list()
    trace = scan("profile", outcome.root).filter(pl.col("run_id").is_in(runs)).collect()
    return oracle_bound(trace) if trace.height else None


def verdicts(root: Path, trial_ids: list[str], analysis, at: tuple[float, ...]) -> list[list[str]]:
    """Per agreement target in ``at``, per model, `sweep analyze`'s verdict (``sweep.report.verdicts.model_verdicts``:
    the best at that target, full depth among the candidates, its interval bootstrapped as there) over the given
    settings' rows (read once)."""
    import polars as pl

    from sweep.analysis import load_trials, ok_trials
    from sweep.report.build import sure_at, targets_at
    from sweep.report.verdicts import model_verdicts
    from sweep.store import trusted_rows

    trials = trusted_rows(load_trials(root).filter(pl.col("trial_id").is_in(trial_ids)).collect(), root, ids=False)
    ok = ok_trials(trials, analysis.speedup, ranks=True).collect()
    conf = {"metric": analysis.speedup, "n_boot": analysis.n_boot, "seed": analysis.seed}
    conf["min_prompts"] = analysis.ci_min_prompts
    said = []
    for target in at:
        targets = targets_at(ok, (target,), conf)
        settings = targets_at(ok, (target,), conf, reference=False)
        sure = sure_at(ok, targets, target, conf)
        said.append(
            model_verdicts(
                trials,
                targets,
                settings,
                analysis.ci_min_prompts,
                noun="settings",
                target=target,
                metric=analysis.speedup,
                sure=sure,
            )
        )
    return said


def oracle_lines(outcome) -> list[str]:
    """For a sweep that traced its model (a screen, a bracket): per model, the most any exit rule could save at
    agreement 1.0 on that trace (``sweep.analysis.oracle_bound``)."""
    from sweep.analysis import oracle_bound

    bound = _trace_bound(outcome, oracle_bound)
    if bound is None:
        return []
    return [
        f"{r['model']}: at best {100 * r['skippable']:.1f}% of layers could be skipped at agreement 1.0 (oracle: "
        f"each of the trace's {r['positions']} decisions exits at the first layer whose top-1 is the final one)"
        for r in bound.iter_rows(named=True)
    ]


def screen_report(outcome) -> list[str]:
    """A screen's lines: how many settings were simulated and run, simulated against measured."""
    from sweep.analysis import comparison, gap_by_gate

    sim = outcome.simulated
    lines = wrap(
        f"screen: {sim.height} settings simulated, {int(sim['on_front'].sum())} on the simulated front, "
        f"{int(sim['selected'].sum())} run closed-loop (a grid of the same resolution: {sim.height} settings)"
    )
    comp = comparison(sim, outcome.rows)
    if comp.height:
        lines += ["simulated (teacher-forced) against measured (closed loop):", *table(comp, keys=("gate",))]
        lines += ["gap per gate (simulated - measured):", *table(gap_by_gate(comp), keys=("gate",))]
    return lines
