"""Learned exits in the engine, the trace and the replay: gate=classifier and gate.lens=tuned
decide closed-loop exactly as their replay on a profile trace says (every tiny family, float32
and bfloat16), read their tokens through the tuned lens, are charged for it by the cost model,
and are judged only on prompts the readouts were not fitted on."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest
import torch

from conftest import TINY_FAMILIES, compose, load, run_cli
from sweep.config import GateConfig
from sweep.bench.costs import CostModel
from sweep.decode.engine import Engine
from sweep.errors import ConfigError
from sweep.gates import make_gate
from sweep.trace.profile import profile_prompts
from sweep.models.prompts import read_prompts, tokenize_prompts
from sweep.trace.readouts import fit_readouts
from sweep.gates.readouts import load_readouts
from sweep.trace.readouts import save_readouts
from sweep.trace.simulate import exit_layers, signals_from_trace, simulate, threshold_value

N = 6


def _prompts(lm, start: int, n: int):
    cfg = dataclasses.replace(compose("prompts=chat").prompts, start=start, n=n)
    return tokenize_prompts(read_prompts(cfg), cfg, lm.tokenizer)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """Per (family, dtype): readouts fitted on chat/0..2, their file, and a trace (with the
    readouts' columns) of chat/3..5, the prompts they are evaluated on."""
    made = {}

    def get(family: str, dtype: str = "float32"):
        if (family, dtype) not in made:
            lm = load(f"model=tiny-{family}", f"dtype={dtype}")
            fit = fit_readouts(
                lm, _prompts(lm, 0, 3), gen_tokens=N, ridge=1.0, l2=1e-3, seed=0, prompt_set="chat", prompt_start=0
            )
            path = save_readouts(fit, tmp_path_factory.mktemp(f"readouts-{family}-{dtype}"))
            readouts = load_readouts(path, lm)
            prompts = _prompts(lm, 3, 3)
            trace = profile_prompts(lm, prompts, N, topk=3, pca_k=8, readouts=readouts)
            trace = trace.with_columns(model=pl.lit(lm.name), run_id=pl.lit("r"), num_layers=pl.lit(lm.num_layers))
            baseline = {p.id: Engine(lm).generate(p.input_ids, N).tokens for p in prompts}
            made[family, dtype] = (lm, readouts, path, prompts, trace, baseline)
        return made[family, dtype]

    return get


def _quantile_thresholds(sig, column: str, min_layer: int, qs=(0.15, 0.5, 0.85)) -> list[float]:
    """Thresholds at quantiles of a traced signal over the layers a gate probes (some positions
    exit and some do not), and one past all of them: whichever way the signal points, one
    threshold never exits, so the settings differ wherever another one exits."""
    values = sig.extra[column][:, min_layer - 1 : sig.num_layers - 1].flatten().double()
    beyond = float(values.min()) - 1.0 if column.endswith("entropy") else float(values.max()) + 1.0
    return sorted({float(values.quantile(q)) for q in qs} | {beyond})


SETTINGS = {  # gate, lens, the traced column its threshold is read from
    "classifier-logit": ("classifier", "logit", "classifier_prob"),
    "classifier-tuned": ("classifier", "tuned", "tuned_classifier_prob"),
    "margin-tuned": ("margin", "tuned", "tuned_margin"),
    "softmax-tuned": ("softmax", "tuned", "tuned_prob_margin"),
    "entropy-tuned": ("entropy", "tuned", "tuned_entropy"),
}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_replay_equals_the_closed_loop_for_learned_exits(fitted, family, dtype, setting):
    """Until each prompt's first divergence from full depth, every step exits where the replay
    says, and agrees with full depth exactly when the replay's (tuned or logit) top-1 matches."""
    lm, readouts, path, prompts, trace, baseline = fitted(family, dtype)
    name, lens, column = SETTINGS[setting]
    sig = signals_from_trace(trace)
    L, min_layer = lm.num_layers, 1
    thresholds = _quantile_thresholds(sig, column, min_layer)
    order = {p: i for i, p in enumerate(sig.prompt_ids)}
    view = sig.for_lens(lens)
    runs, compared = [], 0
    for value in thresholds:
        cfg = GateConfig(name=name, min_layer=min_layer, theta=value, lens=lens, readouts=str(path))
        gate = make_gate(cfg, lm, readouts)
        sim = exit_layers(type(gate), view, torch.tensor([threshold_value(gate)], dtype=torch.float64), min_layer)[0]
        exits = []
        for prompt in prompts:
            gen = Engine(lm, gate, "full").generate(prompt.input_ids, N)
            exits += gen.exit_layers
            rows = (sig.prompt_index == order[prompt.id]).nonzero().flatten()
            base = baseline[prompt.id]
            diverged = next((i for i, (a, b) in enumerate(zip(gen.tokens, base)) if a != b), N - 1)
            for i in range(diverged + 1):
                t = rows[i]
                assert gen.exit_layers[i] == int(sim[t]), (setting, value, prompt.id, i)
                assert (gen.tokens[i] == base[i]) == bool(view.match[t, sim[t] - 1]), (setting, value, prompt.id, i)
                compared += 1
        runs.append(exits)
    assert compared >= len(thresholds) * len(prompts)
    assert any(e < L for exits in runs for e in exits), f"{setting} never exits"
    assert len({tuple(e) for e in runs}) > 1, f"every {setting} threshold decides alike"


@pytest.mark.parametrize("policy", ["full", "propagate"])
@pytest.mark.parametrize("setting", ["classifier-logit", "classifier-tuned", "margin-tuned"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_a_batch_of_two_decodes_each_row_as_alone(fitted, family, setting, policy):
    """Rows of a left-padded batch exit at different layers; each is read through its own
    layer's translator and decides as it would alone (and the gate does exit)."""
    from helpers.contract import each_sequence_decides_as_it_would_alone

    lm, readouts, path, prompts, trace, _ = fitted(family)
    name, lens, column = SETTINGS[setting]
    value = _quantile_thresholds(signals_from_trace(trace), column, 1, qs=(0.5,))[0]
    cfg = GateConfig(name=name, min_layer=1, theta=value, lens=lens, readouts=str(path))
    pair = [list(p.input_ids) for p in prompts[:2]]
    assert len(pair[0]) != len(pair[1])  # left padding is exercised
    together = each_sequence_decides_as_it_would_alone(lm, pair, cfg, policy, readouts)
    assert any(e < lm.num_layers for row in together.exit_layers for e in row), f"{setting} never exits"


def test_the_exit_token_comes_from_the_tuned_lens(fitted):
    """gate=fixed-like exits through the classifier at theta=0 (always exit at min_layer): the
    token is the tuned lens's argmax there, and differs from the logit lens's somewhere."""
    lm, readouts, path, prompts, _, _ = fitted("llama")
    a, differ = lm.adapter, 0
    for lens in ("logit", "tuned"):
        cfg = GateConfig(name="classifier", min_layer=2, theta=0.0, lens=lens, readouts=str(path))
        gate = make_gate(cfg, lm, readouts)
        gen = Engine(lm, gate, "full").generate(prompts[0].input_ids, N, record=True)
        assert gen.exit_layers == [2] * N
        for i, h in enumerate(gen.exit_hidden):
            expected = a.lens(readouts.translate(2, h[:, -1])) if lens == "tuned" else a.lens(h[:, -1])
            assert torch.equal(gen.logits[i], expected[0].float())
            differ += int(readouts.translate(2, h[:, -1]).ne(h[:, -1]).any())
    assert differ > 0  # the translator is not the identity, so the two lenses are different readouts


def test_an_identity_translator_traces_the_logit_lens(fitted, tmp_path):
    """Readouts whose translators are all zero (the identity): every tuned_* column of the trace
    equals its logit-lens twin exactly."""
    lm, readouts, _, prompts, _, _ = fitted("qwen2")
    zero = {k: (torch.zeros_like(v) if k.startswith("translator.") else v) for k, v in readouts.weights.items()}
    ident = dataclasses.replace(readouts, weights=zero)
    trace = profile_prompts(lm, prompts[:1], N, topk=3, pca_k=8, readouts=ident)
    for tuned, logit in (("tuned_top1", "top1"), ("tuned_margin", "margin"), ("tuned_match", "top1_match")):
        assert trace[tuned].to_list() == trace[logit].to_list(), tuned
    # KL sums over the vocabulary: the two columns' lenses ran on different block shapes, so compare to rounding
    assert np.allclose(trace["tuned_kl_final"].to_numpy(), trace["kl_final"].to_numpy(), rtol=1e-5, atol=1e-6)
    assert (trace.filter(pl.col("layer") == lm.num_layers)["kl_final"].abs() < 1e-5).all()


def test_the_cost_model_charges_translator_and_classifier():
    """A tuned lens probe costs its measured key; a classifier that exits pays the head and, with
    the tuned lens, the translator on top; a logit-lens probe pays neither."""
    costs = CostModel(
        layer_ms=1.0,
        head_ms=5.0,
        lens_probe_ms=5.5,
        hidden_probe_ms=0.1,
        kv_ms=0.2,
        overhead_ms=0.5,
        step_ms=35.5,
        num_layers=30,
        extra_probe_ms={"lens:tuned": 5.8, "classifier:logit": 0.05, "classifier:tuned": 0.05, "translate": 0.3},
    )

    def gate(name, lens, **params):
        return make_gate(GateConfig(name=name, min_layer=8, lens=lens, readouts="x", **params), 30)

    logit = make_gate(GateConfig(name="margin", min_layer=8, theta=3.0), 30)
    tuned = gate("margin", "tuned", theta=3.0)
    assert costs.probe_ms(tuned) == 5.8 and costs.probe_ms(logit) == 5.5
    assert costs.token_ms(tuned, 10, 3, "propagate") - costs.token_ms(logit, 10, 3, "propagate") == pytest.approx(0.9)
    c_logit, c_tuned = gate("classifier", "logit", theta=0.9), gate("classifier", "tuned", theta=0.9)
    exited = costs.token_ms(c_logit, 10, 3, "propagate")
    assert exited == pytest.approx(0.5 + 10 + 3 * 0.05 + 20 * 0.2 + 5.0)  # the head reads the exited token
    assert costs.token_ms(c_tuned, 10, 3, "propagate") - exited == pytest.approx(0.3)
    assert costs.token_ms(c_tuned, 30, 22, "propagate") == costs.token_ms(c_logit, 30, 22, "propagate")


def test_a_screen_replays_learned_gates_with_the_trace_they_need(fitted):
    lm, readouts, path, prompts, trace, _ = fitted("llama")
    sig = signals_from_trace(trace)
    cfgs = [
        GateConfig(name="classifier", min_layer=1, theta=t, lens=lens, readouts=str(path))
        for lens in ("logit", "tuned")
        for t in (0.3, 0.6, 0.9)
    ] + [GateConfig(name="margin", min_layer=1, theta=0.5, lens="tuned", readouts=str(path))]
    rows = simulate(cfgs, sig, None)
    assert rows.height == 7 and rows["lens"].to_list() == [None] * 3 + ["tuned"] * 4
    assert rows["agreement_tf"].is_between(0, 1).all()
    bare = signals_from_trace(trace.drop([c for c in trace.columns if c.startswith("tuned_")]))
    with pytest.raises(ConfigError, match="no tuned-lens columns.*profile.readouts"):
        simulate(cfgs[-1:], bare, None)


@pytest.mark.slow
def test_readouts_are_refused_on_prompts_they_were_fitted_on(fitted, tmp_path):
    _, _, path, _, _, _ = fitted("llama")
    args = ["model=tiny-llama", "gate=classifier", f"gate.readouts={path}", "bench.gen_tokens=3", "bench.repeats=1"]
    done = run_cli("bench", *args, "prompts=chat", "prompts.start=2", "prompts.n=2", f"results.root={tmp_path}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "1 of 2 evaluation prompts (chat/2)" in errors[0] and "fitting set" in errors[0]
    assert not (tmp_path / "trials").exists()
    ok = run_cli("bench", *args, "prompts=chat", "prompts.start=3", "prompts.n=2", f"results.root={tmp_path}")
    assert ok.returncode == 0, ok.stderr[-2000:]
    from sweep.store import read

    row = read("trials", tmp_path).row(0, named=True)
    assert row["gate"] == "classifier" and row["status"] == "ok" and row["lens"] is None
    assert row["readouts_id"] == path.stem and row["fit_prompts"] == "chat: chat/0 .. chat/2 (3 prompts)"


def test_lens_and_readouts_are_checked_at_compose(tmp_path):
    with pytest.raises(ConfigError, match=r"gate.lens=tuned: gate=saturation takes logit"):
        compose("gate=saturation", "gate.lens=tuned", "gate.readouts=x")
    with pytest.raises(ConfigError, match=r"gate.readouts: required for gate.lens=tuned"):
        compose("gate=margin", "gate.lens=tuned")
    with pytest.raises(ConfigError, match=r"gate.readouts: required for gate=classifier"):
        compose("gate=classifier")
    with pytest.raises(ConfigError, match=r"gate.readouts=x: only gate.lens=tuned and gate=classifier"):
        compose("gate=margin", "gate.readouts=x")
    with pytest.raises(ConfigError, match=r"gate.theta=1.5: must be a number in \[0, 1\]"):
        compose("gate=classifier", "gate.readouts=x", "gate.theta=1.5")
    done = run_cli("bench", "model=tiny-llama", "gate=classifier", f"gate.readouts={tmp_path}/none.safetensors")
    assert done.returncode == 2 and done.stderr.count("error:") == 1 and "no such file" in done.stderr


@pytest.fixture(scope="module")
def chat_tail_readouts(tmp_path_factory):
    """tiny-llama readouts fitted on chat/6..9: HumanEval calibrates, chat/0..3 checks the drift."""
    lm = load("model=tiny-llama")
    fit = fit_readouts(
        lm, _prompts(lm, 6, 4), gen_tokens=N, ridge=1.0, l2=1e-3, seed=0, prompt_set="chat", prompt_start=6
    )
    return save_readouts(fit, tmp_path_factory.mktemp("chat-tail"))


CALIBRATE = [
    "calibrate",
    "model=tiny-llama",
    "gate=classifier",
    "gate.lens=tuned",
    "gate.min_layer=1",
    "prompts=humaneval",
    "prompts.n=10",
    "bench.gen_tokens=4",
    "calibrate.delta=0.3",
    "calibrate.epsilon=0.3",
    "calibrate.grid='range(1.0, 0.6, step=-0.1)'",
]


def test_calibrate_a_classifier_and_check_its_drift(chat_tail_readouts, capsys):
    from sweep.cli.commands import main

    code = main(
        [*CALIBRATE, f"gate.readouts={chat_tail_readouts}", "calibrate.heldout_prompts=chat", "calibrate.heldout_n=4"]
    )
    out = " ".join(capsys.readouterr().out.split())  # its lines wrap at 120 columns
    assert code == 0, out
    assert "calibrate gate=classifier" in out and "chosen theta=" in out
    assert "drift check on chat (4 prompts, another distribution): observed disagreement" in out
    assert "against the held-out prompts" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["calibrate.heldout_prompts=humaneval"],
            "calibrate.heldout_prompts=humaneval: 10 of its prompts are calibration",
        ),
        (["calibrate.heldout_prompts=chat", "calibrate.heldout_n=8"], "calibrate.heldout_prompts: 2 of 8 evaluation"),
        (
            ["calibrate.heldout_prompts=chat", "calibrate.heldout_n=8"],
            "evaluate on others (calibrate.heldout_prompts: another set, or readouts fitted on another)",
        ),
        (["prompts=chat", "prompts.n=8"], "prompts: 2 of 8 evaluation prompts (chat/6, chat/7)"),
        (["prompts=chat", "prompts.n=8"], "evaluate on others (prompts.start, prompts.n)"),
    ],
)
def test_calibration_and_drift_prompts_never_overlap_the_fitting_set(chat_tail_readouts, capsys, extra, message):
    from sweep.cli.commands import main

    code = main([*CALIBRATE, f"gate.readouts={chat_tail_readouts}", *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and message in err, err


def test_a_screen_sweep_of_learned_gates(ray_session, llama_readouts, tmp_path):
    """`sweep run search=screen` with tuned-lens and classifier settings: the trace carries the
    readouts' columns, every setting replays, the selected ones run closed-loop with their lens."""
    from conftest import sweep
    from sweep.store import read

    space = (
        "search.spaces=[{gate: classifier, gate.lens: 'choice(logit, tuned)', gate.theta: 'range(0.5, 1.0, step=0.1)', "
        f"gate.readouts: {llama_readouts}, gate.min_layer: 1}}, {{gate: margin, gate.lens: tuned, "
        f"gate.theta: 'choice(0.5, 1, 2)', gate.readouts: {llama_readouts}, gate.min_layer: 1}}]"
    )
    outcome = sweep(tmp_path, "search=screen", space, "prompts.start=3", "prompts.n=2", "bench.gen_tokens=6")
    sim = read("simulated", tmp_path)
    assert sim.height == 13 and set(sim["gate"]) == {"classifier", "margin"}
    assert sorted(sim["lens"].unique().to_list(), key=str) == [None, "tuned"]
    trace = read("profile", tmp_path)
    assert trace["readouts_id"].unique().to_list() == [llama_readouts.stem]
    assert trace["tuned_match"].null_count() == 0 and trace["classifier_prob"].null_count() == 0
    assert sim["speedup_model"].null_count() == 0  # the cost model measured the tuned and classifier probes
    trials = read("trials", tmp_path)
    selected = set(sim.filter(pl.col("selected"))["trial_id"])  # on a tiny model, maybe none beats full depth
    assert set(trials["trial_id"]) == selected and trials.height == outcome.written
    assert set(trials["status"]) <= {"ok"} and set(trials["readouts_id"]) <= {llama_readouts.stem}
