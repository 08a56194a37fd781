"""The report's sections: each takes the one ``ReportContext`` and returns a ``Section``, its
Markdown lines (ending with a blank line) and the figures it wrote; ``SECTIONS`` is their order.

Header, verdicts, one section per model (the A/A noise floor, targets and knees from
``sweep.report.tables``, Pareto and layer figures), profiles
(EAS and oracle exits), the learned readouts against the logit lens, simulated against measured
(screen) and the batching effect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from sweep.report import figures, figures_layers
from sweep.analysis import (
    eas_per_layer,
    oracle_summary,
)
from sweep.report.tables import (
    floor_lines,
    floor_of,
    knees_table,
    num,
    speedup_text,
    stopped_lines,
    table_head,
    targets_table,
)
from sweep.report.context import ReportContext
from sweep.report.categories import category_lines
from sweep.report.environment import WORKLOAD, environment_lines
from sweep.report.tasks import task_section, task_verdict_lines
from sweep.report.verdicts import verdict, verdicts

__all__ = ["SECTIONS", "ReportContext", "Section", "verdict", "verdicts"]


@dataclass(frozen=True)
class Section:
    lines: list[str]
    figures: list[str] = field(default_factory=list)


def _on_accuracy(ok: pl.DataFrame) -> str:
    """How many ok trials' task sides stopped on their accuracy loss (search.max_accuracy_loss), where any did."""
    from sweep.analysis import stopped_task_rows

    n = stopped_task_rows(ok).height
    return f" (and {n} ok whose task stopped on its accuracy loss: the task section names them)" if n else ""


def _ok_count(trials: pl.DataFrame, ok: pl.DataFrame) -> str:
    """The ok rows, and those of them the tables do not rank: a setting's earlier row, timed again over more rounds
    (``best_timed``), and a row without a finite speedup or agreement (``counted``)."""
    from sweep.analysis import counted

    n_ok = trials.filter(pl.col("status") == "ok").height
    usable = trials.filter(counted(ok["speedup_metric"][0] if ok.height else "speedup_wall")).height
    parts = [
        f"{usable - ok.height} earlier row(s) of settings timed again over more rounds" if usable > ok.height else "",
        f"{n_ok - usable} without a finite speedup or agreement" if n_ok > usable else "",
    ]
    said = "; ".join(p for p in parts if p)
    return f"{n_ok} ok" + (f" ({ok.height} ranked; not ranked: {said})" if said else "")


def header(ctx: ReportContext) -> Section:
    lines = ["# Early-exit report", ""]
    trials, ok = ctx.trials, ctx.ok
    lines += environment_lines(trials, ctx.mixes)
    if trials.height:
        lines += [
            (
                f"{trials.height} trials from {trials['run_id'].n_unique()} run(s); {_ok_count(trials, ok)}, "
                f"{trials.filter(pl.col('status') == 'nondeterministic').height} nondeterministic, "
                f"{trials.filter(pl.col('status') == 'failed').height} failed, "
                f"{trials.filter(pl.col('status') == 'stopped').height} stopped early{_on_accuracy(ok)} "
                "(fronts and targets use ok trials only)."
            ),
            "",
        ]
        stopped = stopped_lines(trials.select("status", "bench_seconds", "stopped_at_prompts").to_dicts())
        lines += [" ".join(line.strip() for line in stopped), ""] if stopped else []
    if ok.height:
        lines += [
            (
                f"Speedups rank by `{ok['speedup_metric'][0]}`, as the ranked `speedup`: the measured ratio, except "
                "that a trial that skipped no compute (no decode step exited, or kv_policy=full) is capped at 1x from "
                "above (above 1x its ratio is timing noise: shown as *capped*; below 1x it is the real cost of its "
                "probes, heads and K/V work, and it stays), and a speedup inside the trial's A/A noise floor counts "
                "as 1x (shown as *≈1x*: it cannot be told from full depth). An Optuna objective on speedup_wall is "
                "the same estimator. Full depth (1x at agreement 1.0, always available) is a candidate on every front "
                "(on it unless a setting at agreement 1.0 ranks above 1x) and at every target: a setting it dominates "
                "is on no front, and a target names a setting only where one beats it. Intervals: 95% bootstrap of the "
                "same estimator, prompts and timed rounds resampled, seeded per trial; "
                f"† marks an interval from fewer than {ctx.min_prompts} prompts, or batches for a batched trial's "
                "speedup (analysis.ci_min_prompts), too coarse to trust."
            ),
            "",
        ]
    return Section(lines)


def verdict_section(ctx: ReportContext) -> Section:
    accuracy = [f"- {line}" for line in task_verdict_lines(ctx.ok)]
    return Section(["## Verdicts", ""] + [f"- {v}" for v in verdicts(ctx)] + accuracy + [""])


def model_sections(ctx: ReportContext) -> Section:
    """Per model: the best speedup at each target, the knees of its fronts, its figures."""
    lines, made = [], []
    for model in ctx.models:
        shown = []
        if ctx.ok.height and model in ctx.ok["model"].to_list():
            floor = floor_of(ctx, model)
            shown.append(
                figures.pareto_figure(ctx.ok, ctx.front, ctx.knees, model, ctx.out, floor=floor, target=ctx.headline)
            )
        if ctx.profiles is not None and model in ctx.curves["model"].to_list():
            shown.append(figures_layers.layers_figure(ctx.curves.filter(pl.col("model") == model), model, ctx.out))
        lines += [f"## {model}", "", *floor_lines(ctx, model), *targets_table(ctx, model), *knees_table(ctx, model)]
        lines += [f"![{name}]({name})" for name in shown] + [""]
        made += shown
    return Section(lines, made)


def profiles_section(ctx: ReportContext) -> Section:
    """EAS per model and variant, both oracle exits, the EAS-per-layer figure."""
    if ctx.profiles is None:
        return Section([])
    name = figures_layers.eas_figure(eas_per_layer(ctx.profiles, ctx.alpha), ctx.eas, ctx.alpha, ctx.out)
    lines = [
        "## Profiles: EAS and oracle exits",
        "",
        f"EAS (arXiv 2603.23701), alpha={ctx.alpha:g}, S averaged over all traced positions:",
        "",
        *table_head("model", "variant", "EAS", "K"),
    ]
    lines += [
        f"| {r['model']} | {r['variant']} | {r['eas']:.4f} | {r['topk']} |" for r in ctx.eas.iter_rows(named=True)
    ]
    lines += [
        "",
        (
            "Oracle exits: first match (the earliest layer whose top-1 equals the final one: the bound on "
            "what any exit rule could save) and saturation (the earliest layer from which the top-1 stays "
            "equal up to L)."
        ),
        "",
        *table_head("model", "positions", "first match: mean layer", "before L", "saturation: mean layer", "before L"),
    ]
    lines += [
        f"| {r['model']} | {r['phase']} ({r['positions']}) | {r['mean_first_match']:.2f} of {r['num_layers']} | "
        f"{100 * r['frac_first_match_before_L']:.1f}% | {r['mean_saturation']:.2f} of {r['num_layers']} | "
        f"{100 * r['frac_saturation_before_L']:.1f}% |"
        for r in oracle_summary(ctx.profiles).iter_rows(named=True)
    ]
    return Section(lines + ["", f"![{name}]({name})", ""], [name])


LENS_ROWS = 32  # the lens table shows every layer up to this many, a stride of them beyond


def lens_section(ctx: ReportContext) -> Section:
    """Per model with a trace taken with ``profile.readouts``: the tuned lens against the logit lens
    per layer (top-1 agreement and KL to the final distribution), a table and a figure per readouts."""
    if not ctx.lens.height:
        return Section([])
    lines, made = [], []
    for model in sorted(ctx.lens["model"].unique().to_list()):
        lines += [f"## Learned readouts: tuned lens vs logit lens, {model}", ""]
        sub = ctx.lens.filter(pl.col("model") == model)
        for readouts_id in sorted(sub["readouts_id"].unique().to_list()):
            curve = sub.filter(pl.col("readouts_id") == readouts_id).sort("layer")
            name = figures_layers.lens_figure(curve, model, readouts_id, ctx.out)
            lines += [*_lens_table(curve, readouts_id), f"![{name}]({name})", ""]
            made.append(name)
    return Section(lines, made)


def _lens_table(curve: pl.DataFrame, readouts_id: str) -> list[str]:
    """One readouts' curve as a sentence and a Markdown table (every layer, or a stride and layer L)."""
    L = int(curve["num_layers"][0])
    stride = -(-L // LENS_ROWS)
    rows = curve.filter(((pl.col("layer") - 1) % stride == 0) | (pl.col("layer") == L))
    which = (
        "every layer"
        if stride == 1
        else f"layers 1, {1 + stride}, {1 + 2 * stride}, ... and {L} (the figure has them all)"
    )
    lines = [
        (
            f"Readouts `{readouts_id}` (`sweep fit`) on {curve['prompts'][0]} evaluation prompts (not among those "
            f"they were fitted on), at their {curve['positions'][0]} decision positions (each prompt's last prefill "
            "position and its decode positions): the fraction whose top-1 equals the final layer's, and the mean "
            f"KL(final || lens) in nats, for the logit lens and the tuned lens; {which}."
        ),
        "",
        *table_head("layer", "logit top-1", "tuned top-1", "KL logit", "KL tuned"),
    ]
    lines += [
        f"| {r['layer']} | {r['logit_top1']:.3f} | {r['tuned_top1']:.3f} | {num(r['kl_logit'], '.4g')} | "
        f"{num(r['kl_tuned'], '.4g')} |"
        for r in rows.iter_rows(named=True)
    ]
    return lines + [""]


def screen_section(ctx: ReportContext) -> Section:
    """Simulated against measured, when a screen left simulated rows: a table of the gap per
    gate, and a figure pairing each simulated setting with its closed-loop trial."""
    from sweep.analysis import distinct_simulated, gap_by_gate
    from sweep.store import scan

    sim = distinct_simulated(scan("simulated", ctx.root).filter(pl.col("selected")).collect())
    if not sim.height or not ctx.ok.height:
        return Section([])
    measured = ctx.ok.select("trial_id", "agreement", "speedup_wall", *[c for c in ("speedup_floor",) if c in ctx.ok])
    both = sim.join(measured, on="trial_id", how="inner").with_columns(
        agreement_gap=pl.col("agreement_tf") - pl.col("agreement"),
        speedup_gap=pl.col("speedup_model") - pl.col("speedup_wall"),
    )
    if not both.height:
        return Section([])
    name = figures.screen_figure(both, ctx.out)
    lines = [
        "## Simulated against measured (screen)",
        "",
        (
            "Teacher-forced replay on the profile trace against the closed loop (errors cascade through the "
            "cache there): the gap is simulated minus measured."
        ),
        "",
        *table_head("gate", "trials", "agreement gap (mean)", "agreement gap (max)", "speedup gap (mean)"),
    ]
    lines += [
        f"| {r['gate']} | {r['trials']} | {r['agreement_gap_mean']:.3f} | {r['agreement_gap_max']:.3f} | "
        f"{r['speedup_gap_mean']:.3f} |"
        for r in gap_by_gate(both).iter_rows(named=True)
    ]
    return Section(lines + ["", f"![{name}]({name})", ""], [name])


def batching_section(ctx: ReportContext) -> Section:
    """How the saving decays with batch size, for settings measured at several batch sizes."""
    from sweep.gates import GATE_COLUMNS, gate_text

    ok = ctx.ok
    if not ok.height or ok["batch_size"].n_unique() < 2:  # trials load in the current schema: the column is there
        return Section([])
    # self-speculative trials (batch 1, agreement 1 by construction) are not part of this comparison
    early_exit = pl.col("mode").fill_null("early_exit") == "early_exit"
    rows = ok.filter(pl.col("batch_size").is_not_null() & early_exit)
    # a series is one setting on one workload: where the rows' workloads differ, each label names its own
    varying = [c for c in WORKLOAD if c in rows.columns and rows[c].n_unique() > 1]
    keys = ["model", "gate", "min_layer", *GATE_COLUMNS, "kv_policy", *varying]

    def label(r: dict) -> str:
        kv = f"kv_policy={r['kv_policy']}" if r["kv_policy"] is not None else ""
        return " ".join(part for part in (gate_text(r), kv, *(f"{c}={r[c]}" for c in varying)) if part)

    rows = rows.with_columns(
        setting=pl.concat_str(
            [
                pl.col("model"),
                pl.lit(" "),
                pl.col("gate"),
                pl.lit(" "),
                pl.struct(keys).map_elements(label, return_dtype=pl.String),
            ]
        )
    )
    # one point per batch size (ctx.ok holds a setting's best-timed rows only; rows the label cannot tell apart:
    # the one timed over the most rounds, then the latest)
    rows = rows.sort("repeats", "created_at", descending=True).unique(["setting", "batch_size"], keep="first")
    groups = rows.group_by("setting").agg(pl.col("batch_size").n_unique().alias("sizes")).filter(pl.col("sizes") > 1)
    series = {s: rows.filter(pl.col("setting") == s).sort("batch_size") for s in sorted(groups["setting"].to_list())}
    if not series:
        return Section([])
    sizes = sorted(rows.filter(pl.col("setting").is_in(list(series)))["batch_size"].unique().to_list())
    name = figures.batching_figure(series, sizes, ctx.out)
    lines = [
        "## The batching effect",
        "",
        "A batch saves compute only once every sequence has exited (per-sequence decisions, max over the batch).",
        "",
        "The speedup is the one the tables rank by (≈1x inside the trial's A/A noise floor).",
        "",
        *table_head("setting", "batch", "speedup", "speedup_model", "decode layers saved", "agreement"),
    ]
    for setting, sub in series.items():
        lines += [
            f"| {setting} | {r['batch_size']} | {speedup_text(r)} | {num(r['speedup_model'])} | "
            f"{num(r['step_layers_saved'])} | {num(r['agreement'])} |"
            for r in sub.iter_rows(named=True)
        ]
    return Section(lines + ["", f"![{name}]({name})", ""], [name])


def speculation_section(ctx: ReportContext) -> Section:
    """Self-speculation per model: the best draft of each kind (layers 1..K, a skip set) with its acceptance
    and the draft/verify split of its time per token that explains its speedup or its absence, and the best
    skip set as a layer map."""
    ok = ctx.ok
    if not ok.height or "mode" not in ok.columns:
        return Section([])
    spec = ok.filter(pl.col("mode") == "self_speculative")
    if not spec.height:
        return Section([])
    lines = [
        "## Self-speculation",
        "",
        "Lossless by construction (agreement 1.0, checked on every trial): the draft (layers 1..K and the logit lens,",
        "or the full model with the skip set's sublayers bypassed) proposes up to draft_len tokens, the full model",
        "verifies them in one pass. acceptance length = 1 + accepted drafts per verification; draft and verify are",
        "ms per committed token; full depth costs `baseline ms` per token.",
        "",
        *table_head(
            "model",
            "draft",
            "acceptance",
            "acc. length",
            "draft ms",
            "verify ms",
            "baseline ms",
            "speedup_wall",
            "cost model",
        ),
    ]
    maps, positions = [], []
    for model in sorted(spec["model"].unique().to_list()):
        rows = spec.filter(pl.col("model") == model)
        for kind in ("fixed", "skip"):
            best = rows.filter(pl.col("gate") == kind).sort("speedup", descending=True, nulls_last=True).head(1)
            if not best.height:
                continue
            r = best.row(0, named=True)
            draft = (
                f"skip {r['skip']} (ratio {num(r['skip_ratio'])})" if kind == "skip" else f"layers 1..{r['exit_layer']}"
            )
            stop = f", stop below {r['draft_stop']:g}" if r.get("draft_stop") is not None else ""
            lines.append(
                f"| {model} | {draft}, {r['draft_len']} drafts{stop} | {num(r['acceptance_rate'])} | "
                f"{num(r['acceptance_length'])} | {num(r['draft_ms_per_token'])} | {num(r['verify_ms_per_token'])} | "
                f"{num(r['baseline_ms_per_token'])} | {num(r['speedup_wall'])}x | {num(r['speedup_model'])}x |"
            )
            if kind == "skip":
                maps.append((model, r["skip"], int(r["num_layers"]), r.get("skip_ratio")))
            positions.append((model, draft, r.get("acceptance_by_position"), r.get("accepted_length_hist")))
    lines.append("")
    lines += position_lines(positions)
    if not maps:
        return Section(lines)
    name = figures.skip_map_figure(maps, ctx.out)
    return Section(lines + [f"![{name}]({name})", ""], [name])


def position_lines(drafts: list[tuple[str, str, list | None, list | None]]) -> list[str]:
    """For each best draft (model, draft, acceptance_by_position, accepted_length_hist): acceptance at each draft
    position given it was reached, and how many verifications accepted 0, 1, ... drafts (vLLM's and SPEED-Bench's
    terms)."""
    rows = [d for d in drafts if d[2] is not None and d[3] is not None]
    if not rows:
        return []
    lines = [
        "Acceptance per draft position (given the position was reached) and the histogram of accepted drafts per "
        "verification:",
        "",
        "| model | draft | acceptance at position 1, 2, ... | verifications accepting 0, 1, ... drafts |",
        "|---|---|---|---|",
    ]
    for model, draft, rates, hist in rows:
        shown = ", ".join("n/a" if r is None else f"{r:.2f}" for r in rates)
        lines.append(f"| {model} | {draft} | {shown} | {', '.join(str(h) for h in hist)} |")
    return lines + [""]


SECTIONS: tuple[Callable[[ReportContext], Section], ...] = (
    header,
    verdict_section,
    model_sections,
    profiles_section,
    lens_section,
    screen_section,
    speculation_section,
    batching_section,
    lambda ctx: Section(category_lines(ctx)),
    lambda ctx: Section(task_section(ctx)),
)
