"""Compose conf/ with Hydra overrides and validate it into a ``Config``.

Every Hydra or OmegaConf failure becomes one ``ConfigError`` line that names the key
or option and what is allowed; nothing else in the package touches Hydra's compose.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from pathlib import Path
from typing import Any

from sweep.config._composed import CONFIG_DIR_ENV, composed, config_dir
from sweep.config._override_errors import first_line, gate_said, missing_option as _missing_option, unapplied
from sweep.config._fields import build
from sweep.config._schema import Config, GateConfig
from sweep.errors import ConfigError
from sweep.gates import check_gate, check_k
from sweep.config.paths import is_name, override_key, read_paths
from sweep.config.search import check_ladder, check_search
from sweep.config.search_kinds import build_search, kind_chosen

# A gate's conf file holds only its own keys; every other GateConfig key composes to these (lens: the logit
# lens, as a gate built in code reads a null one), and ``gate.KEY=VALUE`` may set any of them: ``check_gate``
# then says whether the chosen gate takes it.
GATE_KEYS = {f.name for f in dataclasses.fields(GateConfig)} - {"name"}
GATE_BASE = {**{f.name: f.default for f in dataclasses.fields(GateConfig) if f.name != "name"}, "lens": "logit"}


def _gate_keys_settable(overrides) -> list[str]:
    """``gate.KEY=VALUE`` as Hydra's add-or-override (``++``) for every GateConfig key: a gate's conf file
    holds only its own keys, so another gate's key is added, and ``check_gate`` judges it."""
    out = []
    for o in overrides:
        key, eq, value = str(o).partition("=")
        bare = key.lstrip("+")
        if eq and not key.startswith("~") and bare.startswith("gate.") and bare[len("gate.") :] in GATE_KEYS:
            o = f"++{bare}={value}"
        out.append(o)
    return out


def _hydra(overrides, *, hydra_config: bool = False):
    """Hydra's composition of conf/ with ``overrides``; what it raises, one line (``ConfigError``)."""
    import yaml
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    for override in overrides:  # Hydra would look a long key up as a file name: "File name too long"
        key = override_key(override)
        if len(key) > 128:
            raise ConfigError(f"{key[:40]}...: not a config key ({len(key)} characters; `sweep config` shows the keys)")
        _check_group_choice(str(override), key)
    chosen = kind_chosen(_gate_keys_settable(overrides))
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return compose(config_name="config", overrides=chosen, return_hydra_config=hydra_config)
    except MissingConfigException as exc:
        raise ConfigError(_missing_option(exc)) from None
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_first_line(exc, exc.__cause__, overrides)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(exc)) from None
    except (TypeError, IndexError, KeyError) as exc:  # OmegaConf's own, applying an override (not Hydra's errors)
        import traceback

        if "omegaconf" not in traceback.extract_tb(exc.__traceback__)[-1].filename:
            raise  # not an override's: a bug, said as one
        raise ConfigError(unapplied(exc, overrides)) from None


def _check_group_choice(override: str, key: str) -> None:
    """An override's key is a config key, and a config group's value one option of it (``gate=margin``): an empty
    key, Hydra's own settings, a package (``gate@x``), and a null, number or list for a group (Hydra would merge a
    list's options or fail inside itself) are one line naming the override."""
    if "=" not in override:
        return
    value = override.partition("=")[2].strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":  # Hydra's quotes, as Hydra reads them
        value = value[1:-1]
    if not key or "@" in key:
        raise ConfigError(f"{override}: not a config key=value (`sweep config` shows the keys; gate=NAME picks a gate)")
    if key == "hydra" or key.startswith("hydra."):
        raise ConfigError(f"{override}: Hydra's own settings, not this tool's config (`sweep config` shows its keys)")
    group = config_dir() / key
    if not group.is_dir() or (group / f"{value}.yaml").is_file() or ("," in value and "[" not in value):
        return  # (a comma list is Hydra's sweep: its own line says where sweeps go)
    if value.startswith("{"):
        return  # a mapping set whole: its keys are checked as keys (``_override_errors``)
    scalar = value.lower() in ("null", "true", "false") or re.fullmatch(r"[-+]?[0-9][0-9_]*(\.[0-9_]*)?", value)
    if scalar or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", value):
        options = sorted(p.stem for p in group.glob("*.yaml") if not p.name.startswith("_"))
        raise ConfigError(f"{override}: one option of conf/{key}/; allowed: {', '.join(options)}")


def _first_line(exc: BaseException, cause: BaseException | None = None, overrides=()) -> str:
    return first_line(exc, cause, overrides, compose_dict)


def compose_dict(overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The composed config as a plain dict (defaults plus overrides), not yet validated."""
    return composed(config_dir(), overrides, lambda: _compose_dict(overrides))


def _compose_dict(overrides) -> dict[str, Any]:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = _hydra(overrides)
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(_first_line(exc, exc.__cause__, overrides)) from None
    if isinstance(data.get("gate"), dict):
        data["gate"] = {**GATE_BASE, **data["gate"]}
        _layer_keys(data["gate"], _given(overrides))
    _unread(data, _given(overrides))
    return data


# keys read only beside another: (the key's section, what must be set, the keys it alone reads, what they are for)
_READ_WITH = (
    ("eval", "task", ("problems", "max_tokens", "samples", "temperature", "ks", "workers", "timeout_s", "batch_size"),
     "eval.task (humaneval or harness)"),
    ("calibrate", "heldout_prompts", ("heldout_n",), "calibrate.heldout_prompts (chat or humaneval)"),
)  # fmt: skip


def spaces_vary(spaces, section: str) -> bool:
    """Whether a search's sub-spaces set a key of ``section`` (its settings then differ from the base there)."""
    return any(
        override_key(str(k)).split(".")[0] == section
        for space in (spaces or [])
        if isinstance(space, dict)
        for k in space
    )


def _unread(data: dict[str, Any], given: set[str]) -> None:
    """A key given on the command line that nothing reads without another key (``eval.samples`` without a task):
    one line naming it, as a key that would change nothing."""
    spaces = (data.get("search") or {}).get("spaces") if isinstance(data.get("search"), dict) else None
    for section, needed, keys, needs in _READ_WITH:
        values = data.get(section)
        if not isinstance(values, dict) or values.get(needed) is not None or spaces_vary(spaces, section):
            continue  # (a sweep's settings may set what the key needs: each setting's composition is its own)
        for key in keys:
            if f"{section}.{key}" in given:
                raise ConfigError(f"{section}.{key}: read only with {needs}, which is not set; it would change nothing")


def group_choices(overrides: list[str] | tuple[str, ...] = ()) -> dict[str, str | None]:
    """The option each config group (model, gate, prompts, search, cluster, experiment) takes
    in the composition of ``overrides``: Hydra's runtime choices, for `sweep <command> --help`."""
    cfg = _hydra(overrides, hydra_config=True)
    return {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra/")}


def _yaml_error(exc) -> str:
    """A conf file that is not YAML: the file and line, and what the parser said."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{mark.name}:{mark.line + 1}" if mark is not None else "a file"
    what = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
    env = f"{CONFIG_DIR_ENV}={os.environ[CONFIG_DIR_ENV]}: " if os.environ.get(CONFIG_DIR_ENV) else ""
    return f"{env}{where}: not valid YAML ({what})"


def _given(overrides: list[str] | tuple[str, ...]) -> set[str]:
    """The keys the overrides set (``+``/``++`` stripped; ``~`` deletions are not settings)."""
    return {override_key(o) for o in overrides if "=" in o and not o.startswith("~")}


def _layer_keys(gate: dict[str, Any], given: set[str]) -> None:
    """Keep at most one of the gate's min_layer and min_depth (``sweep.gates.resolve_min_layer``):
    what the overrides set wins over what a conf file set. The gates' conf files set min_depth
    (a fraction of depth) and leave min_layer null, so ``gate.min_layer=K`` drops that default
    min_depth, ``gate.min_depth=F`` drops a min_layer set by a conf file (an experiment's), and
    setting both is an error; two from conf files: min_layer wins. For the fixed gate, whose
    min_depth only gives the default exit layer, an explicit ``gate.exit_layer=K`` drops it too."""
    layer, depth = gate.get("min_layer"), gate.get("min_depth")
    set_layer = "gate.min_layer" in given and layer is not None
    set_depth = "gate.min_depth" in given and depth is not None
    if set_layer and set_depth:
        raise ConfigError(
            f"gate.min_layer={layer} and gate.min_depth={depth}: set one of them "
            f"(min_layer: a layer index; min_depth: a fraction of depth, min_layer = ceil(min_depth * L))"
        )
    if set_depth:
        gate["min_layer"] = None
    elif layer is not None or (
        gate.get("name") == "fixed" and "gate.exit_layer" in given and gate.get("exit_layer") is not None
    ):
        gate["min_depth"] = None


def compose(overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Compose and validate: the single entry from user input to a typed ``Config``."""
    return validate(compose_dict(overrides))


def validate(data: dict[str, Any], *, search: bool = True) -> Config:
    """Check types, ranges and cross-field rules; fill derived values (names).

    ``search=False`` leaves the search's sub-spaces unparsed (their grammar is Hydra's): for code
    that runs settings and never a search, on a machine without Hydra (benchmarks/gpu_check.py)."""
    data = {k: v for k, v in data.items() if k != "hydra"}
    if "search" in data:  # the search typed by its kind (``sweep.config.search_kinds``)
        data = {**data, "search": build_search(data["search"])}
    try:
        cfg = build(Config, data)
    except ConfigError as exc:
        raise gate_said(exc, data.get("gate")) from None
    check_gate(cfg.gate)
    _check_model(cfg)
    if search:
        check_search(cfg.search, cfg.gate.name)
        cfg.search.check()
    if cfg.calibrate.grid is not None:
        check_ladder(cfg.calibrate.grid, cfg.gate.name)
    _check_bench(cfg)
    _check_eval(cfg)
    sizes = [f"cluster.{k}={v}" for k, v in (("num_cpus", cfg.cluster.num_cpus), ("num_gpus", cfg.cluster.num_gpus))]
    sizes = [s for s in sizes if not s.endswith("=None")] + ["cluster.dashboard=true"] * cfg.cluster.dashboard
    if cfg.cluster.address is not None and sizes:  # (a joined cluster has its own: they were ignored in silence)
        raise ConfigError(
            f"{sizes[0]}: is for the embedded Ray (cluster=local) only; a cluster joined (cluster.address="
            f"{cfg.cluster.address}) has its own nodes (resources.cpu and resources.gpu ask each trial's share)"
        )
    if cfg.sweep.storage is not None and "://" in cfg.sweep.storage:
        raise ConfigError(
            f"sweep.storage={cfg.sweep.storage}: a filesystem path is needed (a shared mount on a cluster)"
        )
    if cfg.prompts.name == "jsonl" and cfg.prompts.path is None:
        raise ConfigError('prompts.path: required for prompts=jsonl (a file of {"id": ..., "prompt": ...} lines)')
    varied = spaces_vary(cfg.search.spaces if cfg.search is not None else None, "prompts")
    if cfg.prompts.name != "jsonl" and cfg.prompts.path is not None and not varied:  # it changed only the trial id
        raise ConfigError(
            f"prompts.path={cfg.prompts.path}: read by prompts=jsonl only (prompts={cfg.prompts.name} is a built-in "
            "set); add prompts=jsonl, or leave prompts.path out"
        )
    cfg = read_paths(cfg)  # every path read once: what every command checks and writes (and names a model by)
    if cfg.model.name is None:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=_derive_name(cfg.model.path)))
    cfg = _mode_defaults(cfg)
    if cfg.gate.name == "full":  # it never exits: whatever (valid) layer keys it is given, one setting, one trial
        cfg = dataclasses.replace(cfg, gate=dataclasses.replace(cfg.gate, min_layer=1, min_depth=None))
    if cfg.gate.skip is not None:  # one set, one text: two spellings of a skip set are one trial
        from sweep.gates.skipset import canonical

        cfg = dataclasses.replace(cfg, gate=dataclasses.replace(cfg.gate, skip=canonical(cfg.gate.skip)))
    return cfg


RUN_ID_LENGTH = len("20250101T000000Z-abcdef")  # sweep.store.run_info.new_run_id's


def check_sweep_name(cfg: Config) -> str:
    """`sweep run`'s directory name, <search.name>-<run_id> unless sweep.name is set, is a name too
    (``sweep.config.paths``); a placeholder stands for a run_id not yet drawn."""
    if cfg.sweep.name is not None:
        return cfg.sweep.name
    run_id = cfg.run_id if cfg.run_id is not None else "x" * RUN_ID_LENGTH
    derived = f"{cfg.search.name}-{run_id}"
    if not is_name(derived):
        why = f"the sweep's name <search.name>-<run_id> would be {len(derived)} characters, over 128; shorten"
        raise ConfigError(f"search.name={cfg.search.name}: {why} search.name or run_id, or set sweep.name=NAME")
    return derived


def _check_model(cfg: Config) -> None:
    m = cfg.model
    if m.source in ("hf", "gguf") and m.path is None:
        example = "ID_OR_DIR" if m.source == "hf" else "FILE.gguf"
        raise ConfigError(f"model.path: required for model={m.source} (model.path={example})")
    if m.source == "tiny" and (m.family is None or m.tiny is None):
        raise ConfigError("model.family and model.tiny: required for a tiny model (see conf/model/tiny-llama.yaml)")
    if m.source == "packaged" and (m.parts is None and (m.package is None or m.file is None)) or m.parts == ():
        raise ConfigError("model.package and model.file, or model.parts: required for a packaged model")
    if m.parts is not None and (m.source != "packaged" or m.sha256 is None):
        raise ConfigError("model.parts: a model in parts needs model.source=packaged and model.sha256 (the whole's)")
    if m.tiny is not None and m.tiny.heads % m.tiny.kv_heads != 0:
        raise ConfigError(f"model.tiny.kv_heads={m.tiny.kv_heads}: must divide model.tiny.heads={m.tiny.heads}")
    if m.source == "tiny" and m.tiny is not None:  # its hidden size is known before any weights exist
        check_k(cfg.gate, m.tiny.hidden, f"model.tiny.hidden={m.tiny.hidden}, the hidden size of model={m.name}")


def _mode_defaults(cfg: Config) -> Config:
    """What a mode needs, whatever the other mode's keys say: self-speculation's cache holds the full model's K/V at
    every kept position, which is ``bench.kv_policy=full`` (propagate, early exit's default, would ask state-space
    families for a K/V fill they cannot have): one trial whatever kv_policy says; early exit drafts nothing, one trial
    whatever ``bench.draft_len`` says. ``_check_bench`` refuses the
    mode-only keys whose default means "off" (``bench.draft_stop``, ``bench.batch_size``) set for the other mode."""
    if cfg.bench.mode == "self_speculative" and cfg.bench.kv_policy != "full":
        cfg = dataclasses.replace(cfg, bench=dataclasses.replace(cfg.bench, kv_policy="full"))
    if cfg.bench.mode == "early_exit" and cfg.bench.draft_len != DRAFT_LEN:  # drafts nothing: one trial whatever it is
        cfg = dataclasses.replace(cfg, bench=dataclasses.replace(cfg.bench, draft_len=DRAFT_LEN))
    return cfg


DRAFT_LEN = 4  # conf/config.yaml's bench.draft_len, the value an early-exit trial's id has always held


def _check_bench(cfg: Config) -> None:
    b = cfg.bench
    if b.mode == "self_speculative" and cfg.gate.name not in ("fixed", "skip"):
        raise ConfigError(
            "bench.mode=self_speculative: drafts with gate=fixed gate.exit_layer=K (layers 1..K) or gate=skip "
            f"gate.skip=S (the full model minus S), not gate={cfg.gate.name}"
        )
    if cfg.gate.name == "skip" and b.mode != "self_speculative":
        raise ConfigError("gate=skip: drafts for bench.mode=self_speculative (it never exits on its own)")
    if b.draft_stop is not None and b.mode != "self_speculative":
        raise ConfigError(f"bench.draft_stop={b.draft_stop}: stops drafting in bench.mode=self_speculative only")
    if b.batch_size > 1 and b.mode != "early_exit":
        raise ConfigError(f"bench.batch_size={b.batch_size}: batches are measured for bench.mode=early_exit only")
    if cfg.prompts.n is not None and b.batch_size > cfg.prompts.n:
        raise ConfigError(
            f"bench.batch_size={b.batch_size}: needs at least {b.batch_size} prompts (prompts.n={cfg.prompts.n})"
        )


# the one wording of the sandbox's opt-in (``sweep.tasks.sandbox.require_allowed``)
CODE_EXECUTION_OPT_IN = (
    "eval.allow_code_execution=false: this evaluation runs code the model wrote; set eval.allow_code_execution=true "
    "to run it in the sandbox (docs/tasks.md says what it isolates)"
)


def _check_eval(cfg: Config) -> None:
    e = cfg.eval
    if e.task is None:
        from sweep.config.search import TASK_METRICS

        for section in ("objectives", "constraints"):
            named = [m for m in getattr(cfg.search, section) or {} if m in TASK_METRICS]
            if named:
                raise ConfigError(
                    f"search.{section}.{named[0]}: a task's metric; measure a task with eval.task=humaneval|harness"
                )
        if cfg.search.max_accuracy_loss is not None:  # it would stop nothing, and say nothing of it
            raise ConfigError(
                f"search.max_accuracy_loss={cfg.search.max_accuracy_loss}: stops a task's gated side on its accuracy "
                "loss; measure a task with eval.task=humaneval|harness, or leave it null"
            )
        return
    if e.task == "humaneval" and not e.allow_code_execution:
        raise ConfigError(CODE_EXECUTION_OPT_IN)
    if e.task == "harness" and e.batch_size != 1:  # it would batch nothing, and only change the trial's id
        raise ConfigError(
            f"eval.batch_size={e.batch_size}: batches eval.task=humaneval's completions only (lm-evaluation-harness "
            "requests decode one at a time); leave it 1 for eval.task=harness"
        )
    if e.task == "harness" and cfg.search.max_accuracy_loss is not None:  # it would stop nothing, silently
        raise ConfigError(
            f"search.max_accuracy_loss={cfg.search.max_accuracy_loss}: stops eval.task=humaneval's gated side only "
            "(lm-evaluation-harness scores a task's documents as a whole); leave it null for eval.task=harness"
        )
    if (e.task == "harness") != (e.harness_tasks is not None):
        raise ConfigError(
            "eval.harness_tasks: lm-evaluation-harness task names, given with eval.task=harness (and only then); "
            f"here eval.task={e.task} and eval.harness_tasks={e.harness_tasks}"
        )
    if e.samples > 1 and e.temperature == 0:
        raise ConfigError(
            f"eval.samples={e.samples}: several completions per problem are sampled; set eval.temperature > 0"
        )
    if e.temperature > 0 and cfg.bench.mode != "early_exit":
        raise ConfigError(
            f"eval.temperature={e.temperature}: sampled completions are decoded in bench.mode=early_exit only "
            "(self-speculation verifies greedy tokens)"
        )
    if min(e.ks) > e.samples:
        raise ConfigError(f"eval.ks={e.ks}: pass@k needs k <= eval.samples={e.samples} for at least one k")


def _derive_name(path: str | None) -> str:
    """A model label from a hub id, a directory or a file path: always a safe name
    (``sweep.config.paths``), since it becomes a directory under results.root."""
    assert path is not None
    p = Path(path)
    if p.suffix == ".gguf":
        stem = p.stem
    elif os.path.exists(p):  # (False, not an error, for a path too long to be a file)
        stem = p.resolve().name
    else:
        stem = path.strip("/").replace("/", "--")
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", stem)
    name = re.sub(r"^[^A-Za-z0-9]+", "", name)  # no leading dot ('.', '..', '.hidden'), '_' or '-'
    if len(name) > 128:  # keep it unique: a cut name plus a hash of the whole path
        name = f"{name[:119]}-{hashlib.sha256(path.encode()).hexdigest()[:8]}"
    return name if is_name(name) else "model"
