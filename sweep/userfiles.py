"""Paths and files a user names (or anyone who writes a shared root could plant), read one way, as data.

- ``expand``: ``~`` and environment variables (``$NAME``, ``${NAME}``) in a path as written, expanded once;
  ``unset`` names the variables it refers to that are not set. (``sweep.config.paths.read_path`` is the one reading
  of a config key's path: expanded here, made absolute and resolved there.)
- ``read_capped``: the bytes of a regular file of at most ``cap`` bytes. What is not a regular file (a FIFO, a
  device such as /dev/zero, a directory, a socket) is refused from a ``stat``, never opened for reading; a file
  over the cap is refused from its size, and one that grows past it while read is refused after ``cap + 1`` bytes:
  no read waits on a writer or takes all the memory.
- ``parse_json``: JSON nested at most ``MAX_DEPTH`` deep (a deeper text is refused before the parser recurses).

The caps (docs/cluster.md states them): ``CAP`` for what the tool writes itself and reads back (sweep definitions,
claims, cost-model cache entries) and published skip sets; ``PROMPTS_CAP`` for a JSONL prompt set.

This module imports nothing of the project (the lowest layer): the gates read skip sets with it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

CAP = 1 << 20  # 1 MiB: a definition, a claim, a cost model or a skip set is a few kB
PROMPTS_CAP = 64 << 20  # 64 MiB: a JSONL prompt set
MAX_DEPTH = 32  # JSON nesting: what the tool writes nests 4 deep at most

_VAR = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([^}]*)\})")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class NotRegular(OSError):
    """A path that exists but is not a regular file (a FIFO, a directory, a device): never opened for reading."""


class NotData(ValueError):
    """A file (or text) that is not what may be read: over its size cap, or JSON nested deeper than ``MAX_DEPTH``."""


def expand(text: str) -> str:
    """``text`` with a leading ``~`` (or ``~user``) and every set environment variable expanded, once."""
    return os.path.expandvars(os.path.expanduser(text))


def unset(text: str) -> list[str]:
    """The environment variables ``text`` refers to (``$NAME``, ``${NAME}``) that are not set."""
    names = [a or b for a, b in _VAR.findall(text)]
    return [name for name in dict.fromkeys(names) if name not in os.environ]


def kind(mode: int) -> str:
    """What a file of ``mode`` is, in words: a regular file, a directory, a FIFO, a device, ..."""
    for test, words in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return words
    return "not a file"


def read_capped(path: str | os.PathLike, cap: int = CAP) -> bytes:
    """The bytes of the regular file ``path`` (a link to one is followed), refused (``NotRegular``, ``NotData``)
    before it is read whole when it is not a regular file or holds more than ``cap`` bytes. OSError
    (FileNotFoundError, PermissionError) as the system says."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegular(f"{path}: {kind(mode)}, not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))  # replaced by a FIFO meanwhile:
    try:  # the open does not wait for a writer, and fstat refuses it
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"{path}: {kind(st.st_mode)}, not a regular file")
        if st.st_size > cap:
            raise NotData(f"{path}: {st.st_size} bytes, over the cap of {cap} bytes")
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(cap + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > cap:
            raise NotData(f"{path}: over the cap of {cap} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def depth(text: str) -> int:
    """How deep the JSON ``text`` nests its arrays and objects (brackets inside strings do not count); stops
    counting once past ``MAX_DEPTH``."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    level = deepest = 0
    for c in brackets:
        level += 1 if c in "[{" else -1
        if level > deepest:
            deepest = level
            if deepest > MAX_DEPTH:
                break
    return deepest


def parse_json(data: bytes | str, max_depth: int = MAX_DEPTH):
    """The JSON value of ``data`` (UTF-8), refused (``NotData``) when it nests deeper than ``max_depth``;
    ValueError (``json.JSONDecodeError``, ``UnicodeDecodeError``) when it is not JSON."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    if depth(text) > max_depth:
        raise NotData(f"JSON nested more than {max_depth} deep")
    return json.loads(text)


def read_json(path: str | os.PathLike, cap: int = CAP):
    """``parse_json(read_capped(path, cap))``: the JSON value of a regular file of bounded size and depth."""
    return parse_json(read_capped(Path(path), cap))
