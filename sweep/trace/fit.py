"""`sweep fit`: fit the readouts of a model on a prompt set and write them (``sweep.trace.readouts``)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from sweep.trace.readouts import Readouts, fit_readouts
from sweep.trace.readouts_io import save_readouts

log = logging.getLogger("sweep.trace.fit")


def run_fit(cfg, session=None) -> tuple[Path, Readouts, dict]:
    """`sweep fit`: load the model (from ``session``, ``sweep.bench.session``; default: this process's),
    read and tokenize ``cfg.prompts``, fit, write under ``fit.out`` (null: <results.root>/readouts);
    returns the path, the readouts and the fit's summary."""
    from sweep.bench.session import process_session
    from sweep.config.paths import check_name, inside
    from sweep.models.prompts import read_prompts

    read_prompts(cfg.prompts)  # a bad prompts file fails before anything else
    check_name("model", cfg.model.name or "model")
    out_dir = Path(cfg.fit.out) if cfg.fit.out is not None else Path(cfg.results.root) / "readouts"
    root, key = (cfg.fit.out, "fit.out") if cfg.fit.out is not None else (cfg.results.root, "results.root")
    inside(root, out_dir / (cfg.model.name or "model"), key=key)  # a link planted there: refused before any work
    # translators and classifiers are fitted to the lens at layer L
    session = process_session() if session is None else session
    lm, prompts = session.workload(cfg, ("fit.gen_tokens", cfg.fit.gen_tokens), check=lambda lm: lm.require(lens=True))
    readouts = fit_readouts(
        lm,
        prompts,
        gen_tokens=cfg.fit.gen_tokens,
        ridge=cfg.fit.ridge,
        l2=cfg.fit.l2,
        seed=cfg.seed,
        prompt_set=cfg.prompts.name,
        prompt_start=cfg.prompts.start,
    )
    path = save_readouts(readouts, out_dir, root=root, key=key)
    summary = {**json.loads(readouts.meta["fit_summary"]), "fit_seconds": float(readouts.meta["fit_seconds"])}
    summary |= {"model": lm.name, "prompt_set": cfg.prompts.name}
    log.info("fitted readouts of %s on %d prompts; wrote %s", lm.name, len(prompts), path)
    return path, dataclasses.replace(readouts, path=path), summary
