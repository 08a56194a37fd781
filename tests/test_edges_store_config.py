"""Behaviours of the store, the config, the report and the command line at their edges that no other test pinned down,
each found by changing the code and seeing every test pass."""

from __future__ import annotations

import json
import logging
import shutil

import polars as pl
import pytest

from conftest import compose
from helpers.factories import verdict_row
from helpers.rows import PROV, profile_rows
from sweep.errors import ConfigError


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    """Each test checks its files afresh (the store remembers a file's verdict by path, mtime and size)."""
    from sweep.store import _guard

    _guard._verdicts.clear()
    yield
    _guard._verdicts.clear()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sweep.store" and r.levelno == logging.WARNING]


# ---------------------------------------------------------------- the store


def test_a_trial_key_spelled_otherwise_is_still_its_trials():
    """Broken: a row whose trial_key another tool re-wrote (other spacing, other key order) but that names the same
    config is taken for an edited file and left out of the analysis and of a resume's done rows."""
    from sweep.config.identity import trial_identity
    from sweep.store import broken_identity

    ident = trial_identity(compose("model=tiny-llama", "gate=saturation"), "cpu")
    respelled = json.dumps(dict(reversed(list(json.loads(ident.key).items()))), indent=1)
    assert respelled != ident.key
    rows = pl.DataFrame(
        {
            "trial_key": [ident.key, respelled, respelled],
            "trial_id": [ident.id, ident.id, "0" * 16],
            "model": ["tiny-llama"] * 3,
            "gate": ["saturation"] * 3,
        }
    )
    assert broken_identity(rows).to_list() == [False, False, True]
    older = rows.with_columns(trial_key=pl.lit(None, dtype=pl.String))  # rows of schema 2 and older hold no key
    assert broken_identity(older).to_list() == [False, False, False]


def test_a_file_whose_nullable_column_is_all_null_typed_is_read(tmp_path, caplog):
    """Broken: a profile file that another tool rewrote, storing an all-null column as Parquet's null type, is
    skipped whole ("column prob_margin is null, table declares Float64"), and its rows vanish from every read."""
    from sweep.store import files, read, write_table

    path = write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1")
    rewritten = pl.read_parquet(path).with_columns(prob_margin=pl.lit(None))
    assert rewritten.schema["prob_margin"] == pl.Null
    rewritten.write_parquet(path, metadata={"sweep.table": "profile", "sweep.schema_version": "2"})
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        assert files("profile", tmp_path) == [path]
        got = read("profile", tmp_path)
    assert _warnings(caplog) == []
    assert got.height == 4 and got["prob_margin"].null_count() == 4 and got["prob_margin"].dtype == pl.Float64


def test_a_file_under_a_partition_directory_with_no_value_is_skipped(tmp_path, caplog):
    """Broken: a file under `profile/model=/` (no value: no name sweep writes) is read as rows of a model named "",
    which every table and figure then shows."""
    from sweep.store import read, write_table

    path = write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1")
    stray = tmp_path / "profile" / "model=" / "r1.parquet"
    stray.parent.mkdir()
    shutil.copy(path, stray)
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        got = read("profile", tmp_path)
    assert got["model"].unique().to_list() == ["m-1"] and got.height == 4
    assert _warnings(caplog) == [
        f"skipping {stray}: not in the layout of table 'profile' (profile/model=<value>/<file>.parquet)"
    ]


def test_an_analysis_table_written_anew_removes_its_old_single_file(tmp_path):
    """Broken: the single file `<root>/pareto.parquet` an analysis of schema 3 left stays beside the new
    `<root>/pareto/pareto.parquet`, and a glob over the root reads both layouts' rows."""
    from helpers.factories import full_row
    from sweep.store import read, write_table

    old = tmp_path / "pareto.parquet"
    old.write_bytes(b"an analysis table of schema 3")
    row = full_row("pareto")
    path = write_table("pareto", {k: [v] for k, v in row.items()}, root=tmp_path, provenance={})
    assert path == tmp_path / "pareto" / "pareto.parquet" and not old.exists()
    assert read("pareto", tmp_path).height == 1


def test_another_hosts_temporary_file_is_stale_only_once_older_than_an_hour(tmp_path):
    """Broken: a temporary file of another host is removed as orphaned at exactly STALE_AFTER_S, not once older."""
    import os

    from sweep.store import STALE_AFTER_S
    from sweep.store._guard import stale_temps

    theirs = tmp_path / ".r1~other-host.1~123~ab.tmp"
    theirs.write_bytes(b"being written")
    os.utime(theirs, (1_000_000_000, 1_000_000_000))
    assert stale_temps(tmp_path, now=1_000_000_000 + STALE_AFTER_S) == []
    assert stale_temps(tmp_path, now=1_000_000_000 + STALE_AFTER_S + 1) == [theirs]


# ---------------------------------------------------------------- the report


def test_an_unbatched_trials_coarse_interval_counts_prompts_not_batches():
    """Broken: a trial decoded one prompt at a time (as many units as prompts) has its too-coarse interval said to
    come "from 3 batches", as if it had been batched."""
    from sweep.report.build import verdict

    row = verdict_row(speedup=1.3, speedup_lo=1.1, speedup_hi=1.5, ci_few_prompts=True, ci_prompts=3)
    assert "[interval from 3 prompts, fewer than 8: too coarse to trust]" in verdict({**row, "ci_units": 3}, 8)
    assert "[interval from 2 batches, fewer than 8: too coarse to trust]" in verdict({**row, "ci_units": 2}, 8)


def test_the_knees_table_calls_the_whole_models_front_all():
    """Broken: the row of the front over every gate is labelled as one of its gates' fronts would be (or not at
    all), so a reader cannot tell the model's knee from a gate's."""
    from types import SimpleNamespace

    from helpers.factories import trials
    from sweep.analysis import fronts
    from sweep.analysis import knees_table as knees
    from sweep.report.tables import knees_table

    points = [(1.0, 1.0), (1.2, 0.99), (1.5, 0.97), (2.0, 0.6), (2.2, 0.1)]
    front = fronts(trials(points))
    ctx = SimpleNamespace(front=front, knees=knees(front, min_points=3, min_agreement=0.5), knee_min_agreement=0.5)
    rows = [line for line in knees_table(ctx, "m") if line.startswith("| ")][1:]  # after the header
    assert [row.split(" | ")[0] for row in rows] == ["| all", "| saturation"]


def test_only_stopped_settings_count_as_stopped_early():
    """Broken: a failed or nondeterministic row is counted among the settings "stopped early", and its bench
    seconds among what they spent."""
    from sweep.report.tables import stopped_lines

    rows = [
        {"status": "ok", "bench_seconds": 10.0},
        {"status": "failed", "bench_seconds": 5.0},
        {"status": "nondeterministic", "bench_seconds": 7.0},
        {"status": "stopped", "bench_seconds": 1.5, "stopped_at_prompts": 4},
    ]
    said = " ".join(" ".join(stopped_lines(rows)).split())
    assert said.startswith("1 of 4 settings stopped early: after their first 4 prompts,")
    assert "they spent 1.5 s of bench in all" in said
    assert stopped_lines(rows[:3]) == []


def _verdict_of(*rows) -> str:
    """The verdict line at agreement 0.98 that `sweep analyze` prints for the ok trial rows ``rows`` of model m."""
    from sweep.analysis import ok_trials
    from sweep.report.build import sure_at, targets_at
    from sweep.report.verdicts import model_verdicts
    from sweep.store import TABLES

    trials = pl.DataFrame(list(rows), infer_schema_length=None)
    typed = [pl.lit(None, dtype=c.dtype).alias(c.name) for c in TABLES["trials"].columns]
    trials = trials.with_columns(c for c in typed if c.meta.output_name() not in trials.columns)
    conf = {"metric": "speedup_wall", "n_boot": 1000, "seed": 0, "min_prompts": 2}
    ok = ok_trials(trials, "speedup_wall").collect()
    targets = targets_at(ok, (0.98,), conf)
    settings = targets_at(ok, (0.98,), conf, reference=False)
    sure = sure_at(ok, targets, 0.98, conf)
    return model_verdicts(trials, targets, settings, 2, target=0.98, sure=sure)[0]


def test_a_pick_whose_interval_starts_exactly_at_1x_gives_way_to_a_sure_setting():
    """Broken: the fastest setting's interval starts at exactly 1.000x, so the verdict says it includes 1x, but no
    slower setting whose interval lies above 1x is sought: the verdict ends "no gate reaches ... distinguishable from
    1x" although one does."""
    from helpers.factories import timed_row

    base = [[10.0, 10.0]] * 3
    edge = timed_row("edge", base, [[10.0, 10.0], [20 / 3, 20 / 3], [5.0, 5.0]])  # rounds 1x, 1.5x, 2x
    steady = timed_row("steady", base, [[8.0, 8.0]] * 3)  # 1.25x every round
    alone = _verdict_of(edge)
    assert "speedup_wall 1.500x, 95% CI 1.00-" in alone and "but its interval includes 1x" in alone
    line = _verdict_of(edge, steady)
    assert line.startswith("m: agreement >= 0.98 with a speedup: saturation eps=0.1 min_layer=2, speedup_wall 1.250x")
    assert "(the fastest there, saturation eps=0.1 min_layer=2, speedup_wall 1.500x, 95% CI 1.00-" in line


def test_a_setting_exactly_at_the_target_agreement_can_be_the_sure_answer():
    """Broken: where the fastest setting's interval includes 1x, a slower one at exactly the target's agreement (0.98
    at agreement >= 0.98), whose interval lies above 1x, is passed over, and the verdict finds none."""
    from helpers.factories import timed_row

    base = [[10.0, 10.0]] * 3
    noisy = timed_row("noisy", base, [[5.0, 5.0], [20.0, 20.0], [20 / 3, 20 / 3]])  # rounds 2x, 0.5x, 1.5x
    steady = timed_row("steady", base, [[8.0, 8.0]] * 3, agree=[0.98, 0.98])  # 1.25x every round
    assert pl.DataFrame([steady])["agreement"].to_list() == [0.98]
    line = _verdict_of(noisy, steady)
    assert line.startswith("m: agreement >= 0.98 with a speedup: saturation eps=0.1 min_layer=2, speedup_wall 1.250x")
    assert "(the fastest there, saturation eps=0.1 min_layer=2, speedup_wall 1.500x" in line


def test_a_setting_whose_interval_starts_exactly_at_1x_is_not_the_sure_answer():
    """Broken: where the fastest setting's interval includes 1x, a slower one whose interval starts at exactly 1.000x
    (so includes 1x too) is announced as the speedup distinguishable from 1x."""
    from helpers.factories import timed_row

    base = [[10.0, 10.0]] * 3
    noisy = timed_row("noisy", base, [[5.0, 5.0], [20.0, 20.0], [50 / 9, 50 / 9]])  # rounds 2x, 0.5x, 1.8x
    edge = timed_row("edge", base, [[10.0, 10.0], [20 / 3, 20 / 3], [5.0, 5.0]])  # rounds 1x, 1.5x, 2x
    line = _verdict_of(noisy, edge)
    assert line.startswith("m: no gate reaches agreement >= 0.98 with a speedup distinguishable from 1x"), line
    assert "speedup_wall 1.800x" in line and "1.500x" not in line


def test_the_replays_fastest_setting_may_sit_exactly_at_the_knee_bar():
    """Broken: without a knee, a replayed setting whose teacher-forced agreement is exactly the bar (0.9 at
    agreement >= 0.9) is not counted as keeping it, and the end says none does."""
    from sweep.report.run_report import knee_lines

    front = pl.DataFrame(
        {"model": ["m", "m"], "gate": ["full", "saturation"], "min_layer": [None, 8], "eps": [None, 0.5],
         "speedup": [1.0, 2.9], "agreement": [1.0, 0.0], "trial_id": ["f", "t"]}
    )  # fmt: skip
    simulated = pl.DataFrame(
        {"model": ["m", "m"], "gate": ["saturation"] * 2, "min_layer": [8, 8], "eps": [0.1, 0.3],
         "agreement_tf": [1.0, 0.9], "exit_rate": [0.01, 0.2], "speedup_model": [1.004, 1.09], "trial_id": ["a", "b"]}
    )  # fmt: skip
    text = " ".join(line.strip() for line in knee_lines(front, 0.9, simulated))
    assert "2 of the sweep's 2 settings keep agreement >= 0.9" in text
    assert "the fastest is saturation eps=0.3 min_layer=8: 1.090x by the cost model" in text


def _categorised(categories: list[str], speedups: list[float]) -> list[str]:
    """The report's per-category lines for one setting (1.5x at agreement 0.99) whose prompts have ``categories``
    and measured ``speedups``."""
    from types import SimpleNamespace

    from helpers.factories import trials
    from sweep.report.categories import category_lines

    ok = trials([(1.5, 0.99)]).with_columns(
        speedup=pl.lit(1.5),
        speedup_metric=pl.lit("speedup_wall"),
        prompt_categories=pl.lit(categories, dtype=pl.List(pl.String)),
        prompt_speedup_wall=pl.lit(speedups, dtype=pl.List(pl.Float64)),
        prompt_acceptance=pl.lit(None, dtype=pl.List(pl.Float64)),
    )
    return [line for line in category_lines(SimpleNamespace(ok=ok, headline=0.98)) if line.startswith("| m |")]


def test_a_prompt_without_a_positive_speedup_is_left_out_of_its_categorys_mean():
    """Broken: one prompt whose measured speedup is 0 (an edited or foreign row) stops `sweep analyze` with "math
    domain error" while it writes the per-category table."""
    assert _categorised(["chat", "chat", "code"], [2.0, 0.0, 1.5]) == [
        "| m | best setting: saturation eps=0.1 min_layer=8 | chat | 2 | 2.000x | n/a |",
        "| m | best setting: saturation eps=0.1 min_layer=8 | code | 1 | 1.500x | n/a |",
    ]


def test_prompts_of_one_category_get_no_per_category_table():
    """Broken: where every prompt is of one category, the report adds a per-category table repeating the tables above
    it."""
    assert _categorised(["chat", "chat"], [2.0, 1.0]) == []
    assert len(_categorised(["chat", "code"], [2.0, 1.0])) == 2


def test_a_task_measured_over_one_problem_set_is_not_named_by_its_size():
    """Broken: every accuracy verdict names its problem set ("m on humaneval, 40 problems"), as if the model and
    task had been measured over several, which is when the lines must tell them apart."""
    from sweep.report.tasks import task_verdict_lines

    base = {"model": "m", "task": "humaneval", "task_metric": "pass@1", "accuracy_full": 0.6, "agreement": 0.9,
            "gate": "saturation", "speedup_lo": 1.1, "speedup_hi": 1.4, "accuracy_lo": 0.45, "accuracy_hi": 0.7,
            "accuracy_loss_lo": 0.0, "accuracy_loss_hi": 0.05, "task_problems": 40, "task_samples": 1,
            "task_layers_saved": 0.06, "layers_saved": 0.05}  # fmt: skip
    ok = pl.DataFrame(
        [
            {**base, "trial_id": "a", "speedup": 1.2, "accuracy": 0.6, "accuracy_loss": 0.0},
            {**base, "trial_id": "b", "speedup": 1.3, "accuracy": 0.58, "accuracy_loss": 0.02},
        ]
    )
    [line] = task_verdict_lines(ok)
    assert line.startswith("m on humaneval (pass@1 0.600 at full depth): within 1% loss: saturation, 1.200x")
    more = ok.with_columns(trial_id=pl.lit("c") + pl.col("trial_id"), task_problems=pl.lit(80, dtype=pl.Int64))
    named = [line.split(" (")[0] for line in task_verdict_lines(pl.concat([ok, more]))]
    assert named == ["m on humaneval, 40 problems", "m on humaneval, 80 problems"]


# ---------------------------------------------------------------- the config


def test_a_grid_of_exactly_max_trials_settings_runs():
    """Broken: a grid of exactly MAX_TRIALS (100000) settings, the most the refusal itself allows, is refused."""
    from sweep.config.search import MAX_TRIALS, grid

    exact = "search.spaces=[{gate: margin, gate.theta: 'range(0, 10000)', gate.min_layer: 'range(1, 11)'}]"
    assert len(grid(compose(exact).search)) == MAX_TRIALS == 100_000
    over = "search.spaces=[{gate: margin, gate.theta: 'range(0, 9091)', gate.min_layer: 'range(1, 12)'}]"
    with pytest.raises(ConfigError, match=r"^search.spaces: the grid has 100001 trials; at most 100000 \(use fewer"):
        grid(compose(over).search)


def test_a_fractions_constraint_may_be_0_or_1():
    """Broken: search.constraints.agreement=0 (no minimum worth the name, but a number in [0, 1] as the refusal itself
    says) is refused."""
    for bound in (0, 1):
        cfg = compose("search=optuna-constrained", f"search.constraints.agreement={bound}")
        assert cfg.search.constraints["agreement"] == bound
    with pytest.raises(ConfigError, match=r"^search.constraints.agreement=-0.1: must be a number in \[0, 1\]"):
        compose("search=optuna-constrained", "search.constraints.agreement=-0.1")


def test_a_skip_ratio_range_may_be_one_ratio():
    """Broken: search.skip_ratio=[0.3,0.3], a skip-set search at one skip ratio, which "0 <= lo <= hi <= 1" allows,
    is refused."""
    assert compose("search=skipset-random", "search.skip_ratio=[0.3,0.3]").search.skip_ratio == [0.3, 0.3]
    with pytest.raises(ConfigError, match=r"^search.skip_ratio=\[0.4, 0.3\]: must be \[lo, hi\] with 0 <= lo <= hi"):
        compose("search=skipset-random", "search.skip_ratio=[0.4,0.3]")


def test_a_skipset_search_may_draw_the_longest_draft_bench_allows():
    """Broken: search.draft_lens=[1,64] is refused, though bench.draft_len takes 64 and the refusal says 1..64."""
    assert compose("search=skipset-random", "search.draft_lens=[1,64]").search.draft_lens == [1, 64]
    assert compose("bench.mode=self_speculative", "gate=fixed", "bench.draft_len=64").bench.draft_len == 64
    with pytest.raises(ConfigError, match=r"^search.draft_lens=\[1, 65\]: must be a non-empty list of distinct draft"):
        compose("search=skipset-random", "search.draft_lens=[1,65]")


def test_true_is_not_an_integer_setting():
    """Broken: prompts.n=true (YAML's boolean) is taken as the integer 1, and a sweep runs one prompt in silence."""
    with pytest.raises(ConfigError) as refused:
        compose("prompts.n=true")
    assert str(refused.value) == "prompts.n=True: must be an integer >= 1 or null (all)"
    assert compose("prompts.n=1").prompts.n == 1


def test_pass_at_k_needs_only_one_k_within_the_samples():
    """Broken: eval.ks=[1,5] with eval.samples=2 is refused, though pass@1 can be measured (a k beyond the samples is
    left out of the row, not refused, as long as one k is within them)."""
    task = ("eval.task=humaneval", "eval.allow_code_execution=true", "eval.samples=2", "eval.temperature=0.8")
    assert compose(*task, "eval.ks=[1,5]").eval.ks == [1, 5]
    with pytest.raises(ConfigError) as refused:
        compose(*task, "eval.ks=[3,5]")
    assert str(refused.value) == "eval.ks=[3, 5]: pass@k needs k <= eval.samples=2 for at least one k"


def test_a_model_directorys_fingerprint_covers_which_file_holds_what(tmp_path):
    """Broken: two model directories holding the same text, one as its config.json and the other as its
    generation_config.json (which the loader reads otherwise), share one model_hash, and so one cached cost model."""
    from sweep.config.provenance import fingerprint_dir

    one, two = tmp_path / "one", tmp_path / "two"
    for directory, name in ((one, "config.json"), (two, "generation_config.json")):
        directory.mkdir()
        (directory / name).write_text('{"num_hidden_layers": 2}')
    assert fingerprint_dir(one) != fingerprint_dir(two)
    assert fingerprint_dir(one) == fingerprint_dir(one) and fingerprint_dir(one).startswith("dir-sha256:")


# ---------------------------------------------------------------- the command line


def test_analyze_refuses_a_report_inside_the_claims_directory(tmp_path, capsys):
    """Broken: analysis.out=<root>/claims is taken, and the report's files land where a sweep's workers keep their
    claims on trials."""
    from sweep.cli.commands import main

    root = tmp_path / "results"
    assert main(["analyze", f"results.root={root}", f"analysis.out={root}/claims"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: analysis.out={root}/claims: inside the results' claims/ directory"), err
    assert not (root / "claims").exists()


def test_a_file_planted_where_kept_rows_go_is_refused_before_any_work(tmp_path):
    """Broken: a file planted at `<root>/trials/kept` passes the check before work, and a row whose own path then
    fails has nowhere to be kept: its figures are lost after the work is done."""
    from sweep.store import check_row_path

    values = {"model": "m", "gate": "saturation"}
    assert check_row_path("trials", tmp_path, values, "t1") == tmp_path / "trials" / "model=m" / "gate=saturation" / (
        "t1.parquet"
    )
    (tmp_path / "trials").mkdir()
    (tmp_path / "trials" / "kept").write_text("not a directory")
    with pytest.raises(ConfigError) as refused:
        check_row_path("trials", tmp_path, values, "t1")
    assert str(refused.value) == (
        f"results.root: {tmp_path}/trials/kept is not a directory (planted where the kept trials rows of model=m, "
        "gate=saturation are written); remove it or use another results.root"
    )


def test_an_unknown_command_is_bad_input(capsys):
    """Broken: `sweep bogus` exits 1, the code of a failure, where every other input a user can fix exits 2."""
    from sweep.cli.commands import main

    assert main(["bogus"]) == 2
    assert capsys.readouterr().err == (
        "error: unknown command 'bogus'; commands: profile, bench, run, analyze, calibrate, fit, config, schema, "
        "families\n"
    )
