"""lm-evaluation-harness through the registered model ``sweep`` (``sweep.tasks.harness``), offline on local tasks the
tests build: a multiple-choice task and a generation task.

Checked against independent computations:
- multiple choice under a gate: each choice's loglikelihood brute-forced from one plain transformers forward with
  every layer's hidden state (kv_policy=full leaves every layer's state the full model's, so the exit layer's
  readout is lm_head(norm(h_l)) at the first layer whose saturation delta is below eps);
- generation at full depth: half the documents' answers are transformers' own greedy ``generate`` output, so the
  full-depth exact match is 0.5 by construction;
- lm-eval's own command line on the registered model gives the accuracy the project's trial row holds.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import compose, load, run_cli, subprocess_env

pytest.importorskip("lm_eval")

MODEL = "tiny-llama"
QUESTIONS = ["The sky is", "Two plus two is", "Paris is in", "Water is", "A cat says", "Fire is", "Snow is", "Grass is"]
CHOICES = [" blue", " green", " loud"]


def _task(tmp_path, name: str, data: list[dict], body: str) -> None:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in data))
    (tmp_path / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {path}\ntest_split: test\n"
        + body
        + "metadata:\n  version: 1.0\n"
    )


def _mc(tmp_path) -> None:
    data = [{"question": q, "choices": CHOICES, "label": i % 3} for i, q in enumerate(QUESTIONS)]
    _task(
        tmp_path,
        "tiny_mc",
        data,
        "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_target: label\ndoc_to_choice: choices\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n",
    )


def _gen(tmp_path, lm) -> None:
    """Answers: transformers' own greedy continuation for even documents, a wrong one for odd ones."""
    data, eos = [], lm.tokenizer.eos_token_id
    for i, q in enumerate(QUESTIONS):
        ids = torch.tensor([lm.tokenizer(q, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = lm.model.generate(ids, max_new_tokens=5, do_sample=False, eos_token_id=None, pad_token_id=0)
        tokens = out[0, ids.shape[1] :].tolist()
        tokens = tokens[: tokens.index(eos)] if eos in tokens else tokens  # a generation ends at end-of-sequence
        text = lm.tokenizer.decode(tokens, skip_special_tokens=True).split("\n")[0]
        data.append({"question": q, "answer": text if i % 2 == 0 else text + "#wrong"})
    _task(
        tmp_path,
        "tiny_gen",
        data,
        "output_type: generate_until\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 5\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n",
    )


def _deltas_and_lens(lm, ids: list[int]):
    """Per position: every layer's saturation delta and lens logits, from one plain forward (no engine)."""
    with torch.no_grad():
        out = lm.model(torch.tensor([ids]), output_hidden_states=True)
    hs = out.hidden_states  # h_0 (embeddings) .. h_L (the last one after the final norm)
    L = len(hs) - 1
    inner = lm.model.model
    deltas = [((hs[layer] - hs[layer - 1]).norm(dim=-1) / hs[layer].norm(dim=-1))[0] for layer in range(1, L)]
    lens = [lm.model.lm_head(inner.norm(hs[layer]))[0] for layer in range(1, L)]
    return deltas, lens, out.logits[0], L


def _brute_logprob(lm, ctx: list[int], cont: list[int], eps: float, min_layer: int) -> tuple[float, int]:
    """The continuation's log-probability with each position read out at its exit layer, and how many exited."""
    deltas, lens, final, L = _deltas_and_lens(lm, ctx + cont)
    total, exited = 0.0, 0
    for i, token in enumerate(cont):
        pos = len(ctx) - 1 + i
        logits = final[pos]
        for layer in range(min_layer, L):
            if float(deltas[layer - 1][pos]) < eps:
                logits, exited = lens[layer - 1][pos], exited + 1
                break
        total += float(torch.log_softmax(logits.double(), -1)[token])
    return total, exited


def _median_delta(lm, min_layer: int) -> float:
    deltas, _, _, L = _deltas_and_lens(
        lm, lm.tokenizer(QUESTIONS[0] + CHOICES[0], add_special_tokens=False)["input_ids"]
    )
    pooled = torch.cat([deltas[layer - 1] for layer in range(min_layer, L)])
    return float(pooled.median())


def _row(tmp_path, *overrides):
    from sweep.bench.command import run_bench

    cfg = compose(
        f"model={MODEL}",
        "prompts.n=1",
        "bench.gen_tokens=4",
        "bench.repeats=1",
        "bench.warmup=0",
        f"results.root={tmp_path / 'results'}",
        "eval.task=harness",
        f"eval.harness_include={tmp_path}",
        *overrides,
    )
    return run_bench(cfg)[1]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


@pytest.mark.slow
def test_multiple_choice_under_a_gate_equals_a_brute_force_from_plain_hidden_states(tmp_path):
    lm = load(f"model={MODEL}")
    min_layer = 1
    eps = _median_delta(lm, min_layer)
    _mc(tmp_path)
    row = _row(
        tmp_path, "gate=saturation", f"gate.eps={eps}", f"gate.min_layer={min_layer}", "eval.harness_tasks=[tiny_mc]"
    )
    right_gated = right_full = exited = 0
    tok = lm.tokenizer
    for i, q in enumerate(QUESTIONS):
        ctx = tok(q, add_special_tokens=False)["input_ids"]
        gated, full = [], []
        for choice in CHOICES:
            cont = tok(q + " " + choice, add_special_tokens=False)["input_ids"][len(ctx) :]  # lm-eval's delimiter " "
            lp, n = _brute_logprob(lm, ctx, cont, eps, min_layer)
            exited += n
            gated.append(lp)
            full.append(_brute_logprob(lm, ctx, cont, -1.0, min_layer)[0])
        right_gated += max(range(3), key=gated.__getitem__) == i % 3
        right_full += max(range(3), key=full.__getitem__) == i % 3
    assert exited > 0  # the gate exits on some positions: the gated loglikelihoods are not the full model's
    assert row["task"] == "harness:tiny_mc" and row["task_metric"] == "acc" and row["task_problems"] == len(QUESTIONS)
    assert row["accuracy"] == pytest.approx(right_gated / len(QUESTIONS))
    assert row["accuracy_full"] == pytest.approx(right_full / len(QUESTIONS))
    assert row["accuracy_loss"] == pytest.approx((right_full - right_gated) / len(QUESTIONS))
    assert row["accuracy_loss_lo"] <= row["accuracy_loss"] <= row["accuracy_loss_hi"]


@pytest.mark.slow
def test_generation_at_full_depth_matches_transformers_greedy_and_lm_evals_own_cli(tmp_path):
    lm = load(f"model={MODEL}")
    _gen(tmp_path, lm)
    _mc(tmp_path)
    row = _row(tmp_path, "gate=full", "eval.harness_tasks=[tiny_gen]")
    assert row["task_metric"] == "exact_match"
    assert row["accuracy_full"] == 0.5 and row["accuracy"] == 0.5 and row["accuracy_loss"] == 0.0
    assert row["task_scores_full"] == [1.0, 0.0] * (len(QUESTIONS) // 2)

    eps = _median_delta(lm, 1)
    gated = _row(tmp_path, "gate=saturation", f"gate.eps={eps}", "gate.min_layer=1", "eval.harness_tasks=[tiny_mc]")
    out = tmp_path / "lm-eval-out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sweep.tasks.harness",
            "--model",
            "sweep",
            "--model_args",
            f"model={MODEL},gate=saturation,eps={eps},min_layer=1",
            "--tasks",
            "tiny_mc",
            "--include_path",
            str(tmp_path),
            "--output_path",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=subprocess_env(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "c")),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    assert results["results"]["tiny_mc"]["acc,none"] == pytest.approx(gated["accuracy"])


def test_model_args_name_what_they_may_be(tmp_path):
    from sweep.errors import ConfigError
    from sweep.tasks.harness import model_class

    with pytest.raises(ConfigError, match="--model_args bogus=1: not a gate key"):
        model_class()(model=MODEL, gate="saturation", bogus=1)


@pytest.mark.slow
def test_analyze_reports_accuracy_beside_agreement(tmp_path):
    lm = load(f"model={MODEL}")
    _mc(tmp_path)
    eps = _median_delta(lm, 1)
    rows = [
        _row(tmp_path, "gate=saturation", f"gate.eps={e}", "gate.min_layer=1", "eval.harness_tasks=[tiny_mc]")
        for e in (eps, 2 * eps)
    ]
    done = run_cli("analyze", f"results.root={tmp_path / 'results'}")
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "results" / "report" / "report.md").read_text()
    assert "## Task accuracy" in report and "Fronts of speedup against accuracy" in report
    verdicts = report.split("## Verdicts")[1].split("\n## ")[0]
    full = rows[0]["accuracy_full"]
    assert f"{MODEL} on harness:tiny_mc (acc {full:.3f} at full depth): within 1% loss:" in verdicts
    assert "within 5% loss:" in verdicts
    for r in rows:
        assert f"{r['accuracy']:.3f} [{r['accuracy_lo']:.3f}, {r['accuracy_hi']:.3f}]" in report


@pytest.mark.slow  # the harness loads its task three times (25 s)
def test_a_harness_tasks_side_is_keyed_by_its_documents_not_by_the_files_beside_them(tmp_path):
    """Before: only eval.harness_include's path was in the key (the documents edited, the stale side read); then,
    briefly, every file under it (results written there made every trial measure the side afresh)."""
    from sweep.tasks.evaluate import reference_key, task_data_digest
    from sweep.tasks.harness import check_tasks

    _mc(tmp_path)
    args = ("eval.task=harness", "eval.harness_tasks=[tiny_mc]", f"eval.harness_include={tmp_path}")
    cfg = compose(*args)
    first = task_data_digest(cfg)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "row.parquet").write_bytes(b"a row written beside the task")
    check_tasks.cache_clear()  # (a process reads a task set once)
    assert task_data_digest(cfg) == first
    data = [{"question": q, "choices": CHOICES, "label": (i + 1) % 3} for i, q in enumerate(QUESTIONS)]
    body = "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_target: label\ndoc_to_choice: choices\n"
    _task(tmp_path, "tiny_mc", data, body + "metric_list:\n  - metric: acc\n    aggregation: mean\n")
    check_tasks.cache_clear()
    assert task_data_digest(cfg) != first
    lm = load(f"model={MODEL}")  # a harness task draws its few-shot examples from the seed: the seed is in the key
    assert reference_key(cfg, lm) != reference_key(compose(*args, "seed=1"), lm)
