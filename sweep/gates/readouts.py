"""Fitted readouts as the gates read them: tuned-lens translators and exit classifiers (`sweep fit` fits them,
``sweep.trace.readouts``), one content-addressed safetensors file with their provenance in its metadata.

``load_readouts`` refuses a file changed since it was written or fitted to another model, and
``check_disjoint`` keeps the fitting prompts out of an evaluation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Sequence

import torch

from sweep.errors import ConfigError
from sweep.gates.signals import cosine_prev, saturation_delta
from sweep.gates.spec import LENSES

FEATURES = "final_norm(h),log_delta,cos_prev"
TENSORS = ("translator.weight", "translator.bias", *(f"classifier.{n}.{p}" for n in LENSES for p in ("weight", "bias")))
META = ("model", "model_hash", "num_layers", "hidden", "prompt_set", "prompt_ids", "prompt_digests", "gen_tokens")
_UNHASHED = ("created_at", "fit_seconds")  # what differs between two identical fits
_LOG_EPS = 1e-6  # log(delta + eps): delta is 0 where a layer changes nothing


def _rms(h: torch.Tensor) -> torch.Tensor:
    """r(h): the root mean square over hidden (float32, clamped away from 0), shape (..., 1)."""
    return h.float().square().mean(dim=-1, keepdim=True).sqrt().clamp_min(1e-12)


def features(norm: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, h_prev: torch.Tensor) -> torch.Tensor:
    """The classifiers' features of rows h_l, h_{l-1} (..., H): final_norm(h_l), log(delta + 1e-6) and
    cos(h_l, h_{l-1}) (the saturation and cosine gates' own signals); float32, (..., H + 2)."""
    log_delta = torch.log(saturation_delta(h, h_prev) + _LOG_EPS)
    return torch.cat([norm(h).float(), log_delta[..., None], cosine_prev(h, h_prev)[..., None]], dim=-1)


def text_digest(text: str) -> str:
    """sha256 of a prompt's text: how the fitting set is recognised under another id."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, eq=False)
class Readouts:
    """Fitted readouts of one model: translators D_l, b_l for layers 1..L-1 (``translator.weight``
    (L-1, H, H), ``translator.bias`` (L-1, H)), exit classifiers per lens (``classifier.<lens>.weight``
    (L-1, H+2), ``classifier.<lens>.bias`` (L-1,)), their provenance (``meta``, all str) and the
    content digest. ``final_norm`` is the model's own final norm, bound by ``fit_readouts`` and
    ``load_readouts``: the classifiers' features start with it."""

    weights: dict[str, torch.Tensor]
    meta: dict[str, str]
    digest: str
    path: Path | None = None
    final_norm: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, repr=False)
    _identity: tuple[bool, ...] = field(init=False, repr=False)  # per layer 1..L-1: D_l = 0 and b_l = 0

    def __post_init__(self) -> None:
        d, b = self.weights["translator.weight"], self.weights["translator.bias"]
        object.__setattr__(self, "_identity", tuple(((d == 0).flatten(1).all(1) & (b == 0).all(1)).tolist()))

    model_hash = property(lambda self: self.meta["model_hash"])
    model = property(lambda self: self.meta["model"])
    num_layers = property(lambda self: int(self.meta["num_layers"]))
    hidden = property(lambda self: int(self.meta["hidden"]))
    prompt_set = property(lambda self: self.meta["prompt_set"])
    prompt_ids = property(lambda self: list(json.loads(self.meta["prompt_ids"])))
    prompt_digests = property(lambda self: list(json.loads(self.meta["prompt_digests"])))
    gen_tokens = property(lambda self: int(self.meta["gen_tokens"]))

    def translate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """The tuned lens's input for h_l (..., H): h + r(h) (x D_l^T + b_l), x = h / r(h). ``h`` itself
        at layer L and wherever the translator is the identity, so the tuned lens is then the logit lens."""
        if layer < 1:
            raise ValueError(f"translate: layer {layer}; layers are 1..{len(self._identity) + 1}")
        if layer > len(self._identity) or self._identity[layer - 1]:
            return h
        d, b = self.weights["translator.weight"][layer - 1], self.weights["translator.bias"][layer - 1]
        r = _rms(h)
        x = h.float() / r
        return (h.float() + r * (x.to(d.dtype) @ d.T + b).float()).to(h.dtype)

    def lens(self, adapter, layer: int, h: torch.Tensor, lens: str) -> torch.Tensor:
        """Logits of h_l: ``logit``, the model's own final norm and head; ``tuned``, layer l's translator first."""
        if lens == "tuned":
            return adapter.lens(self.translate(layer, h))
        if lens != "logit":
            raise ValueError(f"lens={lens!r}: one of {', '.join(LENSES)}")
        return adapter.lens(h)

    def classifier_prob(self, layer: int, h: torch.Tensor, h_prev: torch.Tensor, lens: str) -> torch.Tensor:
        """p(layer l's top-1 through ``lens`` is the final layer's) per row of h_l, h_{l-1} (..., H),
        float32 (...,); 1 at layer L, which is the final layer."""
        if layer >= self.num_layers:
            return torch.ones(h.shape[:-1], device=h.device)
        if self.final_norm is None:
            raise RuntimeError("classifier_prob: readouts not bound to a model (use fit_readouts or load_readouts)")
        w, b = self.weights[f"classifier.{lens}.weight"][layer - 1], self.weights[f"classifier.{lens}.bias"][layer - 1]
        return torch.sigmoid(features(self.final_norm, h, h_prev) @ w.float() + b.float())

    def to(self, device, dtype) -> Readouts:
        """A copy on ``device``: translators in ``dtype`` (the model's), classifiers in float32."""
        moved = {
            k: v.to(device=device, dtype=dtype if k.startswith("translator.") else torch.float32)
            for k, v in self.weights.items()
        }
        return dataclasses.replace(self, weights=moved)


def content_digest(weights: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
    """sha256 hex of the tensors (name, dtype, shape and bytes, in sorted name order) and of ``meta``
    but for created_at and fit_seconds: two identical fits get one digest, hence one path."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        t = weights[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    digest.update(json.dumps({k: v for k, v in meta.items() if k not in _UNHASHED}, sort_keys=True).encode())
    return digest.hexdigest()


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


def check_readouts_file(path, key: str, shape: tuple[int, int] | None = None, prompts: Sequence = ()) -> None:
    """Before any model loads: ``path`` is a regular file holding a readouts file's header (its metadata and
    tensors named as `sweep fit` writes them), fitted to a model of ``shape`` (layers, hidden) when the model's
    shape is known before it loads (``sweep.models.shape_before_load``), and fitted to none of ``prompts`` ((id,
    text, ...) as ``read_prompts`` gives them: ``check_disjoint``); one ConfigError line naming ``key`` otherwise.
    Its content (the digest) and its fit to the loaded model are checked when it loads (``load_readouts``)."""
    meta, _ = _read_readouts(path, key, tensors=False)
    problem = None if shape is None or _meta_problem(meta) is not None else _fit_problem(meta, *shape)
    if problem:
        raise ConfigError(f"{key}={path}: {problem}")
    if prompts and _meta_problem(meta) is None:  # (what ``check_disjoint`` reads of readouts, from the header)
        ids, digests = json.loads(meta["prompt_ids"]), json.loads(meta["prompt_digests"])
        fitted = SimpleNamespace(prompt_set=meta["prompt_set"], prompt_ids=ids, prompt_digests=digests)
        check_disjoint(fitted, [SimpleNamespace(id=p[0], text=p[1]) for p in prompts])


def _read_readouts(path, key: str, *, tensors: bool = True) -> tuple[dict, dict]:
    """The metadata and the tensors (only their names unless ``tensors``) of the readouts file at ``path``."""
    from safetensors import SafetensorError, safe_open

    where = f"{key}={path}"
    p = Path(path).expanduser()
    if not p.is_file():
        if p.exists():  # a FIFO, a directory, a device: never opened (a FIFO would block the read)
            raise ConfigError(f"{where}: not a regular file; readouts are a safetensors file `sweep fit` writes")
        raise ConfigError(f"{where}: no such file (`sweep fit` writes readouts)")
    try:
        with safe_open(str(p), framework="pt") as f:
            meta = dict(f.metadata() or {})
            weights = {k: f.get_tensor(k) if tensors else None for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:120]
        raise ConfigError(f"{where}: not a readable safetensors file ({type(exc).__name__}: {first})") from None
    missing = [k for k in (*META, "digest") if k not in meta] + [k for k in TENSORS if k not in weights]
    if missing:
        raise ConfigError(f"{where}: not a readouts file from `sweep fit` (missing {', '.join(missing)})")
    return meta, weights


def _load_readouts(path, lm, key: str) -> Readouts:
    where = f"{key}={path}"
    p = Path(path).expanduser()
    meta, weights = _read_readouts(path, key)
    stored = meta.pop("digest")
    stem = p.name.removesuffix(".safetensors")
    if content_digest(weights, meta) != stored:
        raise ConfigError(f"{where}: was modified after it was written (its content no longer hashes to its digest)")
    if re.fullmatch("[0-9a-f]{16}", stem) and stem != stored[:16]:
        raise ConfigError(
            f"{where}: its content is intact, but a name of 16 hex digits must be its digest's: rename it "
            f"{stored[:16]}.safetensors, as `sweep fit` named it (or give it a name of your own)"
        )
    if meta["model_hash"] != lm.content_hash:
        raise ConfigError(
            f"{where}: fitted to model {meta['model']} (hash {meta['model_hash'][:20]}...), not {lm.name} "
            f"(hash {lm.content_hash[:20]}...); fit readouts for this model with `sweep fit`"
        )
    problem = _shape_problem(weights, meta, lm.num_layers, lm.adapter.config.hidden_size)
    if problem:
        raise ConfigError(f"{where}: {problem}")
    nonfinite = sorted(k for k, t in weights.items() if t.is_floating_point() and not bool(t.isfinite().all()))
    if nonfinite:
        raise ConfigError(f"{where}: tensors with non-finite weights (NaN or inf): {', '.join(nonfinite)}")
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


def _fit_problem(meta: dict, num_layers: int, hidden: int) -> str | None:
    """Why readouts of metadata ``meta`` (checked by ``_meta_problem``) do not fit a model of ``num_layers`` x
    ``hidden``; None when they do."""
    fitted = (int(meta["num_layers"]), int(meta["hidden"]))
    if fitted != (num_layers, hidden):
        return f"fitted to {fitted[0]} layers x {fitted[1]} hidden, the model has {num_layers} x {hidden}"
    return None


def _shape_problem(weights: dict, meta: dict, num_layers: int, hidden: int) -> str | None:
    problem = _meta_problem(meta)
    if problem:
        return problem
    problem = _fit_problem(meta, num_layers, hidden)
    if problem:
        return problem
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
            f"({readouts.prompt_set}: {span}{len(fitted)} prompts); evaluate on others ({_OTHERS.get(key, key)})"
        )


# where a caller of check_disjoint picks other prompts: the keys that move its evaluation set
_OTHERS = {
    "prompts": "prompts.start, prompts.n",
    "calibrate.heldout_prompts": "calibrate.heldout_prompts: another set, or readouts fitted on another",
}
