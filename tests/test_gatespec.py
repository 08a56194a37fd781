"""The gate registry: one registration per gate (spec and class, torch-free to import), checked before any
model loads or Ray starts, and the source of every table's gate columns."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
import sys

import pytest

from sweep.config import GateConfig, compose
from sweep.errors import ConfigError
from sweep.gates import GATE_COLUMNS, GATES, LAYER_KEYS, PARAMS, Resolved, check_gate, check_model, gate_text


def _python(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"stderr": out.stderr}


def test_config_and_the_gate_registry_import_no_torch():
    seen = _python(
        "import json, sys; import sweep.config; from sweep.config import compose; compose(['gate=softmax']);"
        "import sweep.gates; assert len(sweep.gates.GATES) > 5;"
        "print(json.dumps({m: m in sys.modules for m in ('torch', 'sweep.gates.signals', 'ray', 'transformers')}))"
    )
    assert seen == {
        "torch": False,
        "sweep.gates.signals": False,
        "ray": False,
        "transformers": False,
        "stderr": seen["stderr"],
    }


def test_every_gate_class_takes_its_declarations_from_its_registration():
    for spec in GATES:
        cls = spec.cls
        assert cls is not None and cls.spec is spec and cls.name == spec.name
        assert (cls.params, cls.probe, cls.threshold, cls.aggressive) == (
            spec.params,
            spec.probe,
            spec.threshold,
            spec.aggressive,
        )


def test_gate_config_fields_are_the_tables_parameters():
    fields = [f.name for f in dataclasses.fields(GateConfig)]
    assert fields == ["name", "min_layer", "min_depth", *PARAMS, "lens", "readouts"]
    assert GATE_COLUMNS == (*PARAMS, "lens")


def test_every_table_carrying_a_gate_has_exactly_the_tables_gate_columns():
    from sweep.store import TABLES

    carrying = [
        t for t in TABLES.values() if "gate" in {c.name for c in t.columns} and "eps" in {c.name for c in t.columns}
    ]
    assert {t.name for t in carrying} >= {"trials", "simulated"}
    for table in carrying:
        columns = {c.name: c for c in table.columns}
        for param in PARAMS.values():
            assert param.name in columns, (table.name, param.name)
            units = {g.name: g.unit(param.name) for g in GATES if param.name in g.accepts}
            column = columns[param.name]
            if len(set(units.values())) > 1:  # the unit depends on the gate: each gate's, from its spec
                assert dict(column.unit_by_gate) == units and column.unit.startswith("per gate: ")
            else:
                assert column.unit == param.unit and not column.unit_by_gate


def test_a_new_parameter_reaches_the_schema_from_the_table(monkeypatch):
    """The store derives its gate columns from PARAMS: a parameter added there is a column."""
    import importlib

    import sweep.gates.spec as gs
    import sweep.store._columns as columns

    extra = gs.ParamSpec("gamma", float, gs.Domain(lambda v: v > 0, "a number > 0"), "logits", "a test parameter")
    monkeypatch.setitem(gs.PARAMS, "gamma", extra)
    try:
        fresh = importlib.reload(columns)
        added = [c for c in fresh.GATE_FIELDS if c.name == "gamma"]
        assert len(added) == 1 and added[0].unit == "logits" and added[0].nullable
    finally:
        monkeypatch.delitem(gs.PARAMS, "gamma")
        importlib.reload(columns)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["gate=softmax", "gate.theta=1.5"], "gate.theta=1.5: must be a number in [0, 1]"),
        (["gate=saturation", "gate.theta=2"], "gate.theta=2.0: not a parameter of gate=saturation"),
        (["gate=margin", "gate.decay=4"], "gate.decay=4.0: not a parameter of gate=margin"),
        (["gate=pca", "gate.k=null"], "gate.k: required for gate=pca"),
        (["gate=conformal", "gate.q=0"], "gate.q=0: must be a number in (0, 1] for gate=conformal"),
        (["gate=softmax", "gate.decay=-1"], "gate.decay=-1: must be a number >= 0 (finite) for gate=softmax"),
        # a key outside its widest domain is said as the gate says it (it said "... or null", which the gate refuses)
        (["gate=saturation", "gate.q=2"], "gate.q=2: not a parameter of gate=saturation"),
        (["gate=conformal", "gate.q=1.5"], "gate.q=1.5: must be a number in (0, 1] for gate=conformal"),
        # ... only where the gate's check names the same key (here it would name gate.q, required)
        (
            ["gate=conformal", "gate.q=null", "gate.min_depth=0"],
            "gate.min_depth=0.0: must be a number in (0, 1] or null",
        ),
        (
            ["gate=margin", "search=optuna-mo", "search.spaces=[{gate: softmax, gate.theta: 'interval(0.1, 2)'}]"],
            "search.spaces[0].gate.theta=2.0: must be a number in [0, 1]",
        ),
        (
            ["search.spaces=[{gate: 'choice(margin, softmax)', gate.theta: 'choice(0.5, 3)'}]"],
            "search.spaces[0].gate.theta=3: must be a number in [0, 1] (a probability margin) for gate=softmax",
        ),
        (
            ["search.spaces=[{gate: saturation, gate.theta: 'choice(1, 2)'}]"],
            "search.spaces[0].gate.theta=1: not a parameter of gate=saturation",
        ),
        (
            ["search.spaces=[{gate: saturaton, gate.eps: 0.1}]"],
            "search.spaces[0].gate=saturaton: unknown gate (did you mean 'saturation'?)",
        ),
        (
            ["gate=softmax", "calibrate.grid='range(0.5, 2.0, step=0.5)'"],
            "calibrate.grid=range(0.5, 2.0, step=0.5): 1.5 is not a value of gate.theta; gate=softmax needs each to "
            "be a number in [0, 1]",
        ),
    ],
)
def test_config_only_rules_fail_at_compose(overrides, message):
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert message in str(err.value)


def needs(name: str, readouts: str = "readouts.safetensors") -> list[str]:
    """What a gate needs beyond its conf file, from its registration: a gate that reads `sweep fit`'s readouts
    (not opened at compose) names a file; a skip-set draft runs in bench.mode=self_speculative."""
    spec = GATES.get(name, key="gate")
    return [f"gate.readouts={readouts}"] * spec.readouts + ["bench.mode=self_speculative"] * ("skip" in spec.params)


def test_valid_settings_of_every_gate_pass():
    for name in GATES.names():
        cfg = compose([f"gate={name}", *needs(name)])  # every conf/gate file is a valid setting of its gate
        assert check_gate(cfg.gate).name == name


def test_check_model_is_the_one_check_against_the_model():
    fixed = compose(["gate=fixed", "gate.exit_layer=15"]).gate
    assert check_model(fixed, 30).exit_layer == 15
    with pytest.raises(ConfigError, match=r"gate.exit_layer=15: must be in 1..12"):
        check_model(fixed, 12)
    deep = compose(["gate=saturation", "gate.min_layer=40"]).gate
    with pytest.raises(ConfigError, match=r"gate.min_layer=40: must be in 1..30"):
        check_model(deep, 30)
    assert check_model(compose(["gate=saturation", "gate.min_depth=0.5"]).gate, 30).min_layer == 15
    pca = compose(["gate=pca", "gate.k=128", "gate.min_layer=1"]).gate
    assert check_model(pca, 4).min_layer == 1  # the hidden size unknown: k is checked when it is
    with pytest.raises(ConfigError, match=r"gate.k=128: must be an integer in 1..64 \(at most the hidden size"):
        check_model(pca, 4, hidden_size=64)


def test_the_full_gate_is_one_setting_whatever_its_layer_keys():
    from sweep.config.identity import trial_columns

    plain = compose(["gate=full", "model=tiny-llama"])
    for keys in (["gate.min_layer=3"], ["gate.min_depth=0.5"]):
        given = compose(["gate=full", "model=tiny-llama", *keys])
        assert (given.gate.min_layer, given.gate.min_depth) == (1, None), keys
        assert trial_columns(given)["trial_id"] == trial_columns(plain)["trial_id"], keys


def test_gate_text_is_the_one_text_form():
    from sweep.analysis._pareto import params_text
    from sweep.gates import make_gate

    gate = make_gate(compose(["gate=margin", "gate.theta=14", "gate.min_layer=8"]).gate, 30)
    assert gate.describe() == "gate=margin theta=14 min_layer=8"
    row = gate.values()
    assert gate_text(row) == "theta=14 min_layer=8"
    assert params_text({**row, "mode": "early_exit", "batch_size": 1}) == "theta=14 min_layer=8"
    fixed = make_gate(compose(["gate=fixed", "gate.exit_layer=null", "gate.min_layer=5"]).gate, 30)
    assert gate_text(fixed.values()) == "exit_layer=5 min_layer=5"


SCRIPT = """
import json, sys
import sweep.models as models
from sweep.cli.commands import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loads": models.model_loads(), "ray": "ray" in sys.modules}))
"""


def test_bench_with_an_out_of_domain_threshold_fails_before_any_model_loads():
    seen = _python(SCRIPT, "bench", "model=tiny-llama", "gate=softmax", "gate.theta=1.5")
    assert seen["code"] == 2 and seen["loads"] == 0
    assert "error: gate.theta=1.5: must be a number in [0, 1] (a probability margin) for gate=softmax" in seen["stderr"]


def test_run_with_an_out_of_domain_search_value_fails_before_ray_starts():
    seen = _python(
        SCRIPT,
        "run",
        "model=tiny-llama",
        "search=optuna-mo",
        "search.spaces=[{gate: softmax, gate.theta: 'interval(0.1, 1.5)'}]",
    )
    assert seen["code"] == 2 and seen["loads"] == 0 and seen["ray"] is False
    assert "search.spaces[0].gate.theta=1.5: must be a number in [0, 1]" in seen["stderr"]


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_an_unreadable_readouts_file_fails_before_any_model_loads_or_ray_starts(tmp_path):
    """A readouts file that is missing, or not one, was found when the model had loaded (`sweep run`: in every
    trial, a failed row each, rc 1); its header is read when the config is validated."""
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    bench = ("bench", "model=tiny-llama", "gate=classifier", "gate.theta=0.9", f"results.root={tmp_path / 'r'}")
    seen = _python(SCRIPT, *bench, f"gate.readouts={empty}")
    assert seen["code"] == 2 and seen["loads"] == 0
    assert f"error: gate.readouts={empty}: not a readable safetensors file" in seen["stderr"]
    missing = tmp_path / "missing.safetensors"
    space = "search.spaces=[{gate.theta: 'choice(0.5, 0.9)'}]"
    seen = _python(SCRIPT, "run", *bench[1:4], f"gate.readouts={missing}", space, f"results.root={tmp_path / 'r'}")
    assert seen["code"] == 2 and seen["loads"] == 0 and seen["ray"] is False
    assert f"error: gate.readouts={missing}: no such file" in seen["stderr"]
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- depth-relative defaults (issue 13, item 10)

SMOLLM2_DEPTH = 30  # SmolLM2-135M's layers: the defaults keep the layers it had before min_depth (layer 8, exit 15)
BEFORE = {"full": (1, None), "skip": (1, None), "fixed": (15, 15)}  # (min_layer, exit_layer) at L=30; others: (8, None)


@pytest.mark.parametrize("name", GATES.names())
def test_every_gates_default_first_layer_is_a_fraction_of_depth(name):
    import yaml

    from conftest import ROOT

    conf = yaml.safe_load((ROOT / "conf" / "gate" / f"{name}.yaml").read_text())
    if name not in ("full", "skip"):  # the full and skip gates never exit: min_layer 1, as before
        assert conf.get("min_layer") is None and 0 < conf["min_depth"] <= 1, conf
    gate = compose([f"gate={name}", *needs(name)]).gate
    assert check_model(gate, SMOLLM2_DEPTH) == Resolved(*BEFORE.get(name, (8, None)))
    tiny = check_model(gate, 4)  # the default no longer fails on a 4-layer model ("must be in 1..4")
    assert 1 <= tiny.min_layer <= 4 and (tiny.exit_layer is None) == (name != "fixed")
    deep = check_model(gate, 80).min_layer  # and scales with depth
    assert deep == {"full": 1, "skip": 1, "fixed": 40}.get(name, 20)


def test_an_explicit_min_layer_wins_over_the_default_min_depth():
    gate = compose(["gate=saturation", "gate.min_layer=3"]).gate
    assert (gate.min_layer, gate.min_depth) == (3, None)  # the row records min_depth null: the setting gave a layer
    assert check_model(gate, 4).min_layer == 3 and check_model(gate, SMOLLM2_DEPTH).min_layer == 3
    with pytest.raises(ConfigError, match=r"gate.min_layer=3: must be in 1..2 \(L=2"):
        check_model(gate, 2)
    # an explicit min_depth wins over a min_layer a conf file set (this experiment sets min_layer: 8)
    assert compose(["experiment=calibrate-saturation"]).gate.min_layer == 8
    depth = compose(["experiment=calibrate-saturation", "gate.min_depth=0.5"]).gate
    assert (depth.min_layer, depth.min_depth) == (None, 0.5) and check_model(depth, SMOLLM2_DEPTH).min_layer == 15
    with pytest.raises(ConfigError, match=r"^gate.min_layer=3 and gate.min_depth=0.5: set one of them"):
        compose(["gate=saturation", "gate.min_layer=3", "gate.min_depth=0.5"])
    # the fixed gate's min_depth only gives its default exit: an explicit exit_layer drops it
    fixed = compose(["gate=fixed", "gate.exit_layer=10"]).gate
    assert fixed.min_depth is None and check_model(fixed, SMOLLM2_DEPTH) == Resolved(1, 10)
    with pytest.raises(ConfigError, match=r"gate.exit_layer=10: must be in 15..30"):  # both explicit: checked
        check_model(compose(["gate=fixed", "gate.exit_layer=10", "gate.min_depth=0.5"]).gate, SMOLLM2_DEPTH)


def test_min_layer_resolution_for_gates_built_in_code():
    def resolved(**kw):
        return check_model(GateConfig(name="margin", theta=1.0, **kw), SMOLLM2_DEPTH).min_layer

    assert resolved() == 1  # neither: 1
    assert resolved(min_layer=2, min_depth=0.9) == 2  # min_layer wins
    assert resolved(min_depth=0.25) == 8  # ceil(7.5)
    assert resolved(min_depth=0.1) == 3  # ceil(3.0), not ceil(3.0000000000000004) = 4
    assert resolved(min_depth=0.01) == 1 and resolved(min_depth=1.0) == SMOLLM2_DEPTH


def test_search_spaces_over_min_layer_or_min_depth_compose_to_one_of_them():
    from sweep.config.search import grid

    spaces = (
        "search.spaces=[{gate: margin, gate.min_layer: 'choice(2, 3)'}, "
        "{gate: saturation, gate.min_depth: 'choice(0.25, 0.5)'}]"
    )
    trials = grid(compose([spaces]).search)
    gates = [compose(trial).gate for trial in trials]
    assert [(g.name, g.min_layer, g.min_depth) for g in gates] == [
        ("margin", 2, None),
        ("margin", 3, None),
        ("saturation", None, 0.25),
        ("saturation", None, 0.5),
    ]
    assert [check_model(g, SMOLLM2_DEPTH).min_layer for g in gates] == [2, 3, 8, 15]


def test_every_gate_with_its_defaults_benches_a_4_layer_model(tmp_path, llama_readouts):
    """Each gate's conf defaults run `sweep bench` on tiny-llama (L=4): the row carries the
    resolved min_layer (and min_depth, the setting); an explicit gate.min_layer=3 wins."""
    from sweep.bench.command import prepare
    from sweep.bench.protocol import run_trial

    fast = ["model=tiny-llama", f"results.root={tmp_path}", "prompts.start=3", "prompts.n=1", "bench.gen_tokens=2"]
    fast += ["bench.warmup=0", "bench.repeats=1"]
    for name in GATES.names():
        cfg = compose([*fast, f"gate={name}", *needs(name, llama_readouts)])
        row = run_trial(cfg, *prepare(cfg))
        assert row["status"] in ("ok", "nondeterministic"), (name, row.get("error"))
        expected = {"full": 1, "fixed": 2}.get(name, 1)  # ceil(0.5 * 4) = 2; ceil(0.25 * 4) = 1
        assert (row["min_layer"], row["min_depth"]) == (expected, cfg.gate.min_depth), name
        assert row["exit_layer"] == (2 if name == "fixed" else None)
    cfg = compose([*fast, "gate=saturation", "gate.min_layer=3"])
    row = run_trial(cfg, *prepare(cfg))
    assert (row["min_layer"], row["min_depth"]) == (3, None)


# ---------------------------------------------------------------- one registration, one conf file per gate


def conf_problems(conf_gate: Path) -> list[str]:
    """What does not hold between the registry and ``conf_gate`` (conf/gate/): a file per registered gate and a
    gate per file, each naming its gate and holding only the gate's own keys (its parameters, the layer keys;
    lens and readouts where it reads a lens), with defaults its checks accept."""
    import yaml

    files = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(conf_gate.glob("*.yaml"))}
    problems = [f"{n}: no conf file" for n in GATES.names() if n not in files]
    problems += [f"{n}: no registered gate" for n in files if n not in GATES]
    for name, conf in files.items():
        if name not in GATES:
            continue
        spec = GATES.get(name, key="gate")
        own = {"name", *LAYER_KEYS, *spec.accepts} | ({"lens", "readouts"} if len(spec.lenses) > 1 else set())
        if conf.get("name") != name:
            problems.append(f"{name}: names gate {conf.get('name')}")
        if set(conf) - own:
            problems.append(f"{name}: keys the gate does not take: {sorted(set(conf) - own)}")
        try:
            check_gate({**conf, **({"readouts": "r.safetensors"} if spec.readouts else {})})
        except ConfigError as exc:
            problems.append(f"{name}: {exc}")
    return problems


def test_conf_gate_holds_one_file_per_registered_gate_with_only_its_own_keys():
    from conftest import ROOT

    assert conf_problems(ROOT / "conf" / "gate") == []


def test_the_conf_check_finds_what_is_out_of_step(tmp_path):
    import shutil

    from conftest import ROOT

    shutil.copytree(ROOT / "conf" / "gate", tmp_path, dirs_exist_ok=True)
    (tmp_path / "margin.yaml").write_text((tmp_path / "margin.yaml").read_text() + "eps: null\n")
    (tmp_path / "pca.yaml").unlink()
    (tmp_path / "orphan.yaml").write_text("name: orphan\n")
    (tmp_path / "softmax.yaml").write_text("name: softmax\nmin_depth: 0.25\ntheta: 2.0\n")
    assert conf_problems(tmp_path) == [
        "pca: no conf file",
        "orphan: no registered gate",
        "margin: keys the gate does not take: ['eps']",
        "softmax: gate.theta=2.0: must be a number in [0, 1] (a probability margin) for gate=softmax",
    ]


def test_a_gate_registered_twice_is_refused():
    from sweep.gates import Gate, register
    from sweep.gates.spec import GateSpec

    with pytest.raises(ValueError, match="gate 'margin' is registered twice"):
        register(GateSpec("margin", "again", probe="lens", signal="margin", params=("theta",), threshold="theta"))(
            type("Again", (Gate,), {})
        )
    assert GATES.get("margin", key="gate").cls.__name__ == "MarginGate"


def test_gate_keys_a_conf_file_leaves_out_compose_as_every_gate_had_them():
    """A gate's conf file holds only its own keys; the composed setting still has every GateConfig key (null,
    the logit lens), so trial ids are what they were, and another gate's key is refused by name."""
    cfg = compose(["gate=saturation"]).gate
    assert dataclasses.asdict(cfg) == {
        **{f.name: None for f in dataclasses.fields(GateConfig)},
        "name": "saturation",
        "min_depth": 0.25,
        "eps": 0.1,
        "lens": "logit",
    }
    with pytest.raises(ConfigError, match=r"^gate.theta=2.0: not a parameter of gate=saturation"):
        compose(["gate=saturation", "gate.theta=2"])
    assert compose(["gate=saturation", "+gate.eps=0.3"]).gate.eps == 0.3


@pytest.mark.parametrize(
    "gate, takes",
    [
        ("margin", "theta, min_layer, min_depth, lens, readouts"),  # a tuned lens reads readouts
        ("classifier", "theta, min_layer, min_depth, lens, readouts"),
        ("fixed", "exit_layer, min_layer, min_depth"),
    ],
)
def test_a_key_a_gate_does_not_take_names_every_key_it_does(gate, takes):
    """Before: margin's list left out lens and readouts, which it takes."""
    with pytest.raises(ConfigError) as exc:
        compose([f"gate={gate}", "gate.decay=0.5"])
    assert str(exc.value) == f"gate.decay=0.5: not a parameter of gate={gate} (it takes: {takes})"
