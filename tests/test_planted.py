"""A shared root where someone planted things that are not regular files: FIFOs and directories where rows and claims
belong. No reader opens them (a FIFO would block it forever): `sweep analyze` skips them with a warning naming each,
a claim in their place is not waited on (the trial runs unclaimed, said so), and readouts refuse in one line. Real
FIFOs and directories, each command with a deadline only a hang reaches."""

from __future__ import annotations

import os
from pathlib import Path
import threading

import pytest

from conftest import compose, full_disk, run_cli
from sweep.config.identity import trial_identity

pytestmark = pytest.mark.faults

BENCH = ("model=tiny-llama", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0")


def test_analyze_skips_a_fifo_and_a_directory_planted_as_rows(tmp_path):
    from sweep.bench.command import run_bench

    root = tmp_path / "results"
    row = run_bench(compose(*BENCH, f"results.root={root}"))[1]
    where = root / "trials" / "model=tiny-llama" / "gate=full"
    os.mkfifo(where / "planted.parquet")
    (where / "dir.parquet").mkdir()
    done = run_cli("analyze", f"results.root={root}", timeout=120)
    assert done.returncode == 0, done.stderr
    for name in ("planted.parquet", "dir.parquet"):
        assert f"skipping {where / name}: not a regular file" in done.stderr.replace("\n         ", " ")
    assert "1 trials" in (root / "report" / "report.md").read_text() and row["status"] == "ok"


@pytest.mark.parametrize("plant", ["fifo", "directory"])
def test_a_claim_planted_as_a_fifo_or_directory_is_not_waited_on(tmp_path, plant):
    from sweep.orchestrate import claims

    path = claims.claim_path(tmp_path, "abcdef0123456789")
    path.parent.mkdir(parents=True)
    os.mkfifo(path) if plant == "fifo" else path.mkdir()
    outcomes = []

    def claim():
        with claims.hold(tmp_path, "abcdef0123456789", claims.Owner.here("r1", "s1"), lambda: None) as held:
            outcomes.append(held)

    worker = threading.Thread(target=claim, daemon=True)
    worker.start()
    worker.join(timeout=60)  # a deadline only a hang reaches
    assert not worker.is_alive(), "the claim waited on a planted path"
    (held,) = outcomes
    assert held.row is None and any("runs unclaimed" in n and "not a regular file" in n for n in held.notes)
    assert path.exists()  # what was planted is left where it is


def test_a_file_planted_where_a_partition_belongs_is_refused_before_any_work(tmp_path):
    root = tmp_path / "results"
    (root / "trials" / "model=tiny-llama").mkdir(parents=True)
    planted = root / "trials" / "model=tiny-llama" / "gate=saturation"
    planted.write_text("not a directory")
    for command in ("bench", "run"):
        done = run_cli(command, *BENCH, "gate=saturation", "gate.eps=0.3", f"results.root={root}", "--quiet")
        assert done.returncode == 2, (command, done.stderr)
        assert f"results.root: {planted} is not a directory" in done.stderr, (command, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1
    assert planted.read_text() == "not a directory" and not list(root.rglob("*.parquet"))


def test_a_directory_planted_as_any_settings_row_file_is_refused_before_any_work(tmp_path):
    """Each foreseeable setting's own row file is checked, not only the first of its model and gate: a directory
    planted as the second margin setting's file was found once the sweep had run (naming a temporary file)."""
    from sweep.orchestrate.plan import foresee_settings

    root = tmp_path / "results"
    args = [*BENCH, "search.spaces=[{gate: margin, gate.theta: 'choice(1, 2)'}]", f"results.root={root}"]
    second = trial_identity(foresee_settings(compose(*args), args)[1][1], "cpu").id
    planted = root / "trials" / "model=tiny-llama" / "gate=margin" / f"{second}.parquet"
    planted.mkdir(parents=True)
    done = run_cli("run", *args, "--quiet")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert str(planted) in done.stderr and not list(root.rglob("*.parquet"))[1:]


def test_a_row_its_partition_cannot_take_is_kept_where_analyze_reads_it(tmp_path):
    from sweep.store import read

    root = tmp_path / "results"
    own = root / "trials" / "model=tiny-llama" / "gate=saturation"
    with full_disk(own):  # a directory, so the check before the work passes; full when the row is written
        done = run_cli("bench", *BENCH, "gate=saturation", "gate.eps=0.3", f"results.root={root}", "--quiet")
    assert done.returncode != 0, done.stderr
    assert "unexpected" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    [kept] = (root / "trials" / "kept").rglob("*.parquet")
    assert kept.parent == root / "trials" / "kept" / "model=tiny-llama" / "gate=saturation"
    assert f"to {own}" in line and "no space left on device" in line and f"kept it at {kept}" in line, line
    rows = read("trials", root)
    assert rows.height == 1 and rows["trial_id"][0] == kept.stem and rows["gate"][0] == "saturation"
    done = run_cli("analyze", f"results.root={root}", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "1 trials" in (root / "report" / "report.md").read_text()


def test_a_kept_row_written_again_in_place_leaves_no_twin(tmp_path):
    from sweep.store import KEPT, read, table_path, write_or_keep

    row = {k: [v] for k, v in _row(tmp_path).items()}
    values = {"model": row["model"][0], "gate": row["gate"][0]}
    tid = row["trial_id"][0]
    own = table_path("trials", tmp_path / "r", values, tid)
    own.parent.parent.mkdir(parents=True)
    own.parent.write_text("planted")  # a file where the gate's directory belongs
    path, failure = write_or_keep("trials", row, root=tmp_path / "r", stem=tid)
    assert path == table_path("trials", tmp_path / "r", values, tid, KEPT) and isinstance(failure, OSError)
    assert read("trials", tmp_path / "r")["trial_id"].to_list() == [tid]
    own.parent.unlink()  # the plant removed: the row written again lands in place, and its kept twin goes
    assert write_or_keep("trials", row, root=tmp_path / "r", stem=tid) == (own, None)
    assert not path.exists() and read("trials", tmp_path / "r")["trial_id"].to_list() == [tid]


def _row(tmp_path) -> dict:
    import polars as pl

    from sweep.bench.command import run_bench

    path = run_bench(compose(*BENCH, f"results.root={tmp_path / 'first'}"))[0]
    return pl.read_parquet(path).to_dicts()[0] | {"model": "tiny-llama", "gate": "full"}


def test_a_sweeps_row_is_replaced_by_a_bench_only_with_consent(tmp_path):
    import polars as pl

    from sweep.bench.command import run_bench

    root = tmp_path / "results"
    path = run_bench(compose(*BENCH, f"results.root={root}"))[0]
    frame = pl.read_parquet(path).with_columns(sweep_name=pl.lit("someone-elses-sweep"))
    frame.write_parquet(path)  # as a sweep had written it
    done = run_cli("bench", *BENCH, f"results.root={root}")
    assert done.returncode == 2 and "already has a row from sweep someone-elses-sweep" in done.stderr
    assert "sweep.rerun=true replaces it" in done.stderr
    assert pl.read_parquet(path)["sweep_name"][0] == "someone-elses-sweep"  # untouched
    done = run_cli("bench", *BENCH, f"results.root={root}", "sweep.rerun=true")
    assert done.returncode == 0, done.stderr
    assert pl.read_parquet(path)["sweep_name"][0] is None  # replaced, with consent


def test_analyze_on_a_full_disk_is_one_line_naming_the_path(small_disk):
    from sweep.bench.command import run_bench

    root, filler = small_disk
    filler.unlink()  # room for the rows
    results = root / "results"
    for eps in (0.3, 0.6):
        run_bench(compose(*BENCH, "gate=saturation", f"gate.eps={eps}", f"results.root={results}"))
    try:
        with open(filler, "wb") as f:  # the disk full again
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:
        pass
    done = run_cli("analyze", f"results.root={results}", timeout=240)
    assert done.returncode == 1, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "cannot write the report:" in line and str(results) in line and "no space left on device" in line
    assert "unexpected" not in done.stderr and "Traceback" not in done.stderr


def test_a_fifo_planted_as_the_optuna_study_is_refused_in_one_line(tmp_path):
    from sweep.errors import ConfigError
    from sweep.orchestrate.searches.study import optuna_storage_url, remaining_trials

    os.mkfifo(tmp_path / "optuna.db")
    with pytest.raises(ConfigError, match=r"optuna.db: not a regular file \(planted in place of the sweep's Optuna"):
        optuna_storage_url(tmp_path)
    with pytest.raises(ConfigError, match="not a regular file"):
        remaining_trials(compose("search=optuna-mo").search, tmp_path, rows=set())


def test_a_row_that_is_not_its_files_trial_is_measured_again_and_left_out_of_the_analysis(tmp_path, caplog):
    """A row's trial_id rewritten (its file still the trial's), and a row copied into another gate's directory with
    its figures changed: a resume counted the first as done and never measured the trial; the analysis ranked the copy
    as a saturation setting at 7x. Now each is named in a warning, measured again, and left out."""
    import logging

    import polars as pl

    from sweep.bench.command import run_bench
    from sweep.orchestrate.done import finished_row_of
    from sweep.orchestrate.plan import plan_sweep

    root = tmp_path / "results"
    full = Path(run_bench(compose(*BENCH, f"results.root={root}"))[0])
    fixed = Path(run_bench(compose(*BENCH, "gate=fixed", "gate.exit_layer=2", f"results.root={root}"))[0])
    pl.read_parquet(full).with_columns(trial_id=pl.lit("c" * 16)).write_parquet(full)
    copy = root / "trials" / "model=tiny-llama" / "gate=saturation" / fixed.name
    copy.parent.mkdir()
    pl.read_parquet(fixed).with_columns(speedup_wall=pl.lit(7.0)).write_parquet(copy)
    space = "search.spaces=[{gate: full}, {gate: fixed, gate.exit_layer: 2}]"
    args = [*BENCH, space, f"results.root={root}"]
    with caplog.at_level(logging.WARNING):
        plan = plan_sweep(compose(*args), args)
    ids = [t.id for t in (trial_identity(c, "cpu") for _, c in plan.grid_trials)]
    assert set(plan.done) == {fixed.stem} and full.stem in ids  # the edited row's trial is measured again
    said = " ".join(caplog.text.split())
    assert "2 trial row(s) under" in said and f"{'c' * 16} (in model=tiny-llama/gate=full)" in said
    assert f"{fixed.stem} (in model=tiny-llama/gate=saturation)" in said
    assert finished_row_of(root, "tiny-llama", "full", full.stem) is None  # a worker's own check: not done
    assert finished_row_of(root, "tiny-llama", "fixed", fixed.stem)["trial_id"] == fixed.stem
    done = run_cli("analyze", f"results.root={root}", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "7.000x" not in done.stdout and "2 ok trials" in " ".join(done.stdout.split())  # the copy never counts


def test_a_row_left_out_is_named_once_however_often_the_sweep_reads_its_root(tmp_path, caplog):
    """An Optuna sweep reads its root's rows in its plan, its study and its end: the same row left out was named in
    two warnings of one `sweep run`. Each row is named once per root; a row found broken later is named then."""
    import logging

    import polars as pl

    from sweep.bench.command import run_bench
    from sweep.store import scan, trusted_rows

    root = tmp_path / "results"
    full = Path(run_bench(compose(*BENCH, f"results.root={root}"))[0])
    fixed = Path(run_bench(compose(*BENCH, "gate=fixed", "gate.exit_layer=2", f"results.root={root}"))[0])
    pl.read_parquet(full).with_columns(trial_id=pl.lit("c" * 16)).write_parquet(full)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert trusted_rows(scan("trials", root).collect(), root)["trial_id"].to_list() == [fixed.stem]
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(said) == 1 and "1 trial row(s)" in said[0] and "c" * 16 in said[0], said
    caplog.clear()
    pl.read_parquet(fixed).with_columns(trial_id=pl.lit("d" * 16)).write_parquet(fixed)
    with caplog.at_level(logging.WARNING):
        assert trusted_rows(scan("trials", root).collect(), str(root)).height == 0
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(said) == 1 and "1 more trial row(s)" in said[0] and "left out (2 in all)" in said[0], said
    assert "d" * 16 in said[0] and "c" * 16 not in said[0], said
