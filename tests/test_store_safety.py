"""A shared results.root (issue 12): bad files are named and skipped, `analyze` writes only once
it has everything, orphaned temporary files are cleaned, every write stays inside the root,
and trial rows are never replaced by a concurrent writer."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest

from conftest import TINY_SWEEP, compose
from sweep.cli.commands import main
from sweep.errors import ConfigError
from sweep.store import files, read, scan, write_table
from sweep.store import _guard as guard
from sweep.store._columns import Column, Table
from helpers.rows import PROV, profile_rows

# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def bench_root(tmp_path_factory):
    """Two real trials (tiny-llama, full and fixed gates), measured once for the module."""
    root = tmp_path_factory.mktemp("bench")
    for gate in (["gate=full"], ["gate=fixed", "gate.exit_layer=2"]):
        argv = ["bench", "model=tiny-llama", "prompts.n=2", "bench.gen_tokens=4", "bench.repeats=1"]
        assert main([*argv, "bench.warmup=0", f"results.root={root}", *gate]) == 0
    return root


@pytest.fixture
def root(bench_root, tmp_path):
    shutil.copytree(bench_root, tmp_path / "results")
    return tmp_path / "results"


@pytest.fixture(autouse=True)
def fresh_verdicts():
    guard._verdicts.clear()  # every test sees its own warnings
    yield
    guard._verdicts.clear()


def skipped(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sweep.store" and r.levelno == logging.WARNING]


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root (hidden ones too), with size and mtime."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


# ---------------------------------------------------------------- A. bad files are named and skipped


def test_a_garbage_file_is_named_once_and_skipped(tmp_path, caplog):
    write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1")
    bad = tmp_path / "profile" / "model=x" / "bad.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not parquet at all" * 100)
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        assert read("profile", tmp_path).height == 4
        assert scan("profile", tmp_path).collect().height == 4  # cached: not warned twice
    [line] = skipped(caplog)
    assert line.startswith(f"skipping {bad}: not a readable Parquet file (ComputeError: ")
    assert files("profile", tmp_path) == [tmp_path / "profile" / "model=m-1" / "r1.parquet"]
    assert bad in files("profile", tmp_path, checked=False)


def test_foreign_parquet_files_are_named_and_skipped(tmp_path, caplog):
    write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1")
    d = tmp_path / "profile" / "model=m-1"
    foreign = d / "foreign.parquet"
    pl.DataFrame({"a": [1, 2], "b": ["x", "y"]}).write_parquet(foreign)
    other = d / "other.parquet"  # a file this tool wrote for another table
    pl.DataFrame({"model": ["m-1"]}).write_parquet(other, metadata={"sweep.table": "trials"})
    typed = d / "typed.parquet"  # every column, one of another type
    read("profile", tmp_path).with_columns(pl.col("layer").cast(pl.String)).write_parquet(typed)
    ours = d / "cut.parquet"  # ours, version 3, without a required column
    read("profile", tmp_path).drop("delta").write_parquet(
        ours, metadata={"sweep.table": "profile", "sweep.schema_version": "3"}
    )
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        df = read("profile", tmp_path)
    assert df.height == 4 and df["run_id"].null_count() == 0
    assert sorted(skipped(caplog)) == sorted(
        [
            f"skipping {foreign}: lacks required column(s) schema_version, run_id, created_at of table 'profile'",
            f"skipping {other}: written for table 'trials', not 'profile'",
            f"skipping {typed}: column layer is String, table 'profile' declares Int32",
            f"skipping {ours}: lacks required column(s) delta of table 'profile'",
        ]
    )


def test_files_of_a_newer_schema_version_are_read_as_this_one_and_said_so(root, caplog):
    """A newer release bumps the version when a column's meaning or unit changes: its rows read here as this
    version's columns (one it added is left out), with one warning when the file is checked (once while it is
    unchanged). Before: silently."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sweep.store._columns import SCHEMA_VERSION

    newer = sorted((root / "trials").rglob("*.parquet"))[0]
    table = pq.read_table(newer)
    meta = {**table.schema.metadata, b"sweep.schema_version": str(SCHEMA_VERSION + 1).encode()}
    table = table.append_column("added_later", pa.array([1.0] * table.num_rows)).replace_schema_metadata(meta)
    pq.write_table(table, newer)
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        first, again = read("trials", root), read("trials", root)
    assert first.height == again.height == 2 and "added_later" not in first.columns
    [line] = skipped(caplog)
    assert line == (
        f"1 file(s) of table 'trials' (e.g. {newer}) were written under schema version {SCHEMA_VERSION + 1}, newer "
        f"than this release's {SCHEMA_VERSION}: read as version {SCHEMA_VERSION} (its columns only; see "
        "docs/schema.md); update sweep to read them as written"
    )


def test_required_columns_follow_the_schema_version():
    cols = (
        Column("schema_version", pl.Int32(), "", ""),
        Column("model", pl.String(), "", ""),
        Column("x", pl.Int32(), "", ""),
        Column("y", pl.Int32(), "", "", since=4),  # a non-nullable column version 4 added
        Column("z", pl.Int32(), "", "", nullable=True),
    )
    t = Table("t", ("model",), "", "", cols)
    # the partition column (model) is never required: it is the file's directory name
    assert guard.required_columns(t, 3) == ["schema_version", "x"]
    assert guard.required_columns(t, 1) == ["schema_version", "x"]
    assert guard.required_columns(t, None) == ["schema_version"]  # no metadata: what every version had
    assert guard.required_columns(Table("u", (), "", "", cols), None) == ["schema_version", "model"]


def test_a_file_outside_the_partition_layout_is_named_and_skipped(tmp_path, caplog):
    write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1")
    stray = tmp_path / "profile" / "stray.parquet"
    shutil.copy(tmp_path / "profile" / "model=m-1" / "r1.parquet", stray)
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        assert read("profile", tmp_path).height == 4
    assert skipped(caplog) == [
        f"skipping {stray}: not in the layout of table 'profile' (profile/model=<value>/<file>.parquet)"
    ]


def test_a_rewritten_older_file_with_our_metadata_still_loads(tmp_path, caplog):
    write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1")
    old = tmp_path / "profile" / "model=m-1" / "old.parquet"
    read("profile", tmp_path).drop("pca_k", "entropy").with_columns(run_id=pl.lit("old")).write_parquet(
        old, metadata={"sweep.table": "profile", "sweep.schema_version": "2"}
    )
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        assert read("profile", tmp_path).height == 8
    assert skipped(caplog) == []


def test_the_sweeps_done_rows_skip_a_garbage_file(root, caplog):
    from sweep.orchestrate.done import done_rows

    bad = root / "trials" / "model=x" / "bad.parquet"
    bad.parent.mkdir()
    bad.write_bytes(b"\0" * 64)
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        done = done_rows(compose(f"results.root={root}"))
    assert len(done) == 2
    assert [line.split(":")[0] for line in skipped(caplog)] == [f"skipping {bad}"]


def test_analyze_completes_past_a_garbage_and_a_foreign_file(root, capsys):
    bad = root / "trials" / "model=x" / "bad.parquet"
    bad.parent.mkdir()
    bad.write_bytes(b"garbage")
    foreign = root / "trials" / "model=tiny-llama" / "foreign.parquet"
    pl.DataFrame({"trial_id": ["zz"], "speedup_wall": [9.0]}).write_parquet(foreign)
    assert main(["analyze", f"results.root={root}"]) == 0
    assert read("pareto", root).height >= 1 and "zz" not in read("pareto", root)["trial_id"].to_list()
    assert (root / "report" / "report.md").is_file()


def test_a_trial_file_that_holds_no_row_is_named_by_analyze(root, caplog):
    """A trial's file cut to no row (its schema and sweep's metadata kept) read as no setting at all: `sweep analyze`
    left its setting out in silence. It is named in one warning, and the other trial is analysed."""
    import pyarrow.parquet as pq

    (cut, *_), kept = sorted((root / "trials").rglob("*.parquet")), read("trials", root).height
    pq.write_table(pq.read_table(cut).slice(0, 0), cut)
    assert pq.read_metadata(cut).num_rows == 0 and kept == 2
    with caplog.at_level(logging.WARNING):
        assert main(["analyze", f"results.root={root}"]) == 0
    said = [r.getMessage() for r in caplog.records if "hold no row" in r.getMessage()]
    assert (
        len(said) == 1 and said[0].startswith("1 file(s) of table 'trials' hold no row") and said[0].endswith(str(cut))
    )
    assert "1 trials" in (root / "report" / "report.md").read_text()
    caplog.clear()  # the same through the reader's cache (a root of CACHE_FROM files or more): named on each read
    for _ in range(2):
        assert scan("trials", root, cache_from=1).collect().height == 1
    said = [r.getMessage() for r in caplog.records if "hold no row" in r.getMessage()]
    assert len(said) == 2 and all(s.endswith(str(cut)) for s in said)


# ---------------------------------------------------------------- B. analyze writes only once it has everything


def test_a_failing_report_writes_nothing(root, monkeypatch):
    from sweep.report import figures as report_figures
    from sweep.report.build import run_analyze

    real = report_figures.pareto_figure

    def half_then_fail(ok, front, knees, model, out, **kw):
        real(ok, front, knees, model, out, **kw)  # one figure drawn, then the report fails
        raise RuntimeError("figure failed")

    before = snapshot(root)
    monkeypatch.setattr(report_figures, "pareto_figure", half_then_fail)
    with pytest.raises(RuntimeError, match="figure failed"):
        run_analyze(compose(f"results.root={root}"))
    assert snapshot(root) == before
    monkeypatch.undo()
    path, _ = run_analyze(compose(f"results.root={root}"))  # then a good run writes everything
    assert path == root / "report" / "report.md"
    assert {p.name for p in (root / "report").iterdir()} == {"report.md", "pareto_tiny-llama.png"}
    before = snapshot(root)
    monkeypatch.setattr(report_figures, "pareto_figure", half_then_fail)
    with pytest.raises(RuntimeError, match="figure failed"):
        run_analyze(compose(f"results.root={root}"))
    assert snapshot(root) == before  # the earlier outputs stay as they were


def test_an_orphaned_report_staging_directory_is_removed(root):
    from sweep.report.build import run_analyze

    old, fresh = root / ".report.0123456789ab.tmp", root / ".report.ba9876543210.tmp"
    for d in (old, fresh):
        d.mkdir()
        (d / "pareto_x.png").write_bytes(b"x")
    stamp = time.time() - guard.STALE_AFTER_S - 60
    os.utime(old, (stamp, stamp))
    run_analyze(compose(f"results.root={root}"))
    assert not old.exists() and fresh.exists()  # a fresh one may be another analyze's, still rendering
    assert not (root / "report" / "pareto_x.png").exists()


# ---------------------------------------------------------------- C. orphaned temporary files


CHILD = """
import json, os, sys, time
from sweep.store import write_table
def stuck(fd):
    print("writing", flush=True)
    time.sleep(120)
os.fsync = stuck  # the write stops after the temporary file is written, before its rename
rows, prov = json.loads(sys.argv[2]), json.loads(sys.argv[3])
write_table("profile", rows, root=sys.argv[1], provenance=prov, stem="killed")
"""


@pytest.mark.faults
def test_a_killed_writers_temporary_file_is_never_read_and_removed_by_the_next_writer(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), json.dumps(profile_rows()), json.dumps(PROV)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "writing"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    directory = tmp_path / "profile" / "model=m-1"
    [orphan] = list(directory.iterdir())
    assert orphan.stat().st_size > 1000
    assert files("profile", tmp_path) == [] and read("profile", tmp_path).height == 0
    write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="next")  # same host: pid is gone
    assert [p.name for p in directory.iterdir()] == ["next.parquet"]
    assert orphan.name.startswith(".killed~") and f"~{child.pid}~" in orphan.name  # its writer's host and pid


def test_which_temporary_files_are_stale(tmp_path):
    host = guard._host_token()
    # a live writer: it lives until its stdin closes (no signal needed to end it)
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        old = time.time() - guard.STALE_AFTER_S - 60
        planted = {
            f".r1~other-host.1~{os.getpid()}~0123456789ab.tmp": False,  # another host, fresh: may be writing
            f".r2~other-host.1~{os.getpid()}~0123456789ab.tmp": True,  # another host, old
            ".r3.0123456789ab.tmp": False,  # the earlier name, fresh
            ".r4.0123456789ab.tmp": True,  # the earlier name, old
            f".r5~{host}~{live.pid}~0123456789ab.tmp": False,  # this host, writer alive
            f".r6~{host}~{os.getpid()}~0123456789ab.tmp": False,  # this very process (another thread)
            ".notes.tmp": False,  # not ours
            ".r7.parquet": False,  # hidden, not a temporary file
        }
        for name, _ in planted.items():
            (tmp_path / name).write_bytes(b"x")
        for name in (".r2", ".r4", ".notes", ".r7.parquet"):
            for p in tmp_path.glob(f"{name}*"):
                os.utime(p, (old, old))
        assert sorted(p.name for p in guard.stale_temps(tmp_path)) == sorted(n for n, s in planted.items() if s)
        assert guard.remove_stale_temps(tmp_path) and not guard.stale_temps(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, s in planted.items() if not s)
    finally:
        live.stdin.close()
        live.wait(timeout=60)


# ---------------------------------------------------------------- D. every write stays inside the root


@pytest.mark.parametrize("stem", ["../x", ".hidden", "a/b", "", ".."])
def test_an_unsafe_stem_is_refused_and_nothing_written(tmp_path, stem):
    with pytest.raises(ConfigError, match="stem="):
        write_table("profile", profile_rows(), root=tmp_path / "root", provenance=PROV, stem=stem)
    assert not tmp_path.joinpath("root").exists() and not list(tmp_path.parent.glob("x*.parquet"))


def test_an_unsafe_partition_value_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"model='\.\./evil'"):
        write_table("profile", profile_rows(), root=tmp_path, provenance={**PROV, "model": "../evil"}, stem="r1")
    assert list(tmp_path.rglob("*")) == []


def test_a_symlink_out_of_the_root_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "root" / "profile").mkdir(parents=True)
    (tmp_path / "root" / "profile" / "model=m-1").symlink_to(outside)
    with pytest.raises(ConfigError, match="outside it"):
        write_table("profile", profile_rows(), root=tmp_path / "root", provenance=PROV, stem="r1")
    (tmp_path / "root2").mkdir()
    (tmp_path / "root2" / "profile").symlink_to(outside)  # the table directory itself
    with pytest.raises(ConfigError, match="outside it"):
        write_table("profile", profile_rows(), root=tmp_path / "root2", provenance=PROV, stem="r1")
    assert list(outside.iterdir()) == []


# ---------------------------------------------------------------- E. no-clobber writes


def test_an_exclusive_write_never_replaces(tmp_path):
    path = write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1", exclusive=True)
    with pytest.raises(FileExistsError):
        write_table(
            "profile", profile_rows(), root=tmp_path, provenance={**PROV, "run_id": "r2"}, stem="r1", exclusive=True
        )
    assert read("profile", tmp_path)["run_id"].unique().to_list() == ["r1"]
    assert [p.name for p in path.parent.iterdir()] == ["r1.parquet"]  # no temporary file left
    write_table("profile", profile_rows(), root=tmp_path, provenance={**PROV, "run_id": "r3"}, stem="r1")
    assert read("profile", tmp_path)["run_id"].unique().to_list() == ["r3"]  # a plain write replaces


def test_exactly_one_of_racing_exclusive_writers_wins(tmp_path):
    n = 8
    barrier = threading.Barrier(n)
    outcome: dict[str, str] = {}

    def writer(i: int) -> None:
        barrier.wait()
        try:
            write_table(
                "profile",
                profile_rows(),
                root=tmp_path,
                provenance={**PROV, "run_id": f"w{i}"},
                stem="r",
                exclusive=True,
            )
            outcome[f"w{i}"] = "won"
        except FileExistsError:
            outcome[f"w{i}"] = "refused"

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [w for w, o in outcome.items() if o == "won"]
    assert len(outcome) == n and len(winners) == 1
    assert read("profile", tmp_path)["run_id"].unique().to_list() == winners
    assert [p.name for p in (tmp_path / "profile" / "model=m-1").iterdir()] == ["r.parquet"]


# ---------------------------------------------------------------- F. planted files and links (issue 25)

SPACE = "search.spaces=[{gate: saturation, gate.min_layer: 2, gate.eps: 'choice(0.05,0.1)'}]"


@pytest.mark.parametrize("pid", ["99999999999999999999", "0", "4194304", "4194305", "1" + "0" * 200])
def test_a_temporary_name_with_an_impossible_pid_is_left_and_named_once(tmp_path, caplog, pid):
    directory = tmp_path / "profile" / "model=m-1"
    directory.mkdir(parents=True)
    planted = directory / f".x~{guard._host_token()}~{pid}~ab.tmp"
    planted.write_bytes(b"planted")
    guard._named.clear()
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        for stem in ("r1", "r2"):  # two writes into the directory: both go through, one warning
            write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem=stem)
    assert planted.read_bytes() == b"planted" and read("profile", tmp_path).height == 8
    assert [r.getMessage() for r in caplog.records] == [
        f"leaving {planted} alone: pid {pid[:30]} is not a process id (removed once it is older than 3600 s)"
    ]
    old = time.time() - guard.STALE_AFTER_S - 60
    os.utime(planted, (old, old))
    write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r3")
    assert not planted.exists()  # an old one goes, as any orphan


def test_a_sweep_writes_every_row_past_a_planted_temporary_name(ray_session, tmp_path):
    from conftest import sweep

    directory = tmp_path / "trials" / "model=tiny-llama" / "gate=saturation"
    directory.mkdir(parents=True)
    planted = directory / f".x~{guard._host_token()}~99999999999999999999~ab.tmp"
    planted.write_bytes(b"x")
    outcome = sweep(tmp_path, SPACE)
    assert outcome.written == 2 and read("trials", tmp_path).height == 2  # rows lost: 0
    assert planted.exists()


def _refused(capsys, argv) -> str:
    from sweep.models import model_loads

    loads = model_loads()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert model_loads() == loads, "a model loaded before the refusal"
    return line


def test_run_refuses_a_tune_storage_linked_out_of_the_root_before_any_work(tmp_path, capsys):
    root, elsewhere = tmp_path / "R", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "ray").symlink_to(elsewhere)
    line = _refused(capsys, ["run", *TINY_SWEEP, f"results.root={root}", SPACE])
    assert (
        line == f"error: results.root={root}: refusing to write {root}/ray, which resolves to {elsewhere}, outside it"
    )
    assert list(elsewhere.iterdir()) == [] and sorted(p.name for p in root.iterdir()) == ["ray"]


def test_fit_refuses_readouts_linked_out_of_the_root_before_the_model_loads(tmp_path, capsys):
    root, elsewhere = tmp_path / "R", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "readouts").symlink_to(elsewhere)
    fit = ["fit", "model=tiny-llama", "prompts.n=2", "fit.gen_tokens=4", f"results.root={root}"]
    line = _refused(capsys, fit)
    assert line.startswith(f"error: results.root={root}: refusing to write {root}/readouts/tiny-llama, which resolves")
    out = tmp_path / "out"
    out.mkdir()
    (out / "tiny-llama").symlink_to(elsewhere)  # fit.out given: its model directory linked elsewhere
    line = _refused(capsys, [*fit, f"fit.out={out}"])
    assert line.startswith(f"error: fit.out={out}: refusing to write {out}/tiny-llama, which resolves to {elsewhere}")
    assert list(elsewhere.iterdir()) == []


@pytest.fixture(scope="module")
def optuna_root(ray_session, tmp_path_factory):
    """An Optuna sweep of 4 tiny trials (its study in <root>/ray/<name>/optuna.db), run once for the module."""
    from conftest import sweep

    root = tmp_path_factory.mktemp("optuna")
    outcome = sweep(root, "search=optuna-mo", "search.n_trials=4", "search.seed=3")
    assert outcome.written == 4
    return root, outcome.name


def _resume(root: Path, name: str, capsys, *extra: str) -> tuple[int, str, str]:
    argv = ["run", *TINY_SWEEP, f"results.root={root}", "search=optuna-mo", "search.n_trials=4", "search.seed=3"]
    code = main([*argv, "resume=true", f"sweep.name={name}", *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def optuna_copy(optuna_root, tmp_path):
    root, name = optuna_root
    shutil.copytree(root, tmp_path / "r")
    return tmp_path / "r", name


def test_a_resume_refuses_links_planted_in_the_sweeps_tune_directory(optuna_copy, tmp_path, capsys):
    root, name = optuna_copy
    sweep_dir = root / "ray" / name
    victim = tmp_path / "victim.db"
    shutil.copy(sweep_dir / "optuna.db", victim)
    before = victim.stat().st_mtime_ns
    (sweep_dir / "optuna.db").unlink()
    (sweep_dir / "optuna.db").symlink_to(victim)
    code, _, err = _resume(root, name, capsys)
    assert code == 2, err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    escape = f"refusing to write {sweep_dir}/optuna.db, which resolves to {victim}, outside it"
    assert line == f"error: results.root={root}: {escape}"
    assert victim.stat().st_mtime_ns == before
    (sweep_dir / "optuna.db").unlink()
    shutil.copy(victim, sweep_dir / "optuna.db")
    (sweep_dir / "tuner.pkl").unlink()
    os.link(victim, sweep_dir / "tuner.pkl")  # a hard link: another name for a file elsewhere
    code, _, err = _resume(root, name, capsys)
    assert code == 2 and f"refusing to write {sweep_dir}/tuner.pkl, which has 2 hard links" in err, err
    assert victim.stat().st_mtime_ns == before


def test_a_truncated_study_is_named_in_one_line_with_the_way_out(optuna_copy, capsys):
    root, name = optuna_copy
    db = root / "ray" / name / "optuna.db"
    os.truncate(db, db.stat().st_size // 2)
    before = snapshot(root)
    code, _, err = _resume(root, name, capsys)
    assert code == 2 and "Traceback" not in err and "unexpected" not in err, err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {db}: the sweep's Optuna study cannot be read (")
    assert "move the file away and resume" in line
    assert {k: v for k, v in snapshot(root).items() if "/ray/" not in f"/{k}"} == {
        k: v for k, v in before.items() if "/ray/" not in f"/{k}"
    }  # no row written
    db.rename(db.with_name("optuna.db.broken"))  # the way out it names: a fresh study from the rows
    code, out, err = _resume(root, name, capsys)
    assert code == 0, err
    assert read("trials", root).height == 4  # the 4 trials' rows were taken from their rows: none lost, none new


def test_a_resume_never_counts_a_trial_done_without_its_row(optuna_copy, capsys):
    root, name = optuna_copy
    ids = set(read("trials", root)["trial_id"])
    lost = sorted(files("trials", root))[:2]
    for path in lost:  # two trials the study holds as complete, whose rows were never written
        path.unlink()
    code, out, err = _resume(root, name, capsys)
    assert code == 0, err
    assert re.search(r"2 settings measured and written, 2 skipped", out), (
        out
    )  # the study's own settings, run again, once each; the two whose rows exist skipped
    df = read("trials", root)
    assert df.height == 4 and set(df["trial_id"]) == ids  # rows lost: 0


def test_a_study_whose_values_table_was_dropped_resumes_from_the_rows(optuna_copy, capsys):
    import sqlite3

    root, name = optuna_copy
    ids = set(read("trials", root)["trial_id"])
    lost = sorted(files("trials", root))[:2]
    for path in lost:
        path.unlink()
    with sqlite3.connect(root / "ray" / name / "optuna.db") as db:
        db.execute("DROP TABLE trial_values")
    code, out, err = _resume(root, name, capsys)
    assert code == 0 and "Traceback" not in err and "unexpected" not in err, err
    assert re.search(r"2 settings measured and written", out), (
        out
    )  # the 2 trials whose rows were missing, not "all 4 done"
    assert read("trials", root).height == 4 and set(read("trials", root)["trial_id"]) == ids  # rows lost: 0


# ---------------------------------------------------------------- G. analyze: copies of a row, non-finite speedups


def test_analyze_counts_a_trial_once_however_many_copies_of_its_row(root, capsys, caplog):
    source = sorted(files("trials", root))[0]
    tid = source.stem
    for i in range(3):  # three copies of one trial's row, under other names and another partition
        copy = (
            source.parent / f"copy{i}.parquet"
            if i < 2
            else root / "trials" / "model=tiny-llama" / "gate=x" / "c.parquet"
        )
        copy.parent.mkdir(exist_ok=True)
        shutil.copy(source, copy)
    with caplog.at_level(logging.WARNING, logger="sweep.analysis"):
        assert main(["analyze", f"results.root={root}"]) == 0
    out = capsys.readouterr().out
    assert "(2 ok trials)" in out, out
    assert [r.getMessage() for r in caplog.records if r.name == "sweep.analysis"] == [
        f"1 trial ids have more than one row (copies of a trial's file): each counted once, its newest row kept: "
        f"{tid} (4 rows)"
    ]


@pytest.mark.parametrize("planted", [float("nan"), -5.0])
def test_analyze_leaves_out_a_non_finite_speedup_and_never_prints_nan(root, capsys, caplog, planted):
    for path in files("trials", root):
        df = pl.read_parquet(path)
        meta = pl.read_parquet_metadata(path)
        df.with_columns(speedup_wall=pl.lit(planted), speedup_e2e_wall=pl.lit(planted)).write_parquet(
            path, metadata=meta
        )
        break
    with caplog.at_level(logging.WARNING, logger="sweep.report.build"):
        assert main(["analyze", f"results.root={root}"]) == 0
    out = capsys.readouterr().out
    report = (root / "report" / "report.md").read_text()
    assert "nan" not in out.lower() and "nanx" not in report, out
    assert any("that is not a finite number; left out" in r.getMessage() for r in caplog.records)
    ok = [p for p in files("trials", root) if pl.read_parquet(p)["status"][0] == "ok"]
    assert f"({len(ok) - 1} ok trials)" in out, out  # the row left out is not counted among those judged
