"""conf/experiment/: every named experiment composes and validates, each equals the override
list it replaced, and the places that run them (Makefile, README, infra/) select them by name."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from conftest import ROOT, compose
from sweep.errors import ConfigError

EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))

# each experiment = the override list it replaced (results.root stays on the cluster commands' line)
REPLACED = {
    "main": "model=smollm2-135m search=bracket prompts.n=2 bench.gen_tokens=16 bench.repeats=2 resources.cpu=2",
    "optuna-tiny": "model=tiny-llama search=optuna-mo search.n_trials=20",
    "profile-humaneval": "model=smollm2-135m prompts=humaneval prompts.n=2 profile.gen_tokens=16",
    "screen": "model=smollm2-135m search=screen prompts.n=4 bench.gen_tokens=16",
    "calibrate-saturation": "model=smollm2-135m gate=saturation gate.min_layer=8 prompts=humaneval "
    "prompts.n=164 calibrate.split=0.78 \"calibrate.grid='range(0.002, 0.042, step=0.002)'\" "
    "bench.gen_tokens=16",
    "calibrate-cpu": "model=smollm2-135m gate=saturation gate.min_layer=8 prompts=humaneval "
    "prompts.n=40 calibrate.split=0.75 \"calibrate.grid='range(0.004, 0.036, step=0.004)'\" bench.gen_tokens=16",
    "humaneval-cpu": "model=smollm2-135m search=bracket search.n_trials=3 search.neighbours=0 "
    "'search.spaces=[{gate: saturation, gate.min_depth: 0.5}]' prompts.n=2 bench.gen_tokens=16 bench.repeats=1 "
    "resources.cpu=2 eval.task=humaneval eval.max_tokens=128",
    "qwen-coder": "model=qwen2.5-coder-0.5b search=saturation-grid search.name=qwen-coder "
    "search.max_accuracy_loss=0.25 'search.spaces=[{gate: fixed, gate.exit_layer: \"choice(21, 22, 23)\"}]' "
    "prompts=humaneval prompts.start=162 prompts.n=2 bench.gen_tokens=16 bench.repeats=4 resources.cpu=2 "
    "eval.task=humaneval eval.problems=40 eval.max_tokens=128 eval.batch_size=8",
    "cluster-gpu": "model=smollm2-135m search=saturation-grid cluster=existing device=cuda resources.gpu=1",
    "cluster-gpu-humaneval": "model=smollm2-135m search=saturation-grid cluster=existing device=cuda resources.gpu=1 "
    "resources.cpu=4 prompts=humaneval prompts.n=16 bench.gen_tokens=64 bench.repeats=5",
}


# what the command line adds to an experiment: a consent no shipped file gives (eval.allow_code_execution)
CONSENT = {"humaneval-cpu": ("eval.allow_code_execution=true",), "qwen-coder": ("eval.allow_code_execution=true",)}


def test_every_experiment_is_described_here():
    assert EXPERIMENTS == sorted(REPLACED)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_validates_and_is_global(name):
    path = ROOT / "conf" / "experiment" / f"{name}.yaml"
    assert path.read_text().startswith("# @package _global_\n")
    cfg = compose(f"experiment={name}", *CONSENT.get(name, ()))
    assert cfg != compose()  # it changes something
    assert not hasattr(cfg, "experiment")


@pytest.mark.parametrize("name", sorted(REPLACED))
def test_an_experiment_equals_the_overrides_it_replaced(name):
    extra = CONSENT.get(name, ())
    assert compose(f"experiment={name}", *extra) == compose(*shlex.split(REPLACED[name]), *extra)


def test_a_shipped_experiment_never_consents_to_running_code():
    for name in CONSENT:
        with pytest.raises(ConfigError, match="eval.allow_code_execution=false"):
            compose(f"experiment={name}")


def test_the_command_line_overrides_an_experiment():
    cfg = compose("experiment=main", "model=tiny-qwen2", "search=screen", "prompts.n=3")
    assert (cfg.model.name, cfg.search.name, cfg.prompts.n, cfg.bench.gen_tokens) == ("tiny-qwen2", "screen", 3, 16)
    with pytest.raises(ConfigError, match=r"experiment=nope: unknown option; allowed: .*main"):
        compose("experiment=nope")


def test_make_run_is_the_main_experiment():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^run:.*\n\t(.+)$", makefile, re.MULTILINE).group(1)
    argv = shlex.split(recipe)
    assert argv[:3] == ["$(BIN)/sweep", "run", "experiment=main"] and argv[3:] == ["$(RUN_ARGS)"]
    assert compose(*argv[2:3]) == compose(*REPLACED["main"].split())


def test_readme_docs_and_infra_run_experiments():
    readme = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    commands = [line for line in readme.splitlines() if line.startswith(".venv/bin/sweep ") and "experiment=" in line]
    used = {re.search(r"experiment=(\S+)", line).group(1) for line in commands}
    assert {"main", "optuna-tiny", "profile-humaneval", "screen", "calibrate-saturation"} <= used
    assert "-- experiment=cluster-gpu results.root=/shared/results" in readme
    job = yaml.safe_load((ROOT / "infra" / "kuberay" / "rayjob.yaml").read_text())
    assert job["spec"]["entrypoint"] == "sweep run experiment=cluster-gpu-humaneval results.root=/mnt/results"
    launcher = (ROOT / "infra" / "cluster-launcher" / "aws-gpu.yaml").read_text()
    assert "-- experiment=cluster-gpu results.root=/mnt/results" in launcher
