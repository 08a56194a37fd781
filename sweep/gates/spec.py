"""What a gate is, as data: its parameters, their domains and units, and the one registration of each gate.

A gate module (``sweep/gates/_*.py``) declares each of its gates once, with ``@register(GateSpec(...))`` on
the class that decides: the spec says which ``GateConfig`` parameters the gate takes (required, optional),
each parameter's domain (the table's, or a narrower one for this gate) and unit, which parameter is its
threshold and which way it is aggressive, what its probe costs, which profile signal it compares, and its
one-line help. The registry ``GATES`` holds each spec with its class (``spec.cls``). The gate's conf file,
``conf/gate/<name>.yaml``, holds its own keys' defaults (Hydra's).

Everything that needs only the config is checked from here, in ``sweep.config.validate`` (search spaces
included) before any model loads or Ray starts; ``check_model`` is the one check against a loaded model
(layer indices against L, the pca gate's k against the hidden size). The gate columns of every results
table, and the one text form of a gate setting, derive from ``PARAMS``. Importing this package loads no
torch: the gate modules reach torch and the signals through ``lazy`` modules, imported when a gate decides.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

from sweep.errors import ConfigError
from sweep.gates.registry import Registry
from sweep.gates.skipset import GRAMMAR as SKIP_GRAMMAR


@dataclass(frozen=True)
class Domain:
    """Which values a parameter may take, and the phrase that says so in errors."""

    check: Callable[[Any], bool]
    allowed: str


@dataclass(frozen=True)
class ParamSpec:
    """A gate parameter: a ``GateConfig`` field, a column of every table that carries a gate."""

    name: str
    type: type  # int, float or str
    domain: Domain  # what any gate allows; a gate may narrow it (``GateSpec.domains``)
    unit: str  # as the results schema states it ("" when unitless; a gate may state its own)
    meaning: str


def _positive_int(bound: str = "") -> Domain:
    """An integer >= 1; ``bound`` names the upper bound that only the model knows."""
    return Domain(lambda v: _integer(v) and v >= 1, "an integer >= 1" + (f" and at most {bound}" if bound else ""))


def finite(check: Callable[[float], bool], allowed: str) -> Domain:
    """A float domain: a finite number (never inf or nan) that passes ``check``; ``allowed``
    says which (a bounded range already excludes inf, an open one says "(finite)")."""
    return Domain(lambda v: _number(v) and math.isfinite(v) and check(v), f"a number {allowed}")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _skip_set(v: Any) -> bool:
    return _skip_set_problem(v) is None


def _skip_set_problem(v: Any) -> str | None:
    """What the skip-set parser says is wrong with ``v``; None when it parses."""
    from sweep.gates.skipset import SkipSet

    try:
        SkipSet.parse(v)
    except ValueError as exc:
        return str(exc)
    return None


_skip_set.why = _skip_set_problem  # type: ignore[attr-defined]  (read by the config's field check)


PARAMS: dict[str, ParamSpec] = {
    p.name: p
    for p in (
        ParamSpec("exit_layer", int, _positive_int(), "layer", "fixed gate's exit layer (min_layer when unset)"),
        ParamSpec(
            "eps",
            float,
            finite(lambda v: v > 0, "> 0 (finite)"),
            "ratio",
            "threshold of saturation (delta), cosine (1 - cos) and pca (projection change)",
        ),
        ParamSpec(
            "theta",
            float,
            finite(lambda v: v >= 0, ">= 0 (finite)"),
            "per gate: logits | probability | nats",
            "threshold: margin gate in logits (top1 - top2 of z_l), softmax gate in probability (top-1 minus "
            "top-2 probability), entropy gate in nats",
        ),
        ParamSpec("q", float, finite(lambda v: 0 < v <= 1, "in (0, 1]"), "", "conformal gate's calibration quantile"),
        ParamSpec("k", int, _positive_int("the model's hidden size"), "directions", "pca gate's principal directions"),
        ParamSpec(
            "decay",
            float,
            finite(lambda v: v >= 0, ">= 0 (finite)"),
            "",
            "CALM's decaying-threshold tau (softmax, cosine gates); null when the threshold is fixed",
        ),
        ParamSpec(
            "skip",
            str,
            Domain(_skip_set, f"a skip set: {SKIP_GRAMMAR}"),
            "sublayers",
            "skip gate's draft: the sublayers bypassed through the residual, canonical text (a3+m3+a5-9: attention "
            "of layers 3 and 5..9, MLP of layer 3; none: the empty set)",
        ),
    )
}
# the gate setting columns of every table, in display order: the parameters, then the readout a gate
# takes its lens from when it is not the logit lens (``lens``: tuned; null = the logit lens)
GATE_COLUMNS: tuple[str, ...] = (*PARAMS, "lens")
LENSES = ("logit", "tuned")  # gate.lens: the model's own final norm + head, or a fitted translator first
# every gate takes these: min_layer (a layer index) or min_depth (a fraction of depth), resolved per model
LAYER_KEYS = ("min_layer", "min_depth")


@dataclass(frozen=True)
class GateSpec:
    name: str
    summary: str  # one line: the exit rule
    # none | hidden (norms of h, O(hidden)) | lens (final norm + lm_head) | pca (a k x hidden projection)
    # | classifier (final norm + a dot product with a fitted weight vector)
    probe: str
    signal: str | None  # the profile column the rule compares (None: no signal)
    params: tuple[str, ...] = ()  # parameters the gate requires (besides min_layer)
    optional: tuple[str, ...] = ()  # parameters it takes when set (null otherwise)
    threshold: str | None = None  # the swept parameter; None when there is none
    aggressive: int = 1  # +1: a larger threshold exits more often; -1: a smaller one does
    domains: Mapping[str, Domain] = field(default_factory=dict)  # narrower than PARAMS' for this gate
    units: Mapping[str, str] = field(default_factory=dict)  # a parameter's unit for this gate
    ladder: str | None = None  # the default calibration ladder (`sweep calibrate`), Hydra's sweep grammar
    lenses: tuple[str, ...] = ("logit",)  # gate.lens values it takes (a tuned lens needs `sweep fit`'s readouts)
    readouts: bool = False  # needs gate.readouts whatever its lens (the classifier)
    cls: type | None = field(default=None, compare=False, repr=False)  # the class that decides (``register``)

    @property
    def accepts(self) -> tuple[str, ...]:
        return self.params + self.optional

    def domain(self, param: str) -> Domain:
        return self.domains.get(param, PARAMS[param].domain)

    def unit(self, param: str) -> str:
        return self.units.get(param, PARAMS[param].unit)


GATES: Registry[GateSpec] = Registry("gate")
T = TypeVar("T", bound=type)


def register(spec: GateSpec) -> Callable[[T], T]:
    """The one registration of a gate: ``@register(GateSpec(...))`` on the class that decides. The class
    takes the spec's declarations (name, params, probe, threshold, aggressive), so the engine and the replay
    read the spec's values, never a second copy; ``GATES`` holds the spec with its class."""

    def bind(cls: T) -> T:
        bound = dataclasses.replace(spec, cls=cls)
        cls.spec, cls.name = bound, spec.name
        cls.params, cls.probe, cls.threshold, cls.aggressive = spec.params, spec.probe, spec.threshold, spec.aggressive
        GATES.register(bound)
        return cls

    return bind


class lazy:
    """A module imported at its first attribute read: the gate modules reach torch and the signals through
    these, so importing the gates (which every config check does) loads no torch."""

    def __init__(self, name: str) -> None:
        self.__dict__["_lazy_name"] = name

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self.__dict__["_lazy_name"])
        self.__dict__.update(vars(module))  # later reads are plain attribute reads
        return getattr(module, attr)


def check_value(spec: GateSpec, param: str, value: Any, key: str) -> None:
    """``value`` of ``param`` is in its domain for this gate; ``key`` names it in the error."""
    if param not in spec.accepts:
        lens = ("lens", "readouts") if "tuned" in spec.lenses else ("readouts",) if spec.readouts else ()
        takes = ", ".join((*spec.accepts, *LAYER_KEYS, *lens))
        raise ConfigError(f"{key}={value}: not a parameter of gate={spec.name} (it takes: {takes})")
    if value is None:
        if param in spec.params:
            raise ConfigError(f"{key}: required for gate={spec.name}")
        return
    domain = spec.domain(param)
    if not domain.check(value):  # each domain checks its type too (a bool is neither an int nor a float here)
        why = getattr(domain.check, "why", lambda _: None)(value)  # a check that can say what is wrong with it
        said = f" ({why})" if why else ""
        raise ConfigError(f"{key}={value}: must be {domain.allowed} for gate={spec.name}{said}")


def check_gate(gate: Any, prefix: str = "gate") -> GateSpec:
    """A gate config (``GateConfig`` or a mapping) against its spec: the gate exists, takes the
    parameters set, has the ones it requires, each in its domain. Needs no model."""
    get = gate.get if isinstance(gate, Mapping) else lambda k: getattr(gate, k, None)
    spec = GATES.get(get("name"), key=f"{prefix}.name")
    for param in PARAMS:
        value = get(param)
        if value is not None or param in spec.params:
            check_value(spec, param, value, f"{prefix}.{param}")
    lens, readouts = get("lens") or "logit", get("readouts")
    if lens not in spec.lenses:
        raise ConfigError(f"{prefix}.lens={lens}: gate={spec.name} takes {' or '.join(spec.lenses)}")
    if readouts is None and (lens == "tuned" or spec.readouts):
        why = f"gate={spec.name}" if spec.readouts else f"{prefix}.lens=tuned"
        raise ConfigError(f"{prefix}.readouts: required for {why} (the file `sweep fit` wrote)")
    if readouts is not None and lens != "tuned" and not spec.readouts:
        raise ConfigError(
            f"{prefix}.readouts={readouts}: only gate.lens=tuned and gate=classifier use readouts "
            f"(gate={spec.name}, lens={lens})"
        )
    return spec


@dataclass(frozen=True)
class Resolved:
    """A gate's layer indices on one model."""

    min_layer: int
    exit_layer: int | None  # the fixed gate's (from min_layer when unset); None for other gates


def resolve_min_layer(gate: Any, num_layers: int) -> int:
    """The first layer after which ``gate`` may exit on a model of ``num_layers`` layers.

    An explicit ``min_layer`` wins (a layer index, at most L); otherwise ``min_depth``, a
    fraction of depth: ``ceil(min_depth * L)``, at least 1 (the product rounded to 9 decimals
    first, so 0.28 of 25 layers, 7.000000000000001 in floats, is 7, not 8); with neither, 1. The gates' conf files set
    ``min_depth`` and leave ``min_layer`` null; composition keeps at most one of the two
    (``sweep.config``: the one a user sets wins over a conf file's)."""
    if gate.min_layer is not None:
        if not 1 <= gate.min_layer <= num_layers:
            raise ConfigError(
                f"gate.min_layer={gate.min_layer}: must be in 1..{num_layers} (L={num_layers} for this model)"
            )
        return gate.min_layer
    if gate.min_depth is not None:
        return max(1, math.ceil(round(gate.min_depth * num_layers, 9)))
    return 1


def check_model(gate: Any, num_layers: int, hidden_size: int | None = None) -> Resolved:
    """The one check of a gate config against a loaded model of ``num_layers`` layers (and
    ``hidden_size``, when known): min_layer resolved (``resolve_min_layer``), layer indices
    within L, the pca gate's k at most the hidden size."""
    spec = GATES.get(gate.name, key="gate.name")
    min_layer = resolve_min_layer(gate, num_layers)
    exit_layer = None
    if spec.name == "fixed":
        exit_layer = gate.exit_layer if gate.exit_layer is not None else min_layer
        if not min_layer <= exit_layer <= num_layers:
            raise ConfigError(
                f"gate.exit_layer={gate.exit_layer}: must be in {min_layer}..{num_layers} "
                f"(from gate.min_layer to L={num_layers} for this model)"
            )
    if spec.name == "skip":
        from sweep.gates.skipset import SkipSet

        if SkipSet.parse(gate.skip).max_layer > num_layers:
            raise ConfigError(
                f"gate.skip={gate.skip}: names layer {SkipSet.parse(gate.skip).max_layer}; layers are 1..{num_layers} "
                f"(L={num_layers} for this model)"
            )
    if hidden_size is not None:
        check_k(gate, hidden_size)
    return Resolved(min_layer, exit_layer)


def check_k(gate: Any, hidden_size: int, bound: str | None = None) -> None:
    """The pca gate's k against the model's hidden size, its real bound (known from a tiny
    model's config at compose, from the loaded model otherwise); ``bound`` says where it comes from."""
    spec = GATES.get(gate.name, key="gate.name")
    if "k" in spec.accepts and gate.k is not None and gate.k > hidden_size:
        bound = bound or f"the hidden size of this model, {hidden_size}"
        raise ConfigError(f"gate.k={gate.k}: must be an integer in 1..{hidden_size} (at most {bound})")


def setting_columns(gate: Any, resolved: Resolved | None = None) -> dict[str, Any]:
    """A gate setting as every results table carries it: each gate column (null where the gate
    does not take it) and min_layer; layer indices as ``resolved`` for a model when given (without
    it, min_layer is the config's, null when the setting gives min_depth: only a model resolves it)."""
    spec = GATES.get(gate.name, key="gate.name")
    columns = {p: (getattr(gate, p) if p in spec.accepts else None) for p in PARAMS}
    if columns.get("skip") is not None:
        from sweep.gates.skipset import canonical

        columns["skip"] = canonical(columns["skip"])
    lens = getattr(gate, "lens", None)
    columns["lens"] = lens if lens not in (None, "logit") else None
    columns["min_layer"] = gate.min_layer
    if resolved is not None:
        columns.update(exit_layer=resolved.exit_layer, min_layer=resolved.min_layer)
    return columns


def gate_text(values: Mapping[str, Any], *, with_min_layer: bool = True) -> str:
    """A gate setting's parameters as ``key=value`` text (the ones set), then min_layer: the one
    text form of a gate setting (rows, progress lines, reports, knee labels)."""
    keys = (*GATE_COLUMNS, "min_layer") if with_min_layer else GATE_COLUMNS
    return " ".join(f"{k}={_fmt(values[k])}" for k in keys if values.get(k) is not None)


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
