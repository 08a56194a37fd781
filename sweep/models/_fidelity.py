"""The fidelity check every model load runs: are the adapter's parts the model's own?

On a few tokens (milliseconds on a tiny model) it compares, each as the largest absolute
difference over the largest magnitude of the reference:

- (a) lens: the logit lens at layer L (final norm, head, logit transforms) against the model's own
  logits over the same forward;
- (b) K/V: per attention layer, the K/V a fill computes from that layer's own input against what the
  layer itself cached for that position in a full-depth step: the fast path's stacked projection
  where the model type has one, else (or when it is not exact) the generic fill through the layer's
  own modules; the path that passes is the one the engine uses;
- (c) step: a decode step as the engine runs it (a cache from a prefill, the fill's layer wrappers
  installed) against the model's own forward over the whole sequence;
- (d) batch: a left-padded batch of two prompts of different lengths, prefilled and stepped once,
  against each prompt decoded alone (a state-space model's own padding may not be exact);
- (e) rollback: self-speculation's cache moves on the model's own cache (``Adapter.new_cache(record=...)``: past
  recording on sliding-window and state-space layers): after a prefill, drafting 3 tokens one step at a time and
  rolling back, then verifying them in one pass and rolling back to 1 accepted, the cache and the next step equal a
  fresh forward over the accepted sequence (tolerance 1e-5 in float32). Its prompt runs past the smallest sliding
  window where that window is at most ``ROLLBACK_BEYOND`` positions (a tiny model's); a longer window is checked
  below it, the check's cost kept to milliseconds.

(a) failing refuses everything that reads the lens (every exiting gate, the profile, prefix
self-speculation): gate=full still runs. (b) failing refuses kv_policy=propagate; full still works.
(c) failing refuses the model. (d) failing refuses bench.batch_size > 1. (e) failing refuses self-speculation.
Tolerances are per dtype:
the two sides of each comparison run the same arithmetic in a different order, so they agree to a
few units of the dtype's rounding.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

# the largest relative difference each comparison may show, per dtype
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}
PROMPT = (5, 17, 3, 42, 7, 11, 29)  # token ids of the check (taken modulo the vocabulary)
ROLLBACK_TOLERANCE = {torch.float32: 1e-5}  # (e), where it is tighter than TOLERANCE
ROLLBACK_BEYOND = 256  # (e) runs past a sliding window of at most this many positions


@dataclass(frozen=True)
class Fidelity:
    """What the check measured: each comparison's largest relative error (None where it does not
    apply: no attention layer has K/V to fill), the tolerance, and the K/V path that passed."""

    lens_err: float
    kv_err: float | None
    step_err: float
    batch_err: float
    tolerance: float
    kv_path: str | None  # fast | generic | None (no fill is exact, or the model keeps recurrent state)
    kv_refusal: str | None = None  # why kv_policy=propagate is refused
    rollback_err: float | None = None  # (e); None: the check could not run (its error in rollback_refusal)
    rollback_tolerance: float = 1e-5
    rollback_refusal: str | None = None

    @property
    def rollback_ok(self) -> bool:
        return self.rollback_err is not None and self.rollback_err <= self.rollback_tolerance

    @property
    def lens_ok(self) -> bool:
        return self.lens_err <= self.tolerance

    @property
    def step_ok(self) -> bool:
        return self.step_err <= self.tolerance

    @property
    def batch_ok(self) -> bool:
        return self.batch_err <= self.tolerance

    def columns(self) -> dict:
        return {
            "adapter_path": self.kv_path or "none",
            "fidelity_lens_err": self.lens_err,
            "fidelity_kv_err": self.kv_err,
            "fidelity_step_err": self.step_err,
            "fidelity_batch_err": self.batch_err,
            "fidelity_rollback_err": self.rollback_err,
        }


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 when both are 0), in float32."""
    a32, b32 = a.float(), b.float()
    scale = float(b32.abs().max())
    diff = float((a32 - b32).abs().max())
    return diff / scale if scale > 0 else diff


class _Never:
    """A step state whose rows never exit (check (c): hooks and wrappers installed, nothing fired)."""

    exit_layer = None

    def fill_source(self, layer: int):
        return None


class _FromInputs:
    """Every row has exited before layer 1, and layer l fills from its own input in a full-depth step."""

    exit_layer = 0

    def __init__(self, inputs: list[torch.Tensor]) -> None:
        self.inputs = inputs

    def fill_source(self, layer: int):
        return None, self.inputs[layer - 1]


@torch.inference_mode()
def check(adapter, device: torch.device) -> Fidelity:
    """Run the three comparisons on ``adapter``'s model; sets ``adapter.kv_path``."""
    vocab = adapter.lm_head.weight.shape[0]
    ids = torch.tensor([[t % vocab for t in PROMPT]], device=device)
    tol = TOLERANCE.get(adapter.lm_head.weight.dtype, 1e-2)

    with adapter.capture_hidden() as hs:  # the model's own forward over the whole sequence, no cache
        whole = adapter.model(input_ids=ids, use_cache=False).logits[:, -1]
    lens_err = _lens_err(adapter, hs[-1][:, -1], whole, tol)
    del hs

    cache = adapter.new_cache()
    adapter.forward(ids[:, :-1], cache)
    step_err = _step_err(adapter, ids[:, -1:], _copy(cache), whole)
    kv_err, kv_path, refusal = _kv(adapter, ids[:, -1:], cache, tol)
    adapter.kv_path = kv_path
    rollback_tol = min(tol, ROLLBACK_TOLERANCE.get(adapter.lm_head.weight.dtype, tol))
    rollback_err, rollback_refusal = _rollback(adapter, device, vocab)
    return Fidelity(
        lens_err,
        kv_err,
        step_err,
        _batch_err(adapter, ids),
        tol,
        kv_path,
        refusal,
        rollback_err,
        rollback_tol,
        rollback_refusal,
    )


def _rollback(adapter, device: torch.device, vocab: int) -> tuple[float | None, str | None]:
    """(e): draft 3 tokens step by step and roll back; verify them in one pass and roll back to 1 accepted; the
    next step's logits and every layer's state against a fresh forward over the accepted sequence."""
    window = min((w for w in _windows(adapter.model.config) if w <= ROLLBACK_BEYOND), default=None)
    length = len(PROMPT) if window is None else window + 5
    prompt = [PROMPT[i % len(PROMPT)] * (i + 1) % vocab for i in range(length)]
    token, drafts, correction = 13 % vocab, [31 % vocab, 37 % vocab, 41 % vocab], 43 % vocab

    def ids(values) -> torch.Tensor:
        return torch.tensor([list(values)], device=device)

    try:
        cache = adapter.new_cache(record=len(drafts) + 1)
        adapter.forward(ids(prompt), cache)
        adapter.crop_cache(cache, length)
        for t in [token, *drafts[:-1]]:  # drafting: one step per draft
            adapter.forward(ids([t]), cache)
        adapter.crop_cache(cache, length)
        adapter.forward(ids([token, *drafts]), cache, logits_to_keep=0)  # verification: one pass
        adapter.crop_cache(cache, length + 2)  # 1 draft accepted: the token and that draft kept
        rolled = adapter.forward(ids([correction]), cache)[:, -1]
        fresh_cache = adapter.new_cache()
        adapter.forward(ids([*prompt, token, drafts[0]]), fresh_cache)
        fresh = adapter.forward(ids([correction]), fresh_cache)[:, -1]
    except (RuntimeError, ValueError, TypeError, AttributeError, IndexError) as exc:
        return None, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"
    return max(rel_err(rolled, fresh), _state_err(cache, fresh_cache)), None


def _windows(config) -> list[int]:
    """The model's sliding-window sizes (its text config's), none for a model without."""
    config = getattr(config, "text_config", None) or config
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not window or (types is not None and not any("sliding" in str(t) for t in types)):
        return []
    return [int(window)]


def _state_err(cache, fresh) -> float:
    """The largest relative difference between two caches' states: each layer's K/V over the positions both hold,
    its recurrent and convolution states."""
    worst = 0.0
    for mine, theirs in zip(cache.layers, fresh.layers):
        for name in ("keys", "values"):
            a, b = getattr(mine, name, None), getattr(theirs, name, None)
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 4 and b.shape[-2]:
                n = min(a.shape[-2], b.shape[-2])
                worst = max(worst, rel_err(a[..., -n:, :], b[..., -n:, :]))
        for name in ("recurrent_states", "conv_states"):
            a, b = getattr(mine, name, None), getattr(theirs, name, None)
            if isinstance(a, dict) and isinstance(b, dict):
                for key in a:
                    x, y = a.get(key), b.get(key)
                    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                        n = min(x.shape[-1], y.shape[-1])
                        worst = max(worst, rel_err(x[..., -n:], y[..., -n:]))
    return worst


def _lens_err(adapter, h_last: torch.Tensor, whole: torch.Tensor, tol: float) -> float:
    """(a), with the config-named logit transforms the model really applies: all of them, else the
    largest subset that reproduces its logits (a vision-language wrapper may drop its text model's
    softcapping); ``adapter.scales`` keeps that subset. Nothing reproduces them: the full list stays."""
    named = adapter.scales
    subsets = [c for n in range(len(named), -1, -1) for c in itertools.combinations(named, n)]
    errors = []
    for subset in subsets:
        adapter.scales = tuple(subset)
        errors.append(rel_err(adapter.lens(h_last), whole))
        if errors[-1] <= tol:
            return errors[-1]
    adapter.scales = named
    return errors[0]


def _copy(cache):
    import copy

    return copy.deepcopy(cache)


def _step_err(adapter, token: torch.Tensor, cache, whole: torch.Tensor) -> float:
    """(c): one decode step from a prefilled cache, with the generic fill's wrappers in place."""
    with adapter.filling(_Never()):
        logits = adapter.forward(token, cache)[:, -1]
    return rel_err(logits, whole)


def _batch_err(adapter, ids: torch.Tensor) -> float:
    """(d): rows of a left-padded batch (a prefill, then one step on each row's greedy token) against
    each row decoded alone."""
    from sweep.models._padding import left_pad

    rows = [ids[0, :3].tolist(), ids[0].tolist()]
    alone = []
    for row in rows:
        cache = adapter.new_cache()
        first = adapter.forward(torch.tensor([row], device=ids.device), cache)[:, -1]
        second = adapter.forward(first.argmax(-1, keepdim=True), cache)[:, -1]
        alone.append((first, second))
    batch = left_pad(rows, ids.device)
    cache = adapter.new_cache()
    first = adapter.forward(batch.ids, cache, attention_mask=batch.mask, position_ids=batch.positions)[:, -1]
    mask = torch.cat([batch.mask, batch.mask.new_ones((len(rows), 1))], dim=1)
    positions = batch.lengths.to(ids.device)[:, None]
    token = torch.cat([a[0].argmax(-1, keepdim=True) for a in alone])  # each row's own next token
    second = adapter.forward(token, cache, attention_mask=mask, position_ids=positions)[:, -1]
    return max(max(rel_err(first[i : i + 1], a[0]), rel_err(second[i : i + 1], a[1])) for i, a in enumerate(alone))


def _kv(adapter, token: torch.Tensor, cache, tol: float) -> tuple[float | None, str | None, str | None]:
    """(b): the K/V path that reproduces every attention layer's own cache, with its error."""
    if adapter.kind != "attention":
        what = "state-space layers keep" if adapter.kind == "ssm" else "its state-space layers keep"
        return None, None, f"{what} a recurrent state that a K/V fill cannot set"
    inputs: list[torch.Tensor] = []
    handles = [
        layer.register_forward_pre_hook(
            lambda _m, a, k: inputs.append(a[0] if a else k["hidden_states"]), with_kwargs=True
        )
        for layer in adapter.layers
    ]
    own = _copy(cache)
    try:
        with adapter.capture_rope() as rope:  # (the fast path reads the RoPE of this step)
            adapter.forward(token, own)
    finally:
        for handle in handles:
            handle.remove()
    layers = adapter.attention_layers()
    errors = {}
    if adapter.fast is not None:
        errors["fast"] = _fast_err(adapter, inputs, own, layers, rope)
    if "fast" in errors and errors["fast"] <= tol:
        return errors["fast"], "fast", None
    errors["generic"] = _generic_err(adapter, token, cache, inputs, own, layers)
    if errors["generic"] <= tol:
        return errors["generic"], "generic", None
    worst = min(errors.values())
    return worst, None, f"no K/V fill reproduces the layers' own cache (largest relative error {worst:.3g})"


def _fast_err(adapter, inputs, own, layers: list[int], rope: dict) -> float:
    try:
        stacked = adapter.stacked_kv()
    except (AttributeError, TypeError, ValueError, RuntimeError):  # the fast path's parts are not there
        return float("inf")
    worst = 0.0
    for j in layers:
        try:
            k, v = stacked.project(inputs[j][:, -1:], j, j + 1, rope)
        except (KeyError, RuntimeError, TypeError, IndexError):
            return float("inf")
        ref_k, ref_v = adapter.last_kv(own, j)
        worst = max(worst, rel_err(k[:, :, 0].transpose(1, 2), ref_k), rel_err(v[:, :, 0].transpose(1, 2), ref_v))
    return worst


def _generic_err(adapter, token, cache, inputs, own, layers: list[int]) -> float:
    from sweep.models._adapter import StepExit
    from sweep.models._layerfill import NoKVWritten

    filled = _copy(cache)
    try:
        with adapter.filling(_FromInputs(inputs)):
            adapter.forward(token, filled)
    except NoKVWritten:
        return float("inf")
    except StepExit:  # the stop after the last layer's fill
        pass
    worst = 0.0
    for j in layers:
        (k, v), (ref_k, ref_v) = adapter.last_kv(filled, j), adapter.last_kv(own, j)
        worst = max(worst, rel_err(k, ref_k), rel_err(v, ref_v))
    return worst
