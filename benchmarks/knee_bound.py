"""Could any gate give a knee on this model? Every replayable gate, at every first exit layer, over the thresholds a
bracket search would try, replayed on one profile trace with the cost model measured on this machine.

    .venv/bin/python benchmarks/knee_bound.py -- model=smollm2-135m prompts.n=10 bench.gen_tokens=32

Everything after `--` composes the config (as `sweep run` would; the model, prompts and length matter). For each
agreement bar it prints, per gate, the setting that the cost model prices fastest among those whose agreement
reaches the bar, twice:

- teacher-forced (the replay's own agreement: every decision sees the full-depth context, so it is optimistic);
- closed-loop, pessimistic: a prompt's positions after its first wrong exit all count as disagreeing (what a
  closed-loop run that never re-converges would measure).

A knee at a bar needs at least two settings there that beat full depth by more than the bench's A/A floor; where the
fastest one is inside the floor, no gate on this model can give one. The oracle line is the bound for any exit rule.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import polars as pl
import torch

GATES = ("saturation", "cosine", "pca", "margin", "softmax", "entropy")
BARS = (0.99, 0.95, 0.9, 0.8)


def closed_loop_pessimistic(signals, exits: torch.Tensor) -> float:
    """Agreement if every position after a prompt's first wrong exit disagreed."""
    L = signals.num_layers
    right = signals.match.gather(1, (exits - 1).clamp(max=L - 1).unsqueeze(1)).squeeze(1) | (exits == L)
    good = 0
    for p in signals.prompt_index.unique():
        mine = right[signals.prompt_index == p]
        wrong = (~mine).nonzero()
        good += int(wrong[0]) if len(wrong) else len(mine)
    return good / len(right)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="", help="first exit layers to try (comma list; default every 2nd layer)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from sweep.analysis import oracle_bound
    from sweep.bench.costs import CostModel
    from sweep.config import compose
    from sweep.config.identity import trial_device
    from sweep.gates import GATES as SPECS
    from sweep.orchestrate.searches._bracket import candidates
    from sweep.orchestrate.searches.screening import screen_trace
    from sweep.trace.simulate import exit_layers, signals_from_trace, simulate

    cfg = compose(args.overrides)
    t0 = time.perf_counter()
    probes = [compose([*args.overrides, f"gate={name}"]).gate for name in GATES]  # each gate's probe, timed in situ
    traced = screen_trace(args.overrides, "knee-bound", trial_device(cfg.device), probes)
    costs = CostModel(**traced["costs"])
    signals = signals_from_trace(traced["trace"])
    L = signals.num_layers
    print(
        f"traced {len(signals.prompt_ids)} prompts, {signals.positions} decisions, {L} layers in "
        f"{time.perf_counter() - t0:.0f} s; full-depth step {costs.step_ms:.2f} ms"
    )
    for r in oracle_bound(traced["trace"]).iter_rows(named=True):
        print(f"oracle: at best {100 * r['skippable']:.1f}% of layers skippable at agreement 1.0")
    layers = [int(x) for x in args.layers.split(",")] if args.layers else list(range(2, L, 2))
    rows = []
    for name in GATES:
        spec = SPECS.get(name, key="gate")
        for min_layer in layers:
            base = compose([*args.overrides, f"gate={name}", f"gate.min_layer={min_layer}"]).gate
            values = candidates(spec, base, signals)
            gates = [dataclasses.replace(base, **{spec.threshold: v}) for v in values]
            table = simulate(gates, signals, costs, cfg.bench.kv_policy)
            exits = exit_layers(spec.cls, signals, torch.tensor(values, dtype=torch.float64), min_layer)
            table = table.with_columns(
                threshold=pl.Series(values),
                agreement_cl=pl.Series([closed_loop_pessimistic(signals, e) for e in exits]),
            )
            rows.append(
                table.select(
                    "gate", "min_layer", "threshold", "exit_rate", "agreement_tf", "agreement_cl", "speedup_model"
                )
            )
    every = pl.concat(rows, how="diagonal_relaxed").filter(pl.col("exit_rate") > 0)
    print(f"{every.height} exiting settings replayed ({len(GATES)} gates x {len(layers)} first exit layers)")
    pl.Config.set_tbl_rows(40)
    pl.Config.set_tbl_hide_dataframe_shape(True)
    for col, label in (("agreement_tf", "teacher-forced"), ("agreement_cl", "closed-loop, pessimistic")):
        for bar in BARS:
            best = (
                every.filter(pl.col(col) >= bar)
                .sort("speedup_model", descending=True)
                .group_by("gate", maintain_order=True)
                .head(1)
            )
            print(f"\nfastest setting per gate at {label} agreement >= {bar}:")
            print(best if best.height else "(none)")


if __name__ == "__main__":
    main()
