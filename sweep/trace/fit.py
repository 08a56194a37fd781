"""`sweep fit`: fit the readouts of a model on a prompt set and write them (``sweep.trace.readouts``)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

from sweep.gates.readouts import Readouts
from sweep.trace.readouts import fit_readouts, save_readouts

log = logging.getLogger("sweep.trace.fit")


def prepare(cfg, session) -> tuple:
    """`sweep fit`'s checks, then its model and prompts from ``session`` (``sweep.bench.session``): the
    prompts file, the model's name as a path part, the output directory inside its root (a link planted
    there is refused before any work); (lm, prompts, out_dir, root, key)."""
    from sweep.config.paths import check_name, check_writable_dir, inside
    from sweep.errors import ConfigError
    from sweep.models.prompts import read_prompts

    read_prompts(cfg.prompts)  # a bad prompts file fails before anything else
    check_name("model", cfg.model.name or "model")
    out_dir = Path(cfg.fit.out) if cfg.fit.out is not None else Path(cfg.results.root) / "readouts"
    root, key = (cfg.fit.out, "fit.out") if cfg.fit.out is not None else (cfg.results.root, "results.root")
    inside(root, out_dir / (cfg.model.name or "model"), key=key)
    check_writable_dir(key, root)
    for where in (out_dir, out_dir / (cfg.model.name or "model")):  # the file's own directory, before the fit
        if not os.path.lexists(where):
            continue
        if not where.is_dir():
            raise ConfigError(f"{key}={root}: {where}, where the readouts go, is not a directory")
        if not os.access(where, os.W_OK | os.X_OK):
            raise ConfigError(f"{key}={root}: {where}, where the readouts go, is not writable (no write permission)")
    # translators and classifiers are fitted to the lens at layer L
    lm, prompts = session.workload(cfg, ("fit.gen_tokens", cfg.fit.gen_tokens), check=lambda lm: lm.require(lens=True))
    return lm, prompts, out_dir, root, key


def fit(cfg, prepared) -> Readouts:
    """The readouts fitted on the prompts."""
    lm, prompts = prepared[:2]
    return fit_readouts(
        lm,
        prompts,
        gen_tokens=cfg.fit.gen_tokens,
        ridge=cfg.fit.ridge,
        l2=cfg.fit.l2,
        seed=cfg.seed,
        prompt_set=cfg.prompts.name,
        prompt_start=cfg.prompts.start,
    )


def write(cfg, prepared, readouts: Readouts) -> Path:
    """The readouts under fit.out (null: <results.root>/readouts), atomically; their path."""
    lm, prompts, out_dir, root, key = prepared
    path = save_readouts(readouts, out_dir, root=root, key=key)
    log.info("fitted readouts of %s on %d prompts; wrote %s", lm.name, len(prompts), path)
    return path


def summary(cfg, lm, readouts: Readouts) -> dict:
    """The fit's summary: its size and time, and per layer its agreement, KL and classifier accuracy."""
    out = {**json.loads(readouts.meta["fit_summary"]), "fit_seconds": float(readouts.meta["fit_seconds"])}
    return out | {"model": lm.name, "prompt_set": cfg.prompts.name}


def render(cfg, prepared, readouts: Readouts, path: Path) -> tuple[list[str], int]:
    """The fit's report and the readouts' path."""
    from sweep.textfit import fit_lines

    return [fit_lines(fit_report(summary(cfg, prepared[0], readouts))), f"readouts: {path}"], 0


def run_fit(cfg, session=None) -> tuple[Path, Readouts, dict]:
    """`sweep fit` as a library call (``sweep.cli.verbs``' four steps, in ``session``, default this
    process's): returns the path, the readouts and the fit's summary."""
    from sweep.bench.session import process_session

    prepared = prepare(cfg, process_session() if session is None else session)
    readouts = fit(cfg, prepared)
    path = write(cfg, prepared, readouts)
    return path, dataclasses.replace(readouts, path=path), summary(cfg, prepared[0], readouts)


def fit_report(summary: dict) -> str:
    """`sweep fit`'s report: the fit's size and time, then one row per layer on the fitting set."""
    lines = [
        f"readouts of {summary['model']} fitted on {summary['prompts']} {summary['prompt_set']} prompts in "
        f"{summary['fit_seconds']:.1f} s (translators: {summary['translator_positions']} positions; classifiers "
        f"and this table: the {summary['decode_positions']} decode positions)",
        "top1: agreement with the final layer's token; KL(final || lens) in nats; acc: the exit classifier's accuracy",
        f"{'layer':>5}  {'top1 logit':>10}  {'top1 tuned':>10}  {'KL logit':>9}  {'KL tuned':>9}  "
        f"{'acc logit':>9}  {'acc tuned':>9}",
    ]
    for r in summary["layers"]:
        lines.append(
            f"{r['layer']:>5}  {r['top1_logit']:>10.3f}  {r['top1_tuned']:>10.3f}  {r['kl_logit']:>9.3f}  "
            f"{r['kl_tuned']:>9.3f}  {r['acc_logit']:>9.3f}  {r['acc_tuned']:>9.3f}"
        )
    return "\n".join(lines)
