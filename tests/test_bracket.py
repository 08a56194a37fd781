"""`search=bracket`: thresholds bracketed from the model's own signal in a profile trace, through the search-kind
interface: it refuses bad input in one line, keeps thresholds dense where agreement falls, plans, runs the simulated
front closed-loop, resumes and runs again without tracing again (a report counting each setting once); the oracle
bound it prints is the first-match oracle's."""

from __future__ import annotations

import shutil

import polars as pl
import pytest

from conftest import compose, load, run_cli, sweep
from helpers.contract import trace_of
from sweep.errors import ConfigError
from sweep.orchestrate.searches import search_for
from sweep.orchestrate.searches._bracket import candidates, kept
from sweep.store import read

BRACKET = ["search=bracket", "search.n_trials=4"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["search.n_trials=null"], "search.n_trials: required for a bracket search (thresholds kept per line, >= 2)"),
        (
            ["search.spaces=[{gate: saturation, gate.eps: 'choice(0.1, 0.2)'}]"],
            "search.spaces[0].gate.eps: a bracket search derives it from the model's signal; leave it out",
        ),
        (["search.spaces=[{gate: full}]"], "search.spaces[0].gate=full: has no threshold to bracket"),
        (["search.spaces=[{gate.min_depth: 0.25}]"], "search.spaces[0]: a bracket sub-space names its gate"),
        (["search.spaces=[{gate: saturaton}]"], "search.spaces[0].gate=saturaton: unknown gate"),
    ],
)
def test_bad_bracket_searches_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        search_for(compose("search=bracket", *overrides).search)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_a_bad_bracket_is_refused_by_sweep_run_before_any_work(tmp_path):
    res = run_cli("run", "model=tiny-llama", *BRACKET, "search.spaces=[{gate: full}]", f"results.root={tmp_path}")
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 2 and errors == ["error: search.spaces[0].gate=full: has no threshold to bracket"]
    assert list(tmp_path.iterdir()) == []


def test_kept_thresholds_are_dense_near_agreement_1():
    """From the gentlest setting that exits to the harshest, at equal steps of log disagreement: distinct, the
    two ends included, closer together near agreement 1 than near 0; a setting that never exits is never kept."""
    agreement = [1.0] + [1.0 - i / 100 for i in range(101)]
    table = pl.DataFrame({"agreement_tf": agreement, "exit_rate": [0.0] + [0.01 + i / 200 for i in range(101)]})
    picked = kept(table, 5)
    values = [agreement[i] for i in picked]
    assert len(set(picked)) == 5 and 0 not in picked
    assert max(values) == 1.0 and min(values) == 0.0
    gaps = [a - b for a, b in zip(sorted(values, reverse=True), sorted(values, reverse=True)[1:])]
    assert gaps[0] < gaps[-1]  # dense where agreement begins to fall
    assert kept(table.with_columns(exit_rate=pl.lit(0.0)), 5) == []


def test_kept_thresholds_differ_in_what_they_do_on_the_trace():
    """Two thresholds that replay alike (same agreement, exits and exit layers: no value the model shows lies
    between them) are one closed-loop trial's worth: a line keeps n settings that each do something else."""
    table = pl.DataFrame(
        {
            "agreement_tf": [1.0, 0.96, 0.96, 0.96, 0.5, 0.2],
            "exit_rate": [0.0, 0.04, 0.04, 0.04, 0.5, 0.8],
            "mean_exit_layer": [30.0, 29.5, 29.5, 29.5, 25.0, 20.0],
        }
    )
    picked = kept(table, 4)  # the second target (0.89) lies nearest the three alike: a third setting takes it
    assert picked == [2, 4, 5]  # of the three alike, the middle one; three distinct settings are all there are


def test_candidates_lie_between_the_values_the_model_shows():
    """A saturation line's candidates on a tiny model's trace: in eps's domain, and none on a traced signal value
    (a threshold on one would make its decision a close call)."""
    from sweep.gates import GATES

    lm = load("model=tiny-llama")
    _, sig = trace_of(lm)
    gate = compose("model=tiny-llama", "gate=saturation", "gate.min_layer=2").gate
    values = candidates(GATES.get("saturation", key="gate"), gate, sig)
    traced = set(sig.delta[:, 1:3].double().flatten().tolist())
    assert len(values) > 20 and all(v > 0 for v in values)
    assert not traced & set(values)


def test_the_oracle_bound_is_the_first_match_oracles_share():
    from sweep.analysis import oracle_bound

    # L = 4; decision positions: the last prefill position (1) and the decode ones (2, 3); position 0 is not one
    matches = {0: [True, True, True, True], 1: [False, True, True, True], 2: [False, False, False, True]}
    matches[3] = [True, False, True, True]
    rows = [
        {"model": "m", "run_id": "r", "prompt_id": "p", "position": pos, "phase": "prefill" if pos < 2 else "decode"}
        | {"layer": layer, "top1_match": hit, "num_layers": 4}
        for pos, m in matches.items()
        for layer, hit in enumerate(m, start=1)
    ]
    bound = oracle_bound(pl.DataFrame(rows)).row(0, named=True)
    # first matches at the decision positions: 2, 4, 1 -> skippable (4-2)/4, 0, (4-1)/4
    assert bound["positions"] == 3 and bound["skippable"] == pytest.approx((0.5 + 0.0 + 0.75) / 3)


@pytest.mark.ray
def test_a_bracket_sweep_plans_runs_its_front_and_resumes_or_runs_again_without_tracing(ray_session, tmp_path):
    args = ("model=tiny-llama", *BRACKET, "prompts.n=2", "bench.gen_tokens=8")
    first = sweep(tmp_path, *args)
    simulated = read("simulated", tmp_path).filter(pl.col("sweep_name") == first.name)
    lines = 2  # gate.min_depth: choice(0.25, 0.5) of the shipped bracket
    assert 0 < simulated.height <= 4 * lines  # n_trials per line, distinct within each line
    assert simulated.select("min_depth", "eps").n_unique() == simulated.height
    assert simulated["selected"].sum() == first.written > 0
    rows = read("trials", tmp_path)
    assert set(rows["trial_id"]) == set(simulated.filter("selected")["trial_id"])  # the simulated front ran
    traced = read("profile", tmp_path).height
    again = sweep(tmp_path, *args, "resume=true", f"sweep.name={first.name}")
    assert again.written == 0 and len(again.rows) == first.written  # what it selected, from its rows
    assert read("profile", tmp_path).height == traced  # no second trace
    # the end of both runs: the screen's comparison, the oracle bound of the trace beside the verdict
    from sweep.report.run_report import sweep_report

    for outcome in (first, again):
        text = " ".join(line.strip() for line in sweep_report(outcome, compose().analysis).splitlines())
        assert f"screen: {simulated.height} settings simulated" in text
        assert "tiny-llama: at best " in text and "of layers could be skipped at agreement 1.0 (oracle:" in text
        assert ("no knee on tiny-llama's front" in text) == ("replayed on the trace, " in text)
    # run again (no resume, no sweep.name), as `make run` twice: the first sweep continued from its trace and
    # selection, no second trace, no second simulated table, no second sweep directory
    simulated = read("simulated", tmp_path)
    plain = sweep(tmp_path, *args)
    assert plain.name == first.name
    assert plain.written == 0 and len(plain.rows) == first.written
    assert read("profile", tmp_path).height == traced
    assert read("simulated", tmp_path).equals(simulated)
    assert [p.name for p in (tmp_path / "ray").iterdir() if p.is_dir()] == [first.name]
    # a root holding the same settings replayed twice (a screen traced afresh under sweep.rerun=true, or an older
    # release's run again): the report counts each setting once
    from sweep.report.build import analyse
    from sweep.report.sections import screen_section

    written = next((tmp_path / "simulated").rglob(f"{first.name}.parquet"))
    shutil.copyfile(written, written.with_name("copy.parquet"))
    ok = set(read("trials", tmp_path).filter(pl.col("status") == "ok")["trial_id"])
    settings = simulated.filter(pl.col("selected") & pl.col("trial_id").is_in(list(ok)))["trial_id"].n_unique()
    lines = screen_section(analyse(compose(f"results.root={tmp_path}"))).lines
    assert any(line.startswith(f"| saturation | {settings} |") for line in lines), lines
    # another definition (here search.n_trials) is another sweep, traced afresh
    other = sweep(tmp_path, *args, "search.n_trials=3")
    assert other.name != first.name
    assert read("profile", tmp_path)["run_id"].n_unique() == 2
