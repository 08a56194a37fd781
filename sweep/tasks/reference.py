"""The full-depth side of a task, kept on disk once per machine (``$SWEEP_CACHE_DIR/tasks/``): every later trial,
sweep or process with the same key reads it instead of decoding and scoring every problem again.

The key is what the side depends on: the model's content hash, dtype and device, the seed where completions are
sampled or a harness task draws its few-shot examples, the task's settings (``sweep.config.identity.EVAL_KEYS``) and
the sandbox's timeout, the task's data (a digest of HumanEval's data file, or of each harness task's config and
documents as the harness loads them), the torch threads (a CPU matmul may sum in another order), torch's and
transformers' versions, and the source of the code that decodes and scores it (this package's, ``sweep.decode``'s
and ``sweep.models``' modules: a change there measures the side again). An entry holds its key and is read only from
a regular file of bounded size whose fields have the types, lengths and ranges a side has (one score per problem of
the task, in [0, 1] for pass@1, its samples' completions, pass@k in [0, 1] and pass@1 the mean score); anything else
is measured over, with a warning, and replaced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import uuid
from dataclasses import asdict
from pathlib import Path

from sweep.errors import first_line
from sweep.tasks.completions import Side

log = logging.getLogger("sweep.tasks")

VERSION = 1
MAX_BYTES = 64 * 2**20  # an entry of 164 problems x 256 tokens is about 1 MB; anything far larger is not one
_SCORERS = ("tasks", "decode", "models")  # the packages (under sweep/) whose code decodes and scores a side


def scorer_hash() -> str:
    """A hash of the source that decodes and scores a side (every module of ``_SCORERS``' packages) and of torch's
    and transformers' versions, computed once per process."""
    global _SCORER
    if _SCORER is None:
        import torch
        import transformers

        h = hashlib.sha256(f"torch {torch.__version__} transformers {transformers.__version__}".encode())
        root = Path(__file__).resolve().parent.parent
        for path in sorted(p for name in _SCORERS for p in (root / name).glob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
        _SCORER = h.hexdigest()[:16]
    return _SCORER


_SCORER: str | None = None


def entry_path(key: str) -> Path:
    from sweep.models import cache_dir

    return cache_dir() / "tasks" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def load(key: str, problems: int | None = None, samples: int | None = None) -> Side | None:
    """The side stored under ``key`` (of ``problems`` problems, ``samples`` completions each, where known); None when
    there is none, or the entry cannot be trusted (said in a warning)."""
    from sweep.userfiles import read_json

    path = entry_path(key)
    if not os.path.lexists(path):
        return None
    try:  # only a regular file of bounded size and JSON depth is read (sweep.userfiles)
        side = _side(read_json(path, MAX_BYTES), key, problems, samples)
    except (OSError, ValueError) as exc:
        side = first_line(exc)
    if isinstance(side, Side):
        log.info("the full-depth side of this task comes from %s (measured earlier on this machine)", path)
        return side
    log.warning("the stored full-depth side %s cannot be used (%s); measuring it again", path, side)
    return None


def save(key: str, side: Side) -> Path | None:
    """Store ``side`` under ``key``: written under a temporary name and renamed into place (atomic); None where the
    cache directory cannot take it (the trial goes on: the next one measures the side again)."""
    path = entry_path(key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    record = {"version": VERSION, "key": key, "side": asdict(side)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, allow_nan=True))
        os.replace(tmp, path)
        return path
    except OSError as exc:
        log.warning("the full-depth side was not stored (%s: %s); later trials measure it again", path, exc)
        return None
    finally:
        tmp.unlink(missing_ok=True)


def _side(record, key: str, problems: int | None = None, samples: int | None = None) -> Side | str:
    """The Side an entry holds, or why it holds none (its key, version, its number of problems or of samples, or a
    field's type, length or range)."""
    if not isinstance(record, dict) or record.get("version") != VERSION or record.get("key") != key:
        return "another key or version"
    s = record.get("side")
    if not isinstance(s, dict):
        return "no side"
    scores, completions, tokens = s.get("scores"), s.get("completions"), s.get("tokens")
    exits, pass_at, metric = s.get("exit_layers"), s.get("pass_at"), s.get("metric")
    n = len(scores) if isinstance(scores, list) else -1
    if problems is not None and n != problems:
        return f"{n} problems' scores, the task has {problems}"
    if (
        samples is not None
        and isinstance(completions, list)
        and any(isinstance(c, list) and len(c) != samples for c in completions)
    ):
        return f"a problem without {samples} completions (eval.samples)"
    bounded = metric == "pass@1"  # a fraction; a harness metric may be any number (BLEU, a difference)
    checks = (
        n >= 1 and all(_number(x) and (not bounded or 0 <= x <= 1) for x in scores),
        completions == [] or _nested(completions, n, str, depth=2),  # a harness task keeps no completions
        tokens == [] or _nested(tokens, n, int, depth=3),
        isinstance(exits, list) and all(_int(x) and x >= 0 for x in exits),
        isinstance(pass_at, dict) and all(k.isdigit() and _number(v) and 0 <= v <= 1 for k, v in pass_at.items()),
        isinstance(metric, str),
        s.get("isolation") is None or isinstance(s.get("isolation"), str),
        s.get("stopped_at") is None,
    )
    if not all(checks):
        return "a field of the wrong type, length or range"
    if metric == "pass@1" and "1" in pass_at and abs(pass_at["1"] - sum(scores) / n) > 1e-9:
        return f"pass@1 {pass_at['1']} is not its scores' mean {sum(scores) / n}"
    return Side(
        scores=[float(x) for x in scores],
        completions=completions,
        tokens=tokens,
        exit_layers=exits,
        pass_at={int(k): float(v) for k, v in pass_at.items()},
        metric=metric,
        isolation=s.get("isolation"),
    )


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _nested(value, n: int, leaf: type, depth: int) -> bool:
    """A list of ``n`` lists (of lists ...) ``depth`` deep, ending in ``leaf`` values; empty inner lists allowed."""
    if not isinstance(value, list) or len(value) != n:
        return False

    def ok(v, d: int) -> bool:  # v: lists d deep, then leaves
        if d == 0:
            return isinstance(v, leaf) and not isinstance(v, bool)
        return isinstance(v, list) and all(ok(x, d - 1) for x in v)

    return all(ok(v, depth - 1) for v in value)
