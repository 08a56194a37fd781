"""The results store: schema enforced, atomic writes, tolerant reads, docs equal code."""

from __future__ import annotations

from datetime import datetime, timezone

import polars as pl
import pyarrow.parquet as pq
import pytest

from helpers.rows import PROV, profile_rows
from conftest import ROOT
from sweep.errors import SweepError
from sweep.store import PROVENANCE, SCHEMA_VERSION, TABLES, files, markdown, read, scan, write_table


def test_round_trip_with_schema_version_and_partition(tmp_path):
    path = write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1")
    assert path == tmp_path / "profile" / "model=m-1" / "r1.parquet"
    meta = pl.read_parquet_metadata(path)
    assert meta["sweep.schema_version"] == str(SCHEMA_VERSION) and meta["sweep.table"] == "profile"
    df = read("profile", tmp_path)
    assert df.height == 4 and df.columns == [c.name for c in TABLES["profile"].columns]
    assert df["schema_version"].unique().to_list() == [SCHEMA_VERSION]
    assert df.schema["created_at"] == pl.Datetime("us", "UTC")
    # a downstream user's plain polars read sees the same rows; the partition column is the directory name
    assert pl.read_parquet(tmp_path / "profile" / "**" / "*.parquet", hive_partitioning=False).height == 4
    assert "model" not in pq.read_schema(path).names and pl.read_parquet(tmp_path / "profile")["model"][0] == "m-1"


def test_a_linked_partition_is_not_read_and_is_named(tmp_path, caplog):
    """A partition directory that is a symbolic link was passed over in silence ("no trials there"): it is still
    not read (a link could lead anywhere), and a warning names it."""
    import logging

    elsewhere = tmp_path / "elsewhere"
    write_table("profile", profile_rows(), root=elsewhere, provenance=PROV, stem="r1")
    root = tmp_path / "root"
    (root / "profile").mkdir(parents=True)
    (root / "profile" / "model=m-1").symlink_to(elsewhere / "profile" / "model=m-1")
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        assert read("profile", root).height == 0
    assert any("symbolic link" in r.message and "model=m-1" in r.message for r in caplog.records), caplog.text


def test_a_linked_row_file_is_not_read_and_is_named(tmp_path, caplog):
    """A `.parquet` file that is a symbolic link was read like any file: a link planted in the results could put
    another sweep's rows (or any table's file elsewhere) into this one's analysis. Refused as a linked directory is,
    and named."""
    import logging

    elsewhere = tmp_path / "elsewhere"
    theirs = write_table("profile", profile_rows(), root=elsewhere, provenance=PROV, stem="r1")
    root = tmp_path / "root"
    mine = write_table("profile", profile_rows(), root=root, provenance=PROV, stem="r2")
    (mine.parent / "r3.parquet").symlink_to(theirs)
    with caplog.at_level(logging.WARNING, logger="sweep.store"):
        assert read("profile", root).height == 4 and files("profile", root) == [mine]
    assert any("symbolic link" in r.message and "r3.parquet" in r.message for r in caplog.records), caplog.text


def test_failure_mid_write_leaves_no_readable_file(tmp_path, monkeypatch):
    def half_write(table, where, **kwargs):
        with open(where, "wb") as f:
            f.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", half_write)
    with pytest.raises(OSError, match="disk full"):
        write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1")
    left = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert left == [], f"left behind: {left}"
    assert files("profile", tmp_path) == [] and read("profile", tmp_path).height == 0


def test_a_crashed_writers_temp_file_is_never_read(tmp_path):
    write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1")
    stray = tmp_path / "profile" / "model=m-1" / ".r2.0123.tmp"
    stray.write_bytes(b"PAR1 garbage")
    (tmp_path / "profile" / "model=m-1" / ".hidden.parquet").write_bytes(b"PAR1 garbage")
    assert read("profile", tmp_path).height == 4


def test_columns_must_match_the_schema(tmp_path):
    rows = profile_rows()
    del rows["delta"]
    with pytest.raises(SweepError, match=r"missing \['delta'\]"):
        write_table("profile", rows, root=tmp_path, provenance=PROV, stem="r1")
    rows = {**profile_rows(), "surprise": [1] * 4}
    with pytest.raises(SweepError, match=r"unknown \['surprise'\]"):
        write_table("profile", rows, root=tmp_path, provenance=PROV, stem="r1")
    with pytest.raises(SweepError, match="has nulls but is declared not nullable"):
        write_table("profile", profile_rows(), root=tmp_path, provenance={**PROV, "git_sha": None}, stem="r1")
    assert files("profile", tmp_path) == []


def test_older_files_without_newer_columns_still_load(tmp_path):
    write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="new")
    old = read("profile", tmp_path).drop("topk", "cos_logits").with_columns(run_id=pl.lit("old"))
    target = tmp_path / "profile" / "model=m-1" / "old.parquet"
    pq.write_table(old.to_arrow(), target)
    df = read("profile", tmp_path).sort("run_id", "position")
    assert df.height == 8
    old_rows = df.filter(pl.col("run_id") == "old")
    assert old_rows["topk"].null_count() == 4 and old_rows["cos_logits"].null_count() == 4
    assert df.filter(pl.col("run_id") == "r1")["topk"].to_list() == [10] * 4


def test_every_table_carries_provenance():
    names = {c.name for c in PROVENANCE}
    for table in TABLES.values():
        assert table.columns[0].name == "schema_version"
        if not table.single_file or table.name == "pareto":  # knees and targets point at trials by trial_id
            assert names <= {c.name for c in table.columns}
        else:
            assert "trial_id" in {c.name for c in table.columns}


def test_trials_store_their_key_beside_their_id():
    trials = [c.name for c in TABLES["trials"].columns]
    assert trials[trials.index("trial_id") + 1] == "trial_key" and SCHEMA_VERSION == 16
    assert "trial_key" not in {c.name for c in TABLES["simulated"].columns}


def test_schema_doc_equals_the_code():
    doc = (ROOT / "docs" / "schema.md").read_text()
    assert doc.strip() == markdown().strip(), "docs/schema.md is stale: run `sweep schema > docs/schema.md`"


def test_empty_root_reads_as_empty_frame_with_schema(tmp_path):
    df = scan("profile", tmp_path / "nothing").collect()
    assert df.height == 0 and "delta" in df.columns


def test_unknown_table_is_an_error(tmp_path):
    with pytest.raises(SweepError, match="unknown results table 'nope'"):
        read("nope", tmp_path)


def test_created_at_is_utc_now(tmp_path):
    write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1")
    ts = read("profile", tmp_path)["created_at"][0]
    assert abs((datetime.now(timezone.utc) - ts).total_seconds()) < 60


def test_a_numeric_model_name_stays_a_string(tmp_path):
    path = write_table("profile", profile_rows(), root=tmp_path, provenance={**PROV, "model": "123"}, stem="r1")
    assert path.parent.name == "model=123"
    df = read("profile", tmp_path)
    assert df.schema["model"] == pl.String() and df["model"].unique().to_list() == ["123"]


def test_schema_3_files_with_partition_columns_inside_still_load(tmp_path):
    """Before schema 4 the partition columns were also stored in the files (as large_string)."""
    write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="new")
    old = read("profile", tmp_path).with_columns(run_id=pl.lit("old"), schema_version=pl.lit(3, pl.Int32))
    target = tmp_path / "profile" / "model=m-1" / "old.parquet"
    old.write_parquet(target, metadata={"sweep.table": "profile", "sweep.schema_version": "3"})
    assert pq.read_schema(target).field("model").type == "large_string"
    df = read("profile", tmp_path)
    assert df.height == 8 and df["model"].unique().to_list() == ["m-1"]
    assert sorted(df["schema_version"].unique().to_list()) == [3, SCHEMA_VERSION]


def test_every_column_carries_its_unit_and_meaning_in_the_file(tmp_path):
    import json

    path = write_table("profile", profile_rows(), root=tmp_path, provenance=PROV, stem="r1")
    schema = pq.read_schema(path)
    for c in TABLES["profile"].file_columns:
        meta = schema.field(c.name).metadata
        assert meta[b"unit"].decode() == c.unit and meta[b"description"].decode() == c.meaning
    assert schema.field("margin").metadata[b"unit"] == b"logits"
    theta = {c.name: c for c in TABLES["trials"].columns}["theta"].field_metadata()
    units = {"margin": "logits", "softmax": "probability", "entropy": "nats", "classifier": "probability"}
    assert json.loads(theta["unit_by_gate"]) == units
    assert pl.read_parquet_metadata(path)["sweep.table"] == "profile"  # the file's key-value metadata too
