"""benchmarks/skipset_shapes.py: the skip sets it times and its dry run on tiny shapes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import skipset_shapes  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "skipset_shapes.py"


@pytest.mark.parametrize("shape", skipset_shapes.SHAPES + skipset_shapes.DRY_SHAPES, ids=lambda s: s.name)
def test_each_timed_skip_set_has_its_ratio_half_attention_half_mlp(shape):
    L = shape.layers
    for ratio in skipset_shapes.RATIOS:
        skip = skipset_shapes.spread(L, ratio)
        assert len(skip) == round(ratio * 2 * L)  # no two picks of one sublayer
        assert abs(skip.ratio(L) - ratio) <= 1 / (2 * L)
        assert abs(len(skip.attention) - len(skip.mlp)) <= 1
        assert set(skip.attention) | set(skip.mlp) <= set(range(1, L + 1))


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_the_dry_run_prints_every_shape_and_ratio_with_consistent_ceilings(tmp_path):
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    for shape in skipset_shapes.DRY_SHAPES:
        block = res.stdout.split(f"## {shape.name}:")[1].split("\n## ")[0]
        step = float(re.search(r"full step ([\d.]+) ms", block).group(1))
        verify = {int(k): float(ms) for k, ms in re.findall(r"k=(\d) ([\d.]+) ms", block)}
        assert sorted(verify) == [1, 2, 3, 4, 5]
        rows = [line for line in block.splitlines() if re.match(r"\| 0\.\d\d \|", line)]
        assert len(rows) == len(skipset_shapes.RATIOS)
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            draft = float(cells[2])
            for n, cell in zip(skipset_shapes.DRAFT_LENS, cells[5:]):
                ceiling, break_even = (float(x) for x in cell.rstrip().replace("x", "").split(","))
                # recomputed from the printed step, draft and verification figures: each is rounded to 0.01 ms, so
                # the recomputation is an interval (tiny shapes' steps are a fraction of a millisecond), widened by
                # the printed ratios' own rounding
                low, high = break_even_bounds(n, draft, verify[n + 1], step, HALF_UNIT)
                assert low - HALF_UNIT <= break_even <= high + HALF_UNIT, (shape.name, n, break_even, low, high)
                assert (n + 1) / high - HALF_UNIT <= ceiling <= (n + 1) / low + HALF_UNIT


HALF_UNIT = 0.005  # half the last printed digit


def break_even_bounds(n: int, draft: float, verify: float, step: float, half: float) -> tuple[float, float]:
    """The range of (n draft + verify) / step over every set of true values that round to the printed ones."""
    low = (n * (draft - half) + (verify - half)) / (step + half)
    high = (n * (draft + half) + (verify + half)) / (step - half)
    return low, high


def test_the_bounds_contain_the_exact_ratio_and_shrink_with_the_rounding():
    # a closed case: step 0.5, draft 0.4, verify 0.9, n 2 -> (0.8 + 0.9) / 0.5 = 3.4
    low, high = break_even_bounds(2, 0.4, 0.9, 0.5, HALF_UNIT)
    assert low < 3.4 < high
    assert high - low > 0.1  # a fraction-of-a-millisecond step amplifies the rounding
    tight = break_even_bounds(2, 0.4, 0.9, 0.5, 0.0)
    assert tight == pytest.approx((3.4, 3.4))


def test_an_unknown_shape_is_one_line_and_exit_2():
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, str(SCRIPT), "--shapes", "nope"], capture_output=True, text=True, env=env)
    assert res.returncode == 2
    assert res.stdout.strip().splitlines() == [
        "error: --shapes: unknown nope (allowed: smollm2-135m-shape, gemma3-270m-shape, gemma3-1b-shape)"
    ]
