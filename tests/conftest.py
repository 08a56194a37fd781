"""Shared fixtures (the real conf/ composed and shrunk, tiny models for every family) and the test tiers.

Tiers, by marker: a test that starts Ray (an embedded Ray, a local cluster, a `sweep run`) is ``ray``; one that
sends a signal, kills a process or fills a disk is ``faults``; one on a packaged real model, or a whole program
end to end that takes over 9 s, is ``slow``; the family contract beyond the representative families is
``families``; ``gpu`` needs CUDA. The rest is the fast tier (`make test-fast`), and a guard here fails any test of
it that starts Ray or sends a signal, in this process or in one it started: each test process keeps Ray's files
under a directory of its own (``RAY_TMPDIR``), where every Ray started on its behalf leaves a session.
"""

from __future__ import annotations

import glob
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sweep.orchestrate.ray.env import descendants  # noqa: F401 (tests import it from here)
from sweep.config.families import TINY

ROOT = Path(__file__).resolve().parents[1]
ALL_TINY = list(TINY)  # every family with a tiny model (tests/test_families.py runs the contract on each)
# the families the engine's own suites run on: attention models (every K/V policy), as before
TINY_FAMILIES = ["gemma3", "llama", "mistral", "qwen2", "qwen3"]
# the fast tier's family contract: one family per adapter path and kind (the stacked K/V fill, the generic one,
# mixture of experts, state space, hybrid, a vision-language wrapper); the rest run under the `families` marker
REPRESENTATIVE = ["llama", "phi3", "mixtral", "mamba", "jamba", "gemma3-mm"]
# what sets a test apart from the fast tier
TIERS = ("ray", "faults", "slow", "families", "gpu")

# Ray's files (its sessions) under a directory of this test process: the guard below sees every Ray this
# process or its children start, and no other test run's (pytest-xdist's processes, another checkout's suite);
# short, for Ray's socket paths
RAY_TMPDIR = Path(tempfile.mkdtemp(prefix="sweep-tests-", dir="/tmp"))
os.environ["RAY_TMPDIR"] = str(RAY_TMPDIR)
# the caches a run keeps for the machine start empty in each test (``_own_caches``), but for converted models
# (verified at every load), which the test run converts once: one directory for the run's test processes, made by
# the process that starts pytest-xdist's (they inherit its name), the first to need a model converting it while the
# others wait for it (the loader's conversion lock)
_SHARED = "PYTEST_SWEEP_CONVERTED"
_OWNS_CONVERTED = not ("PYTEST_XDIST_WORKER" in os.environ and os.environ.get(_SHARED))
if _OWNS_CONVERTED:
    os.environ[_SHARED] = tempfile.mkdtemp(prefix="sweep-tests-converted-", dir="/tmp")
CONVERTED = Path(os.environ[_SHARED])
# what runs outside a test (session fixtures, the Ray workers they start) keeps its caches under the test process's
os.environ["SWEEP_CACHE_DIR"] = str(RAY_TMPDIR / "cache")
(RAY_TMPDIR / "cache").mkdir()
(RAY_TMPDIR / "cache" / "converted").symlink_to(CONVERTED, target_is_directory=True)


def pytest_unconfigure(config):
    shutil.rmtree(RAY_TMPDIR, ignore_errors=True)
    if _OWNS_CONVERTED:
        shutil.rmtree(CONVERTED, ignore_errors=True)
        shutil.rmtree(f"{CONVERTED}.locks", ignore_errors=True)


def family_params(families: list[str]) -> list:
    """The families as parameters, those beyond REPRESENTATIVE marked ``families`` (outside the fast tier)."""
    return [f if f in REPRESENTATIVE else pytest.param(f, marks=pytest.mark.families) for f in families]


def _ray_sessions() -> set[str]:
    return set(glob.glob(str(RAY_TMPDIR / "ray" / "session_2*")))


_SIGNALS: list[tuple[str, int]] = []  # signals this process sent (signal 0 only asks whether a process lives)
_kill, _killpg, _send_signal = os.kill, os.killpg, subprocess.Popen.send_signal


def _recording_kill(pid, sig):
    if sig:
        _SIGNALS.append(("os.kill", sig))
    return _kill(pid, sig)


def _recording_killpg(pgid, sig):
    if sig:
        _SIGNALS.append(("os.killpg", sig))
    return _killpg(pgid, sig)


def _recording_send_signal(self, sig):
    _SIGNALS.append(("Popen.send_signal", sig))
    return _send_signal(self, sig)


os.kill, os.killpg, subprocess.Popen.send_signal = _recording_kill, _recording_killpg, _recording_send_signal


def pytest_collection_modifyitems(config, items):
    """A test that takes the shared Ray is ``ray``. `make test` runs ``--dist loadfile``: a file's tests in one
    process (its module fixtures built once), every tier spread over both, each process starting its own embedded
    Ray; the ``faults`` tier's tests spread too (each fault is the test's own, a full disk on a tmpfs of its own, and
    the sandbox's snapshots tell apart what another process's evaluation holds, ``helpers/machine.py``)."""
    for item in items:
        if "ray_session" in item.fixturenames:
            item.add_marker(pytest.mark.ray)


@pytest.fixture(autouse=True)
def _own_caches(tmp_path_factory, monkeypatch):
    """Each test's own machine caches (``SWEEP_CACHE_DIR``: cost models, readers' tables), empty: no test reads
    what another measured; converted models are the test run's (``CONVERTED``)."""
    own = tmp_path_factory.mktemp("cache")
    (own / "converted").symlink_to(CONVERTED, target_is_directory=True)
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(own))


@pytest.fixture(autouse=True)
def _fast_tier_guard(request):
    """A test outside the ray tier starts no Ray, and one outside the ray and faults tiers sends no signal; the
    guard says which marker it needs when it does."""
    marked = {m.name for m in request.node.iter_markers()} & {"ray", "faults"}
    before = _ray_sessions()
    _SIGNALS.clear()
    yield
    if "ray" not in marked:
        started = sorted(_ray_sessions() - before)
        assert not started, f"this test started Ray ({len(started)} session(s)): mark it @pytest.mark.ray"
    if not marked:  # (a Ray that a ray test stops sends its own processes signals)
        assert not _SIGNALS, f"this test sent signals ({_SIGNALS}): mark it @pytest.mark.faults"


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
    from sweep.orchestrate.ray.env import ray_environment
    from sweep.config import compose

    cluster = compose([]).cluster  # conf/cluster/local.yaml
    ray_environment(cluster)
    from sweep.orchestrate.ray import tuner as sweep_tune

    started = sweep_tune.start_ray(cluster)
    yield sweep_tune
    if started:
        sweep_tune.stop_ray()


# A tiny sweep, one Tune trial at a time: its trials take milliseconds, and each worker process it starts costs seconds
# of CPU (Ray's worker, torch and transformers imported) that the tests running beside it share; one worker, reused for
# every trial, does the same work. A test whose subject is trials side by side asks for them: sweep.max_concurrent=null.
TINY_SWEEP = [
    "model=tiny-llama",
    "prompts.n=1",
    "bench.gen_tokens=4",
    "bench.repeats=1",
    "bench.warmup=0",
    "sweep.max_concurrent=1",
]


def sweep(tmp_path, *overrides):
    """Run `sweep run` in-process on the session's embedded Ray."""
    from sweep.orchestrate.driver import run_sweep

    args = [*TINY_SWEEP, f"results.root={tmp_path}", *overrides]
    return run_sweep(compose(*args), args)


def subprocess_env(**extra) -> dict:
    """The environment for a `sweep` or Ray subprocess: token auth, Ray on loopback, no debug
    tracebacks, and none of the private token path an in-process embedded Ray of this test
    session set (``sweep.orchestrate.ray.env``): a cluster a test starts uses the user's token, as does
    the submitter that talks to it."""
    e = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **extra}
    e["PATH"] = f"{Path(sys.executable).parent}:{e.get('PATH', '')}"
    for key in ("SWEEP_DEBUG", "RAY_AUTH_TOKEN_PATH"):
        if key not in extra:
            e.pop(key, None)
    return e


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """tiny-llama saved as an HF model directory (config, safetensors weights, tokenizer): a user's own model."""
    path = tmp_path_factory.mktemp("hf") / "tiny"
    lm = load("model=tiny-llama")
    lm.model.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    return path


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


@contextlib.contextmanager
def full_disk(mount: Path, free: int = 16384):
    """A 1 MiB tmpfs mounted on the directory ``mount``, filled to ``free`` bytes of free space (16 KiB: a claim
    fits, a row does not): yields its filler file; unmounted after. Skips where mounting needs a root we are not."""
    mount.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.decode().strip()}")
    filler = mount / "filler"
    try:
        with open(filler, "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:
        pass
    os.truncate(filler, filler.stat().st_size - free)
    try:
        yield filler
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs, filled to 16 KiB of free space (a claim fits, a row does not): (its mount, its filler)."""
    with full_disk(tmp_path / "disk") as filler:
        yield filler.parent, filler
