"""Where a number came from: code version, library versions, model identity, device."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

import sweep

_FULL_HASH_LIMIT = 256 * 2**20  # files up to this size are hashed whole
_SAMPLE = 2**20  # larger files: size plus 1 MiB from the start, middle and end


PROJECT_ROOT = Path(__file__).resolve().parents[2]  # sweep/config/provenance.py -> the checkout
GIT_SHA_ENV = "SWEEP_GIT_SHA"  # the commit, when this copy of the project is not a git checkout
SUBMISSION_ID_ENV = "SWEEP_SUBMISSION_ID"  # the Ray job this process runs in (jobs/submit.py sets both)


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


def checkout_commit(root: str | Path) -> str | None:
    """The commit checked out at ``root``, with ``-dirty`` when tracked files have changes; None
    when ``root`` is not the top of a git work tree (a staged or installed copy, even one that
    lies inside some other repository) or git is unavailable."""
    root = Path(root).resolve()
    try:
        if Path(_git(root, "rev-parse", "--show-toplevel")).resolve() != root:
            return None
        sha = _git(root, "rev-parse", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


@functools.lru_cache(maxsize=1)
def git_sha() -> str:
    """Commit of the project, with ``-dirty`` when it has changes: from git where the project is a
    checkout, else ``$SWEEP_GIT_SHA`` (a Ray job's staged working directory has no .git; the
    submitter passes its commit), else 'unknown'."""
    return checkout_commit(PROJECT_ROOT) or os.environ.get(GIT_SHA_ENV) or "unknown"


def submission_id() -> str | None:
    """The submission id of the Ray job this process belongs to (``$SWEEP_SUBMISSION_ID``, which
    jobs/submit.py puts in the job's runtime_env so that the driver and every worker see it); None
    outside a job. Ray 2.60 itself sets no such variable for workers: the job supervisor passes the
    id to the driver only, inside ``RAY_JOB_CONFIG_JSON_ENV_VAR`` (ray/dashboard/modules/job/job_supervisor.py)."""
    return os.environ.get(SUBMISSION_ID_ENV) or None


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


@functools.lru_cache(maxsize=1)
def machine() -> dict:
    """The environment fingerprint of this process's machine: CPU model, physical cores and logical threads, the
    threads torch uses, GPU name and memory (null without one), the CUDA version torch was built with."""
    import torch

    cpu, cores = platform.processor() or platform.machine(), None
    try:
        text = Path("/proc/cpuinfo").read_text()
        names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
        pairs = set()
        for block in text.split("\n\n"):
            fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
            fields = {k.strip(): v.strip() for k, v in fields.items()}
            if "core id" in fields:
                pairs.add((fields.get("physical id", "0"), fields["core id"]))
        cores = len(pairs) or None
    except OSError:
        pass
    gpu = memory = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu, memory = props.name, round(props.total_memory / 2**30, 1)
    return {
        "env_cpu": cpu,
        "env_cores": cores or os.cpu_count(),
        "env_threads": os.cpu_count(),
        "env_torch_threads": torch.get_num_threads(),
        "env_gpu": gpu,
        "env_gpu_memory_gib": memory,
        "cuda_version": torch.version.cuda,
    }


# the fingerprint's columns that a front's rows should share (the report warns where they differ), dtype included
FINGERPRINT = (
    "env_cpu",
    "env_cores",
    "env_threads",
    "env_torch_threads",
    "env_gpu",
    "env_gpu_memory_gib",
    "torch_version",
    "transformers_version",
    "cuda_version",
    "attn_implementation",
    "dtype",
)


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
    """Content hash of a weights file (sampled above 256 MiB; cached per size and mtime); a path that is not a
    regular file (a FIFO planted among a model's files would block the read) is an InputError, never opened."""
    import stat

    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        from sweep.errors import InputError
        from sweep.userfiles import kind

        raise InputError(f"model.path: {path} is {kind(st.st_mode)}, not a regular file (a model's files are read)")
    return _fingerprint_cached(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


# a model directory's files that decide what it computes: weights, configs, and the tokenizer's files (a BPE's
# merges.txt, a SentencePiece model, a tiktoken file, the chat template transformers writes beside the config)
# (a .txt only where it is a tokenizer's: merges.txt, vocab.txt; a README.txt or a log is no part of the model)
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".json", ".gguf", ".pt", ".model", ".tiktoken", ".jinja")
TOKENIZER_TEXTS = ("merges.txt", "vocab.txt")


def fingerprint_dir(path: str | Path) -> str:
    """Combined fingerprint of a model directory's config, weight and tokenizer files (``MODEL_FILE_SUFFIXES``,
    ``TOKENIZER_TEXTS``)."""
    h = hashlib.sha256()
    for f in sorted(Path(path).iterdir()):
        if f.suffix in MODEL_FILE_SUFFIXES or f.name in TOKENIZER_TEXTS:
            h.update(f.name.encode())
            h.update(fingerprint_file(f).encode())
    return "dir-sha256:" + h.hexdigest()


def random_init_hash(spec: dict, seed: int) -> str:
    """The content hash of a model built with seeded random weights: every field that builds it (``spec``, JSON
    data) and the seed. Two shapes of one depth, dtype and seed are two models, each with its own cached costs."""
    text = json.dumps({"spec": spec, "seed": seed}, sort_keys=True)
    return "random-init:sha256:" + hashlib.sha256(text.encode()).hexdigest()


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
