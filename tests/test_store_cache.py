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
from test_store import PROV, profile_rows

ALWAYS, NEVER = 1, 10**9  # cache_from: cache every table / no table


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(path))
    return path


def write(root: Path, stem: str, model: str = "m", **values) -> Path:
    rows = profile_rows()
    rows.update({k: [v] * len(rows["layer"]) for k, v in values.items()})
    return write_table("profile", rows, root=root, provenance={**PROV, "model": model}, stem=stem)


def rows(root: Path, cache_from: int) -> pl.DataFrame:
    return scan("profile", root, cache_from=cache_from).collect().sort("run_id", "prompt_id", "position", "layer")


def cache_files(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.parquet")) if cache.exists() else []


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_cached_read_is_what_the_files_hold_through_every_change(tmp_path, cache):
    root = tmp_path / "results"
    for i in range(3):
        write(root, f"r{i}", model=f"m{i % 2}", run_id=f"run{i}")
    before = tree(root)
    first = rows(root, ALWAYS)
    assert first.equals(rows(root, NEVER)) and first.height == 12
    assert len(cache_files(cache)) == 1 and tree(root) == before  # the cache is outside the results root
    assert rows(root, ALWAYS).equals(first)  # from the cache

    write(root, "r3", run_id="run3")  # a new file
    write(root, "r0", model="m0", run_id="run0", delta=0.5)  # a rewritten file (a rerun)
    (root / "profile" / "model=m1" / "r1.parquet").unlink()  # a removed file
    after = rows(root, ALWAYS)
    assert after.equals(rows(root, NEVER))
    assert set(after["run_id"]) == {"run0", "run2", "run3"}
    assert after.filter(pl.col("run_id") == "run0")["delta"].to_list() == [0.5] * 4


def test_an_unchanged_file_is_read_from_the_cache_and_a_changed_one_again(tmp_path, cache):
    root, other = tmp_path / "results", tmp_path / "other"
    path = write(root, "r0", run_id="run0", delta=0.5)
    assert rows(root, ALWAYS)["delta"].to_list() == [0.5] * 4
    # the same file with other values, copied over it in place, keeping its size, mtime and inode: the
    # identity the cache keys on
    replacement = write(other, "r0", run_id="run0", delta=0.25).read_bytes()
    st = path.stat()
    assert len(replacement) == st.st_size
    with open(path, "r+b") as f:
        f.write(replacement)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert rows(root, NEVER)["delta"].to_list() == [0.25] * 4  # what the file holds now
    assert rows(root, ALWAYS)["delta"].to_list() == [0.5] * 4  # taken from the cache, not read again
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # now it changed: read again
    assert rows(root, ALWAYS)["delta"].to_list() == [0.25] * 4


def test_a_broken_or_foreign_cache_is_rebuilt(tmp_path, cache):
    root = tmp_path / "results"
    write(root, "r0", run_id="run0")
    truth = rows(root, NEVER)
    rows(root, ALWAYS)
    (path,) = cache_files(cache)
    path.write_bytes(b"not parquet")
    assert rows(root, ALWAYS).equals(truth)
    # a well-formed cache written for another schema, holding other rows: ignored
    truth.with_columns(run_id=pl.lit("planted")).write_parquet(path, metadata={"sweep.cache": "0:other"})
    assert rows(root, ALWAYS).equals(truth)
    assert rows(root, ALWAYS).equals(truth)


def test_an_unwritable_cache_directory_only_costs_the_cache(tmp_path, monkeypatch):
    root = tmp_path / "results"
    write(root, "r0", run_id="run0")
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(blocker))
    assert rows(root, ALWAYS).equals(rows(root, NEVER))


def test_bad_files_are_named_skipped_and_never_cached(tmp_path, cache, caplog):
    root = tmp_path / "results"
    write(root, "r0", run_id="run0")
    bad = root / "profile" / "model=m" / "junk.parquet"
    bad.write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        assert rows(root, ALWAYS).height == 4
    assert [r.getMessage() for r in caplog.records if "junk.parquet" in r.getMessage()]
    assert rows(root, ALWAYS).height == 4
    write(root, "junk", run_id="run1")  # the same name, now a good file: read
    assert set(rows(root, ALWAYS)["run_id"]) == {"run0", "run1"}
