"""No work wasted (issue 46): what can fail is checked before the timed rounds, so a computed row is never lost to an
input that could have been checked first. Real files, real processes, tiny models.

- a cost-model cache entry whose figures are not a measurement's (zero, negative, a string, a list, NaN) is
  measured over with a warning, before the timed rounds, and the row lands;
- a harness task's data file that is missing is one line (rc 2) before any model loads;
- the paths a user names are read once (``~`` and variables expanded, resolved) and that is what every command
  checks and writes: ``~/R`` lands under $HOME, a root that is a symbolic link works in bench, run and analyze, a
  link planted at ``trials/kept`` is refused before the work;
- a setting stopped under one sweep's stopping rule is measured by a sweep under another; a kept row is replaced
  only under the rules of a row in place; a sweep's definition is written once its work starts;
- self-speculation needs no ``bench.kv_policy`` on state-space families.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from conftest import compose, load, run_cli
from helpers.contract import chat_prompts

pytestmark = pytest.mark.faults

BENCH = ("model=tiny-llama", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0")


# ------------------------------------------------------------------ 1. cost-model cache entries


@pytest.fixture(scope="module")
def measured_entry(tmp_path_factory):
    """A real cost-model cache entry of tiny-llama (measured once), its key, its model's depth and prompt length."""
    import os

    from sweep.bench.costs import cost_model
    from sweep.models import load_model

    cache = tmp_path_factory.mktemp("costs-cache")
    before = os.environ.get("SWEEP_CACHE_DIR")
    os.environ["SWEEP_CACHE_DIR"] = str(cache)
    try:
        cfg = compose("model=tiny-llama")
        lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
        prompt = chat_prompts(lm, 1)[0].input_ids
        cost_model(lm, prompt, kv_policies=["propagate"], verify_positions=2)
    finally:
        os.environ.pop("SWEEP_CACHE_DIR") if before is None else os.environ.update(SWEEP_CACHE_DIR=before)
    [path] = (cache / "costs").glob("*.json")
    data = json.loads(path.read_text())
    return data, lm.num_layers, len(prompt)


POSITIVE = ["layer_ms", "head_ms", "step_ms", "num_layers", "prompt_tokens"]
NON_NEGATIVE = ["kv_ms", "lens_probe_ms", "overhead_ms", "prefill_ms", "attn_ms"]


@pytest.mark.parametrize(
    ("field", "value"),
    [(f, v) for f in POSITIVE for v in (0, -1, "x", [1], math.nan, True)]
    + [(f, v) for f in NON_NEGATIVE for v in (-1, "x", [1], math.inf)]
    + [("verify_ms", v) for v in (0, [0], [-1.0], ["x"], {"a": 1})]
    + [("extra_probe_ms", v) for v in (0, [1], {"margin/lens": -1}, {"margin/lens": "x"})]
    + [("num_layers", 3), ("prompt_tokens", 1000)],  # another model's depth, another prompt's length
)
def test_a_cache_entry_with_a_figure_no_measurement_gives_is_measured_over(
    tmp_path, caplog, measured_entry, field, value
):
    from sweep.bench import costs_cache

    data, layers, tokens = measured_entry
    path = tmp_path / "entry.json"
    path.write_text(json.dumps({**data, "costs": {**data["costs"], field: value}}))
    with caplog.at_level(logging.WARNING, logger="sweep.bench.costs_cache"):
        assert costs_cache.load(path, data["key"], layers) is None
    [said] = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"cost model cache {path}: not used (") and field in said and "\n" not in said


def test_the_measured_entry_itself_is_taken(tmp_path, measured_entry):
    from sweep.bench import costs_cache

    data, layers, tokens = measured_entry
    path = tmp_path / "entry.json"
    path.write_text(json.dumps(data))
    costs = costs_cache.load(path, data["key"], layers)
    assert costs is not None and costs.layer_ms == data["costs"]["layer_ms"] and costs.prompt_tokens == tokens


@pytest.mark.parametrize("field, value", [("layer_ms", 0), ("kv_ms", "x"), ("verify_ms", [-1])])
def test_a_bench_on_a_planted_cache_entry_measures_it_over_and_keeps_its_row(tmp_path, field, value):
    """Without the check, each of these failed after the timed rounds (ZeroDivisionError, TypeError) and the row was
    lost; now the entry is measured over before them, said in one warning, and the bench ends ok with its row."""
    from sweep.store import read

    env = {"SWEEP_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    args = ["bench", *BENCH, "gate=saturation", "gate.eps=0.3", "gate.min_layer=1"]
    first = run_cli(*args, f"results.root={tmp_path / 'a'}", env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    [entry] = (tmp_path / "cache" / "costs").glob("*.json")
    data = json.loads(entry.read_text())
    data["costs"][field] = value
    entry.write_text(json.dumps(data))
    again = run_cli(*args, f"results.root={tmp_path / 'b'}", env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"cost model cache {entry}: not used ({field}" in again.stderr.replace("\n         ", " ")
    row = read("trials", tmp_path / "b").row(0, named=True)
    assert row["status"] == "ok" and row["cost_model_source"] == "fresh" and row["cost_layer_ms"] > 0


# ------------------------------------------------------------------ 2. a task's files


def _harness_task(where, data_file) -> None:
    (where / "tiny_missing.yaml").write_text(
        "task: tiny_missing\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data_file}\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\ndoc_to_target: label\ndoc_to_choice: choices\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n"
    )


SCRIPT = """
import json, sys
import sweep.models as models
from sweep.cli.commands import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loads": models.model_loads()}))
"""


def fresh_process(*args: str, env: dict | None = None) -> tuple[dict, list[str]]:
    """``sweep ARGS`` in a new interpreter: its exit code and models loaded, and its stderr's error lines."""
    import os
    import subprocess
    import sys

    full = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    full.pop("SWEEP_DEBUG", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=300, env=full)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    return seen, [line for line in out.stderr.splitlines() if line.startswith("error: ")]


def test_a_harness_task_whose_data_file_is_missing_is_refused_before_the_model_loads(tmp_path):
    """Before: "unexpected FileNotFoundError" after the timed rounds, the row lost."""
    pytest.importorskip("lm_eval")
    _harness_task(tmp_path, tmp_path / "missing.jsonl")
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    args = [*BENCH, "eval.task=harness", f"eval.harness_include={tmp_path}", "eval.harness_tasks=[tiny_missing]"]
    seen, errors = fresh_process("bench", *args, f"results.root={tmp_path / 'r'}", env=offline)
    assert seen == {"code": 2, "loads": 0}, errors
    [line] = errors
    assert line.startswith("error: eval.harness_tasks=['tiny_missing']: cannot load them (FileNotFoundError")
    assert str(tmp_path / "missing.jsonl") in line and not (tmp_path / "r").exists()
    done = run_cli("run", *args, "search.spaces=[{gate: full}]", f"results.root={tmp_path / 's'}", env=offline)
    assert done.returncode == 2 and "cannot load them (FileNotFoundError" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "s").exists()  # refused before Ray started: no sweep, no row


def test_more_problems_than_the_largest_harness_task_has_are_refused_before_the_model_loads(tmp_path, monkeypatch):
    """Before: eval.problems=4 on a task of 3 documents ran all 3 under the trial id of 4 (HumanEval's count was
    checked, a harness task's was not). Now one line naming the largest task and its count, before the load; a
    count within it passes the check."""
    pytest.importorskip("lm_eval")
    data = tmp_path / "three.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"Q{i}", "choices": ["a", "b"], "label": 0}) + "\n" for i in range(3))
    )
    _harness_task(tmp_path, data)
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    args = [*BENCH, "eval.task=harness", f"eval.harness_include={tmp_path}", "eval.harness_tasks=[tiny_missing]"]
    seen, errors = fresh_process("bench", *args, "eval.problems=4", f"results.root={tmp_path / 'r'}", env=offline)
    assert seen == {"code": 2, "loads": 0}, errors
    [line] = errors
    assert line == (
        "error: eval.problems=4: the largest of eval.harness_tasks, tiny_missing, has 3 documents; give at most 3 "
        "(a task with fewer runs all of its own), or null for all of them"
    )
    assert not (tmp_path / "r").exists()
    from sweep.tasks.evaluate import check_inputs

    for key, value in offline.items():
        monkeypatch.setenv(key, value)
    check_inputs(compose(*args, "eval.problems=3"))  # within the count: no error


# ------------------------------------------------------------------ 3. one path reader


def test_a_root_under_home_is_written_under_home(tmp_path):
    """``results.root='~/R'`` with HOME pointed at a temporary directory: before, the path check expanded ``~``
    and the store did not (empty ``./~/R/trials/...`` directories in the working directory, and the row lost)."""
    from sweep.store import read

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    done = run_cli("bench", *BENCH, "results.root='~/R'", cwd=work, env={"HOME": str(home), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"row: {home / 'R' / 'trials'}" in done.stdout and read("trials", home / "R").height == 1
    assert list(work.iterdir()) == []


def test_a_root_named_by_a_variable_is_read_once(tmp_path):
    from sweep.store import read

    env = {"SWEEP_TEST_ROOT": str(tmp_path / "v"), "OMP_NUM_THREADS": "1"}
    done = run_cli("bench", *BENCH, "results.root='${oc.env:SWEEP_TEST_ROOT}/R'", cwd=tmp_path, env=env)
    assert done.returncode == 0 and read("trials", tmp_path / "v" / "R").height == 1, done.stderr[-2000:]
    done = run_cli("bench", *BENCH, "results.root='$SWEEP_TEST_ROOT/S'", cwd=tmp_path, env=env)
    assert done.returncode == 0 and read("trials", tmp_path / "v" / "S").height == 1, done.stderr[-2000:]
    done = run_cli("bench", *BENCH, "results.root='$SWEEP_NOT_SET_46/S'", cwd=tmp_path)
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == "error: results.root=$SWEEP_NOT_SET_46/S: the environment variable SWEEP_NOT_SET_46 is not set"
    )


@pytest.mark.ray
def test_a_root_that_is_a_link_to_a_directory_works_in_bench_run_and_analyze(tmp_path, ray_session):
    """Before: bench refused it ("is not a directory ... planted") where run and analyze took it."""
    from conftest import sweep
    from sweep.store import read

    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    link = tmp_path / "link"
    done = run_cli("bench", *BENCH, "gate=saturation", "gate.eps=0.3", f"results.root={link}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"row: {real / 'trials'}" in done.stdout
    outcome = sweep(link, "search.spaces=[{gate: full}]")
    assert outcome.written == 1 and outcome.root == str(real)
    done = run_cli("analyze", f"results.root={link}", timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert read("trials", real).height == 2 and (real / "report" / "report.md").is_file()
    assert (tmp_path / "link").is_symlink()  # the user's link, left as it is


def test_a_link_planted_inside_the_root_stays_refused(tmp_path):
    root, elsewhere = tmp_path / "r", tmp_path / "elsewhere"
    (root / "trials").mkdir(parents=True)
    elsewhere.mkdir()
    (root / "trials" / "model=tiny-llama").symlink_to(elsewhere, target_is_directory=True)
    done = run_cli("bench", *BENCH, f"results.root={root}")
    assert done.returncode == 2 and f"{root / 'trials' / 'model=tiny-llama'} is a symbolic link" in done.stderr
    assert list(elsewhere.iterdir()) == []


def test_a_link_planted_at_trials_kept_is_refused_before_any_work(tmp_path):
    """Before: the bench did its work, then failed at the write ("refusing to write ... outside it") although its
    own path was free; now one line before the model loads."""
    root, elsewhere = tmp_path / "r", tmp_path / "elsewhere"
    (root / "trials").mkdir(parents=True)
    elsewhere.mkdir()
    (root / "trials" / "kept").symlink_to(elsewhere, target_is_directory=True)
    seen, errors = fresh_process("bench", *BENCH, f"results.root={root}")
    assert seen == {"code": 2, "loads": 0}, errors
    assert errors == [
        f"error: results.root: {root / 'trials' / 'kept'} is a symbolic link (planted where the kept trials rows of "
        "model=tiny-llama, gate=full are written); remove it or use another results.root"
    ]
    assert list(elsewhere.iterdir()) == [] and not list(root.rglob("*.parquet"))


def test_a_row_whose_own_path_is_free_lands_whatever_is_planted_at_the_kept_path(tmp_path):
    """The write itself: the kept path is looked at only when the row's own path fails (a link planted there after
    the check no longer stops a row that has its path)."""
    import polars as pl

    from sweep.bench.command import run_bench
    from sweep.store import table_path, write_or_keep

    first = pl.read_parquet(run_bench(compose(*BENCH, f"results.root={tmp_path / 'a'}"))[0]).to_dicts()[0]
    row = {k: [v] for k, v in (first | {"model": "tiny-llama", "gate": "full"}).items()}
    root, elsewhere = tmp_path / "r", tmp_path / "elsewhere"
    (root / "trials").mkdir(parents=True)
    elsewhere.mkdir()
    (root / "trials" / "kept").symlink_to(elsewhere, target_is_directory=True)
    path, failure = write_or_keep("trials", row, root=root, stem=first["trial_id"])
    assert failure is None and path == table_path("trials", root, {"model": "tiny-llama", "gate": "full"}, path.stem)
    assert path.is_file() and list(elsewhere.iterdir()) == []


# ------------------------------------------------------------------ 4. kept rows, done-ness, definitions


def _as_a_sweeps_kept_row(root, sweep_name: str):
    """Run a bench into ``root`` and move its row to the kept path, as a sweep whose own path failed had kept it."""
    import polars as pl

    from sweep.bench.command import run_bench
    from sweep.store import KEPT, table_path

    path = Path(run_bench(compose(*BENCH, f"results.root={root}"))[0])
    frame = pl.read_parquet(path).with_columns(sweep_name=pl.lit(sweep_name))
    kept = table_path("trials", root, {"model": "tiny-llama", "gate": "full"}, path.stem, KEPT)
    kept.parent.mkdir(parents=True)
    frame.write_parquet(kept)
    path.unlink()
    return kept, frame.to_dicts()[0] | {"model": "tiny-llama", "gate": "full"}


def test_a_bench_replaces_a_sweeps_kept_row_only_with_consent(tmp_path):
    """Before: the bench deleted the sweep's kept row silently and wrote its own, while the same row in its own path
    was refused without sweep.rerun=true."""
    import polars as pl

    root = tmp_path / "r"
    kept, _ = _as_a_sweeps_kept_row(root, "someone-elses-sweep")
    done = run_cli("bench", *BENCH, f"results.root={root}")
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"already has a row from sweep someone-elses-sweep ({kept})" in done.stderr
    assert pl.read_parquet(kept)["sweep_name"][0] == "someone-elses-sweep"  # untouched
    done = run_cli("bench", *BENCH, f"results.root={root}", "sweep.rerun=true")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not kept.exists() and len(list((root / "trials").rglob("*.parquet"))) == 1  # replaced, with consent


def test_a_sweep_counts_a_kept_row_as_it_counts_one_in_place(tmp_path):
    """The sweep's row writer: a finished row kept there is a finished row; it is neither written over nor
    doubled by a row in place."""
    import polars as pl

    from sweep.orchestrate.writer import RowWriter

    root = tmp_path / "r"
    kept, row = _as_a_sweeps_kept_row(root, "first-sweep")
    writer = RowWriter(str(root), 1, [], "run2", "second-sweep", "cpu", search=compose().search)
    assert writer.write({**row, "sweep_name": "second-sweep"}) is False and writer.existing == 1
    assert [p for p in (root / "trials").rglob("*.parquet")] == [kept]
    assert pl.read_parquet(kept)["sweep_name"][0] == "first-sweep"


@pytest.mark.ray
def test_a_setting_stopped_under_one_rule_is_measured_by_a_sweep_under_another(tmp_path, ray_session):
    """Sweep A stops a setting under search.min_agreement=0.99; sweep B on the same root, without early stopping,
    measures it (before: B skipped it as done, rc 0, and reported it "stopped below search.min_agreement", a bar B
    never set). A sweep under A's own rule counts A's stopped row as done."""
    import polars as pl

    from conftest import sweep
    from sweep.store import read

    space = "search.spaces=[{gate: fixed, gate.exit_layer: 1}]"  # exits at layer 1 of 4: agrees on almost nothing
    small = ["prompts.n=4", "bench.gen_tokens=8", space]
    rule = ["search.min_agreement=0.99", "search.rung_prompts=2"]
    a = sweep(tmp_path, *small, *rule, "sweep.name=a")
    [stopped] = read("trials", tmp_path).to_dicts()
    assert a.written == 1 and stopped["status"] == "stopped"
    assert (stopped["stop_min_agreement"], stopped["stop_rung_prompts"]) == (0.99, 2)
    same_rule = sweep(tmp_path, *small, *rule, "sweep.name=a2")
    assert same_rule.written == 0 and same_rule.skipped == 1
    b = sweep(tmp_path, *small, "sweep.name=b")
    assert b.written == 1 and [r["status"] for r in b.rows] == ["ok"]
    [measured] = read("trials", tmp_path).to_dicts()
    assert measured["trial_id"] == stopped["trial_id"] and measured["status"] == "ok"
    assert measured["n_prompts"] == 4 and measured["stop_min_agreement"] is None
    again = sweep(tmp_path, *small, *rule, "sweep.name=a3")  # an ok row is done under every rule
    assert again.written == 0 and read("trials", tmp_path).filter(pl.col("status") == "ok").height == 1


def test_a_run_refused_before_its_work_leaves_no_sweep_of_its_name(tmp_path):
    """No cluster answered: before, the definition file stayed behind and the corrected command was refused ("a
    sweep of that name exists")."""
    from sweep.orchestrate.plan import plan_sweep

    args = [*BENCH, "search.spaces=[{gate: full}]", f"results.root={tmp_path}", "sweep.name=s1"]
    done = run_cli("run", *args, "cluster=existing", "cluster.address=127.0.0.1:1", timeout=240)
    assert done.returncode != 0 and "nothing answers at 127.0.0.1:1" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "ray" / "s1").exists()
    plan = plan_sweep(compose(*args), args)  # the corrected command plans: no sweep of that name is in its way
    assert plan.name == "s1"


# ------------------------------------------------------------------ 6. modes choose their own defaults


@pytest.mark.parametrize("family", ["mamba", "mamba2", "jamba", "falcon-h1"])
def test_self_speculation_runs_state_space_families_on_the_defaults(tmp_path, family):
    """Before: refused, "bench.kv_policy=propagate: refused for model=tiny-mamba ... use bench.kv_policy=full"."""
    from sweep.store import read

    args = [f"model=tiny-{family}", "gate=fixed", "gate.exit_layer=1", "bench.mode=self_speculative", *BENCH[1:]]
    done = run_cli("bench", *args, f"results.root={tmp_path}")
    assert done.returncode == 0, done.stderr[-2000:]
    row = read("trials", tmp_path).row(0, named=True)
    assert row["status"] == "ok" and row["agreement"] == 1.0 and row["kv_policy"] == "full"


def test_early_exit_ignores_the_self_speculation_draft_len():
    """Before: bench.draft_len=2 on an early-exit trial (which drafts nothing) was another trial id: the same setting
    measured twice and counted twice."""
    from sweep.config.identity import trial_identity

    early = ["model=tiny-llama", "gate=saturation", "gate.eps=0.3"]
    ids = {trial_identity(compose(*early, f"bench.draft_len={n}"), "cpu").id for n in (2, 4, 8)}
    assert len(ids) == 1 and ids == {trial_identity(compose(*early), "cpu").id}
    spec = ["model=tiny-llama", "gate=fixed", "gate.exit_layer=1", "bench.mode=self_speculative"]
    assert len({trial_identity(compose(*spec, f"bench.draft_len={n}"), "cpu").id for n in (2, 4, 8)}) == 3


def test_self_speculation_ignores_the_early_exit_kv_policy():
    """One trial whatever bench.kv_policy says; early exit still reads it."""
    from sweep.config.identity import trial_identity

    spec = ["model=tiny-llama", "gate=fixed", "gate.exit_layer=1", "bench.mode=self_speculative"]
    ids = {trial_identity(compose(*spec, f"bench.kv_policy={kv}"), "cpu").id for kv in ("propagate", "full")}
    assert len(ids) == 1 and compose(*spec).bench.kv_policy == "full"
    early = ["model=tiny-llama", "gate=fixed", "gate.exit_layer=1"]
    assert compose(*early, "bench.kv_policy=propagate").bench.kv_policy == "propagate"


# ------------------------------------------------------------------ 7. a model's depth, before it loads


def _gguf(path: Path, layers: int, hidden: int) -> Path:
    """A GGUF file written by the format's own writer (the ``gguf`` package): a token list before the depth and the
    width, so a reader walks past an array of strings and one of floats to reach them; no usable weights."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(["a", "bb", "ccc"])
    writer.add_token_scores([0.0, 1.0, 2.0])
    writer.add_block_count(layers)
    writer.add_embedding_length(hidden)
    writer.add_tensor("token_embd.weight", np.zeros((3, hidden), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_headers_depth_and_width_are_what_its_writer_wrote(tmp_path):
    from sweep.models import Shape
    from sweep.models._shape import gguf_shape

    assert gguf_shape(_gguf(tmp_path / "a.gguf", 7, 48)) == Shape(7, 48)
    (tmp_path / "b.gguf").write_bytes((tmp_path / "a.gguf").read_bytes()[:60])  # ends inside the token list
    with pytest.raises(EOFError):
        gguf_shape(tmp_path / "b.gguf")
    (tmp_path / "c.gguf").write_bytes(b"GGML" + (tmp_path / "a.gguf").read_bytes()[4:])
    assert gguf_shape(tmp_path / "c.gguf") is None


@pytest.mark.parametrize(
    "model, gate, line",
    [
        (["model=tiny-llama"], ["gate=fixed", "gate.exit_layer=9"], "gate.exit_layer=9: must be in 1..4"),
        (["model=tiny-llama", "model.tiny.layers=6"], ["gate=margin", "gate.min_layer=7"], "gate.min_layer=7: must"),
        (["model=hf", "model.path=HF"], ["gate=pca", "gate.k=65"], "gate.k=65: must be an integer in 1..64"),
        (["model=gguf", "model.path=GGUF"], ["gate=fixed", "gate.exit_layer=8"], "gate.exit_layer=8: must be in 1..7"),
        (["model=hf", "model.path=HF"], ["gate=margin", "gate.min_layer=5"], "gate.min_layer=5: must be in 1..4"),
    ],
)
def test_a_layer_past_the_models_depth_is_refused_before_it_loads(tmp_path, model, gate, line):
    """Before: the model loaded first (SmolLM2: 16 s; a GGUF or HF directory without usable weights: refused for
    its weights instead), then the same line. The depth comes from a tiny model's config, a GGUF's header (written
    here by the format's own writer), an HF directory's config.json (written by transformers)."""
    from transformers import LlamaConfig

    hf = tmp_path / "hf"
    LlamaConfig(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4).save_pretrained(hf)
    where = {"GGUF": str(_gguf(tmp_path / "m.gguf", 7, 48)), "HF": str(hf)}
    model = [m.split("=")[0] + "=" + where.get(m.split("=")[1], m.split("=")[1]) for m in model]
    seen, errors = fresh_process("bench", *model, *gate, *BENCH[1:], f"results.root={tmp_path / 'r'}")
    assert seen == {"code": 2, "loads": 0}, errors
    [error] = errors
    assert error.startswith(f"error: {line}"), error
    assert not (tmp_path / "r").exists()


def test_a_sweep_with_a_setting_past_the_models_depth_is_refused_before_ray_starts(tmp_path):
    """Before: Ray started, the model loaded in a worker, and the setting became a failed row beside the others."""
    space = "search.spaces=[{gate: fixed, gate.exit_layer: 'choice(2, 9)'}]"
    done = run_cli("run", *BENCH, space, f"results.root={tmp_path}")
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: gate.exit_layer=9: must be in 1..4 (from gate.min_layer to L=4 for this model)"]
    assert "Ray" not in done.stderr and not any(tmp_path.iterdir())


def test_readouts_fitted_to_another_depth_are_refused_before_the_model_loads(tmp_path):
    """Before: the 6-layer model loaded, then its readouts were refused for the model's hash."""
    from sweep.models.prompts import read_prompts, tokenize_prompts
    from sweep.trace.readouts import fit_readouts, save_readouts

    lm = load("model=tiny-llama")
    pcfg = compose("prompts=chat", "prompts.n=2").prompts
    prompts = tokenize_prompts(read_prompts(pcfg), pcfg, lm.tokenizer)
    settings = dict(gen_tokens=4, ridge=1.0, l2=1e-3, seed=0, prompt_set="chat", prompt_start=0)
    path = save_readouts(fit_readouts(lm, prompts, **settings), tmp_path / "fit")
    six = [
        "model=tiny-llama",
        "model.tiny.layers=6",
        "prompts.n=1",
        "prompts.start=4",
        f"results.root={tmp_path / 'r'}",
    ]
    for command, key, args in (
        ("bench", "gate.readouts", ["gate=classifier", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0"]),
        ("profile", "profile.readouts", ["profile.gen_tokens=4"]),
    ):
        seen, errors = fresh_process(command, *six, *args, f"{key}={path}")
        assert seen == {"code": 2, "loads": 0}, errors
        assert errors == [f"error: {key}={path}: fitted to 4 layers x 64 hidden, the model has 6 x 64"]
        assert not (tmp_path / "r").exists()
