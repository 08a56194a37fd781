"""A model's depth and width read before any weight loads: what a gate's layer indices and a PCA gate's k are checked
against before the work (a model's load takes seconds to minutes; its config or its GGUF header, milliseconds).

- a tiny model: its config, built from ``model.tiny`` (no weights);
- an HF directory, or a hub id already in the local HF cache: its ``config.json`` (never the network);
- a GGUF file (``model=gguf``, a packaged GGUF, the first part of one shipped in parts): the header's
  ``<architecture>.block_count`` and ``<architecture>.embedding_length``, read key by key up to them.

None wherever the shape cannot be read so cheaply: the load checks the model as before, and says what is wrong with
its files. The loaded model's depth is the one that counts; a test holds these against it for every family.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import struct
from pathlib import Path
from typing import BinaryIO, NamedTuple

from sweep.config import ModelConfig


class Shape(NamedTuple):
    layers: int  # decoder layers (the text model's, in a vision-language wrapper)
    hidden: int  # the hidden size


def shape_before_load(mcfg: ModelConfig) -> Shape | None:
    """``mcfg``'s depth and width without loading it; None where they cannot be read without the load."""
    try:
        if mcfg.source == "tiny":
            from sweep.models._tiny import tiny_config

            return _from_config(tiny_config(mcfg, vocab_size=512))
        if mcfg.source == "hf":
            return _from_hf(mcfg)
        path = _gguf_path(mcfg)
        return None if path is None else gguf_shape(path)
    except Exception:  # noqa: BLE001 - a shape that cannot be read cheaply is the load's to check, as before
        return None


def _from_config(config) -> Shape | None:
    text = config.get_text_config(decoder=True)
    layers, hidden = getattr(text, "num_hidden_layers", None), getattr(text, "hidden_size", None)
    if isinstance(layers, int) and isinstance(hidden, int) and layers > 0 and hidden > 0:
        return Shape(layers, hidden)
    return None


def _from_hf(mcfg: ModelConfig) -> Shape | None:
    from transformers import AutoConfig

    assert mcfg.path is not None
    path = Path(mcfg.path).expanduser()
    if path.exists():
        config_file = path / "config.json"
        if not _regular(config_file):
            return None
        return _from_config(AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False))
    return _from_config(
        AutoConfig.from_pretrained(mcfg.path, revision=mcfg.revision, local_files_only=True, trust_remote_code=False)
    )


def _gguf_path(mcfg: ModelConfig) -> Path | None:
    if mcfg.source == "gguf" and mcfg.path is not None:
        path = Path(mcfg.path).expanduser()
    elif mcfg.source == "packaged" and mcfg.parts:
        from sweep.models._split import _locate

        path = _locate(mcfg, 0)  # the header is at the start of the first part: read only once it is the one recorded
        if not _regular(path) or not _is_recorded(path, mcfg.parts[0]):
            return None  # (the load names the part that is wrong)
    elif mcfg.source == "packaged" and mcfg.package and mcfg.file:
        spec = importlib.util.find_spec(mcfg.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(list(spec.submodule_search_locations)[0]) / mcfg.file
    else:
        return None
    return path if _regular(path) else None  # a FIFO or a device is never opened here


def _is_recorded(path: Path, part) -> bool:
    """Whether the file at ``path`` is of the part's recorded size and sha256 (``fingerprint_file``: hashed once per
    process while the file is unchanged; a part past its 256 MiB full-hash limit is never taken as recorded)."""
    from sweep.config.provenance import fingerprint_file

    return os.stat(path).st_size == part.size and fingerprint_file(path) == f"sha256:{part.sha256}"


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


# GGUF value types (the format's specification): fixed-size scalars by their struct code; 8 a string, 9 an array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_MAX_KEYS = 4096  # a header with more keys than this is not one this reader should walk


def gguf_shape(path: str | Path) -> Shape | None:
    """The depth and width a GGUF file's header records (version 2 or 3, little-endian); None when the header is not
    one, or ends before both keys."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            return None
        version, _tensors, n_keys = struct.unpack("<IQQ", _exact(f, 20))
        if version not in (2, 3) or n_keys > _MAX_KEYS:
            return None
        arch, found = None, {}
        for _ in range(n_keys):
            key = _string(f)
            kind = struct.unpack("<I", _exact(f, 4))[0]
            value = _value(
                f, kind, keep=key == "general.architecture" or key.endswith((".block_count", ".embedding_length"))
            )
            if key == "general.architecture" and isinstance(value, str):
                arch = value
            elif value is not None:
                found[key] = value
            if arch is not None and {f"{arch}.block_count", f"{arch}.embedding_length"} <= found.keys():
                layers, hidden = found[f"{arch}.block_count"], found[f"{arch}.embedding_length"]
                if all(type(v) is int and v > 0 for v in (layers, hidden)):  # (a bool is no count)
                    return Shape(layers, hidden)
                return None
    return None


def _exact(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise EOFError("the GGUF header ends early")
    return data


def _string(f: BinaryIO) -> str:
    n = struct.unpack("<Q", _exact(f, 8))[0]
    if n > 1 << 20:
        raise ValueError("a GGUF string longer than 1 MiB")
    return _exact(f, n).decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int, *, keep: bool):
    """The value of type ``kind`` at ``f``'s position, read past; returned when ``keep`` (None otherwise)."""
    if kind in _SCALARS:
        code = _SCALARS[kind]
        value = struct.unpack("<" + code, _exact(f, struct.calcsize(code)))[0]
        return value if keep else None
    if kind == _STRING:
        text = _string(f)
        return text if keep else None
    if kind == _ARRAY:
        item, n = struct.unpack("<IQ", _exact(f, 12))
        if item in _SCALARS:
            f.seek(n * struct.calcsize(_SCALARS[item]), os.SEEK_CUR)
        else:
            for _ in range(n):
                _value(f, item, keep=False)
        return None
    raise ValueError(f"GGUF value type {kind} is not one of the format's")
