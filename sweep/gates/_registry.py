"""The gate classes, one per row of the gate-spec table.

``register`` binds a class to its spec (``sweep.config.gatespec.GATE_SPECS``, matched by name) and
copies the spec's declarations onto it (params, probe, threshold, aggressive), so the
engine and replay read the table's values, never a second copy.
"""

from __future__ import annotations

from typing import TypeVar

from sweep.config.gatespec import GATE_SPECS
from sweep.config.registry import Registry

T = TypeVar("T", bound=type)

GATES: Registry[type] = Registry("gate")


def register(cls: T) -> T:
    spec = GATE_SPECS.get(cls.name, key="gate")
    cls.spec = spec
    cls.params, cls.probe, cls.threshold, cls.aggressive = spec.params, spec.probe, spec.threshold, spec.aggressive
    return GATES.register(cls)
