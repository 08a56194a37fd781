"""Search spaces: Hydra's sweep grammar to grids and Optuna distributions."""

from __future__ import annotations

import pytest

from conftest import ROOT, compose
from sweep.errors import ConfigError
from sweep.config.search import Param, check_search, grid, parse_space, spaces

SEARCHES = sorted(p.stem for p in (ROOT / "conf" / "search").glob("*.yaml"))


def test_expressions_parse_to_typed_params():
    params = {
        p.key: p
        for p in parse_space(
            {
                "gate.eps": "choice(0.05, 0.1)",
                "gate.min_layer": "int(interval(2, 8))",
                "gate.theta": "tag(log, interval(0.5, 20))",
                "gate.q": "interval(0.5, 1.0)",
                "gate.min_depth": "range(0.25, 1.0, step=0.25)",
                "gate": "saturation",
                "bench.kv_policy": "choice(propagate, full)",
            },
            "s",
        )
    }
    assert params["gate.eps"] == Param("gate.eps", "choice", (0.05, 0.1))
    assert params["gate.min_layer"].integer and (params["gate.min_layer"].low, params["gate.min_layer"].high) == (2, 8)
    assert params["gate.theta"].log and not params["gate.theta"].integer
    assert params["gate.q"].kind == "interval" and not params["gate.q"].log
    assert params["gate.min_depth"].values == (0.25, 0.5, 0.75)
    assert params["gate"] == Param("gate", "fixed", ("saturation",))
    assert params["bench.kv_policy"].values == ("propagate", "full")
    # groups come first, as Hydra applies them
    assert parse_space({"gate.eps": "0.1", "gate": "saturation"}, "s")[0].key == "gate"


def test_ranges_do_not_drift_and_strings_are_quoted():
    from sweep.config.search import as_override

    assert parse_space({"gate.eps": "range(0.1, 0.45, step=0.1)"}, "s")[0].values == (0.1, 0.2, 0.3, 0.4)
    assert parse_space({"gate.min_layer": "range(2, 9, step=3)"}, "s")[0].values == (2, 5, 8)
    assert as_override("prompts.path", "/data/my prompts.jsonl") == "prompts.path='/data/my prompts.jsonl'"
    assert as_override("model", "tiny-llama") == "model=tiny-llama" and as_override("gate.eps", None) == "gate.eps=null"


def test_grid_is_the_union_of_cross_products():
    assert len(grid(compose("search=saturation-grid").search)) == 8
    trials = grid(compose("search=gates-grid").search)
    assert len(trials) == 1 + 4 + 3 + 1
    assert trials[0] == ["gate=fixed", "gate.exit_layer=null", "gate.min_depth=0.5"]
    assert {t[0] for t in trials} == {"gate=fixed", "gate=saturation", "gate=margin", "gate=conformal"}


def test_one_function_maps_every_kind_to_an_optuna_distribution():
    import optuna

    from sweep.orchestrate.searches.study import distribution as d

    assert d(Param("k", "choice", (1, 2))) == optuna.distributions.CategoricalDistribution([1, 2])
    assert d(Param("k", "interval", low=2, high=8, integer=True)) == optuna.distributions.IntDistribution(2, 8)
    log = optuna.distributions.FloatDistribution(0.01, 1.0, log=True)
    assert d(Param("k", "interval", low=0.01, high=1.0, log=True)) == log
    assert d(Param("k", "fixed", ("x",))) == optuna.distributions.CategoricalDistribution(["x"])


def test_define_by_run_suggests_composable_overrides(ray_session):
    import optuna

    study = optuna.create_study(directions=["maximize", "maximize"], sampler=optuna.samplers.RandomSampler(seed=1))
    from sweep.orchestrate.searches.study import DefineByRun

    space = DefineByRun(spaces(compose("search=optuna-mo").search))
    seen = set()
    for _ in range(8):
        overrides = space(study.ask())["trial"]
        cfg = compose("model=tiny-llama", *overrides)
        seen.add(cfg.gate.name)
        assert 0.02 <= (cfg.gate.eps or 0.02) <= 0.6 and 0.1 <= cfg.gate.min_depth <= 0.75
    assert seen == {"saturation", "margin"}


@pytest.mark.parametrize("name", SEARCHES)
def test_every_shipped_search_composes_with_the_real_conf(name):
    cfg = compose(f"search={name}", "model=tiny-llama")
    check_search(cfg.search)
    for params in spaces(cfg.search):
        corner = [f"{p.key}={p.values[0] if p.values else p.low}" for p in params]
        compose("model=tiny-llama", *(c.replace("=None", "=null") for c in corner))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["search.kind=grid", "search=optuna-mo"],
            "interval(...) is continuous; a grid needs choice(...) or range(...)",
        ),
        (["+search.objectives.speed=max"], "search.objectives.speed: not a metric"),
        # keys that would change nothing: refused rather than accepted silently
        (
            ["search=saturation-grid", "search.n_trials=3"],
            "search.n_trials=3: a grid search runs every setting of its sub-spaces; n_trials counts the settings of "
            "an optuna, bracket or skipset search (leave it null)",
        ),
        (["search=screen", "search.n_trials=3"], "search.n_trials=3: a screen search replays every setting"),
        (["search=bracket", "search.n_trials=1"], "search.n_trials=1: at least 2 for a bracket search"),
        (
            ["search=optuna-constrained", "search.constraints.agreement=1.5"],
            "search.constraints.agreement=1.5: must be a number in [0, 1] (agreement is a fraction",
        ),
        (["search=optuna-constrained", "search.constraints.agreement=-1"], "search.constraints.agreement=-1: must be"),
        (
            ["search.spaces=[{gate: saturation, gate.eps: 'range(0.3,0.1)'}]"],
            "search.spaces[0].gate.eps=range(0.3,0.1): range(...) has no values (it runs from 0.3 towards 0.1",
        ),
        (
            ["search.max_accuracy_loss=0.1"],
            "search.max_accuracy_loss=0.1: stops a task's gated side on its accuracy loss; measure a task with "
            "eval.task=humaneval|harness, or leave it null",
        ),
        # a key of another kind, typed with or without '+': the kinds that take it (once: "a value, not a section")
        (
            ["search=optuna-mo", "search.neighbours=2"],
            "search.neighbours: a key of a bracket or screen search, not of this optuna search (search.kind)",
        ),
        (
            ["search=optuna-mo", "+search.neighbours=2"],
            "search.neighbours: a key of a bracket or screen search, not of this optuna search (search.kind)",
        ),
        (
            ["search=screen", "search.sampler=tpe"],
            "search.sampler: a key of an optuna or skipset search, not of this screen search (search.kind)",
        ),
        (
            ["search.kind=optuna", "search.closed_loop=3"],
            "search.closed_loop: a key of a skipset search, not of this optuna search (search.kind)",
        ),
        (
            ["search.objectives={speed: max}"],
            "search.objectives.speed: not a key of search.objectives; add it with +search.objectives.speed=VALUE",
        ),
        (["search.objectives.agreement=up"], "search.objectives.agreement=up: must be max or min"),
        (
            ["search=optuna-constrained", "search.constraints.agreement=high"],
            "search.constraints.agreement=high: must be a number",
        ),
        (
            ["search.spaces=[{gate.eps: 'interval(0.5, 0.1)'}]", "search.kind=optuna", "search.n_trials=2"],
            "interval needs low < high",
        ),
        (
            ["search.spaces=[{gate.eps: 'tag(log, interval(0, 1))'}]", "search.kind=optuna", "search.n_trials=2"],
            "a log interval needs low > 0",
        ),
        (["search.spaces=[{gate.eps: 'choice(0.1,'}]"], "choice(0.1,: cannot parse (no viable alternative at input"),
        (
            ["search.spaces=[{gate: skip, bench.mode: self_speculative, bench.draft_stop: 'choice(null, 0.5)'}]"],
            "bench.draft_stop=choice(null, 0.5): cannot parse (choice(...) cannot hold null in Hydra's grammar; "
            "give the null value a space of its own)",
        ),
        (["search=optuna-constrained", "+search.objectives.agreement=max"], "supported with a single objective"),
        (
            ["search=skipset-optuna", "search.draft_stops=[0.3,1.5]"],
            "search.draft_stops=[0.3, 1.5]: must be a non-empty list of distinct draft_stop values (each null or a "
            "number in [0, 1]), or null",
        ),
        (["search=skipset-optuna", "search.draft_stops=[null,null]"], "search.draft_stops=[None, None]: must be"),
        (["search=skipset-optuna", "search.draft_stops=0.3"], "search.draft_stops=0.3: must be a non-empty list"),
        (["search=skipset-optuna", "search.draft_stops=[[0.3]]"], "search.draft_stops=[[0.3]]: must be a non-empty"),
        (["search=skipset-optuna", "search.draft_lens=[[2]]"], "search.draft_lens=[[2]]: must be a non-empty list"),
        (
            ["search=skipset-optuna", "search.draft_lens=[2,0]"],
            "search.draft_lens=[2, 0]: must be a non-empty list of distinct draft lengths (integers in 1..64), or null",
        ),
        (
            ["search=self-spec-grid", "+search.draft_lens=[2]"],
            "search.draft_lens: searched jointly with a skip set by a skipset search only (search.kind is grid); "
            "sweep bench.draft_len in search.spaces instead",
        ),
        (
            [
                "search=skipset-random",
                "search.draft_lens=[2,4]",
                "search.spaces=[{gate: skip, bench.mode: self_speculative, bench.draft_len: 4}]",
            ],
            "search.spaces[0].bench.draft_len: search.draft_lens searches bench.draft_len with the set; "
            "leave one of them out",
        ),
        (
            ["search=saturation-grid", "+search.draft_stops=[0.3]"],
            "search.draft_stops: searched jointly with a skip set by a skipset search only (search.kind is grid)",
        ),
        (
            [
                "search=skipset-optuna",
                "search.draft_stops=[null,0.3]",
                "search.spaces=[{gate: skip, bench.mode: self_speculative, bench.draft_stop: 0.5}]",
            ],
            "search.spaces[0].bench.draft_stop: search.draft_stops searches bench.draft_stop with the set; "
            "leave one of them out",
        ),
    ],
)
def test_bad_search_configs_are_clear_errors(overrides, message):
    """As `sweep run` plans: the config's own checks, then the search kind's (``search_for``)."""
    from sweep.orchestrate.searches import search_for

    with pytest.raises(ConfigError) as info:
        search = compose(*overrides).search
        check_search(search)
        search_for(search)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_an_unknown_search_key_is_told_what_the_chosen_kind_takes():
    shared = (
        "name, kind, spaces, n_trials, seed, objectives, constraints, min_agreement, max_accuracy_loss, rung_prompts"
    )
    for overrides, key, own in (
        (["search=saturation-grid", "search.foo=1"], "search.foo", ""),
        (["search=bracket", "search.foo=1"], "search.foo", ", neighbours"),
        (["search.foo=1", "search.bar=2"], "search.foo", ""),  # the kind is found without either
        (["search={n_trial: 3}"], "search.n_trial", ""),  # a mapping set whole (it recursed until Python gave up)
    ):
        with pytest.raises(ConfigError) as info:
            compose(*overrides)
        assert str(info.value) == f"{key}: unknown key in search; allowed: {shared}{own}", overrides


def test_a_whole_number_draft_stop_is_the_trial_bench_draft_stop_composes():
    """search.draft_stops=[null,0,1]: the values the study draws give the trial ids of the closed-loop rows,
    which compose bench.draft_stop=0 as 0.0 (an int in the list would give another id)."""
    import dataclasses

    from sweep.config.identity import trial_identity

    cfg = compose("model=tiny-llama", "search=skipset-optuna", "search.draft_stops=[null,0,1]")
    assert cfg.search.draft_stops == [None, 0.0, 1.0]
    setting = ["gate=skip", "gate.skip=a1", "bench.mode=self_speculative"]
    for stop in cfg.search.draft_stops[1:]:
        row = compose("model=tiny-llama", *setting, f"bench.draft_stop={int(stop)}")
        drawn = dataclasses.replace(row, bench=dataclasses.replace(row.bench, draft_stop=stop))
        assert trial_identity(drawn, "cpu").id == trial_identity(row, "cpu").id


# ---------------------------------------------------------------- search kinds (sweep.orchestrate.searches)


def test_every_shipped_search_names_a_registered_kind_and_passes_its_checks():
    from conftest import ROOT
    from sweep.orchestrate.searches import SEARCHES, search_for

    kinds = set()
    for path in sorted((ROOT / "conf" / "search").glob("*.yaml")):
        search = compose(f"search={path.stem}").search
        kinds.add(search_for(search).kind)
    assert kinds == set(SEARCHES.names())  # every kind has a shipped search, and every shipped search a kind


def test_an_unknown_search_kind_is_one_line_rc_2_before_any_work(tmp_path):
    from conftest import run_cli

    res = run_cli("run", "model=tiny-llama", "search.kind=random", f"results.root={tmp_path}", timeout=120)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 2 and errors == [
        "error: search.kind=random: unknown search kind; allowed: bracket, grid, optuna, screen, skipset"
    ], res.stderr[-2000:]
    assert not (tmp_path / "ray").exists() and not (tmp_path / "trials").exists()


def test_no_two_search_files_repeat_a_key_with_the_same_value():
    """The shared base (conf/config.yaml's `search:`) holds what every kind shares, a kind's file (conf/search/kind/)
    only its own keys, and a shipped search (conf/search/) only its own values: no shipped search repeats another's,
    its kind's or the base's, and no kind the base's. (Two kinds may each own a key of one name: the studies of
    optuna and skipset both sample with TPE unless told otherwise.)"""
    import itertools

    import yaml

    from conftest import ROOT

    conf = ROOT / "conf"

    def read(paths) -> dict[str, dict]:
        return {str(p.relative_to(conf)): yaml.safe_load(p.read_text()) for p in sorted(paths)}

    base = {"config.yaml search": yaml.safe_load((conf / "config.yaml").read_text())["search"]}
    shipped, kinds = read((conf / "search").glob("*.yaml")), read((conf / "search" / "kind").glob("*.yaml"))
    pairs = list(itertools.combinations({**base, **shipped}.items(), 2))
    pairs += list(itertools.product(kinds.items(), {**base, **shipped}.items()))
    repeated = [f"{a} and {b}: {key}" for (a, x), (b, y) in pairs for key in set(x) & set(y) if x[key] == y[key]]
    assert repeated == []


def test_every_search_kind_has_its_settings_its_file_and_its_behaviour():
    """One registry of kinds (the settings'): each has its own conf file and one behaviour, and nothing else is a
    kind."""
    from conftest import ROOT
    from sweep.config.search_kinds import SEARCH_KINDS
    from sweep.orchestrate.searches import SEARCHES

    kinds = set(SEARCH_KINDS.names())
    assert {p.stem for p in (ROOT / "conf" / "search" / "kind").glob("*.yaml")} == kinds
    assert set(SEARCHES.names()) == kinds
    for kind in kinds:  # search.kind=KIND brings the kind's own keys with it
        import yaml

        from sweep.config import compose_dict

        own = yaml.safe_load((ROOT / "conf" / "search" / "kind" / f"{kind}.yaml").read_text())
        composed = compose_dict([f"search.kind={kind}"])["search"]
        assert {k: composed[k] for k in own if k != "defaults"} == {k: v for k, v in own.items() if k != "defaults"}
