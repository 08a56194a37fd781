"""The cost model measured once per machine: kept on disk per model content, device, dtype, threads and prompt
length (``$SWEEP_CACHE_DIR/costs/``, else ~/.cache/sweep/costs), taken again by a later process after a quick
check that this machine still runs the model's full-depth step as fast as when it was measured.

The check times full-depth decode steps in two interleaved halves, A and B: their spread is its A/A floor (the
larger of the halves' median ratio and the 95% quantile of the round-by-round ratios, as a |log|). The cached
costs stand while the check's median step lies within that floor of the cached step; otherwise the model is
measured afresh and the file replaced. A file that is not a cost model of this key (unreadable, not JSON, the
wrong fields, planted as something other than a file) is named in one warning and measured over, never trusted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import platform
import statistics
from pathlib import Path

import torch

from sweep.bench.pricing import CostModel
from sweep.models import LoadedModel

log = logging.getLogger("sweep.bench.costs_cache")

MAX_BYTES = 1 << 20  # a cost model is a few kB; a larger file is not one
MIN_FLOOR = 0.02  # the check never asks for agreement tighter than 2%, however quiet its own rounds were
CHECK_ROUNDS = 8


def machine() -> dict[str, str]:
    """What a cost model's figures depend on besides the model: the device and what runs it."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
    else:
        name = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    return {"device_name": name, "torch": torch.__version__, "threads": str(torch.get_num_threads())}


def key(lm: LoadedModel, prompt_tokens: int) -> dict[str, str]:
    """The cached cost model's key: model content, device, dtype, threads, torch and the prompt's length."""
    return {
        "model_hash": lm.content_hash,
        "device": str(lm.device),
        "dtype": str(lm.dtype),
        "prompt_tokens": str(prompt_tokens),
        **machine(),
    }


def path_for(cache: Path, lm: LoadedModel, prompt_tokens: int) -> Path:
    digest = hashlib.sha256(json.dumps(key(lm, prompt_tokens), sort_keys=True).encode()).hexdigest()
    return cache / "costs" / f"{digest[:24]}.json"


def load(path: Path, want: dict[str, str]) -> CostModel | None:
    """The cost model in ``path`` when it is one of key ``want``; None (with one warning naming the file when it
    exists but is not) otherwise."""
    try:
        if not path.exists():
            return None
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            raise ValueError("not a regular file of a cost model's size")
        data = json.loads(path.read_text())
        if data.get("key") != want:
            raise ValueError("another model's or machine's")
        costs = CostModel(**data["costs"])
        numbers = [costs.layer_ms, costs.head_ms, costs.overhead_ms, costs.step_ms]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in numbers) or costs.step_ms <= 0:
            raise ValueError("impossible figures")
        return costs
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        log.warning("cost model cache %s: not used (%s); measuring afresh", path, str(exc).splitlines()[0][:120])
        return None


def save(path: Path, want: dict[str, str], costs: CostModel) -> None:
    """Write ``costs`` under ``path``: to a temporary name of this process, renamed into place (a reader sees a
    whole file or the last one); a cache that cannot be written costs only the cache. (Not ``sweep.store``'s
    writer: this runs where the results stack is not installed, a GPU image's bench.)"""
    fields = {k: v for k, v in dataclasses.asdict(costs).items() if k != "source"}
    text = json.dumps({"key": want, "costs": fields}, sort_keys=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cost model cache %s: not written (%s)", path, exc)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def still_holds(cached: CostModel, times: dict[str, list[float]]) -> tuple[bool, float, float]:
    """Whether the check's full-depth steps (``times``: halves A and B, ms per round) still run at the cached
    step's speed: (holds, the check's median step, its A/A floor as a |log|)."""
    a, b = times["a"], times["b"]
    pairs = sorted(abs(math.log(x / y)) for x, y in zip(a, b))
    q95 = pairs[min(len(pairs) - 1, math.ceil(0.95 * len(pairs)) - 1)]
    floor = max(abs(math.log(statistics.median(a) / statistics.median(b))), q95, math.log1p(MIN_FLOOR))
    now = statistics.median(a + b)
    return abs(math.log(now / cached.step_ms)) <= floor, now, floor
