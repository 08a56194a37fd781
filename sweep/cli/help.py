"""`sweep --help`, `sweep <command> --help`, and one line for each of Hydra's flags.

The keys a command's help shows come with their values from the composed config (conf/ is
the one place defaults live) and their comments from the conf/ files.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from sweep.errors import SweepError

USAGE = """usage: sweep [--quiet] <command> [key=value ...]

commands:
  profile   per-layer trace of full-depth decoding, layer curve, EAS, oracle exits
  bench     one early-exit trial: determinism self-check, gated vs full-depth, speedups
  run       a sweep of bench trials on Ray Tune (grid or Optuna), on an embedded or a real cluster
  analyze   Pareto fronts, knees, best speedup per agreement target, EAS; tables and a report
  calibrate a gate threshold with a guarantee (Learn-then-Test), checked on held-out prompts
  fit       learned readouts of a model: tuned-lens translators and exit classifiers, fitted on prompts
  config    print the composed configuration
  schema    print the results schema (docs/schema.md)
  families  print the supported model families: each tiny model loaded and checked, what runs on it

Overrides use Hydra's syntax, e.g. `sweep profile model=tiny-llama prompts.n=2`.
Progress (phase, done/total, elapsed, ETA) shows on stderr: live on a terminal, a line per step (at most
one a minute) in a pipe. --quiet (-q, anywhere on the line) turns it off with the info lines; so does a
non-empty CI variable (info lines kept). Results print on stdout either way.
`sweep <command> --help` (or `sweep help <command>`): the command's main keys, their defaults, examples.
"""

HELP_FLAGS = ("-h", "--help")
QUIET_FLAGS = ("-q", "--quiet")  # the one flag sweep takes: no progress display and no info lines on stderr

# Hydra's command-line flags (hydra.cc/docs/advanced/hydra-command-line-flags): sweep composes
# conf/ itself (Hydra's compose API), so none applies; each names what to use instead
HYDRA_FLAGS: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("-m", "--multirun"),
        "sweeps are `sweep run search=...` (a grid or Optuna over search.spaces); see `sweep run --help`",
    ),
    (("-c", "--cfg"), "`sweep config [key=value ...]` prints the composed config (resolved, as YAML)"),
    (("--resolve",), "`sweep config [key=value ...]` prints the composed config, interpolations resolved"),
    (
        ("-p", "--package"),
        "`sweep config [key=value ...]` prints the composed config; pick the section you need from it",
    ),
    (("-i", "--info"), "`sweep config [key=value ...]` prints the composed config; the groups are conf/<group>/*.yaml"),
    (
        ("-cd", "--config-dir", "-cp", "--config-path"),
        "set SWEEP_CONFIG_DIR=DIR to compose another conf/ directory (one with a config.yaml)",
    ),
    (
        ("-cn", "--config-name"),
        "sweep composes config.yaml; choose groups (gate=margin, search=screen) or experiment=NAME "
        "(conf/experiment/), or set SWEEP_CONFIG_DIR=DIR for another conf/ directory",
    ),
    (("-r", "--run"), "not needed: a command runs once (`sweep bench ...`); sweeps are `sweep run search=...`"),
    (("--hydra-help",), "`sweep <command> --help` lists a command's keys; overrides follow Hydra's override grammar"),
    (("--version",), "the installed version is in `pip show sweep` and in every row's sweep_version column"),
    (("-sc", "--shell-completion"), "no shell completion; `sweep --help` lists the commands"),
)


def flag_error(arg: str, command: str | None) -> int:
    """One line for a flag (``-m``, ``--cfg job``, ``--config-dir=X``, ...): what to use instead; rc 2."""
    flag = arg.split("=", 1)[0]
    for names, instead in HYDRA_FLAGS:
        if flag in names:
            label = "/".join(names[:2]) if flag in names[:2] else flag
            print(f"error: {label}: {instead}", file=sys.stderr)
            return 2
    import difflib

    where = f"sweep {command} --help" if command else "sweep --help"
    close = difflib.get_close_matches(flag, [*QUIET_FLAGS, *HELP_FLAGS], n=1, cutoff=0.6)
    meant = f"did you mean {close[0]}? " if close else ""
    print(
        f"error: {flag}: not a flag of sweep; {meant}its only flags are --quiet/-q and --help/-h, every setting is a "
        f"key=value override (Hydra's syntax); see `{where}`",
        file=sys.stderr,
    )
    return 2


@dataclasses.dataclass(frozen=True)
class CommandHelp:
    usage: str
    what: str
    keys: tuple[str, ...]  # config keys (or groups) shown with their composed values
    examples: tuple[str, ...]
    gates: bool = False  # list every gate with its conf defaults
    searches: bool = False  # list every search kind


GROUPS = ("model", "gate", "prompts", "search", "cluster", "experiment")

HELP: dict[str, CommandHelp] = {
    "profile": CommandHelp(
        "sweep profile [key=value ...]",
        "Per-layer trace of full-depth decoding (signals, logit-lens agreement), the layer curve, EAS and\n"
        "oracle exits; one Parquet table under results.root.",
        ("model", "prompts", "prompts.n", "profile.gen_tokens", "profile.topk", "profile.pca_k", "eas.alpha")
        + ("device", "dtype", "results.root"),
        (
            "sweep profile model=tiny-llama prompts.n=2",
            "sweep profile prompts=humaneval prompts.n=8 profile.gen_tokens=64",
            "sweep profile experiment=profile-humaneval",
        ),
    ),
    "bench": CommandHelp(
        "sweep bench [key=value ...]",
        "One early-exit trial: a determinism self-check, gated against full-depth decoding on the same\n"
        "prompts, speedups and agreement; one Parquet row under results.root.",
        ("model", "gate", "gate.min_depth", "gate.min_layer", "prompts", "prompts.n")
        + ("bench.gen_tokens", "bench.warmup", "bench.repeats", "bench.kv_policy", "bench.mode", "bench.batch_size")
        + ("eval.task", "eval.problems", "eval.allow_code_execution", "eval.harness_tasks")
        + ("device", "dtype", "results.root"),
        (
            "sweep bench model=tiny-llama gate=saturation gate.eps=0.3",
            "sweep bench gate=margin gate.theta=14 gate.min_layer=8",
            "sweep bench gate=fixed gate.exit_layer=15 bench.mode=self_speculative",
            "sweep bench gate=saturation gate.eps=0.2 eval.task=humaneval eval.allow_code_execution=true",
        ),
        gates=True,
    ),
    "run": CommandHelp(
        "sweep run [key=value ...]",
        "A sweep of bench trials on Ray Tune, searched by its kind over search.spaces (each sub-space\n"
        "maps keys to a value or choice(...), range(...), interval(...)), on an embedded Ray or a cluster;\n"
        "one Parquet row per trial under results.root, trials already there skipped.",
        ("search", "search.kind", "search.n_trials", "search.spaces", "search.objectives", "model", "prompts.n")
        + ("bench.gen_tokens", "cluster", "cluster.address", "resources.cpu", "resources.gpu")
        + ("sweep.name", "sweep.max_concurrent", "sweep.rerun", "resume", "results.root"),
        (
            "sweep run model=tiny-llama search=saturation-grid prompts.n=2",
            "sweep run experiment=main",
            "sweep run \"search.spaces=[{gate: saturation, gate.eps: 'choice(0.1,0.2)'}]\"",
            "sweep run search=optuna-mo search.n_trials=40",
            "sweep run resume=true sweep.name=NAME",
        ),
        searches=True,
    ),
    "analyze": CommandHelp(
        "sweep analyze [key=value ...]",
        "Pareto fronts, knees, the best speedup per agreement target and EAS over every row under\n"
        "results.root; tables and a report.",
        ("results.root", "analysis.targets", "analysis.speedup", "analysis.n_boot", "analysis.ci_min_prompts")
        + ("analysis.seed", "analysis.knee_min_agreement", "analysis.floor_target", "analysis.out", "eas.alpha"),
        ("sweep analyze results.root=results", "sweep analyze analysis.speedup=speedup_e2e_wall"),
    ),
    "calibrate": CommandHelp(
        "sweep calibrate [key=value ...]",
        "A gate threshold with a guarantee (Learn-then-Test): calibrated on a split of the prompts, checked\n"
        "on the held-out rest; writes nothing.",
        ("model", "gate", "gate.min_depth", "gate.min_layer", "prompts", "prompts.n")
        + ("calibrate.delta", "calibrate.epsilon", "calibrate.grid", "calibrate.split", "calibrate.pvalue")
        + ("calibrate.heldout_prompts", "calibrate.heldout_n", "bench.gen_tokens"),
        (
            "sweep calibrate model=tiny-llama gate=margin prompts.n=8 calibrate.delta=0.3 calibrate.epsilon=0.3",
            "sweep calibrate experiment=calibrate-saturation",
            "sweep calibrate gate=saturation prompts=humaneval prompts.n=60 \"calibrate.grid='range(0.02, 0.4, "
            "step=0.02)'\"",
        ),
        gates=True,
    ),
    "fit": CommandHelp(
        "sweep fit [key=value ...]",
        "Learned readouts of h_l, fitted on the prompts' full-depth greedy traces: a tuned-lens translator\n"
        "per layer (ridge toward the logit lens) and an exit classifier per layer and lens; one\n"
        "content-addressed .safetensors file for gate.readouts (gate.lens=tuned, gate=classifier).",
        ("model", "prompts", "prompts.start", "prompts.n", "fit.gen_tokens", "fit.ridge", "fit.l2", "fit.out")
        + ("seed", "device", "dtype", "results.root"),
        (
            "sweep fit model=tiny-llama prompts.n=4 fit.gen_tokens=8",
            "sweep fit prompts=humaneval prompts.n=100",
            "sweep bench gate=margin gate.lens=tuned gate.readouts=PATH prompts=humaneval prompts.start=100",
        ),
    ),
    "config": CommandHelp(
        "sweep config [key=value ...]",
        "Print the composed configuration (conf/ plus the overrides, validated) as YAML: what Hydra's\n"
        "--cfg job would print.",
        GROUPS,
        ("sweep config gate=margin", "sweep config experiment=main", "SWEEP_CONFIG_DIR=my-conf sweep config"),
    ),
    "schema": CommandHelp(
        "sweep schema",
        "Print the results schema (docs/schema.md): every table and column, with units. Takes no overrides.",
        (),
        ("sweep schema",),
    ),
    "families": CommandHelp(
        "sweep families",
        "Print the table of model families (the README's): each family's tiny model is built, loaded and put\n"
        "through the fidelity check any model gets at load; the row says which K/V fill path the adapter takes\n"
        "and what is refused on it. Any other decoder-only model takes the generic path. Takes no overrides.",
        (),
        ("sweep families",),
    ),
}


def show_help(command: str, overrides: list[str]) -> int:
    """`sweep <command> --help`: the command, its main keys with their values in the composed
    config (conf/ plus ``overrides``: conf/ is the one place defaults live), and examples."""
    if command not in HELP:
        print(f"error: unknown command '{command}'; commands: {', '.join(HELP)}", file=sys.stderr)
        return 2
    h = HELP[command]
    lines = [f"usage: {h.usage}", "", h.what]
    if h.keys:
        data, choices, note = _composed(overrides)
        lines += ["", f"main keys ({'defaults' if not overrides else 'values'} from the composed config, conf/):"]
        if note:
            lines.append(f"  ({note})")
        kind = _search_kind(data)
        rows = [_key_text(key, data, choices, kind) for key in _with_chosen(h.keys, data, kind)]
        width = min(36, max(len(text) for text, _ in rows))
        lines += [f"  {text:<{width}}  {note}".rstrip() for text, note in rows]
        if h.gates:
            lines += ["", "gates (gate=NAME; defaults from conf/gate/NAME.yaml):"]
            lines += _gate_lines()
        if h.searches:
            from sweep.orchestrate.searches import SEARCHES

            lines += ["", "search kinds (search.kind; a search=NAME of conf/search/ sets one):"]
            lines += [f"  {s.kind:<10}  {s.summary}" for s in SEARCHES]
    lines += ["", "examples:", *(f"  {e}" for e in h.examples), ""]
    lines += (
        []
        if not h.keys
        else [
            "Overrides use Hydra's syntax (key=value; +key=value adds a key). `sweep config [key=value ...]` prints",
            "the whole composed config; SWEEP_CONFIG_DIR=DIR composes another conf/ directory.",
        ]
    )
    print("\n".join(lines))
    return 0


def _search_kind(data: dict) -> str | None:
    """The composed search's kind, where it is a registered one."""
    from sweep.config.search_kinds import SEARCH_KINDS

    search = data.get("search") if isinstance(data.get("search"), dict) else {}
    return search.get("kind") if search.get("kind") in SEARCH_KINDS.names() else None


def _with_chosen(keys: tuple[str, ...], data: dict, kind: str | None) -> list[str]:
    """``keys`` with the chosen gate's own parameters (its threshold, as composed) after ``gate``, and the search
    ``kind``'s own keys after ``search.kind``."""
    from sweep.config.search_kinds import kind_keys
    from sweep.gates import PARAMS

    gate = data.get("gate") if isinstance(data.get("gate"), dict) else {}
    out: list[str] = []
    for key in keys:
        out.append(key)
        if key == "gate":
            out += [f"gate.{p}" for p in PARAMS if gate.get(p) is not None and f"gate.{p}" not in keys]
        if key == "search.kind" and kind is not None:
            out += [f"search.{k}" for k in kind_keys(kind) if f"search.{k}" not in keys]
    return out


def _composed(overrides: list[str]) -> tuple[dict, dict, str]:
    """The composed config and group choices of ``overrides``, falling back to the defaults."""
    from sweep.config import compose_dict, group_choices

    note = ""
    for attempt in [overrides, []] if overrides else [[]]:
        try:
            return compose_dict(attempt), group_choices(attempt), note
        except SweepError as exc:
            note = f"{'the overrides do not compose' if attempt else 'conf/ does not compose'}: {exc}"
    return {}, {}, note


def _key_text(key: str, data: dict, choices: dict, kind: str | None = None) -> tuple[str, str]:
    """``key=value`` as composed (a group: its option) and what conf/ says of it (its comment;
    a group: the other options)."""
    from sweep.config import config_dir

    if key in GROUPS:
        try:
            options = sorted(p.stem for p in (config_dir() / key).glob("*.yaml"))
        except SweepError:
            options = []
        value = choices.get(key)
        return f"{key}={'null' if value is None else value}", f"conf/{key}/: {', '.join(options)}"
    value: Any = data
    for part in key.split("."):
        value = value.get(part, "?") if isinstance(value, dict) else "?"
    return f"{key}={_yaml_value(value)}", _comments(choices, kind).get(key, "")


def _yaml_value(value: Any) -> str:
    import yaml

    if value is None:
        return "null"
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    text = text.removesuffix("\n...").strip()
    return text if len(text) <= 70 else text[:67] + "..."


def _comments(choices: dict, kind: str | None = None) -> dict[str, str]:
    """The trailing comment of each key in conf/config.yaml and in the chosen group files, by
    dotted key: the one place the keys are described (what `sweep <command> --help` shows)."""
    import re

    from sweep.config import config_dir

    try:
        root = config_dir()
    except SweepError:
        return {}
    files = [(root / "config.yaml", "")]
    files += [(root / g / f"{choices[g]}.yaml", g + ".") for g in GROUPS[:5] if choices.get(g)]
    if kind:  # the search kind's own keys are described in its file, over the shared base's
        files.insert(1, (root / "search" / "kind" / f"{kind}.yaml", "search."))
    out: dict[str, str] = {}
    for path, prefix in files:
        if not path.is_file():
            continue
        stack: list[tuple[int, str]] = []
        for line in path.read_text().splitlines():
            m = re.match(r"^( *)([A-Za-z_]\w*):(.*)$", line)
            if not m:
                continue
            indent, key, rest = len(m.group(1)), m.group(2), m.group(3)
            stack = [(i, k) for i, k in stack if i < indent]
            dotted = prefix + ".".join([*(k for _, k in stack), key])
            stack.append((indent, key))
            comment = re.search(r"\s#\s*(.*)$", rest)
            if comment and not re.search(r"['\"]", rest[: comment.start()]):
                out[dotted] = comment.group(1)
    return out


def _gate_lines() -> list[str]:
    """Every gate: its conf file's parameters (the ones set) and its exit rule."""
    import yaml

    from sweep.config import config_dir
    from sweep.gates import GATES, LAYER_KEYS, PARAMS

    lines = []
    for spec in GATES:
        try:
            conf = yaml.safe_load((config_dir() / "gate" / f"{spec.name}.yaml").read_text()) or {}
        except (OSError, SweepError, yaml.YAMLError):
            conf = {}
        keys = [k for k in (*PARAMS, *LAYER_KEYS) if conf.get(k) is not None]
        params = " ".join(f"{k}={conf[k]}" for k in keys)
        lines.append(f"  {spec.name:<10}  {params:<28}  {spec.summary}")
    return lines
