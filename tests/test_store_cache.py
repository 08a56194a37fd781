"""The reader's table cache (``sweep.store.scan`` from ``cache_from`` files on): what it returns is
what the files hold, through additions, rewrites and removals; it lives outside the results root;
a broken, foreign or unwritable cache is never trusted and never fatal."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import polars as pl
import pytest

from sweep.store import scan, write_table

ALWAYS, NEVER = 1, 10**9  # cache_from: cache every table / no table


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(path))
    return path


@pytest.fixture(scope="module")
def base_row() -> dict:
    """A complete trials row, as the driver writes one for a trial that failed."""
    from conftest import compose
    from sweep.bench.rows import failed_row
    from sweep.store.run_info import provenance_unloaded

    cfg = compose("model=tiny-llama")
    return {**provenance_unloaded(cfg, "run0"), **failed_row(cfg, 1, RuntimeError("no"))}


@pytest.fixture
def write(base_row):
    def write(root: Path, stem: str, gate: str = "full", **values) -> Path:
        row = {**base_row, "trial_id": stem, "gate": gate, **values}
        row.update(sweep_name=None, worker_pid=None, worker_model_loads=None, trial_seconds=None)
        return write_table("trials", {k: [v] for k, v in row.items()}, root=root, provenance={}, stem=stem)

    return write


def rows(root: Path, cache_from: int) -> pl.DataFrame:
    return scan("trials", root, cache_from=cache_from).collect().sort("trial_id")


def cache_files(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.parquet")) if cache.exists() else []


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_cached_read_is_what_the_files_hold_through_every_change(tmp_path, cache, write):
    root = tmp_path / "results"
    for i in range(3):
        write(root, f"r{i}", gate=("full", "fixed")[i % 2])
    before = tree(root)
    first = rows(root, ALWAYS)
    assert first.equals(rows(root, NEVER)) and first.height == 3
    assert len(cache_files(cache)) == 1 and tree(root) == before  # the cache is outside the results root
    assert rows(root, ALWAYS).equals(first)  # from the cache

    write(root, "r3")  # a new file
    write(root, "r0", error="rerun")  # a rewritten file (a rerun)
    (root / "trials" / "model=tiny-llama" / "gate=fixed" / "r1.parquet").unlink()  # a removed file
    after = rows(root, ALWAYS)
    assert after.equals(rows(root, NEVER))
    assert after["trial_id"].to_list() == ["r0", "r2", "r3"] and after["error"][0] == "rerun"


def test_an_unchanged_file_is_read_from_the_cache_and_a_changed_one_again(tmp_path, cache, write):
    root, other = tmp_path / "results", tmp_path / "other"
    path = write(root, "r0", error="first")
    assert rows(root, ALWAYS)["error"].to_list() == ["first"]
    # the same file with other values, copied over it in place, keeping its size, mtime and inode: the
    # identity the cache keys on
    replacement = write(other, "r0", error="other").read_bytes()
    st = path.stat()
    assert len(replacement) == st.st_size
    with open(path, "r+b") as f:
        f.write(replacement)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert rows(root, NEVER)["error"].to_list() == ["other"]  # what the file holds now
    assert rows(root, ALWAYS)["error"].to_list() == ["first"]  # taken from the cache, not read again
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # now it changed: read again
    assert rows(root, ALWAYS)["error"].to_list() == ["other"]


def test_a_broken_or_foreign_cache_is_rebuilt(tmp_path, cache, write):
    root = tmp_path / "results"
    write(root, "r0")
    truth = rows(root, NEVER)
    rows(root, ALWAYS)
    (path,) = cache_files(cache)
    path.write_bytes(b"not parquet")
    assert rows(root, ALWAYS).equals(truth)
    # a well-formed cache written for another schema, holding other rows: ignored
    truth.with_columns(run_id=pl.lit("planted")).write_parquet(path, metadata={"sweep.cache": "0:other"})
    assert rows(root, ALWAYS).equals(truth)
    assert rows(root, ALWAYS).equals(truth)


def test_an_unwritable_cache_directory_only_costs_the_cache(tmp_path, monkeypatch, write):
    root = tmp_path / "results"
    write(root, "r0")
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(blocker))
    assert rows(root, ALWAYS).equals(rows(root, NEVER))


def test_bad_files_are_named_skipped_and_never_cached(tmp_path, cache, caplog, write):
    root = tmp_path / "results"
    write(root, "r0")
    bad = root / "trials" / "model=tiny-llama" / "gate=full" / "junk.parquet"
    bad.write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        assert rows(root, ALWAYS).height == 1
    assert [r.getMessage() for r in caplog.records if "junk.parquet" in r.getMessage()]
    assert rows(root, ALWAYS).height == 1
    write(root, "junk")  # the same name, now a good file: read
    assert rows(root, ALWAYS)["trial_id"].to_list() == ["junk", "r0"]


def test_only_tables_of_many_small_files_are_cached(tmp_path, cache):
    from sweep.store import TABLES
    from helpers.rows import PROV, profile_rows

    assert [name for name, table in TABLES.items() if table.cached] == ["trials"]
    root = tmp_path / "results"
    write_table("profile", profile_rows(), root=root, provenance=PROV, stem="r0")
    assert scan("profile", root, cache_from=ALWAYS).collect().height == 4 and not cache_files(cache)


def test_a_full_cache_disk_only_costs_the_cache(tmp_path, monkeypatch, write):
    """polars says a full disk in its own error, not an OSError: the read went down with it ("unexpected
    ComputeError") where the cache should only have been skipped."""
    from conftest import full_disk

    root = tmp_path / "results"
    for i in range(3):
        write(root, f"r{i}")
    with full_disk(tmp_path / "cache", free=0):
        monkeypatch.setenv("SWEEP_CACHE_DIR", str(tmp_path / "cache"))
        assert rows(root, ALWAYS).equals(rows(root, NEVER))
