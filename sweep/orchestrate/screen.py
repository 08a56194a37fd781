"""`search=screen`: profile once, simulate a dense grid, run closed-loop trials only where
they decide something (the simulated Pareto front and the knee's neighbours).

The dense grid uses the search's own sub-spaces. Each point's config is composed once per
combination of its non-threshold values; the threshold is then set directly (validated
like any config value), so thousands of points cost milliseconds, not a Hydra compose each.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging

import polars as pl

from sweep.analysis import FULL_DEPTH_ID
from sweep.config import Config, GateConfig, compose
from sweep.config import build
from sweep.errors import ConfigError
from sweep.gates import GATE_COLUMNS, GATES
from sweep.config.search import as_override, spaces

log = logging.getLogger("sweep.orchestrate.screen")
BASELINE = FULL_DEPTH_ID  # the reference point (1x, agreement 1) on every simulated front, as on every measured one


def dense_settings(cfg: Config, base: list[str], merge) -> list[tuple[list[str], Config]]:
    """Every point of the search's sub-spaces as (trial overrides, composed config)."""
    out = []
    for i, params in enumerate(spaces(cfg.search)):
        gate_name = next((p.values[0] for p in params if p.key == "gate" and p.kind == "fixed"), None)
        if gate_name is None:
            raise ConfigError(f"search.spaces[{i}]: a screen sub-space names its gate (gate: saturation, ...)")
        threshold = GATES.get(gate_name, key=f"search.spaces[{i}].gate").threshold
        key = f"gate.{threshold}" if threshold else None
        swept = next((p for p in params if p.key == key), None)
        others = [p for p in params if p.key != key]
        for combo in itertools.product(*(p.grid_values() for p in others)):
            fixed = [as_override(p.key, v) for p, v in zip(others, combo)]
            corner = compose(merge(base, fixed))
            for value in swept.grid_values() if swept is not None else [None]:
                if swept is None:
                    out.append((fixed, corner))
                    continue
                overrides = [*fixed, as_override(key, value)]
                if threshold == "exit_layer":  # a layer index: composed, so min_depth drops as on the command line
                    out.append((overrides, compose(merge(base, overrides))))
                    continue
                gate = build(GateConfig, {**dataclasses.asdict(corner.gate), threshold: value}, "gate.")
                out.append((overrides, dataclasses.replace(corner, gate=gate)))
    return out


def select(table: pl.DataFrame, neighbours: int) -> pl.DataFrame:
    """Mark the settings to run closed-loop: the simulated front (speedup_model against
    agreement_tf, per model across gates) and the knee's ``neighbours`` on each side along
    its gate's threshold. Full-depth decoding (speedup 1, agreement 1) is always available,
    so it joins the front as a reference: settings predicted slower than it drop out."""
    from sweep.analysis import chord_knees, nondominated

    # settings that resolve to the same gate on this model (min_depth 0.1 and 0.2 of 4 layers...) are one
    table = table.with_columns(
        _first=pl.col("trial_id") == pl.col("trial_id").first().over("model", "gate", "min_layer", *GATE_COLUMNS)
    )
    sim = table.filter("_first").rename({"speedup_model": "_x", "agreement_tf": "_y"})
    baseline = sim.select("model").unique().with_columns(trial_id=pl.lit(BASELINE), _x=pl.lit(1.0), _y=pl.lit(1.0))
    front = nondominated(pl.concat([sim, baseline], how="diagonal_relaxed"), "_x", "_y", by=("model",))
    front = front.filter(pl.col("trial_id") != BASELINE)
    chosen = set(front["trial_id"].to_list())
    for knee in chord_knees(front, by=("model",), x="_x", y="_y").iter_rows(named=True):
        gate = GATES.get(knee["gate"], key="gate")
        if gate.threshold is None:
            continue
        line = sim.filter(
            (pl.col("model") == knee["model"])
            & (pl.col("gate") == knee["gate"])
            & (pl.col("min_layer") == knee["min_layer"])
            & pl.col("lens").eq_missing(knee["lens"])  # a tuned lens's thresholds are another line
        ).sort(gate.threshold)
        ids = line["trial_id"].to_list()
        at = ids.index(knee["trial_id"])
        chosen.update(ids[max(0, at - neighbours) : at + neighbours + 1])
    return table.with_columns(
        on_front=pl.col("trial_id").is_in(front["trial_id"].to_list()),
        selected=pl.col("trial_id").is_in(sorted(chosen)) & pl.col("_first"),
    ).drop("_first")
