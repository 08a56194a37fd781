"""Gates: the exit rules, each declared once (``sweep.gates.spec.register`` on the class that decides).

Every module ``sweep/gates/_*.py`` is a gate module and is imported here, so a new gate is one module plus
its conf file (``conf/gate/<name>.yaml``). Importing this package loads no torch (``sweep.gates.spec.lazy``):
the config checks read the registry; ``sweep.gates.signals`` (every signal, once) and ``sweep.gates.readouts``
(fitted readouts) are torch modules of their own.
"""

import importlib
import pkgutil

from sweep.gates.base import FIRST, Decoding, Gate, make_gate
from sweep.gates.spec import (
    GATE_COLUMNS,
    GATES,
    LAYER_KEYS,
    LENSES,
    PARAMS,
    GateSpec,
    ParamSpec,
    Resolved,
    check_gate,
    check_k,
    check_model,
    check_value,
    gate_text,
    register,
    resolve_min_layer,
    setting_columns,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "FIRST",
    "GATES",
    "GATE_COLUMNS",
    "LAYER_KEYS",
    "LENSES",
    "PARAMS",
    "Decoding",
    "Gate",
    "GateSpec",
    "ParamSpec",
    "Resolved",
    "check_gate",
    "check_k",
    "check_model",
    "check_value",
    "gate_text",
    "make_gate",
    "register",
    "resolve_min_layer",
    "setting_columns",
]
