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
    for group, option in choices.items():
        if option is not None:
            data[group] = yaml.safe_load((conf / group / f"{option}.yaml").read_text())
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
