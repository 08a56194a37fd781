"""What an override that Hydra cannot compose means, in one line: an option a group lacks, a key no section has
(and, in ``search``, what the chosen kind takes), a comma list that is a sweep, a value that is not a path."""

from __future__ import annotations

import contextvars
import dataclasses
import re
import typing
from typing import Any

from sweep.config._schema import Config
from sweep.config.search_kinds import SEARCH_KINDS
from sweep.errors import ConfigError, SweepError
from sweep.gates import check_gate

_ASKING = contextvars.ContextVar("asking_the_search_kind", default=False)  # the kind's composition is under way


def missing_option(exc: Any) -> str:
    missing = getattr(exc, "missing_cfg_file", "") or ""
    options = getattr(exc, "options", None)
    group, _, option = missing.rpartition("/")
    if group and options:
        return f"{group}={option}: unknown option; allowed: {', '.join(sorted(options))}"
    return first_line(exc)


def first_line(exc: BaseException, cause: BaseException | None = None, overrides=(), compose=None) -> str:
    """What Hydra's ``exc`` (with its ``cause``) says of ``overrides``, in one line; ``compose`` (overrides -> the
    composed dict) finds the chosen search kind for a search key's error."""
    text = str(exc).strip()
    m = re.match(r"Ambiguous value for argument '([^'=]+)=(.*)'", text)
    if m:
        return _comma_list(m.group(1).lstrip("+"), m.group(2), overrides)
    m = re.search(r"Could not override '([^']+)'", text)
    if m:
        deeper = re.search(r"full_key: (\S+)", str(cause or ""))
        return _unknown_key(m.group(1), deeper.group(1) if deeper else m.group(1), overrides, compose)
    m = re.search(r"Could not append to config. An item is already at '([^']+)'", text)
    if m:
        return f"+{m.group(1)}: already set; drop the '+'"
    m = re.match(r"Error merging override (\S+)", text)
    if m and cause is not None:  # OmegaConf's reason is the cause's first line; its full_key names the part
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        part = re.search(r"full_key: (\S+)", str(cause))
        where = f"{part.group(1)}: {reason}" if part else reason
        return f"{m.group(1)}: cannot be set ({where}); {_LISTS}"
    first = _as_typed(text.splitlines()[0] if text else type(exc).__name__, overrides)
    if getattr(exc, "full_key", None) and "interpolation" in first.lower():
        return f"{exc.full_key}: cannot resolve its interpolation ({first})"
    if isinstance(exc, _override_parse_error()):
        bad = next((o for o in overrides if any(c in o for c in "\n\r\t\x00")), None)
        if bad is not None:  # a control character would cut this line: the override is shown escaped
            return f"cannot parse the override {bad!r}: it holds a control character (newline, tab, NUL)"
        bad = _unparsable(overrides)
        if bad is not None:
            return (
                f"cannot parse the overrides: {bad} ({first}); see Hydra's override grammar (a value holding '=', "
                "brackets or parentheses is quoted: key='a=b')"
            )
        return f"cannot parse the overrides ({first}); see Hydra's override grammar"
    m = re.search(r"Sweep parameters '([^'=]+)=(.*)' requires --multirun", first)
    if m:  # a sweep expression as a plain value: only quotes make it a string
        return f"{m.group(1)}={m.group(2)}: a sweep expression as a value must be quoted: {m.group(1)}='{m.group(2)}'"
    return first


def _as_typed(text: str, overrides) -> str:
    """``text`` with a gate key's ``++`` (``_gate_keys_settable``'s rewrite) given back as the user typed it."""
    for o in overrides:
        key = str(o).partition("=")[0]
        bare = key.lstrip("+")
        if not key.startswith("++") and f"++{bare}=" in text:
            text = text.replace(f"++{bare}=", f"{key}=")
    return text


def _unparsable(overrides) -> str | None:
    """The first of ``overrides`` Hydra's grammar cannot parse alone."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for o in overrides:
        try:
            parser.parse_overrides([str(o)])
        except Exception:  # noqa: BLE001 (Hydra raises its own kinds for a bad override)
            return str(o)
    return None


def _comma_list(key: str, value: str, overrides=()) -> str:
    """A comma list as a value (Hydra's multirun sweep): one line pointing to `sweep run search=...`
    with this key's sub-space as the example (naming the gate when the key is a gate parameter)."""
    from sweep.gates import GATES, LAYER_KEYS

    param = key.removeprefix("gate.")
    entries = [f"{key}: 'choice({value})'"]
    if key.startswith("gate.") and param != "name":
        chosen = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") in ("gate", "gate.name")]
        takes = [s.name for s in GATES if param in s.accepts]
        gate = chosen[-1] if chosen else (takes[0] if takes and param not in LAYER_KEYS else "saturation")
        entries.insert(0, f"gate: {gate}")
    space = "{" + ", ".join(entries) + "}"
    return (
        f"{key}={value}: a comma list is a sweep; sweeps are `sweep run search=...`, e.g. "
        f'sweep run "search.spaces=[{space}]" or a shipped search such as search=saturation-grid '
        f"(conf/search/)" + (f"; a list value is written {key}=[{value}]" if "." in key else "")
    )


def _unknown_key(key: str, missing: str, overrides=(), compose=None) -> str:
    """The error for override ``key`` when ``missing`` (Hydra's full_key: the first part of
    ``key`` not in the config, or a key inside a mapping ``key`` sets whole) does not exist:
    names both, and what is allowed where (in ``search``: what the chosen kind takes)."""
    if missing.startswith(key + "."):  # a mapping set whole (search.objectives={speed: max}): name the new key
        key = missing
    parent, _, leaf = missing.rpartition(".")
    kind, allowed = _section(parent)
    if parent == "search":  # the keys of the search's kind, which the composed search lacks: its kind's own only
        from sweep.config.search_kinds import foreign_key, own_keys

        chosen = _search_kind(overrides, compose) if compose is not None else None
        foreign = foreign_key(leaf, chosen)
        if foreign:
            return foreign
        allowed = own_keys(chosen) if chosen else allowed
    at = f" ({missing})" if missing != key else ""
    if kind == "mapping":  # a free mapping such as search.objectives: new keys need a '+'
        return f"{key}: not a key of {parent}{at}; add it with +{key}=VALUE"
    if kind == "value" or leaf in allowed:  # the path goes through a value, not a section
        value = parent if kind == "value" else missing
        return f"{key}: {value} is a value, not a section; set {value}=VALUE"
    where = f"in {parent}" if parent else "at the top level"
    if allowed:
        return f"{key}: unknown key {where}{at}; allowed: {', '.join(allowed)}"
    return f"{key}: unknown key{at}"


def _search_kind(overrides, compose) -> str | None:
    """The search kind ``overrides`` choose (``search=NAME``, ``search.kind=KIND``), composed without the overrides
    of the search's other keys, one of which failed; None when that does not compose either, or while it is being
    asked already (an error inside this composition names no kind: no second one)."""
    if _ASKING.get():
        return None

    def chooses_or_elsewhere(o) -> bool:  # search=NAME (a conf file, not a mapping set whole), search.kind, not search
        key, _, value = str(o).partition("=")
        key = key.lstrip("+~")
        if key == "search":
            return not value.lstrip().startswith("{")
        return key == "search.kind" or not key.startswith("search.")

    rest = [o for o in overrides if chooses_or_elsewhere(o)]
    token = _ASKING.set(True)
    try:
        kind = compose(rest).get("search", {}).get("kind")
    except SweepError:
        return None
    finally:
        _ASKING.reset(token)
    return kind if kind in {k.KIND for k in SEARCH_KINDS} else None


def _section(path: str) -> tuple[str, list[str]]:
    """What the config holds at dotted ``path`` ('' = top level): ("section", its field
    names), ("mapping", []) for a free mapping, ("value", []) for a leaf, ("", []) if unknown."""
    cls: Any = Config
    for part in [p for p in path.split(".") if p]:
        if not dataclasses.is_dataclass(cls):
            return "", []
        hints = {k: v for c in _kinds(cls) for k, v in typing.get_type_hints(c).items()}
        if part not in hints:
            return "", []
        args = [a for a in typing.get_args(hints[part]) if dataclasses.is_dataclass(a)]
        optional = [a for a in typing.get_args(hints[part]) if a is not type(None)]
        cls = args[0] if args else optional[0] if len(optional) == 1 else hints[part]
    if dataclasses.is_dataclass(cls):
        return "section", list(dict.fromkeys(f.name for c in _kinds(cls) for f in dataclasses.fields(c)))
    return ("mapping" if cls is dict else "value"), []


def _kinds(cls: Any) -> list:
    """A section's classes: the search's base and every kind's settings over it; any other section itself."""
    from sweep.config._schema import SearchConfig

    return [cls, *SEARCH_KINDS] if cls is SearchConfig else [cls]


def _override_parse_error() -> type:
    from hydra.errors import OverrideParseException

    return OverrideParseException


def unapplied(exc: BaseException, overrides) -> str:
    """An override OmegaConf could not apply, one line: a key that walks into a list by a name (``Index 'x' (str)
    is not an int``); named where its key holds the part named. (Hydra words the ``+``/``~`` forms and an index
    past a list's end as "Error merging override ...": ``first_line``.)"""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    part = re.search(r"'([^']*)'", text)
    named = [o for o in overrides if part and part.group(1) in str(o).partition("=")[0].lstrip("+~").split(".")]
    return f"{named[0] if named else 'an override'}: cannot be set ({text}); {_LISTS}"


_LISTS = (
    "a list's items are set by their index, or the list whole (search.spaces=[{gate: saturation, gate.eps: "
    "'choice(0.1,0.2)'}]); `sweep config` shows the keys"
)


def gate_said(exc: ConfigError, gate: Any) -> ConfigError:
    """A gate key's type or range error as the gate says it (``check_gate``: which gate takes the key, its
    narrower domain, that it requires it) where the gate's check names the same key; else ``exc``. A gate
    parameter's field allows the widest domain, "or null", since other gates leave it unset."""
    key = str(exc).split("=", 1)[0].split(":", 1)[0]
    if not key.startswith("gate.") or not isinstance(gate, dict):
        return exc
    try:
        check_gate(gate)
    except ConfigError as said:
        if str(said).split("=", 1)[0].split(":", 1)[0] == key:
            return said
    return exc
