"""The Optuna study of a sweep stands on its own: loaded with plain `optuna.load_study`, it
names its metrics, its parameters readably, links every trial to its Parquet row
(`trial_id`), and keeps its constraints where optuna-dashboard and Optuna's samplers read them."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import polars as pl
import pytest

from conftest import compose, sweep
from sweep.analysis import ok_trials
from sweep.config.search import Param, spaces
from sweep.store import read

# a third sub-space whose trials fail in the bench (tiny-llama has 4 layers): failed trials
# are in the study too; it fixes the margin gate again with another theta range, so both
# margin sub-spaces' theta get their own name
FAILING = (
    "search.spaces=[{gate: saturation, gate.eps: 'tag(log, interval(0.02, 0.6))', "
    "gate.min_depth: 'interval(0.1, 0.75)'}, {gate: margin, gate.theta: 'interval(1.0, 24.0)', "
    "gate.min_depth: 'interval(0.1, 0.75)'}, {gate: margin, gate.theta: 'interval(2.0, 3.0)', gate.min_layer: 9}]"
)


# the ranked wall-clock speedup as the objective (the shipped searches climb the cost model's speedup_model)
WALL = ("~search.objectives", "+search.objectives={speedup_wall: max}")


def load(outcome) -> optuna.Study:
    """The study as anyone opens it: a plain SQLite URL, no project code."""
    storage = f"sqlite:///{Path(outcome.root) / 'ray' / outcome.name / 'optuna.db'}"
    (summary,) = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage)


def check_study(study: optuna.Study, root: Path, n_trials: int) -> None:
    """Metric names, user attributes, parameter names and constraints; the study joined to the
    trials table on trial_id."""
    assert study.metric_names == ["speedup_wall"]
    assert study.user_attrs["objectives"] == {"speedup_wall": "max"}
    assert study.user_attrs["constraints"] == ["agreement >= 0.98", "skipped_compute"]
    assert study.user_attrs["subspaces"] == ["saturation", "margin#1", "margin#2"]
    assert study.user_attrs["trials_table"] == str(root / "trials")
    trials = study.trials
    assert len(trials) == n_trials
    rows = read("trials", root)
    by_id = {row["trial_id"]: row for row in rows.to_dicts()}
    allowed = {
        "saturation": {"subspace", "gate.eps", "gate.min_depth"},
        "margin#1": {"subspace", "margin#1/gate.theta", "gate.min_depth"},
        "margin#2": {"subspace", "margin#2/gate.theta"},
    }
    for trial in trials:
        attrs = trial.user_attrs
        assert {"trial_id", "gate", "model", "status"} <= set(attrs), trial
        assert attrs["model"] == "tiny-llama" and attrs["gate"] in {"saturation", "margin"}
        assert set(trial.params) == allowed[trial.params["subspace"]]
        row = by_id[attrs["trial_id"]]  # every trial, failed ones too, finds its row
        assert (row["gate"], row["status"]) == (attrs["gate"], attrs["status"])
        if trial.params["subspace"] == "margin#2":
            assert trial.state == optuna.trial.TrialState.FAIL and attrs["status"] == "failed"
            assert "must be in 1..4" in attrs["error"] and "constraints" not in trial.system_attrs
            continue
        skip = 0.0 if attrs["skipped_compute"] else 1.0
        assert trial.state == optuna.trial.TrialState.COMPLETE and attrs["status"] == "ok"
        # optuna-dashboard reads the list in system attribute "constraints"; Optuna's samplers read it too
        assert trial.system_attrs["constraints"] == [pytest.approx(0.98 - row["agreement"]), skip]
        assert trial.constraints == {"0": pytest.approx(0.98 - row["agreement"]), "1": skip}
        assert attrs["speedup_wall_measured"] == pytest.approx(row["speedup_wall"])  # the raw ratio
        assert not any(key.startswith("constraints:") for key in trial.system_attrs)
        assert attrs["agreement"] == pytest.approx(row["agreement"])
        theta = trial.params.get("margin#1/gate.theta")
        assert row["theta"] == (pytest.approx(theta) if theta is not None else None)
        if "gate.eps" in trial.params:
            assert row["eps"] == pytest.approx(trial.params["gate.eps"])
        assert row["min_depth"] == pytest.approx(trial.params["gate.min_depth"])

    # the join a reader makes: trials_dataframe() on user_attrs_trial_id, the trials table on trial_id
    df = pl.from_pandas(study.trials_dataframe())
    assert "value_speedup_wall" in df.columns and "values_0" not in df.columns and "value" not in df.columns
    joined = df.filter(pl.col("state") == "COMPLETE").join(
        rows, left_on="user_attrs_trial_id", right_on="trial_id", how="left"
    )
    assert joined.height == sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) > 0
    assert joined["run_id"].null_count() == 0  # every COMPLETE trial found its row
    # the objective is the analysis's own ranked speedup; the raw ratio is a user attribute
    ranked = ok_trials(rows).collect().select("trial_id", "speedup")
    both = joined.join(ranked, left_on="user_attrs_trial_id", right_on="trial_id", how="left")
    assert both["value_speedup_wall"].to_list() == pytest.approx(both["speedup"].to_list())
    assert both["user_attrs_speedup_wall_measured"].to_list() == pytest.approx(both["speedup_wall"].to_list())


def test_study_stands_on_its_own_and_survives_a_resume(ray_session, tmp_path):
    """A constrained sweep over three sub-spaces (one fails in the bench), then resumed with
    one more trial: the study reloaded from SQLite keeps its names and attributes."""
    outcome = sweep(tmp_path, "search=optuna-constrained", FAILING, *WALL, "search.n_trials=4", "search.seed=3")
    study = load(outcome)
    assert {t.params["subspace"] for t in study.trials} == {"saturation", "margin#1", "margin#2"}, (
        "pick a seed whose 4 trials visit every sub-space"
    )
    check_study(study, tmp_path, 4)
    print("metric_names:", study.metric_names)
    for trial in study.trials[:2]:
        print(f"trial {trial.number}: {trial.state.name} params={trial.params}")
        print(f"  user_attrs={trial.user_attrs}\n  system_attrs={trial.system_attrs}")

    resumed = sweep(
        tmp_path,
        "search=optuna-constrained",
        FAILING,
        *WALL,
        "search.n_trials=5",
        "search.seed=3",
        "resume=true",
        f"sweep.name={outcome.name}",
    )
    assert resumed.name == outcome.name and resumed.total == 5
    check_study(load(resumed), tmp_path, 5)


def test_multi_objective_study_names_both_metrics(ray_session, tmp_path):
    """The shipped optuna-mo climbs the cost model's speedup (the trial's own exits, priced), beside agreement."""
    outcome = sweep(tmp_path, "search=optuna-mo", "search.n_trials=3")
    study = load(outcome)
    assert study.metric_names == ["speedup_model", "agreement"]
    df = study.trials_dataframe()
    assert {"values_speedup_model", "values_agreement", "user_attrs_trial_id"} <= set(df.columns)
    rows = {r["trial_id"]: r for r in read("trials", tmp_path).to_dicts()}
    for trial in study.trials:
        row = rows[trial.user_attrs["trial_id"]]
        assert trial.values == pytest.approx([row["speedup_model"], row["agreement"]])
        assert set(trial.params) <= {"subspace", "gate.eps", "gate.theta", "gate.min_depth"}
        assert trial.params["subspace"] == row["gate"]  # subspaces labelled by their gate
        assert trial.system_attrs["constraints"] == [0.0 if trial.user_attrs["skipped_compute"] else 1.0]


# ---------------------------------------------------------------- names, without Ray


def test_parameter_names_are_config_paths_unless_distributions_differ(ray_session):
    from sweep.orchestrate.searches.study import param_names, subspace_labels

    for name in ("optuna-mo", "optuna-constrained"):
        parsed = spaces(compose(f"search={name}").search)
        labels = subspace_labels(parsed)
        assert labels == ["saturation", "margin"]
        assert param_names(parsed, labels) == [
            {"gate.eps": "gate.eps", "gate.min_depth": "gate.min_depth"},
            {"gate.theta": "gate.theta", "gate.min_depth": "gate.min_depth"},
        ]
    subspaces = [
        [Param("gate", "fixed", ("softmax",)), Param("gate.theta", "interval", low=0.1, high=0.9)],
        [Param("gate", "fixed", ("margin",)), Param("gate.theta", "interval", low=1.0, high=24.0)],
        [Param("gate.theta", "choice", (1, 2))],
    ]
    labels = subspace_labels(subspaces)
    assert labels == ["softmax", "margin", "space2"]
    assert [list(names.values()) for names in param_names(subspaces, labels)] == [
        ["softmax/gate.theta"],
        ["margin/gate.theta"],
        ["space2/gate.theta"],
    ]


def test_a_name_keeps_one_distribution_per_study(ray_session):
    """Sub-spaces that give one config path different distributions (even different kinds)
    run in one study without Optuna refusing a parameter."""
    from sweep.orchestrate.searches.study import DefineByRun

    cfg = compose(
        "search=optuna-mo",
        "search.spaces=[{gate: saturation, gate.min_depth: 'interval(0.1, 0.5)'}, "
        "{gate: margin, gate.min_depth: 'choice(0.25, 0.5)'}, {gate: margin, gate.min_depth: 'interval(0.5, 0.75)'}]",
    )
    space = DefineByRun(spaces(cfg.search))
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(12):
        trial = study.ask()
        overrides = space(trial)["trial"]
        study.tell(trial, [0.5, 0.5])
        (value,) = [o for o in overrides if o.startswith("gate.min_depth=")]
        assert float(value.split("=")[1]) == pytest.approx(next(iter(v for k, v in trial.params.items() if "/" in k)))
    names = {name for t in study.trials for name in t.params}
    assert names == {"subspace", "saturation/gate.min_depth", "margin#1/gate.min_depth", "margin#2/gate.min_depth"}
    assert all(re.fullmatch(r"[\w#]+/gate\.min_depth|subspace", n) for n in names)


def test_a_trial_without_a_row_still_names_it(ray_session, tmp_path):
    """A trial whose worker died (Tune gives up on it: no result) or that Tune stopped before
    it ran carries what the driver can compose: the trial id its row would have, gate, model."""
    from conftest import TINY_SWEEP
    from sweep.config.identity import trial_identity
    from sweep.orchestrate.settings import trial_config
    from sweep.orchestrate.ray.searcher import optuna_search

    base = [*TINY_SWEEP, "search=optuna-mo"]
    search = optuna_search(compose(*base).search, tmp_path, base=base, device="cpu", root=tmp_path)
    died, stopped, partial = search.suggest("died"), search.suggest("stopped"), search.suggest("partial")
    search.on_trial_complete("died", error=True)
    search.on_trial_complete("stopped")
    # a row without its partition columns (read from one Parquet file): gate and model composed
    ok = {"status": "ok", "speedup_wall": 1.5, "speedup_model": 1.4, "agreement": 0.9}
    search.on_trial_complete("partial", result={**ok, "row": {**ok, "trial_id": "abc"}})
    study = optuna.load_study(study_name="optuna-mo", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    first, second, third = study.trials
    assert third.state == optuna.trial.TrialState.COMPLETE and third.values == [1.4, 0.9]  # speedup_model
    cfg3 = trial_config(base, partial["trial"], "cpu")
    assert third.user_attrs == {
        "trial_id": "abc",
        "status": "ok",
        "gate": cfg3.gate.name,
        "model": "tiny-llama",
        "speedup_wall_measured": 1.5,
        "skipped_compute": False,  # a row without its exits: nothing says it skipped compute
    }
    cfg = trial_config(base, died["trial"], "cpu")
    assert first.state == optuna.trial.TrialState.FAIL
    assert first.user_attrs == {
        "status": "failed",
        "error": "the trial's worker failed more than sweep.max_failures times",
        "trial_id": trial_identity(cfg, "cpu").id,
        "gate": cfg.gate.name,
        "model": "tiny-llama",
    }
    assert second.state == optuna.trial.TrialState.PRUNED and second.user_attrs["status"] == "not run"
    assert second.user_attrs["trial_id"] == trial_identity(trial_config(base, stopped["trial"], "cpu"), "cpu").id


def _one_setting_search(tmp_path, monkeypatch):
    """An Optuna search over a space of one setting (every proposal repeats it), asked again 3 times at most."""
    from conftest import TINY_SWEEP
    from sweep.config.identity import trial_identity
    from sweep.orchestrate.settings import trial_config
    from sweep.orchestrate.ray.searcher import ConstrainedOptunaSearch, optuna_search

    monkeypatch.setattr(ConstrainedOptunaSearch, "ASKS", 3)
    base = [*TINY_SWEEP, "search=optuna-mo", "search.spaces=[{gate: saturation, gate.eps: 'choice(0.3)'}]"]
    search = optuna_search(compose(*base).search, tmp_path, base=base, device="cpu", root=tmp_path)

    def identity(proposal) -> str:
        return trial_identity(trial_config(base, proposal["trial"], "cpu"), "cpu").id

    def trials():
        study = optuna.load_study(study_name="optuna-mo", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
        return study.trials

    return search, identity, trials


@pytest.mark.parametrize("flattened", [False, True])
def test_a_setting_this_run_measured_and_proposed_again_is_told_from_its_row(tmp_path, monkeypatch, flattened):
    """A setting measured in this run and proposed again is told to the study with its row's figures and identity
    (``from_row``), as an earlier run's rows are, whichever form the result reaches the searcher in (Tune hands it
    flattened, ``row/<column>``)."""
    search, identity, trials = _one_setting_search(tmp_path, monkeypatch)
    first = search.suggest("first")
    tid = identity(first)
    ok = {"status": "ok", "speedup_wall": 1.5, "speedup_model": 1.4, "agreement": 0.9}
    row = {**ok, "trial_id": tid, "gate": "saturation", "model": "tiny-llama"}
    result = {**ok, **({f"row/{k}": v for k, v in row.items()} if flattened else {"row": row})}
    search.on_trial_complete("first", result=result)
    assert identity(search.suggest("again")) == tid
    repeats = [t for t in trials()[1:] if t.state != optuna.trial.TrialState.RUNNING]
    assert len(repeats) == 3 and all(t.user_attrs.get("from_row") for t in repeats)
    assert {(t.state, tuple(t.values), t.user_attrs["trial_id"]) for t in repeats} == {
        (optuna.trial.TrialState.COMPLETE, (1.4, 0.9), tid)
    }


def test_a_setting_still_running_and_proposed_again_is_told_failed_as_a_repeat(tmp_path, monkeypatch):
    """A proposal of a setting that is still running (no row yet) is told failed, marked ``repeat_of`` that setting:
    nothing is known of it to tell."""
    search, identity, trials = _one_setting_search(tmp_path, monkeypatch)
    tid = identity(search.suggest("running"))
    assert identity(search.suggest("again")) == tid
    repeats = [t for t in trials()[1:] if t.state != optuna.trial.TrialState.RUNNING]
    assert len(repeats) == 3
    assert {(t.state, t.user_attrs.get("repeat_of"), t.user_attrs.get("from_row")) for t in repeats} == {
        (optuna.trial.TrialState.FAIL, tid, None)
    }


def _layer_one_search(tmp_path, monkeypatch, known=None):
    """An Optuna search whose every draw is the fixed exit after layer 1 of tiny-llama's 4 (gate.min_depth in
    (0.1, 0.25]: ceil(4 * d) = 1), asked again 3 times at most; each proposal's trial id and key."""
    from conftest import TINY_SWEEP
    from sweep.config.identity import trial_identity
    from sweep.orchestrate.settings import trial_config
    from sweep.orchestrate.ray.searcher import ConstrainedOptunaSearch, optuna_search

    monkeypatch.setattr(ConstrainedOptunaSearch, "ASKS", 3)
    base = [*TINY_SWEEP, "search=optuna-mo", "search.spaces=[{gate: fixed, gate.min_depth: 'interval(0.1, 0.25)'}]"]
    search = optuna_search(compose(*base).search, tmp_path, base=base, device="cpu", root=tmp_path, known=known)

    def identity(proposal):
        return trial_identity(trial_config(base, proposal["trial"], "cpu"), "cpu")

    def trials():
        return optuna.load_study(study_name="optuna-mo", storage=f"sqlite:///{tmp_path / 'optuna.db'}").trials

    return search, identity, trials


def _measured(ident, min_layer: int, **figures) -> dict:
    """A row of the setting ``ident`` (its trial id and key) as a bench writes it, its gate resolved to min_layer."""
    ok = {"status": "ok", "speedup_wall": 1.5, "speedup_model": 1.4, "agreement": 0.25, **figures}
    return {
        **ok,
        "trial_id": ident.id,
        "trial_key": ident.key,
        "gate": "fixed",
        "model": "tiny-llama",
        "min_layer": min_layer,
    }


def test_draws_of_min_depth_that_resolve_to_a_measured_layer_are_told_from_its_row(tmp_path, monkeypatch):
    """Two draws of gate.min_depth that resolve to one layer run the same gate: the second is told to the study from
    the first's row and not measured again (before: 8 trials of a study over tiny-llama's depths measured the exit
    after layer 2 five times, each its own trial id, and the front took the luckiest of the five timings); when the
    study keeps proposing it, the setting that runs is the measured one, which its worker reports from its row."""
    search, identity, trials = _layer_one_search(tmp_path, monkeypatch)
    first = identity(search.suggest("first"))
    row = _measured(first, 1)
    search.on_trial_complete("first", result={**{k: row[k] for k in ("status", "speedup_model")}, "row": row})
    again = search.suggest("again")
    repeats = [t for t in trials()[1:] if t.state != optuna.trial.TrialState.RUNNING]
    assert (
        len(repeats) == 3
        and len({t.params["gate.min_depth"] for t in repeats} | {trials()[0].params["gate.min_depth"]}) == 4
    )  # four draws, one layer
    assert {(t.state, tuple(t.values), t.user_attrs["trial_id"], t.user_attrs.get("from_row")) for t in repeats} == {
        (optuna.trial.TrialState.COMPLETE, (1.4, 0.25), first.id, True)
    }
    assert identity(again).id == first.id  # asked enough: the measured setting, found by its trial id


def test_a_min_depth_draw_is_told_from_a_row_that_named_its_layer(tmp_path, monkeypatch):
    """A row of another sweep that gave the layer itself (gate.min_layer=1) is the setting a draw of min_depth
    resolving to layer 1 runs; a proposal still running is a repeat by the layer too, named by its trial id."""
    from conftest import TINY_SWEEP
    from sweep.config.identity import trial_identity
    from sweep.orchestrate.settings import trial_config

    named = trial_identity(trial_config([*TINY_SWEEP, "gate=fixed", "gate.min_layer=1"], [], "cpu"), "cpu")
    search, identity, trials = _layer_one_search(tmp_path, monkeypatch, known={named.id: _measured(named, 1)})
    search.suggest("first")
    told = [t for t in trials() if t.state != optuna.trial.TrialState.RUNNING]
    assert len(told) == 3 and {(t.user_attrs["trial_id"], t.user_attrs.get("from_row")) for t in told} == {
        (named.id, True)
    }

    search, identity, trials = _layer_one_search(tmp_path / "running", monkeypatch)
    running = identity(search.suggest("running"))
    search.suggest("again")
    repeats = [t for t in trials()[1:] if t.state != optuna.trial.TrialState.RUNNING]
    assert len(repeats) == 3 and {(t.state, t.user_attrs.get("repeat_of")) for t in repeats} == {
        (optuna.trial.TrialState.FAIL, running.id)
    }


def test_a_study_whose_space_runs_out_ends_with_the_settings_it_holds(ray_session, tmp_path, monkeypatch, caplog):
    """gate.min_depth in (0.1, 0.75] of tiny-llama's 4 layers is three settings (exits after layers 1, 2, 3): a study
    asked for 6 measures each once, ends when its proposals only repeat them, and is not an interruption (its end
    runs; before: 8 draws measured layer 2 five times under five trial ids)."""
    from sweep.orchestrate.ray.searcher import ConstrainedOptunaSearch

    monkeypatch.setattr(ConstrainedOptunaSearch, "ASKS", 10)
    space = "search.spaces=[{gate: fixed, gate.min_depth: 'interval(0.1, 0.75)'}]"
    with caplog.at_level("INFO", logger="sweep"):
        outcome = sweep(tmp_path, "search=optuna-mo", space, "search.n_trials=6")
    rows = read("trials", tmp_path).filter(pl.col("repeats") == 1)
    assert sorted(rows["min_layer"].to_list()) == [1, 2, 3] and rows["trial_id"].n_unique() == 3
    assert not outcome.interrupted and outcome.written == read("trials", tmp_path).height  # its end re-timed
    assert "(its space looks spent), so it ends with 3 settings of search.n_trials=6" in caplog.text


def test_a_resumed_study_extended_from_4_to_8_settings_measures_8_distinct_ones(ray_session, tmp_path):
    """search.n_trials counts distinct settings: a study of 4 resumed with 8 ends with 8 distinct settings, each
    with its row; the resumed sampler is not restarted on the stream that drew the first 4, and a proposal of a
    setting that has its row is told to the study from that row (``from_row``) without running again."""
    space = (
        "search.spaces=[{gate: saturation, gate.min_layer: 2, gate.eps: 'choice(0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.7)'}]"
    )
    first = sweep(tmp_path, "search=optuna-mo", space, "search.n_trials=4")

    def sampled():  # the study's own settings, at the sweep's one timed round (its best are then re-timed)
        return read("trials", tmp_path).filter(pl.col("repeats") == 1)

    assert sampled()["trial_id"].n_unique() == sampled().height == 4
    resumed = sweep(tmp_path, "search=optuna-mo", space, "search.n_trials=8", "resume=true", f"sweep.name={first.name}")
    rows = sampled()
    assert rows.height == rows["trial_id"].n_unique() == 8
    assert sorted(rows["eps"].to_list()) == [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]  # the whole space, once each
    study = load(resumed)
    ran = {t.user_attrs["trial_id"] for t in study.trials if not t.user_attrs.get("from_row")}
    assert ran >= set(rows["trial_id"].to_list()) and resumed.written >= 4
    for t in study.trials:  # a setting proposed again carries its row's figures
        if t.user_attrs.get("from_row"):
            row = rows.filter(pl.col("trial_id") == t.user_attrs["trial_id"]).row(0, named=True)
            assert t.values[1] == pytest.approx(row["agreement"])


def test_an_optuna_sweep_run_again_continues_its_study_and_shows_every_setting_of_it(ray_session, tmp_path):
    """A plain re-run (no resume, no sweep.name) of the same definition continues the earlier sweep, as a screen's or
    a skip-set study's does: nothing new is drawn (before: a fresh study drew search.n_trials more settings each time),
    and its end, like a resume's, shows every setting the study holds, not only this run's."""
    space = "search.spaces=[{gate: saturation, gate.min_layer: 2, gate.eps: 'choice(0.05,0.1,0.2,0.3,0.4,0.5)'}]"
    first = sweep(tmp_path, "search=optuna-mo", space, "search.n_trials=3")
    trials = len(load(first).trials)
    again = sweep(tmp_path, "search=optuna-mo", space, "search.n_trials=3")
    assert again.name == first.name and again.written == 0 and len(load(again).trials) == trials
    assert again.skipped == len(again.rows)  # its summary's count: every setting shown is one whose row exists
    assert {r["trial_id"] for r in again.rows} == {r["trial_id"] for r in first.rows}
    more = sweep(tmp_path, "search=optuna-mo", space, "search.n_trials=4", "resume=true", f"sweep.name={first.name}")
    assert {r["trial_id"] for r in more.rows} >= {r["trial_id"] for r in first.rows}  # the earlier ones too
    assert len({r["trial_id"] for r in more.rows if r["repeats"] == 1}) == 4


def test_a_trial_stopped_before_its_id_was_recorded_counts_by_its_setting_on_a_resume(ray_session, tmp_path):
    """A stop signal can end a study trial (told failed, no user attributes) after its setting's row was written: a
    resume knows the trial by its parameters, so the row counts and the sweep does not draw a setting more than
    search.n_trials (before: n_trials=2 ended with 3 distinct settings)."""
    import sqlite3

    space = "search.spaces=[{gate: saturation, gate.min_layer: 2, gate.eps: 'choice(0.05,0.1,0.2,0.3,0.4,0.5)'}]"
    first = sweep(tmp_path, "search=optuna-mo", space, "search.n_trials=2")
    db = Path(first.root) / "ray" / first.name / "optuna.db"
    with sqlite3.connect(db) as con:  # as the interruption leaves it: failed, its attributes never set
        (last,) = con.execute("SELECT max(trial_id) FROM trials").fetchone()
        con.execute("DELETE FROM trial_user_attributes WHERE trial_id = ?", (last,))
        con.execute("DELETE FROM trial_values WHERE trial_id = ?", (last,))
        con.execute("UPDATE trials SET state = 'FAIL' WHERE trial_id = ?", (last,))
    resumed = sweep(tmp_path, "search=optuna-mo", space, "search.n_trials=2", "resume=true", f"sweep.name={first.name}")
    assert resumed.written == 0
    sampled = read("trials", tmp_path).filter(pl.col("repeats") == 1)["trial_id"]
    assert sampled.n_unique() == 2
    assert {r["trial_id"] for r in resumed.rows} >= set(sampled)  # its end shows that setting too


def test_the_settings_a_study_ends_with_are_retimed_to_the_floor_target(ray_session, tmp_path):
    """The study climbs speedup_model; its Pareto set (feasible, found here by brute force) is timed again with
    the rounds that bring each one's A/A floor to analysis.floor_target (projected from its own rounds, at most
    64): a row per such setting, the same setting at those rounds."""
    from sweep.bench.noise import rounds_for_floor
    from sweep.orchestrate.searches._optuna import MAX_ROUNDS

    target = ["analysis.floor_target=0.001"]  # tighter than 3 rounds of a tiny model give: each is timed again
    exiting = "search.spaces=[{gate: saturation, gate.min_layer: 1, gate.eps: 'interval(0.5, 1.2)'}]"  # feasible
    outcome = sweep(
        tmp_path, "search=optuna-mo", exiting, "search.n_trials=4", "bench.repeats=3", "prompts.n=2", *target
    )
    study = load(outcome)
    rows = {r["trial_id"]: r for r in read("trials", tmp_path).to_dicts()}
    done = [
        t
        for t in study.trials
        if t.state == optuna.trial.TrialState.COMPLETE and all(c <= 0 for c in t.system_attrs["constraints"])
    ]
    pareto = [
        t
        for t in done
        if not any(o.values[0] >= t.values[0] and o.values[1] >= t.values[1] and o.values != t.values for o in done)
    ]
    expected = []
    for t in pareto:
        row = rows[t.user_attrs["trial_id"]]
        need = rounds_for_floor(row["round_baseline_ms"], row["round_aa_ms"], 0.001)
        rounds = min(need if need is not None else MAX_ROUNDS, MAX_ROUNDS)
        if rounds > 3:
            expected.append((row["gate"], row["eps"], row["theta"], row["min_depth"], rounds))
    retimed = [
        (r["gate"], r["eps"], r["theta"], r["min_depth"], r["repeats"]) for r in rows.values() if r["repeats"] > 3
    ]
    assert expected, "a setting whose 3 rounds leave a floor above the target"
    assert sorted(retimed, key=str) == sorted(set(expected), key=str)
    assert len(rows) == 4 + len(set(expected))  # the study's settings, then the re-timed ones
    # a finished study resumed: it draws nothing, and times again what its rows leave to do (nothing here)
    again = sweep(
        tmp_path,
        "search=optuna-mo",
        exiting,
        "search.n_trials=4",
        "bench.repeats=3",
        "prompts.n=2",
        *target,
        "resume=true",
        f"sweep.name={outcome.name}",
    )
    assert again.written == 0 and read("trials", tmp_path).height == len(rows)
    # ... and shows its re-timed rows beside the rows they re-time (it showed the study's alone, so its front and
    # verdict ranked a re-timed setting by its 3 rounds), counted as skipped (their rows exist), as the study's are
    assert sorted(r["trial_id"] for r in again.rows) == sorted(rows)
    assert again.skipped == len(rows) == 4 + len(set(expected))


def test_a_resume_counts_the_settings_the_sweep_measured_not_the_rows_it_found(tmp_path):
    """A sweep into a root holding another sweep's rows measured 10 settings when left alone, and 7 when stopped and
    resumed (a reader's): its resume counted the rows the study was told from (``from_row``) as settings it had
    measured, which the uninterrupted run spends no sample on."""
    from sweep.orchestrate.searches.study import optuna_storage_url, remaining_trials

    search = compose("search=optuna-mo", "search.n_trials=10").search
    study = optuna.create_study(
        study_name=search.name, storage=optuna_storage_url(tmp_path), directions=["maximize", "maximize"]
    )
    for i in range(8):  # 3 told from rows another sweep wrote, then 5 this sweep measured before it stopped
        trial = study.ask()
        trial.suggest_float("gate.eps", 0.1 + i / 100, 0.1 + i / 100)
        trial.set_user_attr("trial_id", f"t{i}")
        if i < 3:
            trial.set_user_attr("from_row", True)
        study.tell(trial, [1.0, 1.0])
    assert remaining_trials(search, tmp_path, rows={f"t{i}" for i in range(8)}) == 10 - 5


def test_a_trial_the_stop_left_running_carries_its_identity_and_why_it_failed(tmp_path):
    """A trial running when the sweep stopped is told failed on the resume; it had no user attributes, where every
    other trial names its trial_id and status (docs/sweeps.md). It now carries its setting's trial id (from its
    parameters), status ``interrupted`` and why."""
    from sweep.orchestrate.searches.study import optuna_storage_url, remaining_trials

    search = compose("search=optuna-mo", "search.n_trials=2").search
    study = optuna.create_study(
        study_name=search.name, storage=optuna_storage_url(tmp_path), directions=["maximize", "maximize"]
    )
    running = study.ask()
    running.suggest_float("gate.eps", 0.1, 0.5)
    left = remaining_trials(search, tmp_path, rows=set(), identify=lambda params: f"id-of-{params['gate.eps']:.3f}")
    (trial, *again) = optuna.load_study(study_name=search.name, storage=optuna_storage_url(tmp_path)).trials
    assert left == 2 and trial.state == optuna.trial.TrialState.FAIL
    assert trial.user_attrs["trial_id"] == f"id-of-{trial.params['gate.eps']:.3f}"
    assert trial.user_attrs["status"] == "interrupted" and "the sweep stopped while it ran" in trial.user_attrs["error"]
    assert [(t.state, t.system_attrs["fixed_params"]) for t in again] == [
        (optuna.trial.TrialState.WAITING, trial.params)
    ]
