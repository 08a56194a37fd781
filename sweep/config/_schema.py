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
# the gate parameters results carry as columns (min_layer aside), in display order
GATE_COLUMNS = ("exit_layer", "eps", "theta", "q", "k", "decay")


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
    # the same as a fraction of depth (min_layer = ceil(min_depth * L)), for sweeps over models of any depth
    min_depth: float | None = field(None, check=in_range(0, 1, lo_open=True), allowed="a number in (0, 1] or null")
    exit_layer: int | None = field(None, check=at_least(1), allowed="an integer >= 1")
    eps: float | None = field(None, check=lambda v: v > 0, allowed="a number > 0")
    theta: float | None = field(None, check=lambda v: v >= 0, allowed="a number >= 0")
    q: float | None = field(None, check=in_range(0, 1, lo_open=True), allowed="a number in (0, 1]")
    k: int | None = field(None, check=in_range(1, 65536), allowed="an integer >= 1")  # pca: principal directions
    decay: float | None = field(None, check=lambda v: v >= 0, allowed="a number >= 0 or null")  # CALM's tau (softmax, cosine)


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
    pca_k: int = field(64, check=in_range(1, 65536), allowed="an integer >= 1")  # the pca signal's directions


@dataclass(frozen=True)
class BenchConfig:
    gen_tokens: int = field(32, check=in_range(2, 4096), allowed="an integer in 2..4096")
    warmup: int = field(1, check=in_range(0, 100), allowed="an integer in 0..100")
    repeats: int = field(3, check=in_range(1, 1000), allowed="an integer in 1..1000")
    kv_policy: Literal["propagate", "full"] = "propagate"
    cost_model: bool = False  # print the measured cost model
    mode: Literal["early_exit", "self_speculative"] = "early_exit"
    draft_len: int = field(4, check=in_range(1, 64), allowed="an integer in 1..64")  # self_speculative: drafts per verification
    batch_size: int = field(1, check=in_range(1, 256), allowed="an integer in 1..256")  # sequences decoded together


@dataclass(frozen=True)
class SearchConfig:
    """A sweep: sub-spaces of config paths in Hydra's sweep grammar, searched by grid or Optuna."""

    name: str = "saturation-grid"
    kind: Literal["grid", "optuna", "screen"] = "grid"
    # each sub-space maps config paths (or the groups model/gate/prompts) to a value or a sweep
    # expression: choice(...), range(a,b,step=s), interval(a,b), int(interval(a,b)), tag(log, interval(a,b))
    spaces: list = field([], check=lambda v: len(v) > 0, allowed="a non-empty list of mappings")
    n_trials: int | None = field(None, check=in_range(1, 100000), allowed="an integer in 1..100000")
    seed: int = field(0, check=at_least(0), allowed="an integer >= 0")
    sampler: Literal["tpe", "random", "nsga2"] = "tpe"
    objectives: dict = field({}, check=lambda v: len(v) > 0, allowed="a non-empty mapping of metric: max|min")
    constraints: dict = field({}, allowed="a mapping of metric: minimum value")
    neighbours: int = field(1, check=in_range(0, 100), allowed="an integer in 0..100")  # screen: knee neighbours run closed-loop


@dataclass(frozen=True)
class ClusterConfig:
    address: str | None = None  # null: embedded Ray on 127.0.0.1; auto or host:port: an existing cluster
    auth: Literal["token", "disabled"] = "token"  # RAY_AUTH_MODE; must match the cluster's
    num_cpus: int | None = field(None, check=at_least(1), allowed="an integer >= 1 or null (all)")
    num_gpus: int | None = field(None, check=at_least(0), allowed="an integer >= 0 or null (all)")
    dashboard: bool = False  # embedded only; it binds 127.0.0.1


@dataclass(frozen=True)
class ResourcesConfig:
    cpu: float = field(1.0, check=lambda v: v > 0, allowed="a number > 0")
    gpu: float | str = field(
        "auto", check=lambda v: v == "auto" or (not isinstance(v, str) and v >= 0), allowed="auto or a number >= 0"
    )  # auto: 1 where the cluster has GPUs, else 0


@dataclass(frozen=True)
class SweepConfig:
    name: str | None = field(None, check=lambda v: bool(NAME_RE.match(v)), allowed="letters, digits, '.', '_' or '-'")
    storage: str | None = None  # Ray Tune storage path; null = <results.root>/ray (shared storage on a cluster)
    max_concurrent: int | None = field(None, check=at_least(1), allowed="an integer >= 1 or null (as many as fit)")
    max_failures: int = field(2, check=at_least(0), allowed="an integer >= 0")
    rerun: bool = False  # true: redo trials whose rows already exist


@dataclass(frozen=True)
class AnalysisConfig:
    targets: list = field([0.95, 0.98, 0.99, 1.0], check=lambda v: len(v) > 0 and all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= 1 for t in v), allowed="a non-empty list of numbers in [0, 1]")
    n_boot: int = field(1000, check=in_range(10, 100000), allowed="an integer in 10..100000")
    seed: int = field(0, check=at_least(0), allowed="an integer >= 0")
    out: str | None = None  # report directory; null = <results.root>/report
    # the speedup fronts, knees, targets and verdicts rank by: decode only, or whole requests
    speedup: Literal["speedup_wall", "speedup_e2e_wall"] = "speedup_wall"
    # intervals resampled from fewer prompts than this are flagged as unreliable
    ci_min_prompts: int = field(8, check=at_least(2), allowed="an integer >= 2")


@dataclass(frozen=True)
class CalibrateConfig:
    delta: float = field(0.1, check=lambda v: 0 < v < 1, allowed="a number in (0, 1)")
    epsilon: float = field(0.1, check=in_range(0, 1, lo_open=True), allowed="a number in (0, 1]")
    grid: str | None = None  # the threshold ladder in Hydra's grammar; null = the gate's default
    split: float = field(0.5, check=lambda v: 0 < v < 1, allowed="a number in (0, 1)")
    pvalue: Literal["hb", "hoeffding"] = "hb"


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
    search: SearchConfig = SearchConfig()
    cluster: ClusterConfig = ClusterConfig()
    resources: ResourcesConfig = ResourcesConfig()
    sweep: SweepConfig = SweepConfig()
    resume: bool = False  # `sweep run ... resume=true`: continue the interrupted sweep sweep.name
    profile: ProfileConfig = ProfileConfig()
    bench: BenchConfig = BenchConfig()
    eas: EasConfig = EasConfig()
    analysis: AnalysisConfig = AnalysisConfig()
    calibrate: CalibrateConfig = CalibrateConfig()
    results: ResultsConfig = ResultsConfig()
