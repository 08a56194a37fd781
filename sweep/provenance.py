"""Where a number came from: code version, library versions, model identity, device."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
from pathlib import Path

import sweep

_FULL_HASH_LIMIT = 256 * 2**20  # files up to this size are hashed whole
_SAMPLE = 2**20  # larger files: size plus 1 MiB from the start, middle and end


@functools.lru_cache(maxsize=1)
def git_sha() -> str:
    """Commit of the project checkout, with ``-dirty`` when it has changes; 'unknown' outside git."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("SWEEP_GIT_SHA", "unknown")
    return sha + ("-dirty" if dirty else "")


@functools.lru_cache(maxsize=1)
def library_versions() -> dict[str, str]:
    import torch
    import transformers

    return {
        "sweep_version": sweep.__version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "python_version": platform.python_version(),
    }


@functools.lru_cache(maxsize=64)
def _fingerprint_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= _FULL_HASH_LIMIT:
            for chunk in iter(lambda: f.read(8 * 2**20), b""):
                h.update(chunk)
            return "sha256:" + h.hexdigest()
        h.update(str(size).encode())
        for offset in (0, size // 2, max(size - _SAMPLE, 0)):
            f.seek(offset)
            h.update(f.read(_SAMPLE))
    return "sample-sha256:" + h.hexdigest()


def fingerprint_file(path: str | Path) -> str:
    """Content hash of a weights file (sampled above 256 MiB; cached per size and mtime)."""
    st = os.stat(path)
    return _fingerprint_cached(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def fingerprint_dir(path: str | Path) -> str:
    """Combined fingerprint of a model directory's config and weight files."""
    h = hashlib.sha256()
    for f in sorted(Path(path).iterdir()):
        if f.suffix in (".safetensors", ".bin", ".json", ".gguf", ".pt"):
            h.update(f.name.encode())
            h.update(fingerprint_file(f).encode())
    return "dir-sha256:" + h.hexdigest()


def fingerprint_state(model) -> str:
    """Hash of every parameter and buffer (for models built in memory)."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().to("cpu").contiguous().view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return "sha256:" + h.hexdigest()


def device_label(device) -> str:
    """'cpu' or 'cuda:0 (<GPU name>)'."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return dev.type
