"""Output that fits 120 columns: tables (all-null columns dropped, cells whole) and prose wrapped between
words, in `sweep run`'s end, `sweep analyze`, `sweep profile` and the log lines."""

from __future__ import annotations

import logging
import re

import polars as pl
import pytest

from conftest import run_cli
from sweep.orchestrate.writer import SweepOutcome
from sweep.report.run_report import sweep_report
from sweep.textfit import WIDTH, WrappingFormatter, fit_lines, table, wrap

NULL_GATE_COLUMNS = ("exit_layer", "theta", "q", "k", "decay", "lens")


def _rows(n: int = 8) -> list[dict]:
    """Rows as a sweep of several models and gates reports them: long names, six gate columns all null."""
    models = ["smollm2-135m", "tiny-llama-with-a-long-name"]
    gates = ["saturation", "conformal"]
    rows = []
    for i in range(n):
        rows.append(
            {
                "model": models[i % 2],
                "gate": gates[(i // 2) % 2],
                "min_layer": 8 + 7 * (i % 2),
                "eps": 0.05 * (i + 1),
                **dict.fromkeys(NULL_GATE_COLUMNS),
                "kv_policy": "propagate",
                "mode": "early_exit",
                "status": "ok" if i % 3 else "nondeterministic",
                "agreement": 1.0 - 0.1 * i,
                "speedup_wall": 0.9 + 0.2 * i,
                "speedup_model": 0.95 + 0.15 * i,
                "speedup_e2e_wall": 0.9 + 0.1 * i,
                "exit_rate": 0.1 * i,
                "step_layers_saved": 0.05 * i,
                "trial_id": f"{i:016x}",
            }
        )
    return rows


def _words(text: str) -> list[str]:
    return text.split()


def _fit(text: str) -> bool:
    """Every line within WIDTH, but a path too long for any line (a label and one word: pytest's tmp_path)."""
    return all(len(line) <= WIDTH or (len(line.split()) <= 2 and "/" in line.split()[-1]) for line in text.splitlines())


def test_a_wide_table_fits_keeps_cells_whole_and_drops_null_columns():
    rows = _rows()
    df = pl.DataFrame(rows, infer_schema_length=None)
    lines = table(df, keys=("gate",))
    assert all(len(line) <= WIDTH for line in lines)
    text = "\n".join(lines)
    header = " ".join(lines[:3])
    assert not any(re.search(rf"\b{c}\b", header) for c in NULL_GATE_COLUMNS)
    for r in rows:  # every cell whole, on one line
        for value in (r["model"], r["trial_id"], r["status"], f"{r['speedup_e2e_wall']:.3f}"):
            assert any(value in line.split() for line in lines), value
    assert "smollm2-135m" in text and "tiny-llama-with-a-long-name" in text


def test_a_table_too_wide_even_so_continues_in_blocks_that_repeat_the_keys():
    df = pl.DataFrame(
        {"gate": ["margin", "saturation"], **{f"column_{i:02d}": [1.5 * i, 2.0 * i] for i in range(1, 15)}}
    )
    lines = table(df, keys=("gate",), width=80)
    assert all(len(line) <= 80 for line in lines)
    blocks = [b.splitlines() for b in "\n".join(lines).split("\n\n")]
    assert len(blocks) > 1
    for block in blocks:  # each: header (names over two lines), rule, the two rows under their key
        rule = next(i for i, line in enumerate(block) if set(line) <= {"-", " "})
        assert block[rule - 1].split()[0] == "gate" and [r.split()[0] for r in block[rule + 1 :]] == [
            "margin",
            "saturation",
        ]
    names = [line for block in blocks for line in block[:2]]
    assert sum(line.split().count("column_") for line in names) == 14  # each name once, split after its underscore


def test_columns_equal_in_every_row_are_said_once():
    df = pl.DataFrame({"model": ["m", "m"], "gate": ["margin", "fixed"], "theta": [1.0, None], "agreement": [1.0, 0.5]})
    lines = table(df, keys=("gate",))
    assert lines[0] == "every row: model=m" and "model" not in lines[1]
    assert table(df.head(1))[0].split() == ["model", "gate", "theta", "agreement"]  # one row: nothing to fold


def test_prose_wraps_between_words():
    text = "verdict: " + " ".join(f"word{i}" for i in range(60)) + " /a/very/long/path/" + "x" * 130
    lines = wrap(text)
    assert all(len(line) <= WIDTH for line in lines[:-1]) and lines[-1].strip().startswith("/a/very")
    assert _words(" ".join(lines)) == _words(text)  # nothing lost, no word broken
    block = fit_lines("short\n" + text)
    assert block.splitlines()[0] == "short" and _words(block) == ["short", *_words(text)]


def test_log_lines_wrap_with_their_prefix(caplog):
    record = logging.LogRecord("sweep.x", logging.INFO, __file__, 1, "a " * 100, None, None)
    out = WrappingFormatter("sweep: %(message)s").format(record).splitlines()
    assert out[0].startswith("sweep: a") and all(len(line) <= WIDTH for line in out)
    assert all(line.startswith(" " * 9 + "a") for line in out[1:])


def test_the_end_of_run_report_fits_120_columns():
    """`sweep run`'s end over a 20-column table: 6 of them all-null, long model names (was 200 wide)."""
    rows = _rows()
    outcome = SweepOutcome("saturation-grid-20260101T000000Z-abcdef", "/r/ray/s", "/r", 8, 0, 8, rows)
    text = sweep_report(outcome)  # no analysis: no verdict (the rows are not in a store)
    lines = text.splitlines()
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)
    assert "Pareto front" in text and not any(re.search(rf"\b{c}\b", text) for c in NULL_GATE_COLUMNS)
    assert sum("tiny-llama-with-a-long-name" in line for line in lines) >= 4  # whole, in its rows


@pytest.mark.slow
def test_profile_and_analyze_print_within_120_columns(tmp_path):
    profiled = run_cli("profile", "model=tiny-llama", "prompts.n=2", "profile.gen_tokens=4", f"results.root={tmp_path}")
    assert profiled.returncode == 0, profiled.stderr[-2000:]
    assert "oracle exit" in profiled.stdout and "EAS (alpha" in profiled.stdout
    assert _fit(profiled.stdout + profiled.stderr)
    bench = run_cli(
        "bench", "model=tiny-llama", "gate=margin", "gate.theta=1", "prompts.n=2", f"results.root={tmp_path}"
    )
    assert bench.returncode == 0, bench.stderr[-2000:]
    analyzed = run_cli("analyze", f"results.root={tmp_path}")
    assert analyzed.returncode == 0, analyzed.stderr[-2000:]
    out = analyzed.stdout.splitlines()
    assert any(line.startswith("tiny-llama: ") for line in out) and out[-1].startswith("report: ")
    assert _fit(analyzed.stdout + bench.stdout)


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_calibrate_prints_within_120_columns():
    res = run_cli(
        "calibrate",
        "model=tiny-llama",
        "gate=margin",
        "prompts.n=4",
        "bench.gen_tokens=4",
        "calibrate.grid='range(8, 0, step=-4)'",
        "calibrate.delta=0.5",  # (2 calibration prompts: at the defaults they certify nothing, refused before work)
        "calibrate.epsilon=0.5",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "calibration took" in res.stdout and "calibrate gate=margin on tiny-llama" in res.stdout
    assert _fit(res.stdout + res.stderr)
