"""Issue 13, downstream teams: every results table opens in pandas, pyarrow, DuckDB and polars with
their default calls and gives the same columns and values; every table in its own directory; units
in the files; knees join pareto and trials."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pyarrow.parquet as pq
import pytest

from conftest import sweep
from sweep.cli.commands import main
from sweep.store import TABLES, read

# how a row is told apart in each table (the readers return rows in their own order)
ROW_KEYS = {
    "trials": ["trial_id"],
    "profile": ["run_id", "prompt_id", "position", "layer"],
    "simulated": ["trial_id"],
    "pareto": ["front", "trial_id"],
    "knees": ["front", "model", "gate", "trial_id"],
    "targets": ["model", "target"],
}


@pytest.fixture(scope="module")
def results(ray_session, tmp_path_factory):
    """Every table, written by real commands on tiny-llama: a screen sweep (profile, simulated, trials),
    two more bench trials, then `sweep analyze` (pareto, knees, targets)."""
    root = tmp_path_factory.mktemp("downstream") / "results"
    sweep(root, "search=screen", "bench.gen_tokens=4", "search.neighbours=0")
    common = ["model=tiny-llama", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0"]
    for gate in (["gate=full"], ["gate=fixed", "gate.exit_layer=2"]):
        assert main(["bench", *common, f"results.root={root}", *gate]) == 0
    shutil.copy(next((root / "trials").rglob("*.parquet")), root / "pareto.parquet")  # as an old version left it
    assert main(["analyze", f"results.root={root}"]) == 0
    return root


def scalar(table: str) -> list[str]:
    """The table's columns that are not lists (compared value by value across readers)."""
    return [c.name for c in TABLES[table].columns if not isinstance(c.dtype, pl.List)]


def normalised(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    """One reader's rows in the declared types (categoricals and inferred types cast back), timestamps as
    microseconds since the epoch, sorted by the table's row key."""
    schema = TABLES[table].schema
    cols = []
    for name in scalar(table):
        col = pl.col(name)
        if isinstance(schema[name], pl.Datetime):
            cols.append(col.cast(pl.Datetime("us", "UTC")).dt.epoch("us").alias(name))
        else:
            cols.append(
                col.cast(pl.String).cast(schema[name]) if schema[name] == pl.String() else col.cast(schema[name])
            )
    return frame.select(cols).sort(ROW_KEYS[table], nulls_last=True)


def readers(path) -> dict[str, pl.DataFrame]:
    """Each reader's default call on one table directory, as polars frames."""
    import duckdb
    import pandas as pd
    import pyarrow.dataset as ds

    out = {
        "polars": pl.scan_parquet(path).collect(),
        "pyarrow": pl.from_arrow(ds.dataset(path, partitioning="hive").to_table()),
        "duckdb": duckdb.sql(f"SELECT * FROM read_parquet('{path}/**/*.parquet', hive_partitioning=true)").pl(),
    }
    frame = pd.read_parquet(path)
    out["pandas"] = pl.from_pandas(frame[[c for c in frame.columns if frame[c].dtype.name != "object"]])
    out["pandas_columns"] = pl.DataFrame({"name": list(frame.columns)})
    out["pandas_types"] = pl.DataFrame({"name": list(frame.columns), "type": [str(t) for t in frame.dtypes]})
    return out


@pytest.mark.parametrize("table", list(TABLES))
def test_every_reader_opens_every_table_with_its_defaults(results, table):
    path = results / table
    assert path.is_dir(), f"{table} is not in its own directory"
    ours = read(table, results)
    assert ours.height > 0 or table == "knees"
    expected = normalised(ours, table)
    declared = set(TABLES[table].schema)
    got = readers(path)
    pandas_types = dict(got.pop("pandas_types").iter_rows())
    assert set(got.pop("pandas_columns")["name"]) == declared
    for reader, frame in got.items():
        assert set(frame.columns) <= declared, reader
        if reader != "pandas":  # pandas' object columns (text, lists) are compared through the other readers
            assert set(frame.columns) == declared, reader
        assert frame.height == ours.height, reader
        if reader != "pandas":  # pandas' values: test_pandas_gives_the_same_values
            assert normalised(frame, table).equals(expected), reader
    for key in TABLES[table].partition_by:  # the partition columns: from the path, each reader its own type
        assert got["polars"].schema[key] == pl.String
        assert got["pyarrow"].schema[key] == pl.String
        assert got["duckdb"].schema[key] == pl.String
        assert pandas_types[key] == "category"


def test_pandas_gives_the_same_values(results):
    """pandas' text columns come back as objects; its frame, through pyarrow, equals the store's."""
    import pandas as pd
    import pyarrow as pa

    for table in TABLES:
        frame = pd.read_parquet(results / table)
        if not len(frame):
            continue
        arrow = pa.Table.from_pandas(frame, preserve_index=False)
        got = pl.from_arrow(arrow)
        assert normalised(got, table).equals(normalised(read(table, results), table)), table


def test_a_whole_folder_glob_reads_each_table_in_one_layout(results):
    """`results/<table>/...` without exception: a glob per table directory never meets another table's file."""
    import duckdb

    assert not (results / "pareto.parquet").exists()  # the old single file is removed by analyze
    for table in TABLES:
        files = sorted((results / table).rglob("*.parquet"))
        assert files and all(pq.read_metadata(f).metadata[b"sweep.table"] == table.encode() for f in files)
        n = duckdb.sql(f"SELECT count(*) FROM read_parquet('{results}/{table}/**/*.parquet', hive_partitioning=true)")
        assert n.fetchall()[0][0] == read(table, results).height
    assert {p.name for p in results.iterdir() if p.is_file()} == set()  # only directories at the root


def test_units_and_meanings_are_in_the_files(results):
    trial = next((results / "trials").rglob("*.parquet"))
    schema = pq.read_schema(trial)
    assert "model" not in schema.names and "gate" not in schema.names  # they are the directory names
    assert schema.field("speedup_wall").metadata[b"unit"] == b"ratio"
    assert b"baseline" in schema.field("speedup_wall").metadata[b"description"]
    theta = schema.field("theta").metadata
    units = {"margin": "logits", "softmax": "probability", "entropy": "nats", "classifier": "probability"}
    assert json.loads(theta[b"unit_by_gate"]) == units
    for table in TABLES:
        f = next((results / table).rglob("*.parquet"))
        fields = pq.read_schema(f)
        for c in TABLES[table].file_columns:
            assert fields.field(c.name).metadata[b"unit"] == c.unit.encode(), (table, c.name)


def test_knees_join_pareto_and_trials(results):
    from sweep.analysis import fronts, knees_table, ok_trials

    trials = read("trials", results)
    synthetic = pl.concat(  # a front of 5 per model and gate, so knees exist whatever the tiny model measured
        [
            trials.filter(pl.col("status") == "ok")
            .head(1)
            .with_columns(
                trial_id=pl.lit(f"s{i}"),
                gate=pl.lit(gate),
                speedup_wall=pl.lit(1.0 + 0.3 * i),
                agreement=pl.lit(1.0 - 0.1 * i * i),
                step_layers_saved=pl.lit(0.5),
                exit_rate=pl.lit(0.5),
                kv_policy=pl.lit("propagate"),  # skipped layers not run: a measured speedup ranks as measured
                noise_floor=pl.lit(0.01),  # whatever the tiny model's floor was under load
            )
            for gate in ("margin", "saturation")
            for i in range(5)
        ]
    ).with_columns(trial_id=pl.col("trial_id") + pl.col("gate"))
    for pareto, knees in (
        (read("pareto", results), read("knees", results)),
        (fronts(ok_trials(synthetic).collect()), knees_table(fronts(ok_trials(synthetic).collect()))),
    ):
        if not knees.height:
            continue
        # a front is named by (front, model, front_gate); full depth is a row of every front
        key = ["front", "model", "front_gate"]
        whole = knees.join(
            pareto, left_on=["knee_all_trial_id", *key], right_on=["trial_id", *key], how="inner", nulls_equal=True
        )
        assert whole.height == knees.height  # every unrestricted knee is one row of its front
        knees = knees.drop_nulls("trial_id")  # a front with too few points at analysis.knee_min_agreement has none
        joined = knees.join(pareto, on=["trial_id", *key], how="inner", suffix="_front", nulls_equal=True)
        assert joined.height == knees.height  # every knee is one row of its front
        assert (joined["gate"] == joined["gate_front"]).all()
        for col in ("min_layer", "eps", "theta", "exit_layer"):
            assert joined[col].dtype == joined[f"{col}_front"].dtype
            assert joined.select((pl.col(col) == pl.col(f"{col}_front")) | pl.col(col).is_null()).to_series().all()
    real = read("knees", results).drop_nulls("trial_id").filter(pl.col("trial_id") != "full-depth")
    if real.height:
        both = real.join(trials, on="trial_id", how="inner", suffix="_trial")
        assert both.height == real.height and (both["gate"] == both["gate_trial"]).all()
    synth_knees = knees_table(fronts(ok_trials(synthetic).collect()))
    assert set(zip(synth_knees["front"], synth_knees["front_gate"])) >= {
        ("model+gate", "margin"),
        ("model+gate", "saturation"),
    }


def test_a_numeric_model_name_reads_back_as_text_through_the_store(results, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(results / "trials", root / "trials")
    (root / "trials" / "model=tiny-llama").rename(root / "trials" / "model=123")
    df = read("trials", root)
    assert df.schema["model"] == pl.String and df["model"].unique().to_list() == ["123"]
    # the recipes docs/schema.md gives the other readers, naming every partition column of the table
    import duckdb
    import pandas as pd
    import pyarrow as pa
    import pyarrow.dataset as ds

    path = root / "trials"
    text = ds.partitioning(pa.schema([("model", pa.string()), ("gate", pa.string())]), flavor="hive")
    recipes = {
        "polars": pl.scan_parquet(path, hive_schema={"model": pl.String, "gate": pl.String}).collect(),
        "polars glob": pl.scan_parquet(f"{path}/**/*.parquet", hive_partitioning=True).collect(),
        "pyarrow": pl.from_arrow(ds.dataset(path, partitioning=text).to_table()),
        "pandas": pl.from_pandas(pd.read_parquet(path, partitioning=text)[["model", "gate", "trial_id"]]),
        "duckdb": duckdb.sql(
            f"SELECT * FROM read_parquet('{path}/**/*.parquet', hive_partitioning=true, "
            "hive_types={'model': 'VARCHAR', 'gate': 'VARCHAR'})"
        ).pl(),
    }
    for name, frame in recipes.items():
        assert frame.height == df.height and frame["gate"].null_count() == 0, name
        assert frame["model"].cast(pl.String).unique().to_list() == ["123"], name
    assert recipes["polars"].schema["model"] == pl.String and recipes["pyarrow"].schema["model"] == pl.String
