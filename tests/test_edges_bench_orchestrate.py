"""Behaviours of the bench, the orchestrator and the task evaluation at their edges that no other test pinned down, each
found by changing the code and seeing every test pass."""

from __future__ import annotations

import pytest

from helpers.factories import cost_model

# ---------------------------------------------------------------- bench: figures of a trial


def _one_prompt_row(baseline_s: float, gated_s: float) -> dict:
    """The figures of one prompt of four tokens (exits 2, 4, 2, 4 of 4 layers) timed in one round."""
    from sweep.bench.estimators import Timings
    from sweep.bench.metrics import PromptRun, metrics
    from sweep.config import GateConfig
    from sweep.decode.engine import Generation
    from sweep.gates import make_gate
    from sweep.models.prompts import Prompt

    L = 4
    run = PromptRun(
        Prompt("p", "text", (1, 2, 3)),
        Generation([5, 6, 7, 8], [L] * 4, [0] * 4, 0.0),
        Generation([5, 6, 7, 8], [2, L, 2, L], [1, 2, 1, 2], 0.0),
    )
    t = Timings([[baseline_s]], [[gated_s]], [[0.01]], [[0.01]])
    gate = make_gate(GateConfig(name="saturation", eps=0.1, min_layer=2), L)
    return metrics([run], t, cost_model(L), gate, "propagate", L)


def test_ms_per_token_divides_by_the_decode_steps_on_both_sides():
    """Broken: the baseline's ms/token divides 3 decode steps' time by 4 tokens, so `sweep bench` prints a baseline
    75 ms/token beside a gated 100 ms/token for one and the same time."""
    row = _one_prompt_row(0.3, 0.3)
    assert row["baseline_ms_per_token"] == pytest.approx(100.0)  # 300 ms over tokens 2..4
    assert row["ms_per_token"] == pytest.approx(100.0)
    assert row["prompt_baseline_ms"] == pytest.approx([100.0]) and row["prompt_ms"] == pytest.approx([100.0])


def test_layers_saved_counts_the_decode_steps_only():
    """Broken: the first token (decided by the prefill, which saves nothing) counts in layers_saved: 25% where the
    decode steps ran 4, 2 and 4 of 4 layers, 1/6 saved."""
    row = _one_prompt_row(0.3, 0.2)
    assert row["layers_saved"] == pytest.approx(1 - (4 + 2 + 4) / 3 / 4)
    assert row["exit_rate"] == pytest.approx(0.5)  # the exit rate counts every token, the first included


def test_a_speedup_exactly_at_the_noise_floors_edge_is_ranked_as_1x():
    """Broken: a speedup of exactly 1 + f (the edge the A/A median reaches at the floor's level) ranks as a speedup
    though the floor says it cannot be told from 1x; likewise 1 / (1 + f) as a slowdown."""
    from sweep.bench.estimators import inside_floor, ranked_speedup

    assert inside_floor(1.25, 0.25) and inside_floor(1.5, 0.5)
    assert not inside_floor(1.2501, 0.25)
    assert ranked_speedup(1.25, True, 0.25) == 1.0
    assert ranked_speedup(1.2501, True, 0.25) == pytest.approx(1.2501)


def test_a_bundles_time_is_shared_with_an_even_share_of_its_baseline():
    """Broken: each setting of a bundle is charged the whole shared baseline and A/A control, so a bundle of two
    whose shared runs took 10 s and whose gated runs took 2 s and 6 s reports 12/28 and 16/28 of its time, not
    7/18 and 11/18."""
    from sweep.bench.estimators import Timings
    from sweep.bench.sides import timed_shares

    def timing(gated: float) -> Timings:
        return Timings([[3.0]], [[gated]], [[1.0]], [[0.0]], [[5.0]], [[1.0]])

    shares = timed_shares([timing(2.0), timing(6.0)])
    assert shares == pytest.approx([7 / 18, 11 / 18])
    assert timed_shares([timing(2.0)]) == [1.0]


def test_a_worker_keeps_as_many_references_as_its_capacity():
    """Broken: a reuse cache of capacity 2 keeps one reference, so a worker alternating between two prompt sets
    runs the determinism self-check again on every trial."""
    from sweep.bench.reuse import Reference, ReferenceKey, ReuseCache

    def key(seed: int) -> ReferenceKey:
        return ReferenceKey("m", "float32", "cpu", (("p", (1, 2)),), 4, seed, 1)

    cache = ReuseCache(capacity=2)
    for seed in (1, 2):
        cache.put(Reference(key(seed), f"r{seed}", [], 0.0))
    assert cache.get(key(1)) is not None and cache.get(key(2)) is not None
    cache.put(Reference(key(3), "r3", [], 0.0))  # key 1 is now the least recently used
    assert cache.peek(key(1)) is None and cache.peek(key(2)) is not None and cache.peek(key(3)) is not None


def test_a_prefix_draft_step_pays_the_logit_lens_that_reads_its_token():
    """Broken: a self-speculative draft step of layers 1..K is priced without the head that turns its hidden state
    into a token, and speedup_model overstates every prefix draft's gain."""
    costs = cost_model(4, verify_ms=[7.0, 8.0, 9.0])  # a layer 1 ms, the head 2 ms, the step's overhead 0.5 ms
    assert costs.prefix_draft_ms(2) == pytest.approx(0.5 + 2 * 1.0 + 2.0)
    # two rounds: three draft passes kept two (then a verification of 3 positions); one pass kept none (of 1)
    assert costs.speculative_ms(costs.prefix_draft_ms(2), [2, 0], [3, 1]) == pytest.approx(3 * 4.5 + 9 + 4.5 + 7)


def test_a_rung_under_batches_is_checked_after_at_least_its_prompts():
    """Broken: search.rung_prompts=3 under bench.batch_size=2 checks a setting after its first batch, 2 prompts,
    fewer than the rung asks for, and may stop it on an interval over too few prompts."""
    from conftest import compose
    from sweep.bench.command import prepare
    from sweep.bench.protocol import Rungs, run_trials
    from sweep.bench.session import Session

    cfg = compose("model=tiny-llama", "prompts.n=6", "bench.gen_tokens=3", "bench.repeats=1", "bench.warmup=0",
                  "bench.batch_size=2", "gate=fixed", "gate.exit_layer=3")  # fmt: skip
    lm, gate, prompts = prepare(cfg, Session())
    asked = []
    rows = run_trials([cfg], lm, [gate], prompts, rungs=Rungs(3, lambda s, agreement: asked.append(len(agreement))))
    assert asked == [4]  # two batches of two (the rung's 3 prompts rounded up to whole batches); the next is all 6
    assert rows[0]["status"] == "ok" and rows[0]["n_prompts"] == 6


def test_the_baseline_and_the_aa_control_swap_ends_with_every_unit_and_round():
    """Broken: the order of a round's sides flips with the round only, so within a round every prompt times the
    baseline first and the A/A control last, and a drift across a round (a warming clock) reads as an A/A offset."""
    from conftest import compose
    from sweep.bench.command import prepare
    from sweep.bench.protocol import run_trials
    from sweep.bench.session import Session

    cfg = compose("model=tiny-llama", "prompts.n=2", "bench.gen_tokens=3", "bench.repeats=2", "bench.warmup=0",
                  "gate=fixed", "gate.exit_layer=3")  # fmt: skip
    lm, gate, prompts = prepare(cfg, Session())
    events = []
    run_trials([cfg], lm, [gate], prompts, on_event=events.append)
    timed = [(e.round, e.unit, e.side) for e in events if e.phase == "round"]
    forward, backward = ["baseline", "gated", "aa"], ["aa", "gated", "baseline"]
    expected = {(0, 0): forward, (0, 1): backward, (1, 0): backward, (1, 1): forward}
    assert timed == [(r, u, side) for (r, u), sides in expected.items() for side in sides]


def test_an_early_exit_row_names_no_draft_length():
    """Broken: every early-exit row carries bench.draft_len (4 by default), which only self-speculation uses, and
    reads as a drafting setting in the trials table."""
    from conftest import compose
    from sweep.bench.rows import trial_fields

    assert trial_fields(compose("model=tiny-llama", "gate=saturation"), 1)["draft_len"] is None
    spec = compose("model=tiny-llama", "gate=fixed", "gate.exit_layer=1", "bench.mode=self_speculative",
                   "bench.draft_len=2")  # fmt: skip
    assert trial_fields(spec, 1)["draft_len"] == 2


# ---------------------------------------------------------------- orchestrator: done rows, bundles, study, screen


def test_a_stopped_row_counts_as_done_only_under_the_same_rung_prompts():
    """Broken: a row stopped at the first rung of 4 prompts counts as done for a sweep whose rungs start at 8 under
    the same min_agreement, so that sweep never measures the setting on the prompts its own rule would have seen."""
    from types import SimpleNamespace

    from sweep.orchestrate.done import counts_as_done

    row = {"status": "stopped", "stop_min_agreement": 0.9, "stop_rung_prompts": 4, "accuracy_loss_min": None}
    same = SimpleNamespace(min_agreement=0.9, rung_prompts=4, max_accuracy_loss=None)
    assert counts_as_done(row, same)
    assert not counts_as_done(row, SimpleNamespace(min_agreement=0.9, rung_prompts=8, max_accuracy_loss=None))
    assert not counts_as_done(row, SimpleNamespace(min_agreement=0.8, rung_prompts=4, max_accuracy_loss=None))


def test_self_speculative_settings_of_different_draft_lengths_share_one_bundle():
    """Broken: sweep.shared_baseline bundles settings apart by bench.draft_len, so a grid of draft lengths times a
    full-depth baseline for each, though the baseline never depends on how long the drafts are."""
    from conftest import compose
    from sweep.orchestrate.plan import baseline_groups

    spec = ["model=tiny-llama", "gate=fixed", "gate.exit_layer=1", "bench.mode=self_speculative"]
    trials = [[*spec, f"bench.draft_len={n}"] for n in (2, 3)] + [["model=tiny-llama", "gate=saturation"]]
    grid = [(t, compose(*t)) for t in trials]
    assert baseline_groups(grid, trials, 8) == [trials]
    assert baseline_groups(grid, trials, 2) == [trials[:2], trials[2:]]


def test_a_study_trial_that_just_meets_its_constraints_is_among_its_best():
    """Broken: a constraint value of exactly 0 (agreement exactly at its bound; skipped_compute is 0 for every
    trial that skipped compute) counts as unmet, so a study ends with no best settings and none is re-timed."""
    import optuna

    from sweep.orchestrate.searches.study import best_trials

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "maximize"])
    dist = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    for tid, x, values, constraints in (
        ("at-bound", 0.1, [1.5, 0.98], [0.0, 0.0]),  # agreement 0.98 against a bound of 0.98; it skipped compute
        ("beyond", 0.2, [2.0, 0.9], [0.08, 0.0]),  # faster, but below the agreement bound
        ("none-skipped", 0.3, [1.6, 0.99], [-0.01, 1.0]),  # skipped no compute: infeasible
    ):
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": x}, distributions=dist, values=values,
                user_attrs={"trial_id": tid}, system_attrs={"constraints": constraints},
            )
        )  # fmt: skip
    assert [t.user_attrs["trial_id"] for t in best_trials(study)] == ["at-bound"]


def test_a_study_setting_whose_rounds_already_reach_the_floor_target_is_not_timed_again(tmp_path):
    """Broken: a best setting whose own rounds already give the floor the target asks (its projection needs exactly
    the rounds it ran) is "re-timed" with those same rounds: the same trial id, so a finished sweep run again shows
    its row twice and counts it skipped twice."""
    from helpers.study import SETTING, study_told_one_row
    from sweep.orchestrate.searches._optuna import Optuna

    # full depth against itself, exactly, in its one round: a floor of 0, which its one round already reaches
    plan, row, write = study_told_one_row(
        tmp_path, "bench.repeats=1", repeats=1, round_baseline_ms=[[10.0, 10.0]], round_aa_ms=[[10.0, 10.0]]
    )
    assert Optuna().retime(plan, "cpu") == []
    row.update(repeats=1, round_aa_ms=[[10.0, 11.0]])  # an A/A offset: its floor needs more rounds than one
    write(row)
    [again] = Optuna().retime(plan, "cpu")
    assert again[:2] == SETTING and again[-1].startswith("bench.repeats=") and again[-1] != "bench.repeats=1"


def test_a_setting_planned_twice_shows_its_done_row_once():
    """Broken: a grid that lists one setting twice (two sub-spaces that overlap) shows its row twice at the end of a
    finished sweep run again, once per listing."""
    from conftest import compose
    from sweep.config.identity import trial_identity
    from sweep.orchestrate.plan import done_settings

    full, fixed = compose("model=tiny-llama", "gate=full"), compose("model=tiny-llama", "gate=fixed")
    grid = [(["gate=full"], full), (["gate=fixed"], fixed), (["gate=full"], full)]
    ids = [trial_identity(c, "cpu").id for c in (full, fixed)]
    done = {tid: {"trial_id": tid} for tid in ids}
    assert done_settings(grid, done, "cpu") == [done[ids[0]], done[ids[1]]]


def test_the_last_pass_over_given_up_settings_writes_their_failed_rows(tmp_path):
    """Broken: a setting Tune gives up on in every pass that sweep.max_failures allows is never written, neither
    run nor failed: the sweep ends as if it had no such setting, and says nothing of it."""
    from types import SimpleNamespace

    from conftest import TINY_SWEEP
    from sweep.orchestrate.driver import run_again
    from sweep.orchestrate.writer import RowWriter
    from sweep.store import read

    trial = ["gate=saturation", "gate.eps=0.1"]
    writer = RowWriter(str(tmp_path), 1, [*TINY_SWEEP, f"results.root={tmp_path}"], "run-a", "sweep-a", "cpu")
    writer.gave_up({"trial": trial}, "the actor died", failures=1, allowed=2)  # the first pass: kept to run again
    passes = []

    class GivesUp:  # a cluster whose Tune gives up on every setting it is handed
        def run(self, plan, batch, writer):
            passes.append((batch.values, writer.last_pass))
            for setting in batch.values:
                writer.gave_up({"trial": setting}, "the actor died", failures=1, allowed=2)
            return False

    plan = SimpleNamespace(cfg=SimpleNamespace(sweep=SimpleNamespace(max_failures=2)), name="sweep-a")
    assert run_again(plan, GivesUp(), writer, False) is False
    assert passes == [([trial], False), ([trial], True)]
    rows = read("trials", tmp_path)
    assert rows["status"].to_list() == ["failed"] and "the actor died" in rows["error"][0]
    assert writer.retry == []


def test_a_screen_keeps_settings_of_one_threshold_at_different_min_layers_apart():
    """Broken: a screen takes settings at the same eps but different min_layer for one (as it rightly does settings
    whose min_depth resolves to the same layer), and runs only the first closed-loop, though both are on the front."""
    import polars as pl

    from sweep.orchestrate.searches.screening import select

    table = pl.DataFrame(
        {
            "trial_id": ["shallow", "deep", "same-as-deep"],
            "model": ["m"] * 3,
            "gate": ["saturation"] * 3,
            "min_layer": [2, 6, 6],
            "eps": [0.1, 0.1, 0.1],
            "speedup_model": [1.8, 1.3, 1.3],
            "agreement_tf": [0.7, 0.95, 0.95],
            **{c: [None] * 3 for c in ("exit_layer", "theta", "q", "k", "decay", "skip", "lens")},
        },
        schema_overrides={"exit_layer": pl.Int64, "theta": pl.Float64, "q": pl.Float64, "k": pl.Int64,
                          "decay": pl.Float64, "skip": pl.String, "lens": pl.String},
    )  # fmt: skip
    out = select(table, neighbours=0)
    assert out.filter("selected")["trial_id"].sort().to_list() == ["deep", "shallow"]
    assert out.filter("on_front")["trial_id"].sort().to_list() == ["deep", "shallow"]


# ---------------------------------------------------------------- task evaluation


def test_a_programs_cpu_limit_is_its_timeout_rounded_up(monkeypatch):
    """Broken: eval.timeout_s=2.5 gives each HumanEval program 2 CPU seconds, so a program that computes for 2.2 s
    is killed by its CPU limit well inside the 2.5 s it was promised."""
    import sweep.tasks.sandbox as sandbox
    from conftest import compose
    from sweep.tasks.evaluate import prepare

    asked = []
    monkeypatch.setattr(sandbox, "prepare", lambda limits=None: asked.append(limits) or "checked")
    task = ("model=tiny-llama", "eval.task=humaneval", "eval.problems=1", "eval.allow_code_execution=true")
    for timeout, cpu in ((2.5, 3), (2.0, 2), (0.5, 1)):
        prepare(compose(*task, f"eval.timeout_s={timeout}"))
        assert (asked[-1].timeout_s, asked[-1].cpu_s) == (timeout, cpu)


def test_the_tasks_exit_rate_counts_only_tokens_that_left_before_the_last_layer():
    """Broken: a token that ran all L layers counts as an exit, so a task's exit rate reads 1.0 for a gate that
    exited on one token of four."""
    from types import SimpleNamespace

    from sweep.tasks.completions import Side
    from sweep.tasks.evaluate import task_columns

    cfg = SimpleNamespace(eval=SimpleNamespace(task="humaneval", samples=1))
    lm = SimpleNamespace(num_layers=4)
    gated = Side([1.0], [["x"]], [[[1, 2, 3, 4]]], [4, 2, 4, 4], {1: 1.0}, "pass@1", "sandbox")
    full = Side([1.0], [["x"]], [[[1, 2, 3, 4]]], [4, 4, 4, 4], {1: 1.0}, "pass@1", "sandbox")
    out = task_columns(cfg, lm, gated, full, 1.0, "fresh")
    assert out["task_exit_rate"] == pytest.approx(0.25)
    assert out["task_layers_saved"] == pytest.approx(2 / 16)
    assert out["accuracy_loss"] == 0.0 and out["task_agreement"] == 1.0


def _task_on_fakes(monkeypatch, *overrides, gated_passes: bool):
    """``evaluate`` of a HumanEval trial of two problems whose full-depth side (in the worker's memo) passed both:
    each completion decoded by a stand-in that records its seed, the gated side's programs scored as
    ``gated_passes`` without a sandbox. The task's columns and the seeds drawn."""
    from types import SimpleNamespace

    import sweep.tasks.evaluate as evaluate
    import sweep.tasks.humaneval as humaneval
    from conftest import compose
    from sweep.tasks.completions import Side

    cfg = compose("model=tiny-llama", "gate=saturation", "eval.task=humaneval", "eval.problems=2",
                  "eval.allow_code_execution=true", *overrides)  # fmt: skip
    lm = SimpleNamespace(content_hash="h", dtype="float32", device="cpu", num_layers=4)
    seeds = []

    def complete(cfg, lm, engine, prompt, stops, seed):
        seeds.append(seed)
        return "    return 1", [7], [2]

    def score(samples, by_id, *, limits, workers, ks=(1,)):
        passed = {task: [] for task, _ in samples}
        for task, _ in samples:
            passed[task].append(gated_passes)
        return humaneval.Scored(passed, humaneval.pass_at(passed, ks), "stand-in")

    monkeypatch.setattr(evaluate, "complete", complete)
    monkeypatch.setattr(humaneval, "score", score)
    n = cfg.eval.samples
    full = Side([1.0, 1.0], [["x"] * n] * 2, [[[7]] * n] * 2, [4, 4], {1: 1.0}, "pass@1", "stand-in")
    memo = {evaluate.reference_key(cfg, lm): full}
    return cfg, lm, memo, seeds


def test_a_gated_side_that_ran_every_problem_keeps_its_accuracy(monkeypatch):
    """Broken: a gated side whose loss passes search.max_accuracy_loss only on its last problem is told "stopped
    after 2 of 2 problems", with no accuracy, though it ran every problem and its accuracy is known."""
    from sweep.tasks.evaluate import evaluate

    cfg, lm, memo, _ = _task_on_fakes(monkeypatch, "search.max_accuracy_loss=0.6", gated_passes=False)
    out = evaluate(cfg, lm, object(), memo)  # after one problem the loss is at least 0.5: not yet past 0.6
    assert out["accuracy_loss_min"] is None and out["task_problems"] == 2
    assert out["accuracy"] == 0.0 and out["accuracy_loss"] == 1.0
    cfg, lm, memo, _ = _task_on_fakes(monkeypatch, "search.max_accuracy_loss=0.4", gated_passes=False)
    out = evaluate(cfg, lm, object(), memo)  # after one problem, a loss of at least 0.5 is certain: it stops
    assert out["accuracy_loss_min"] == pytest.approx(0.5) and out["accuracy"] is None and out["task_problems"] == 1


def test_sampled_completions_of_different_problems_draw_from_different_seeds(monkeypatch):
    """Broken: problem 0's second sample and problem 1's first draw from one seed, so with eval.samples > 1 the
    samples of neighbouring problems are not independent draws."""
    from sweep.tasks.evaluate import evaluate

    cfg, lm, memo, seeds = _task_on_fakes(
        monkeypatch, "eval.samples=3", "eval.temperature=0.8", "eval.ks=[1]", gated_passes=True
    )
    out = evaluate(cfg, lm, object(), memo)
    assert len(seeds) == 6 and len(set(seeds)) == 6
    assert seeds == [cfg.seed + 1000 * i + s for i in range(2) for s in range(3)]
    assert out["accuracy"] == 1.0 and out["pass_at_k"] == '{"1": 1.0}'


def test_a_stopped_task_side_has_no_intervals(monkeypatch):
    """Broken: a gated side stopped after its first problem gets accuracy intervals over that one problem, which read
    as a measured accuracy of the setting (and the loss's over one problem as a certain loss)."""
    from types import SimpleNamespace

    from sweep.bench.sides import task_columns

    cfg, lm, memo, _ = _task_on_fakes(monkeypatch, "search.max_accuracy_loss=0.4", gated_passes=False)
    out = task_columns(cfg, lm, SimpleNamespace(), memo)
    assert out["accuracy_loss_min"] == pytest.approx(0.5)
    assert [out[k] for k in ("accuracy_lo", "accuracy_hi", "accuracy_loss_lo", "accuracy_loss_hi")] == [None] * 4
    cfg, lm, memo, _ = _task_on_fakes(monkeypatch, gated_passes=False)
    out = task_columns(cfg, lm, SimpleNamespace(), memo)  # no stop rule: every problem, with its intervals
    assert out["accuracy_lo"] == 0.0 and out["accuracy_loss_hi"] == 1.0


def test_a_stored_full_depth_side_is_not_reused_under_another_program_timeout():
    """Broken: the full-depth side measured with eval.timeout_s=10 is reused for a trial at eval.timeout_s=1, where
    its slow programs would have timed out and failed: the two sides are scored under different limits."""
    from types import SimpleNamespace

    from conftest import compose
    from sweep.tasks.evaluate import reference_key

    lm = SimpleNamespace(content_hash="h", dtype="float32", device="cpu")
    task = ("model=tiny-llama", "eval.task=humaneval", "eval.problems=2", "eval.allow_code_execution=true")
    keys = {t: reference_key(compose(*task, f"eval.timeout_s={t}"), lm) for t in (1, 10)}
    assert keys[1] != keys[10]
    assert reference_key(compose(*task, "eval.timeout_s=1"), lm) == keys[1]


def test_humaneval_problems_and_their_scores_come_in_task_number_order():
    """Broken: problems sorted as text put HumanEval/10 before HumanEval/2, so eval.problems=3 runs problems 0, 1
    and 10, and per-problem scores of one side no longer pair with the other side's (scored in other chunks)."""
    from sweep.tasks.humaneval import Scored, problems

    assert [p["task_id"] for p in problems(12)] == [f"HumanEval/{i}" for i in range(12)]
    scored = Scored({"HumanEval/10": [True, True], "HumanEval/2": [False, True], "HumanEval/9": [False, False]}, {}, "")
    assert scored.per_problem(1) == [0.5, 0.0, 1.0]  # problems 2, 9, 10


def test_a_generation_stops_at_its_end_of_sequence_token():
    """Broken: a completion that ends with its end-of-sequence token decodes on to eval.max_tokens (unless a stop
    sequence happens to appear), spending the time of every token past its end."""
    from sweep.tasks.completions import stop_at

    class Chars:  # one token per character; 0 is the end of sequence
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids if i)

    stop = stop_at(Chars(), ("\ndef",), eos=0)
    assert stop([ord("a"), ord("b"), 0]) and not stop([ord("a"), ord("b")])
    assert stop([ord(c) for c in "x\ndef"])


def test_eval_problems_may_ask_for_every_humaneval_problem():
    """Broken: eval.problems=164, all of HumanEval, is refused as more problems than the task has."""
    from conftest import compose
    from sweep.errors import InputError
    from sweep.tasks.evaluate import check_inputs

    task = ("model=tiny-llama", "eval.task=humaneval", "eval.allow_code_execution=true")
    check_inputs(compose(*task, "eval.problems=164"))
    with pytest.raises(InputError, match="HumanEval has 164 problems"):
        check_inputs(compose(*task, "eval.problems=165"))


def test_a_harness_tasks_full_depth_side_is_keyed_by_the_seed_of_its_few_shot_draw(monkeypatch):
    """Broken: a harness task's full-depth side, whose few-shot examples are drawn from the seed, is reused for a
    trial of another seed, so its accuracy_loss compares prompts with different examples."""
    from types import SimpleNamespace

    import sweep.tasks.evaluate as evaluate
    from conftest import compose

    monkeypatch.setattr(evaluate, "task_data_digest", lambda cfg: "documents")  # the harness's documents, as read
    lm = SimpleNamespace(content_hash="h", dtype="float32", device="cpu")
    harness = ("model=tiny-llama", "eval.task=harness", "eval.harness_tasks=[arc_easy]", "eval.problems=2")
    assert evaluate.reference_key(compose(*harness, "seed=1"), lm) != evaluate.reference_key(
        compose(*harness, "seed=2"), lm
    )
    greedy = ("model=tiny-llama", "eval.task=humaneval", "eval.problems=2", "eval.allow_code_execution=true")
    assert evaluate.reference_key(compose(*greedy, "seed=1"), lm) == evaluate.reference_key(
        compose(*greedy, "seed=2"), lm
    )  # greedy completions draw nothing: one side serves every seed


# ---------------------------------------------------------------- what the driver says and the searcher reads


def test_a_nondeterministic_row_gives_the_searcher_no_objectives():
    """Broken: a trial whose timed repeats did not reproduce their tokens hands Optuna its speedup and agreement as
    if measured, and the study climbs towards figures the bench itself distrusts."""
    from sweep.orchestrate.report import reported_metrics

    row = {"status": "nondeterministic", "speedup_wall": 1.8, "speedup_model": 1.7, "agreement": 0.95}
    got = reported_metrics(row)
    assert got["status"] == "nondeterministic"
    assert got["speedup_wall"] is None and got["speedup_model"] is None and got["agreement"] is None
    ok = reported_metrics({**row, "status": "ok", "mode": "early_exit", "step_layers_saved": 0.3,
                           "kv_policy": "propagate", "noise_floor": 0.05})  # fmt: skip
    assert ok["speedup_wall"] == pytest.approx(1.8) and ok["agreement"] == 0.95


def test_a_row_another_sweep_computed_is_named_in_the_progress_line():
    """Broken: a row computed meanwhile by a concurrent sweep into the same root reads "from an earlier run", and the
    user cannot tell that two sweeps shared the work."""
    from sweep.orchestrate.writer import describe

    row = {"model": "m", "gate": "full", "status": "ok", "agreement": 1.0, "speedup_wall": 1.0}
    assert describe(row, True, "sweep-b").endswith("(row computed by the concurrent sweep sweep-b)")
    assert describe(row, True).endswith("(row from an earlier run)")


def test_a_setting_planned_twice_is_counted_skipped_once():
    """Broken (found here): a grid that lists one done setting twice (two overlapping sub-spaces) counts it skipped
    twice, so a finished sweep run again says "0 settings measured and written, 3 skipped" over 2 settings."""
    from conftest import compose
    from sweep.config.identity import trial_identity
    from sweep.orchestrate.plan import select_trials

    full, fixed = compose("model=tiny-llama", "gate=full"), compose("model=tiny-llama", "gate=fixed")
    grid = [(["gate=full"], full), (["gate=fixed"], fixed), (["gate=full"], full)]
    done = {trial_identity(full, "cpu").id: {}}
    assert select_trials(grid, done, "cpu", "root") == ([["gate=fixed"]], 1)
    done[trial_identity(fixed, "cpu").id] = {}
    assert select_trials(grid, done, "cpu", "root") == ([], 2)
    assert select_trials(grid, {}, "cpu", "root") == ([["gate=full"], ["gate=fixed"]], 0)


def test_the_eta_runs_no_more_settings_at_once_than_are_left(tmp_path):
    """Broken: with four Tune trials running and one setting left, the ETA divides that setting's time by four, as
    if one setting could run on four workers at once."""
    from helpers.factories import full_trial_row
    from sweep.orchestrate.writer import RowWriter

    def result(tid: str) -> dict:
        row = full_trial_row(tid)
        row.update(n_prompts=2, gen_tokens=4, repeats=1, baseline_shared=1, bench_seconds=10.0, task_seconds=0.0)
        return {"row": row, "cached": False, "status": "ok"}

    writer = RowWriter(str(tmp_path), 2, [], "run", "eta", "cpu")
    for key in "abcd":  # four Tune trials running (the other two for a retry, say)
        writer.started(key)
    writer.result("a", result("0" * 16))
    writer.close()
    # one setting left at the pace of the first (10 s for the same work), on one worker; no overhead measured
    assert writer.eta(1) == pytest.approx(10.0)


@pytest.mark.parametrize("exit_rate", [0.0, 0.5])
def test_a_speedup_of_exactly_1x_is_said_as_neither_a_slowdown_nor_a_saving_outside_the_floor(exit_rate):
    """A trial measured at exactly 1.000x was said to pay "its probes' and heads' real cost" in a slowdown it did not
    have (no compute skipped), or to lie "outside the noise floor" (compute skipped)."""
    from sweep.bench.rows import aa_lines

    row = {
        "speedup_aa": 1.0,
        "noise_floor": 0.05,
        "round_aa_ms": [[10.0, 10.0]],
        "round_baseline_ms": [[10.0, 10.0]],
        "speedup_wall": 1.0,
        "mode": "early_exit",
        "step_layers_saved": exit_rate,
        "exit_rate": exit_rate,
        "kv_policy": "propagate",
    }
    said = aa_lines(row)[-1]
    assert said == "ranked speedup (what `sweep analyze` ranks by): 1.000x (measured at 1x: no saving and no slowdown)"
    slower = aa_lines({**row, "speedup_wall": 0.9})[-1]  # the other readings stay as they were
    assert slower.endswith("(it skipped no compute: the slowdown is its probes' and heads' real cost)") == (
        exit_rate == 0.0
    )
    assert slower.endswith("(outside the noise floor)") == (exit_rate > 0)
