"""Text that fits a 120-column terminal, words and cells whole.

``wrap`` and ``fit_lines`` for prose (a line too long is broken between words, its continuation
indented); ``table`` for a polars frame: all-null columns dropped, the columns equal in every row said
once above it, the rest laid out in blocks of columns that fit (key columns repeated in each block), no
cell ever broken; ``WrappingFormatter`` wraps log lines the same way.
"""

from __future__ import annotations

import logging
import textwrap
from typing import Any, Sequence

WIDTH = 120


def wrap(text: str, width: int = WIDTH, indent: str = "  ") -> list[str]:
    """``text`` as lines of at most ``width`` columns (a word longer than that keeps its own line)."""
    if len(text) <= width:
        return [text]
    lines = textwrap.wrap(
        text, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False, replace_whitespace=False
    )
    return lines or [text]


def fit_lines(text: str, width: int = WIDTH, indent: str = "  ") -> str:
    """Every line of ``text`` wrapped to ``width``; a continuation keeps the line's own indent plus ``indent``."""
    out: list[str] = []
    for line in text.splitlines():
        lead = line[: len(line) - len(line.lstrip(" "))]
        out += wrap(line, width, lead + indent)
    return "\n".join(out)


def cell(value: Any, precision: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.{precision}f}"
    return str(value)


def table(
    df,
    *,
    keys: Sequence[str] = (),
    width: int = WIDTH,
    precision: int = 3,
    same_line: str = "every row:",
) -> list[str]:
    """``df`` (a polars DataFrame) as text lines of at most ``width`` columns: all-null columns dropped;
    with more than one row, columns equal in every row (but ``keys``) go on one line after ``same_line``;
    the others in blocks of columns that fit, ``keys`` (leading columns) repeated in every block."""
    kept = [c for c in df.columns if df[c].null_count() < df.height]
    df = df.select(kept)
    lines: list[str] = []
    if df.height > 1:
        same = [c for c in df.columns if c not in keys and df[c].n_unique() == 1]
        if same and len(same) < df.width:
            lines += wrap(f"{same_line} " + "  ".join(f"{c}={cell(df[c][0], precision)}" for c in same), width)
            df = df.drop(same)
    if df.width == 0:
        return lines
    cells = {c: [cell(v, precision) for v in df[c].to_list()] for c in df.columns}
    heads = {c: [c] for c in df.columns}
    size = {c: max(len(c), *(len(v) for v in cells[c])) for c in df.columns}
    if _span(list(df.columns), size) > width:  # too wide: names over two lines, split after an underscore
        heads = {c: _split_name(c, max(map(len, cells[c]), default=0)) for c in df.columns}
        size = {c: max(*(len(h) for h in heads[c]), *(len(v) for v in cells[c])) for c in df.columns}
    right = {c: df[c].dtype.is_numeric() for c in df.columns}
    lead = [c for c in keys if c in cells]
    blocks: list[list[str]] = []
    current = list(lead)
    for c in (c for c in df.columns if c not in lead):
        if len(current) > len(lead) and _span([*current, c], size) > width:
            blocks.append(current)
            current = [*lead, c]
        else:
            current.append(c)
    blocks.append(current)
    for i, block in enumerate(blocks):
        if i:
            lines.append("")
        depth = max(len(heads[c]) for c in block)
        for k in range(depth):  # a name on one line is on the last header line
            lines.append(_join([_pad(_head_line(heads[c], k, depth), size[c], right[c]) for c in block]))
        lines.append(_join(["-" * size[c] for c in block]))
        for r in range(df.height):
            lines.append(_join([_pad(cells[c][r], size[c], right[c]) for c in block]))
    return lines


def _split_name(name: str, room: int) -> list[str]:
    """A column name as one line, or two split after the underscore that makes the wider line narrowest
    (none when the name fits beside its cells' width anyway)."""
    cuts = [i + 1 for i, ch in enumerate(name) if ch == "_" and 0 < i < len(name) - 1]
    if len(name) <= room or not cuts:
        return [name]
    cut = min(cuts, key=lambda i: max(i, len(name) - i))
    return [name[:cut], name[cut:]]


def _head_line(parts: list[str], k: int, depth: int) -> str:
    offset = depth - len(parts)
    return parts[k - offset] if k >= offset else ""


def _span(columns: list[str], size: dict[str, int]) -> int:
    return sum(size[c] for c in columns) + 2 * (len(columns) - 1)


def _pad(text: str, n: int, right: bool) -> str:
    return text.rjust(n) if right else text.ljust(n)


def _join(parts: list[str]) -> str:
    return "  ".join(parts).rstrip()


class WrappingFormatter(logging.Formatter):
    """A log formatter whose lines fit ``WIDTH`` columns (continuations indented past the prefix)."""

    def __init__(self, fmt: str, indent: str = " " * 9) -> None:
        super().__init__(fmt)
        self.indent = indent

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(
            line for text in super().format(record).splitlines() for line in wrap(text, WIDTH, self.indent)
        )


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one: "1 setting", "2 settings"."""
    return f"{n} {noun}{'s' * (n != 1)}"
