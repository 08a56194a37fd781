"""A user's own model directory (``model=hf model.path=DIR``): what cannot be measured is one line naming
``model.path``, rc 2, before the work (a sweep's before Ray starts); a model directory never runs code of its own."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from conftest import load, run_cli
from sweep.cli.commands import main

TINY = ["prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0", "gate=full"]


@pytest.fixture(scope="module")
def own(hf_dir) -> Path:
    """tiny-llama saved as a user's HF model directory (``conftest.hf_dir``)."""
    return hf_dir


def _bench(path: Path | str, root: Path, capsys) -> tuple[int, list[str]]:
    code = main(["bench", "model=hf", f"model.path={path}", *TINY, f"results.root={root}"])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def _with_code_of_its_own(own: Path, where: Path, model_type: str) -> Path:
    """``own`` with a config naming code of its own (auto_map) that, run, writes ``where/RAN``."""
    shutil.copytree(own, where)
    config = json.loads((where / "config.json").read_text())
    config.update(model_type=model_type, auto_map={"AutoConfig": "configuration_own.OwnConfig"})
    (where / "config.json").write_text(json.dumps(config))
    (where / "configuration_own.py").write_text(
        f"import pathlib\npathlib.Path({str(where / 'RAN')!r}).write_text('ran')\n"
        "from transformers import LlamaConfig\n\n\nclass OwnConfig(LlamaConfig):\n    model_type = "
        f"{model_type!r}\n"
    )
    return where


def test_a_model_directory_that_names_code_of_its_own_is_refused_and_its_code_never_runs(own, tmp_path, capsys):
    """A config whose model type only its own code (auto_map) defines: one line, the code not run (transformers asks
    on a terminal and runs it on a yes); a model type transformers ships loads as transformers' own class, the
    directory's code not run either."""
    theirs = _with_code_of_its_own(own, tmp_path / "theirs", "ownmodel")
    code, errors = _bench(theirs, tmp_path / "r", capsys)
    assert code == 2 and errors == [
        f"error: model.path={theirs}: its files name Python code of their own (auto_map) for a model type "
        "transformers does not ship; sweep does not run a model's own code (trust_remote_code=False): use a model "
        "whose model_type transformers has"
    ]
    assert not (theirs / "RAN").exists() and not (tmp_path / "r").exists()

    shipped = _with_code_of_its_own(own, tmp_path / "shipped", "llama")
    code, errors = _bench(shipped, tmp_path / "r2", capsys)
    assert code == 0 and errors == [] and not (shipped / "RAN").exists()


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_a_sweep_of_a_directory_that_cannot_load_is_refused_before_ray_starts(own, tmp_path):
    """No weights (a Trainer's arguments are not), a file for a directory, a model type transformers does not know,
    a masked LM: one line naming model.path, rc 2, and no results root (before: Ray started and a failed row was
    written per setting)."""
    empty = tmp_path / "noweights"
    empty.mkdir()
    shutil.copy(own / "config.json", empty / "config.json")
    unknown = tmp_path / "unknown"
    shutil.copytree(own, unknown)
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "model_type": "frobnicator"}))
    (empty / "training_args.bin").write_bytes(b"a Trainer's arguments, not weights")
    from transformers import BertConfig, BertForMaskedLM

    masked = tmp_path / "masked"
    BertForMaskedLM(
        BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=600)
    ).save_pretrained(masked)
    cases = {
        empty: "no weights in this directory (model*.safetensors or pytorch_model*.bin)",
        masked: "its weights are a BertForMaskedLM (config.json's architectures), not a causal LM",
        own / "config.json": "a file, not a model directory; model=hf takes an HF model directory",
        unknown: "config.json's model_type is not one transformers",
    }
    for path, line in cases.items():
        root = tmp_path / f"r-{path.name}"
        out = run_cli("run", "model=hf", f"model.path={path}", *TINY, f"results.root={root}")
        errors = [e for e in out.stderr.splitlines() if e.startswith("error:")]
        assert out.returncode == 2 and len(errors) == 1 and line in errors[0], out.stderr[-2000:]
        assert f"model.path={path}" in errors[0] and "Ray" not in out.stderr and not root.exists()


def test_an_empty_model_path_says_what_model_hf_takes(tmp_path, capsys):
    code, errors = _bench("", tmp_path / "r", capsys)
    assert code == 2 and errors == [
        "error: model.path=: empty; model=hf takes model.path=DIR (an HF model directory) or a hub id org/name"
    ]


def test_encoder_decoder_and_encoder_only_models_say_what_sweep_measures(own, tmp_path, capsys):
    """BART has a causal-LM class in transformers (its decoder) and BERT one (BertLMHeadModel): neither is the
    decoder-only LM the directory holds, and each is one line saying so (before: "the checkpoint does not fit its
    config ... fix config.json")."""
    from transformers import BartConfig, BartForConditionalGeneration, BertConfig, BertModel

    small = dict(vocab_size=600, max_position_embeddings=64)
    bart = tmp_path / "bart"
    BartForConditionalGeneration(
        BartConfig(
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            **small,
        )
    ).save_pretrained(bart)
    bert = tmp_path / "bert"
    BertModel(
        BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, **small)
    ).save_pretrained(bert)
    for path in (bart, bert):
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(own / name, path / name)
    code, errors = _bench(bart, tmp_path / "r", capsys)
    assert code == 2 and errors == [
        f"error: model.path={bart}: model_type 'bart' is an encoder-decoder model; sweep measures decoder-only causal "
        "LMs"
    ]
    code, errors = _bench(bert, tmp_path / "r", capsys)
    assert code == 2 and errors == [
        f"error: model.path={bert}: its weights are a BertModel (config.json's architectures), not a causal LM; "
        "sweep measures decoder-only causal LMs"
    ]


def test_a_tokenizer_of_another_model_is_one_line_not_an_index_error(own, tmp_path, capsys):
    """A model of 64 embeddings beside a tokenizer whose ids go past them (tiny-llama's byte tokenizer): one line
    naming the id, the prompt and the embeddings, before any decoding (before: an IndexError mid-decode)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    small = tmp_path / "small"
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
    )
    LlamaForCausalLM(config).save_pretrained(small)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(own / name, small / name)
    code, errors = _bench(small, tmp_path / "r", capsys)
    assert code == 2 and len(errors) == 1, errors
    assert errors[0].startswith("error: model=small: its tokenizer gives token id ") and errors[0].endswith(
        "for prompt chat/0, past the model's 64 embeddings (vocab_size); the tokenizer is another model's"
    )


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_a_sweep_over_model_files_changed_since_their_rows_is_refused_before_the_work(own, tmp_path, capsys):
    """A trial's id names a model directory's path, not its content: after the weights there change, the rows made
    with the old ones counted as done and came back as the new model's figures (a reader's run: agreement 1.0 shown
    for a model at 0.0). Now one line naming the path, both hashes and what to do, rc 2, before Ray starts."""
    mine = tmp_path / "mine"
    shutil.copytree(own, mine)
    root = tmp_path / "r"
    code, errors = _bench(mine, root, capsys)
    assert code == 0 and errors == []
    load("model=tiny-llama", "seed=7").model.save_pretrained(mine)  # other weights, the same path and shapes
    out = run_cli("run", "model=hf", f"model.path={mine}", *TINY, f"results.root={root}")
    errors = [e for e in out.stderr.splitlines() if e.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr[-2000:]
    assert errors[0].startswith(f"error: model.path={mine}: its files are not the ones 1 row(s) under results.root")
    assert errors[0].endswith("measure them again with sweep.rerun=true, or write to another results.root")
    assert "Ray" not in out.stderr and not (root / "ray").exists()


def test_two_models_under_one_label_are_named_in_a_warning_by_analyze(own, tmp_path, capsys, caplog):
    """Two directories of one name (a/ckpt, b/ckpt: other weights) both land under model=ckpt, and every table
    pooled them without a word (a reader's verdict named one speedup for the two). `sweep analyze` names the label and
    its two model hashes."""
    root = tmp_path / "r"
    for where, seed in (("a", "seed=0"), ("b", "seed=7")):
        shutil.copytree(own, tmp_path / where / "ckpt")
        load("model=tiny-llama", seed).model.save_pretrained(tmp_path / where / "ckpt")
        code, errors = _bench(tmp_path / where / "ckpt", root, capsys)
        assert code == 0 and errors == []
    with caplog.at_level(logging.WARNING, logger="sweep"):
        assert main(["analyze", f"results.root={root}"]) == 0
    [line] = [r.getMessage() for r in caplog.records if "share a label" in r.getMessage()]
    assert "ckpt (2 models: model_hash dir-sha256:" in line and "give each model its own results.root" in line


def test_a_tokenizer_without_a_chat_template_is_said_to_give_the_raw_text(own, tmp_path, capsys, caplog):
    """prompts.chat_template (on by default) on a tokenizer that has none fell back to the raw text without a word,
    while the row's key says chat_template true: one info line says so."""
    plain = tmp_path / "plain"
    shutil.copytree(own, plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.INFO, logger="sweep"):
        code, errors = _bench(plain, tmp_path / "r", capsys)
    assert code == 0 and errors == []
    assert "the model's tokenizer has no chat template: its prompts are the raw text" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sweep"):
        assert _bench(own, tmp_path / "r2", capsys) == (0, [])
    assert "no chat template" not in caplog.text
