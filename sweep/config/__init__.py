"""Configuration: Hydra composition of conf/ into validated, typed dataclasses."""

from sweep.config._compose import check_sweep_name, compose, compose_dict, config_dir, group_choices, validate
from sweep.config._fields import build
from sweep.config._schema import (
    AnalysisConfig,
    BenchConfig,
    CalibrateConfig,
    ClusterConfig,
    Config,
    EasConfig,
    GateConfig,
    ModelConfig,
    ProfileConfig,
    PromptsConfig,
    ResourcesConfig,
    ResultsConfig,
    SearchConfig,
    SweepConfig,
    TinyConfig,
)

__all__ = [
    "AnalysisConfig",
    "BenchConfig",
    "CalibrateConfig",
    "ClusterConfig",
    "Config",
    "EasConfig",
    "GateConfig",
    "ModelConfig",
    "ProfileConfig",
    "PromptsConfig",
    "ResourcesConfig",
    "ResultsConfig",
    "SearchConfig",
    "SweepConfig",
    "TinyConfig",
    "build",
    "check_sweep_name",
    "compose",
    "compose_dict",
    "config_dir",
    "group_choices",
    "validate",
]
