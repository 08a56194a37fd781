"""What verifying a GGUF conversion cache entry costs (every file's size and sha256 against the
manifest written with it), beside loading the model from that entry, interleaved, medians.

    SWEEP_CACHE_DIR=DIR .venv/bin/python benchmarks/cache_verify.py [ROUNDS]

DIR must hold the converted entry of the packaged SmolLM2-135M (any `sweep bench` with
SWEEP_CACHE_DIR=DIR writes it on its first load).
"""

from __future__ import annotations

import statistics
import sys
import time

from sweep.config import compose
from sweep.models import _cache
from sweep.models import _loader as loader


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    entries = list((loader.cache_dir() / "converted").iterdir())
    if len(entries) != 1:
        raise SystemExit(f"expected one entry under {loader.cache_dir() / 'converted'}, found {len(entries)}")
    cfg = compose(["model=smollm2-135m"])
    verify, load = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        assert _cache.entry_problem(entries[0], loader.COMPLETE) is None
        verify.append(time.perf_counter() - t0)
        loader._CACHE.clear()  # a fresh load each round, as a new worker process does
        t0 = time.perf_counter()
        loader.load_model(cfg.model, device="cpu")
        load.append(time.perf_counter() - t0)
    size = sum(p.stat().st_size for p in entries[0].iterdir()) / 2**20
    print(f"entry {entries[0]} ({size:.0f} MiB)")
    print(f"verify (s): {[round(v, 3) for v in verify]} median {statistics.median(verify):.3f}")
    print(
        f"load from the cache, verify included (s): {[round(v, 3) for v in load]} median {statistics.median(load):.3f}"
    )
    print(f"verify / load: {statistics.median(verify) / statistics.median(load):.2f}")


if __name__ == "__main__":
    main()
