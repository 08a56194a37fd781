"""Reuse within a sweep worker: one reference and self-check per key, every trial still checked."""

from __future__ import annotations

import contextlib
import time

import pytest
import torch

from conftest import compose
from sweep.bench.command import prepare
from sweep.bench.protocol import PhaseEvent, run_trial
from sweep.bench.reuse import ReferenceKey, ReuseCache

FAST = ["bench.gen_tokens=6", "bench.repeats=2", "bench.warmup=1", "prompts.n=2"]


def cfg_of(*overrides):
    return compose("model=tiny-llama", *FAST, *overrides)


class SelfChecks:
    """Counts the determinism self-checks that really run, from the protocol's public events (a trial's
    reference phase, one event per unit); pass it as ``on_event``."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, event: PhaseEvent) -> None:
        self.n += event.phase == "reference" and event.unit == 0


@pytest.fixture
def counted():
    return SelfChecks()


@contextlib.contextmanager
def noisy_layer(lm, *, scale: float = 3.0, seed: int = 0):
    """Layer 0 adds seeded random noise on every call: the same model, now nondeterministic."""
    gen = torch.Generator().manual_seed(seed)

    def noise(_module, _args, output):
        if isinstance(output, tuple):
            return (output[0] + scale * torch.randn(output[0].shape, generator=gen), *output[1:])
        return output + scale * torch.randn(output.shape, generator=gen)

    handle = lm.adapter.layers[0].register_forward_hook(noise)
    try:
        yield
    finally:
        handle.remove()


def test_a_workers_second_trial_reuses_the_reference(counted):
    cache = ReuseCache()
    first_cfg = cfg_of("gate=saturation", "gate.eps=0.3", "gate.min_layer=1")
    second_cfg = cfg_of("gate=fixed", "gate.exit_layer=2")
    lm, gate, prompts = prepare(first_cfg)
    first = run_trial(first_cfg, lm, gate, prompts, references=cache, on_event=counted)
    assert counted.n == 1 and cache.counts["self_checks"] == 1
    lm2, gate2, prompts2 = prepare(second_cfg)
    assert lm2 is lm
    second = run_trial(second_cfg, lm2, gate2, prompts2, references=cache, on_event=counted)
    assert counted.n == 1 and cache.counts["self_checks"] == 1  # no second determinism check ran
    assert cache.counts["reused"] == 1
    assert first["status"] == second["status"] == "ok"
    assert first["reference_reused"] is False and second["reference_reused"] is True
    assert first["reference_id"] == second["reference_id"]
    assert second["determinism_max_logit_diff"] == first["determinism_max_logit_diff"] == 0.0
    # the figures of a reused reference are the ones a fresh trial finds (decoding is deterministic)
    fresh = run_trial(second_cfg, lm2, gate2, prompts2, on_event=counted)
    assert counted.n == 2 and fresh["reference_reused"] is False and fresh["reference_id"] != first["reference_id"]
    for col in ("agreement", "prefix_agreement", "exit_rate", "mean_exit_layer", "prompt_agreement"):
        assert second[col] == fresh[col]
    # every trial still times its own baseline, interleaved with its gated run
    assert len(second["round_baseline_ms"]) == 2 and len(second["round_ms"]) == 2


def test_warmup_runs_once_per_key_and_gate_kind():
    cache = ReuseCache()
    for eps in (0.3, 0.2):
        cfg = cfg_of("gate=saturation", f"gate.eps={eps}", "gate.min_layer=1")
        run_trial(cfg, *prepare(cfg), references=cache)
    assert cache.counts["warmups"] == 2  # the baseline's and the saturation gate's, once
    cfg = cfg_of("gate=margin", "gate.theta=2.0", "gate.min_layer=1")
    run_trial(cfg, *prepare(cfg), references=cache)
    assert cache.counts["warmups"] == 3  # another probe: its gated side warms up once


def test_a_layer_turned_nondeterministic_after_the_reference_is_caught(counted):
    cache = ReuseCache()
    cfg = cfg_of("gate=fixed", "gate.exit_layer=3")
    lm, gate, prompts = prepare(cfg)
    first = run_trial(cfg, lm, gate, prompts, references=cache, on_event=counted)
    assert first["status"] == "ok"
    with noisy_layer(lm):
        second = run_trial(cfg, lm, gate, prompts, references=cache, on_event=counted)
    assert second["reference_reused"] is True and counted.n == 1  # no self-check ran: the timed repeats caught it
    assert second["status"] == "nondeterministic" and second["deterministic"] is False
    assert cache.counts["dropped"] == 1  # the next trial re-runs the self-check
    third = run_trial(cfg, lm, gate, prompts, references=cache, on_event=counted)
    assert third["reference_reused"] is False and counted.n == 2 and third["status"] == "ok"
    assert third["reference_id"] != first["reference_id"]


def test_a_nondeterministic_first_trial_keeps_no_reference():
    cache = ReuseCache()
    cfg = cfg_of("gate=full")
    lm, gate, prompts = prepare(cfg)
    with noisy_layer(lm):
        row = run_trial(cfg, lm, gate, prompts, references=cache)
    assert row["status"] == "nondeterministic" and row["determinism_max_logit_diff"] > 0
    assert not cache.references
    clean = run_trial(cfg, lm, gate, prompts, references=cache)
    assert clean["status"] == "ok" and clean["reference_reused"] is False


@pytest.mark.parametrize(
    "change",
    [
        ["model=tiny-qwen2"],  # another model
        ["seed=1"],  # a tiny model's seed: other weights
        ["prompts.n=3"],  # other prompts
        ["prompts.name=humaneval"],
        ["dtype=bfloat16"],
        ["bench.gen_tokens=5"],
        ["bench.batch_size=2"],
    ],
)
def test_reuse_never_crosses_keys(counted, change):
    cache = ReuseCache()
    base = cfg_of("gate=fixed", "gate.exit_layer=2")
    first = run_trial(base, *prepare(base), references=cache, on_event=counted)
    other = cfg_of("gate=fixed", "gate.exit_layer=2", *change)
    second = run_trial(other, *prepare(other), references=cache, on_event=counted)
    assert counted.n == 2 and cache.counts["reused"] == 0
    assert second["reference_reused"] is False and second["reference_id"] != first["reference_id"]
    assert second["reference_id"].split("-")[0] != first["reference_id"].split("-")[0]  # another key
    # and the first key's reference is still there for its own trials
    again = run_trial(base, *prepare(base), references=cache, on_event=counted)
    assert again["reference_reused"] is True and again["reference_id"] == first["reference_id"]


def test_every_field_of_the_key_separates():
    class LM:
        content_hash, dtype, device = "abc", torch.float32, torch.device("cpu")

    class P:
        def __init__(self, id, ids):
            self.id, self.input_ids = id, ids

    def key(lm=LM, prompts=(P("a", (1, 2)),), **kw):
        return ReferenceKey.of(lm, list(prompts), **{"gen_tokens": 4, "seed": 0, "batch_size": 1, **kw})

    base = key()
    assert key() == base and key().digest() == base.digest()
    others = [
        key(lm=type("L", (LM,), {"content_hash": "abd"})),
        key(lm=type("L", (LM,), {"dtype": torch.bfloat16})),
        key(lm=type("L", (LM,), {"device": torch.device("cuda", 0)})),
        key(prompts=(P("b", (1, 2)),)),
        key(prompts=(P("a", (1, 3)),)),
        key(prompts=(P("a", (1, 2)), P("b", (3,)))),
        key(gen_tokens=5),
        key(seed=1),
        key(batch_size=2),
    ]
    assert len({base, *others}) == len(others) + 1
    assert len({k.digest() for k in [base, *others]}) == len(others) + 1


def test_sweep_bench_takes_its_own_reference():
    cfg = cfg_of("gate=full")
    lm, gate, prompts = prepare(cfg)
    a, b = run_trial(cfg, lm, gate, prompts), run_trial(cfg, lm, gate, prompts)
    assert a["reference_reused"] is b["reference_reused"] is False and a["reference_id"] != b["reference_id"]


def test_worker_rows_reuse_unless_disabled():
    from sweep.bench.session import process_session
    from sweep.orchestrate.worker import trial_rows

    session = process_session()  # the worker's: its trials share it
    session.references.clear()
    assert session.reference_source(cfg_of()) is session.references
    rows = [trial_rows([cfg_of("gate=fixed", f"gate.exit_layer={k}")], "run", "s", time.perf_counter()) for k in (1, 2)]
    rows = [row for (row,) in rows]
    assert [r["reference_reused"] for r in rows] == [False, True] and rows[0]["reference_id"] == rows[1]["reference_id"]
    assert all(r["status"] == "ok" and r["reference_source"] == "cached" for r in rows)
    off = cfg_of("gate=fixed", "gate.exit_layer=3", "sweep.reuse=false")
    assert session.reference_source(off) is None
    (row,) = trial_rows([off], "run", "s", time.perf_counter())
    assert row["reference_reused"] is False and row["reference_id"] != rows[0]["reference_id"]
    assert row["reference_source"] == "fresh"
    assert rows[0]["worker_model_loads"] == row["worker_model_loads"]  # one model for all three trials
    session.references.clear()


def test_settings_share_one_baseline_per_round(counted):
    """Item 3 of issue 14: several settings against one baseline timed in the same rounds, each
    its own row with the figures a one-setting trial finds."""
    from sweep.bench.protocol import run_trials

    cfgs = [cfg_of("gate=fixed", f"gate.exit_layer={k}") for k in (1, 2)]
    cfgs.append(cfg_of("gate=saturation", "gate.eps=0.3", "gate.min_layer=1", "bench.kv_policy=full"))
    prepared = [prepare(c) for c in cfgs]
    lm, prompts = prepared[0][0], prepared[0][2]
    rows = run_trials(cfgs, lm, [p[1] for p in prepared], prompts, on_event=counted)
    assert counted.n == 1  # one self-check for the group
    assert [r["status"] for r in rows] == ["ok"] * 3 and len({r["reference_id"] for r in rows}) == 1
    assert rows[0]["round_baseline_ms"] == rows[1]["round_baseline_ms"] == rows[2]["round_baseline_ms"]
    assert rows[0]["round_ms"] != rows[1]["round_ms"]
    for cfg, p, row in zip(cfgs, prepared, rows):
        alone = run_trial(cfg, *p, on_event=counted)
        assert row["trial_id"] == alone["trial_id"] and row["kv_policy"] == alone["kv_policy"]
        for col in ("agreement", "prompt_agreement", "exit_rate", "mean_exit_layer", "speedup_model"):
            assert row[col] == pytest.approx(alone[col]) if col == "speedup_model" else row[col] == alone[col]
    with pytest.raises(ValueError, match="must share"):
        run_trials(
            [cfgs[0], cfg_of("gate=full", "bench.gen_tokens=5")],
            lm,
            [p[1] for p in prepared[:2]],
            prompts,
            on_event=counted,
        )


def test_a_drifting_setting_is_caught_in_a_shared_group():
    from sweep.bench.protocol import run_trials

    cache = ReuseCache()
    cfgs = [cfg_of("gate=fixed", f"gate.exit_layer={k}") for k in (1, 3)]
    prepared = [prepare(c) for c in cfgs]
    lm, prompts = prepared[0][0], prepared[0][2]
    run_trial(cfgs[0], *prepared[0], references=cache)  # takes the reference
    with noisy_layer(lm):
        rows = run_trials(cfgs, lm, [p[1] for p in prepared], prompts, references=cache)
    assert all(r["reference_reused"] for r in rows) and all(r["status"] == "nondeterministic" for r in rows)
    assert cache.counts["dropped"] == 1


def test_worker_rows_of_a_shared_group():
    from sweep.bench.session import process_session
    from sweep.orchestrate.worker import trial_rows

    process_session().references.clear()
    cfgs = [cfg_of("gate=fixed", f"gate.exit_layer={k}") for k in (1, 2)]
    t0 = time.perf_counter()
    rows = trial_rows(cfgs, "run", "s", t0)
    elapsed = time.perf_counter() - t0
    assert [r["status"] for r in rows] == ["ok", "ok"] and rows[0]["exit_layer"] == 1 and rows[1]["exit_layer"] == 2
    # the group's worker-side time: each row its bench_seconds plus an even share of the rest; together the
    # worker's span from t0, which lies inside the span the test saw
    assert all(r["trial_seconds"] > r["bench_seconds"] for r in rows)
    assert sum(r["bench_seconds"] for r in rows) < sum(r["trial_seconds"] for r in rows) <= elapsed
    assert rows[0]["trial_seconds"] - rows[0]["bench_seconds"] == pytest.approx(
        rows[1]["trial_seconds"] - rows[1]["bench_seconds"]
    )
    assert rows[0]["model_hash"] == rows[1]["model_hash"] and rows[0]["worker_pid"] == rows[1]["worker_pid"]
    bad = trial_rows([cfgs[0], cfg_of("gate=fixed", "gate.exit_layer=2", "bench.gen_tokens=5")], "run", "s", 0.0)
    assert [r["status"] for r in bad] == ["failed", "failed"] and "must share" in bad[0]["error"]
    process_session().references.clear()


def test_self_speculative_trials_reuse_too():
    cache = ReuseCache()
    cfg = cfg_of("bench.mode=self_speculative", "gate=fixed", "gate.exit_layer=2", "bench.draft_len=2")
    lm, gate, prompts = prepare(cfg)
    first, second = (run_trial(cfg, lm, gate, prompts, references=cache) for _ in range(2))
    alone = run_trial(cfg, lm, gate, prompts)
    assert second["reference_reused"] and first["status"] == second["status"] == "ok"
    for col in ("acceptance_rate", "mean_accepted_length", "tokens_per_verification", "agreement"):
        assert first[col] == second[col] == alone[col]


def _timed_seconds(row) -> float:
    """A row's own timed rounds from its round_* columns (ms): its gated runs and an even share of
    the baseline's and the A/A control's (shared by ``baseline_shared`` settings)."""

    def total(col):
        return sum(v for unit in row[col] for v in unit) / 1000

    shared = ("round_baseline_ms", "round_baseline_prefill_ms", "round_aa_ms", "round_aa_prefill_ms")
    base = sum(total(col) for col in shared) / row["baseline_shared"]
    return base + total("round_ms") + total("round_prefill_ms")


def test_a_shared_group_apportions_its_time_by_each_settings_timed_rounds():
    """Every row of a group reads the group's bench / timed ratio (an even split made a fast setting
    look dear and a slow one cheap), and the rows' seconds add up to the group's wall time."""
    from sweep.bench.protocol import run_trials

    cfgs = [cfg_of("gate=fixed", "gate.exit_layer=1"), cfg_of("gate=full"), cfg_of("gate=fixed", "gate.exit_layer=2")]
    prepared = [prepare(c) for c in cfgs]
    lm, prompts = prepared[0][0], prepared[0][2]
    t0 = time.perf_counter()
    rows = run_trials(cfgs, lm, [p[1] for p in prepared], prompts, references=ReuseCache())
    wall = time.perf_counter() - t0
    ratios = [r["bench_seconds"] / _timed_seconds(r) for r in rows]
    assert ratios == pytest.approx([ratios[0]] * 3, rel=1e-6)
    assert len({round(r["bench_seconds"], 9) for r in rows}) == 3  # not an even split
    # the group's bench time, apportioned: it holds every row's timed rounds and lies inside the call's span
    assert sum(_timed_seconds(r) for r in rows) <= sum(r["bench_seconds"] for r in rows) <= wall
    # the group's setup (its self-check, warm-up, cost model) apportioned the same way
    setups = [r["setup_seconds"] / r["bench_seconds"] for r in rows]
    assert setups == pytest.approx([setups[0]] * 3, rel=1e-6) and 0 < setups[0] < 1


def test_setup_seconds_is_the_work_a_reusing_trial_no_longer_does():
    cache = ReuseCache()
    cfgs = [cfg_of("gate=fixed", f"gate.exit_layer={k}") for k in (1, 2)]
    prepared = [prepare(c) for c in cfgs]
    events: list[list[PhaseEvent]] = [[], []]
    first = run_trial(cfgs[0], *prepared[0], references=cache, on_event=events[0].append)
    second = run_trial(cfgs[1], *prepared[1], references=cache, on_event=events[1].append)
    assert second["reference_reused"] and not first["reference_reused"]
    # the first took the determinism self-check; the second reused its references and only built its engines
    assert [e.phase for e in events[0]].count("reference") > 0
    assert [e.phase for e in events[1]].count("reference") == 0
    assert first["setup_seconds"] > 0
    for row in (first, second):
        assert 0 <= row["setup_seconds"] < row["bench_seconds"]
        # what is not setup is the timed rounds (and the row's metrics)
        assert row["bench_seconds"] - row["setup_seconds"] >= _timed_seconds(row)


@pytest.fixture
def before_timing():
    """What a trial runs before its timed rounds, in order, from the protocol's public events: untimed
    baseline warm-up runs ("baseline"), the self-check of each unit ("self-check": its two recorded
    baselines), gated warm-up runs ("gated") and the cost model. Pass ``seen.append``-like ``on_event``."""
    seen: list[str] = []
    tags = {"reference": "self-check", "cost model": "cost model", "round": "timed"}

    def on_event(event: PhaseEvent) -> None:
        seen.append(event.side if event.phase == "warm-up" else tags[event.phase])

    def before() -> list[str]:
        return seen[: seen.index("timed")]

    return seen, before, on_event


@pytest.mark.parametrize("warmup", [1, 3])
def test_the_self_checks_runs_warm_the_baseline_after_the_cost_model(before_timing, warmup):
    """The self-check's untimed baselines count as the baseline's warm-up (only what bench.warmup asks
    beyond them runs) and lead into the timed rounds; the cost model is measured after the warm-ups,
    before the self-check. Fresh or from a worker's source, the gated reference is the first timed run."""
    seen, before, on_event = before_timing
    cfg = cfg_of("gate=saturation", "gate.eps=0.3", "gate.min_layer=1", f"bench.warmup={warmup}")
    lm, gate, prompts = prepare(cfg)
    taking = ReuseCache()
    for source in (None, taking):
        seen.clear()
        run_trial(cfg, lm, gate, prompts, references=source, on_event=on_event)
        ran = before()
        assert ran.count("self-check") == len(prompts)  # two recorded baselines per prompt
        assert ran.count("baseline") == max(warmup - 2, 0)  # 0 for the default warm-up of 1
        assert ran.count("gated") == warmup  # the gated side warms up; no untimed gated reference
        cost = ran.index("cost model")
        assert ran[:cost].count("gated") == warmup and "self-check" not in ran[:cost]
        assert set(ran[cost + 1 :]) == {"self-check"}
    # a worker given a reference (no self-check) warms its baseline up in full
    key = ReferenceKey.of(lm, prompts, gen_tokens=cfg.bench.gen_tokens, seed=cfg.seed, batch_size=1)
    given = ReuseCache()
    given.put(taking.get(key))
    seen.clear()
    row = run_trial(cfg, lm, gate, prompts, references=given, on_event=on_event)
    ran = before()
    assert row["reference_reused"] and "self-check" not in ran
    assert ran.count("baseline") == warmup and ran.count("gated") == warmup


def test_a_shared_group_measures_every_settings_probe_in_one_cost_model(before_timing):
    from sweep.bench.protocol import run_trials

    seen, before, on_event = before_timing
    cfgs = [
        cfg_of("gate=saturation", "gate.eps=0.3", "gate.min_layer=1"),
        cfg_of("gate=margin", "gate.theta=2.0", "gate.min_layer=1"),
    ]
    prepared = [prepare(c) for c in cfgs]
    lm, prompts = prepared[0][0], prepared[0][2]
    rows = run_trials(cfgs, lm, [p[1] for p in prepared], prompts, references=ReuseCache(), on_event=on_event)
    ran = before()
    assert ran.count("cost model") == 1
    cost = ran.index("cost model")
    assert ran[:cost] == ["gated", "gated"]  # each gate kind's warm-up, then the model's costs
    assert ran[cost + 1 :] == ["self-check"] * len(prompts)  # the self-check leads into the timed rounds
    assert all(r["probe_cost_layers"] > 0 for r in rows)  # both probes measured in that one cost model
