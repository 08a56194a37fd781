"""The typed configuration every command receives, validated once at the boundary.

Field names follow conf/ one to one. Defaults live in one place: conf/config.yaml and the
group files (a test keeps every field there); a field here carries its type and check, and
no default except null for optional keys (and the gate parameters, null where a gate does
not take them). Checks that need the loaded model (a layer index against L) live with the
gate-spec table (``sweep.gates.check_model``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from sweep.config._fields import at_least, field, in_range
from sweep.config.families import TINY
from sweep.gates import PARAMS
from sweep.config.paths import NAME_ALLOWED, is_name


def _name(default=dataclasses.MISSING):
    """A name that becomes a file or directory name under results.root (``sweep.config.paths``)."""
    return field(default, check=is_name, allowed=f"{NAME_ALLOWED} (it becomes a file or directory name)")


def _path(allowed: str = "a non-empty directory path"):
    """An optional directory path: null, or a non-empty string (checked writable by the commands that write)."""
    return field(None, check=lambda v: v.strip() != "" and "\0" not in v, allowed=f"{allowed} or null")


@dataclass(frozen=True, kw_only=True)
class TinyConfig:
    """Sizes of a seeded random model built from a config (tests, quick checks)."""

    layers: int = field(check=in_range(1, 64), allowed="an integer in 1..64")
    hidden: int = field(check=in_range(8, 1024), allowed="an integer in 8..1024")
    heads: int = field(check=at_least(1), allowed="an integer >= 1")
    kv_heads: int = field(check=at_least(1), allowed="an integer >= 1")
    head_dim: int = field(check=lambda v: v >= 2 and v % 2 == 0, allowed="an even integer >= 2")
    intermediate: int = field(check=at_least(1), allowed="an integer >= 1")
    init_std: float = field(check=lambda v: v > 0, allowed="a number > 0 (finite)")


_SHA256 = "64 lowercase hex digits"


def _is_sha256(v: str) -> bool:
    return len(v) == 64 and all(c in "0123456789abcdef" for c in v)


@dataclass(frozen=True, kw_only=True)
class PartConfig:
    """One part of a model file shipped as several packages' data files (``model.parts``)."""

    path: str = field(check=lambda v: v.strip() != "", allowed="PACKAGE/PATH, a file inside a top-level package")
    size: int = field(check=at_least(1), allowed="the part's size in bytes, an integer >= 1")
    sha256: str = field(check=_is_sha256, allowed=f"the part's sha256, {_SHA256}")
    version: str | None = None  # the package's version, named in the install hint


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Where a model comes from. ``name`` labels every row written for it."""

    name: str | None = _name(None)  # null: derived from model.path
    source: Literal["packaged", "hf", "gguf", "tiny"]
    path: str | None = None
    revision: str | None = None
    family: str | None = field(None, check=lambda v: v in TINY, allowed="one of " + ", ".join(TINY))
    package: str | None = None
    file: str | None = None
    tiny: TinyConfig | None = None
    # a file shipped in parts (conf/model/qwen2.5-coder-0.5b.yaml): concatenated in order into model.file, whose
    # sha256 is model.sha256 (sweep.models._split checks every part before any use)
    parts: tuple[PartConfig, ...] | None = None
    sha256: str | None = field(None, check=_is_sha256, allowed=f"the whole file's sha256, {_SHA256}, or null")


def _gate_param(name: str):
    """A gate parameter field: type and widest domain from the gate-spec table (null = unset)."""
    domain = PARAMS[name].domain
    return field(None, check=domain.check, allowed=f"{domain.allowed} or null")


@dataclass(frozen=True, kw_only=True)
class GateConfig:
    """An exit rule and its thresholds; parameters a gate does not take stay null.

    The parameters are the gate-spec table's (``sweep.gates.PARAMS``, a test keeps the two
    equal); which gate takes which, and narrower domains, are checked by ``check_gate``."""

    name: str = "full"  # a gate of sweep.gates.GATES
    # the first layer after which the gate may exit: min_layer (a layer index) when set, else
    # ceil(min_depth * L) (a fraction of depth, the conf/gate default), else 1 (gates built in code);
    # sweep.gates.resolve_min_layer, once the model's depth L is known
    min_layer: int | None = field(None, check=at_least(1), allowed="an integer >= 1 or null")
    min_depth: float | None = field(None, check=in_range(0, 1, lo_open=True), allowed="a number in (0, 1] or null")
    exit_layer: int | None = _gate_param("exit_layer")
    eps: float | None = _gate_param("eps")
    theta: float | None = _gate_param("theta")
    q: float | None = _gate_param("q")
    k: int | None = _gate_param("k")
    decay: float | None = _gate_param("decay")
    # the skip gate's bypassed sublayers (sweep.gates.skipset), e.g. 'a3+m3+a5-9'
    skip: str | None = _gate_param("skip")
    # which readout turns h_l into logits (the lens-probe gates and the classifier's exit token):
    # logit = the model's own final norm and head; tuned = a fitted translator first (`sweep fit`)
    lens: Literal["logit", "tuned"] | None = None  # null: logit (gates built in code)
    # the fitted readouts (`sweep fit`'s .safetensors file): needed by gate.lens=tuned and gate=classifier
    readouts: str | None = field(None, check=lambda v: v.strip() != "" and "\0" not in v, allowed="a file path or null")


@dataclass(frozen=True, kw_only=True)
class PromptsConfig:
    """Which prompts, how many, and whether they go through the chat template."""

    name: Literal["chat", "humaneval", "jsonl"]
    path: str | None = None
    start: int = field(check=at_least(0), allowed="an integer >= 0")  # the set's first prompt taken (0-based)
    n: int | None = field(None, check=at_least(1), allowed="an integer >= 1 or null (all)")
    chat_template: bool
    max_tokens: int = field(check=at_least(1), allowed="an integer >= 1")


@dataclass(frozen=True, kw_only=True)
class ProfileConfig:
    gen_tokens: int = field(check=in_range(1, 4096), allowed="an integer in 1..4096")
    topk: int = field(check=in_range(1, 1000), allowed="an integer in 1..1000")
    pca_k: int = field(
        check=in_range(1, 65536), allowed="an integer in 1..65536 (more than the hidden size is clipped to it)"
    )  # the pca signal's directions
    # `sweep fit`'s readouts file: the trace adds the tuned lens's and the exit classifiers' columns
    readouts: str | None = field(None, check=lambda v: v.strip() != "" and "\0" not in v, allowed="a file path or null")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    gen_tokens: int = field(check=in_range(2, 4096), allowed="an integer in 2..4096")
    warmup: int = field(check=in_range(0, 100), allowed="an integer in 0..100")
    repeats: int = field(check=in_range(1, 1000), allowed="an integer in 1..1000")
    kv_policy: Literal["propagate", "full"]
    cost_model: bool  # print the measured cost model
    mode: Literal["early_exit", "self_speculative"]
    draft_len: int = field(
        check=in_range(1, 64), allowed="an integer in 1..64"
    )  # self_speculative: drafts per verification
    # self_speculative: stop drafting once the draft's top-1 probability is below this; null: never
    draft_stop: float | None = field(None, check=in_range(0, 1), allowed="a number in [0, 1] or null")
    batch_size: int = field(check=in_range(1, 256), allowed="an integer in 1..256")  # sequences decoded together


@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """A sweep's search, the keys every kind shares (conf/config.yaml's ``search:``): sub-spaces of config paths in
    Hydra's sweep grammar, searched as its kind says (``search.kind``). Each kind adds its own keys in a subclass
    (``sweep.config.search_kinds``); ``check`` holds its rules."""

    name: str = _name()  # the sweep's name is <search.name>-<run_id> unless sweep.name is set
    # how it searches: a registered search kind (sweep.config.search_kinds.SEARCH_KINDS; `sweep run --help` lists them)
    kind: str = field(check=lambda v: v.strip() != "" and "\0" not in v, allowed="a search kind's name")
    # each sub-space maps config paths (or the groups model/gate/prompts) to a value or a sweep
    # expression: choice(...), range(a,b,step=s), interval(a,b), int(interval(a,b)), tag(log, interval(a,b))
    spaces: list = field(check=lambda v: len(v) > 0, allowed="a non-empty list of mappings")
    # the settings a search draws or keeps (required by optuna, bracket, skipset; null for a grid or a screen)
    n_trials: int | None = field(None, check=in_range(1, 100000), allowed="an integer in 1..100000")
    seed: int = field(check=in_range(0, 2**32 - 1), allowed="an integer in 0..4294967295 (2^32 - 1, Optuna's samplers)")
    # what the sweep's settings are judged by (an Optuna search optimises them; every kind records them; null: an
    # Optuna search's own, which it must name)
    objectives: dict | None = field(None, check=lambda v: len(v) > 0, allowed="a non-empty mapping of metric: max|min")
    constraints: dict = field(allowed="a mapping of metric: minimum value (null: none on that metric)")
    # hopeless settings stopped early: a setting whose agreement's bootstrap interval ends below this after its
    # first rung_prompts prompts (then twice as many, ...) stops there, a row of status `stopped` (null: none stops)
    min_agreement: float | None = field(None, check=in_range(0, 1), allowed="a number in [0, 1] or null")
    # a task's gated side stops once its accuracy loss over all problems is certain to exceed this
    max_accuracy_loss: float | None = field(None, check=in_range(0, 1), allowed="a number in [0, 1] or null")
    rung_prompts: int = field(check=in_range(1, 100000), allowed="an integer in 1..100000")

    def check(self) -> None:
        """The rules of the kind's own keys, before anything runs (one ConfigError line naming the key)."""

    def settled(self) -> SearchConfig:
        """The settings as every reader takes them: a constraint set to null is none."""
        kept = {m: b for m, b in self.constraints.items() if b is not None}
        return self if kept == self.constraints else dataclasses.replace(self, constraints=kept)


def _host_port(text: str) -> bool:
    """``host:port`` (a name, an IPv4 address or a bracketed IPv6 one; a port in 1..65535), no scheme."""
    import re

    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})", text)
    return m is not None and 1 <= int(m.group(2)) <= 65535


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    # null: embedded Ray on 127.0.0.1; auto or host:port (the GCS's): an existing cluster, joined as a driver
    address: str | None = field(
        None,
        check=lambda v: v == "auto" or _host_port(v),
        allowed="null (an embedded Ray), auto or host:port of a running cluster's GCS (a Ray Client ray:// address "
        "is not joined: submit with jobs/submit.py)",
    )
    auth: Literal["token", "disabled"]  # RAY_AUTH_MODE; must match the cluster's
    num_cpus: int | None = field(None, check=at_least(1), allowed="an integer >= 1 or null (all)")
    num_gpus: int | None = field(None, check=at_least(0), allowed="an integer >= 0 or null (all)")
    dashboard: bool  # embedded only; it binds 127.0.0.1


@dataclass(frozen=True, kw_only=True)
class ResourcesConfig:
    cpu: float = field(check=lambda v: v > 0, allowed="a number > 0 (finite)")
    # auto: 1 where the cluster has GPUs, else 0
    gpu: float | str = field(
        check=lambda v: v == "auto" or (not isinstance(v, str) and v >= 0), allowed="auto or a number >= 0 (finite)"
    )
    # loaded models a process keeps (least recently used dropped first): a worker serving several models
    models: int = field(check=in_range(1, 64), allowed="an integer in 1..64")


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    name: str | None = _name(None)
    storage: str | None = _path()  # Ray Tune storage path; null = <results.root>/ray (shared storage on a cluster)
    max_concurrent: int | None = field(None, check=at_least(1), allowed="an integer >= 1 or null (as many as fit)")
    max_failures: int = field(check=at_least(0), allowed="an integer >= 0")
    rerun: bool  # true: redo trials whose rows already exist
    # grid and screen: settings of one model (differing only in gate, kv_policy, mode) timed against one
    # full-depth baseline per round, each its own row; 1 = every setting its own baseline
    shared_baseline: int = field(check=in_range(1, 16), allowed="an integer in 1..16")
    # true: a worker takes each full-depth reference once and its later trials reuse it (``sweep.bench.reuse``;
    # rows: reference_source cached); false: every trial takes its own, as `sweep bench` does (fresh)
    reuse: bool


def _fractions(values: list) -> bool:
    return len(values) > 0 and all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= 1 for t in values
    )


@dataclass(frozen=True, kw_only=True)
class AnalysisConfig:
    # each target once: a target given twice would be two rows of the targets table for one pick
    targets: list = field(
        check=lambda v: _fractions(v) and len(set(v)) == len(v),
        allowed="a non-empty list of numbers in [0, 1], each once",
    )
    n_boot: int = field(check=in_range(10, 100000), allowed="an integer in 10..100000")
    seed: int = field(check=at_least(0), allowed="an integer >= 0")
    out: str | None = _path()  # report directory; null = <results.root>/report
    # the speedup fronts, knees, targets and verdicts rank by: decode only, or whole requests
    speedup: Literal["speedup_wall", "speedup_e2e_wall"]
    # intervals resampled from fewer prompts than this are flagged as unreliable
    ci_min_prompts: int = field(check=at_least(2), allowed="an integer >= 2")
    # knees are taken among front points at least this accurate (the unrestricted knee is kept beside)
    knee_min_agreement: float = field(check=in_range(0, 1), allowed="a number in [0, 1]")
    # the A/A noise floor (a fraction: 0.02 = +-2%) for which the report says how many timed rounds it takes
    floor_target: float = field(check=in_range(0, 1, lo_open=True), allowed="a number in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class CalibrateConfig:
    delta: float = field(check=lambda v: 0 < v < 1, allowed="a number in (0, 1)")
    # < 1: at epsilon = 1 the guarantee (probability >= 1 - epsilon) says nothing
    epsilon: float = field(check=lambda v: 0 < v < 1, allowed="a number in (0, 1)")
    grid: str | None = None  # the threshold ladder in Hydra's grammar; null = the gate's default
    split: float = field(check=lambda v: 0 < v < 1, allowed="a number in (0, 1)")
    pvalue: Literal["hb", "hoeffding"]
    # a second prompt set (chat | humaneval) the certified threshold is checked on: its drift
    heldout_prompts: Literal["chat", "humaneval"] | None = None
    heldout_n: int = field(check=at_least(1), allowed="an integer >= 1")  # prompts of that set (its first ones)


@dataclass(frozen=True, kw_only=True)
class FitConfig:
    """`sweep fit`: learned readouts (tuned-lens translators, exit classifiers) fitted on the
    traces of ``prompts`` (the fitting set)."""

    gen_tokens: int = field(check=in_range(1, 4096), allowed="an integer in 1..4096")
    ridge: float = field(check=lambda v: 0 <= v < float("inf"), allowed="a number >= 0 (finite)")
    l2: float = field(check=lambda v: 0 <= v < float("inf"), allowed="a number >= 0 (finite)")
    out: str | None = _path()  # where readouts go; null = <results.root>/readouts


@dataclass(frozen=True, kw_only=True)
class EasConfig:
    alpha: float = field(check=in_range(0, 1), allowed="a number in [0, 1]")


def _ks(values: list) -> bool:
    return (
        len(values) > 0
        and len(set(values)) == len(values)
        and all(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 1000 for k in values)
    )


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """A task's accuracy under the gate and at full depth, on the same problems, in the same trial (docs/tasks.md):
    null task = none (the trial measures agreement and speed only)."""

    task: Literal["humaneval", "harness"] | None = None
    problems: int | None = field(None, check=at_least(1), allowed="an integer >= 1 or null (all)")
    max_tokens: int = field(check=in_range(1, 4096), allowed="an integer in 1..4096")  # per completion
    samples: int = field(check=in_range(1, 1000), allowed="an integer in 1..1000")  # completions per problem
    temperature: float = field(check=lambda v: 0 <= v <= 10, allowed="a number in [0, 10]")  # 0: greedy
    ks: list = field(check=_ks, allowed="a non-empty list of distinct integers in 1..1000 (the k of pass@k)")
    allow_code_execution: bool  # humaneval runs code the model wrote: opt-in
    workers: int = field(check=in_range(1, 64), allowed="an integer in 1..64")  # programs the sandbox runs at once
    timeout_s: float = field(check=lambda v: 0 < v <= 3600, allowed="a number in (0, 3600]")  # per program
    # completions decoded together (greedy early exit and full depth; sweep.tasks.evaluate.batching), both sides
    batch_size: int = field(check=in_range(1, 64), allowed="an integer in 1..64")
    harness_tasks: list | None = field(
        None,
        check=lambda v: len(v) > 0 and all(isinstance(t, str) and t.strip() for t in v),
        allowed="a non-empty list of lm-evaluation-harness task names, or null",
    )
    harness_include: str | None = _path("a directory of lm-evaluation-harness task YAMLs")


@dataclass(frozen=True, kw_only=True)
class ResultsConfig:
    root: str = field(check=lambda v: v.strip() != "" and "\0" not in v, allowed="a non-empty directory path")


@dataclass(frozen=True, kw_only=True)
class Config:
    """The whole validated configuration of one command."""

    model: ModelConfig
    gate: GateConfig
    prompts: PromptsConfig
    seed: int = field(check=in_range(0, 2**63 - 1), allowed="an integer in 0..9223372036854775807 (2^63 - 1, torch's)")
    device: Literal["auto", "cpu", "cuda"]
    dtype: Literal["float32", "bfloat16", "float16"]
    run_id: str | None = _name(None)
    search: SearchConfig
    cluster: ClusterConfig
    resources: ResourcesConfig
    sweep: SweepConfig
    resume: bool  # `sweep run ... resume=true`: continue the interrupted sweep sweep.name
    profile: ProfileConfig
    bench: BenchConfig
    eas: EasConfig
    analysis: AnalysisConfig
    calibrate: CalibrateConfig
    fit: FitConfig
    eval: EvalConfig
    results: ResultsConfig
