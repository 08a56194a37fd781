"""What every report section reads: the analysed tables and the settings (``ReportContext``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import polars as pl

from sweep.analysis import eas_table, layer_curve, lens_curves
from sweep.report.plotting import HEADLINE_TARGET


@dataclass(frozen=True)
class ReportContext:
    """What every section reads: the analysed tables (as written beside the data) and the settings."""

    root: Path  # results.root
    out: Path  # the report directory (figures are written there)
    trials: pl.DataFrame  # every trial row
    ok: pl.DataFrame  # ok trials, ranked speedup (with intervals)
    front: pl.DataFrame  # the pareto table
    knees: pl.DataFrame  # the knees table
    targets: pl.DataFrame  # the targets table
    profiles: pl.LazyFrame | None  # None without profile rows
    alpha: float  # eas.alpha
    min_prompts: int  # analysis.ci_min_prompts
    settings: pl.DataFrame = field(default_factory=pl.DataFrame)  # the best setting per target, full depth aside
    # per model whose headline pick's speedup interval reaches 1x: the fastest setting there whose interval is above
    sure: pl.DataFrame = field(default_factory=pl.DataFrame)
    floors: pl.DataFrame = field(default_factory=pl.DataFrame)  # the A/A noise floor per model (noise_floors)
    knee_min_agreement: float = 0.9  # analysis.knee_min_agreement
    # the verdicts' agreement target (``plotting.headline_target`` of analysis.targets)
    headline: float = HEADLINE_TARGET
    # per model whose front mixes rows that do not compare like with like, how (``environment.front_mixes``)
    mixes: tuple[str, ...] = ()

    @cached_property
    def curves(self) -> pl.DataFrame:
        return layer_curve(self.profiles)

    @cached_property
    def lens(self) -> pl.DataFrame:
        """The learned readouts' curves (``lens_curves``): empty unless a trace has readouts."""
        return lens_curves(self.profiles) if self.profiles is not None else pl.DataFrame()

    @cached_property
    def eas(self) -> pl.DataFrame:
        return eas_table(self.profiles, self.alpha)

    @cached_property
    def models(self) -> list[str]:
        """Models with a section: those with ok trials or a profile."""
        names = set(self.ok["model"].unique().to_list()) if self.ok.height else set()
        if self.profiles is not None:
            names |= set(self.curves["model"].unique().to_list())
        return sorted(names)
