"""Configuration: Hydra composition of conf/ into validated, typed dataclasses."""

from sweep.config._compose import compose, compose_dict, config_dir, validate
from sweep.config._schema import (
    BenchConfig,
    Config,
    EasConfig,
    GateConfig,
    ModelConfig,
    ProfileConfig,
    PromptsConfig,
    ResultsConfig,
    TinyConfig,
)

__all__ = [
    "BenchConfig",
    "Config",
    "EasConfig",
    "GateConfig",
    "ModelConfig",
    "ProfileConfig",
    "PromptsConfig",
    "ResultsConfig",
    "TinyConfig",
    "compose",
    "compose_dict",
    "config_dir",
    "validate",
]
