"""Readouts on disk: written atomically with their digest, loaded only for the model they were fitted to and
checked disjoint from the prompts they are evaluated on."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

import torch

from sweep.errors import ConfigError
from sweep.trace.readouts import LENSES, META, TENSORS, Readouts, content_digest, text_digest


def save_readouts(readouts: Readouts, out_dir, *, root=None, key: str = "fit.out") -> Path:
    """Write ``<out_dir>/<model>/<digest[:16]>.safetensors`` atomically (a temporary file in the same
    directory, renamed into place); returns its path. Only the content the digest names is written,
    and only inside ``root`` (default ``out_dir``; symbolic links resolved, else a ConfigError naming
    ``key``)."""
    from safetensors.torch import save_file

    from sweep.config.paths import check_name, inside

    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in readouts.weights.items()}
    if content_digest(tensors, readouts.meta) != readouts.digest:
        raise ValueError("save_readouts: the tensors do not match the digest (save the fitted readouts, not a copy)")
    path = Path(out_dir).expanduser() / check_name("model", readouts.model) / f"{readouts.digest[:16]}.safetensors"
    inside(out_dir if root is None else root, path, key=key)  # before mkdir, which would follow a planted link
    path.parent.mkdir(parents=True, exist_ok=True)
    from sweep.store import atomic_write

    return atomic_write(
        path, lambda tmp: save_file(tensors, str(tmp), metadata={**readouts.meta, "digest": readouts.digest})
    )


class ReadoutsCache:
    """The readouts a session verified and moved to its model's device, one file at a time (a worker
    that moves on to other readouts drops the last), keyed by the file (path, size, mtime) and model."""

    def __init__(self) -> None:
        self.kept: dict[tuple, Readouts] = {}

    def get(self, ident: tuple) -> Readouts | None:
        return self.kept.get(ident)

    def put(self, ident: tuple, readouts: Readouts) -> None:
        self.kept = {ident: readouts}


def load_readouts(path, lm, key: str = "gate.readouts", cache: ReadoutsCache | None = None) -> Readouts:
    """The readouts at ``path``, verified (content against its digest and name, fitted to ``lm``), on
    lm's device with translators in lm's dtype. Any problem is a one-line ConfigError naming ``key``.
    With a ``cache`` (a session's) trials share one load per file (its path, size and mtime) and model."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
        ident = (str(p.resolve()), st.st_size, st.st_mtime_ns, lm.content_hash, str(lm.device), str(lm.dtype))
    except OSError:
        ident = None
    if cache is not None and ident is not None and (hit := cache.get(ident)) is not None:
        return hit
    readouts = _load_readouts(path, lm, key)
    if cache is not None and ident is not None:
        cache.put(ident, readouts)
    return readouts


def _load_readouts(path, lm, key: str) -> Readouts:
    from safetensors import SafetensorError, safe_open

    where = f"{key}={path}"
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"{where}: no such file (`sweep fit` writes readouts)")
    try:
        with safe_open(str(p), framework="pt") as f:
            meta = dict(f.metadata() or {})
            weights = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:120]
        raise ConfigError(f"{where}: not a readable safetensors file ({type(exc).__name__}: {first})") from None
    missing = [k for k in (*META, "digest") if k not in meta] + [k for k in TENSORS if k not in weights]
    if missing:
        raise ConfigError(f"{where}: not a readouts file from `sweep fit` (missing {', '.join(missing)})")
    stored = meta.pop("digest")
    stem = p.name.removesuffix(".safetensors")
    if content_digest(weights, meta) != stored or (re.fullmatch("[0-9a-f]{16}", stem) and stem != stored[:16]):
        raise ConfigError(f"{where}: was modified after it was written (its content no longer hashes to its name)")
    if meta["model_hash"] != lm.content_hash:
        raise ConfigError(
            f"{where}: fitted to model {meta['model']} (hash {meta['model_hash'][:20]}...), not {lm.name} "
            f"(hash {lm.content_hash[:20]}...); fit readouts for this model with `sweep fit`"
        )
    problem = _shape_problem(weights, meta, lm.num_layers, lm.adapter.config.hidden_size)
    if problem:
        raise ConfigError(f"{where}: {problem}")
    return Readouts(weights, meta, stored, path=p, final_norm=lm.adapter.norm).to(lm.device, lm.dtype)


def _meta_problem(meta: dict) -> str | None:
    """Why ``meta`` is not metadata `sweep fit` writes (a digest recomputed over edited metadata still
    passes the digest check): the types, not only the digest, are checked."""
    try:
        ints = {k: int(meta[k]) for k in ("num_layers", "hidden", "gen_tokens")}
        ids, digests = json.loads(meta["prompt_ids"]), json.loads(meta["prompt_digests"])
    except (ValueError, TypeError):
        return "its metadata is not readouts metadata (num_layers, hidden, gen_tokens: integers; prompt_ids: JSON)"
    if ints["num_layers"] < 2 or ints["hidden"] < 1 or ints["gen_tokens"] < 1:
        return f"its metadata gives impossible sizes ({ints})"
    if not (isinstance(ids, list) and ids and all(isinstance(i, str) for i in ids)):
        return "its metadata's prompt_ids is not a non-empty JSON list of prompt ids"
    if not (isinstance(digests, list) and len(digests) == len(ids) and all(_is_digest(d) for d in digests)):
        return "its metadata's prompt_digests is not a JSON list of one sha256 per prompt id"
    return None


def _is_digest(value) -> bool:
    return isinstance(value, str) and re.fullmatch("[0-9a-f]{64}", value) is not None


def _shape_problem(weights: dict, meta: dict, num_layers: int, hidden: int) -> str | None:
    problem = _meta_problem(meta)
    if problem:
        return problem
    fitted = (int(meta["num_layers"]), int(meta["hidden"]))
    if fitted != (num_layers, hidden):
        return f"fitted to {fitted[0]} layers x {fitted[1]} hidden, the model has {num_layers} x {hidden}"
    n = num_layers - 1
    expected = dict(zip(TENSORS, [(n, hidden, hidden), (n, hidden), *[(n, hidden + 2), (n,)] * len(LENSES)]))
    bad = [f"{k} {tuple(weights[k].shape)}" for k, shape in expected.items() if tuple(weights[k].shape) != shape]
    return f"tensors of the wrong shape: {', '.join(bad)}" if bad else None


def readouts_for(path, lm, prompts: Sequence, key: str, cache: ReadoutsCache | None = None) -> Readouts:
    """The readouts at ``path`` for evaluating ``lm`` on ``prompts``: loaded and verified for the
    model (``load_readouts``, errors naming ``key``; from ``cache`` when it holds them) and disjoint
    from its fitting set."""
    readouts = load_readouts(path, lm, key=key, cache=cache)
    check_disjoint(readouts, prompts, key="prompts")
    return readouts


def check_disjoint(readouts: Readouts, prompts: Sequence, key: str = "prompts") -> None:
    """Refuse (ConfigError) evaluation ``prompts`` that overlap the readouts' fitting set, by id or by
    text: readouts judged on the prompts they were fitted to would flatter themselves."""
    ids, digests = set(readouts.prompt_ids), set(readouts.prompt_digests)
    overlap = [p.id for p in prompts if p.id in ids or text_digest(p.text) in digests]
    if overlap:
        shown = ", ".join(overlap[:3]) + (", ..." if len(overlap) > 3 else "")
        fitted = readouts.prompt_ids
        span = f"{fitted[0]} .. {fitted[-1]}, " if fitted else ""
        raise ConfigError(
            f"{key}: {len(overlap)} of {len(prompts)} evaluation prompts ({shown}) are in the readouts' fitting set "
            f"({readouts.prompt_set}: {span}{len(fitted)} prompts); evaluate on others (prompts.start, prompts.n)"
        )
