"""A trial's row, in one place: the trial table's columns of a measured trial (``measured_row``) and of
one that raised (``failed_row``), the setting's own columns (``trial_fields``), and the summary `sweep
bench` prints (``format_row``)."""

from __future__ import annotations

import json

import os
from typing import TYPE_CHECKING, Any

from sweep.bench.costs import CostModel, DecodeSteps
from sweep.tasks import COLUMNS as TASK_COLUMNS
from sweep.bench.estimators import Timings
from sweep.bench.metrics import PromptRun, metrics, speculation
from sweep.config import Config
from sweep.gates import gate_text, setting_columns
from sweep.config.identity import trial_columns
from sweep.gates import Gate
from sweep.models import LoadedModel

if TYPE_CHECKING:
    from sweep.store import TrialRow


def measured_row(
    cfg: Config,
    lm: LoadedModel,
    gate: Gate,
    costs: CostModel,
    runs: list[PromptRun],
    timings: Timings,
    *,
    steps: DecodeSteps | None,
    deterministic: bool,
    max_logit_diff: float | None,
    reference: tuple[str, bool, str],
    seconds: tuple[float, float],
    share: int = 1,
) -> dict[str, Any]:
    """A measured trial's row from its per-prompt runs (``runs``; ``steps``: a batched trial's decode
    steps), timings and whether every run reproduced its reference (``deterministic``); ``reference``:
    (reference_id, reference_reused, reference_source: fresh, taken for this trial or its group, or
    cached, a worker's); ``seconds``: its (bench, setup) seconds, a group's already apportioned
    (``sweep.bench.protocol.run_trials``); ``share`` the settings that shared the baseline."""
    b = cfg.bench
    row = metrics(runs, timings, costs, gate, b.kv_policy, lm.num_layers, steps)
    speculative = b.mode == "self_speculative"
    row.update(speculation(runs, costs, gate, b.draft_len) if speculative else dict.fromkeys(SPECULATION_COLUMNS))
    status, error = ("ok", None) if deterministic else ("nondeterministic", NOT_REPRODUCED)
    if speculative and deterministic and row["agreement"] != 1.0:  # lossless by construction: a bug if not
        status, error = "failed", f"self-speculation's output differs from full depth (agreement {row['agreement']})"
    row.update(
        status=status,
        error=error,
        deterministic=deterministic,
        determinism_max_logit_diff=max_logit_diff,
        reference_id=reference[0],
        reference_reused=reference[1],
        reference_source=reference[2],
        baseline_shared=share,
        bench_seconds=seconds[0],
        setup_seconds=seconds[1],
        stopped_at_prompts=None,  # measured to the end
        stop_agreement_hi=None,
        stop_min_agreement=None,
        stop_rung_prompts=None,
    )
    row.update(dict.fromkeys(TASK_COLUMNS))  # a task's columns: the trial's evaluation fills them
    return {**trial_fields(cfg, len(runs), gate), **row}


NOT_REPRODUCED = "full-depth baselines or timed repeats did not reproduce their tokens"


SPECULATION_COLUMNS = (
    "prompt_acceptance",
    "acceptance_by_position",
    "accepted_length_hist",
    "acceptance_rate",
    "mean_accepted_length",
    "acceptance_length",
    "tokens_per_verification",
    "draft_ms_per_token",
    "verify_ms_per_token",
)


def trial_fields(cfg: Config, n_prompts: int, gate: Gate | None = None) -> dict[str, Any]:
    """The columns that describe the trial itself (known before it runs); layer indices as
    the gate resolved them for the model when it is known."""
    g, b = cfg.gate, cfg.bench
    return {
        **trial_columns(cfg),  # trial_id and trial_key (sweep.config.identity)
        "source": "measured",
        "gate": g.name,
        "min_depth": g.min_depth,
        **setting_columns(g, gate.resolved if gate is not None else None),
        "kv_policy": b.kv_policy,
        "mode": b.mode,
        "batch_size": b.batch_size,
        "draft_len": b.draft_len if b.mode == "self_speculative" else None,
        "draft_stop": b.draft_stop if b.mode == "self_speculative" else None,
        "skip_ratio": _skip_ratio(g, gate),
        "prompt_set": cfg.prompts.name,
        "n_prompts": n_prompts,
        "gen_tokens": b.gen_tokens,
        "warmup": b.warmup,
        "repeats": b.repeats,
        **readout_columns(gate),
    }


def _skip_ratio(gate_cfg, gate: Gate | None) -> float | None:
    """|S| / the model's skippable sublayers (2L on a model with an attention and an MLP per layer) of a skip gate's
    set (null for other gates, and before the model's L is known)."""
    if gate_cfg.name != "skip" or gate is None:
        return None
    from sweep.gates.skipset import SkipSet

    skip, adapter = SkipSet.parse(gate_cfg.skip), getattr(gate, "adapter", None)
    if skip.every_attention:  # attention-free: resolved on the model's own attention sublayers
        if adapter is None:
            return None
        skip = skip.resolve(adapter.attention_sublayers())
    return skip.ratio(gate.num_layers, len(adapter.skippable()) if adapter is not None else None)


def readout_columns(gate: Gate | None) -> dict[str, Any]:
    """Which fitted readouts a trial used (``sweep fit``): their content digest and fitting prompts."""
    readouts = getattr(gate, "readouts", None)
    if readouts is None:
        return {"readouts_id": None, "fit_prompts": None}
    ids = readouts.prompt_ids
    fitted = f"{readouts.prompt_set}: {ids[0]} .. {ids[-1]} ({len(ids)} prompts)" if ids else readouts.prompt_set
    return {"readouts_id": readouts.digest[:16], "fit_prompts": fitted}


def failed_row(cfg: Config, n_prompts: int, exc: BaseException, gate: Gate | None = None) -> dict[str, Any]:
    """A trial that raised: a row with its status and error, metrics null."""
    from sweep.store import PROVENANCE, TABLES

    # null metrics; provenance is the caller's (a job's submission_id, the model's revision)
    given = {c.name for c in PROVENANCE}
    row = {c.name: None for c in TABLES["trials"].columns if c.nullable and c.name not in given}
    row.update(trial_fields(cfg, n_prompts, gate))
    row.update(
        status="failed",
        error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:500],
    )
    return row


def stopped_row(cfg: Config, gate: Gate, agreement: list[float], bound: float, seconds: float) -> dict[str, Any]:
    """A setting stopped after its first prompts (``agreement``: theirs, per prompt): its agreement's bootstrap
    interval ends at ``bound``, below ``search.min_agreement``. Its agreement there and nothing timed; status
    ``stopped``: never ranked, never on a front, not run again on a resume, nor by another sweep under the same
    stopping rule, which the row records (``sweep.orchestrate.done.counts_as_done``)."""
    from sweep.bench.estimators import mean_agreement
    from sweep.store import PROVENANCE, TABLES

    given = {c.name for c in PROVENANCE}
    row = {c.name: None for c in TABLES["trials"].columns if c.nullable and c.name not in given}
    row.update(trial_fields(cfg, len(agreement), gate))
    row.update(
        status="stopped",
        agreement=mean_agreement(agreement),
        prompt_agreement=list(agreement),
        stopped_at_prompts=len(agreement),
        stop_agreement_hi=bound,
        stop_min_agreement=cfg.search.min_agreement,  # the rule it stopped under: done only for a sweep under it
        stop_rung_prompts=cfg.search.rung_prompts,
        bench_seconds=seconds,
    )
    return row


def complete_row(
    cfg: Config,
    lm: LoadedModel | None,
    row: dict[str, Any],
    run_id: str,
    *,
    sweep_name: str | None = None,
    seconds: float | None = None,
) -> TrialRow:
    """A trial's whole row, as every writer stores it (``sweep.store.TrialRow``: every column, checked): its
    provenance (the loaded model's, or what the config says when the model never loaded), the trial's own columns
    (``measured_row``, ``stopped_row`` or ``failed_row``, the one constructor of a failure's), and what computed
    it. ``seconds``: the trial's time in a sweep's worker, which adds the worker's pid and model loads; None for
    `sweep bench` and for the failed rows a sweep's driver writes itself."""
    from sweep.models import model_loads
    from sweep.store import TrialRow
    from sweep.store.run_info import provenance, provenance_unloaded

    prov = provenance(cfg, lm, run_id) if lm is not None else provenance_unloaded(cfg, run_id)
    worker = seconds is not None
    where = {
        "sweep_name": sweep_name,
        "worker_pid": os.getpid() if worker else None,
        "worker_model_loads": model_loads() if worker else None,
        "trial_seconds": seconds,
    }
    return TrialRow(prov, {**row, **where})


def format_row(row: dict[str, Any], costs=None) -> str:
    """The readable summary `sweep bench` prints."""
    lines = [
        f"trial {row['trial_id']}: model={row['model']} gate={row['gate']} {gate_text(row)} "
        f"kv_policy={row['kv_policy']} ({row['n_prompts']} prompts x {row['gen_tokens']} tokens, {row['repeats']} "
        f"repeats" + (f", batches of {row['batch_size']})" if (row.get("batch_size") or 1) > 1 else ")"),
    ]
    if row["status"] == "failed":
        lines.append(f"status: failed ({row['error']})")
        return "\n".join(lines)
    lines += [
        f"determinism: {'ok' if row['deterministic'] else 'FAILED'}"
        + (
            f" (max |logit diff| between baselines {row['determinism_max_logit_diff']:.3g})"
            if row["determinism_max_logit_diff"] is not None
            else " (tokens compared)"
        ),
        f"agreement {row['agreement']:.3f}  prefix {row['prefix_agreement']:.3f}  exact match "
        f"{row['exact_match']:.2f}  "
        f"exit rate {row['exit_rate']:.3f}  mean exit layer {row['mean_exit_layer']:.2f} of {row['num_layers']}  "
        f"layers saved {100 * row['layers_saved']:.1f}%" + _saved_note(row),
        f"speed: baseline {row['baseline_ms_per_token']:.2f} ms/token, gated {row['ms_per_token']:.2f} ms/token; "
        f"speedup_wall {row['speedup_wall']:.3f}x"
        + (f", speedup_model {row['speedup_model']:.3f}x" if row["speedup_model"] is not None else "")
        + f"; end to end (prefill and calibration included) {row['speedup_e2e_wall']:.3f}x"
        + (f", model {row['speedup_e2e_model']:.3f}x" if row["speedup_e2e_model"] is not None else ""),
        f"costs in layer-equivalents: probe {row['probe_cost_layers']:.2f}, K/V fill "
        f"{row['kv_cost_layers']:.2f}/layer, "
        f"head {row['head_cost_layers']:.2f} (layer = {row['cost_layer_ms']:.3f} ms)",
    ]
    if row.get("cost_model_source") == "unsteady":
        lines.append(
            "cost model: unsteady (measured twice, and neither time did its parts fit its step: a machine busy with "
            "other work); its figures and the model speedups are not to be trusted"
        )
    lines += aa_lines(row)
    if row.get("mode") == "self_speculative":
        lines.append(
            f"self-speculation: draft_len {row['draft_len']}, acceptance rate {_or_none(row['acceptance_rate'], 3)}, "
            f"mean accepted {_or_none(row['mean_accepted_length'], 2)}, tokens per verification "
            f"{_or_none(row['tokens_per_verification'], 2)}"
        )
    if costs is not None:
        lines.append(costs.format())
    if row.get("task") is not None:
        lines.append(task_line(row))
    if row.get("model_source") == "tiny" and row.get("mode") == "self_speculative":
        lines.append(
            "random weights (a tiny model built from a config): its acceptance shows the mechanics, not a draft's "
            "quality"
        )
    lines.append(f"status: {row['status']}")
    return "\n".join(lines)


def aa_lines(row: dict[str, Any]) -> list[str]:
    """The A/A control's spread and the trial's noise floor, and the ranked speedup the analysis and an Optuna
    objective on speedup_wall use (``sweep.bench.estimators.row_speedup``), with why it differs from the measured one
    where it does."""
    from sweep.bench.estimators import row_speedup, skips_compute

    if row.get("speedup_aa") is None or row.get("noise_floor") is None or not row.get("round_aa_ms"):
        return []
    rounds = [sum(b) / sum(a) for b, a in zip(row["round_baseline_ms"], row["round_aa_ms"])]
    floor, measured, ranked = row["noise_floor"], row["speedup_wall"], row_speedup(row)
    lines = [
        f"A/A control (full depth against full depth, in the same rounds): speedup_aa {row['speedup_aa']:.3f}x, "
        f"rounds {min(rounds):.3f}-{max(rounds):.3f}x; noise floor ±{100 * floor:.1f}%: a speedup within "
        f"{1 / (1 + floor):.3f}x-{1 + floor:.3f}x cannot be told from 1x"
    ]
    skipped = skips_compute(row.get("mode"), row.get("step_layers_saved"), row.get("exit_rate"), row.get("kv_policy"))
    if not skipped and measured > 1.0:
        why = "capped: it skipped no compute, so a ratio above 1x is timing noise"
    elif measured == 1.0:
        why = "measured at 1x: no saving and no slowdown"
    elif ranked == 1.0:
        why = "inside the noise floor: indistinguishable from 1x"
    elif not skipped:
        why = "it skipped no compute: the slowdown is its probes' and heads' real cost"
    else:
        why = "outside the noise floor"
    lines.append(f"ranked speedup (what `sweep analyze` ranks by): {ranked:.3f}x ({why})")
    return lines


def task_line(row: dict[str, Any]) -> str:
    """The task's accuracy beside full depth's, with the loss's interval (``eval.task``)."""
    extra = ""
    if row.get("task_agreement") is not None:
        extra = f"; completions agree with full depth on {row['task_agreement']:.3f} of tokens"
    if row.get("pass_at_k") and len(json.loads(row["pass_at_k"])) > 1:
        extra += "; pass@k " + ", ".join(f"@{k} {v:.3f}" for k, v in json.loads(row["pass_at_k"]).items())
    if row.get("accuracy_loss_min") is not None:
        return (
            f"task {row['task']}: the gated side stopped after {row['task_problems']} problems (full depth "
            f"{row['accuracy_full']:.3f}): its loss over all problems is at least {row['accuracy_loss_min']:+.3f}, "
            "above search.max_accuracy_loss"
        )
    return (
        f"task {row['task']} on {row['task_problems']} problems: {row['task_metric']} {row['accuracy']:.3f} "
        f"[{row['accuracy_lo']:.3f}, {row['accuracy_hi']:.3f}] against {row['accuracy_full']:.3f} at full depth; "
        f"loss {row['accuracy_loss']:+.3f} [{row['accuracy_loss_lo']:+.3f}, {row['accuracy_loss_hi']:+.3f}] (95%, "
        f"problems resampled){extra}"
    )


def _saved_note(row: dict) -> str:
    """Why the summary's ``layers saved`` is what it is where it is not the compute saved."""
    if row.get("mode") == "self_speculative":  # every token is the full model's; the drafts run fewer layers
        return " (every token verified at full depth: the drafts' layers are priced in speedup_model)"
    return " (they still run, for their K/V: kv_policy=full saves no layer)" if row["kv_policy"] == "full" else ""


def _or_none(value, digits: int) -> str:
    """A figure of the summary, or ``n/a`` where there is none (no draft kept: ``bench.draft_stop`` stopped them)."""
    return "n/a" if value is None else f"{value:.{digits}f}"
