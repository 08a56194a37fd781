"""Bad input is refused early and rightly (issue 12): one line naming the key and what is
allowed, exit code 2, before any model loads or Ray starts, and nothing written.

Names that become path components, output directories that cannot be written, non-finite
thresholds, calibration settings, ladders and grids that cannot work, unknown keys, and the
pca gate's k against the hidden size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import compose, run_cli
from sweep.cli.commands import main
from sweep.errors import ConfigError
from sweep.config.paths import NAME_ALLOWED, check_writable_dir, is_name

NAME_RULE = f"must be {NAME_ALLOWED} (it becomes a file or directory name)"


def refused(*overrides: str) -> str:
    """The one-line error compose gives for ``overrides``."""
    with pytest.raises(ConfigError) as info:
        compose(*overrides)
    text = str(info.value)
    assert "\n" not in text and info.value.exit_code == 2
    return text


def cli(tmp_path: Path, capsys, *args: str) -> tuple[int, list[str]]:
    code = main(list(args))
    return code, capsys.readouterr().err.strip().splitlines()


SCRIPT = """
import json, sys
import sweep.models as models
from sweep.cli.commands import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loads": models.model_loads(), "ray": "ray" in sys.modules}))
"""


def fresh_process(*args: str) -> dict:
    """``sweep ARGS`` in a new interpreter: its exit code, its models loaded, whether Ray was imported."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("SWEEP_DEBUG", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=300, env=env)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    return seen | {"errors": errors}


# ------------------------------------------------------------------ 1. names that become paths


@pytest.mark.parametrize(
    "override",
    [
        "search.name=../../escape",
        "search.name=.hidden",
        "sweep.name=..",
        "sweep.name=.",
        "sweep.name=.hidden",
        "sweep.name=",
        "run_id=..",
        "run_id=.hidden",
        "run_id=a/b",
        "model.name=..",
        "model.name=.x",
        "model.name=-x",
        "run_id=" + "a" * 129,
    ],
)
def test_a_name_that_becomes_a_path_is_a_safe_name(override):
    key, _, value = override.partition("=")
    assert refused(override) == f"{key}={value}: {NAME_RULE}"


def test_names_in_search_spaces_are_checked_too():
    text = refused("search.spaces=[{model.name: 'choice(ok, ..)'}]")
    assert text == f"search.spaces[0].model.name='..': {NAME_RULE}"


def test_the_schema_uses_the_one_name_rule():
    import sweep.config._schema as schema

    assert not hasattr(schema, "NAME_RE")
    assert compose("run_id=r1.2_b-3", "sweep.name=S.1", "search.name=g-2").run_id == "r1.2_b-3"


@pytest.mark.parametrize(
    "path", ["/x/.hidden", ".hidden", "...", "..", ".", "/", "/m/.x.gguf", "a b/c?d", "x" * 300, "é/ü"]
)
def test_a_derived_model_name_is_always_a_safe_name(path):
    name = compose("model=hf", f"model.path='{path}'").model.name
    assert is_name(name), name


def test_a_derived_model_name_keeps_readable_ids():
    assert compose("model=hf", "model.path=Qwen/Qwen3-0.6B").model.name == "Qwen--Qwen3-0.6B"
    assert compose("model=hf", "model.path=/x/.hidden").model.name == "x--.hidden"
    long = compose("model=hf", f"model.path={'a' * 300}").model.name
    assert len(long) == 128 and long != compose("model=hf", f"model.path={'a' * 299}").model.name


def test_a_sweep_name_derived_from_search_and_run_is_a_name(tmp_path, capsys):
    from sweep.config import check_sweep_name

    assert check_sweep_name(compose("search.name=s", "run_id=r")) == "s-r"
    long = ["search.name=" + "s" * 100, "run_id=" + "r" * 100]
    with pytest.raises(ConfigError, match="the sweep's name <search.name>-<run_id> would be 201 characters"):
        check_sweep_name(compose(*long))
    assert check_sweep_name(compose(*long, "sweep.name=short")) == "short"
    code, err = cli(tmp_path, capsys, "run", "model=tiny-llama", f"results.root={tmp_path}", *long)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: search.name=")
    assert not any(tmp_path.iterdir())


def test_run_refuses_an_escaping_search_name_before_ray_starts(tmp_path):
    root = tmp_path / "results"
    seen = fresh_process("run", "model=tiny-llama", "search.name=../../escape", f"results.root={root}")
    assert seen["code"] == 2 and seen["loads"] == 0 and seen["ray"] is False
    assert seen["errors"] == [f"error: search.name=../../escape: {NAME_RULE}"]
    assert not root.exists() and not any(tmp_path.iterdir())


# ------------------------------------------------------------------ 2. output directories


def test_check_writable_dir_creates_nothing(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    assert check_writable_dir("results.root", target) == target
    assert not (tmp_path / "a").exists()
    assert check_writable_dir("results.root", tmp_path) == tmp_path


def test_a_file_or_a_path_under_a_file_is_not_a_directory(tmp_path):
    file = tmp_path / "f"
    file.write_text("x")
    with pytest.raises(ConfigError) as info:
        check_writable_dir("results.root", file)
    assert str(info.value) == (
        f"results.root={file}: is a file, not a directory; results.root must be a directory (or one to create)"
    )
    with pytest.raises(ConfigError) as info:
        check_writable_dir("sweep.storage", file / "sub" / "deeper")
    assert str(info.value) == (
        f"sweep.storage={file}/sub/deeper: lies under {file}, which is a file, not a directory; "
        "sweep.storage must be a directory (or one to create)"
    )


def test_an_unwritable_directory_is_refused(tmp_path, monkeypatch):
    """Without write permission (simulated: the tests may run as root, who has it anyway)."""
    import sweep.config.paths

    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(sweep.config.paths.os, "access", lambda p, mode: real(p, mode) and Path(p) != locked)
    with pytest.raises(ConfigError, match=r"results.root=.*/locked: the directory is not writable \(no write"):
        check_writable_dir("results.root", locked)
    with pytest.raises(
        ConfigError, match=r"analysis.out=.*/locked/new/r: cannot be created: .*/locked is not writable"
    ):
        check_writable_dir("analysis.out", locked / "new" / "r")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a directory without write permission")
def test_an_unwritable_directory_is_refused_for_real(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="results.root=.*: the directory is not writable"):
            check_writable_dir("results.root", locked)
        with pytest.raises(ConfigError, match="cannot be created: .* is not writable"):
            check_writable_dir("results.root", locked / "sub")
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize(
    "command, key, extra",
    [
        ("profile", "results.root", []),
        ("bench", "results.root", []),
        ("run", "results.root", []),
        ("analyze", "results.root", []),
        ("run", "sweep.storage", []),
        ("analyze", "analysis.out", []),
    ],
)
def test_commands_that_write_refuse_an_unusable_output_before_any_work(tmp_path, capsys, command, key, extra):
    from sweep.models import model_loads

    file = tmp_path / "file"
    file.write_text("x")
    root = tmp_path / "results"
    paths = {"results.root": str(root), key: str(file / "sub")}
    loads = model_loads()
    code, err = cli(tmp_path, capsys, command, "model=tiny-llama", *extra, *(f"{k}={v}" for k, v in paths.items()))
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {key}={file}/sub: lies under {file}, which is a file")
    assert model_loads() == loads and not root.exists()


def test_empty_output_paths_are_refused():
    assert refused("sweep.storage=''") == "sweep.storage=: must be a non-empty directory path or null"
    assert refused("analysis.out=''") == "analysis.out=: must be a non-empty directory path or null"
    assert refused("results.root=''") == "results.root=: must be a non-empty directory path"


# ------------------------------------------------------------------ 3. non-finite numbers


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["gate=saturation", "gate.eps=inf"], "gate.eps=inf: must be a number > 0 (finite) for gate=saturation"),
        (["gate=saturation", "gate.eps=nan"], "gate.eps=nan: must be a number > 0 (finite) for gate=saturation"),
        (["gate=margin", "gate.theta=inf"], "gate.theta=inf: must be a number >= 0 (finite) for gate=margin"),
        (["gate=entropy", "gate.theta=nan"], "gate.theta=nan: must be a number >= 0 (finite) for gate=entropy"),
        (["gate=softmax", "gate.decay=inf"], "gate.decay=inf: must be a number >= 0 (finite) for gate=softmax"),
        (["gate=cosine", "gate.decay=nan"], "gate.decay=nan: must be a number >= 0 (finite) for gate=cosine"),
        (["gate=conformal", "gate.q=nan"], "gate.q=nan: must be a number in (0, 1] for gate=conformal"),
        (["resources.cpu=inf"], "resources.cpu=inf: must be a number > 0 (finite)"),
        (["resources.gpu=inf"], "resources.gpu=inf: must be auto or a number >= 0 (finite)"),
        (["model=tiny-llama", "model.tiny.init_std=inf"], "model.tiny.init_std=inf: must be a number > 0 (finite)"),
        (["calibrate.delta=nan"], "calibrate.delta=nan: must be a number in (0, 1)"),
        (
            ["search=optuna-constrained", "search.constraints.agreement=inf"],
            "search.constraints.agreement=inf: must be a number (finite: the metric's minimum)",
        ),
        (
            ["search.spaces=[{gate: saturation, gate.eps: 'choice(0.1, inf)'}]"],
            "search.spaces[0].gate.eps=inf: must be a number > 0 (finite) for gate=saturation",
        ),
        (
            ["search.spaces=[{gate: margin, gate.theta: 'choice(1, nan)'}]"],
            "search.spaces[0].gate.theta=nan: must be a number >= 0 (finite) for gate=margin",
        ),
        (
            [
                "search.kind=optuna",
                "search.n_trials=2",
                "search.spaces=[{gate: margin, gate.theta: 'interval(1, inf)'}]",
            ],
            "search.spaces[0].gate.theta=interval(1, inf): interval bounds must be finite numbers (got inf)",
        ),
        (
            ["search.spaces=[{gate: saturation, gate.eps: 'range(0.1, inf, step=0.1)'}]"],
            "search.spaces[0].gate.eps=range(0.1, inf, step=0.1): range bounds must be finite numbers (got inf)",
        ),
        (
            ["gate=saturation", "calibrate.grid='choice(0.1, inf)'"],
            "calibrate.grid=choice(0.1, inf): inf is not a value of gate.eps; gate=saturation needs each to be a "
            "number > 0 (finite)",
        ),
        (
            ["gate=margin", "calibrate.grid='range(1, inf, step=1)'"],
            "calibrate.grid=range(1, inf, step=1): range bounds must be finite numbers (got inf)",
        ),
    ],
)
def test_non_finite_numbers_are_refused(overrides, message):
    assert refused(*overrides) == message


def test_bench_with_an_infinite_threshold_writes_nothing(tmp_path):
    root = tmp_path / "x"
    seen = fresh_process("bench", "model=tiny-llama", "gate=saturation", "gate.eps=inf", f"results.root={root}")
    assert seen["code"] == 2 and seen["loads"] == 0
    assert seen["errors"] == ["error: gate.eps=inf: must be a number > 0 (finite) for gate=saturation"]
    assert not root.exists()


# ------------------------------------------------------------------ 4. calibration settings


@pytest.mark.parametrize(
    "override, message",
    [
        ("calibrate.delta=1", "calibrate.delta=1.0: must be a number in (0, 1)"),
        ("calibrate.delta=0", "calibrate.delta=0.0: must be a number in (0, 1)"),
        ("calibrate.delta=inf", "calibrate.delta=inf: must be a number in (0, 1)"),
        ("calibrate.epsilon=1", "calibrate.epsilon=1.0: must be a number in (0, 1)"),  # a guarantee of nothing
        ("calibrate.epsilon=0", "calibrate.epsilon=0.0: must be a number in (0, 1)"),
        ("calibrate.split=1", "calibrate.split=1.0: must be a number in (0, 1)"),
        ("calibrate.split=nan", "calibrate.split=nan: must be a number in (0, 1)"),
    ],
)
def test_calibration_settings_that_cannot_work_are_refused(override, message):
    assert refused("gate=margin", override) == message


def test_calibrate_delta_1_exits_2_before_the_model_loads(tmp_path, capsys):
    from sweep.models import model_loads

    loads = model_loads()
    code, err = cli(tmp_path, capsys, "calibrate", "model=tiny-llama", "calibrate.delta=1", f"results.root={tmp_path}")
    assert code == 2 and err == ["error: calibrate.delta=1.0: must be a number in (0, 1)"]
    assert model_loads() == loads


# ------------------------------------------------------------------ 5. calibration ladders


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "calibrate.grid='choice(a,b)'",
            "calibrate.grid=choice(a,b): 'a' is not a value of gate.eps; gate=saturation needs each to be a number "
            "> 0 (finite)",
        ),
        (
            "calibrate.grid=choice(a,b)",
            "calibrate.grid=choice(a,b): a sweep expression as a value must be quoted: calibrate.grid='choice(a,b)'",
        ),
        (
            "calibrate.grid='choice(0.1, true)'",
            "calibrate.grid=choice(0.1, true): True is not a value of gate.eps",
        ),
        ("calibrate.grid='interval(0.1, 0.5)'", "calibrate.grid: interval(...) is continuous; a grid needs choice"),
        ("calibrate.grid='range(0.1, 0.5, step=0)'", "calibrate.grid=range(0.1, 0.5, step=0): range(...) step must"),
        ("calibrate.grid='choice()'", "calibrate.grid=choice(): cannot parse"),
        (
            "calibrate.grid='range(1, 100001)'",
            "calibrate.grid=range(1, 100001): range(...) has 100000 values; at most 10000 (use a larger step)",
        ),
    ],
)
def test_a_ladder_that_is_not_numbers_fails_at_compose_naming_calibrate_grid(override, message):
    assert refused("gate=saturation", override).startswith(message)


def test_calibrate_with_a_non_numeric_ladder_fails_before_the_model_loads(tmp_path, capsys):
    from sweep.models import model_loads

    loads = model_loads()
    args = ["calibrate", "model=tiny-llama", "gate=margin", "gate.min_layer=1", "calibrate.grid='choice(a,b)'"]
    code, err = cli(tmp_path, capsys, *args)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: calibrate.grid=choice(a,b): 'a' is not a value")
    assert model_loads() == loads


def test_a_grid_too_large_to_run_is_refused():
    assert len(compose("search.spaces=[{gate: margin, gate.theta: 'range(0, 1000, step=0.1)'}]").search.spaces) == 1
    two = "search.spaces=[{gate: margin, gate.theta: 'range(0, 1000)', gate.min_layer: 'range(1, 200)'}]"
    from sweep.orchestrate.searches import search_for

    with pytest.raises(ConfigError, match=r"^search.spaces: the grid has 199000 trials; at most 100000 \(use fewer"):
        search_for(compose(two).search)  # as `sweep run` plans it


# ------------------------------------------------------------------ 6. unknown keys


@pytest.mark.parametrize(
    "override, message",
    [
        ("bogus.key=1", "bogus.key: unknown key at the top level (bogus); allowed: model, gate, prompts, seed"),
        ("bogus.a.b=1", "bogus.a.b: unknown key at the top level (bogus); allowed: model, gate"),
        ("profile.bogus.deep=1", "profile.bogus.deep: unknown key in profile (profile.bogus); allowed: gen_tokens"),
        ("profile.bogus=1", "profile.bogus: unknown key in profile; allowed: gen_tokens, topk, pca_k"),
        ("model.tiny.bogus=1", "model.tiny.bogus: unknown key in model.tiny; allowed: layers, hidden"),
        ("seed.x=1", "seed.x: seed is a value, not a section; set seed=VALUE"),
        (
            "search.objectives.speed=max",
            "search.objectives.speed: not a key of search.objectives; add it with +search.objectives.speed=VALUE",
        ),
    ],
)
def test_an_unknown_key_is_named_with_its_parent(override, message):
    assert refused(override).startswith(message)


# ------------------------------------------------------------------ 7. the pca gate's k


def test_pca_k_is_bounded_by_the_tiny_models_hidden_size_at_compose():
    bound = "(at most model.tiny.hidden=64, the hidden size of model=tiny-llama)"
    assert (
        refused("model=tiny-llama", "gate=pca", "gate.k=99999") == f"gate.k=99999: must be an integer in 1..64 {bound}"
    )
    assert refused("model=tiny-llama", "gate=pca", "gate.k=65") == f"gate.k=65: must be an integer in 1..64 {bound}"
    assert compose("model=tiny-llama", "gate=pca", "gate.k=64").gate.k == 64


def test_pca_k_states_the_hidden_size_as_its_bound():
    from sweep.gates import PARAMS, check_model

    assert PARAMS["k"].domain.allowed == "an integer >= 1 and at most the model's hidden size"
    pca = compose("gate=pca", "gate.k=99999", "gate.min_layer=1").gate  # hidden size unknown until the model loads
    with pytest.raises(ConfigError) as info:
        check_model(pca, 30, hidden_size=576)
    assert str(info.value) == "gate.k=99999: must be an integer in 1..576 (at most the hidden size of this model, 576)"
    assert (
        refused("gate=pca", "gate.k=0")
        == "gate.k=0: must be an integer >= 1 and at most the model's hidden size for gate=pca"
    )


def test_bench_with_a_pca_k_over_the_hidden_size_loads_nothing_and_writes_nothing(tmp_path, capsys):
    from sweep.models import model_loads

    loads = model_loads()
    root = tmp_path / "r"
    code, err = cli(tmp_path, capsys, "bench", "model=tiny-llama", "gate=pca", "gate.k=100", f"results.root={root}")
    assert code == 2 and len(err) == 1 and err[0].startswith("error: gate.k=100: must be an integer in 1..64")
    assert model_loads() == loads and not root.exists()


# ------------------------------------------------------------------ 8. issue 25: ranges, sizes and edited metadata


def test_seeds_are_bounded_by_what_their_generators_take():
    assert refused("seed=18446744073709551615") == (
        "seed=18446744073709551615: must be an integer in 0..9223372036854775807 (2^63 - 1, torch's)"
    )
    assert refused("search=optuna-mo", "search.seed=4294967296") == (
        "search.seed=4294967296: must be an integer in 0..4294967295 (2^32 - 1, Optuna's samplers)"
    )
    assert compose("seed=9223372036854775807", "search.seed=4294967295").seed == 2**63 - 1


def _edited(path: Path, target: Path, **meta: str) -> Path:
    """``path``'s readouts with metadata edited and the digest recomputed, so it passes the digest check."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from sweep.gates.readouts import content_digest

    with safe_open(str(path), framework="pt") as f:
        old, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    old.pop("digest")
    new = {**old, **meta}
    save_file(tensors, str(target), metadata={**new, "digest": content_digest(tensors, new)})
    return target


EDITS = {
    "prompt_ids not a list": {"prompt_ids": "5"},
    "prompt_ids an object": {"prompt_ids": "{}", "prompt_digests": "[]"},  # would bypass the overlap check
    "prompt_ids an empty list": {"prompt_ids": "[]", "prompt_digests": "[]"},
    "prompt_ids of numbers": {"prompt_ids": "[1, 2, 3]"},
    "prompt_digests not one per prompt": {"prompt_digests": '["00"]'},
    "prompt_digests not a list": {"prompt_digests": '"abc"'},
    "gen_tokens not a number": {"gen_tokens": "many"},
    "num_layers zero": {"num_layers": "0"},
}


@pytest.mark.parametrize("meta", EDITS.values(), ids=EDITS.keys())
def test_readouts_whose_metadata_was_edited_are_refused_in_one_line(llama_readouts, tmp_path, capsys, meta):
    target = _edited(llama_readouts, tmp_path / "edited.safetensors", **meta)
    root = tmp_path / "r"
    args = ["bench", "model=tiny-llama", "gate=classifier", f"gate.readouts={target}", "prompts.start=3"]
    code, err = cli(
        tmp_path, capsys, *args, "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", f"results.root={root}"
    )
    assert code == 2 and len([e for e in err if e.startswith("error:")]) == 1, err
    assert err[-1].startswith(f"error: gate.readouts={target}: its metadata") and "unexpected" not in err[-1]
    assert not root.exists()


def _auto_env(address: str) -> dict:
    """A user's environment: `auto` found through RAY_ADDRESS, no loopback mode set beforehand."""
    env = {**os.environ, "RAY_ADDRESS": address, "RAY_AUTH_MODE": "token", "OMP_NUM_THREADS": "1"}
    for key in ("SWEEP_DEBUG", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_TOKEN_PATH"):
        env.pop(key, None)
    return env


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_cluster_address_auto_names_the_loopback_address_it_found(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket is closed
    sweep_exe = str(Path(sys.executable).with_name("sweep"))
    args = [
        sweep_exe,
        "run",
        "model=tiny-llama",
        "cluster=existing",
        "cluster.address=auto",
        f"results.root={tmp_path}",
    ]
    res = subprocess.run(args, env=_auto_env(f"127.0.0.1:{port}"), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    [line] = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: cluster.address=auto: nothing answers at 127.0.0.1:{port};"), line


@pytest.mark.ray
def test_cluster_address_auto_joins_a_cluster_on_loopback(tmp_path):
    import secrets

    from conftest import ROOT, subprocess_env

    token = tmp_path / "token"  # the cluster's own token (never ~/.ray/auth_token), given to the driver too
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    helper = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "helpers" / "local_cluster.py"), "0"],
        env=subprocess_env(RAY_AUTH_TOKEN_PATH=str(token)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = helper.stdout.readline()
        assert line, helper.stderr.read()[-2000:]
        gcs = json.loads(line)["gcs"]
        assert gcs.startswith("127.0.0.1:")
        sweep_exe = str(Path(sys.executable).with_name("sweep"))
        tiny = ["model=tiny-llama", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0"]
        space = "search.spaces=[{gate: saturation, gate.min_layer: 2, gate.eps: 0.1}]"
        args = [sweep_exe, "run", *tiny, space, "cluster=existing", "cluster.address=auto", f"results.root={tmp_path}"]
        env = {**_auto_env(gcs), "RAY_AUTH_TOKEN_PATH": str(token)}
        res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "the Ray cluster at auto" in res.stderr and "1 setting measured and written" in res.stdout
    finally:
        helper.stdin.close()
        helper.wait(timeout=60)


@pytest.mark.parametrize(
    "args, says",
    [
        (["a" * 300 + "=1"], "a" * 40 + "...: not a config key (300 characters"),
        (["run_id=a\nb"], r"cannot parse the override 'run_id=a\nb': it holds a control character"),
    ],
)
def test_odd_overrides_are_one_whole_line(tmp_path, args, says):
    done = run_cli("bench", "model=tiny-llama", f"results.root={tmp_path}", *args)
    assert done.returncode == 2 and says in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_odd_prompts_are_one_line_naming_the_prompt(tmp_path):
    import json

    surrogate = tmp_path / "s.jsonl"
    surrogate.write_text('{"id": "s", "prompt": "bad \\ud800 here"}\n')
    done = run_cli(
        "bench", "model=tiny-llama", "prompts=jsonl", f"prompts.path={surrogate}", f"results.root={tmp_path}"
    )
    assert done.returncode == 2 and "prompt s: not valid Unicode" in done.stderr
    long = tmp_path / "l.jsonl"
    long.write_text(json.dumps({"id": "long", "prompt": "word " * 1000}) + "\n")  # 5000 byte tokens; context 4096
    done = run_cli(
        "bench", "model=tiny-llama", "prompts=jsonl", f"prompts.path={long}", "prompts.max_tokens=100000",
        f"results.root={tmp_path}",
    )  # fmt: skip
    assert done.returncode == 2 and "prompt long: 5000 tokens, at or over the model's context of 4096" in done.stderr
    assert "bench.gen_tokens" not in done.stderr  # the prompt is to blame, not the generation length
