"""A GGUF file shipped as several packages' data files (``model.parts``): found without importing any of the
packages' code, each part checked (a regular file of its recorded size and sha256) before any byte of it is used,
and concatenated in order, the whole checked against ``model.sha256`` as it is written.

Every load checks the parts, so a part damaged or swapped after set-up is named before the model is built from the
conversion cache; the assembled file is made only when the cache has no conversion of it, in the cache directory,
and removed once converted (the conversion cache entry is what stays, verified at every load like any other).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import stat
import uuid
from pathlib import Path

from sweep import progress
from sweep.config import ModelConfig, PartConfig
from sweep.errors import InputError
from sweep.userfiles import kind

log = logging.getLogger("sweep.models")

CHUNK = 8 * 2**20


def content_hash(mcfg: ModelConfig) -> str:
    """The content hash every row carries for a model assembled from parts: its published sha256."""
    return f"sha256:{mcfg.sha256}"


def verify(mcfg: ModelConfig) -> list[Path]:
    """Each part's path, after checking that it is installed, a regular file (not a link, FIFO or device: refused
    without opening it for reading), of its recorded size and sha256; the parts' concatenation must hash to
    ``model.sha256``. The first part that fails is one line naming it."""
    assert mcfg.parts and mcfg.sha256
    paths = [_locate(mcfg, i) for i in range(len(mcfg.parts))]
    whole = hashlib.sha256()
    with progress.phase(f"checking the {len(paths)} parts of {mcfg.name} (MiB)", _mib(mcfg)) as ph:
        for i, path in enumerate(paths):
            digest = _hash_part(mcfg, i, path, whole, ph)
            if digest != mcfg.parts[i].sha256:
                raise InputError(
                    f"{_where(mcfg, i)}: sha256 {digest[:16]}..., recorded {mcfg.parts[i].sha256[:16]}...: a wrong or "
                    f"damaged part; {_reinstall(mcfg.parts[i])}"
                )
    if whole.hexdigest() != mcfg.sha256:
        raise InputError(
            f"model.sha256={mcfg.sha256}: the {len(paths)} parts of model={mcfg.name} assemble to sha256 "
            f"{whole.hexdigest()} (each part matches its own record): the parts' list and the whole's sha256 disagree"
        )
    return paths


def assemble(mcfg: ModelConfig, paths: list[Path], directory: Path) -> Path:
    """The parts concatenated into ``directory/model.file``, written under a temporary name, hashed as written and
    renamed into place only when the whole matches ``model.sha256`` (a part changed since ``verify`` is named)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / (mcfg.file or f"{mcfg.name}.gguf")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    whole = hashlib.sha256()
    try:
        with open(tmp, "wb") as out, progress.phase(f"assembling {target.name} (MiB)", _mib(mcfg)) as ph:
            for i, path in enumerate(paths):
                part = hashlib.sha256()
                for chunk in _chunks(mcfg, i, path):
                    part.update(chunk)
                    whole.update(chunk)
                    out.write(chunk)
                    ph.advance(len(chunk) >> 20)
                if part.hexdigest() != mcfg.parts[i].sha256:
                    raise InputError(f"{_where(mcfg, i)}: changed while it was being assembled; assemble again")
        if whole.hexdigest() != mcfg.sha256:
            raise InputError(f"model.sha256={mcfg.sha256}: the assembled file hashes to {whole.hexdigest()}")
        tmp.rename(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _mib(mcfg: ModelConfig) -> int:
    return sum(p.size for p in mcfg.parts or ()) >> 20


def _locate(mcfg: ModelConfig, i: int) -> Path:
    """Part ``i``'s file: its package's directory as the import system would find it, never importing it
    (``find_spec`` of a top-level name executes nothing), then the file's path inside it."""
    part = mcfg.parts[i]
    package, _, inside = part.path.partition("/")
    if not package.isidentifier() or not inside or ".." in Path(inside).parts or inside.startswith("/"):
        raise InputError(
            f"model.parts[{i}].path={part.path!r}: must be PACKAGE/PATH, a file inside a top-level package"
        )
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"{_where(mcfg, i)}: not installed; {_reinstall(part, force=False)}")
    return Path(list(spec.submodule_search_locations)[0]) / inside


def _hash_part(mcfg: ModelConfig, i: int, path: Path, whole, ph) -> str:
    h = hashlib.sha256()
    for chunk in _chunks(mcfg, i, path):
        h.update(chunk)
        whole.update(chunk)
        ph.advance(len(chunk) >> 20)
    return h.hexdigest()


def _chunks(mcfg: ModelConfig, i: int, path: Path):
    """Part ``i``'s bytes: only from a regular file of the recorded size (checked on the file opened, not the name)."""
    part = mcfg.parts[i]
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise InputError(f"{_where(mcfg, i)}: {path} is missing from its package; {_reinstall(part)}") from None
    except OSError as exc:
        raise InputError(f"{_where(mcfg, i)}: {path} cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{_where(mcfg, i)}: {path} is {kind(st.st_mode)}, not a regular file; {_reinstall(part)}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"{_where(mcfg, i)}: {path} cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{_where(mcfg, i)}: {path} is {kind(st.st_mode)}, not a regular file")
        if st.st_size != part.size:
            raise InputError(
                f"{_where(mcfg, i)}: {path} has {st.st_size} bytes, recorded {part.size}: a wrong or damaged part; "
                f"{_reinstall(part)}"
            )
        while chunk := f.read(CHUNK):
            yield chunk


def _where(mcfg: ModelConfig, i: int) -> str:
    return f"model={mcfg.name}: part {i + 1} of {len(mcfg.parts)} ({mcfg.parts[i].path})"


def _reinstall(part: PartConfig, force: bool = True) -> str:
    pip = part.path.partition("/")[0].replace("_", "-")
    flags = "--force-reinstall --no-deps" if force else "--no-deps"
    version = f"=={part.version}" if part.version else ""
    return f"install it with `pip install {flags} {pip}{version}` (or `make setup`)"
