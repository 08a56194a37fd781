"""An accuracy answer made cheap (``sweep.tasks.evaluate``): the full-depth side measured once per machine (stored,
read by later processes, measured over when the entry cannot be trusted), a gated side stopped once its loss is
certain to exceed ``search.max_accuracy_loss`` (checked against a brute force), and completions decoded in batches
equal to one at a time."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest

from conftest import compose, load, run_cli
from sweep import progress

MODEL = "tiny-llama"
BENCH = ("prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0")
TASK = ("eval.task=humaneval", "eval.problems=3", "eval.max_tokens=12", "eval.allow_code_execution=true")


def _bench(tmp_path, *overrides):
    from sweep.bench.command import run_bench

    cfg = compose(f"model={MODEL}", *BENCH, f"results.root={tmp_path / 'results'}", *TASK, *overrides)
    return run_bench(cfg)[1]


def _cli_row(tmp_path, name: str, *overrides) -> tuple[dict, str]:
    import polars as pl

    root = tmp_path / name
    done = run_cli(
        "bench", f"model={MODEL}", *BENCH, *TASK, f"results.root={root}", "gate=full", *overrides,
        env={"SWEEP_CACHE_DIR": os.environ["SWEEP_CACHE_DIR"]},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    files = list(root.rglob("*.parquet"))
    assert len(files) == 1
    return pl.read_parquet(files[0]).to_dicts()[0], " ".join(done.stderr.split())  # log lines wrap at 120 columns


def _stored() -> list:
    from sweep.models import cache_dir

    return sorted((cache_dir() / "tasks").glob("*.json"))


@pytest.mark.faults  # runs the model's programs in the sandbox
def test_the_full_depth_side_is_measured_once_per_machine(tmp_path):
    first, _ = _cli_row(tmp_path, "a")
    assert first["task_reference"] == "fresh" and len(_stored()) == 1
    second, _ = _cli_row(tmp_path, "b", "gate=saturation", "gate.eps=0.5", "gate.min_layer=1")
    assert second["task_reference"] == "stored"  # another process read what the first one measured
    assert second["completions_full"] == first["completions_full"]
    assert second["task_scores_full"] == first["task_scores_full"]
    other, _ = _cli_row(tmp_path, "c", "eval.max_tokens=8")  # another setting of the task: its own side
    assert other["task_reference"] == "fresh" and len(_stored()) == 2

    entry = next(p for p in _stored() if json.loads(p.read_text())["side"]["completions"] == [
        [c] for c in first["completions_full"]
    ])  # fmt: skip
    record = json.loads(entry.read_text())
    for bad in ("not json {", json.dumps({**record, "side": {**record["side"], "scores": ["1"] * 3}})):
        entry.write_text(bad)
        again, err = _cli_row(tmp_path, f"bad{len(bad)}")
        assert again["task_reference"] == "fresh" and "cannot be used" in err and str(entry) in err
        assert again["task_scores_full"] == first["task_scores_full"]
        assert json.loads(entry.read_text())["side"]["scores"] == first["task_scores_full"]  # replaced
    entry.unlink()
    os.mkfifo(entry)  # read, it would block: it is measured over without being opened
    again, err = _cli_row(tmp_path, "fifo")
    assert again["task_reference"] == "fresh" and "not a regular file" in err


def test_the_loss_bound_against_a_brute_force():
    """``loss_stop``'s bound is the least loss any outcome of the problems not yet run could give, and it stops
    exactly when every such outcome ends above the bar."""
    from sweep.tasks.evaluate import loss_stop

    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 7))
        full = [float(x) for x in rng.integers(0, 2, n)]
        done = [float(x) for x in rng.integers(0, 2, int(rng.integers(0, n + 1)))]
        bar = float(rng.choice([0.0, 0.1, 0.2, 0.34, 0.5]))
        losses = [
            float(np.mean(np.asarray(full) - np.asarray(done + list(rest))))
            for rest in itertools.product((0.0, 1.0), repeat=n - len(done))
        ]
        bound = loss_stop(bar, full)(done)
        if min(losses) > bar + 1e-12:
            assert bound == pytest.approx(min(losses))
        else:
            assert bound is None
    assert loss_stop(None, [1.0]) is None


@pytest.mark.faults
def test_a_setting_certain_to_lose_more_than_the_bar_stops(tmp_path):
    """A stored full-depth side that passes every problem, a tiny random model that passes none: with
    search.max_accuracy_loss=0.5 the gated side stops after 2 of 3 problems (after 2 failures the loss is at least
    2/3 whatever the third gives), with its bound and no accuracy; without the bar it runs all 3."""
    from sweep.tasks import reference
    from sweep.tasks.completions import Side
    from sweep.tasks.evaluate import reference_key

    lm = load(f"model={MODEL}")
    cfg = compose(f"model={MODEL}", *BENCH, *TASK)
    reference.save(reference_key(cfg, lm), Side([1.0] * 3, [["x"]] * 3, [[[1]]] * 3, [4], {1: 1.0}, "pass@1"))
    events: list[progress.Event] = []
    with progress.listen(events.append):
        row = _bench(tmp_path, "gate=fixed", "gate.exit_layer=2", "search.max_accuracy_loss=0.5")
    assert row["task_reference"] == "stored" and row["task_problems"] == 2
    assert row["accuracy_loss_min"] == pytest.approx(2 / 3)
    assert row["accuracy"] is None and row["accuracy_loss"] is None and row["accuracy_loss_lo"] is None
    gated = [e for e in events if e.phase == "humaneval gated" and e.kind == "step"]
    assert gated[-1].done == 2  # the third problem was never decoded
    full = _bench(tmp_path / "all", "gate=fixed", "gate.exit_layer=2")
    assert full["task_problems"] == 3 and full["accuracy_loss_min"] is None and full["accuracy_loss"] == 1.0
    # a bar that only the last problem makes certain (a loss of 1.0 > 0.9): the side ran them all, so it has its
    # accuracy and loss, not a bound
    last = _bench(tmp_path / "last", "gate=fixed", "gate.exit_layer=2", "search.max_accuracy_loss=0.9")
    assert last["task_problems"] == 3 and last["accuracy_loss_min"] is None and last["accuracy_loss"] == 1.0
    # the stopped row is done for a sweep that would stop it too (a bar below its certain loss), and measured again
    # by a sweep under a higher bar, or none: its accuracy is not that sweep's to leave out
    from sweep.orchestrate.done import done_rows

    for bar, done in (("0.5", True), ("0.6", True), ("0.7", False), ("null", False)):
        cfg = compose(
            f"model={MODEL}", f"results.root={tmp_path / 'results'}", *TASK, f"search.max_accuracy_loss={bar}"
        )
        assert (row["trial_id"] in done_rows(cfg)) is done, bar
    assert full["trial_id"] in done_rows(compose(f"results.root={tmp_path / 'all' / 'results'}"))


@pytest.mark.faults
def test_batched_completions_equal_one_at_a_time(tmp_path):
    from sweep.tasks.humaneval import problems

    lm = load(f"model={MODEL}")
    from helpers.tasks import humaneval_eps  # the saturation threshold at which the gate exits on some tokens

    gate = ("gate=saturation", f"gate.eps={humaneval_eps(lm)}", "gate.min_layer=1")
    one = _bench(tmp_path / "one", *gate)
    events: list[progress.Event] = []
    with progress.listen(events.append):
        two = _bench(tmp_path / "two", *gate, "eval.batch_size=2")
    assert 0 < one["task_exit_rate"] < 1  # the gate exits on some tokens
    for column in ("completions", "completions_full", "task_scores", "task_scores_full", "task_exit_rate"):
        assert two[column] == one[column], column
    steps = [e.done for e in events if e.phase == "humaneval gated" and e.kind == "step"]
    assert steps == [2, 3], steps  # two problems decoded together, then the third
    assert len(problems(3)) == 3 and two["trial_id"] != one["trial_id"]


def test_the_batch_size_of_one_keeps_every_trial_id():
    from sweep.config.identity import trial_identity

    keys = {n: json.loads(trial_identity(compose(*TASK, f"eval.batch_size={n}"), "cpu").key) for n in (1, 2)}
    assert "batch_size" not in keys[1]["eval"] and keys[2]["eval"]["batch_size"] == 2


@pytest.mark.faults
def test_gate_full_takes_the_full_depth_side_without_decoding_it_twice(tmp_path):
    from sweep.decode.engine import Engine
    from sweep.gates import make_gate
    from sweep.tasks.evaluate import HUMANEVAL_STOP, complete
    from sweep.tasks.humaneval import problems

    events: list[progress.Event] = []
    with progress.listen(events.append):
        row = _bench(tmp_path, "gate=full")
    assert {e.phase for e in events if e.phase.startswith("humaneval")} == {"humaneval full depth"}
    assert row["completions"] == row["completions_full"] and row["accuracy_loss"] == 0.0
    # what it saves is a pass that decodes the same tokens: gate=full's engine against the plain one
    cfg = compose(f"model={MODEL}", *TASK, "gate=full")
    lm = load(f"model={MODEL}")
    gated, plain = Engine(lm, make_gate(cfg.gate, lm), cfg.bench.kv_policy), Engine(lm)
    for p in problems(3):
        assert complete(cfg, lm, gated, p["prompt"], HUMANEVAL_STOP, 0) == complete(
            cfg, lm, plain, p["prompt"], HUMANEVAL_STOP, 0
        )


def test_a_task_sweep_ends_with_its_accuracy_table_and_verdicts():
    import polars as pl

    from sweep.report.tasks import run_task_lines

    base = {"model": "m", "task": "humaneval", "task_metric": "pass@1", "accuracy_full": 0.6, "agreement": 0.9}
    ok = pl.DataFrame(
        [
            {**base, "trial_id": "a", "gate": "saturation", "speedup": 1.08, "accuracy": 0.58, "accuracy_lo": 0.45,
             "accuracy_hi": 0.7, "accuracy_loss": 0.02, "accuracy_loss_lo": 0.0, "accuracy_loss_hi": 0.05,
             "task_problems": 40, "task_layers_saved": 0.06, "layers_saved": 0.05},
            {**base, "trial_id": "b", "gate": "saturation", "speedup": 1.2, "accuracy": 0.3, "accuracy_lo": 0.18,
             "accuracy_hi": 0.43, "accuracy_loss": 0.3, "accuracy_loss_lo": 0.2, "accuracy_loss_hi": 0.4,
             "task_problems": 40, "task_layers_saved": 0.2, "layers_saved": 0.2},
        ]
    )  # fmt: skip
    stopped = {"gate": "saturation", "trial_id": "c", "task_problems": 25, "accuracy_loss_min": 0.55}
    text = " ".join(" ".join(run_task_lines(ok, [*ok.to_dicts(), stopped])).split())  # lines wrap at 120 columns
    assert "0.450" in text and "0.700" in text  # accuracy with its interval
    assert "within 5% loss: saturation" in text and "1.080x" in text  # a: 2% loss; b loses 30%
    assert "within 1% loss: full depth, 1.000x" in text
    assert "stopped: saturation c after 25 problems" in text and "+55.0%" in text
    assert "6.0% of the completions' layers skipped at <= 5% loss (a)" in text
    assert run_task_lines(pl.DataFrame(), [{"gate": "full", "trial_id": "x"}]) == []


@pytest.mark.ray
@pytest.mark.faults  # runs the model's programs in the sandbox
@pytest.mark.parametrize("reads", [("~search.constraints", "+search.constraints={accuracy: 0.5}"),
                                   ("~search.objectives", "+search.objectives={accuracy: max}")])  # fmt: skip
def test_an_optuna_study_is_told_that_a_stopped_task_row_failed(tmp_path, reads):
    """Every gated trial stops (a stored side that passes all 3 problems, a tiny model that passes none). Before: a
    constraint on accuracy raised TypeError in the searcher (float(None)), the trial stayed in the study as COMPLETE
    without constraints (feasible), and the stopped setting was re-timed as the best; an objective on accuracy left
    the study's trials RUNNING. A `sweep run` of its own, whose workers read this test's machine cache."""
    import optuna
    import torch

    from conftest import TINY_SWEEP
    from sweep.store import read
    from sweep.tasks import reference
    from sweep.tasks.completions import Side
    from sweep.tasks.evaluate import reference_key

    lm = load(f"model={MODEL}")
    cfg = compose(*TINY_SWEEP, *TASK)
    threads = torch.get_num_threads()
    for n in {1, threads}:  # the key holds the torch threads: a worker's and this process's
        torch.set_num_threads(n)
        reference.save(reference_key(cfg, lm), Side([1.0] * 3, [["x"]] * 3, [[[1]]] * 3, [4], {1: 1.0}, "pass@1"))
    torch.set_num_threads(threads)
    space = "search.spaces=[{gate: fixed, gate.exit_layer: 'int(interval(1, 3))'}]"
    args = [*TINY_SWEEP, *TASK, space, *reads, "search.max_accuracy_loss=0.5", "search.n_trials=2", "search.seed=0"]
    done = run_cli("run", "search=optuna-constrained", *args, f"results.root={tmp_path}")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    rows = read("trials", tmp_path)
    assert rows.height == 2 and rows["accuracy"].null_count() == 2, rows.select("accuracy", "task_reference")
    assert rows["accuracy_loss_min"].to_list() == pytest.approx([2 / 3] * 2)
    assert rows["repeats"].to_list() == [1, 1]  # none re-timed as a feasible best
    [db] = (tmp_path / "ray").glob("*/optuna.db")
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{db}")
    trials = optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{db}").trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL] * 2
    name = reads[1].split("{")[1].split(":")[0]
    for t in trials:
        assert t.user_attrs["error"] == (
            f"no {name} in its row: its task stopped once its accuracy loss was certain to be >= 0.667 "
            "(search.max_accuracy_loss)"
        )
        assert "constraints" not in t.system_attrs
    assert {t.user_attrs["trial_id"] for t in trials} == set(rows["trial_id"])


def _plant(side) -> None:
    """``side`` stored as tiny-llama's full-depth side of ``TASK`` (under the torch threads of a subprocess run with
    OMP_NUM_THREADS=1, as `make test` runs, and of this one)."""
    import torch

    from sweep.tasks import reference
    from sweep.tasks.evaluate import reference_key

    lm, cfg, threads = load(f"model={MODEL}"), compose(f"model={MODEL}", *BENCH, *TASK), torch.get_num_threads()
    for n in {1, threads}:
        torch.set_num_threads(n)
        reference.save(reference_key(cfg, lm), side)
    torch.set_num_threads(threads)


@pytest.mark.faults  # runs the model's programs in the sandbox
def test_a_stored_side_is_keyed_by_what_changes_its_scores_not_by_a_label(tmp_path):
    """Before: a side stored under one eval.timeout_s was read under another (a program that runs long passes under
    one limit and fails under another), and a model renamed (model.name, a label) measured its side again."""
    first, _ = _cli_row(tmp_path, "a")
    renamed, _ = _cli_row(tmp_path, "b", "model.name=another-name")
    assert first["task_reference"] == "fresh" and renamed["task_reference"] == "stored"
    assert renamed["task_scores_full"] == first["task_scores_full"] and len(_stored()) == 1
    limit, _ = _cli_row(tmp_path, "c", "eval.timeout_s=3")
    assert limit["task_reference"] == "fresh" and len(_stored()) == 2


@pytest.mark.faults  # runs the model's programs in the sandbox
@pytest.mark.parametrize(
    "scores, pass_at, why",
    [
        ([1.0, 1.0], {1: 1.0}, "2 problems' scores, the task has 3"),
        ([1.0, 0.0, 5.0], {1: 2.0}, "a field of the wrong type, length or range"),
        ([1.0, 0.0, 0.0], {1: 1.0}, "pass@1 1.0 is not its scores' mean 0.333"),
    ],
)
def test_a_stored_side_that_no_run_of_the_task_gives_is_measured_over(tmp_path, scores, pass_at, why):
    """Before: trusted (an accuracy of 1.5; a gated trial's row lost to "operands could not be broadcast")."""
    from sweep.tasks.completions import Side

    n = len(scores)
    _plant(Side(scores, [["x"]] * n, [[[1]]] * n, [4], pass_at, "pass@1"))
    row, err = _cli_row(tmp_path, "a", "gate=fixed", "gate.exit_layer=2")
    assert row["status"] == "ok" and row["task_reference"] == "fresh" and row["task_problems"] == 3, err
    assert "cannot be used (" + why in err and "measuring it again" in err
    assert all(0 <= s <= 1 for s in row["task_scores_full"])


def test_the_loss_bar_and_batches_are_refused_where_they_would_change_nothing():
    """Before: the bar stopped nothing; a batch size batched nothing and made another trial id."""
    from sweep.errors import ConfigError

    harness = ("eval.task=harness", "eval.harness_tasks=[gsm8k]")
    with pytest.raises(ConfigError, match=r"^search.max_accuracy_loss=0.1: stops eval.task=humaneval's gated side "):
        compose(*harness, "search.max_accuracy_loss=0.1")
    with pytest.raises(ConfigError, match=r"^eval.batch_size=4: batches eval.task=humaneval's completions only "):
        compose(*harness, "eval.batch_size=4")
    assert compose(*TASK, "eval.batch_size=4").eval.batch_size == 4


@pytest.mark.slow  # five interpreters hash a copy of the package (10 s)
def test_the_code_that_decodes_a_side_is_in_its_key(tmp_path):
    """A copy of the package with one decoder module changed hashes otherwise. Before: only sweep/tasks' modules
    (and not all of them) were hashed: a change to the engine kept the stored side."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import sweep

    def scorer(package: Path) -> str:
        code = "from sweep.tasks.reference import scorer_hash; print(scorer_hash())"
        env = {**os.environ, "PYTHONPATH": str(package.parent)}
        run = subprocess.run([sys.executable, "-c", code], env=env, cwd=package.parent, capture_output=True, text=True)
        return run.stdout.strip()

    copy = tmp_path / "sweep"
    shutil.copytree(Path(sweep.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    same = scorer(copy)
    assert same == scorer(Path(sweep.__file__).parent)  # the copy is the package
    for module in ("decode/engine.py", "tasks/_seccomp.py", "models/_adapter.py"):
        with open(copy / module, "a") as f:
            f.write("\n# changed\n")
        changed = scorer(copy)
        assert len(same) == 16 and changed != same, module
        same = changed


@pytest.mark.faults  # runs the model's programs in the sandbox
def test_sweep_analyze_says_the_accuracy_verdicts_and_names_a_stopped_setting(tmp_path):
    """Before: `sweep analyze` printed the agreement verdict alone, and said nothing of a setting stopped on its
    accuracy loss (its report: "0 stopped early", no task section)."""
    from sweep.tasks.completions import Side

    _plant(Side([1.0] * 3, [["x"]] * 3, [[[1]]] * 3, [4], {1: 1.0}, "pass@1"))
    row, err = _cli_row(tmp_path, "a", "gate=fixed", "gate.exit_layer=2", "search.max_accuracy_loss=0.5")
    assert row["accuracy_loss_min"] == pytest.approx(2 / 3), err
    done = run_cli("analyze", f"results.root={tmp_path / 'a'}")
    assert done.returncode == 0, done.stderr[-2000:]
    said = " ".join(done.stdout.split())
    assert "tiny-llama on humaneval (pass@1 1.000 at full depth): within 1% loss: full depth, 1.000x" in said
    report = " ".join((tmp_path / "a" / "report" / "report.md").read_text().split())
    assert "(and 1 ok whose task stopped on its accuracy loss: the task section names them)" in report
    assert f"stopped: fixed exit_layer=2 min_layer=1 {row['trial_id']} after 2 problems" in report


def test_a_stored_harness_side_of_a_metric_past_one_is_read_back():
    """A harness metric may be any number (BLEU 0-100, a difference below 0). Before: such a side was stored, then
    refused at every read and measured again ("a field of the wrong type, length or range")."""
    from sweep.tasks import reference
    from sweep.tasks.completions import Side

    side = Side([42.5, -3.0], [], [], [4, 4], {}, "bleu_max")
    reference.save("a harness key", side)
    assert reference.load("a harness key") == side
    reference.save("a pass@1 key", Side([1.0, 5.0], [], [], [4], {}, "pass@1"))
    assert reference.load("a pass@1 key") is None  # pass@1 stays a fraction
