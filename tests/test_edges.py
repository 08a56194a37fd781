"""Behaviours at their edges that no other test pinned down, each found by changing the code and seeing every test
pass."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl
import pytest
import torch

from conftest import compose
from helpers.rows import PROV, profile_rows
from helpers.factories import aa_row, cost_model, full_trial_row, timed_row, trials, verdict_row
from sweep.errors import ConfigError


def _dead_pid() -> int:
    """A process id in Linux's range that names no process here (searched downwards from the top of the range)."""
    for pid in range(2**22 - 1, 2**22 - 100_000, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    pytest.skip("no free process id found")


# ---------------------------------------------------------------- config: identity, refusals


def test_every_eval_setting_that_defines_a_result_changes_the_trial_id():
    """Broken: two task trials at eval.temperature 0.8 and 1.5 share one id, and the second is skipped as done."""
    from sweep.config.identity import EVAL_KEYS, trial_identity

    task = ("eval.task=humaneval", "eval.problems=3", "eval.max_tokens=12", "eval.allow_code_execution=true")
    ids = {t: trial_identity(compose(*task, f"eval.temperature={t}"), "cpu").id for t in (0.8, 1.5)}
    assert ids[0.8] != ids[1.5]
    cfg = compose(*task, "eval.temperature=0.8")
    changed = {
        "task": "harness",
        "problems": 4,
        "max_tokens": 13,
        "samples": 2,
        "temperature": 1.5,
        "ks": [1, 2],
        "harness_tasks": ["arc_easy"],
        "harness_include": "/tasks",
        "batch_size": 2,
    }
    assert set(changed) == set(EVAL_KEYS)
    for key, value in changed.items():
        other = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, **{key: value}))
        assert trial_identity(other, "cpu").id != ids[0.8], key


def test_an_existing_cluster_on_port_0_is_refused_at_compose():
    """Broken: cluster.address=h:0 is accepted, and joining a GCS on port 0 fails later with no clear line."""
    with pytest.raises(ConfigError) as refused:
        compose("cluster=existing", "cluster.address=h:0")
    assert "cluster.address=h:0: must be null (an embedded Ray)" in str(refused.value)
    assert compose("cluster=existing", "cluster.address=h:1").cluster.address == "h:1"


def test_resume_without_a_name_continues_the_newest_sweep_of_the_search(tmp_path):
    """Broken: resume=true continues the oldest earlier sweep of the search, not the one just interrupted."""
    from sweep.orchestrate.plan import sweep_name

    for name, mtime in (("margin-grid-old", 1_000_000), ("margin-grid-new", 3_000_000), ("margin-grid-mid", 2_000_000)):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (mtime, mtime))
    assert sweep_name(compose("search=margin-grid", "resume=true"), tmp_path, "r9") == "margin-grid-new"


# ---------------------------------------------------------------- the store


def test_a_fresh_temporary_file_of_another_host_is_left_to_its_writer(tmp_path):
    """Broken: a write here deletes another host's temporary file (its pid means nothing here) while it is written."""
    from sweep.store import write_table

    first = write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1")
    theirs = first.parent / f".x~other-host.1~{_dead_pid()}~ab.tmp"  # fresh; its pid names no process here
    theirs.write_bytes(b"being written")
    write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r2")  # clears stale temps here
    assert theirs.exists()


def test_a_hidden_copy_of_a_trial_file_is_never_read(tmp_path):
    """Broken: a hidden `.copy.parquet` beside a trial file is read too, and every row in it counts twice."""
    from sweep.store import files, read, write_table

    row = full_trial_row("t1")
    path = write_table("trials", {k: [v] for k, v in row.items()}, root=tmp_path, provenance={}, stem="t1")
    shutil.copy(path, path.parent / ".copy.parquet")
    assert files("trials", tmp_path) == [path]
    assert read("trials", tmp_path)["trial_id"].to_list() == ["t1"]


# ---------------------------------------------------------------- verdicts and their tables


def _verdict_row(**kw) -> dict:
    return verdict_row(gate="margin", params="theta=5", mode="early_exit", exit_rate=0.4, acceptance_rate=None, **kw)


def test_a_verdict_whose_interval_starts_at_1x_is_not_called_a_speedup():
    """Broken: a pick whose 95% interval is [1.00, 1.50] is announced "with a speedup", though it includes 1x."""
    from sweep.report.build import verdict

    said = verdict(_verdict_row(speedup=1.3, speedup_lo=1.0, speedup_hi=1.5), 8)
    assert "with a speedup:" not in said and "its interval includes 1x" in said
    assert "with a speedup: margin theta=5" in verdict(_verdict_row(speedup=1.3, speedup_lo=1.001, speedup_hi=1.5), 8)


def test_a_task_pick_whose_interval_starts_at_1x_gives_way_to_full_depth():
    """Broken: the accuracy verdict names a setting whose speedup interval [1.000, 1.400] includes 1x as the answer."""
    from sweep.report.tasks import task_verdict_lines

    base = {"model": "m", "task": "humaneval", "task_metric": "pass@1", "accuracy_full": 0.6, "agreement": 0.9}
    ok = pl.DataFrame(
        [
            {**base, "trial_id": "a", "gate": "saturation", "speedup": 1.2, "speedup_lo": 1.0, "speedup_hi": 1.4,
             "accuracy": 0.6, "accuracy_lo": 0.45, "accuracy_hi": 0.7, "accuracy_loss": 0.0, "accuracy_loss_lo": 0.0,
             "accuracy_loss_hi": 0.05, "task_problems": 40, "task_layers_saved": 0.06, "layers_saved": 0.05},
        ]
    )  # fmt: skip
    [line] = task_verdict_lines(ok)
    assert "within 1% loss: full depth, 1.000x (saturation" in line
    assert "but its interval [1.000, 1.400] includes 1x" in line


def test_a_table_marks_an_interval_from_few_prompts_with_a_dagger():
    """Broken: an interval too coarse to trust shows in the tables like any other, without its † mark."""
    from sweep.report.tables import ci

    row = {"speedup_lo": 1.1, "speedup_hi": 1.4, "ci_few_prompts": True}
    assert ci(row, "speedup") == "1.100-1.400 †"
    assert ci({**row, "ci_few_prompts": False}, "speedup") == "1.100-1.400"


def test_the_report_honours_analysis_ci_min_prompts_for_the_few_prompts_flag(tmp_path):
    """Broken: with analysis.ci_min_prompts=2, a setting timed on 3 prompts is still flagged too coarse to trust."""
    from sweep.report.build import compute

    timed = timed_row("t1", [[4.0, 4.0, 4.0]] * 3, [[2.0, 2.2, 2.4]] * 3)
    row = {**full_trial_row("t1"), **timed, "acceptance_rate": None, "noise_floor": None, "noise_floor_e2e": None}
    trials = pl.DataFrame([row], infer_schema_length=None).lazy()
    for at_least, few in ((2, False), (4, True)):
        ctx = compute(compose(f"analysis.ci_min_prompts={at_least}"), (tmp_path, trials, None, tmp_path))
        picked = ctx.targets.filter(pl.col("trial_id") == "t1")
        assert picked.height and picked["ci_few_prompts"].to_list() == [few] * picked.height, at_least


# ---------------------------------------------------------------- analysis


def test_a_front_point_exactly_at_the_knee_floor_is_a_knee_candidate():
    """Broken: analysis.knee_min_agreement=0.5 leaves out the front point at agreement 0.5 itself."""
    from sweep.analysis import fronts, knees_table

    points = [(1.0, 1.0), (1.2, 0.99), (1.5, 0.97), (2.0, 0.5), (2.2, 0.1)]
    df = trials(points)
    table = knees_table(fronts(df, reference=False), min_points=3, min_agreement=0.5)
    row = table.filter(pl.col("front") == "model").row(0, named=True)
    assert row["front_points"] == 5 and row["knee_points"] == 4


def test_rows_sharing_one_aa_control_count_it_once_in_the_noise_floor():
    """Broken: a shared-baseline bundle of two settings counts its one A/A control twice (controls and rounds)."""
    from sweep.analysis import noise_floors

    shared = ([[10.0, 11.0], [10.5, 10.0]], [[10.2, 10.9], [10.4, 10.3]])
    own = ([[9.0, 9.5], [9.2, 9.1]], [[9.1, 9.4], [9.3, 9.0]])
    trials = pl.DataFrame([aa_row("a", *shared), aa_row("b", *shared), aa_row("c", *own)], infer_schema_length=None)
    floors = noise_floors(trials).row(0, named=True)
    assert floors["aa_controls"] == 2 and floors["aa_rounds"] == 4


def test_the_screen_keeps_the_newer_replay_of_a_setting():
    """Broken: a setting replayed by two screens is compared with its older replay, not the one traced afresh."""
    from sweep.analysis import distinct_simulated

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    simulated = pl.DataFrame(
        {"trial_id": ["t1", "t1"], "created_at": [now + timedelta(hours=1), now], "agreement_tf": [0.9, 0.5]}
    )
    kept = distinct_simulated(simulated)
    assert kept["agreement_tf"].to_list() == [0.9]
    assert distinct_simulated(simulated.reverse())["agreement_tf"].to_list() == [0.9]


def test_among_settings_of_equal_speedup_the_lower_loss_one_is_picked():
    """Broken: of two settings at the same ranked speedup, the one that loses more accuracy is named the pick."""
    from sweep.analysis import accuracy_targets

    base = {"model": "m", "task": "humaneval", "task_metric": "pass@1", "accuracy_full": 0.6, "gate": "saturation"}
    ok = pl.DataFrame(
        [
            {**base, "trial_id": "a", "speedup": 1.5, "accuracy": 0.57, "accuracy_loss": 0.03},
            {**base, "trial_id": "b", "speedup": 1.5, "accuracy": 0.59, "accuracy_loss": 0.01},
        ]
    )
    picks = accuracy_targets(ok, losses=(0.05,))
    assert picks["trial_id"].to_list() == ["b"]


# ---------------------------------------------------------------- bench and task figures


def test_prefix_agreement_stops_at_the_first_mismatch():
    """Broken: prefix_agreement counts every matching token, the same as agreement (0.75 where it is 0.5)."""
    from sweep.bench.estimators import Timings
    from sweep.bench.metrics import PromptRun, metrics
    from sweep.config import GateConfig
    from sweep.decode.engine import Generation
    from sweep.gates import make_gate
    from sweep.models.prompts import Prompt

    L = 4
    costs = cost_model(L)
    run = PromptRun(
        Prompt("p", "text", (1, 2, 3)),
        Generation([5, 6, 7, 8], [L] * 4, [0] * 4, 0.0),
        Generation([5, 6, 9, 8], [2, L, 2, L], [1, 2, 1, 2], 0.0),
    )
    t = Timings([[1.0]], [[1.0]], [[0.1]], [[0.1]])
    gate = make_gate(GateConfig(name="saturation", eps=0.1, min_layer=2), L)
    row = metrics([run], t, costs, gate, "propagate", L)
    assert row["agreement"] == pytest.approx(0.75) and row["prefix_agreement"] == pytest.approx(0.5)


def test_a_shorter_gated_completion_disagrees_where_it_has_no_token():
    """Broken: a gated completion cut short after two matching tokens of four reads as full agreement."""
    from sweep.tasks.evaluate import completion_agreement

    assert completion_agreement([[[1, 2]]], [[[1, 2, 3, 4]]]) == 0.5
    assert completion_agreement([[[1, 2, 3, 4, 5]]], [[[1, 2, 3, 4]]]) == 1.0


def test_the_rounds_a_floor_needs_are_rounded_up():
    """Broken: the rounds recommended for a +-target floor are rounded to nearest, too few to reach it."""
    from sweep.bench.noise import noise_floor, rounds_for_floor

    rng = np.random.default_rng(0)
    base = rng.uniform(20, 30, size=(5, 3))
    aa = base * rng.normal(1.0, 0.05, size=(5, 3))
    target = 0.01
    ratios = base.sum(axis=1) / aa.sum(axis=1)
    offset = abs(math.log(float(np.median(ratios))))
    spread = math.log1p(noise_floor(base, aa, rounds=5)) - offset
    projected = 5 * (spread / (math.log1p(target) - offset)) ** 2
    assert 0 < projected - math.floor(projected) < 0.5  # rounding to nearest would go down
    assert rounds_for_floor(base, aa, target) == math.ceil(projected)


# ---------------------------------------------------------------- gates


def test_calms_decaying_threshold_matches_its_closed_form():
    """Broken: the CALM threshold decays one token early, so every gated token exits at a looser threshold."""
    from sweep.gates.signals import decayed

    for t in (0, 3):
        expected = 0.9 * 0.5 + 0.1 * math.exp(-4 * t / 10)
        assert float(decayed(0.5, t, 10, 4)) == pytest.approx(expected, abs=1e-12), t
    assert float(decayed(0.5, 0, 10, 4)) == pytest.approx(0.55)


def test_below_is_strict_at_its_level():
    """Broken: a signal exactly at its level counts as below it, and the gate exits where it should not."""
    from sweep.gates.signals import below

    assert below(torch.tensor([0.5]), 0.5).tolist() == [False]
    assert below(torch.tensor([0.0]), 0.0).tolist() == [False]
    assert below(torch.tensor([0.4]), 0.5).tolist() == [True]


# ---------------------------------------------------------------- progress


def test_the_eta_counts_only_the_steps_left():
    """Broken: 2 of 10 steps done in 20 s shows ETA 01:40 (all ten steps), not the 01:20 the eight left take."""
    from sweep.progress import counts

    assert counts(2, 10, 20.0) == "2/10, 00:20 elapsed, ETA 01:20"
