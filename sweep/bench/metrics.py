"""A trial's figures from its runs and timings: agreement, exits, wall-clock and cost-model
speedups, per-prompt values; self-speculation's own counts. Pure functions of what the bench
(``sweep.bench.protocol``) measured."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from sweep.bench.costs import CostModel, DecodeSteps
from sweep.decode.engine import Decoded
from sweep.bench.estimators import Timings, mean_agreement
from sweep.gates import Gate
from sweep.models.prompts import Prompt


@dataclass
class PromptRun:
    """One prompt's reference runs, whichever path decoded it: its full-depth baseline and its
    gated run (tokens, exit layer and probes per token). A single sequence's are its whole
    ``Generation`` (self-speculation's counts included); a batch's are its rows' records."""

    prompt: Prompt
    baseline: Decoded
    gated: Decoded


def speculation(runs, costs: CostModel, gate: Gate, draft_len: int) -> dict[str, Any]:
    """Self-speculation's own metrics over the reference runs, and the cost model's prediction from
    their rounds (each round's drafts at the draft's step cost, plus a verification of drafts + 1)."""
    gens = [run.gated for run in runs]
    drafted, accepted = sum(g.drafted for g in gens), sum(g.accepted for g in gens)
    lengths = [a for g in gens for a in g.accepted_lengths]
    rounds = sum(g.rounds for g in gens)
    committed = sum(len(g.tokens) - 1 for g in gens)  # decode steps: tokens 2..n
    from sweep.decode.skipscreen import position_acceptance

    by_position, histogram = position_acceptance([d for g in gens for d in g.drafted_lengths], lengths, draft_len)
    return {
        "prompt_acceptance": [g.accepted / g.drafted if g.drafted else None for g in gens],
        "acceptance_by_position": by_position,
        "accepted_length_hist": histogram,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_length": statistics.fmean(lengths) if lengths else None,
        "acceptance_length": 1.0 + statistics.fmean(lengths) if lengths else None,
        "tokens_per_verification": committed / rounds if rounds else None,
        "draft_ms_per_token": sum(g.draft_seconds for g in gens) * 1000 / committed if committed else None,
        "verify_ms_per_token": sum(g.verify_seconds for g in gens) * 1000 / committed if committed else None,
        **_speculation_model(runs, costs, gate, committed),
    }


def _speculation_model(runs, costs: CostModel, gate: Gate, committed: int) -> dict[str, float]:
    """speedup_model (decode) and speedup_e2e_model (with each prompt's prefill, the same on both sides)
    of self-speculation, from its measured rounds: each round's draft passes (its kept drafts, and one dropped
    by draft_stop) at the draft's step cost (layers 1..K and the lens, or the full model less the skip set's
    sublayers) plus a verification of the kept drafts + 1."""
    if gate.name == "skip":
        from sweep.gates.skipset import SkipSet

        skip = SkipSet.parse(gate.cfg.skip)
        step = costs.skip_draft_ms(skip.resolve(gate.adapter.attention_sublayers()) if skip.every_attention else skip)
    else:
        step = costs.prefix_draft_ms(gate.exit_layer)
    drafted = [k for run in runs for k in run.gated.drafted_lengths]
    passes = [s for run in runs for s in run.gated.draft_steps]  # a draft dropped by draft_stop was computed too
    spec_ms = costs.speculative_ms(step, drafted, passes)
    prefill = sum(costs.prefill_at(len(run.prompt.input_ids)) for run in runs)
    full_ms = committed * costs.step_ms
    return {
        "speedup_model": full_ms / spec_ms if spec_ms else float("nan"),
        "speedup_e2e_model": (prefill + full_ms) / (prefill + spec_ms) if spec_ms else float("nan"),
    }


def prompt_agreement(runs: list[PromptRun]) -> list[float]:
    """Per prompt: the fraction of its generated positions where the gated token equals full depth's."""
    out = []
    for run in runs:
        n = len(run.baseline.tokens)
        out.append(sum(a == b for a, b in zip(run.gated.tokens, run.baseline.tokens)) / n)
    return out


def metrics(
    runs: list[PromptRun],
    t: Timings,
    costs: CostModel,
    gate: Gate,
    kv_policy: str,
    L: int,
    charged: DecodeSteps | None = None,
) -> dict[str, Any]:
    """The trial's figures; ``t`` is per prompt (single sequences) or per batch; ``charged`` the
    gated decode steps the cost model charges (by default each prompt's own: single sequences)."""
    n = len(runs[0].baseline.tokens)
    agree, prefix = prompt_agreement(runs), []
    for run in runs:
        same = [a == b for a, b in zip(run.gated.tokens, run.baseline.tokens)]
        prefix.append((same.index(False) if False in same else n) / n)
    exits = [e for run in runs for e in run.gated.exit_layers]
    decode_exits = [e for run in runs for e in run.gated.exit_layers[1:]]  # the first token saves nothing
    decode_probes = [p for run in runs for p in run.gated.probes[1:]]
    charged = charged or DecodeSteps(decode_exits, decode_probes)
    steps = n - 1
    rounds = range(len(t.base_decode))
    per_unit = len(t.base_decode[0]) == len(runs)  # per prompt; else per batch (no per-prompt timings)
    lengths = [len(run.prompt.input_ids) for run in runs]
    probe_ms = costs.probe_ms(gate)
    row = {
        "agreement": mean_agreement(agree),
        "prefix_agreement": statistics.fmean(prefix),
        "exact_match": statistics.fmean(a == 1.0 for a in agree),
        "exit_rate": sum(e < L for e in exits) / len(exits),
        "mean_exit_layer": statistics.fmean(exits),
        "layers_saved": 1.0 - statistics.fmean(decode_exits) / L,
        "speedup_wall": t.speedup(),
        "speedup_e2e_wall": t.speedup_e2e(),
        "speedup_model": costs.speedup(gate, charged, kv_policy),
        "speedup_e2e_model": costs.speedup_e2e(gate, charged, kv_policy, lengths),
        "baseline_ms_per_token": statistics.median(sum(r) for r in t.base_decode) * 1000 / (steps * len(runs)),
        "ms_per_token": statistics.median(sum(r) for r in t.gated_decode) * 1000 / (steps * len(runs)),
        "probe_cost_layers": costs.layers(probe_ms),
        "kv_cost_layers": costs.layers(costs.fill_ms(kv_policy)),
        "head_cost_layers": costs.layers(costs.head_ms),
        "cost_layer_ms": costs.layer_ms,
        "cost_head_ms": costs.head_ms,
        "cost_probe_ms": probe_ms,
        "cost_kv_ms": costs.kv_ms,
        "cost_overhead_ms": costs.overhead_ms,
        "cost_prefill_ms": statistics.fmean(costs.prefill_at(p) for p in lengths),
        "cost_calibration_ms": statistics.fmean(costs.calibration_ms(gate, p) for p in lengths),
        "cost_model_source": costs.source,
        # a batch row's record has no calibration time of its own (0, as a batch never timed it)
        "calibration_ms": statistics.fmean(getattr(run.gated, "calibration_seconds", 0.0) for run in runs) * 1000,
        "prompt_ids": [run.prompt.id for run in runs],
        "prompt_categories": [run.prompt.category for run in runs],
        "prompt_input_tokens": lengths,
        "prompt_agreement": agree,
        "prompt_prefix_agreement": prefix,
        "prompt_speedup_wall": [
            statistics.median(t.base_decode[r][i] / t.gated_decode[r][i] for r in rounds) for i in range(len(runs))
        ]
        if per_unit
        else None,
        "prompt_baseline_ms": [
            statistics.median(t.base_decode[r][i] for r in rounds) * 1000 / steps for i in range(len(runs))
        ]
        if per_unit
        else None,
        "prompt_ms": [statistics.median(t.gated_decode[r][i] for r in rounds) * 1000 / steps for i in range(len(runs))]
        if per_unit
        else None,
    }
    # a batch runs to its deepest sequence: its steps' layers are the max over the batch
    return {**row, **t.aa(), **t.columns(), "step_layers_saved": 1.0 - statistics.fmean(charged.layers) / L}
