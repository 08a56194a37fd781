"""Shared fixtures: the real conf/ composed and shrunk, tiny models for every family."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.orchestrate.cluster_env import descendants  # noqa: F401 (tests import it from here)
from sweep.config.families import TINY

ROOT = Path(__file__).resolve().parents[1]
ALL_TINY = list(TINY)  # every family with a tiny model (tests/test_families.py runs the contract on each)
# the families the engine's own suites run on: attention models (every K/V policy), as before
TINY_FAMILIES = ["gemma3", "llama", "mistral", "qwen2", "qwen3"]


def compose(*overrides: str):
    from sweep.config import compose as _compose

    return _compose(list(overrides))


_MODELS: list = []  # the tests' model cache (a sweep.models.ModelCache), shared across the session


def load(*overrides: str):
    from sweep.models import ModelCache, load_model

    cfg = compose(*overrides)
    if not _MODELS:
        _MODELS.append(ModelCache())
    return load_model(
        cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed, keep=cfg.resources.models, cache=_MODELS[0]
    )


@pytest.fixture(scope="module", params=TINY_FAMILIES)
def tiny(request):
    """A tiny random model of each supported family (loaded once per module and family)."""
    return load(f"model=tiny-{request.param}")


def run_cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """The installed console script, as a user runs it."""
    exe = Path(sys.executable).with_name("sweep")
    full_env = {**os.environ, **(env or {})}
    full_env.pop("SWEEP_DEBUG", None)
    return subprocess.run([str(exe), *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray (127.0.0.1, token auth) shared by the in-process sweep tests."""
    from sweep.orchestrate.cluster_env import ray_environment
    from sweep.config import compose

    cluster = compose([]).cluster  # conf/cluster/local.yaml
    ray_environment(cluster)
    from sweep.orchestrate import tune as sweep_tune

    started = sweep_tune.start_ray(cluster)
    yield sweep_tune
    if started:
        sweep_tune.stop_ray()


TINY_SWEEP = ["model=tiny-llama", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0"]


def sweep(tmp_path, *overrides):
    """Run `sweep run` in-process on the session's embedded Ray."""
    from sweep.orchestrate.tune import run_sweep

    args = [*TINY_SWEEP, f"results.root={tmp_path}", *overrides]
    return run_sweep(compose(*args), args)


def subprocess_env(**extra) -> dict:
    """The environment for a `sweep` or Ray subprocess: token auth, Ray on loopback, no debug
    tracebacks, and none of the private token path an in-process embedded Ray of this test
    session set (``sweep.orchestrate.cluster_env``): a cluster a test starts uses the user's token, as does
    the submitter that talks to it."""
    e = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **extra}
    e["PATH"] = f"{Path(sys.executable).parent}:{e.get('PATH', '')}"
    for key in ("SWEEP_DEBUG", "RAY_AUTH_TOKEN_PATH"):
        if key not in extra:
            e.pop(key, None)
    return e


@pytest.fixture(scope="session")
def llama_readouts(tmp_path_factory) -> Path:
    """Readouts (`sweep fit`) of tiny-llama fitted on chat/0..2: the file gate=classifier and
    gate.lens=tuned read in tests that run every gate (evaluate them on chat/3 onwards)."""
    import dataclasses

    from sweep.models.prompts import read_prompts, tokenize_prompts
    from sweep.trace.readouts import fit_readouts
    from sweep.trace.readouts import save_readouts

    lm = load("model=tiny-llama")
    cfg = dataclasses.replace(compose("prompts=chat").prompts, start=0, n=3)
    prompts = tokenize_prompts(read_prompts(cfg), cfg, lm.tokenizer)
    fit = fit_readouts(lm, prompts, gen_tokens=6, ridge=1.0, l2=1e-3, seed=0, prompt_set="chat", prompt_start=0)
    return save_readouts(fit, tmp_path_factory.mktemp("llama-readouts"))
