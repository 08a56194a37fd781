"""`sweep analyze`: the analysis tables beside the data, and a report with figures.

Reads every trial and profile row under results.root; writes pareto.parquet,
knees.parquet and targets.parquet there, and <results.root>/report/report.md with PNG
figures: each model's trials with the Pareto front and its knee, the per-layer curves with
the post-mortem's thresholds, EAS per layer, and the best speedup at each agreement target.
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from sweep.analysis import (
    KNEE_MIN_POINTS,
    best_at_targets,
    eas_per_layer,
    eas_table,
    fronts,
    knees_table,
    layer_curve,
    load_profiles,
    load_trials,
    ok_trials,
    oracle_summary,
    params_text,
    with_confidence,
)
from sweep.errors import InputError

log = logging.getLogger("sweep.report")

EPS_LINES = (0.05, 0.1, 0.2, 0.3)  # the post-mortem's saturation thresholds
THETA_LINES = (8, 14, 20)  # and its margin thresholds
HEADLINE_TARGET = 0.98
CI_ROWS = 20000  # above this many ok trials, intervals are computed for front and target rows only


def run_analyze(cfg) -> tuple[Path, list[str]]:
    """Compute and write everything; returns (report path, one verdict line per model)."""
    from sweep.store import write_table

    root = Path(cfg.results.root)
    trials = load_trials(root).collect()
    profiles = load_profiles(root)
    has_profiles = profiles.select(pl.len()).collect().item() > 0
    if trials.height == 0 and not has_profiles:
        raise InputError(f"results.root={root}: no trials or profiles there to analyze (run `sweep run` or `sweep profile` first)")
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
    out = Path(a.out) if a.out else root / "report"
    if front.height:
        write_table("pareto", _declared(front.drop("gate_scope"), "pareto"), root=root, provenance={})
        write_table("knees", knees, root=root, provenance={})
        write_table("targets", targets, root=root, provenance={})
    figures = _figures(ok, front, knees, profiles if has_profiles else None, cfg.eas.alpha, out)
    verdicts = _verdicts(trials, targets, profiles if has_profiles else None, cfg.eas.alpha, a.ci_min_prompts)
    path = _markdown(out, trials, ok, front, knees, targets, profiles if has_profiles else None, cfg.eas.alpha, figures, verdicts, a.ci_min_prompts)
    _screen_section(root, ok, out, path)
    _batching_section(ok, out, path)
    return path, verdicts


def _batching_section(ok: pl.DataFrame, out: Path, path: Path) -> None:
    """How the saving decays with batch size, for settings measured at several batch sizes."""
    from sweep.config import GATE_COLUMNS

    if ok["batch_size"].n_unique() < 2:  # trials load in the current schema: the column is always there
        return
    keys = ["model", "gate", "min_layer", *GATE_COLUMNS, "kv_policy"]
    # self-speculative trials (batch 1, agreement 1 by construction) are not part of this comparison
    early_exit = pl.col("mode").fill_null("early_exit") == "early_exit"
    rows = ok.filter(pl.col("batch_size").is_not_null() & early_exit).with_columns(
        setting=pl.concat_str([pl.col("model"), pl.lit(" "), pl.col("gate"), pl.lit(" "), pl.struct(keys).map_elements(
            lambda r: " ".join(f"{k}={r[k]:g}" if isinstance(r[k], float) else f"{k}={r[k]}" for k in (*GATE_COLUMNS, "min_layer", "kv_policy") if r[k] is not None),
            return_dtype=pl.String)])
    )
    groups = rows.group_by("setting").agg(pl.col("batch_size").n_unique().alias("sizes")).filter(pl.col("sizes") > 1)["setting"].to_list()
    if not groups:
        return
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    table = ["", "## The batching effect", "", "A batch saves compute only once every sequence has exited (per-sequence decisions, max over the batch).", "",
             "| setting | batch | speedup_wall | speedup_model | decode layers saved | agreement |", "|---|---|---|---|---|---|"]
    for setting in sorted(groups):
        sub = rows.filter(pl.col("setting") == setting).sort("batch_size")
        b = sub["batch_size"].to_list()
        line = axes[0].plot(b, sub["speedup_wall"].to_list(), "o-", label=setting)[0]
        axes[0].plot(b, sub["speedup_model"].to_list(), "x--", color=line.get_color(), alpha=0.7)
        axes[1].plot(b, sub["step_layers_saved"].to_list(), "o-", color=line.get_color())
        axes[2].plot(b, sub["agreement"].to_list(), "o-", color=line.get_color())
        table += [f"| {setting} | {r['batch_size']} | {_num(r['speedup_wall'])} | {_num(r['speedup_model'])} | {_num(r['step_layers_saved'])} | {_num(r['agreement'])} |"
                  for r in sub.iter_rows(named=True)]
    sizes = sorted(rows.filter(pl.col("setting").is_in(groups))["batch_size"].unique().to_list())
    for ax, label in zip(axes, ("speedup (o measured wall, x cost model)", "decode-step layers saved (fraction)", "agreement (fraction)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("batch size (sequences)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].axhline(1.0, color="grey", ls="--", lw=1)
    axes[0].legend(fontsize=7)
    fig.suptitle("The batching effect: early exit saves compute only when every sequence of the batch has exited")
    fig.tight_layout()
    fig.savefig(out / "batching.png", dpi=110)
    plt.close(fig)
    table += ["", "![batching.png](batching.png)", ""]
    with open(path, "a") as f:
        f.write("\n".join(table))


def _screen_section(root: Path, ok: pl.DataFrame, out: Path, path: Path) -> None:
    """Simulated against measured, when a screen left simulated rows: a table, the gap per
    gate, and a figure pairing each simulated setting with its closed-loop trial."""
    from sweep.screen import gap_by_gate
    from sweep.store import scan

    sim = scan("simulated", root).filter(pl.col("selected")).collect()
    if not sim.height or not ok.height:
        return
    both = sim.join(ok.select("trial_id", "agreement", "speedup_wall"), on="trial_id", how="inner").with_columns(
        agreement_gap=pl.col("agreement_tf") - pl.col("agreement"), speedup_gap=pl.col("speedup_model") - pl.col("speedup_wall")
    )
    if not both.height:
        return
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 6))
    for gate, sub in sorted(both.partition_by("gate", as_dict=True).items()):
        line = ax.plot(sub["speedup_wall"].to_list(), sub["agreement"].to_list(), "o", label=f"{gate[0]}: measured (closed loop)")[0]
        ax.plot(sub["speedup_model"].to_list(), sub["agreement_tf"].to_list(), "o", mfc="none", color=line.get_color(), label=f"{gate[0]}: simulated (teacher-forced)")
        for r in sub.iter_rows(named=True):
            ax.plot([r["speedup_model"], r["speedup_wall"]], [r["agreement_tf"], r["agreement"]], "-", lw=0.7, color=line.get_color(), alpha=0.6)
    ax.axvline(1.0, color="grey", ls="--", lw=1)
    ax.set_xlabel("speedup (simulated: cost model; measured: speedup_wall)")
    ax.set_ylabel("agreement with full-depth greedy tokens (fraction)")
    ax.set_title("Screen: each simulated setting (hollow) joined to its closed-loop trial (filled)")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "screen.png", dpi=110)
    plt.close(fig)
    lines = ["", "## Simulated against measured (screen)", "",
             "Teacher-forced replay on the profile trace against the closed loop (errors cascade through the cache there): "
             "the gap is simulated minus measured.", "",
             "| gate | trials | agreement gap (mean) | agreement gap (max) | speedup gap (mean) |", "|---|---|---|---|---|"]
    lines += [f"| {r['gate']} | {r['trials']} | {r['agreement_gap_mean']:.3f} | {r['agreement_gap_max']:.3f} | {r['speedup_gap_mean']:.3f} |"
              for r in gap_by_gate(both).iter_rows(named=True)]
    lines += ["", "![screen.png](screen.png)", ""]
    with open(path, "a") as f:
        f.write("\n".join(lines))


def _targets(ok: pl.DataFrame, targets: tuple[float, ...], conf: dict) -> pl.DataFrame:
    if not ok.height:
        return pl.DataFrame()
    best = best_at_targets(ok, targets, metric=conf["metric"])
    if "agreement_lo" not in best.columns:
        best = with_confidence(best.filter(pl.col("trial_id").is_not_null()), **conf).join(
            best.select("model", "target"), on=["model", "target"], how="right")
    params = [params_text(r) if r["trial_id"] else None for r in best.iter_rows(named=True)]
    return best.with_columns(params=pl.Series(params, dtype=pl.String)).select(
        _declared_names("targets")).sort("model", "target")


def _declared_names(table: str) -> list[str]:
    from sweep.store import TABLES

    return [c.name for c in TABLES[table].columns if c.name not in ("schema_version", "created_at")]


def _declared(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    return frame.select(_declared_names(table))


# ---------------------------------------------------------------- figures


def _figures(ok, front, knees, profiles, alpha: float, out: Path) -> dict[str, list[str]]:
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    made: dict[str, list[str]] = {}
    for model in sorted(ok["model"].unique().to_list()) if ok.height else []:
        made.setdefault(model, []).append(_pareto_figure(ok, front, knees, model, out))
    if profiles is not None:
        curves = layer_curve(profiles)
        per_layer = eas_per_layer(profiles, alpha)
        for model in sorted(curves["model"].unique().to_list()):
            made.setdefault(model, []).append(_layers_figure(curves.filter(pl.col("model") == model), model, out))
        made.setdefault("_all", []).append(_eas_figure(per_layer, eas_table(profiles, alpha), alpha, out))
    return made


def _pareto_figure(ok, front, knees, model: str, out: Path) -> str:
    import matplotlib.pyplot as plt

    rows = ok.filter(pl.col("model") == model)
    metric = rows["speedup_metric"][0]
    fig, ax = plt.subplots(figsize=(8.5, 6))
    for gate, sub in sorted(rows.filter(pl.col("skipped_compute")).partition_by("gate", as_dict=True).items()):
        sub = sub.sort("speedup")
        xerr = yerr = None
        if "speedup_lo" in sub.columns and sub["speedup_lo"].null_count() < sub.height:
            xerr = [(sub["speedup"] - sub["speedup_lo"].fill_null(sub["speedup"])).clip(0).to_list(),
                    (sub["speedup_hi"].fill_null(sub["speedup"]) - sub["speedup"]).clip(0).to_list()]
            yerr = [(sub["agreement"] - sub["agreement_lo"].fill_null(sub["agreement"])).clip(0).to_list(),
                    (sub["agreement_hi"].fill_null(sub["agreement"]) - sub["agreement"]).clip(0).to_list()]
        ax.errorbar(sub["speedup"].to_list(), sub["agreement"].to_list(), xerr=xerr, yerr=yerr, fmt="o", ms=5,
                    alpha=0.75, capsize=2, elinewidth=0.8, label=f"{gate[0]} ({sub.height} trials)")
    idle = rows.filter(~pl.col("skipped_compute"))
    if idle.height:
        ax.plot(idle["speedup"].to_list(), idle["agreement"].to_list(), "D", mfc="none", mec="dimgrey", ms=8, ls="none",
                label=f"skipped no compute ({idle.height}): drawn at 1x, measured ratio is noise")
    line = front.filter((pl.col("model") == model) & (pl.col("scope") == "model")).sort("speedup")
    if line.height:
        ax.plot(line["speedup"].to_list(), line["agreement"].to_list(), "-", color="black", lw=1.5, label="Pareto front (all gates)")
    knee = knees.filter((pl.col("model") == model) & (pl.col("scope") == "model")) if knees.height else knees
    if knee.height:
        k = knee.row(0, named=True)
        ax.plot([k["speedup"]], [k["agreement"]], marker="*", ms=18, color="crimson", ls="none", label="knee (chord)")
        ax.annotate(f"knee: {k['knee_gate']} {k['knee_params']}\n{k['speedup']:.2f}x, agreement {k['agreement']:.3f}",
                    (k["speedup"], k["agreement"]), xytext=(0.97, 0.55), textcoords="axes fraction", ha="right", fontsize=9,
                    color="crimson", arrowprops={"arrowstyle": "->", "color": "crimson", "lw": 1},
                    bbox={"boxstyle": "round", "fc": "white", "ec": "crimson", "alpha": 0.9})
    ax.axvline(1.0, color="grey", ls="--", lw=1, label="no speedup (1x)")
    ax.axhline(HEADLINE_TARGET, color="grey", ls=":", lw=1, label=f"agreement {HEADLINE_TARGET}")
    what = "decode" if metric == "speedup_wall" else "whole-request (prefill + calibration + decode)"
    ax.set_xlabel(f"{metric}: full-depth {what} time / gated time")
    ax.set_ylabel("agreement with full-depth greedy tokens (fraction)")
    ax.set_title(f"{model}: {rows.height} ok trials, error bars: 95% bootstrap over prompts and rounds")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    name = f"pareto_{model}.png"
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def _layers_figure(curve: pl.DataFrame, model: str, out: Path) -> str:
    import matplotlib.pyplot as plt

    curve = curve.sort("layer")
    layers = curve["layer"].to_list()
    fig, axes = plt.subplots(3, 1, figsize=(8.5, 9), sharex=True)
    axes[0].plot(layers, curve["delta_median"].to_list(), "o-", ms=3, label="median saturation delta")
    if curve["pca_delta_median"].null_count() < curve.height:
        axes[0].plot(layers, curve["pca_delta_median"].to_list(), "s-", ms=3, color="tab:purple", label="median pca_delta (lm_head subspace)")
    for eps in EPS_LINES:
        axes[0].axhline(eps, ls=":", lw=1, color="grey")
        axes[0].annotate(f"eps {eps}", (layers[-1], eps), fontsize=8, color="grey", ha="right", va="bottom")
    axes[0].set_ylabel("relative change per layer")
    axes[1].plot(layers, curve["top1_agreement"].to_list(), "o-", ms=3, color="tab:green", label="logit-lens top-1 = final top-1")
    axes[1].set_ylabel("top-1 agreement (fraction)")
    axes[1].set_ylim(-0.03, 1.03)
    axes[2].plot(layers, curve["margin_median"].to_list(), "o-", ms=3, color="tab:orange", label="median margin gamma_l")
    for theta in THETA_LINES:
        axes[2].axhline(theta, ls=":", lw=1, color="grey")
        axes[2].annotate(f"theta {theta}", (layers[-1], theta), fontsize=8, color="grey", ha="right", va="bottom")
    axes[2].set_ylabel("top1 - top2 (logits)")
    axes[2].set_xlabel("layer l (1-indexed; layers 1..l ran)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"{model}: per-layer signals of full-depth decoding ({curve['positions'][0]} positions), post-mortem thresholds dotted", fontsize=10)
    name = f"layers_{model}.png"
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def _eas_figure(per_layer: pl.DataFrame, eas: pl.DataFrame, alpha: float, out: Path) -> str:
    import matplotlib.pyplot as plt

    variants = {"hidden": "hidden-state cosine", "logits": "logit cosine (centred)", "topk": "top-K overlap"}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.5), sharey=True)
    score = {(r["model"], r["variant"]): r["eas"] for r in eas.iter_rows(named=True)}
    for ax, (variant, label) in zip(axes, variants.items()):
        sub = per_layer.filter(pl.col("variant") == variant)
        for model in sorted(sub["model"].unique().to_list()):
            m = sub.filter(pl.col("model") == model).sort("layer")
            ax.plot(m["layer"].to_list(), m["a"].to_list(), "o-", ms=3, label=f"{model} (EAS {score[(model, variant)]:.3f})")
        ax.set_title(f"A_l, S = {label}")
        ax.set_xlabel("exit layer l")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"A_l = S_l^{alpha:g} * w_l^{1 - alpha:g}")
    fig.suptitle(f"Early-Exit Adaptability per layer (alpha={alpha:g}; EAS = mean of A_l over l < L)")
    name = "eas.png"
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


# ---------------------------------------------------------------- text


def _verdicts(trials: pl.DataFrame, targets: pl.DataFrame, profiles, alpha: float, min_prompts: int) -> list[str]:
    lines = []
    models = sorted(set(trials["model"].unique().to_list()) if trials.height else set())
    for model in models:
        rows = targets.filter((pl.col("model") == model) & (pl.col("target") == HEADLINE_TARGET)) if targets.height else targets
        n_ok = trials.filter((pl.col("model") == model) & (pl.col("status") == "ok")).height
        if not n_ok:
            lines.append(f"{model}: no ok trials to judge")
            continue
        best = rows.row(0, named=True) if rows.height else None
        if best is None or best["trial_id"] is None:
            lines.append(f"{model}: no gate reaches agreement >= {HEADLINE_TARGET} ({n_ok} ok trials)")
            continue
        lines.append(f"{model}: {verdict(best, min_prompts)} ({n_ok} ok trials)")
    if profiles is not None:
        eas = eas_table(profiles, alpha)
        for model in sorted(set(eas["model"].to_list()) - set(models)):
            e = {r["variant"]: r["eas"] for r in eas.filter(pl.col("model") == model).iter_rows(named=True)}
            lines.append(f"{model}: profiled only; EAS hidden {e['hidden']:.3f}, logits {e['logits']:.3f}, top-K {e['topk']:.3f}")
    return lines


def verdict(best: dict, min_prompts: int) -> str:
    """One sentence on the best trial at the headline target, from the figures its table row
    shows (the ranked speedup and its interval), in the terms of its own bench mode."""
    metric, speedup, lo, hi = best["speedup_metric"], best["speedup"], best.get("speedup_lo"), best.get("speedup_hi")
    ci = f", 95% CI {lo:.2f}-{hi:.2f}x" if lo is not None and hi is not None else ""
    few = f" [interval from {best['ci_prompts']} prompts, fewer than {min_prompts}: too coarse to trust]" if best.get("ci_few_prompts") else ""
    speculative = best.get("mode") == "self_speculative"
    if speculative:
        what = (f"lossless self-speculation {best['params']}, {metric} {speedup:.3f}x{ci}, "
                f"acceptance rate {_num(best.get('acceptance_rate'), '.2f')}{few}")
    else:
        what = f"{best['gate']} {best['params']}, {metric} {speedup:.3f}x{ci}, exit rate {best['exit_rate']:.2f}{few}"
    head = f"agreement >= {HEADLINE_TARGET}"
    if not best["skipped_compute"]:
        noise = best.get("speedup_noise")
        return (f"no gate reaches {head} with a speedup (best there: {best['gate']} {best['params']} skipped no compute, "
                f"so its speedup is 1x; the measured {_num(noise)}x is timing noise)")
    if speedup > 1.0 and (lo is None or lo > 1.0):
        return f"{head} with a speedup: {what}"
    if speedup > 1.0:
        return f"no gate reaches {head} with a speedup distinguishable from 1x (best there: {what}; the interval includes 1x)"
    why = ("drafting and verifying cost more than the accepted drafts save" if speculative
           else "its probes and K/V fills cost more than the skipped layers save")
    return f"no gate reaches {head} with a speedup > 1 (best there: {what}; {why})"


def _markdown(out: Path, trials, ok, front, knees, targets, profiles, alpha: float, figures: dict, verdicts: list[str], min_prompts: int) -> Path:
    lines = ["# Early-exit report", ""]
    if trials.height:
        runs = trials["run_id"].n_unique()
        lines.append(f"{trials.height} trials from {runs} run(s); {ok.height} ok, "
                     f"{trials.filter(pl.col('status') == 'nondeterministic').height} nondeterministic, "
                     f"{trials.filter(pl.col('status') == 'failed').height} failed (fronts and targets use ok trials only).")
        lines.append("")
    if ok.height:
        metric = ok["speedup_metric"][0]
        lines += [f"Speedups rank by `{metric}`. A trial that skipped no compute (no decode step exited, or kv_policy=full) "
                  "counts as 1x; its measured ratio is timing noise and is shown in brackets. Intervals: 95% bootstrap of the "
                  "same estimator, prompts and timed rounds resampled, seeded per trial; † marks an interval from fewer than "
                  f"{min_prompts} prompts (analysis.ci_min_prompts), too coarse to trust.", ""]
    lines += ["## Verdicts", ""] + [f"- {v}" for v in verdicts] + [""]
    for model in sorted(set(figures) - {"_all"}):
        lines += [f"## {model}", ""]
        if targets.height and model in targets["model"].to_list():
            lines += ["Best speedup at each agreement target:", "",
                      "| agreement >= | speedup | CI | agreement | CI | gate | parameters | trial |", "|---|---|---|---|---|---|---|---|"]
            for r in targets.filter(pl.col("model") == model).iter_rows(named=True):
                if r["trial_id"] is None:
                    lines.append(f"| {r['target']:g} | none | | | | | | |")
                else:
                    noise = "" if r["skipped_compute"] else f" (measured {_num(r['speedup_noise'])})"
                    lines.append(f"| {r['target']:g} | {r['speedup']:.3f}{noise} | {_ci(r, 'speedup')} | {r['agreement']:.3f} | {_ci(r, 'agreement')} | "
                                 f"{r['gate']} | {r['params']} | `{r['trial_id']}` |")
            lines.append("")
        sizes = front.filter(pl.col("model") == model).group_by("scope", "gate_scope").len().sort("scope", "gate_scope") if front.height else front
        if sizes.height:
            lines += [f"Knees of the fronts (chord method, fronts of {KNEE_MIN_POINTS}+ points; Kneedle cross-check with 12+ points):", "",
                      "| front | points | knee speedup | knee agreement | gate | parameters | Kneedle |", "|---|---|---|---|---|---|---|"]
            by_front = {(r["scope"], r["gate"]): r for r in knees.filter(pl.col("model") == model).iter_rows(named=True)} if knees.height else {}
            for f in sizes.iter_rows(named=True):
                r = by_front.get((f["scope"], f["gate_scope"]))
                if r is None:
                    lines.append(f"| {f['gate_scope']} | {f['len']} | no knee (fewer than {KNEE_MIN_POINTS} points) | | | | |")
                    continue
                kneedle = f"{r['kneedle_speedup']:.3f}x / {r['kneedle_agreement']:.3f}" if r["kneedle_trial_id"] else "n/a"
                lines.append(f"| {r['gate']} | {r['front_points']} | {r['speedup']:.3f} | {r['agreement']:.3f} | {r['knee_gate']} | {r['knee_params']} | {kneedle} |")
            lines.append("")
        lines += [f"![{name}]({name})" for name in figures[model]] + [""]
    if profiles is not None:
        eas = eas_table(profiles, alpha)
        oracle = oracle_summary(profiles)
        lines += ["## Profiles: EAS and oracle exits", "", f"EAS (arXiv 2603.23701), alpha={alpha:g}, S averaged over all traced positions:", "",
                  "| model | variant | EAS | K |", "|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['variant']} | {r['eas']:.4f} | {r['topk']} |" for r in eas.iter_rows(named=True)]
        lines += ["", "Oracle exits: first match (the earliest layer whose top-1 equals the final one: the bound on what any exit "
                  "rule could save) and saturation (the earliest layer from which the top-1 stays equal up to L).", "",
                  "| model | positions | first match: mean layer | before L | saturation: mean layer | before L |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['phase']} ({r['positions']}) | {r['mean_first_match']:.2f} of {r['num_layers']} | "
                  f"{100 * r['frac_first_match_before_L']:.1f}% | {r['mean_saturation']:.2f} of {r['num_layers']} | {100 * r['frac_saturation_before_L']:.1f}% |"
                  for r in oracle.iter_rows(named=True)]
        lines += [""] + [f"![{name}]({name})" for name in figures.get("_all", [])] + [""]
    path = out / "report.md"
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".report.md.tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(path)
    return path


def _num(value, fmt: str = ".3f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _ci(row: dict, metric: str) -> str:
    lo, hi = row.get(f"{metric}_lo"), row.get(f"{metric}_hi")
    if lo is None or hi is None:
        return ""
    return f"{lo:.3f}-{hi:.3f}" + (" †" if row.get("ci_few_prompts") else "")
