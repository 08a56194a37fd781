"""What a sweep's Ray workers compute, Ray-free: a trial's row, and the screen's trace.

``sweep.tune`` runs these in its workers and reports the results to Tune or the driver.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from sweep.config import Config
from sweep.errors import SweepError
from sweep.plan import trial_config


REUSE_ENV = "SWEEP_REUSE"  # 0: every trial takes its own reference, self-check and warm-up (as `sweep bench`)


def reuse_cache():
    """This worker process's ``sweep.reuse`` cache, or None when ``$SWEEP_REUSE`` is 0/false/no/off."""
    from sweep.reuse import process_cache

    off = os.environ.get(REUSE_ENV, "1").strip().lower() in ("0", "false", "no", "off")
    return None if off else process_cache()


def trial_row(cfg: Config, run_id: str, sweep_name: str | None, t0: float) -> dict[str, Any]:
    """Run one trial with this process's cached model and reusable references (``sweep.reuse``);
    its row (a failed row when it raises)."""
    from sweep.bench import failed_row, prepare, run_trial
    from sweep.models import model_loads
    from sweep.run_info import provenance, provenance_unloaded

    lm = gate = None
    try:
        lm, gate, prompts = prepare(cfg)
        row = run_trial(cfg, lm, gate, prompts, reuse=reuse_cache())
    except (SweepError, RuntimeError, ValueError, OSError) as exc:
        row = failed_row(cfg, cfg.prompts.n or 0, exc, gate)
    prov = provenance(cfg, lm, run_id) if lm is not None else provenance_unloaded(cfg, run_id)
    return {
        **prov,
        **row,
        "sweep_name": sweep_name,
        "worker_pid": os.getpid(),
        "worker_model_loads": model_loads(),
        "trial_seconds": time.perf_counter() - t0,
    }


def shared_trial_rows(cfgs: list[Config], run_id: str, sweep_name: str | None, t0: float) -> list[dict[str, Any]]:
    """Several settings of one model, prompts and bench measured against one shared baseline
    (``sweep.bench.run_shared_trials``): one row per setting, in order (a failed row for a setting
    that cannot be prepared, the others measured without it; failed rows for all when the group
    raises). The worker side of a Tune trial that bundles grid settings; ``trial_seconds`` is the
    row's bench_seconds plus an even share of the group's time outside the bench (preparing, provenance)."""
    from sweep.bench import failed_row, prepare, run_shared_trials
    from sweep.models import model_loads
    from sweep.run_info import provenance, provenance_unloaded

    prepared: list = [None] * len(cfgs)
    rows: list = [None] * len(cfgs)
    for i, cfg in enumerate(cfgs):  # a setting that cannot run fails alone; its group runs without it
        try:
            prepared[i] = prepare(cfg)
        except (SweepError, RuntimeError, ValueError, OSError) as exc:
            rows[i] = failed_row(cfg, cfg.prompts.n or 0, exc)
    ready = [i for i, p in enumerate(prepared) if p is not None]
    if ready:
        lm, prompts = prepared[ready[0]][0], prepared[ready[0]][2]
        group = [cfgs[i] for i in ready]
        try:
            measured = run_shared_trials(group, lm, [prepared[i][1] for i in ready], prompts, reuse=reuse_cache())
        except (SweepError, RuntimeError, ValueError, OSError) as exc:
            measured = [failed_row(cfgs[i], cfgs[i].prompts.n or 0, exc, prepared[i][1]) for i in ready]
        for i, row in zip(ready, measured):
            rows[i] = row
    # each row: its bench_seconds (0 for a failed one) and an even share of the rest of the group's time
    bench = [row.get("bench_seconds") or 0.0 for row in rows]
    rest = (time.perf_counter() - t0 - sum(bench)) / len(cfgs)
    out = []
    for cfg, row, p, seconds in zip(cfgs, rows, prepared, (b + rest for b in bench)):
        # a setting that failed to prepare has no model
        prov = provenance(cfg, p[0], run_id) if p is not None else provenance_unloaded(cfg, run_id)
        out.append(
            {
                **prov,
                **row,
                "sweep_name": sweep_name,
                "worker_pid": os.getpid(),
                "worker_model_loads": model_loads(),
                "trial_seconds": seconds,
            }
        )
    return out


def screen_trace(base: list[str], run_id: str, device: str, probe_gates: list = ()) -> dict:
    """The profile trace of the sweep's model and prompts at the bench's length, and the cost
    model (with the probes of ``probe_gates``), on the device trials will use."""
    from sweep.bench import attach_readouts, prepare
    from sweep.config import GateConfig
    from sweep.costs import cost_model
    from sweep.gates import make_gate
    from sweep.profile import traced_run

    cfg = trial_config(base, [], device)
    cfg = dataclasses.replace(cfg, gate=GateConfig())  # the model's own depth decides every layer index later
    readouts = {g.readouts for g in probe_gates} - {None}  # one file at most (the driver checked)
    if readouts:
        cfg = dataclasses.replace(cfg, profile=dataclasses.replace(cfg.profile, readouts=readouts.pop()))
    lm, _, prompts = prepare(cfg)
    trace, prov = traced_run(cfg, lm, prompts, run_id, cfg.bench.gen_tokens)
    gates = [make_gate(g, lm.num_layers) for g in probe_gates]
    for gate, g in zip(gates, probe_gates):
        attach_readouts(gate, g, lm, prompts)
    return {
        "trace": trace,
        "provenance": prov,
        # the probes alone too: the replay charges them to every gate not measured in situ here
        "costs": cost_model(
            lm, prompts[0].input_ids, gates=gates, kv_policies=[cfg.bench.kv_policy], probes_alone=True
        ).as_dict(),
    }
