"""Trial identity, in one place: the device a trial runs on, and its key and id.

A trial's key is everything that defines its result (model, gate, bench settings,
prompts, device, dtype, seed; not where it is written, not the run) as canonical JSON
text; its id is a hash of that text. The key is stored with each trial row
(``trial_key``), so an id can always be traced back to the config that produced it and
rebuilt from the key alone (``id_of_key``).

Torch-free at import: ``trial_device`` asks torch only for ``device=auto`` without a GPU
count, and then only when called.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from sweep.config import Config

DEVICES = ("cpu", "cuda")


class TrialIdentity(NamedTuple):
    key: str  # canonical JSON text of the trial's defining config (the trials table's trial_key)
    id: str  # id_of_key(key)


def trial_device(requested: str, gpus: float | None = None) -> str:
    """The device a trial runs on, as its identity names it: cpu or cuda.

    ``cpu`` and ``cuda`` stand as given. ``auto`` is cuda when the trial gets a GPU: on a
    sweep, ``gpus`` is what the driver gives each trial (so every worker agrees with the
    planner); without a count (``sweep bench``), when torch sees a GPU on this machine.
    """
    if requested != "auto":
        return requested
    if gpus is not None:
        return "cuda" if gpus > 0 else "cpu"
    import torch  # only for a device chosen here, outside a sweep

    return "cuda" if torch.cuda.is_available() else "cpu"


# what one setting of a sweep can vary (a sub-space's keys): the sections of a trial's identity (its device is the
# driver's to resolve) and its task; the rest (results, sweep, cluster, resources, ...) is the sweep's own
TRIAL_SECTIONS = ("model", "gate", "prompts", "bench", "eval", "dtype", "seed")


def trial_identity(cfg: Config, device: str) -> TrialIdentity:
    """The trial ``cfg`` describes, run on ``device`` (cpu | cuda, from ``trial_device``):
    its key and id. The one function every caller derives a trial's identity with."""
    if device not in DEVICES:
        raise ValueError(f"trial_identity: device must be one of {DEVICES} (resolved by trial_device), not {device!r}")
    key: dict[str, Any] = {
        "model": _without_later_nulls("model", dataclasses.asdict(cfg.model)),
        "gate": _without_later_nulls("gate", dataclasses.asdict(cfg.gate)),
        "bench": _without_later_nulls(
            "bench", {k: v for k, v in dataclasses.asdict(cfg.bench).items() if k != "cost_model"}
        ),
        "prompts": dataclasses.asdict(cfg.prompts),
        "device": device,
        "dtype": cfg.dtype,
        "seed": cfg.seed,
    }
    if cfg.eval.task is not None:  # a trial that also measures a task's accuracy (left out otherwise: ids unchanged)
        key["eval"] = eval_key(dataclasses.asdict(cfg.eval))
    text = _canonical(key)
    return TrialIdentity(text, _digest(text))


# what defines an evaluation's result (not the sandbox's opt-in, pool size or timeout); batch_size only where it
# batches (1, the default, decodes one sequence at a time, as every trial did before it existed: their ids stand)
EVAL_KEYS = (
    "task",
    "problems",
    "max_tokens",
    "samples",
    "temperature",
    "ks",
    "harness_tasks",
    "harness_include",
    "batch_size",
)


def eval_key(values: dict[str, Any]) -> dict[str, Any]:
    """The eval settings that define a task's result, from ``asdict(cfg.eval)``."""
    return {k: v for k, v in values.items() if k in EVAL_KEYS and not (k == "batch_size" and v == 1)}


# config keys added after trial ids were first written: left out of a trial's key while null (their
# default), so every trial that does not use one keeps the id it always had (resume, dedupe, joins)
LATER_KEYS = {"model": ("parts", "sha256"), "gate": ("skip",), "bench": ("draft_stop",)}


def _without_later_nulls(section: str, values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if not (k in LATER_KEYS[section] and v is None)}


def id_of_key(key: str) -> str:
    """A trial id from its stored key alone (a row's ``trial_key``)."""
    return _digest(_canonical(json.loads(key)))


def resolved_id(key: str, min_layer: int | None) -> str:
    """The id of the setting the trial key ``key`` runs on its model, ``min_layer`` being the first layer its gate may
    exit after there (a row's ``min_layer``, ``sweep.gates.resolve_min_layer`` of the model's depth): a gate given as
    a fraction of depth (``gate.min_depth``) is keyed by the layer it resolves to, as ``gate.min_layer`` names it, so
    min_depth 0.3 and 0.31 of a 4-layer model, and min_layer 2, are one setting (they run the same layers). The
    trial's own id where the key gives no min_depth or its layer is not known."""
    values = json.loads(key)
    gate = values.get("gate") or {}
    if min_layer is None or gate.get("min_depth") is None:
        return id_of_key(key)
    values["gate"] = {**gate, "min_depth": None, "min_layer": int(min_layer)}
    return _digest(_canonical(values))


def key_is_of(key: str, trial_id: str) -> bool:
    """Whether the stored key ``key`` is trial ``trial_id``'s: its text hashed as written (keys are written canonical),
    else as ``id_of_key`` reads it (a key re-spelled since)."""
    return _digest(key) == trial_id or id_of_key(key) == trial_id


def trial_columns(cfg: Config) -> dict[str, str]:
    """The identity columns of a trial row, on ``cfg.device`` as ``trial_device`` resolves it
    (a sweep's worker runs a config whose device the driver already resolved)."""
    ident = trial_identity(cfg, trial_device(cfg.device))
    return {"trial_id": ident.id, "trial_key": ident.key}


def _canonical(key: dict[str, Any]) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
