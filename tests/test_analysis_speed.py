"""What keeps `sweep analyze` fast on 10,000 trials (benchmarks/analyze_10k.py measures it): its own
Kneedle finds exactly what kneed finds, intervals are bootstrapped for the rows the tables show, and
the command imports no model or scipy library."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import polars as pl
import pytest

from conftest import ROOT, compose
from sweep.analysis import FULL_DEPTH_ID, with_confidence
from sweep.analysis._kneedle import kneedle
from sweep.cli.commands import main
from sweep.store import read_file, write_table


def fronts(n: int, seed: int = 1):
    """Random point sets sorted by x: concave decreasing curves with noise, Pareto-like staircases,
    rounded ones full of ties and plateaus, and shapeless clouds."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        size = int(rng.integers(3, 60))
        x = np.sort(rng.uniform(1, 3, size))
        kind = i % 4
        if kind == 0:
            y = 1 - (x - 1) ** rng.uniform(1, 4) / 2 ** rng.uniform(1, 4) + rng.normal(0, 0.02, size)
        elif kind == 1:
            y = np.sort(rng.uniform(0, 1, size))[::-1]
        elif kind == 2:
            x, y = np.sort(np.round(x, 1)), np.round(np.sort(rng.uniform(0, 1, size))[::-1], 1)
        else:
            y = rng.uniform(0, 1, size)
        yield x.tolist(), y.tolist()


def test_kneedle_finds_the_knee_kneed_finds():
    from kneed import KneeLocator

    found = 0
    for xs, ys in fronts(2000):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # kneed warns when it finds no knee
            expected = KneeLocator(xs, ys, curve="concave", direction="decreasing").knee
        got = kneedle(xs, ys)
        assert got == (None if expected is None else float(expected)), (xs, ys)
        found += expected is not None
    assert found > 1500  # the sets mostly have a knee: the comparison is not all None against None


def test_kneedle_without_a_bend():
    assert kneedle([1.0, 2.0, 3.0], [0.5, 0.5, 0.5]) is None  # flat
    assert kneedle([2.0, 2.0, 2.0], [0.9, 0.5, 0.1]) is None  # one x


def bench_root(root, *gates):
    common = ["model=tiny-llama", "prompts.n=2", "bench.gen_tokens=5", "bench.repeats=2", "bench.warmup=0"]
    for gate in gates:
        assert main(["bench", *common, f"results.root={root}", *gate]) == 0


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("analyze")
    bench_root(
        path,
        ["gate=full"],
        ["gate=fixed", "gate.exit_layer=1"],
        ["gate=fixed", "gate.exit_layer=2"],
        ["gate=fixed", "gate.exit_layer=3"],
        ["gate=saturation", "gate.eps=0.9", "gate.min_layer=1"],
        ["gate=margin", "gate.theta=0.5", "gate.min_layer=2"],
    )
    # and a trial that is surely dominated: the saturation trial's row at half its speed and no agreement
    (source,) = (path / "trials" / "model=tiny-llama" / "gate=saturation").glob("*.parquet")
    row = read_file("trials", source).row(0, named=True)
    row.update(
        trial_id="dominated0000000",
        agreement=0.0,
        prompt_agreement=[0.0] * len(row["prompt_agreement"]),
        speedup_wall=row["speedup_wall"] / 2,
        round_ms=[[v * 2 for v in r] for r in row["round_ms"]],
    )
    write_table("trials", {k: [v] for k, v in row.items()}, root=path, provenance={}, stem=row["trial_id"])
    return path


def test_intervals_are_bootstrapped_for_the_rows_the_tables_show(root):
    from sweep.report.build import analyse

    ctx = analyse(compose(f"results.root={root}"))
    shown = set(ctx.front["trial_id"]) | set(ctx.targets["trial_id"].drop_nulls())
    assert (
        ctx.front["speedup_lo"].null_count() == 0 and ctx.targets.drop_nulls("trial_id")["speedup_lo"].null_count() == 0
    )
    off = ctx.ok.filter(~pl.col("trial_id").is_in(list(shown)))
    assert "dominated0000000" in off["trial_id"].to_list()
    assert off["speedup_lo"].null_count() == off.height  # nobody reads these: not bootstrapped
    # each shown interval is the one a bootstrap of every ok trial gives it (seeded per trial)
    everything = with_confidence(ctx.ok.drop("agreement_lo", "agreement_hi", "speedup_lo", "speedup_hi"))
    cols = ["trial_id", "agreement_lo", "agreement_hi", "speedup_lo", "speedup_hi"]
    for table in (ctx.front, ctx.targets.drop_nulls("trial_id")):
        reference = table.filter(pl.col("trial_id") == FULL_DEPTH_ID)  # 1.0-1.0: it is the definition of 1.0
        assert all(reference[c].eq(1.0).all() for c in cols[1:])
        got = table.filter(pl.col("trial_id") != FULL_DEPTH_ID).select(cols).unique("trial_id").sort("trial_id")
        assert got.equals(everything.select(cols).join(got.select("trial_id"), on="trial_id").sort("trial_id"))


def test_analyze_imports_no_model_or_scipy_library(root):
    """torch and transformers (about 2 s to import) and kneed's scipy.signal (about 2 s) stay out of `sweep analyze`;
    its figures are drawn on matplotlib's Agg canvas without pyplot (its import and its registry of open figures)."""
    heavy = ("torch", "transformers", "scipy", "kneed", "ray", "optuna", "matplotlib.pyplot")
    code = (
        "import sys\n"
        "from sweep.cli.commands import main\n"
        f"rc = main(['analyze', 'results.root={root}'])\n"
        "import polars as pl\n"
        "from sweep.analysis import kneedle_knee\n"  # a front of 12+ points takes the Kneedle cross-check
        "front = pl.DataFrame({'trial_id': [f't{i}' for i in range(15)], 'speedup': [1 + i / 10 for i in range(15)],"
        " 'agreement': [1 - (i / 14) ** 3 for i in range(15)]})\n"
        "assert kneedle_knee(front) is not None\n"
        f"print(rc, sorted(m for m in {heavy!r} if m in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "0 []"
