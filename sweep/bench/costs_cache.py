"""The cost model measured once per machine: kept on disk per model content, device, dtype, threads and prompt
length (``$SWEEP_CACHE_DIR/costs/``, else ~/.cache/sweep/costs), taken again by a later process after a quick
check that this machine still runs the model's full-depth step as fast as when it was measured.

The check times full-depth decode steps in two interleaved halves, A and B: their spread is its A/A floor (the
larger of the halves' median ratio and the 95% quantile of the round-by-round ratios, as a |log|). The cached
costs stand while the check's median step lies within that floor of the cached step, and the floor is at most
+-25% (a check that noisy, on a busy machine, cannot vouch for them); otherwise the model is measured afresh and the
file replaced. A file that is not a cost model of this key (unreadable, not JSON, the
wrong fields, a figure of the wrong type, not finite, zero or negative, planted as something other than a
regular file) is named in one warning and measured over before any work, never trusted.
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
from typing import Callable

import torch

from sweep.bench.pricing import CostModel
from sweep.errors import first_line
from sweep.models import LoadedModel

log = logging.getLogger("sweep.bench.costs_cache")

MAX_BYTES = 1 << 20  # a cost model is a few kB; a larger file is not one
MIN_FLOOR = 0.02  # the check never asks for agreement tighter than 2%, however quiet its own rounds were
MAX_FLOOR = 0.25  # a check noisier than +-25% cannot vouch for the cached costs: they are measured afresh
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


def load(path: Path, want: dict[str, str], num_layers: int | None = None) -> CostModel | None:
    """The cost model in ``path`` when it is one of key ``want`` (and of a model of ``num_layers`` layers), every
    figure of the type, sign and range a measurement gives (``problem``); None otherwise, with one warning naming
    the file when it exists but is not one. Read as data: a regular file of at most ``MAX_BYTES``, JSON of bounded
    depth (``sweep.userfiles``)."""
    from sweep.userfiles import read_json

    try:
        if not os.path.lexists(path):
            return None
        data = read_json(path, MAX_BYTES)
        if not isinstance(data, dict) or not isinstance(data.get("costs"), dict):
            raise ValueError("not a cost model's JSON object")
        if data.get("key") != want:
            raise ValueError("another model's or machine's")
        why = problem(data["costs"], int(want["prompt_tokens"]), num_layers)
        if why is not None:
            raise ValueError(why)
        return CostModel(**data["costs"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        log.warning("cost model cache %s: not used (%s); measuring afresh", path, first_line(exc, 120))
        return None


POSITIVE = ("layer_ms", "head_ms", "step_ms")  # every measured step, layer and head takes time
NON_NEGATIVE = ("overhead_ms", "prefill_ms", "prefill_lens_ms")  # differences of medians, clamped at 0
OPTIONAL = ("lens_probe_ms", "hidden_probe_ms", "kv_ms", "attn_ms", "mlp_ms", "mixer_ms")  # null until measured


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def problem(costs: dict, prompt_tokens: int, num_layers: int | None = None) -> str | None:
    """Why ``costs`` (a cache entry's figures) is not a cost model a measurement of a ``num_layers``-layer model at
    ``prompt_tokens`` could give: a field missing or unknown, a figure not a finite number, zero or negative where
    time passes, a count that is not this model's; None when it is one. Checked before the figures are taken, so a
    planted entry is measured over before the work, never divided by after it."""
    fields = dataclasses.fields(CostModel)
    required = {f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    unknown = sorted(set(costs) - {f.name for f in fields})
    missing = sorted(required - set(costs))
    if unknown or missing:
        return f"field(s) {', '.join(unknown)} unknown" if unknown else f"field(s) {', '.join(missing)} missing"
    for name in POSITIVE:
        if not _number(costs[name]) or costs[name] <= 0:
            return f"{name}={costs[name]!r}: not a positive finite number of ms"
    for name in NON_NEGATIVE + OPTIONAL:
        value = costs.get(name, 0.0 if name in NON_NEGATIVE else None)
        if not (value is None and name in OPTIONAL) and (not _number(value) or value < 0):
            return f"{name}={value!r}: not a finite number of ms >= 0"
    for name, want in (("num_layers", num_layers), ("prompt_tokens", prompt_tokens)):
        value = costs.get(name, 1 if name == "prompt_tokens" else None)
        if type(value) is not int or value < 1 or (want is not None and value != want):
            return f"{name}={value!r}: not {want if want is not None else 'a count >= 1'}"
    extra, verify = costs.get("extra_probe_ms", {}), costs.get("verify_ms", [])
    if not isinstance(extra, dict) or not all(isinstance(k, str) and _number(v) and v >= 0 for k, v in extra.items()):
        return "extra_probe_ms: not a mapping of probe names to finite ms >= 0"
    if not isinstance(verify, list) or not all(_number(v) and v > 0 for v in verify):
        return "verify_ms: not a list of positive finite ms"
    return _incoherent(costs)


PART = 2.0  # a part of a step (a probe, a K/V fill, a sublayer), measured beside it, costs at most this many steps
# a gate's own probe in a step (extra_probe_ms): its decision is the gate's code (a learned readout, a user's gate),
# dearer than a tiny model's step where it likes; measured in the step's own rounds, a burst does not inflate it
GATE_PART = 50.0
# a verification pass, per position: a state-space layer scans its positions where a step updates one state
# (falcon-h1's tiny shape on a CPU: 15.7 ms for 2 positions beside a step under 3.9 ms)
VERIFY_PART = 50.0


def _incoherent(costs: dict) -> str | None:
    """Why figures that are each a number cannot come from one measurement (``sweep.bench.costs._measure``): only the
    step is checked against the machine (``still_holds``), so every other figure is held to the step it was measured
    beside. By construction the layers and the head fit in the step, and the layer has a floor; a part of a step
    costs at most ``PART`` steps (a gate's own probe ``GATE_PART``), a prefill or lens pass over the prompt at most
    ``PART`` steps per prompt token, a verification of k positions at most ``VERIFY_PART`` per position (ample for a
    busy machine, never for a planted 1e9). None when they fit."""
    step, layers, tokens = costs["step_ms"], costs["num_layers"], costs.get("prompt_tokens", 1)
    room = max(step - costs["head_ms"], 1e-6)
    if costs["layer_ms"] * layers > room * (1 + 1e-9) or costs["layer_ms"] < 1e-6 * (1 - 1e-9):
        return f"layer_ms={costs['layer_ms']!r}: {layers} layers of it and the head do not fit the step ({step!r} ms)"
    if costs["overhead_ms"] > step:
        return f"overhead_ms={costs['overhead_ms']!r}: more than the step ({step!r} ms)"
    parts = {name: (costs.get(name), PART) for name in OPTIONAL}
    probes = costs.get("extra_probe_ms", {}).items()  # a gate's probe; a tuned lens's translator (translate): PART
    parts.update({f"extra_probe_ms[{k}]": (v, PART if k == "translate" else GATE_PART) for k, v in probes})
    for name, (value, most) in parts.items():
        if value is not None and value > most * step:
            return f"{name}={value!r}: a part of a step costing more than {most:g} steps ({step!r} ms each)"
    for name in ("prefill_ms", "prefill_lens_ms"):
        if costs.get(name, 0.0) > PART * tokens * step:
            return f"{name}={costs[name]!r}: more than {PART:g} steps per token of its {tokens}-token prompt"
    for k, value in enumerate(costs.get("verify_ms", []), start=1):
        if value > VERIFY_PART * k * step:
            return f"verify_ms[{k - 1}]={value!r}: more than {VERIFY_PART:g} steps per position of its {k}"
    return None


def why_not_held(floor: float) -> str:
    """Why ``still_holds`` did not take the cached costs, from the check's A/A floor (a |log|)."""
    spread = f"+-{100 * math.expm1(floor):.1f}%"
    if floor > math.log1p(MAX_FLOOR):
        return f"the check's own rounds vary by {spread}, too busy a machine to tell (at most +-{100 * MAX_FLOOR:g}%)"
    return f"beyond the check's {spread}"


def coherent(measure: Callable[[], CostModel], again: bool = True) -> CostModel:
    """``measure()`` (the cost model measured, or a part of it), once more (``again``) where what it measured does
    not sit beside the step (``holds_together``: a burst of other work during it). Costs that still do not hold
    together are used by their trial, their source ``unsteady``, and not kept for the machine (``save``)."""
    costs = measure()
    why = holds_together(costs) if again else None
    if why is not None:
        log.info("cost model: %s; measuring it again", why)
        costs = measure()
        if holds_together(costs) is not None:  # the rows say so (their cost figures not to be trusted)
            costs.source = "unsteady"
    return costs


def _fields(costs: CostModel) -> dict:
    """A cost model's figures as its cache entry holds them."""
    return {k: v for k, v in dataclasses.asdict(costs).items() if k != "source"}


def holds_together(costs: CostModel) -> str | None:
    """Why costs measured now could not be taken from the cache (``problem``), or None."""
    return problem(_fields(costs), costs.prompt_tokens, costs.num_layers)


def save(path: Path, want: dict[str, str], costs: CostModel) -> None:
    """Write ``costs`` under ``path``: to a temporary name of this process, renamed into place (a reader sees a
    whole file or the last one); a cache that cannot be written costs only the cache. Costs that do not hold
    together (``problem``: a part dearer than a step allows, as a burst of other work makes it) are not written.
    (Not ``sweep.store``'s writer: this runs where the results stack is not installed, a GPU image's bench.)"""
    why = holds_together(costs)
    if why is not None:  # a later process would refuse it: it is not kept (this trial's figures say what it saw)
        log.warning(
            "cost model cache %s: the costs measured now are not kept for the machine (%s: measured while other work "
            "ran?); a later process measures them afresh",
            path,
            why,
        )
        return
    text = json.dumps({"key": want, "costs": _fields(costs)}, sort_keys=True)
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
    return floor <= math.log1p(MAX_FLOOR) and abs(math.log(now / cached.step_ms)) <= floor, now, floor
