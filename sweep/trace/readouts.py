"""Learned readouts of h_l: tuned-lens translators and exit classifiers, fitted by `sweep fit`.

A translator (tuned lens, Belrose et al. 2023, arXiv 2303.08112) is one affine map per layer, fitted
so that the model's own lens of the translated h_l matches the final layer; at the identity it is the
logit lens bit for bit. An exit classifier (CALM, Schuster et al. 2022, arXiv 2207.07061) is a logistic
regression on h_l predicting whether layer l's top-1 already is the final one. Both are fitted from the
states the engine decides on (``sweep.decode.states.decode_states``), streamed one prompt at a time.

Readouts are one content-addressed safetensors file with their provenance in its metadata (``save_readouts``
writes it; ``sweep.gates.readouts`` reads it back, as the gates use it).
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from sweep import progress
from sweep.errors import ConfigError
from sweep.gates.readouts import FEATURES, TENSORS, Readouts, content_digest, features, text_digest
from sweep.gates.spec import LENSES

log = logging.getLogger("sweep.trace.readouts")

_LBFGS_ITERS = 2000  # iterations at most: the classifiers' convex problem solved until its gradient is flat
_FLAT = 1e-6  # the largest gradient entry of a solved classifier (a warning above it)
_LENS_ELEMENTS = 1 << 25  # logits held at once while scoring (rows x vocab)


def _unit(h: torch.Tensor) -> torch.Tensor:
    """h / r(h) in float64: the translators' regression variables."""
    h = h.double()
    return h / h.square().mean(dim=-1, keepdim=True).sqrt().clamp_min(1e-12)


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

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp), metadata={**readouts.meta, "digest": readouts.digest})
        os.chmod(tmp, 0o666 & ~_umask())  # safetensors makes its file owner-only; readouts are shared as rows are

    return atomic_write(path, write)


def _umask() -> int:
    """The process's umask: read from /proc where it is shown (setting it to read it would change it for every
    thread meanwhile), else set and restored."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# --- fitting ------------------------------------------------------------------------------------------------------


def fit_readouts(
    lm,
    prompts: Sequence,
    *,
    gen_tokens: int,
    ridge: float,
    l2: float,
    seed: int,
    prompt_set: str,
    prompt_start: int | None = None,
    log_every: int = 1,
) -> Readouts:
    """Translators and exit classifiers of ``lm`` fitted on ``prompts`` and ``gen_tokens`` greedy tokens
    each. The translators are a closed-form ridge regression (penalty ``ridge`` on D, toward the identity; b free)
    on every position but each sequence's first; the classifiers an L2-penalised (``l2``) logistic
    regression on the decode positions (where gates decide). ``meta["fit_summary"]`` holds per-layer
    figures on the fitting set (top-1 agreement, KL(final || lens), classifier accuracy). The tensors
    are float32 on the CPU, as saved; ``.to(lm.device, lm.dtype)`` readies them for the engine."""
    if not prompts:
        raise ConfigError("prompts: no prompts to fit readouts on")
    t0 = time.perf_counter()
    states, final, xtx, xty, samples = _stream(lm, prompts, gen_tokens, log_every)
    weights = dict(zip(("translator.weight", "translator.bias"), _solve_translators(xtx, xty, ridge)))
    hidden = xty.shape[-1]
    n = lm.num_layers - 1  # the classifiers: filled in once the labels are read through the fitted translators
    weights |= {k: torch.zeros(n, hidden + 2) if k.endswith("weight") else torch.zeros(n) for k in TENSORS[2:]}
    draft = Readouts(weights, {"num_layers": str(lm.num_layers)}, "", final_norm=lm.adapter.norm)
    layers = _fit_classifiers(draft.to(lm.device, lm.dtype), lm.adapter, states, final, l2, seed, weights)
    _say_what_it_can_tell(samples, hidden, int(final.numel()), layers, ridge)
    summary = {"prompts": len(prompts), "translator_positions": samples, "decode_positions": int(final.numel())}
    meta = _meta(lm, prompts, hidden, gen_tokens=gen_tokens, ridge=ridge, l2=l2, seed=seed, prompt_set=prompt_set)
    meta["prompt_start"] = "unknown" if prompt_start is None else str(prompt_start)
    meta["fit_summary"] = json.dumps({**summary, "layers": layers})
    meta["fit_seconds"] = f"{time.perf_counter() - t0:.3f}"
    return Readouts(weights, meta, content_digest(weights, meta), final_norm=lm.adapter.norm)


def _say_what_it_can_tell(samples: int, hidden: int, decisions: int, layers: list[dict], ridge: float) -> None:
    """Warn where the fitting set's own figures say little: fewer positions than a translator's unknowns per output
    (hidden + 1; only the ridge makes its answer unique), and classifiers that saw one label only (their accuracy
    1.000 by predicting it)."""
    if samples < hidden + 1:
        log.warning(
            "the translators were fitted on %d positions for %d unknowns per output (hidden %d + 1): %s; their "
            "figures on the fitting set say little (fit more prompts or tokens: prompts.n, fit.gen_tokens)",
            samples,
            hidden + 1,
            hidden,
            f"fit.ridge={ridge:g} alone makes them unique" if ridge > 0 else "with fit.ridge=0 they are not unique",
        )
    one = sorted({r["layer"] for r in layers for lens in LENSES if r[f"top1_{lens}"] in (0.0, 1.0)})
    if one:
        shown = ", ".join(map(str, one[:8])) + (f" and {len(one) - 8} more" if len(one) > 8 else "")
        log.warning(
            "the exit classifiers of layer(s) %s saw one label only on the %d decision positions: their accuracy "
            "says nothing (fit more prompts or tokens)",
            shown,
            decisions,
        )


@torch.inference_mode()
def _stream(lm, prompts: Sequence, gen_tokens: int, log_every: int):
    """Decode each prompt with every layer's states captured and accumulate the translators' normal
    equations in float64: X^T X and X^T (y - x) with X = [x, 1], x = h_l / r(h_l), y = h_L / r(h_L).
    Keeps only the decode positions' states (L+1, N, H) and the final layer's tokens there (N,)."""
    from sweep.decode.states import decode_states

    L, hidden = lm.num_layers, lm.adapter.config.hidden_size
    xtx = torch.zeros(L - 1, hidden + 1, hidden + 1, dtype=torch.float64, device=lm.device)
    xty = torch.zeros(L - 1, hidden + 1, hidden, dtype=torch.float64, device=lm.device)
    kept, finals, samples = [], [], 0
    shown = progress.start("fit: decode", len(prompts))  # one step per prompt
    for i, prompt in enumerate(prompts, start=1):
        t0 = time.perf_counter()
        decoded = decode_states(lm, prompt.input_ids, n_tokens=gen_tokens)
        hs, P = decoded.states, len(prompt.input_ids)
        # position 0's states (the first token's) are outliers of every layer: left out
        x = _unit(torch.stack([h[0, 1:] for h in hs[1:L]]))
        target = _unit(hs[L][0, 1:])
        xa = torch.cat([x, torch.ones_like(x[..., :1])], dim=-1)
        xtx += xa.transpose(1, 2) @ xa
        xty += xa.transpose(1, 2) @ (target - x)
        samples += x.shape[1]
        kept.append(torch.stack([h[0, P - 1 :] for h in hs]))
        finals.append(torch.tensor(decoded.greedy, device=lm.device))
        text = f"{prompt.id}: {P} prompt + {gen_tokens} generated tokens; decode {time.perf_counter() - t0:.2f} s"
        shown.advance(text=text if log_every and (i % log_every == 0 or i == len(prompts)) else None)
    shown.close()
    return torch.cat(kept, dim=1), torch.cat(finals), xtx, xty, samples


def _solve_translators(xtx: torch.Tensor, xty: torch.Tensor, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """D (L-1, H, H) and b (L-1, H) of min ||X [D^T; b] - (y - x)||^2 + ridge ||D||_F^2 (b not penalised),
    solved in float64; least squares keeps a rank-deficient system (ridge 0, few samples) finite."""
    hidden = xty.shape[-1]
    penalty = torch.full((hidden + 1,), float(ridge), dtype=torch.float64)
    penalty[hidden] = 0.0
    a = xtx.cpu() + torch.diag(penalty)
    w = torch.linalg.lstsq(a, xty.cpu(), driver="gelsd").solution  # (L-1, H+1, H)
    return w[:, :hidden].transpose(1, 2).float().contiguous(), w[:, hidden].float().contiguous()


def _fit_classifiers(draft: Readouts, adapter, states, final, l2: float, seed: int, weights: dict) -> list[dict]:
    """Fit each layer's classifier per lens into ``weights`` (labels: that lens's top-1 equals the
    final token); returns the per-layer figures on the fitting set."""
    L, rows = states.shape[0] - 1, []
    shown = progress.start("fit: classifiers", L - 1)  # one step per layer
    for layer in range(1, L):
        with torch.inference_mode():
            labels, kl = _score(draft, adapter, states, final, layer)
            x = features(adapter.norm, states[layer], states[layer - 1])
        row = {"layer": layer}
        for lens in LENSES:
            w, b = _logistic(x, labels[lens], l2, seed)
            weights[f"classifier.{lens}.weight"][layer - 1], weights[f"classifier.{lens}.bias"][layer - 1] = w, b
            predicted = (x.cpu() @ w + b) >= 0
            row |= {
                f"top1_{lens}": round(labels[lens].float().mean().item(), 6),
                f"kl_{lens}": round(kl[lens], 6),
                f"acc_{lens}": round((predicted == labels[lens].cpu()).float().mean().item(), 6),
            }
        rows.append(row)
        shown.advance()
    shown.close()
    return rows


def _score(readouts: Readouts, adapter, states, final, layer: int) -> tuple[dict, dict]:
    """Per lens: whether layer ``layer``'s top-1 is the final token, per decode position, and the mean
    KL(final || lens) in nats (the final layer's distribution: the model's own head on h_L)."""
    L, n = states.shape[0] - 1, states.shape[1]
    chunk = max(1, _LENS_ELEMENTS // adapter.lm_head.weight.shape[0])
    labels: dict[str, list] = {lens: [] for lens in LENSES}
    kl = dict.fromkeys(LENSES, 0.0)
    for s in range(0, n, chunk):
        logp_final = F.log_softmax(adapter.lens(states[L, s : s + chunk]).float(), dim=-1)
        for lens in LENSES:
            z = readouts.lens(adapter, layer, states[layer, s : s + chunk], lens).float()
            labels[lens].append(z.argmax(-1) == final[s : s + chunk])
            kl[lens] += F.kl_div(F.log_softmax(z, -1), logp_final, reduction="sum", log_target=True).item()
    return {k: torch.cat(v) for k, v in labels.items()}, {k: v / n for k, v in kl.items()}


def _logistic(x: torch.Tensor, y: torch.Tensor, l2: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights and bias of a logistic regression with penalty l2 ||w||^2 (bias not penalised): full-batch
    LBFGS in float64 on the CPU from a small seeded start, until the gradient is flat: the problem is convex,
    so the start only seeds it."""
    with torch.inference_mode(False), torch.enable_grad():
        x64, y64 = x.double().cpu().clone(), y.double().cpu().clone()
        gen = torch.Generator().manual_seed(seed)
        w = (1e-3 * torch.randn(x.shape[1], generator=gen, dtype=torch.float64)).requires_grad_()
        b = torch.zeros((), dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS(
            [w, b],
            max_iter=_LBFGS_ITERS,
            max_eval=2 * _LBFGS_ITERS,
            tolerance_grad=1e-10,
            tolerance_change=1e-14,
            history_size=20,
            line_search_fn="strong_wolfe",
        )

        def closure():
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(x64 @ w + b, y64) + l2 * w.square().sum()
            loss.backward()
            return loss

        opt.step(closure)
        closure()
        flat = max(w.grad.abs().max().item(), b.grad.abs().item())
        iterations = opt.state[w].get("n_iter", 0)
    if flat > _FLAT:  # stopped short of the optimum (the cap, or steps too small to change the loss): said
        log.warning(
            "an exit classifier stopped %.1e from flat after %d iterations (at most %d; fit.l2=%g): its weights "
            "are not the optimum; a larger fit.l2 makes the problem better conditioned",
            flat,
            iterations,
            _LBFGS_ITERS,
            l2,
        )
    return w.detach().float(), b.detach().float()


def _meta(lm, prompts: Sequence, hidden: int, **fit) -> dict[str, str]:
    """Provenance: the model, the fitting prompts, the fit's settings and the code that fitted."""
    from sweep.config.provenance import git_sha, library_versions

    prov = lm.provenance()
    versions = library_versions()
    return {
        **{k: str(prov[k]) for k in ("model", "model_source", "model_hash", "family", "num_layers", "device", "dtype")},
        "hidden": str(hidden),
        "prompt_set": str(fit["prompt_set"]),
        "prompt_n": str(len(prompts)),
        "prompt_ids": json.dumps([p.id for p in prompts]),
        "prompt_digests": json.dumps([text_digest(p.text) for p in prompts]),
        **{k: str(fit[k]) for k in ("gen_tokens", "seed")},
        **{k: repr(float(fit[k])) for k in ("ridge", "l2")},
        "features": FEATURES,
        "git_sha": git_sha(),
        **{k: versions[k] for k in ("sweep_version", "torch_version", "transformers_version")},
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


# --- `sweep fit` --------------------------------------------------------------------------------------------------
