"""Analysis: fronts, knees and targets exactly right on trial sets with known answers;
bootstrap intervals; older files; `sweep analyze` end to end."""

from __future__ import annotations

import math

import polars as pl
import pytest

from conftest import run_cli
from sweep.analysis import (
    best_at_targets,
    chord_knees,
    fronts,
    kneedle_knee,
    knees_table,
    load_trials,
    pareto_front,
    params_text,
    with_confidence,
)
from sweep.cli import main
from sweep.store import read


def trials(points, *, model="m", gate="saturation", status="ok", start=0):
    """Trial rows from (speedup_wall, agreement) points; trial ids t000, t001, ..."""
    return pl.DataFrame(
        {
            "trial_id": [f"t{start + i:03d}" for i in range(len(points))],
            "model": [model] * len(points),
            "gate": [gate] * len(points),
            "status": [status] * len(points),
            "speedup_wall": [float(p[0]) for p in points],
            "agreement": [float(p[1]) for p in points],
            "eps": [0.1] * len(points),
            "min_layer": [8] * len(points),
            "exit_rate": [0.5] * len(points),
        }
    )


CLASSIC = [(1.0, 1.0), (1.2, 0.99), (1.5, 0.97), (2.0, 0.5), (2.2, 0.1), (1.1, 0.9), (0.9, 0.95), (1.4, 0.5)]
CLASSIC_FRONT = {"t000", "t001", "t002", "t003", "t004"}


def ids(df: pl.DataFrame) -> list[str]:
    return df["trial_id"].to_list()


def test_front_of_a_classic_set():
    front = pareto_front(trials(CLASSIC))
    assert ids(front) == ["t004", "t003", "t002", "t001", "t000"]  # sorted by speedup, descending


def test_ties_are_all_kept_and_a_tie_dominates_nothing_twice():
    df = trials([(1.5, 0.9), (1.5, 0.9), (1.5, 0.8), (1.0, 0.9), (2.0, 0.5)])
    assert sorted(ids(pareto_front(df))) == ["t000", "t001", "t004"]


def test_single_point_and_all_dominated_but_one():
    assert ids(pareto_front(trials([(1.3, 0.7)]))) == ["t000"]
    df = trials([(2.0, 1.0), (1.9, 0.99), (1.0, 0.5), (2.0, 0.2)])
    assert ids(pareto_front(df)) == ["t000"]


def test_failed_and_nondeterministic_rows_never_count():
    df = pl.concat([
        trials(CLASSIC),
        trials([(9.0, 1.0)], status="failed", start=100),
        trials([(8.0, 1.0)], status="nondeterministic", start=200),
        trials([(7.0, 1.0)], start=300).with_columns(agreement=pl.lit(None, pl.Float64)),
    ])
    assert set(ids(pareto_front(df))) == CLASSIC_FRONT


def test_fronts_per_model_and_gate():
    df = pl.concat([
        trials([(1.0, 1.0), (2.0, 0.5)], gate="saturation"),
        trials([(1.5, 0.9), (1.2, 0.8)], gate="margin", start=10),
        trials([(3.0, 0.1)], model="other", start=20),
    ])
    per_gate = pareto_front(df, by=("model", "gate"))
    assert {(r["model"], r["gate"], r["trial_id"]) for r in per_gate.iter_rows(named=True)} == {
        ("m", "saturation", "t000"), ("m", "saturation", "t001"), ("m", "margin", "t010"), ("other", "saturation", "t020"),
    }
    across = pareto_front(df, by=("model",))
    assert set(ids(across.filter(pl.col("model") == "m"))) == {"t000", "t010", "t001"}
    both = fronts(df)
    assert set(both["scope"]) == {"model", "model+gate"} and both.filter(pl.col("scope") == "model")["gate_scope"].unique().to_list() == ["all"]


def test_chord_knee_of_the_classic_front():
    # normalised: t001 (0.167, 0.989) 0.156, t002 (0.417, 0.967) 0.383, t003 (0.833, 0.444) 0.278: t002 is farthest
    knee = chord_knees(pareto_front(trials(CLASSIC)), by=())
    assert ids(knee) == ["t002"] and knee["front_points"].to_list() == [5]


def test_chord_knee_edge_cases():
    assert ids(chord_knees(trials([(1.3, 0.7)]), by=())) == ["t000"]  # a front of one point
    two = chord_knees(trials([(1.0, 1.0), (2.0, 0.5)]), by=())  # both on the chord: higher agreement wins
    assert ids(two) == ["t000"]
    tie = chord_knees(trials([(1.0, 1.0), (1.5, 0.9), (1.5, 0.9), (2.0, 0.5)]), by=())  # an exact tie: smaller trial id
    assert ids(tie) == ["t001"]
    grouped = chord_knees(pl.concat([trials(CLASSIC), trials([(1.0, 1.0)], model="x", start=50)]).pipe(pareto_front, by=("model",)), by=("model",))
    assert dict(zip(grouped["model"], grouped["trial_id"])) == {"m": "t002", "x": "t050"}


def test_kneedle_cross_check_needs_twelve_points():
    xs = [1.0 + 0.1 * i for i in range(15)]
    curve = trials([(x, 1.0 - ((x - 1.0) / 1.4) ** 4) for x in xs])
    front = pareto_front(curve)
    assert front.height == 15
    knee = kneedle_knee(front)
    assert knee is not None and knee["trial_id"] in ids(front)
    assert kneedle_knee(front.head(11)) is None
    table = knees_table(fronts(curve))
    row = table.filter(pl.col("scope") == "model").row(0, named=True)
    assert row["front_points"] == 15 and row["kneedle_trial_id"] == knee["trial_id"]
    assert row["trial_id"] == chord_knees(front, by=())["trial_id"][0]


def test_best_speedup_at_each_target():
    df = pl.concat([trials(CLASSIC), trials([(3.0, 0.9), (1.1, 0.96)], model="low", start=40)])
    best = best_at_targets(df)
    got = {(r["model"], r["target"]): r["trial_id"] for r in best.iter_rows(named=True)}
    assert got == {
        ("m", 0.95): "t002", ("m", 0.98): "t001", ("m", 0.99): "t001", ("m", 1.0): "t000",
        ("low", 0.95): "t041", ("low", 0.98): None, ("low", 0.99): None, ("low", 1.0): None,
    }
    # ties on speedup go to the higher agreement, then the smaller trial id
    tied = best_at_targets(trials([(1.5, 0.96), (1.5, 0.99), (1.5, 0.99)]), targets=(0.95,))
    assert ids(tied) == ["t001"]


def test_bootstrap_intervals():
    df = pl.DataFrame({
        "prompt_agreement": [[1.0, 1.0, 1.0], [0.0, 1.0, 0.5, 0.5], None],
        "prompt_baseline_ms": [[10.0, 10.0, 10.0], [10.0, 20.0, 10.0, 20.0], None],
        "prompt_ms": [[5.0, 5.0, 5.0], [10.0, 10.0, 10.0, 10.0], None],
    })
    out = with_confidence(df, n_boot=500, seed=1)
    first, second, third = out.iter_rows(named=True)
    assert first["agreement_lo"] == first["agreement_hi"] == 1.0 and first["speedup_lo"] == first["speedup_hi"] == 2.0
    assert 0.0 <= second["agreement_lo"] < 0.5 < second["agreement_hi"] <= 1.0
    assert 1.0 <= second["speedup_lo"] < 1.5 < second["speedup_hi"] <= 2.0
    assert second["ci_level"] == 0.95 and third["agreement_lo"] is None
    assert with_confidence(df, n_boot=500, seed=1).equals(out)  # seeded


def bench_rows(root, *gates):
    for gate in gates:
        assert main(["bench", "model=tiny-llama", "prompts.n=2", "bench.gen_tokens=6", "bench.repeats=2", "bench.warmup=0", f"results.root={root}", *gate]) == 0


def test_analyze_writes_tables_report_and_figures(tmp_path, capsys):
    bench_rows(tmp_path, ["gate=full"], ["gate=fixed", "gate.exit_layer=2"], ["gate=fixed", "gate.exit_layer=3"],
               ["gate=saturation", "gate.eps=0.8", "gate.min_layer=2"], ["gate=margin", "gate.theta=0.4", "gate.min_layer=1"])
    assert main(["profile", "model=tiny-llama", "prompts.n=1", "profile.gen_tokens=4", f"results.root={tmp_path}"]) == 0
    capsys.readouterr()
    assert main(["analyze", f"results.root={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny-llama: ") and f"report: {tmp_path}/report/report.md" in out
    pareto, knees, targets = read("pareto", tmp_path), read("knees", tmp_path), read("targets", tmp_path)
    assert set(pareto["scope"]) == {"model", "model+gate"} and pareto["agreement_lo"].null_count() == 0
    assert set(knees["gate"]) >= {"all", "full", "fixed"} and targets["target"].to_list() == [0.95, 0.98, 0.99, 1.0]
    assert targets.filter(pl.col("target") == 1.0)["agreement"][0] == 1.0  # the full gate always qualifies
    report = (tmp_path / "report" / "report.md").read_text()
    for name in ("pareto_tiny-llama.png", "layers_tiny-llama.png", "eas.png"):
        assert (tmp_path / "report" / name).stat().st_size > 10_000 and f"({name})" in report
    assert "Best speedup at each agreement target" in report and "EAS (arXiv 2603.23701)" in report


def test_older_files_are_analysed_too(tmp_path, capsys):
    bench_rows(tmp_path, ["gate=full"], ["gate=fixed", "gate.exit_layer=2"])
    path = next((tmp_path / "trials").rglob("*.parquet"))
    old = pl.read_parquet(path).drop("prompt_baseline_ms", "prompt_ms", "min_depth", "sweep_name")
    old.write_parquet(path)  # as a file from before those columns existed
    assert load_trials(tmp_path).collect().height == 2
    assert main(["analyze", f"results.root={tmp_path}"]) == 0
    pareto = read("pareto", tmp_path)
    assert pareto.height >= 1


def test_analyze_on_nothing_is_one_clear_error(tmp_path):
    res = run_cli("analyze", f"results.root={tmp_path}/none")
    assert res.returncode == 2
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: results.root={tmp_path}/none: no trials or profiles there to analyze (run `sweep run` or `sweep profile` first)"]


def test_targets_config_is_validated():
    from conftest import compose
    from sweep.errors import ConfigError

    assert compose("analysis.targets=[0.9]").analysis.targets == [0.9]
    with pytest.raises(ConfigError, match=r"analysis.targets=\[1.5\]: must be a non-empty list of numbers in \[0, 1\]"):
        compose("analysis.targets=[1.5]")
    assert math.isclose(compose().analysis.targets[1], 0.98)


def test_the_readme_polars_example_runs(tmp_path, monkeypatch, capsys):
    from conftest import ROOT

    bench_rows(tmp_path / "results", ["gate=full"], ["gate=fixed", "gate.exit_layer=2"])
    readme = (ROOT / "README.md").read_text()
    block = readme.split("three lines of polars")[1].split("```python")[1].split("```")[0]
    assert len(block.strip().splitlines()) == 3
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "speedup_wall" in out and "tiny-llama" in out


def test_the_report_shows_the_batching_effect(tmp_path, capsys):
    for size in (1, 2, 4):
        assert main(["bench", "model=tiny-llama", "gate=saturation", "gate.eps=0.8", "gate.min_layer=2", f"bench.batch_size={size}",
                     "prompts.n=4", "bench.gen_tokens=6", "bench.repeats=1", "bench.warmup=0", f"results.root={tmp_path}"]) == 0
    assert main(["analyze", f"results.root={tmp_path}"]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## The batching effect" in report and (tmp_path / "report" / "batching.png").stat().st_size > 10_000
    assert report.count("| tiny-llama saturation eps=0.8 min_layer=2 |") == 3


def test_self_speculative_trials_stay_out_of_the_batching_section(tmp_path, capsys):
    common = ["model=tiny-llama", "gate=fixed", "gate.exit_layer=2", "prompts.n=2", "bench.gen_tokens=6", "bench.repeats=1",
              "bench.warmup=0", f"results.root={tmp_path}"]
    assert main(["bench", *common, "bench.batch_size=2"]) == 0
    assert main(["bench", *common, "bench.mode=self_speculative", "bench.draft_len=2"]) == 0  # batch 1, same gate columns
    assert main(["analyze", f"results.root={tmp_path}"]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## The batching effect" not in report  # one early-exit batch size only: nothing to compare
    targets = read("targets", tmp_path).filter(pl.col("target") == 1.0)
    assert targets["mode"].to_list() == ["self_speculative"]  # lossless, so it is the only one at agreement 1
    assert targets["params"][0] == "exit_layer=2 min_layer=1 mode=self_speculative draft_len=2"


def test_params_text_names_mode_and_batch_size():
    row = {"eps": 0.2, "min_layer": 8, "mode": "early_exit", "batch_size": 1}
    assert params_text(row) == "eps=0.2 min_layer=8"
    assert params_text({**row, "batch_size": 4}) == "eps=0.2 min_layer=8 batch_size=4"
    assert params_text({"exit_layer": 15, "min_layer": 15, "mode": "self_speculative", "draft_len": 4}) == (
        "exit_layer=15 min_layer=15 mode=self_speculative draft_len=4")


def test_the_verdict_on_a_slower_self_speculative_best():
    from sweep.report import _verdicts

    trials_df = pl.DataFrame({"model": ["m"], "status": ["ok"]})
    targets = pl.DataFrame({"model": ["m"], "target": [0.98], "trial_id": ["t1"], "gate": ["fixed"], "params": ["exit_layer=23"],
                            "mode": ["self_speculative"], "speedup_wall": [0.38], "agreement": [1.0], "exit_rate": [0.0],
                            "speedup_lo": [0.33], "speedup_hi": [0.42]})
    (line,) = _verdicts(trials_df, targets, None, 0.5)
    assert "lossless self-speculation, but drafting and verifying cost more" in line and "timing noise" not in line
    (line,) = _verdicts(trials_df, targets.with_columns(mode=pl.lit("early_exit")), None, 0.5)
    assert "no token exited, so the difference from 1x is timing noise" in line
