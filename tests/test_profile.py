"""The profile trace, its summaries (layer curve, EAS, oracle exit) and `sweep profile`."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch

from conftest import TINY_FAMILIES, compose, run_cli
from sweep.cli.commands import main
from sweep.decode.engine import greedy_decode
from sweep.models._tiny import build_tiny
from sweep.analysis import eas_per_layer, eas_table, layer_curve, oracle_exits, oracle_summary
from sweep.decode.states import decode_states
from sweep.trace.profile import trace_prompt
from sweep.models.prompts import read_prompts, tokenize_prompts
from sweep.store import read

GEN = 6


def prompts_for(lm, n=2):
    cfg = compose("prompts=chat", f"prompts.n={n}").prompts
    return tokenize_prompts(read_prompts(cfg), cfg, lm.tokenizer)


def independent_lens(model, ids):
    """HF's own hidden states -> final norm -> lm_head (-> softcap), for every layer 1..L."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        L = model.config.num_hidden_layers
        cap = getattr(model.config, "final_logit_softcapping", None)
        zs = []
        for layer in range(1, L):
            z = model.lm_head(model.model.norm(out.hidden_states[layer]))[0]
            if cap is not None:
                z = torch.tanh(z / cap) * cap
            zs.append(z)
        zs.append(out.logits[0])  # layer L: the model's own logits
    return torch.stack(zs, dim=1)  # (T, L, V)


def test_top1_agreement_equals_an_independent_hf_computation(tiny):
    fresh = build_tiny(compose(f"model=tiny-{tiny.family}").model, 0, vocab_size=len(tiny.tokenizer)).eval()
    for prompt in prompts_for(tiny):
        generated = greedy_decode(tiny, prompt.input_ids, GEN)
        cols = trace_prompt(tiny, prompt, generated, topk=5)
        ids = list(prompt.input_ids) + generated[:-1]
        z = independent_lens(fresh, ids)
        T, L = z.shape[0], z.shape[1]
        top1 = z.argmax(-1)
        assert np.array_equal(cols["top1"].reshape(T, L), top1.numpy())
        expect_match = (top1 == top1[:, -1:]).numpy()
        assert np.array_equal(cols["top1_match"].reshape(T, L), expect_match)
        assert expect_match[:, -1].all()


def test_trace_rows_rebuild_the_sequence(tiny):
    prompt = prompts_for(tiny, 1)[0]
    generated = greedy_decode(tiny, prompt.input_ids, GEN)
    df = pl.DataFrame(trace_prompt(tiny, prompt, generated, topk=3))
    L, P = tiny.num_layers, len(prompt.input_ids)
    T = P + GEN - 1
    assert df.height == T * L
    per_pos = df.filter(pl.col("layer") == 1).sort("position")
    assert per_pos["token_id"].to_list() == list(prompt.input_ids) + generated[:-1]
    assert per_pos["phase"].to_list() == ["prefill"] * P + ["decode"] * (GEN - 1)
    # the final top-1 at position p is the greedy token p+1: the trace agrees with the cached decode
    assert per_pos["top1_final"].to_list()[P - 1 :] == generated
    assert df.group_by("position").agg(pl.col("layer").sort()).get_column("layer").to_list()[0] == list(range(1, L + 1))


def test_decode_states_are_the_models_own_states(tiny):
    """The trace's states come from cached decoding (the engine's forwards); they are the states
    of HF's own whole-sequence forward, up to float32 rounding, and the tokens are greedy."""
    prompt = prompts_for(tiny, 1)[0]
    generated, states, greedy = decode_states(tiny, prompt.input_ids, n_tokens=GEN)
    assert generated == greedy == greedy_decode(tiny, prompt.input_ids, GEN)
    ids = list(prompt.input_ids) + generated[:-1]
    fresh = build_tiny(compose(f"model=tiny-{tiny.family}").model, 0, vocab_size=len(tiny.tokenizer)).eval()
    with torch.no_grad():
        out = fresh(input_ids=torch.tensor([ids]), output_hidden_states=True)
    assert len(states) == tiny.num_layers + 1
    for layer in range(tiny.num_layers):  # HF's last entry is after the final norm
        torch.testing.assert_close(states[layer], out.hidden_states[layer], rtol=1e-4, atol=1e-5)
    again = decode_states(tiny, prompt.input_ids, generated=generated)
    assert again.tokens == generated and all(torch.equal(x, y) for x, y in zip(again.states, states))


def test_signal_definitions(tiny):
    prompt = prompts_for(tiny, 1)[0]
    decoded = decode_states(tiny, prompt.input_ids, n_tokens=3)
    generated = decoded.tokens
    cols = trace_prompt(tiny, prompt, generated, topk=4, decoded=decoded)
    ids = list(prompt.input_ids) + generated[:-1]
    a = tiny.adapter
    L, T = a.num_layers, len(ids)
    hs = [h[0] for h in decoded.states]
    z_final = a.lens(hs[L])
    for layer in (1, L - 1, L):
        h, z = hs[layer], a.lens(hs[layer])
        for pos in (0, T - 1):
            row = pos * L + (layer - 1)
            delta = ((h[pos] - hs[layer - 1][pos]).norm() / h[pos].norm()).item()
            assert cols["delta"][row] == pytest.approx(delta, rel=1e-5)
            top2 = z[pos].topk(2).values
            # a difference of two logits rounds as the logits do (the trace's lens ran on another block shape)
            tol = 1e-6 * top2.abs().max().item()
            assert cols["margin"][row] == pytest.approx((top2[0] - top2[1]).item(), rel=1e-5, abs=tol)
            assert cols["residual_inf"][row] == pytest.approx((z[pos] - z_final[pos]).abs().max().item(), abs=1e-5)
            n_l, n_L = a.norm(h[pos]), a.norm(hs[L][pos])
            assert cols["cos_hidden"][row] == pytest.approx(torch.cosine_similarity(n_l, n_L, dim=0).item(), abs=1e-5)
            zc, zf = z[pos] - z[pos].mean(), z_final[pos] - z_final[pos].mean()
            assert cols["cos_logits"][row] == pytest.approx(torch.cosine_similarity(zc, zf, dim=0).item(), abs=1e-5)
            overlap = len(set(z[pos].topk(4).indices.tolist()) & set(z_final[pos].topk(4).indices.tolist())) / 4
            assert cols["topk_overlap"][row] == pytest.approx(overlap)
    last = np.arange(T) * L + (L - 1)
    assert np.allclose(cols["residual_inf"][last], 0) and np.allclose(cols["topk_overlap"][last], 1)


def test_greedy_decode_equals_generate(tiny):
    prompt = prompts_for(tiny, 1)[0]
    ours = greedy_decode(tiny, prompt.input_ids, GEN)
    with torch.no_grad():
        ref = tiny.model.generate(
            torch.tensor([prompt.input_ids]),
            max_new_tokens=GEN,
            min_new_tokens=GEN,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert ours == ref[0, len(prompt.input_ids) :].tolist()


def hand_trace(cos_hidden, top1_match, L=3):
    """A synthetic trace: one row per (position, layer) from per-position lists over layers."""
    rows = []
    for pos, (cs, ms) in enumerate(zip(cos_hidden, top1_match)):
        for layer in range(1, L + 1):
            rows.append(
                dict(
                    model="m",
                    run_id="r",
                    prompt_id="p",
                    position=pos,
                    phase="decode" if pos else "prefill",
                    layer=layer,
                    num_layers=L,
                    cos_hidden=cs[layer - 1],
                    cos_logits=cs[layer - 1] / 2,
                    topk_overlap=0.5,
                    top1_match=ms[layer - 1],
                    delta=0.1 * layer,
                    pca_delta=0.05 * layer * (pos + 1),
                    margin=float(pos + layer),
                    topk=10,
                )
            )
    return pl.DataFrame(rows)


def test_eas_hand_computed():
    trace = hand_trace(cos_hidden=[[0.2, 0.6, 1.0], [0.4, 1.0, 1.0]], top1_match=[[True] * 3] * 2)
    # S_1 = 0.3, S_2 = 0.8; w_1 = 2/3, w_2 = 1/3; alpha = 0.5
    expected = (math.sqrt(0.3 * 2 / 3) + math.sqrt(0.8 * 1 / 3)) / 2
    t = eas_table(trace, 0.5)
    got = dict(zip(t["variant"], t["eas"]))
    assert got["hidden"] == pytest.approx(expected, rel=1e-12)
    assert got["logits"] == pytest.approx((math.sqrt(0.15 * 2 / 3) + math.sqrt(0.4 / 3)) / 2, rel=1e-12)
    assert got["topk"] == pytest.approx((math.sqrt(0.5 * 2 / 3) + math.sqrt(0.5 / 3)) / 2, rel=1e-12)
    assert t["alpha"].to_list() == [0.5] * 3 and t["topk"].to_list() == [10] * 3 and t["layers"].to_list() == [2] * 3
    # alpha = 1: EAS is the mean similarity; alpha = 0: the mean skip ratio
    assert dict(zip(eas_table(trace, 1.0)["variant"], eas_table(trace, 1.0)["eas"]))["hidden"] == pytest.approx(0.55)
    assert dict(zip(eas_table(trace, 0.0)["variant"], eas_table(trace, 0.0)["eas"]))["hidden"] == pytest.approx(0.5)


def test_eas_clips_negative_similarity_to_zero():
    trace = hand_trace(cos_hidden=[[-0.5, 0.5, 1.0]], top1_match=[[True] * 3])
    per_layer = eas_per_layer(trace, 0.5).filter(pl.col("variant") == "hidden").sort("layer")
    assert per_layer["s"].to_list() == [0.0, 0.5, 1.0]
    assert per_layer["a"][0] == 0.0 and per_layer["a"][2] == 0.0  # layer L has w = 0


def test_oracle_exit_hand_computed():
    # the second position matches at layer 1, misses at 2, matches at 3: a gate exiting at its
    # first match is correct there, so the two oracles differ (1 against 3)
    trace = hand_trace(
        cos_hidden=[[1, 1, 1]] * 3,
        top1_match=[[False, True, True], [True, False, True], [True, True, True]],
    )
    exits = oracle_exits(trace)
    assert exits["first_match_exit"].to_list() == [2, 1, 1]
    assert exits["saturation_exit"].to_list() == [2, 3, 1]
    summary = {r["phase"]: r for r in oracle_summary(trace).iter_rows(named=True)}
    assert summary["all"]["mean_first_match"] == pytest.approx(4 / 3)
    assert summary["all"]["frac_first_match_before_L"] == pytest.approx(1.0)
    assert summary["all"]["mean_saturation"] == pytest.approx(2.0)
    assert summary["all"]["frac_saturation_before_L"] == pytest.approx(2 / 3)
    assert summary["decode"]["positions"] == 2 and summary["prefill"]["mean_saturation"] == 2.0


def test_layer_curve_hand_computed():
    trace = hand_trace(cos_hidden=[[1, 1, 1]] * 2, top1_match=[[False, True, True], [True, True, True]])
    curve = layer_curve(trace)
    assert curve["layer"].to_list() == [1, 2, 3]
    assert curve["top1_agreement"].to_list() == [0.5, 1.0, 1.0]
    assert curve["delta_median"].to_list() == pytest.approx([0.1, 0.2, 0.3])
    assert curve["pca_delta_median"].to_list() == pytest.approx(
        [0.075, 0.15, 0.225]
    )  # positions 0 and 1: 0.05 l and 0.1 l
    assert curve["margin_median"].to_list() == [1.5, 2.5, 3.5]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_profile_command_on_every_tiny_family(family, tmp_path, capsys):
    code = main(
        [
            "profile",
            f"model=tiny-{family}",
            "prompts.n=2",
            "profile.gen_tokens=4",
            f"results.root={tmp_path}",
            "run_id=t1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "EAS (alpha=0.5, K=10" in out and "oracle exit (all positions" in out
    assert "pca_delta (median)" in out
    assert f"trace: {tmp_path}/profile/model=tiny-{family}/t1.parquet" in out
    df = read("profile", tmp_path)
    lm_prompts = df.select("prompt_id", "position").unique().height
    assert df.height == lm_prompts * 4 and df["run_id"].unique().to_list() == ["t1"]
    assert df["prompt_set"].unique().to_list() == ["chat"] and df["family"].unique().to_list() == [family]


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_profile_console_script_end_to_end(tmp_path):
    res = run_cli("profile", "model=tiny-qwen2", "prompts.n=1", "profile.gen_tokens=3", f"results.root={tmp_path}")
    assert res.returncode == 0, res.stderr
    assert "top-1 agree" in res.stdout and "sweep: [1/1] chat/0" in res.stderr
    assert len(list((tmp_path / "profile" / "model=tiny-qwen2").glob("*.parquet"))) == 1


def test_profile_bad_input_writes_nothing(tmp_path, capsys):
    code = main(["profile", "model=tiny-llama", "prompts.max_tokens=5", f"results.root={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and err[-1] == errors[0] and "over the limit of 5" in errors[0]
    assert not (tmp_path / "r").exists()


def test_a_prompt_traced_again_counts_once_in_the_report(tmp_path, caplog):
    """`sweep profile` run again with one more prompt, and the first run's trace file stored twice: the
    report's oracle table counts each traced position once, as the newest trace alone holds them, and says what
    repeated; a model that was only traced gets no noise-floor line."""
    args = ["profile", "model=tiny-llama", "profile.gen_tokens=4", f"results.root={tmp_path}"]
    for run, n in (("a", 2), ("c", 3)):
        assert main([*args, f"prompts.n={n}", f"run_id={run}"]) == 0
    traces = tmp_path / "profile" / "model=tiny-llama"
    (traces / "d.parquet").write_bytes((traces / "a.parquet").read_bytes())  # a copy of a whole trace file
    assert main(["analyze", f"results.root={tmp_path}"]) == 0
    newest = pl.read_parquet(traces / "c.parquet").filter(pl.col("layer") == 1)  # run c traced all three prompts
    assert newest["prompt_id"].n_unique() == 3
    report = (tmp_path / "report" / "report.md").read_text()
    assert f"| tiny-llama | all ({newest.height}) |" in report
    decode = newest.filter(pl.col("phase") == "decode").height
    assert f"| tiny-llama | decode ({decode}) |" in report
    copy = pl.read_parquet(traces / "d.parquet").height
    assert "tiny-llama: 2 traced again" in caplog.text and f"{copy} rows stored twice" in caplog.text
    assert "Noise floor" not in report
    # two prompts of one text under two ids are two prompts, not one traced again
    twins = tmp_path / "twins.jsonl"
    twins.write_text('{"id": "x", "prompt": "The same words."}\n{"id": "y", "prompt": "The same words."}\n')
    assert main([*args, "prompts=jsonl", f"prompts.path={twins}", "prompts.n=2", "run_id=e"]) == 0
    caplog.clear()
    assert main(["analyze", f"results.root={tmp_path}"]) == 0
    both = pl.read_parquet(traces / "e.parquet").filter(pl.col("layer") == 1)
    assert both["prompt_id"].n_unique() == 2
    report = (tmp_path / "report" / "report.md").read_text()
    assert f"| tiny-llama | all ({newest.height + both.height}) |" in report
