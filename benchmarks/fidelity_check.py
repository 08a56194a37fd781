"""The fidelity check at load on a model (default the packaged SmolLM2-135M): its errors, and its time
against the load it is part of (median of repeated checks on the loaded model's adapter).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fidelity_check.py [OVERRIDES...] [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from sweep.config import compose
from sweep.models import load_model
from sweep.models._fidelity import check


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", default=["model=smollm2-135m"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cfg = compose(args.overrides)
    t0 = time.perf_counter()
    lm = load_model(cfg.model, device="cpu", dtype=cfg.dtype, seed=cfg.seed)
    load_s = time.perf_counter() - t0
    f = lm.fidelity
    print(f"{lm.name}: kind {lm.adapter.kind}, K/V path {f.kv_path}, tolerance {f.tolerance:g}")
    print(
        f"errors: lens {f.lens_err:.2g}, kv {f.kv_err if f.kv_err is None else format(f.kv_err, '.2g')}, "
        f"step {f.step_err:.2g}, batch {f.batch_err:.2g}"
    )
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        check(lm.adapter, lm.device)
        times.append(time.perf_counter() - t)
    print(
        f"load (check included) {load_s:.2f} s; check alone: median {statistics.median(times):.3f} s "
        f"(min {min(times):.3f}, max {max(times):.3f}) over {args.repeats}"
    )


if __name__ == "__main__":
    main()
