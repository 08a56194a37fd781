"""What the cost model charges one probe on the packaged model, beside the decision timed alone (its floor).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/probe_floor.py [--runs N]

For the saturation probe (two norms of h) and the margin probe (the logit lens and its top-2) at min_layer 8,
each run measures a fresh cost model at a prompt length not measured before: the in-situ charge
(``CostModel.probe_ms``), its layer-equivalents, and the gate's decision alone on one position, which the
charge is never below. Prints each run and the medians.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from sweep.bench import costs as C
from sweep.config import GateConfig, compose
from sweep.gates import make_gate
from sweep.models import load_model

GATES = {"saturation": {"eps": 0.3}, "margin": {"theta": 8.0}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    cfg = compose(["model=smollm2-135m"])
    lm = load_model(cfg.model, device="cpu", dtype="float32", seed=cfg.seed)
    rows = {name: [] for name in GATES}
    for run in range(args.runs):
        ids = list(range(100, 140 + run))  # a new length: a fresh cost model each run
        for name, kw in GATES.items():
            gate = make_gate(GateConfig(name=name, min_layer=8, **kw), lm)
            costs = C.cost_model(lm, ids, gates=[gate])
            _, state = C._probed_engine(lm, gate, torch.tensor([ids]))
            alone = C._decision_alone_ms(lm, gate, 1, state.at)
            charged = costs.probe_ms(gate)
            rows[name].append((charged, costs.layers(charged), alone, costs.layer_ms))
            print(
                f"run {run} {name:10s} charged {charged:8.4f} ms = {costs.layers(charged):7.4f} layers"
                f"  alone {alone:8.4f} ms  layer {costs.layer_ms:.3f} ms",
                flush=True,
            )
    for name, got in rows.items():
        med = [statistics.median(col) for col in zip(*got)]
        print(f"median {name:10s} charged {med[0]:.4f} ms = {med[1]:.4f} layers, alone {med[2]:.4f} ms")


if __name__ == "__main__":
    main()
