"""The typed configuration every command receives, validated once at the boundary.

Field names follow conf/ one to one; conf/config.yaml and the group files hold the
defaults a user sees. Checks that need the loaded model (a layer index against L) live
with the code that has the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from sweep.config._fields import at_least, field, in_range
from sweep.families import FAMILIES

NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class TinyConfig:
    """Sizes of a seeded random model built from a config (tests, quick checks)."""

    layers: int = field(4, check=in_range(1, 64), allowed="an integer in 1..64")
    hidden: int = field(64, check=in_range(8, 1024), allowed="an integer in 8..1024")
    heads: int = field(4, check=at_least(1), allowed="an integer >= 1")
    kv_heads: int = field(2, check=at_least(1), allowed="an integer >= 1")
    head_dim: int = field(16, check=lambda v: v >= 2 and v % 2 == 0, allowed="an even integer >= 2")
    intermediate: int = field(128, check=at_least(1), allowed="an integer >= 1")
    init_std: float = field(0.2, check=lambda v: v > 0, allowed="a number > 0")


@dataclass(frozen=True)
class ModelConfig:
    """Where a model comes from. ``name`` labels every row written for it."""

    name: str | None = field(None, check=lambda v: bool(NAME_RE.match(v)), allowed="letters, digits, '.', '_' or '-'")
    source: Literal["packaged", "hf", "gguf", "tiny"] = "hf"
    path: str | None = None
    revision: str | None = None
    family: str | None = field(None, check=lambda v: v in FAMILIES, allowed="one of " + ", ".join(FAMILIES))
    package: str | None = None
    file: str | None = None
    tiny: TinyConfig | None = None


@dataclass(frozen=True)
class GateConfig:
    """An exit rule and its thresholds; parameters a gate does not use stay null."""

    name: str = "full"  # a registered gate (sweep.gates); checked with the gate's own parameters
    min_layer: int = field(1, check=at_least(1), allowed="an integer >= 1")
    exit_layer: int | None = field(None, check=at_least(1), allowed="an integer >= 1")
    eps: float | None = field(None, check=lambda v: v > 0, allowed="a number > 0")
    theta: float | None = field(None, check=lambda v: v >= 0, allowed="a number >= 0")
    q: float | None = field(None, check=in_range(0, 1, lo_open=True), allowed="a number in (0, 1]")


@dataclass(frozen=True)
class PromptsConfig:
    """Which prompts, how many, and whether they go through the chat template."""

    name: Literal["chat", "humaneval", "jsonl"] = "chat"
    path: str | None = None
    n: int | None = field(None, check=at_least(1), allowed="an integer >= 1 or null (all)")
    chat_template: bool = True
    max_tokens: int = field(512, check=at_least(1), allowed="an integer >= 1")


@dataclass(frozen=True)
class ProfileConfig:
    gen_tokens: int = field(32, check=in_range(1, 4096), allowed="an integer in 1..4096")
    topk: int = field(10, check=in_range(1, 1000), allowed="an integer in 1..1000")


@dataclass(frozen=True)
class BenchConfig:
    gen_tokens: int = field(32, check=in_range(2, 4096), allowed="an integer in 2..4096")
    warmup: int = field(1, check=in_range(0, 100), allowed="an integer in 0..100")
    repeats: int = field(3, check=in_range(1, 1000), allowed="an integer in 1..1000")
    kv_policy: Literal["propagate", "full"] = "propagate"
    cost_model: bool = False  # print the measured cost model


@dataclass(frozen=True)
class EasConfig:
    alpha: float = field(0.5, check=in_range(0, 1), allowed="a number in [0, 1]")


@dataclass(frozen=True)
class ResultsConfig:
    root: str = field("results", check=lambda v: v.strip() != "", allowed="a non-empty directory path")


@dataclass(frozen=True)
class Config:
    """The whole validated configuration of one command."""

    model: ModelConfig
    gate: GateConfig
    prompts: PromptsConfig
    seed: int = field(0, check=at_least(0), allowed="an integer >= 0")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    run_id: str | None = field(None, check=lambda v: bool(NAME_RE.match(v)), allowed="letters, digits, '.', '_' or '-'")
    profile: ProfileConfig = ProfileConfig()
    bench: BenchConfig = BenchConfig()
    eas: EasConfig = EasConfig()
    results: ResultsConfig = ResultsConfig()
