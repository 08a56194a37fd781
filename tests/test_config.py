"""The real conf/ composes; every validation error is one line naming the key."""

from __future__ import annotations


import pytest

from conftest import ROOT, compose
from sweep.cli.commands import main
from sweep.errors import ConfigError


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


GROUP_EXTRA = {
    "hf": ["model.path=org/name"],
    "gguf": ["model.path=x.gguf"],
    "jsonl": ["prompts.path=p.jsonl"],
    "classifier": ["gate.readouts=readouts.safetensors"],
    "skip": ["bench.mode=self_speculative"],
}


@pytest.mark.parametrize("group", ["model", "gate", "prompts"])
def test_every_group_option_composes_and_validates(group):
    names = options(group)
    assert names, f"conf/{group} is empty"
    for name in names:
        cfg = compose(f"{group}={name}", *GROUP_EXTRA.get(name, []))
        section = getattr(cfg, group)
        assert section.name is not None
        if group != "model":
            assert section.name == name


def test_defaults_and_types():
    cfg = compose()
    assert cfg.model.name == "smollm2-135m" and cfg.model.source == "packaged"
    assert cfg.gate.name == "full" and cfg.prompts.name == "chat"
    assert isinstance(cfg.profile.gen_tokens, int) and isinstance(cfg.eas.alpha, float)
    assert cfg.seed == 0  # seed 0 is a seed, not "no seed"


def test_tiny_sizes_and_overrides():
    cfg = compose("model=tiny-qwen3", "model.tiny.layers=6", "profile.topk=3", "seed=7")
    assert cfg.model.family == "qwen3" and cfg.model.tiny.layers == 6
    assert cfg.profile.topk == 3 and cfg.seed == 7


def test_model_name_is_derived_from_path():
    assert compose("model=hf", "model.path=Qwen/Qwen3-0.6B").model.name == "Qwen--Qwen3-0.6B"
    assert compose("model=gguf", "model.path=/m/SmolLM2-135M.Q4.gguf").model.name == "SmolLM2-135M.Q4"


BAD = [
    (["model=nope"], "model=nope: unknown option; allowed: gguf, hf, qwen2.5-coder-0.5b, smollm2-135m, tiny-cohere"),
    (
        ["gate=nope"],
        "gate=nope: unknown option; allowed: classifier, conformal, cosine, entropy, fixed, full, margin, pca, "
        "saturation, skip, softmax",
    ),
    (["prompts=nope"], "prompts=nope: unknown option; allowed: chat, humaneval, jsonl"),
    (["profile.nope=1"], "profile.nope: unknown key in profile; allowed: gen_tokens, topk"),
    (["+nope=1"], "nope: unknown key; allowed: model, gate, prompts"),
    (["profile.gen_tokens=abc"], "profile.gen_tokens='abc': must be an integer"),
    (["profile.gen_tokens=0"], "profile.gen_tokens=0: must be an integer in 1..4096"),
    (["profile.gen_tokens=1.5"], "profile.gen_tokens=1.5: must be an integer"),
    (["profile.topk=0"], "profile.topk=0: must be an integer in 1..1000"),
    (["eas.alpha=1.5"], "eas.alpha=1.5: must be a number in [0, 1]"),
    (["seed=-1"], "seed=-1: must be an integer in 0..9223372036854775807 (2^63 - 1, torch's)"),
    (["device=tpu"], "device=tpu: must be one of auto, cpu, cuda"),
    (["dtype=int8"], "dtype=int8: must be one of float32, bfloat16, float16"),
    (["prompts.n=0"], "prompts.n=0: must be an integer >= 1 or null (all)"),
    (["prompts.chat_template=maybe"], "prompts.chat_template='maybe': must be true or false"),
    (["model=hf"], "model.path: required for model=hf"),
    (["model=gguf"], "model.path: required for model=gguf"),
    (["prompts=jsonl"], "prompts.path: required for prompts=jsonl"),
    (
        ["model=tiny-llama", "model.family=t5"],
        "model.family=t5: must be one of llama, mistral, qwen2, qwen3, gemma3, gemma3-mm",
    ),
    (["model=tiny-llama", "model.tiny.kv_heads=3"], "model.tiny.kv_heads=3: must divide model.tiny.heads=4"),
    (["model=tiny-llama", "model.tiny.head_dim=5"], "model.tiny.head_dim=5: must be an even integer >= 2"),
    (["model.name=a/b"], "model.name=a/b: must be 1-128 letters, digits, '.', '_' or '-', starting with a letter"),
    (["gate=fixed", "gate.exit_layer=0"], "gate.exit_layer=0: must be an integer >= 1"),
    (["gate=saturation", "gate.eps=null"], "gate.eps: required for gate=saturation"),
    (["gate=margin", "gate.theta=null"], "gate.theta: required for gate=margin"),
    (["gate.min_depth=0"], "gate.min_depth=0.0: must be a number in (0, 1] or null"),
    (["gate.min_depth=1.5"], "gate.min_depth=1.5: must be a number in (0, 1] or null"),
    (["gate.name=margn"], "gate.name=margn: unknown gate (did you mean 'margin'?); allowed: full, skip, fixed"),
    (["resources.gpu=-1"], "resources.gpu=-1.0: must be auto or a number >= 0"),
    (["resources.gpu=lots"], "resources.gpu=lots: must be auto or a number >= 0"),
    (["resources.cpu=0"], "resources.cpu=0.0: must be a number > 0"),
    (["cluster.auth=none"], "cluster.auth=none: must be one of token, disabled"),
    (  # a Ray Client address joined as a driver wrote every row and then summed them as skipped, rc 0
        ["cluster=existing", "cluster.address=ray://127.0.0.1:10001"],
        "cluster.address=ray://127.0.0.1:10001: must be null (an embedded Ray), auto or host:port of a running "
        "cluster's GCS (a Ray Client ray:// address is not joined: submit with jobs/submit.py)",
    ),
    (["cluster=existing", "cluster.address=127.0.0.1"], "cluster.address=127.0.0.1: must be null (an embedded Ray)"),
    (["cluster=existing", "cluster.address=h:65536"], "cluster.address=h:65536: must be null (an embedded Ray)"),
    (
        ["search=nope"],
        "search=nope: unknown option; allowed: "  # every option the conf group holds, and no other
        + ", ".join(sorted(p.stem for p in (ROOT / "conf" / "search").glob("*.yaml"))),
    ),
    (["search.n_trials=0"], "search.n_trials=0: must be an integer in 1..100000"),
    (["sweep.max_failures=-1"], "sweep.max_failures=-1: must be an integer >= 0"),
    (["gate=saturation", "gate.eps=0"], "gate.eps=0: must be a number > 0 (finite) for gate=saturation"),
    (["gate=saturation", "gate.eps=-0.1"], "gate.eps=-0.1: must be a number > 0"),
    (["gate=conformal", "gate.q=0"], "gate.q=0: must be a number in (0, 1] for gate=conformal"),
    (["gate=conformal", "gate.q=1.5"], "gate.q=1.5: must be a number in (0, 1]"),
    (["gate=margin", "gate.theta=-1"], "gate.theta=-1: must be a number >= 0 (finite) for gate=margin"),
    (["gate.min_layer=0"], "gate.min_layer=0: must be an integer >= 1"),
    (
        ["gate=margin", "gate.min_layer=3", "gate.min_depth=0.5"],
        "gate.min_layer=3 and gate.min_depth=0.5: set one of them (min_layer: a layer index; min_depth: a fraction",
    ),
    (
        ["gate.eps=0.1,0.2"],
        "gate.eps=0.1,0.2: a comma list is a sweep; sweeps are `sweep run search=...`, e.g. sweep run "
        "\"search.spaces=[{gate: saturation, gate.eps: 'choice(0.1,0.2)'}]\"",
    ),
    (["profile.gen_tokens=[1,"], "cannot parse the overrides"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_config_is_one_clear_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        compose(*overrides)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


@pytest.mark.parametrize("overrides", [o for o, _ in BAD[:6]])
def test_cli_bad_config_exits_2_with_one_line(overrides, capsys, tmp_path):
    code = main(["profile", f"results.root={tmp_path}", *overrides])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: ")  # config errors come before any progress output
    assert not any(tmp_path.iterdir()), "nothing may be written on bad input"


def test_config_dir_env_must_point_at_a_conf(monkeypatch, tmp_path):
    monkeypatch.setenv("SWEEP_CONFIG_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="SWEEP_CONFIG_DIR: no config.yaml"):
        compose()


def test_every_yaml_starts_with_the_command_that_uses_it():
    for path in sorted((ROOT / "conf").rglob("*.yaml")):
        lines = path.read_text().splitlines()
        first = lines[1] if lines[0] == "# @package _global_" else lines[0]  # an experiment's header comes first
        assert first.startswith("#") and "sweep" in first, f"{path} should start with a usage comment"


def test_cli_config_prints_the_composed_config(capsys):
    assert main(["config", "model=tiny-gemma3", "profile.gen_tokens=5"]) == 0
    out = capsys.readouterr().out
    assert "gen_tokens: 5" in out and "family: gemma3" in out


def test_defaults_live_in_conf_only():
    """Every default value is in conf/ (config.yaml and the group files): a config dataclass
    field has no default but null (GateConfig's name aside, for gates built in code: min_layer
    and min_depth null resolve to layer 1), and the no-override composition validates, so conf/
    sets every required field."""
    import dataclasses as dc
    import typing

    from sweep.config import Config

    def fields(cls, prefix=""):
        hints = typing.get_type_hints(cls)
        for f in dc.fields(cls):
            yield cls, f, prefix + f.name
            for sub in [a for a in (typing.get_args(hints[f.name]) or (hints[f.name],)) if dc.is_dataclass(a)]:
                yield from fields(sub, prefix + f.name + ".")

    for cls, f, key in fields(Config):
        if cls.__name__ == "GateConfig" and f.name == "name":
            continue
        assert f.default_factory is dc.MISSING, key
        assert f.default is dc.MISSING or f.default is None, f"{key} has a default ({f.default!r}) outside conf/"
    assert compose().bench.gen_tokens == 32  # conf/config.yaml's value, the only one


def test_a_composition_kept_in_this_process_is_the_callers_own_and_follows_every_edit_of_conf(monkeypatch, tmp_path):
    """Compositions are kept per process (sweep.config._composed): the same overrides give equal configs, a caller
    that changes what it got changes no later one, and a conf file rewritten in place (same size, within the same
    clock tick), a file added under conf/, a FIFO or a loop of links planted there, and a value that reads the
    environment are all seen or passed over, never a stale config."""
    import os
    import shutil

    from sweep.config import compose_dict

    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    monkeypatch.setenv("SWEEP_CONFIG_DIR", str(conf))
    first = compose_dict(["model=tiny-llama"])
    assert first["model"]["tiny"]["layers"] == 4
    first["model"]["tiny"]["layers"] = 99
    first["seed"] = -1
    again = compose_dict(["model=tiny-llama"])
    assert again["model"]["tiny"]["layers"] == 4 and again["seed"] != -1
    again["model"]["tiny"]["layers"] = 98  # the kept one is a copy too
    assert compose_dict(["model=tiny-llama"])["model"]["tiny"]["layers"] == 4
    model = conf / "model" / "tiny-llama.yaml"
    text = model.read_text()
    stamp = os.stat(model)
    model.write_text(text.replace("layers: 4", "layers: 6"))  # the same size, the same mtime put back
    os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert compose_dict(["model=tiny-llama"])["model"]["tiny"]["layers"] == 6
    os.mkfifo(conf / "gate" / "planted.fifo")  # never opened: a read would block here
    (conf / "model" / "tiny-llama-6.yaml").write_text(text.replace("name: tiny-llama", "name: tiny-llama-6"))
    assert compose_dict(["model=tiny-llama-6"])["model"]["name"] == "tiny-llama-6"
    assert compose_dict(["model=tiny-llama"])["model"]["tiny"]["layers"] == 6
    model.write_text(text)
    assert compose_dict(["model=tiny-llama"])["model"]["tiny"]["layers"] == 4
    # a value that interpolates reads the environment (or the clock) each time
    monkeypatch.setenv("MODELS_OF_THIS_TEST", "/first")
    assert compose_dict(["model=hf", "model.path=${oc.env:MODELS_OF_THIS_TEST}/m"])["model"]["path"] == "/first/m"
    monkeypatch.setenv("MODELS_OF_THIS_TEST", "/second")
    assert compose_dict(["model=hf", "model.path=${oc.env:MODELS_OF_THIS_TEST}/m"])["model"]["path"] == "/second/m"
    # a directory that links back to itself twice: hashing it would branch at every level, so it is composed afresh
    loop = conf / "loop"
    loop.mkdir()
    (loop / "a").symlink_to(".", target_is_directory=True)
    (loop / "b").symlink_to(".", target_is_directory=True)
    assert compose_dict(["model=tiny-llama"])["model"]["tiny"]["layers"] == 4
    model.write_text(text.replace("layers: 4", "layers: 6"))
    assert compose_dict(["model=tiny-llama"])["model"]["tiny"]["layers"] == 6


def test_sweep_config_prints_each_path_as_the_commands_read_it(tmp_path, monkeypatch, capsys):
    import yaml

    from sweep.cli.commands import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert main(["config", "results.root='~/r'", "analysis.out=rel/out"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["results"]["root"] == str(tmp_path / "home" / "r")  # ~ expanded
    assert printed["analysis"]["out"] == str(tmp_path / "rel" / "out")  # made absolute against the working dir


def test_sweep_config_prints_the_values_the_commands_use(capsys):
    """What validation settles is printed as settled: the full-depth gate's layer keys (it never exits: one
    trial whatever they say) and self-speculation's cache policy (the full model's K/V at every position)."""
    import yaml

    from sweep.cli.commands import main

    assert main(["config", "gate=full", "gate.min_layer=3"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["gate"]["min_layer"] == 1
    assert main(["config", "bench.mode=self_speculative", "gate=fixed", "gate.exit_layer=10"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["bench"]["kv_policy"] == "full" and printed["gate"]["exit_layer"] == 10


def test_what_the_new_refusals_leave_alone(tmp_path):
    """A second reader's list of valid command lines the session's refusals must not touch: a quoted option, a
    sub-space key with Hydra's '+', a task or a prompt file that only the sweep's settings set."""
    from sweep.orchestrate.plan import foresee_settings

    assert compose("gate='margin'").gate.name == "margin" and compose('model="tiny-llama"').model.name == "tiny-llama"
    plus = ["model=tiny-llama", "search.spaces=[{gate: margin, ++gate.theta: 'choice(0.5,1.0)'}]"]
    assert [c.gate.theta for _, c in foresee_settings(compose(*plus), plus)] == [0.5, 1.0]
    task = ["model=tiny-llama", "eval.problems=5", "eval.allow_code_execution=true",
            "search.spaces=[{gate: margin, eval.task: humaneval}, {gate: full, eval.task: humaneval}]"]  # fmt: skip
    assert {c.eval.problems for _, c in foresee_settings(compose(*task), task)} == {5}
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "yo"}\n')
    both = ["model=tiny-llama", "prompts=jsonl", f"prompts.path={path}",
            "search.spaces=[{gate: margin, prompts: 'choice(chat, jsonl)'}]"]  # fmt: skip
    assert sorted(c.prompts.name for _, c in foresee_settings(compose(*both), both)) == ["chat", "jsonl"]


@pytest.mark.parametrize("given", ["cluster.num_gpus=1", "cluster.num_cpus=8", "cluster.dashboard=true"])
def test_an_embedded_rays_sizes_given_for_a_joined_cluster_are_refused(given):
    """`cluster=existing cluster.num_gpus=1` went on as if unset (the run then said no node has 1 GPU): a joined
    cluster has its own nodes; the key is named in one line. With the embedded Ray, each still sizes it."""
    with pytest.raises(ConfigError) as refused:
        compose("cluster=existing", given)
    assert str(refused.value).startswith(f"{given}: is for the embedded Ray (cluster=local) only; a cluster joined")
    assert getattr(compose(given).cluster, given.split(".")[1].split("=")[0]) in (1, 8, True)


def test_a_key_that_walks_into_a_list_by_a_name_is_one_line_naming_it():
    """`search.spaces.saturation.eps=1` ended `sweep run` with "unexpected TypeError at omegaconf.py" (and
    jobs/submit.py with a 44-line traceback): search.spaces is a list."""
    with pytest.raises(ConfigError) as refused:
        compose("search.spaces.saturation.eps=1")
    assert str(refused.value).startswith(
        "search.spaces.saturation.eps=1: cannot be set (Index 'saturation' (str) is not an int); a list's items"
    )
    with pytest.raises(TypeError):  # a caller's bug (a list where overrides go) is not said as a user's key
        compose(["model=tiny-llama"])


@pytest.mark.parametrize("prefix", ["", "+", "++"])
def test_an_index_past_a_lists_end_is_one_line_naming_the_item(prefix):
    """`search.spaces.5.gate=margin` (the list holds one) was Hydra's "Error merging override ...", naming neither
    the item nor how a list is set."""
    with pytest.raises(ConfigError) as refused:
        compose(f"{prefix}search.spaces.5.gate=margin")
    said = str(refused.value)
    assert said.startswith(
        f"{prefix}search.spaces.5.gate=margin: cannot be set (search.spaces[5]: list index out of range); a list's "
        "items are set by their index, or the list whole"
    )
    assert "\n" not in said


def test_a_directory_the_filesystem_will_not_create_is_refused_before_any_work():
    """`fit.out=/proc/nope` passed the permission check (root may write /proc's bits), loaded the model, fitted,
    and then ended with "unexpected FileNotFoundError", rc 1 (a reader's). The filesystem is asked before any work."""
    done = main(["fit", "model=tiny-llama", "fit.out=/proc/nope", "prompts.n=1", "fit.gen_tokens=1", "--quiet"])
    assert done == 2
    from sweep.config.paths import check_writable_dir

    with pytest.raises(ConfigError) as refused:
        check_writable_dir("fit.out", "/proc/nope")
    assert str(refused.value).startswith("fit.out=/proc/nope: cannot be created") and "\n" not in str(refused.value)
    assert str(refused.value).endswith("fit.out must be a directory you can write to")


@pytest.mark.parametrize("gate, says", [("softmax", "gate.theta values, each a number in [0, 1]"),
                                        ("pca", "gate.eps values, each a number > 0")])  # fmt: skip
def test_a_calibration_without_a_ladder_says_what_its_grid_holds(gate, says, capsys):
    """A gate with no default ladder was told "(e.g. 'range(1, 30)')", which its own domain then refused ("2 is not a
    value of gate.theta"; a reader's): the line names the threshold and its domain instead."""
    assert main(["calibrate", "model=tiny-llama", f"gate={gate}"]) == 2
    line = " ".join(capsys.readouterr().err.split())
    assert f"error: calibrate.grid: required for gate={gate}, which has no default ladder: {says}" in line
    assert "range(1, 30)" not in line
