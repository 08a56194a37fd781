"""A shared results.root (issue 12): bad files are named and skipped, `analyze` writes only once
it has everything, orphaned temporary files are cleaned, every write stays inside the root,
and trial rows are never replaced by a concurrent writer."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest

from conftest import compose
from sweep.cli import main
from sweep.errors import ConfigError
from sweep.store import files, read, scan, write_table
from sweep.store import _guard as guard
from sweep.store._columns import Column, Table
from test_store import PROV, profile_rows

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
    from sweep.plan import done_rows

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


# ---------------------------------------------------------------- B. analyze writes only once it has everything


def test_a_failing_report_writes_nothing(root, monkeypatch):
    from sweep import report_figures
    from sweep.report import run_analyze

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
    from sweep.report import run_analyze

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
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
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
        live.kill()
        live.wait()


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
