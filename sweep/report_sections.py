"""The report's sections: each takes the one ``ReportContext`` and returns a ``Section``, its
Markdown lines (ending with a blank line) and the figures it wrote; ``SECTIONS`` is their order.

Header, verdicts, one section per model (targets, knees, Pareto and layer figures), profiles
(EAS and oracle exits), the learned readouts against the logit lens, simulated against measured
(screen) and the batching effect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import polars as pl

from sweep import report_figures as figures
from sweep.analysis import (
    KNEE_MIN_POINTS,
    eas_per_layer,
    eas_table,
    front_gate,
    layer_curve,
    lens_curves,
    oracle_summary,
)

HEADLINE_TARGET = figures.HEADLINE_TARGET


@dataclass(frozen=True)
class ReportContext:
    """What every section reads: the analysed tables (as written beside the data) and the settings."""

    root: Path  # results.root
    out: Path  # the report directory (figures are written there)
    trials: pl.DataFrame  # every trial row
    ok: pl.DataFrame  # ok trials, ranked speedup (with intervals)
    front: pl.DataFrame  # the pareto table
    knees: pl.DataFrame  # the knees table
    targets: pl.DataFrame  # the targets table
    profiles: pl.LazyFrame | None  # None without profile rows
    alpha: float  # eas.alpha
    min_prompts: int  # analysis.ci_min_prompts

    @cached_property
    def curves(self) -> pl.DataFrame:
        return layer_curve(self.profiles)

    @cached_property
    def lens(self) -> pl.DataFrame:
        """The learned readouts' curves (``lens_curves``): empty unless a trace has readouts."""
        return lens_curves(self.profiles) if self.profiles is not None else pl.DataFrame()

    @cached_property
    def eas(self) -> pl.DataFrame:
        return eas_table(self.profiles, self.alpha)

    @cached_property
    def models(self) -> list[str]:
        """Models with a section: those with ok trials or a profile."""
        names = set(self.ok["model"].unique().to_list()) if self.ok.height else set()
        if self.profiles is not None:
            names |= set(self.curves["model"].unique().to_list())
        return sorted(names)

    @cached_property
    def verdicts(self) -> list[str]:
        return verdicts(self)


@dataclass(frozen=True)
class Section:
    lines: list[str]
    figures: list[str] = field(default_factory=list)


def header(ctx: ReportContext) -> Section:
    lines = ["# Early-exit report", ""]
    trials, ok = ctx.trials, ctx.ok
    if trials.height:
        lines += [
            (
                f"{trials.height} trials from {trials['run_id'].n_unique()} run(s); {ok.height} ok, "
                f"{trials.filter(pl.col('status') == 'nondeterministic').height} nondeterministic, "
                f"{trials.filter(pl.col('status') == 'failed').height} failed "
                "(fronts and targets use ok trials only)."
            ),
            "",
        ]
    if ok.height:
        lines += [
            (
                f"Speedups rank by `{ok['speedup_metric'][0]}`. A trial that skipped no compute "
                "(no decode step exited, or kv_policy=full) counts as 1x; its measured ratio is timing noise and "
                "is shown in brackets. Intervals: 95% bootstrap of the same estimator, prompts and timed rounds "
                "resampled, seeded per trial; "
                f"† marks an interval from fewer than {ctx.min_prompts} prompts (analysis.ci_min_prompts), "
                "too coarse to trust."
            ),
            "",
        ]
    return Section(lines)


def verdict_section(ctx: ReportContext) -> Section:
    return Section(["## Verdicts", ""] + [f"- {v}" for v in ctx.verdicts] + [""])


def model_sections(ctx: ReportContext) -> Section:
    """Per model: the best speedup at each target, the knees of its fronts, its figures."""
    lines, made = [], []
    for model in ctx.models:
        shown = []
        if ctx.ok.height and model in ctx.ok["model"].to_list():
            shown.append(figures.pareto_figure(ctx.ok, ctx.front, ctx.knees, model, ctx.out))
        if ctx.profiles is not None and model in ctx.curves["model"].to_list():
            shown.append(figures.layers_figure(ctx.curves.filter(pl.col("model") == model), model, ctx.out))
        lines += [f"## {model}", "", *_targets_table(ctx, model), *_knees_table(ctx, model)]
        lines += [f"![{name}]({name})" for name in shown] + [""]
        made += shown
    return Section(lines, made)


def _targets_table(ctx: ReportContext, model: str) -> list[str]:
    if not ctx.targets.height or model not in ctx.targets["model"].to_list():
        return []
    lines = [
        "Best speedup at each agreement target:",
        "",
        *_table_head("agreement >=", "speedup", "CI", "agreement", "CI", "gate", "parameters", "trial"),
    ]
    for r in ctx.targets.filter(pl.col("model") == model).iter_rows(named=True):
        if r["trial_id"] is None:
            lines.append(f"| {r['target']:g} | none | | | | | | |")
            continue
        noise = "" if r["skipped_compute"] else f" (measured {_num(r['speedup_noise'])})"
        lines.append(
            f"| {r['target']:g} | {r['speedup']:.3f}{noise} | {_ci(r, 'speedup')} | {r['agreement']:.3f} | "
            f"{_ci(r, 'agreement')} | {r['gate']} | {r['params']} | `{r['trial_id']}` |"
        )
    return lines + [""]


def _knees_table(ctx: ReportContext, model: str) -> list[str]:
    front, knees = ctx.front, ctx.knees
    sizes = (
        front.filter(pl.col("model") == model)
        .with_columns(_front_gate=front_gate())
        .group_by("front", "_front_gate")
        .len()
        .sort("front", "_front_gate", nulls_last=False)
        if front.height
        else front
    )
    if not sizes.height:
        return []
    lines = [
        (
            f"Knees of the fronts (chord method, fronts of {KNEE_MIN_POINTS}+ points; Kneedle cross-check "
            "with 12+ points):"
        ),
        "",
        *_table_head("front", "points", "knee speedup", "knee agreement", "gate", "parameters", "Kneedle"),
    ]
    rows = knees.filter(pl.col("model") == model).iter_rows(named=True) if knees.height else []
    by_front = {(r["front"], r["gate"] if r["front"] == "model+gate" else None): r for r in rows}
    for f in sizes.iter_rows(named=True):
        r = by_front.get((f["front"], f["_front_gate"]))
        label = f["_front_gate"] or "all"
        if r is None:
            lines.append(f"| {label} | {f['len']} | no knee (fewer than {KNEE_MIN_POINTS} points) | | | | |")
            continue
        kneedle = f"{r['kneedle_speedup']:.3f}x / {r['kneedle_agreement']:.3f}" if r["kneedle_trial_id"] else "n/a"
        lines.append(
            f"| {label} | {r['front_points']} | {r['speedup']:.3f} | {r['agreement']:.3f} | "
            f"{r['gate']} | {r['params']} | {kneedle} |"
        )
    return lines + [""]


def profiles_section(ctx: ReportContext) -> Section:
    """EAS per model and variant, both oracle exits, the EAS-per-layer figure."""
    if ctx.profiles is None:
        return Section([])
    name = figures.eas_figure(eas_per_layer(ctx.profiles, ctx.alpha), ctx.eas, ctx.alpha, ctx.out)
    lines = [
        "## Profiles: EAS and oracle exits",
        "",
        f"EAS (arXiv 2603.23701), alpha={ctx.alpha:g}, S averaged over all traced positions:",
        "",
        *_table_head("model", "variant", "EAS", "K"),
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
        *_table_head("model", "positions", "first match: mean layer", "before L", "saturation: mean layer", "before L"),
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
            name = figures.lens_figure(curve, model, readouts_id, ctx.out)
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
        *_table_head("layer", "logit top-1", "tuned top-1", "KL logit", "KL tuned"),
    ]
    lines += [
        f"| {r['layer']} | {r['logit_top1']:.3f} | {r['tuned_top1']:.3f} | {_num(r['kl_logit'], '.4g')} | "
        f"{_num(r['kl_tuned'], '.4g')} |"
        for r in rows.iter_rows(named=True)
    ]
    return lines + [""]


def screen_section(ctx: ReportContext) -> Section:
    """Simulated against measured, when a screen left simulated rows: a table of the gap per
    gate, and a figure pairing each simulated setting with its closed-loop trial."""
    from sweep.screen import gap_by_gate
    from sweep.store import scan

    sim = scan("simulated", ctx.root).filter(pl.col("selected")).collect()
    if not sim.height or not ctx.ok.height:
        return Section([])
    both = sim.join(ctx.ok.select("trial_id", "agreement", "speedup_wall"), on="trial_id", how="inner").with_columns(
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
        *_table_head("gate", "trials", "agreement gap (mean)", "agreement gap (max)", "speedup gap (mean)"),
    ]
    lines += [
        f"| {r['gate']} | {r['trials']} | {r['agreement_gap_mean']:.3f} | {r['agreement_gap_max']:.3f} | "
        f"{r['speedup_gap_mean']:.3f} |"
        for r in gap_by_gate(both).iter_rows(named=True)
    ]
    return Section(lines + ["", f"![{name}]({name})", ""], [name])


def batching_section(ctx: ReportContext) -> Section:
    """How the saving decays with batch size, for settings measured at several batch sizes."""
    from sweep.gatespec import GATE_COLUMNS, gate_text

    ok = ctx.ok
    if not ok.height or ok["batch_size"].n_unique() < 2:  # trials load in the current schema: the column is there
        return Section([])
    keys = ["model", "gate", "min_layer", *GATE_COLUMNS, "kv_policy"]

    def label(r: dict) -> str:
        kv = f"kv_policy={r['kv_policy']}" if r["kv_policy"] is not None else ""
        return " ".join(part for part in (gate_text(r), kv) if part)

    # self-speculative trials (batch 1, agreement 1 by construction) are not part of this comparison
    early_exit = pl.col("mode").fill_null("early_exit") == "early_exit"
    rows = ok.filter(pl.col("batch_size").is_not_null() & early_exit).with_columns(
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
        *_table_head("setting", "batch", "speedup_wall", "speedup_model", "decode layers saved", "agreement"),
    ]
    for setting, sub in series.items():
        lines += [
            f"| {setting} | {r['batch_size']} | {_num(r['speedup_wall'])} | {_num(r['speedup_model'])} | "
            f"{_num(r['step_layers_saved'])} | {_num(r['agreement'])} |"
            for r in sub.iter_rows(named=True)
        ]
    return Section(lines + ["", f"![{name}]({name})", ""], [name])


SECTIONS: tuple[Callable[[ReportContext], Section], ...] = (
    header,
    verdict_section,
    model_sections,
    profiles_section,
    lens_section,
    screen_section,
    batching_section,
)


# ---------------------------------------------------------------- verdicts


def verdicts(ctx: ReportContext) -> list[str]:
    """One line per model: the verdict at the headline target, or EAS for models only profiled."""
    lines, trials, targets = [], ctx.trials, ctx.targets
    models = sorted(set(trials["model"].unique().to_list()) if trials.height else set())
    for model in models:
        at = (pl.col("model") == model) & (pl.col("target") == HEADLINE_TARGET)
        rows = targets.filter(at) if targets.height else targets
        n_ok = trials.filter((pl.col("model") == model) & (pl.col("status") == "ok")).height
        if not n_ok:
            lines.append(f"{model}: no ok trials to judge")
            continue
        best = rows.row(0, named=True) if rows.height else None
        if best is None or best["trial_id"] is None:
            lines.append(f"{model}: no gate reaches agreement >= {HEADLINE_TARGET} ({n_ok} ok trials)")
            continue
        lines.append(f"{model}: {verdict(best, ctx.min_prompts)} ({n_ok} ok trials)")
    if ctx.profiles is not None:
        for model in sorted(set(ctx.eas["model"].to_list()) - set(models)):
            e = {r["variant"]: r["eas"] for r in ctx.eas.filter(pl.col("model") == model).iter_rows(named=True)}
            lines.append(
                f"{model}: profiled only; EAS hidden {e['hidden']:.3f}, logits {e['logits']:.3f}, top-K {e['topk']:.3f}"
            )
    return lines


def verdict(best: dict, min_prompts: int) -> str:
    """One sentence on the best trial at the headline target, from the figures its table row
    shows (the ranked speedup and its interval), in the terms of its own bench mode."""
    metric, speedup, lo, hi = best["speedup_metric"], best["speedup"], best.get("speedup_lo"), best.get("speedup_hi")
    ci = f", 95% CI {lo:.2f}-{hi:.2f}x" if lo is not None and hi is not None else ""
    few = (
        f" [interval from {best['ci_prompts']} prompts, fewer than {min_prompts}: too coarse to trust]"
        if best.get("ci_few_prompts")
        else ""
    )
    speculative = best.get("mode") == "self_speculative"
    if speculative:
        what = (
            f"lossless self-speculation {best['params']}, {metric} {speedup:.3f}x{ci}, "
            f"acceptance rate {_num(best.get('acceptance_rate'), '.2f')}{few}"
        )
    else:
        what = f"{best['gate']} {best['params']}, {metric} {speedup:.3f}x{ci}, exit rate {best['exit_rate']:.2f}{few}"
    head = f"agreement >= {HEADLINE_TARGET}"
    if not best["skipped_compute"]:
        noise = best.get("speedup_noise")
        return (
            f"no gate reaches {head} with a speedup (best there: {best['gate']} {best['params']} "
            "skipped no compute, "
            f"so its speedup is 1x; the measured {_num(noise)}x is timing noise)"
        )
    if speedup > 1.0 and (lo is None or lo > 1.0):
        return f"{head} with a speedup: {what}"
    if speedup > 1.0:
        return (
            f"no gate reaches {head} with a speedup distinguishable from 1x (best there: {what}; "
            "the interval includes 1x)"
        )
    why = (
        "drafting and verifying cost more than the accepted drafts save"
        if speculative
        else "its probes and K/V fills cost more than the skipped layers save"
    )
    return f"no gate reaches {head} with a speedup > 1 (best there: {what}; {why})"


def _table_head(*columns: str) -> list[str]:
    """A Markdown table's header and separator rows."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _num(value, fmt: str = ".3f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _ci(row: dict, metric: str) -> str:
    lo, hi = row.get(f"{metric}_lo"), row.get(f"{metric}_hi")
    if lo is None or hi is None:
        return ""
    return f"{lo:.3f}-{hi:.3f}" + (" †" if row.get("ci_few_prompts") else "")
