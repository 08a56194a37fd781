"""How long does replaying 10,000 gate settings on a profile trace take? Median of 3 runs.

    .venv/bin/python benchmarks/simulate_10k.py RESULTS_ROOT [SETTINGS]

RESULTS_ROOT holds a profile trace (`sweep profile ...`); e.g. 64 HumanEval prompts x 32
tokens of SmolLM2-135M give 2,048 decision positions x 30 layers. The settings spread over
the saturation, margin and conformal gates at two min_layers, plus every fixed exit.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from sweep.analysis import load_profiles
from sweep.config import GateConfig
from sweep.bench.costs import CostModel
from sweep.trace.simulate import signals_from_trace, simulate

# the cost model measured for SmolLM2-135M fp32 on these CPUs (`sweep bench ... bench.cost_model=true`)
COSTS = dict(
    layer_ms=1.062,
    head_ms=7.188,
    lens_probe_ms=7.367,
    hidden_probe_ms=0.011,
    kv_ms=0.071,
    overhead_ms=1.796,
    step_ms=40.856,
)


def settings(n: int, L: int) -> list[GateConfig]:
    per = (n - L) // 6
    out = [GateConfig(name="fixed", exit_layer=e) for e in range(1, L + 1)]
    for m in (max(1, L // 4), L // 2):
        out += [GateConfig(name="saturation", min_layer=m, eps=float(e)) for e in np.linspace(0.005, 0.8, per)]
        out += [GateConfig(name="margin", min_layer=m, theta=float(t)) for t in np.linspace(0.1, 30, per)]
        out += [GateConfig(name="conformal", min_layer=m, q=float(q)) for q in np.linspace(0.01, 1.0, per)]
    return out


def main() -> None:
    root = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    trace = load_profiles(root).collect()
    run = trace["run_id"].unique().sort()[0]
    trace = trace.filter(trace["run_id"] == run)
    t0 = time.perf_counter()
    signals = signals_from_trace(trace)
    t_signals = time.perf_counter() - t0
    L = signals.num_layers
    cfgs = settings(n, L)
    costs = CostModel(**COSTS, num_layers=L)
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        table = simulate(cfgs, signals, costs)
        samples.append(time.perf_counter() - t0)
    print(
        f"trace {run}: {signals.positions} decision positions x {L} layers ({len(signals.prompt_ids)} prompts); "
        f"signals built in {t_signals:.2f} s"
    )
    print(
        f"{len(cfgs)} settings simulated; median of 3 runs: {statistics.median(samples):.3f} s (runs: "
        f"{', '.join(f'{s:.3f}' for s in samples)})"
    )
    print(", ".join(f"{g}: {k}" for g, k in sorted(table["gate"].value_counts().iter_rows())))


if __name__ == "__main__":
    main()
