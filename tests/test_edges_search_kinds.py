"""Behaviours of the search kinds at their edges that no other test pinned down, each found by changing the code and
seeing every test pass."""

from __future__ import annotations

import pytest

from conftest import compose
from sweep.errors import ConfigError

# ---------------------------------------------------------------- search spaces (sweep.config.search)


def test_an_interval_of_one_value_is_refused():
    """Broken: interval(0.5, 0.5), which "interval needs low < high" refuses, is taken as an interval of no width."""
    from sweep.config.search import parse_value

    with pytest.raises(ConfigError, match=r"^s.gate.eps=interval\(0.5, 0.5\): interval needs low < high$"):
        parse_value("gate.eps", "interval(0.5, 0.5)", "s.gate.eps")


def test_constraints_without_objectives_are_refused():
    """Broken: search.constraints with search.objectives=null (nothing to optimise under them) passes the check."""
    from sweep.config.search import check_search

    with pytest.raises(ConfigError, match=r"^search.constraints: supported with a single objective"):
        search = compose("search=saturation-grid", "search.objectives=null", "+search.constraints.agreement=0.9").search
        check_search(search)


# ---------------------------------------------------------------- each kind's settings (sweep.config.search_kinds)


def test_an_optuna_search_without_n_trials_is_refused():
    """Broken: an optuna search with search.n_trials=null is accepted, though nothing says how many settings it
    draws."""
    with pytest.raises(ConfigError, match=r"^search.n_trials: required for an optuna search$"):
        compose("search=optuna-constrained", "search.n_trials=null")


def test_a_bracket_may_keep_two_thresholds_per_line():
    """Broken: search.n_trials=2, the least a bracket search allows ("at least 2"), is refused."""
    from sweep.orchestrate.searches import search_for

    search = compose("search=bracket", "search.n_trials=2").search
    assert search_for(search).kind == "bracket" and search.n_trials == 2


def test_a_bracket_sub_space_choosing_among_gates_is_refused():
    """Broken: a bracket sub-space with gate: choice(saturation, margin) is accepted and bracketed by the first gate's
    threshold alone, though each line's gate brackets its own."""
    from sweep.orchestrate.searches import search_for

    with pytest.raises(ConfigError, match=r"^search.spaces\[0\]: a bracket sub-space names its gate \(gate"):
        search_for(compose("search=bracket", "search.spaces=[{gate: 'choice(saturation, margin)'}]").search)


def test_a_skipset_search_may_run_1000_sets_closed_loop():
    """Broken: search.closed_loop=1000, the most its own refusal allows ("an integer in 1..1000"), is refused."""
    assert compose("search=skipset-random", "search.closed_loop=1000").search.closed_loop == 1000
    with pytest.raises(ConfigError, match=r"^search.closed_loop=1001: must be an integer in 1..1000 or null"):
        compose("search=skipset-random", "search.closed_loop=1001")


def test_a_kind_chosen_with_a_plus_brings_its_own_keys():
    """Broken: +search.kind=optuna, typed with the '+' Hydra takes for a new key, sets the kind without the kind's own
    keys and their defaults (its sampler)."""
    chosen = ("+search.kind=optuna", "search.n_trials=2", "search.objectives={speedup_model: max}")
    search = compose("search=saturation-grid", *chosen).search
    assert (search.kind, search.sampler, search.n_trials) == ("optuna", "tpe", 2)


def test_a_skipset_search_of_two_sub_spaces_is_refused():
    """Broken: a skipset search given two sub-spaces plans the first alone and drops the second without a word."""
    from sweep.orchestrate.searches import search_for

    two = "search.spaces=[{gate: skip, bench.mode: self_speculative}, {gate: skip, bench.mode: self_speculative}]"
    with pytest.raises(ConfigError, match=r"^search.spaces: a skipset search has one sub-space \(it has 2\)$"):
        search_for(compose("search=skipset-random", two).search)


@pytest.mark.parametrize(
    "space, message",
    [
        (
            "{gate: skip, bench.mode: self_speculative, bench.gen_tokens: 'choice(4, 8)'}",
            "search.spaces[0].bench.gen_tokens: a skipset search fixes every key but the skip set (found a sweep)",
        ),
        (
            "{gate: skip, bench.mode: self_speculative, gate.skip: a1}",
            "search.spaces[0].gate.skip: the skip set is what a skipset search searches; leave gate.skip out",
        ),
    ],
)
def test_a_skipset_sub_space_fixes_all_but_the_skip_set(space, message):
    """Broken: a skipset sub-space that sweeps a key (its closed-loop settings take the first value alone) or names
    gate.skip (the study's drawn set replaces it) is accepted."""
    from sweep.orchestrate.searches import search_for

    with pytest.raises(ConfigError) as info:
        search_for(compose("search=skipset-random", f"search.spaces=[{space}]").search)
    assert str(info.value) == message


def test_a_screen_of_more_than_max_trials_settings_is_refused():
    """Broken: a screen's dense grid is not held to MAX_TRIALS as a grid's is, so 100001 settings are planned (each
    composed on the driver) rather than refused in one line."""
    over = "search.spaces=[{gate: margin, gate.theta: 'range(0, 9091)', gate.min_layer: 'range(1, 12)'}]"
    with pytest.raises(ConfigError, match=r"^search.spaces: the grid has 100001 trials; at most 100000 \(use fewer"):
        compose("search=screen", over)


def test_a_skip_ratio_range_may_start_at_0():
    """Broken: search.skip_ratio=[0, 0.5] (sets of any size up to half, "0 <= lo" as its refusal says) is refused."""
    assert compose("search=skipset-random", "search.skip_ratio=[0,0.5]").search.skip_ratio == [0, 0.5]


def test_a_bench_key_on_the_command_line_is_refused_only_where_the_study_draws_it():
    """Broken: bench.draft_stop given on the command line of a skipset search that draws no draft_stop (no
    search.draft_stops) is refused as though the study replaced it."""
    from sweep.config.search import check_given

    check_given(compose("search=skipset-random").search, {"bench.draft_stop", "bench.draft_len"})
    drawn = compose("search=skipset-random", "search.draft_stops=[null,0.3]").search
    with pytest.raises(ConfigError, match=r"^bench.draft_stop: search.draft_stops draws it with each set"):
        check_given(drawn, {"bench.draft_stop", "bench.draft_len"})


# ---------------------------------------------------------------- the Optuna study (sweep.orchestrate.searches.study)


def test_a_study_of_one_sub_space_has_no_subspace_parameter():
    """Broken: a study over one sub-space draws a `subspace` parameter of one choice, a column of one value in every
    trial and a name the study's readers look for only where there are several sub-spaces."""
    import optuna

    from sweep.config.search import spaces
    from sweep.orchestrate.searches.study import DefineByRun

    one = "search.spaces=[{gate: saturation, gate.eps: 'interval(0.1, 0.5)'}]"
    space = DefineByRun(spaces(compose("search=optuna-constrained", one).search))
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    assert space(trial)["trial"][0] == "gate=saturation"
    assert list(trial.params) == ["gate.eps"]


def test_a_sub_space_choosing_among_gates_is_labelled_by_its_place():
    """Broken: a sub-space whose gate is choice(saturation, margin) is labelled `saturation` in the study's
    `subspace` parameter, as though it held that gate alone."""
    from sweep.config.search import spaces
    from sweep.orchestrate.searches.study import subspace_labels

    two = "search.spaces=[{gate: 'choice(saturation, margin)', gate.min_depth: 0.5}, {gate: margin, gate.theta: 2}]"
    assert subspace_labels(spaces(compose(two).search)) == ["space0", "margin"]


def test_a_study_minimises_an_objective_given_min(tmp_path):
    """Broken: search.objectives.agreement=min makes a study that maximises agreement, the opposite of what was
    asked."""
    from sweep.orchestrate.searches.study import open_study, opened

    search = compose("search=optuna-mo", "search.objectives.agreement=min").search
    opened(search, tmp_path)
    assert search.objectives == {"speedup_model": "max", "agreement": "min"}
    assert [d.name for d in open_study(search, tmp_path).directions] == ["MAXIMIZE", "MINIMIZE"]


def test_a_resume_without_its_study_whose_own_rows_exceed_n_trials_draws_none(tmp_path):
    """Broken: an Optuna sweep resumed with a smaller search.n_trials than its own rows hold, after its study was
    moved away, is left a negative count of settings to draw."""
    from sweep.orchestrate.searches.study import remaining_trials

    search = compose("search=optuna-constrained", "search.n_trials=5").search
    assert remaining_trials(search, tmp_path, rows=set(), own={str(i) for i in range(7)}) == 0
    assert remaining_trials(search, tmp_path, rows=set(), own={"a", "b", "c"}) == 2


def test_a_best_setting_is_retimed_with_at_most_max_rounds(tmp_path):
    """Broken: a best setting whose A/A rounds vary widely (its floor would need 192 rounds to reach the target) is
    re-timed with all 192, not MAX_ROUNDS (64)."""
    from helpers.study import SETTING, study_told_one_row
    from sweep.orchestrate.searches._optuna import MAX_ROUNDS, Optuna

    plan, _, _ = study_told_one_row(
        tmp_path, repeats=2, round_baseline_ms=[[10.0, 10.0]] * 2, round_aa_ms=[[10.0, 12.0], [10.0, 8.0]]
    )
    assert Optuna().retime(plan, "cpu") == [[*SETTING, f"bench.repeats={MAX_ROUNDS}"]]
    assert MAX_ROUNDS == 64


# ---------------------------------------------------------------- the skip-set screen's study (skipstudy)


def test_of_two_sets_predicted_alike_the_longer_accepted_drafts_are_best():
    """Broken: of two skip sets with the same predicted speedup, the one with the shorter acceptance length is ranked
    first (the tie-break, higher acceptance length, turned round)."""
    import optuna

    from sweep.orchestrate.searches.skipstudy import best_trials, candidate

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for skip, accepted in (("a1", 2.0), ("m1", 3.0), ("a2", 1.0)):
        attrs = {"skip": skip, "ratio_violation": 0.0, "acceptance_length": accepted}
        study.add_trial(optuna.trial.create_trial(value=1.2, user_attrs=attrs))
    assert [candidate(t, None, 4).skip for t in best_trials(study, 2)] == ["m1", "a1"]


def test_a_study_holding_what_the_sweep_asks_says_no_reason_it_ended_short():
    """Broken: a study that ended short of an earlier n_trials (50 repeats in a row at 241 sets), continued asking
    for 241, is said to have screened "241 of search.n_trials=241" for want of more."""
    from types import SimpleNamespace

    from sweep.orchestrate.searches.skipstudy import ended

    study = SimpleNamespace(user_attrs={"ended": "repeats", "space": 256})
    assert ended(study, 241, 241) is None
    assert ended(study, 241, 242).startswith("241 of search.n_trials=242 screened: its last 50 proposals")


# ---------------------------------------------------------------- bracket and screen (_bracket, screening)


def test_of_two_thresholds_as_near_their_target_a_bracket_keeps_the_one_exiting_more():
    """Broken: of two thresholds whose replayed agreement is as near the target, a bracket keeps the one that exits
    less (the tie-break, then the one exiting more, turned round)."""
    import polars as pl

    from sweep.orchestrate.searches._bracket import kept

    table = pl.DataFrame({"agreement_tf": [0.9, 0.9, 0.5], "exit_rate": [0.2, 0.4, 0.8]})
    assert kept(table, 1) == [1]
    assert kept(table, 2) == [1, 2]


def test_a_margin_brackets_candidates_never_include_a_threshold_of_0():
    """Broken: a margin line's candidates include theta=0 (its quantile grid starting at 0, not in (0, 1]), a
    threshold every position with any margin exits at."""
    from conftest import load
    from helpers.contract import trace_of
    from sweep.gates import GATES
    from sweep.orchestrate.searches._bracket import candidates

    lm = load("model=tiny-llama")
    _, sig = trace_of(lm)
    gate = compose("model=tiny-llama", "gate=margin", "gate.min_layer=2").gate
    values = candidates(GATES.get("margin", key="gate"), gate, sig)
    assert min(values) > 0 and 1 / 64 in values and 1.0 in values


# ---------------------------------------------------------------- a skipset search's settings (_skipset)


def test_the_skip_set_screen_prices_the_longest_draft_it_draws():
    """Broken: with search.draft_lens=[2,4] the screen is set up at draft_len 2, so its cost model cannot price the
    verification of a 4-token draft the study draws."""
    from sweep.orchestrate.searches._skipset import screen_setting

    cfg = compose("model=tiny-llama", "search=skipset-random", "search.draft_lens=[2,4]")
    assert screen_setting(cfg) == ["gate=skip", "bench.mode=self_speculative", "gate.skip=none", "bench.draft_len=4"]
