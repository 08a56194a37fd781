"""Numbers a reader acts on: full depth on every front and target, slowdowns never raised to 1.0,
the A/A noise floor measured in every trial's own rounds and stated by the report, knees above a
useful agreement, and an Optuna objective that is the analysis's own ranked speedup.

Every figure is checked against an independent computation: every resample enumerated, a closed
form, a brute-force chord, or a recomputation from the row's own round timings.
"""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import polars as pl
import pytest

from sweep.analysis import best_at_targets, fronts, knees_table, noise_floors, ok_trials, pareto_front
from sweep.cli.commands import main
from sweep.bench.noise import noise_floor, rounds_for_floor
from sweep.store import read

TINY = ["model=tiny-llama", "prompts.n=2", "bench.gen_tokens=6", "bench.warmup=0"]


def exact_floor(ratios: list[float], rounds: int, level: float = 0.95) -> float:
    """By enumeration of every equally likely draw of ``rounds`` rounds: the smallest f such that the
    median ratio lies within [1/(1+f), 1+f] with probability >= ``level``."""
    null = sorted(abs(math.log(statistics.median(draw))) for draw in itertools.product(ratios, repeat=rounds))
    return math.expm1(null[math.ceil(level * len(null) - 1e-9) - 1])


# ---------------------------------------------------------------- the noise floor, by enumeration and closed form


@pytest.mark.parametrize("seed", range(6))
def test_the_noise_floor_is_the_95_percent_quantile_over_every_resample_of_rounds(seed):
    rng = np.random.default_rng(seed)
    base = rng.uniform(20, 30, size=(5, 3))
    aa = base * rng.normal(1.0, 0.06, size=(5, 3))
    ratios = [float(b) / float(a) for b, a in zip(base.sum(axis=1), aa.sum(axis=1))]
    for rounds in (1, 2, 3, 4, 5):  # odd and even numbers of rounds (an even median averages two)
        assert noise_floor(base[:rounds], aa[:rounds]) == pytest.approx(exact_floor(ratios[:rounds], rounds))
    assert noise_floor(base, aa, rounds=4) == pytest.approx(exact_floor(ratios, 4))  # 5^4 draws of 4 rounds
    # with three rounds every round's ratio is the median with probability >= 7/27, so the floor is the
    # largest single-round deviation, in closed form
    assert noise_floor(base[:3], aa[:3]) == pytest.approx(math.expm1(max(abs(math.log(r)) for r in ratios[:3])))
    assert noise_floor(np.zeros((0, 2)), np.zeros((0, 2))) is None


def test_a_floor_near_its_level_does_not_flip():
    # rounds 0.950 1.135 0.965 0.989 1.025: five draws give a median of 1.135 with probability 0.0579, just
    # above 5%, so the floor is 13.5%; a sampled floor read 5.3% or 13.5% from one seed to another
    base, aa = np.array([[0.950], [1.135], [0.965], [0.989], [1.025]]), np.ones((5, 1))
    assert noise_floor(base, aa) == pytest.approx(0.135) == pytest.approx(exact_floor(list(base[:, 0]), 5))
    assert noise_floor(base * 1000, aa * 1000) == noise_floor(base, aa)  # seconds or ms: the same floor


def test_the_rounds_a_floor_needs_follow_the_median_s_closed_form():
    # per-round A/A log-ratios exactly N(0, 0.05^2) quantiles: the median of R draws has standard deviation
    # sqrt(pi / 2) * 0.05 / sqrt(R) for large R, so a 95% floor of +-t needs (1.96 sqrt(pi/2) 0.05 / log(1+t))^2
    sigma, n = 0.05, 4000
    logs = np.array([statistics.NormalDist(0, sigma).inv_cdf((i + 0.5) / n) for i in range(n)])
    base, aa = np.ones((n, 1)), np.exp(-logs)[:, None]
    for target in (0.02, 0.01):
        closed = (1.959964 * math.sqrt(math.pi / 2) * sigma / math.log1p(target)) ** 2
        for rounds in (3, 5, 10):  # projected from the floor at the trials' rounds; small medians vary a bit less
            need = rounds_for_floor(base, aa, target, rounds=rounds)
            assert 0.8 * closed <= need <= 1.05 * closed, (target, rounds, need, closed)
    # the projection from a floor measured by enumeration: offset o (the A/A's median), spread log(1+f) - o
    ratios = [1.04, 0.97, 1.01, 0.95, 1.02]
    f, o = exact_floor(ratios, 3), abs(math.log(statistics.median(ratios)))
    want = math.ceil(3 * ((math.log1p(f) - o) / (math.log1p(0.02) - o)) ** 2)
    assert rounds_for_floor(np.array(ratios)[:, None], np.ones((5, 1)), 0.02, rounds=3) == want
    # an A/A that is always 3% off: no number of rounds averages that away
    assert rounds_for_floor(np.ones((8, 1)), np.full((8, 1), 1.03), 0.02) is None


# ---------------------------------------------------------------- the A/A control in every bench


def test_every_bench_times_an_a_a_control_and_prints_its_spread(tmp_path, capsys):
    assert main(["bench", *TINY, "bench.repeats=3", "gate=fixed", "gate.exit_layer=2", f"results.root={tmp_path}"]) == 0
    out = capsys.readouterr().out
    row = read("trials", tmp_path).row(0, named=True)
    base, aa = row["round_baseline_ms"], row["round_aa_ms"]
    assert len(aa) == 3 and all(len(r) == 2 for r in aa)  # every round, every prompt
    per_round = [sum(b) / sum(a) for b, a in zip(base, aa)]
    assert row["speedup_aa"] == pytest.approx(statistics.median(per_round))  # by hand, the bench's estimator
    assert row["noise_floor"] == pytest.approx(math.expm1(max(abs(math.log(r)) for r in per_round)))
    e2e = [
        (sum(b) + sum(bp)) / (sum(a) + sum(ap))
        for b, bp, a, ap in zip(base, row["round_baseline_prefill_ms"], aa, row["round_aa_prefill_ms"])
    ]
    assert row["speedup_e2e_aa"] == pytest.approx(statistics.median(e2e))
    assert row["noise_floor_e2e"] == pytest.approx(math.expm1(max(abs(math.log(r)) for r in e2e)))
    assert row["deterministic"]  # the A/A runs reproduce the reference tokens too
    said = " ".join(out.split())  # the summary's lines are wrapped at 120 columns
    assert (
        f"A/A control (full depth against full depth, in the same rounds): speedup_aa {row['speedup_aa']:.3f}x, "
        f"rounds {min(per_round):.3f}-{max(per_round):.3f}x; noise floor ±{100 * row['noise_floor']:.1f}%"
    ) in said
    assert "ranked speedup (what `sweep analyze` ranks by)" in said


def test_a_shared_baseline_group_shares_one_a_a_control():
    from conftest import compose
    from sweep.bench.command import prepare
    from sweep.bench.protocol import run_trials

    cfgs = [compose(*TINY, "bench.repeats=2", *g) for g in (["gate=fixed", "gate.exit_layer=2"], ["gate=full"])]
    prepared = [prepare(c) for c in cfgs]
    rows = run_trials(cfgs, prepared[0][0], [p[1] for p in prepared], prepared[0][2])
    assert rows[0]["round_aa_ms"] == rows[1]["round_aa_ms"] and len(rows[0]["round_aa_ms"]) == 2
    assert rows[0]["round_baseline_ms"] == rows[1]["round_baseline_ms"]
    assert rows[0]["noise_floor"] == rows[1]["noise_floor"] is not None  # seeded from the timings alone


# ---------------------------------------------------------------- full depth, the cap, the floor in the ranking


def rows(*points, floor=0.01):
    """Trial rows from (trial_id, speedup_wall, agreement, skipped) with a given A/A floor."""
    return pl.DataFrame(
        [
            {
                "trial_id": t,
                "model": "m",
                "gate": "saturation",
                "status": "ok",
                "eps": 0.08,
                "min_layer": 8,
                "speedup_wall": s,
                "agreement": a,
                "exit_rate": 0.5 if skipped else 0.0,
                "step_layers_saved": 0.3 if skipped else 0.0,
                "kv_policy": "propagate",
                "mode": "early_exit",
                "noise_floor": floor,
            }
            for t, s, a, skipped in points
        ]
    )


def test_a_screen_s_front_and_targets_compare_against_full_depth():
    # the held-out review's Gemma3 screen: no full-depth trial, a saturation setting both slower and less
    # accurate than full depth (0.994x at agreement 0.961, outside a 0.3% floor)
    screen = rows(("sat", 0.994, 0.961, True), ("slow", 0.9, 0.99, True), floor=0.003)
    for front in (pareto_front(screen), pareto_front(screen, by=("model",))):
        assert front["trial_id"].to_list() == ["full-depth"]  # full depth dominates both
    both = fronts(screen)
    assert set(zip(both["front"], both["front_gate"], both["trial_id"])) == {
        ("model", None, "full-depth"),
        ("model+gate", "saturation", "full-depth"),
    }
    targets = best_at_targets(screen)
    assert targets["trial_id"].to_list() == ["full-depth"] * 4 and targets["speedup"].to_list() == [1.0] * 4
    assert targets["gate"].to_list() == ["full"] * 4 and targets["agreement"].to_list() == [1.0] * 4
    # not 0.994x as "the best speedup at agreement >= 0.95": that setting is the best only beside full depth
    beside = best_at_targets(screen, reference=False)
    assert beside.filter(pl.col("target") == 0.95)["trial_id"].to_list() == ["sat"]
    # a setting that beats full depth is on the front beside it, and named where it reaches the target
    faster = pl.concat([screen, rows(("fast", 1.3, 0.96, True))])
    assert set(pareto_front(faster)["trial_id"]) == {"fast", "full-depth"}
    named = dict(zip(*best_at_targets(faster).select("target", "trial_id")))
    assert named == {0.95: "fast", 0.98: "full-depth", 0.99: "full-depth", 1.0: "full-depth"}
    # a setting that only ties full depth (1x at agreement 1: a zero-exit trial capped from 1.2x) gives way to it
    tie = rows(("idle", 1.2, 1.0, False))
    assert pareto_front(tie)["trial_id"].to_list() == ["full-depth"]
    assert best_at_targets(tie)["trial_id"].to_list() == ["full-depth"] * 4


def test_the_ranked_speedup_caps_from_above_and_counts_noise_as_1x():
    frame = rows(
        ("noise", 1.146, 1.0, False),  # no exit: above 1x it is timing noise
        ("cost", 0.6, 1.0, False),  # no compute skipped and slower: its probes and heads are a real cost
        ("inside", 1.04, 0.9, True),  # exits, but inside a 5% floor
        ("outside", 1.06, 0.9, True),
        ("slowin", 0.97, 0.9, True),  # 1/1.05 < 0.97: inside too
        floor=0.05,
    )
    got = {r["trial_id"]: r for r in ok_trials(frame).collect().iter_rows(named=True)}
    for tid, measured in (("noise", 1.146), ("cost", 0.6), ("inside", 1.04), ("outside", 1.06), ("slowin", 0.97)):
        r = got[tid]
        capped = measured if r["skipped_compute"] else min(measured, 1.0)
        inside = 1 / 1.05 <= capped <= 1.05  # the floor's band, by hand
        assert r["within_noise"] == inside and r["speedup"] == pytest.approx(1.0 if inside else capped), tid
    assert got["cost"]["speedup"] == 0.6 and not got["cost"]["capped"] and got["noise"]["capped"]
    without = {r["trial_id"]: r for r in ok_trials(frame.drop("noise_floor")).collect().iter_rows(named=True)}
    assert without["inside"]["speedup"] == 1.04 and without["inside"]["within_noise"] is None  # no A/A: no floor


# ---------------------------------------------------------------- knees a user can act on


def chord_by_hand(points: list[tuple[str, float, float]]) -> str:
    """The chord knee by brute force: normalise both axes, the point farthest from x + y = 1."""
    xs, ys = [p[1] for p in points], [p[2] for p in points]

    def norm(v, vs):
        return (v - min(vs)) / (max(vs) - min(vs))

    return max(points, key=lambda p: (abs(norm(p[1], xs) + norm(p[2], ys) - 1), p[2]))[0]


def test_knees_are_taken_above_a_useful_agreement(tmp_path):
    front = [("a", 1.2, 0.99), ("b", 1.5, 0.95), ("c", 1.7, 0.92), ("d", 3.0, 0.30), ("e", 3.05, 0.008)]
    frame = rows(*((t, s, a, True) for t, s, a in front))
    table = knees_table(fronts(frame)).filter(pl.col("front") == "model").row(0, named=True)
    points = [("full-depth", 1.0, 1.0), *front]
    assert table["knee_all_trial_id"] == chord_by_hand(points) == "d"  # right by the chord, of no use
    assert table["knee_all_gate"] == "saturation" and table["knee_all_agreement"] == 0.30
    useful = [p for p in points if p[2] >= 0.9]
    assert table["trial_id"] == chord_by_hand(useful) and table["agreement"] >= 0.9
    assert table["knee_min_agreement"] == 0.9 and table["knee_points"] == len(useful) == 4
    assert table["front_points"] == 6
    low = knees_table(fronts(frame), min_agreement=0.0).filter(pl.col("front") == "model")
    assert low["trial_id"].to_list() == ["d"]
    none = knees_table(fronts(frame), min_agreement=0.999).filter(pl.col("front") == "model").row(0, named=True)
    assert none["trial_id"] is None and none["knee_all_trial_id"] == "d"  # too few points that accurate
    from sweep.report.figures import pareto_figure

    ok = ok_trials(frame).collect()
    for floor in (0.9, 0.999):  # a knee and the unrestricted one drawn; none above the floor, the unrestricted only
        name = pareto_figure(ok, fronts(ok), knees_table(fronts(ok), min_agreement=floor), "m", tmp_path, floor=0.05)
        assert (tmp_path / name).stat().st_size > 10_000


def test_the_knee_floor_is_a_documented_setting():
    from conftest import ROOT, compose
    from sweep.errors import ConfigError

    assert compose().analysis.knee_min_agreement == 0.9 and compose().analysis.floor_target == 0.02
    with pytest.raises(ConfigError, match=r"analysis.knee_min_agreement=1.5: must be a number in \[0, 1\]"):
        compose("analysis.knee_min_agreement=1.5")
    docs = (ROOT / "docs" / "results.md").read_text()  # the page that says what the numbers mean
    assert "analysis.knee_min_agreement" in docs and "analysis.floor_target" in docs


# ---------------------------------------------------------------- the report: its floor, its marks


def test_the_report_states_the_floor_and_marks_speedups_inside_it(tmp_path, capsys):
    for gate in (["gate=fixed", "gate.exit_layer=2"], ["gate=fixed", "gate.exit_layer=3"]):
        assert main(["bench", *TINY, "bench.repeats=2", *gate, f"results.root={tmp_path}"]) == 0
    for path in (tmp_path / "trials").rglob("*.parquet"):  # a floor of +-300%: any speedup of 4 layers is inside
        pl.read_parquet(path).with_columns(noise_floor=pl.lit(3.0)).write_parquet(path)
    capsys.readouterr()
    assert main(["analyze", f"results.root={tmp_path}", "analysis.targets=[0.0]"]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    ok = ok_trials(read("trials", tmp_path)).collect()
    floors = noise_floors(ok).row(0, named=True)
    # pooled over both trials' rounds: 4 rounds, the floor at 2 rounds, by enumeration of the 16 resamples
    pooled = [
        sum(b) / sum(a) for r in ok.iter_rows(named=True) for b, a in zip(r["round_baseline_ms"], r["round_aa_ms"])
    ]
    assert floors["aa_rounds"] == 4 and floors["repeats"] == 2
    assert floors["floor"] == pytest.approx(exact_floor(pooled, 2))
    assert f"the floor at 2 rounds is **±{100 * floors['floor']:.1f}%**" in report
    need = floors["rounds_for_target"]  # None: the pooled A/A sits off 1x by more than 2% (a loaded machine)
    said = f"needs about {need} timed rounds" if need is not None else "needs more than any number of rounds"
    assert f"A floor of ±2% (analysis.floor_target) {said}" in report
    assert ok["within_noise"].all() and (ok["speedup"] == 1.0).all()
    # full depth wins the tie at 1x; the best setting beside it is marked as inside its floor
    marked = best_at_targets(ok, targets=(0.0,), reference=False).row(0, named=True)
    assert best_at_targets(ok, targets=(0.0,))["trial_id"].to_list() == ["full-depth"]
    assert f"≈1x (measured {marked['speedup_wall']:.3f}, inside ±300.0%)" in report
    assert "agreement >= 0.9, analysis.knee_min_agreement" in report or "Knees of the fronts" not in report


# ---------------------------------------------------------------- a real kv_policy=full trial keeps its slowdown


def test_a_kv_full_trial_is_ranked_by_its_own_measured_ratio(tmp_path, capsys):
    gate = ["gate=fixed", "gate.exit_layer=1", "bench.kv_policy=full", "bench.repeats=3"]
    assert main(["bench", *TINY, *gate, f"results.root={tmp_path}"]) == 0
    said = " ".join(capsys.readouterr().out.split())  # its exits' layers saved, and that they still ran
    assert "layers saved 75.0% (they still run, for their K/V: kv_policy=full saves no layer)" in said
    row = ok_trials(read("trials", tmp_path)).collect().row(0, named=True)
    assert not row["skipped_compute"] and row["exit_rate"] == 1.0  # every token exited, no layer skipped
    per_round = [sum(b) / sum(g) for b, g in zip(row["round_baseline_ms"], row["round_ms"])]
    capped = min(statistics.median(per_round), 1.0)  # from above only
    inside = abs(math.log(capped)) <= math.log1p(row["noise_floor"])
    assert row["capped"] == (statistics.median(per_round) > 1.0)
    assert row["speedup"] == pytest.approx(1.0 if inside else capped)


@pytest.mark.slow
def test_a_real_kv_full_trial_that_pays_for_its_probes_is_never_raised_to_1(tmp_path):
    """SmolLM2-135M, margin probes from layer 2 with kv_policy=full: every probe's norm and head (about 2.2
    layers each) is paid and no layer is skipped, so it is far slower than full depth, beyond any floor."""
    gate = ["gate=margin", "gate.theta=4", "gate.min_layer=2", "bench.kv_policy=full", "bench.repeats=3"]
    real = ["model=smollm2-135m", "prompts.n=1", "bench.gen_tokens=8", "bench.warmup=1"]
    assert main(["bench", *real, *gate, f"results.root={tmp_path}"]) == 0
    row = ok_trials(read("trials", tmp_path)).collect().row(0, named=True)
    assert not row["skipped_compute"] and row["exit_rate"] > 0
    per_round = [sum(b) / sum(g) for b, g in zip(row["round_baseline_ms"], row["round_ms"])]
    measured = statistics.median(per_round)
    assert measured < 1.0 / (1.0 + row["noise_floor"])  # a real slowdown, outside the A/A floor
    assert row["speedup"] == pytest.approx(measured) and not row["capped"] and not row["within_noise"]


# ---------------------------------------------------------------- the study optimises what the analysis ranks

ZERO_EXIT = (  # margin with a threshold no margin reaches (no token exits), and a fixed exit that always exits
    "search.spaces=[{gate: margin, gate.theta: 'interval(1000.0, 2000.0)', gate.min_layer: 1}, "
    "{gate: fixed, gate.exit_layer: 'int(interval(1, 3))'}]"
)


@pytest.mark.parametrize("search", ["optuna-constrained", "optuna-mo"])
def test_a_zero_exit_trial_is_never_the_study_s_best(ray_session, tmp_path, search):
    import optuna

    from conftest import sweep

    every = ["search.constraints.agreement=0.0"] if search == "optuna-constrained" else []  # every agreement feasible
    # the ranked wall-clock objective (the shipped searches climb speedup_model)
    wall = "{speedup_wall: max}" if search == "optuna-constrained" else "{speedup_wall: max, agreement: max}"
    args = (f"search={search}", ZERO_EXIT, "search.n_trials=5", "search.seed=1")
    args += ("~search.objectives", f"+search.objectives={wall}")
    outcome = sweep(tmp_path, *args, *every)
    storage = f"sqlite:///{outcome.path}/optuna.db"
    study = optuna.load_study(study_name=search, storage=storage)
    trials = read("trials", tmp_path)
    ranked = {r["trial_id"]: r for r in ok_trials(trials).collect().iter_rows(named=True)}
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    zero = [t for t in done if ranked[t.user_attrs["trial_id"]]["exit_rate"] == 0.0]
    assert zero and len(zero) < len(done), "pick a seed whose trials visit both sub-spaces"
    for t in done:
        row = ranked[t.user_attrs["trial_id"]]
        assert t.values[0] == pytest.approx(row["speedup"])  # the analysis's own ranked speedup
        assert t.user_attrs["speedup_wall_measured"] == pytest.approx(row["speedup_wall"])  # the raw ratio
        assert t.user_attrs["skipped_compute"] == row["skipped_compute"]
        assert t.system_attrs["constraints"][-1] == (0.0 if row["skipped_compute"] else 1.0)
    for t in zero:
        assert t.values[0] <= 1.0 and not t.user_attrs["skipped_compute"]  # capped from above, and infeasible
    best = [study.best_trial] if search == "optuna-constrained" else study.best_trials
    assert best and all(t.user_attrs["skipped_compute"] for t in best)
    assert not {t.number for t in best} & {t.number for t in zero}
    assert study.user_attrs["constraints"][-1] == "skipped_compute"
