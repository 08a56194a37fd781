"""conf/ composed without Hydra, for a machine that has none (benchmarks/gpu_check.py).

    from plain_compose import plain_compose    (with benchmarks/ on the path)

A test checks that it equals Hydra's composition (``sweep.config.compose_dict``) for every setting
the GPU check runs; validate the result with ``sweep.config.validate(data, search=False)`` (the
search's sub-spaces need Hydra's grammar).
"""

from __future__ import annotations

import yaml

from sweep.config import GATE_BASE, config_dir


def plain_compose(overrides: list[str]) -> dict:
    """conf/ composed without Hydra: config.yaml's own keys, each group's option file (its defaults
    list, a ``group=option`` override replacing the option; the gate keys its file leaves out composed as
    ``GATE_BASE``), then ``key.path=value`` overrides read as YAML scalars. Enough for the GPU check's
    settings; what needs Hydra's own rules is refused: experiments, '+'/'~' overrides, and the gate's layer
    keys (whose precedence ``compose_dict`` applies)."""
    conf = config_dir()
    data = yaml.safe_load((conf / "config.yaml").read_text())
    choices = {}
    for entry in data.pop("defaults"):
        if entry != "_self_":
            choices.update(entry)
    pairs = [o.split("=", 1) for o in overrides]
    for key, value in pairs:
        if key[:1] in "+~" or key in ("experiment", "gate.min_layer", "gate.min_depth", "gate.exit_layer"):
            raise ValueError(f"{key}: plain_compose takes group=option and key.path=value overrides only")
        if key in choices:
            choices[key] = value
    kind = choices.pop("search/kind@search", None)
    for group, option in choices.items():
        if option is not None and group != "search":
            data[group] = yaml.safe_load((conf / group / f"{option}.yaml").read_text())
    if choices.get("search") is not None:  # the shared base, its kind's keys, then the search's own values
        own, kind = _search(conf, choices["search"], kind)
        data["search"] = {**data["search"], **_kind(conf, kind), **own}
    data["gate"] = {**GATE_BASE, **data["gate"]}  # a gate's file holds its own keys; the rest compose as these
    for key, value in pairs:
        if key not in choices:
            *path, leaf = key.split(".")
            node = data
            for part in path:
                node = node[part]
            if leaf not in node:
                raise KeyError(f"{key}: not a key of conf/")
            node[leaf] = yaml.safe_load(value)
    return data


def _entries(text: str) -> tuple[dict, list]:
    data = yaml.safe_load(text)
    return {k: v for k, v in data.items() if k != "defaults"}, data.get("defaults", [])


def _search(conf, option: str, kind: str | None) -> tuple[dict, str | None]:
    """A search file's own values over those it builds on (its defaults list), and the kind it names."""
    own, defaults = _entries((conf / "search" / f"{option}.yaml").read_text())
    merged: dict = {}
    for entry in defaults:
        if isinstance(entry, dict):  # override kind@_here_: KIND
            kind = next(iter(entry.values()))
        elif entry != "_self_":
            earlier, kind = _search(conf, entry, kind)
            merged.update(earlier)
    return {**merged, **own}, kind


def _kind(conf, kind: str) -> dict:
    """A kind's own keys over those of the kind it builds on (its defaults list)."""
    own, defaults = _entries((conf / "search" / "kind" / f"{kind}.yaml").read_text())
    merged: dict = {}
    for entry in defaults:
        if entry != "_self_":
            merged.update(_kind(conf, entry))
    return {**merged, **own}
