"""Load a model from its config: packaged GGUF, GGUF file, HF directory or hub id, tiny.

``load_model`` loads; given a ``ModelCache`` (a session's, ``sweep.bench.session``) a second request
for the same (model, device, dtype) returns the same object, so trials that share a worker share its
model (and never convert it twice).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from sweep.config import ModelConfig
from sweep.errors import ConfigError, InputError
from sweep.models._adapter import Adapter
from sweep.models._fidelity import Fidelity, check
from sweep.models._sources import _load_gguf, _load_hf, _load_packaged, _load_tiny
from sweep.config.provenance import device_label

log = logging.getLogger("sweep.models")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_LOADS = [0]  # models this process really loaded (``model_loads``)


@dataclass
class LoadedModel:
    """A model ready for the engine, with what every result row must say about it."""

    name: str
    source: str
    model: Any
    tokenizer: Any
    adapter: Adapter
    device: torch.device
    dtype: torch.dtype
    content_hash: str
    revision: str | None
    load_seconds: float
    fidelity: Fidelity | None = None  # the check at load (``sweep.models._fidelity``)
    info: dict = field(default_factory=dict)

    @property
    def family(self) -> str:
        """The decoder's HF model_type (``gemma3`` for Gemma 3's text model too)."""
        return self.adapter.config.model_type.removesuffix("_text")

    @property
    def num_layers(self) -> int:
        return self.adapter.num_layers

    def require(
        self, *, lens: bool = False, kv_policy: str | None = None, crop: bool = False, batch_size: int = 1
    ) -> None:
        """Refuse, in one line, a use the fidelity check found this model cannot give exactly: reading
        the logit lens (every exiting gate, the profile, prefix drafts), kv_policy=propagate, a cache
        cropped back (self-speculation), or a left-padded batch."""
        where, fid = f"model={self.name}", self.fidelity
        if batch_size > 1 and fid is not None and not fid.batch_ok:
            raise ConfigError(
                f"bench.batch_size={batch_size}: refused for {where}: a left-padded batch through its own forward "
                f"does not decode each row as alone (largest relative error {fid.batch_err:.3g}); "
                "use bench.batch_size=1"
            )
        if lens and fid is not None and not fid.lens_ok:
            raise ConfigError(
                f"{where}: the logit lens at layer L does not reproduce the model's own logits (largest relative "
                f"error {fid.lens_err:.3g}, tolerance {fid.tolerance:g}): its final norm, head or logit transform is "
                f"not the model's; gates that exit and the profile read that lens, so they are refused (gate=full runs)"
            )
        if kv_policy == "propagate" and self.adapter.kv_path is None:
            why = fid.kv_refusal if fid is not None and fid.kv_refusal else "no K/V fill was checked exact for it"
            raise ConfigError(f"bench.kv_policy=propagate: refused for {where}: {why}; use bench.kv_policy=full")
        if crop and fid is not None and not fid.rollback_ok:
            found = (
                f"it could not run ({fid.rollback_refusal})"
                if fid.rollback_err is None
                else f"largest relative error {fid.rollback_err:.3g}, tolerance {fid.rollback_tolerance:g}"
            )
            raise ConfigError(
                f"bench.mode=self_speculative: refused for {where}: the fidelity check (e) found that its cache does "
                f"not roll back to the accepted tokens exactly ({found})"
            )

    def provenance(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "model_source": self.source,
            "model_hash": self.content_hash,
            "model_revision": self.revision,
            "family": self.family,
            "model_kind": self.adapter.kind,
            "num_layers": self.num_layers,
            **(self.fidelity.columns() if self.fidelity is not None else {}),
            "device": device_label(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "attn_implementation": self.attn_implementation,
        }

    @property
    def attn_implementation(self) -> str:
        """The attention implementation the model runs (eager, sdpa, flash_attention_2, ...; none without attention)."""
        config = self.adapter.config
        found = getattr(config, "_attn_implementation", None) or getattr(
            self.model.config, "_attn_implementation", None
        )
        return str(found) if found else "none"


def resolve_device(device: str) -> torch.device:
    """``auto`` is CUDA when torch sees a GPU, else CPU; ``cuda`` without one is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise ConfigError(
            f"device=cuda: torch {torch.__version__} ({build}) sees no CUDA device here; allowed here: auto, cpu"
        )
    return torch.device(device)


def model_loads() -> int:
    """How many models this process has really loaded (cache hits do not count)."""
    return _LOADS[0]


class ModelCache:
    """Loaded models kept for the next request, the most recently used last; a session's
    (``sweep.bench.session``), which a worker's trials share."""

    def __init__(self) -> None:
        self.models: dict[tuple, LoadedModel] = {}

    def get(self, key: tuple) -> LoadedModel | None:
        lm = self.models.pop(key, None)
        if lm is not None:
            self.models[key] = lm  # most recently used last
        return lm

    def put(self, key: tuple, lm: LoadedModel) -> None:
        self.models[key] = lm

    def evict(self, keep: int) -> None:
        """Drop the least recently used models until ``keep`` remain (a worker that serves a sweep over
        several models holds at most resources.models of them, default 2)."""
        while len(self.models) > max(keep, 0):
            lm = self.models.pop(next(iter(self.models)))
            if lm.device.type == "cuda":
                del lm
                torch.cuda.empty_cache()


def load_model(
    mcfg: ModelConfig,
    *,
    device: str = "auto",
    dtype: str = "float32",
    seed: int = 0,
    keep: int = 2,
    cache: ModelCache | None = None,
) -> LoadedModel:
    """The model ``mcfg`` describes, on ``device`` in ``dtype``: from ``cache`` when it holds it, else
    loaded (and kept there, with at most the ``keep`` most recently used, ``resources.models``).
    Without a cache every call loads."""
    dev = resolve_device(device)
    key = (mcfg, str(dev), dtype, seed if mcfg.source == "tiny" else None)
    if cache is not None and (hit := cache.get(key)) is not None:
        return hit
    if cache is not None:
        cache.evict(keep=keep - 1)
    t0 = time.perf_counter()
    loader = {"packaged": _load_packaged, "gguf": _load_gguf, "hf": _load_hf, "tiny": _load_tiny}[mcfg.source]
    model, tokenizer, content_hash, revision = loader(mcfg, DTYPES[dtype], seed)
    model.to(device=dev, dtype=DTYPES[dtype])
    lm = ready(
        model,
        tokenizer,
        name=mcfg.name or "model",
        source=mcfg.source,
        where=f"model={mcfg.name or mcfg.path}",
        content_hash=content_hash,
        revision=revision,
        device=dev,
        t0=t0,
    )
    _LOADS[0] += 1
    if cache is not None:
        cache.put(key, lm)
    return lm


def ready(
    model,
    tokenizer,
    *,
    name: str,
    source: str,
    where: str,
    content_hash: str,
    revision: str | None = None,
    device: torch.device | None = None,
    t0: float | None = None,
) -> LoadedModel:
    """A model already on its device and in its dtype, ready for the engine: eval mode, its parts found
    (``Adapter``), the fidelity check run (refusing the model when a decode step through the adapter is
    not the model's own). ``load_model`` ends here; so does a caller that builds a model in memory."""
    t0 = time.perf_counter() if t0 is None else t0
    model.eval()
    model.requires_grad_(False)
    adapter = Adapter(model, where=where)
    param = next(model.parameters())
    device = param.device if device is None else device
    fidelity = check(adapter, device)
    if not fidelity.step_ok:
        raise InputError(
            f"{where}: a decode step through the adapter does not reproduce the model's own forward (largest "
            f"relative error {fidelity.step_err:.3g}, tolerance {fidelity.tolerance:g}); this model is not supported"
        )
    lm = LoadedModel(
        name=name,
        source=source,
        model=model,
        tokenizer=tokenizer,
        adapter=adapter,
        device=device,
        dtype=param.dtype,
        content_hash=content_hash,
        revision=revision,
        load_seconds=time.perf_counter() - t0,
        fidelity=fidelity,
    )
    log.info(
        "loaded %s (%s, %s, %d layers, %s, %s) in %.1f s; fidelity: lens %.2g, K/V %s (%s path), step %.2g, batch %.2g",
        lm.name,
        lm.family,
        adapter.kind,
        lm.num_layers,
        lm.provenance()["device"],
        lm.provenance()["dtype"],
        lm.load_seconds,
        fidelity.lens_err,
        "n/a" if fidelity.kv_err is None else f"{fidelity.kv_err:.2g}",
        adapter.path,
        fidelity.step_err,
        fidelity.batch_err,
    )
    return lm
