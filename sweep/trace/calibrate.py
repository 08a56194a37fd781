"""Calibrated thresholds with a guarantee: Learn-then-Test (as CALM uses it).

On calibration prompts, each threshold's risk is the mean per-prompt disagreement with
full-depth greedy decoding, measured closed-loop. Thresholds are tested in a fixed
sequence from the most conservative: H_j "risk(lambda_j) > delta" is rejected when its
p-value is at most epsilon, and testing stops at the first threshold that is not. The last
rejected threshold has risk <= delta with probability at least 1 - epsilon (fixed-sequence
testing controls the family-wise error; prompts exchangeable). Held-out prompts then show
the risk actually observed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from sweep import progress
from sweep.config import Config
from sweep.errors import ConfigError
from sweep.gates import GATES

log = logging.getLogger("sweep.trace.calibrate")


def hoeffding_p(risk: float, n: int, delta: float) -> float:
    """Hoeffding's p-value for H: true risk > delta, from a mean of n losses in [0, 1]."""
    return 1.0 if risk >= delta else math.exp(-2.0 * n * (delta - risk) ** 2)


def hoeffding_bentkus_p(risk: float, n: int, delta: float) -> float:
    """The Hoeffding-Bentkus p-value (Bates et al. 2021): min(exp(-n h1(min(risk, delta), delta)),
    e * P(Binomial(n, delta) <= ceil(n * risk)))."""
    r = min(risk, delta)
    h1 = (r * math.log(r / delta) if r > 0 else 0.0) + ((1 - r) * math.log((1 - r) / (1 - delta)) if r < 1 else 0.0)
    hoeffding = math.exp(-n * h1)
    bentkus = math.e * binomial_cdf(math.ceil(n * risk - 1e-12), n, delta)
    return min(1.0, hoeffding, bentkus)


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), summed in log space (n up to many thousands)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    logs = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p)
        for i in range(k + 1)
    ]
    top = max(logs)
    return math.exp(top) * sum(math.exp(v - top) for v in logs)


PVALUES: dict[str, Callable[[float, int, float], float]] = {"hoeffding": hoeffding_p, "hb": hoeffding_bentkus_p}


def fixed_sequence(pvalues: Sequence[float], epsilon: float) -> int:
    """Index of the last hypothesis rejected in order (p <= epsilon) before the first that is
    not; -1 when the first is not."""
    last = -1
    for i, p in enumerate(pvalues):
        if p > epsilon:
            break
        last = i
    return last


def certifiable_risk(
    n: int, delta: float, epsilon: float, pvalue: Callable[[float, int, float], float]
) -> float | None:
    """The largest calibration risk (mean loss over n prompts) whose p-value is still <= epsilon,
    found by bisection (p-values grow with the risk); None when even a risk of 0 is not enough."""
    if pvalue(0.0, n, delta) > epsilon:
        return None
    lo, hi = 0.0, delta
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if pvalue(mid, n, delta) <= epsilon else (lo, mid)
    return lo


def ordered(gate_name: str, values: Sequence[float]) -> list[float]:
    """Thresholds from the most conservative (exits least) to the most aggressive."""
    spec = GATES.get(gate_name, key="gate")
    return sorted(set(values), key=lambda v: spec.aggressive * v)


@dataclass
class Calibration:
    gate: str
    threshold: str
    tested: list[float] = field(default_factory=list)
    risks: list[float] = field(default_factory=list)
    pvalues: list[float] = field(default_factory=list)
    exit_rates: list[float] = field(default_factory=list)  # on the calibration prompts, per threshold tested
    chosen: float | None = None
    holdout_risk: float | None = None
    holdout_exit_rate: float | None = None
    n_cal: int = 0
    n_holdout: int = 0
    seconds: float = 0.0
    # calibrate.heldout_prompts: the chosen threshold on another prompt distribution (its drift)
    drift_set: str | None = None
    drift_risk: float | None = None
    drift_exit_rate: float | None = None
    n_drift: int = 0


def split(items: list, fraction: float, seed: int) -> tuple[list, list]:
    """A seeded split of the prompts into calibration and held-out sets."""
    order = list(items)
    random.Random(seed).shuffle(order)
    cut = max(1, min(len(order) - 1, round(fraction * len(order))))
    return order[:cut], order[cut:]


def prepare(cfg: Config, session) -> tuple:
    """`sweep calibrate`'s ladder, model, gate (readouts loaded, disjoint from the prompts) and prompts from
    ``session`` (``sweep.bench.session``), split into calibration, held-out and drift sets; every check
    before any decoding: (values, lm, gate, prompts, cal, held, drift)."""
    from sweep.bench import command
    from sweep.config.search import check_ladder

    c = cfg.calibrate
    spec = GATES.get(cfg.gate.name, key="gate")
    ladder = c.grid if c.grid is not None else spec.ladder  # the gate spec's default ladder
    if ladder is None and spec.threshold is not None:  # (an example in the threshold's own domain, not another's)
        raise ConfigError(
            f"calibrate.grid: required for gate={spec.name}, which has no default ladder: gate.{spec.threshold} "
            f"values, each {spec.domain(spec.threshold).allowed}, as a list or range(start, stop, step=...)"
        )
    values = ordered(spec.name, check_ladder(ladder or "", spec.name))
    _check_prompt_sets(cfg)  # before the model loads
    lm, prepared, prompts = command.prepare(cfg, session)
    cal, held = split(prompts, c.split, cfg.seed)
    drift = _heldout_set(cfg, lm, prepared, prompts)
    _check_certifiable(cfg, len(cal), len(prompts))  # the last check: every other one said first, as before
    return values, lm, prepared, prompts, cal, held, drift


def _check_certifiable(cfg: Config, n_cal: int, n: int) -> None:
    """Before any decoding: ``n_cal`` calibration prompts can certify a threshold at all (a p-value at zero risk
    within calibrate.epsilon); else one line with how many would (the ladder's baselines and rungs cost minutes)."""
    c, pvalue = cfg.calibrate, PVALUES[cfg.calibrate.pvalue]
    if certifiable_risk(n_cal, c.delta, c.epsilon, pvalue) is not None:
        return
    need = next((m for m in range(n_cal + 1, 100_000) if pvalue(0.0, m, c.delta) <= c.epsilon), None)
    at_least = f"at least {need} are needed" if need is not None else "no number of prompts is enough"
    raise ConfigError(
        f"prompts.n: {n_cal} calibration prompts ({n} x calibrate.split={c.split:g}) certify no threshold at "
        f"calibrate.delta={c.delta:g}, calibrate.epsilon={c.epsilon:g} with {c.pvalue} p-values, even at zero "
        f"risk: {at_least}"
    )


def calibrate(cfg: Config, prepared: tuple) -> Calibration:
    """Learn-then-Test on the calibration prompts, checked on the held-out ones (and the drift set)."""
    from sweep.decode.engine import Engine
    from sweep.gates import make_gate

    values, lm, prepared, prompts, cal, held, drift = prepared
    c, spec = cfg.calibrate, GATES.get(cfg.gate.name, key="gate")
    n = cfg.bench.gen_tokens
    log.info("full-depth baselines: %d prompts x %d tokens", len(prompts) + len(drift), n)
    full = Engine(lm)
    baseline = {}
    with progress.phase("calibrate: full-depth baselines", len(prompts) + len(drift)):  # one step per prompt
        for p in [*prompts, *drift]:
            baseline[p.id] = full.generate(p.input_ids, n).tokens
            progress.step()
    pvalue = PVALUES[c.pvalue]
    result = Calibration(spec.name, spec.threshold, n_cal=len(cal), n_holdout=len(held))
    t0 = time.perf_counter()

    def risk(value: float, group) -> tuple[float, float]:
        shown = progress.start(f"calibrate: {spec.threshold}={value:g}", len(group))  # one step per prompt
        gate = make_gate(dataclasses.replace(cfg.gate, **{spec.threshold: value}), lm, prepared.readouts)
        engine = Engine(lm, gate, cfg.bench.kv_policy)
        losses, exits = [], []
        for p in group:
            gen = engine.generate(p.input_ids, n)
            shown.advance()
            losses.append(sum(a != b for a, b in zip(gen.tokens, baseline[p.id])) / n)
            exits += [e < lm.num_layers for e in gen.exit_layers]
        shown.close()
        return sum(losses) / len(losses), sum(exits) / len(exits)

    # the ladder: one step per threshold, until the first not rejected (fewer steps than planned then)
    ladder = progress.start("calibrate: ladder", len(values))
    for value in values:
        r, rate = risk(value, cal)
        p = pvalue(r, len(cal), c.delta)
        result.tested.append(float(value))
        result.risks.append(r)
        result.exit_rates.append(rate)
        result.pvalues.append(p)
        verdict = "(rejected: risk <= delta)" if p <= c.epsilon else "(stop)"
        ladder.advance(text=f"{spec.threshold}={value:g}: calibration risk {r:.4f}, p-value {p:.3g} {verdict}")
        if p > c.epsilon:
            break
    ladder.close()
    last = fixed_sequence(result.pvalues, c.epsilon)
    if last >= 0:
        result.chosen, chosen = result.tested[last], values[last]  # the value as tested: gate=fixed's layer an int
        result.holdout_risk, result.holdout_exit_rate = risk(chosen, held)
        if drift:
            result.drift_set, result.n_drift = c.heldout_prompts, len(drift)
            result.drift_risk, result.drift_exit_rate = risk(chosen, drift)
    result.seconds = time.perf_counter() - t0
    return result


def render(cfg: Config, prepared, result: Calibration, _written) -> tuple[list[str], int]:
    from sweep.textfit import fit_lines

    return [fit_lines(format_calibration(cfg, result))], 0


def run_calibrate(cfg: Config, session=None) -> Calibration:
    """`sweep calibrate` as a library call (``sweep.cli.verbs``' steps, in ``session``, default this
    process's; it writes nothing): Learn-then-Test on calibration prompts, checked on held-out ones."""
    from sweep.bench.session import process_session

    return calibrate(cfg, prepare(cfg, process_session() if session is None else session))


def _check_prompt_sets(cfg: Config) -> None:
    """What the prompt sets' ids decide, read before any model loads: at least 2 prompts to split, and a
    calibrate.heldout_prompts set that shares none of them."""
    from sweep.models.prompts import read_prompts

    ids = {pid for pid, *_ in read_prompts(cfg.prompts)}
    if len(ids) < 2:
        raise ConfigError("prompts.n: calibration needs at least 2 prompts (some to calibrate on, some held out)")

    if cfg.calibrate.heldout_prompts is not None:
        same = ids & {pid for pid, *_ in read_prompts(_heldout_prompts(cfg))}
        if same:
            raise ConfigError(
                f"calibrate.heldout_prompts={cfg.calibrate.heldout_prompts}: {len(same)} of its prompts are "
                f"calibration prompts ({sorted(same)[0]}, ...); name another set"
            )


def _heldout_prompts(cfg: Config):
    """The prompts config of calibrate.heldout_prompts: its first calibrate.heldout_n, with the set's own template
    setting."""
    from sweep.config import compose

    c = cfg.calibrate
    return dataclasses.replace(compose([f"prompts={c.heldout_prompts}"]).prompts, start=0, n=c.heldout_n)


def _heldout_set(cfg: Config, lm, gate, prompts: list) -> list:
    """calibrate.heldout_prompts: the first calibrate.heldout_n prompts of another set (chat or
    humaneval, with that set's template setting), disjoint from the calibration prompts and from
    the readouts' fitting prompts; [] when not asked for."""
    from sweep.models.prompts import read_prompts
    from sweep.models.workload import tokenize_for

    if cfg.calibrate.heldout_prompts is None:
        return []
    pc = _heldout_prompts(cfg)  # (disjoint from the calibration prompts: ``_check_prompt_sets``)
    drift = tokenize_for(lm, read_prompts(pc), pc, ("bench.gen_tokens", cfg.bench.gen_tokens))
    if gate.readouts is not None:
        from sweep.gates.readouts import check_disjoint

        check_disjoint(gate.readouts, drift, key="calibrate.heldout_prompts")
    return drift


def format_calibration(cfg: Config, r: Calibration) -> str:
    c = cfg.calibrate
    lines = [
        f"calibrate gate={r.gate} on {cfg.model.name}: {r.n_cal} calibration and {r.n_holdout} held-out prompts x "
        f"{cfg.bench.gen_tokens} tokens, kv_policy={cfg.bench.kv_policy}, {c.pvalue} p-values, delta={c.delta:g}, "
        f"epsilon={c.epsilon:g}",
        f"{'':>2}{r.threshold:>10}  {'risk (cal)':>11}  {'exit rate':>9}  {'p-value':>9}",
    ]
    lines += [
        f"{'':>2}{v:>10g}  {risk:>11.4f}  {rate:>9.3f}  {p:>9.3g}{'  <- chosen' if v == r.chosen else ''}"
        for v, risk, rate, p in zip(r.tested, r.risks, r.exit_rates, r.pvalues)
    ]
    bar = certifiable_risk(r.n_cal, c.delta, c.epsilon, PVALUES[c.pvalue])
    if bar is None:
        lines.append(
            f"with {r.n_cal} calibration prompts no threshold can be certified at delta={c.delta:g}, "
            f"epsilon={c.epsilon:g}, even at zero risk: use more prompts"
        )
    else:
        lines.append(
            f"with {r.n_cal} calibration prompts a threshold is certified when its calibration risk is <= {bar:.4f}"
        )
    if r.chosen is None:
        lines.append(
            f"no threshold certified: even the most conservative has p-value {r.pvalues[0]:.3g} > epsilon={c.epsilon:g}"
        )
    else:
        lines.append(
            f"chosen {r.threshold}={r.chosen:g}: disagreement risk <= {c.delta:g} with probability >= "
            f"{1 - c.epsilon:g} "
            f"(fixed-sequence Learn-then-Test; prompts exchangeable)"
        )
        if r.exit_rates[r.tested.index(r.chosen)] == 0:  # certified, and full depth's: say so, not only in a column
            lines.append(
                f"  {r.threshold}={r.chosen:g} exits at no token of the calibration prompts: what it certifies is full "
                "depth's; no threshold that exits was certified (a finer ladder or more prompts may find one)"
            )
        verdict = "holds" if r.holdout_risk <= c.delta else "EXCEEDED"
        lines.append(
            f"held-out check: observed disagreement {r.holdout_risk:.4f} on {r.n_holdout} prompts (exit rate "
            f"{r.holdout_exit_rate:.3f}): {verdict}"
        )
        if r.drift_risk is not None:
            drifted = "holds" if r.drift_risk <= c.delta else "EXCEEDED"
            lines.append(
                f"drift check on {r.drift_set} ({r.n_drift} prompts, another distribution): observed disagreement "
                f"{r.drift_risk:.4f} (exit rate {r.drift_exit_rate:.3f}), {r.drift_risk - r.holdout_risk:+.4f} "
                f"against the held-out prompts: {drifted}"
            )
    lines.append(f"calibration took {r.seconds:.1f} s")
    return "\n".join(lines)
