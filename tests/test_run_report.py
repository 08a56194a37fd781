"""The end of `sweep run` tells the whole story: every setting of the sweep (those measured now and those
whose rows exist), the verdict `sweep analyze` would give on them, and where to go next."""

from __future__ import annotations

from pathlib import Path

from conftest import ROOT, compose, sweep
from sweep.report.run_report import sweep_report
from sweep.store import read


def _report(outcome) -> str:
    return sweep_report(outcome, compose().analysis)


def test_a_second_run_shows_the_existing_rows_and_the_verdict(ray_session, tmp_path):
    first = sweep(tmp_path, "search=saturation-grid")
    ids = sorted(r["trial_id"] for r in first.rows)
    assert first.written == 8 and len(ids) == 8
    # two rows lost: the next run measures those two and shows all eight
    lost = sorted(Path(tmp_path, "trials").rglob("*.parquet"))[:2]
    for path in lost:
        path.unlink()
    again = sweep(tmp_path, "search=saturation-grid")
    assert (again.written, again.skipped) == (2, 6) and sorted(r["trial_id"] for r in again.rows) == ids
    # all there: nothing runs, and the end still shows every setting's row
    done = sweep(tmp_path, "search=saturation-grid")
    assert (done.written, done.skipped) == (0, 8) and sorted(r["trial_id"] for r in done.rows) == ids
    text = _report(done)
    assert "0 settings measured and written, 8 skipped" in text
    assert "settings (8; 8 with rows from an earlier run or another sweep):" in text
    lines = text.splitlines()
    start, end = (
        lines.index("settings (8; 8 with rows from an earlier run or another sweep):"),
        lines.index(next(line for line in lines if line.startswith("Pareto front"))),
    )
    assert sorted(line.split()[-1] for line in lines[start:end] if line.startswith("saturation ")) == ids
    assert f"next: `sweep analyze results.root={tmp_path}`" in text and "report.md" in text
    assert read("trials", tmp_path).height == 8


def test_the_verdict_is_the_one_sweep_analyze_gives(ray_session, tmp_path):
    """On a root holding only this sweep, the end-of-run verdict and `sweep analyze`'s (another path: the
    whole root, its targets table, its report) name the same setting with the same figures."""
    from sweep.report.build import run_analyze

    outcome = sweep(tmp_path, "search=margin-grid", "prompts.n=2")
    lines = _report(outcome).splitlines()
    at = lines.index(next(line for line in lines if line.startswith("verdict on this sweep's 6 settings")))
    end = next(i for i, line in enumerate(lines) if line.startswith("next: `sweep analyze"))
    ours = " ".join(line.strip() for line in lines[at + 1 : end])
    _, theirs = run_analyze(compose(f"results.root={tmp_path}"))
    assert len(theirs) == 1 and theirs[0].startswith("tiny-llama: ")
    assert ours.removesuffix(" (6 ok settings)") == theirs[0].removesuffix(" (6 ok trials)")


def test_the_readme_starts_with_what_the_main_job_shows_and_what_comes_next():
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:60])
    assert "sweep analyze" in head and "report.md" in head and "make run" in head
    assert "RUN_ARGS=" in head  # how to run a smaller main job


def test_the_end_names_the_fronts_knee_or_why_there_is_none():
    """The chord-method knee of each model's front among its points at agreement >= analysis.knee_min_agreement,
    as `sweep analyze` takes it; with fewer than three such points, why there is none."""
    import polars as pl

    from sweep.report.run_report import knee_lines

    def front(points):
        return pl.DataFrame(
            {
                "model": ["m"] * len(points),
                "gate": ["saturation"] * len(points),
                "min_layer": [8] * len(points),
                "eps": [0.1 * (i + 1) for i in range(len(points))],
                "speedup": [p[0] for p in points],
                "agreement": [p[1] for p in points],
                "trial_id": [f"t{i}" for i in range(len(points))],
            }
        )

    curve = front([(1.0, 1.0), (1.5, 0.99), (1.6, 0.95), (1.65, 0.92)])
    [line] = knee_lines(curve, 0.9)
    assert line.startswith("knee of m's front: saturation eps=0.2 min_layer=8, speedup 1.500x, agreement 0.990")
    none = " ".join(line.strip() for line in knee_lines(front([(1.0, 1.0), (2.9, 0.0)]), 0.9))
    assert none.startswith(
        "no knee on m's front: 1 point(s) at agreement >= 0.9 (full depth among them), a knee needs 3"
    )
    # a setting at agreement 1 ranked above 1x dominates full depth: the line said "full depth among them" whatever
    dominated = " ".join(line.strip() for line in knee_lines(front([(1.35, 1.0), (1.55, 0.5)]), 0.9))
    assert dominated.startswith(
        "no knee on m's front: 1 point(s) at agreement >= 0.9 (not full depth: a setting at agreement 1 ranks above "
        "1x), a knee needs 3"
    )


def test_without_a_knee_the_end_gives_the_replays_fastest_setting_at_the_bar():
    """A sweep that replayed its settings on a trace (a bracket, a screen) says, beside "no knee", the fastest the
    cost model predicts among those settings at the knee's agreement bar: whether any could have beaten full depth."""
    import polars as pl

    from sweep.report.run_report import knee_lines

    front = pl.DataFrame(
        {
            "model": ["m", "m"],
            "gate": ["full", "saturation"],
            "min_layer": [None, 8],
            "eps": [None, 0.5],
            "speedup": [1.0, 2.9],
            "agreement": [1.0, 0.0],
            "trial_id": ["f", "t"],
        }
    )
    simulated = pl.DataFrame(
        {
            "model": ["m"] * 4 + ["other"],
            "gate": ["saturation"] * 5,
            "min_layer": [8] * 5,
            "eps": [0.1, 0.15, 0.2, 0.5, 0.1],
            "agreement_tf": [1.0, 0.93, 0.85, 0.1, 1.0],
            "exit_rate": [0.01, 0.05, 0.2, 1.0, 0.5],
            "speedup_model": [1.004, 1.012, 1.09, 2.8, 3.0],
            "trial_id": ["a", "b", "c", "d", "e"],
        }
    )
    text = " ".join(line.strip() for line in knee_lines(front, 0.9, simulated))
    assert text.startswith("no knee on m's front")
    assert (
        "2 of the sweep's 4 settings keep agreement >= 0.9 (teacher-forced; a closed loop's errors cascade, so it "
        "usually keeps less); the fastest is saturation eps=0.15 min_layer=8: 1.012x by the cost model, exit "
        "rate 0.050" in text
    )
    none = " ".join(line.strip() for line in knee_lines(front, 0.99, simulated.with_columns(agreement_tf=0.5)))
    assert "none of the sweep's 4 settings keeps agreement >= 0.99 (teacher-forced)" in none
    # a setting written twice (the same gate under two texts) counts once
    twice = " ".join(line.strip() for line in knee_lines(front, 0.9, pl.concat([simulated, simulated.head(2)])))
    assert "2 of the sweep's 4 settings keep agreement >= 0.9" in twice
    # a table without the replay's columns (nothing replayed) adds nothing to the no-knee line
    plain = knee_lines(front, 0.9, simulated.drop("speedup_model", "agreement_tf"))
    assert plain == knee_lines(front, 0.9) and plain[0].startswith("no knee on m's front")
    assert "replayed" not in " ".join(plain)


def test_settings_that_differ_only_in_batch_size_are_told_apart():
    """A batching grid's settings differ only in bench.batch_size: the end's table has it as a column (said once above
    the table where every row shares it), and each setting's progress line names it."""
    from sweep.orchestrate.writer import SweepOutcome, describe

    def row(batch: int) -> dict:
        return {"model": "m", "gate": "fixed", "min_layer": 2, "exit_layer": 2, "kv_policy": "propagate",
                "mode": "early_exit", "batch_size": batch, "repeats": 1, "status": "ok", "agreement": 0.5,
                "speedup_wall": 1.0 + batch / 10, "noise_floor": 0.01, "speedup_aa": 1.0,
                "step_layers_saved": 0.5, "trial_id": f"t{batch}"}  # fmt: skip

    rows = [row(b) for b in (4, 1, 2)]
    text = sweep_report(SweepOutcome("s", "p", "r", 3, 0, written=3, rows=rows))
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("gate ") and "batch_size" in line)
    column = header.split().index("batch_size")
    table = lines[lines.index(header) + 2 : lines.index(header) + 5]
    assert [line.split()[column] for line in table] == ["1", "2", "4"]
    assert "batch_size" not in describe(row(1), cached=False) and " batch_size=4:" in describe(row(4), cached=False)
    two = [row(1), {**row(1), "exit_layer": 3, "trial_id": "t1b"}]
    every = next(
        line for line in sweep_report(SweepOutcome("s", "p", "r", 2, 0, rows=two)).splitlines() if "every" in line
    )
    assert "batch_size=1" in every  # one value: said once, with the columns every row shares


def test_a_constrained_search_is_also_judged_at_the_agreement_it_sought(ray_session, tmp_path, capsys):
    """`sweep run search=optuna-constrained search.constraints.agreement=0.5` sought settings at agreement >= 0.5 and
    ended with a verdict at 0.98 alone, the study's own bar unjudged. Its end now gives the verdict there too, the
    one `sweep analyze analysis.targets=[0.5]` gives on the same rows."""
    from conftest import TINY_SWEEP
    from sweep.cli.commands import main
    from sweep.report.build import run_analyze

    args = ["search=optuna-constrained", "search.n_trials=2", "search.constraints.agreement=0.5"]
    assert main(["run", *TINY_SWEEP, f"results.root={tmp_path}", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("and at the agreement this search sought"))
    end = next(i for i, line in enumerate(lines) if line.startswith("next: `sweep analyze"))
    assert "(search.constraints.agreement=0.5), on its settings as `sweep analyze" in " ".join(lines[at : at + 2])
    ours = " ".join(" ".join(lines[at + 1 : end]).split())
    _, theirs = run_analyze(compose(f"results.root={tmp_path}", "analysis.targets=[0.5]"))
    assert len(theirs) == 1 and "at agreement >= 0.5" in theirs[0]
    assert ours.endswith(" ".join(theirs[0].split()).removesuffix(" (2 ok trials)") + " (2 ok settings)")


def test_the_first_line_fits_120_columns_with_a_long_sweep_name():
    """An optuna-constrained sweep's name made its first line 121 characters (the docs promise 120)."""
    from sweep.orchestrate.writer import SweepOutcome
    from sweep.textfit import WIDTH

    name = "optuna-constrained-20261207T100842Z-595b48"
    text = sweep_report(SweepOutcome(name, "p", "r", 5, 0, written=5))
    assert all(len(line) <= WIDTH for line in text.splitlines()), text
    assert f"sweep {name}: 5 settings measured and written" in " ".join(text.split())


def test_the_rows_line_names_an_optuna_study_only_where_the_sweep_has_one(tmp_path):
    """A grid, a screen and a bracket printed "Tune state and Optuna study:" beside a directory with no study."""
    from sweep.orchestrate.writer import SweepOutcome

    def rows_line(path) -> str:
        text = " ".join(sweep_report(SweepOutcome("s", str(path), "r", 1, 0, written=1)).split())
        return text[text.index("rows: ") :]

    assert rows_line(tmp_path).endswith(f"Tune state: {tmp_path}")
    (tmp_path / "optuna.db").write_bytes(b"")
    assert rows_line(tmp_path).endswith(f"Tune state and Optuna study: {tmp_path}")


def test_the_summary_counts_one_setting_in_the_singular():
    """A sweep of one setting ended "1 settings measured and written"."""
    from sweep.orchestrate.writer import SweepOutcome

    def first(written: int) -> str:
        return " ".join(sweep_report(SweepOutcome("s", "p", "r", written, 0, written=written)).split())

    assert "s: 1 setting measured and written, 0 skipped" in first(1)
    assert "s: 2 settings measured and written" in first(2) and "s: 0 settings measured and written" in first(0)
