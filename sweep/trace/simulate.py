"""Record once, evaluate many: replay every gate and threshold on a profile trace.

A profile trace holds, for every position and layer, every gate's signal. Replaying a
gate on it gives, per decision position, the layer where the gate would exit, whether the
exited top-1 equals the final one (teacher-forced agreement: the trace's context is the
full-depth one, so closed-loop errors that cascade through the cache are not seen), the
probes it would run, and the speedup the cost model predicts. A whole grid of thresholds
is one tensor pass per gate, chunked over thresholds.

Decision positions are the ones where a generation picks a token: each prompt's last
prefill position (the first generated token) and its decode positions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import torch

from sweep import progress
from sweep.config import GateConfig
from sweep.bench.costs import CostModel
from sweep.errors import ConfigError
from sweep.gates import GATES, Gate, make_gate

CHUNK = 256  # thresholds per tensor pass: (CHUNK, T, L) booleans at a time
# traced with profile.readouts: the tuned lens's signals and the exit classifiers' probabilities
READOUT_SIGNALS = ("tuned_margin", "tuned_prob_margin", "tuned_entropy", "classifier_prob", "tuned_classifier_prob")


@dataclass
class Signals:
    """Per decision position t and layer l (index l-1): the signals of a profile trace."""

    delta: torch.Tensor  # (T, L) saturation delta
    margin: torch.Tensor  # (T, L) gamma_l
    match: torch.Tensor  # (T, L) top1 of z_l == final top1
    prompt_index: torch.Tensor  # (T,) which prompt each position belongs to
    token_index: torch.Tensor  # (T,) 0 for a prompt's first generated token, then 1, 2, ...
    prefill_residual: list[torch.Tensor]  # per prompt, (P_i, L) sup-norm residuals of its prefill positions
    prompt_ids: list[str]
    gen_tokens: int = 1  # tokens generated per prompt (N of CALM's decaying schedule)
    extra: dict = field(
        default_factory=dict
    )  # (T, L) signals newer traces carry: prob_margin, entropy, cos_prev, pca_delta
    pca_k: int | None = None
    tuned_residual: list[torch.Tensor] = field(default_factory=list)  # the tuned lens's prefill residuals

    def need(self, name: str) -> torch.Tensor:
        """A signal a gate replays; traces written before it existed say so."""
        if name not in self.extra:
            raise ConfigError(
                f"the profile trace has no '{name}' column (written before that signal existed); re-run `sweep profile`"
            )
        return self.extra[name]

    def for_lens(self, lens: str) -> Signals:
        """The signals as a gate reading ``lens`` sees them: for the tuned lens its margin, match,
        probabilities, prefill residuals and classifier (traced with ``profile.readouts``)."""
        if lens != "tuned":  # logit, or null (a gate built in code)
            return self
        if "tuned_margin" not in self.extra:
            raise ConfigError(
                "the profile trace has no tuned-lens columns: trace it with profile.readouts=<`sweep fit`'s file>"
            )
        extra = dict(self.extra)
        for name in ("prob_margin", "entropy", "classifier_prob"):
            if f"tuned_{name}" in extra:
                extra[name] = extra[f"tuned_{name}"]
        return dataclasses.replace(
            self,
            margin=self.extra["tuned_margin"],
            match=self.extra["tuned_match"].bool(),
            prefill_residual=self.tuned_residual,
            extra=extra,
        )

    @property
    def num_layers(self) -> int:
        return self.delta.shape[1]

    @property
    def positions(self) -> int:
        return self.delta.shape[0]


def signals_from_trace(trace: pl.DataFrame | pl.LazyFrame) -> Signals:
    """Signals of one model's trace (one or more prompts of one run) as tensors."""
    frame = trace.lazy().sort("prompt_id", "position", "layer").collect()
    if frame.height == 0:
        raise ValueError("empty trace")
    if frame["model"].n_unique() != 1 or frame["run_id"].n_unique() != 1:
        raise ValueError("signals_from_trace needs the trace of one model from one run")
    L = int(frame["num_layers"][0])
    last_prefill = (
        frame.filter(pl.col("phase") == "prefill").group_by("prompt_id").agg(pl.col("position").max().alias("_last"))
    )
    decide = frame.join(last_prefill, on="prompt_id").filter(
        (pl.col("phase") == "decode") | (pl.col("position") == pl.col("_last"))
    )
    decide = decide.sort("prompt_id", "position", "layer")
    prompt_ids = decide["prompt_id"].unique(maintain_order=True).to_list()
    index = {p: i for i, p in enumerate(prompt_ids)}

    def grid(col: str, dtype=torch.float32) -> torch.Tensor:
        return torch.tensor(decide[col].to_numpy().reshape(-1, L), dtype=dtype)

    per_position = decide.filter(pl.col("layer") == 1)
    prompt_of = np.array([index[p] for p in per_position["prompt_id"].to_list()])
    token = per_position.with_columns(_t=pl.col("position").rank("ordinal").over("prompt_id") - 1)["_t"].to_numpy()
    prefill = frame.filter(pl.col("phase") == "prefill")
    residual = [
        torch.tensor(
            prefill.filter(pl.col("prompt_id") == p)["residual_inf"].to_numpy().reshape(-1, L), dtype=torch.float32
        )
        for p in prompt_ids
    ]
    extra = {
        c: grid(c)
        for c in (*READOUT_SIGNALS, "prob_margin", "entropy", "cos_prev", "pca_delta")
        if c in decide.columns and decide[c].null_count() == 0
    }
    tuned_residual = []
    if "tuned_margin" in extra:
        extra["tuned_match"] = grid("tuned_match", torch.bool)
        tuned_residual = [
            torch.tensor(
                prefill.filter(pl.col("prompt_id") == p)["tuned_residual_inf"].to_numpy().reshape(-1, L),
                dtype=torch.float32,
            )
            for p in prompt_ids
        ]
    pca_k = int(decide["pca_k"][0]) if "pca_delta" in extra else None
    return Signals(
        gen_tokens=int(token.max()) + 1,
        extra=extra,
        pca_k=pca_k,
        delta=grid("delta"),
        margin=grid("margin"),
        match=grid("top1_match", torch.bool),
        prompt_index=torch.tensor(prompt_of, dtype=torch.long),
        token_index=torch.tensor(token, dtype=torch.long),
        prefill_residual=residual,
        prompt_ids=prompt_ids,
        tuned_residual=tuned_residual,
    )


def exit_layers(
    gate_cls: type[Gate], signals: Signals, values: torch.Tensor, min_layer: int, decay: float | None = None
) -> torch.Tensor:
    """(K, T) exit layers (L = no exit) of a gate for each threshold value (float64, as the
    config holds them: a float32 tensor would round them before the gate's own comparison).

    The gate decides after layers min_layer..L-1, as the engine's hooks do; the first layer
    where it says exit is the exit layer.
    """
    L = signals.num_layers
    out = []
    for start in range(0, len(values), CHUNK):
        mask = gate_cls.decisions(signals, values[start : start + CHUNK], decay).clone()
        mask[..., : min_layer - 1] = False
        mask[..., L - 1 :] = False
        first = mask.to(torch.uint8).argmax(dim=-1) + 1
        out.append(torch.where(mask.any(dim=-1), first, torch.full_like(first, L)))
    return torch.cat(out) if out else torch.empty((0, signals.positions), dtype=torch.long)


def simulate(
    gate_cfgs: list[GateConfig], signals: Signals, costs: CostModel | None, kv_policy: str = "propagate"
) -> pl.DataFrame:
    """One row per gate setting: teacher-forced agreement, exit statistics and the speedup the
    cost model predicts (on decode steps, as the bench times them). Settings are grouped by
    gate and everything but the threshold, and each group is one vectorised pass."""
    L = signals.num_layers
    groups: dict[tuple, list[int]] = {}
    for i, g in enumerate(gate_cfgs):
        cls = GATES.get(g.name, key="gate").cls
        rest = tuple((k, v) for k, v in vars(g).items() if k != cls.threshold)
        groups.setdefault((g.name, rest), []).append(i)
    rows: list[dict | None] = [None] * len(gate_cfgs)
    decode = signals.token_index > 0
    shown = progress.start("replay", len(groups), part="replay")  # one step per group of settings
    for (name, _), members in groups.items():
        cls = GATES.get(name, key="gate").cls
        gates = [make_gate(gate_cfgs[i], L) for i in members]
        values = torch.tensor(
            [threshold_value(g) for g in gates], dtype=torch.float64
        )  # as the engine's gates read them
        if cls.name == "pca" and gates[0].cfg.k != signals.pca_k:
            raise ConfigError(
                f"gate.k={gates[0].cfg.k}: the trace's pca signal has k={signals.pca_k} (profile.pca_k); replay at "
                f"that k"
            )
        seen = signals.for_lens(gates[0].cfg.lens)
        # a fixed gate's only probe layer is its threshold, so its min_layer does not mask anything
        exits = exit_layers(cls, seen, values, 1 if cls.name == "fixed" else gates[0].min_layer, gates[0].cfg.decay)
        metrics = _metrics(gates, exits, seen, costs, kv_policy, decode)
        for j, i in enumerate(members):
            rows[i] = metrics[j]
        shown.advance()
    shown.close()
    return pl.DataFrame(rows, infer_schema_length=None)


def threshold_value(gate: Gate) -> float:
    """The gate's threshold as resolved for the model (a fixed gate's exit_layer may come from min_layer)."""
    if gate.threshold is None:
        return 0.0
    value = getattr(gate, gate.threshold, None)
    return float(value if value is not None else getattr(gate.cfg, gate.threshold))


def probes_at(gate: Gate, exits: torch.Tensor) -> torch.Tensor:
    """Probes a gate runs before stopping at each exit layer: its probe layers up to the exit."""
    probe = gate.probe_layers()
    if not len(probe):
        return torch.zeros_like(exits)
    return (torch.clamp(torch.minimum(exits, torch.tensor(probe.stop - 1)) - probe.start + 1, min=0)).clamp(
        max=len(probe)
    )


def _metrics(
    gates: list[Gate], exits: torch.Tensor, signals: Signals, costs: CostModel | None, kv_policy: str, decode
) -> list[dict]:
    L = signals.num_layers
    agree = signals.match.gather(1, (exits - 1).T).T.float()  # (K, T): exited top-1 == final top-1
    rows = []
    for j, gate in enumerate(gates):
        e = exits[j]
        row = {
            "gate": gate.name,
            **gate.values(),
            "agreement_tf": float(agree[j].mean()),
            "exit_rate": float((e < L).float().mean()),
            "mean_exit_layer": float(e.float().mean()),
            "speedup_model": None,
        }
        if costs is not None and bool(decode.any()):
            steps = e[decode]
            predicted = costs.token_ms(
                gate, steps.to(torch.float64), probes_at(gate, steps).to(torch.float64), kv_policy
            )
            row["speedup_model"] = float(costs.step_ms * len(steps) / predicted.sum())
        rows.append(row)
    return rows
