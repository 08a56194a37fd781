"""Prompt sets: real text through the tokenizer, n deterministic, bad files named by line."""

from __future__ import annotations

import json

import pytest

from conftest import compose, load
from sweep.errors import InputError
from sweep.models.prompts import CHAT_PROMPTS, read_prompts, tokenize_prompts


@pytest.fixture(scope="module")
def tok():
    return load("model=tiny-llama").tokenizer


def test_chat_prompts_go_through_the_chat_template(tok):
    cfg = compose("prompts=chat", "prompts.n=3").prompts
    prompts = tokenize_prompts(read_prompts(cfg), cfg, tok)
    assert [p.id for p in prompts] == ["chat/0", "chat/1", "chat/2"]
    text = tok.decode(list(prompts[0].input_ids))
    assert text.startswith("<|bos|><|user|>") and text.endswith("<|assistant|>")
    assert CHAT_PROMPTS[0][1] in text


def test_chat_template_off_tokenizes_plain_text(tok):
    cfg = compose("prompts=chat", "prompts.n=1", "prompts.chat_template=false").prompts
    (p,) = tokenize_prompts(read_prompts(cfg), cfg, tok)
    assert tok.decode(list(p.input_ids)) == CHAT_PROMPTS[0][1]


def test_n_is_a_deterministic_prefix():
    cfg_all = compose("prompts=humaneval").prompts
    cfg_3 = compose("prompts=humaneval", "prompts.n=3").prompts
    all_items = read_prompts(cfg_all)
    assert len(all_items) == 164
    assert read_prompts(cfg_3) == all_items[:3] == read_prompts(cfg_3)
    assert [i for i, _, _ in all_items[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert {c for _, _, c in all_items} == {"code"}  # HumanEval is code
    assert "def " in all_items[0][1]


def test_n_larger_than_the_set_takes_all(caplog):
    """... and says so (before: silently, though the row's n_prompts counted them)."""
    import logging

    with caplog.at_level(logging.WARNING, logger="sweep.models.prompts"):
        assert len(read_prompts(compose("prompts=chat", "prompts.n=997").prompts)) == len(CHAT_PROMPTS)
        read_prompts(compose("prompts=chat", f"prompts.n={len(CHAT_PROMPTS)}").prompts)  # exactly all: nothing said
    lines = [r.getMessage() for r in caplog.records if r.name == "sweep.models.prompts"]
    assert lines == [
        f"prompts.n=997: the chat set has {len(CHAT_PROMPTS)} prompts from prompts.start=0; taking those "
        f"{len(CHAT_PROMPTS)} (rows count them in n_prompts)"
    ]


def jsonl(tmp_path, lines):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return compose("prompts=jsonl", f"prompts.path={path}").prompts


def test_jsonl_good_file(tmp_path, tok):
    cfg = jsonl(tmp_path, [json.dumps({"id": "a", "prompt": "hello"}), "", json.dumps({"id": 7, "prompt": "world"})])
    prompts = tokenize_prompts(read_prompts(cfg), cfg, tok)
    assert [(p.id, p.text) for p in prompts] == [("a", "hello"), ("7", "world")]
    assert tok.decode(list(prompts[0].input_ids)) == "hello"


@pytest.mark.parametrize(
    "lines,message",
    [
        (['{"id": "a", "prompt": "x"}', '{"id": "b", "prompt": '], "line 2: not valid JSON"),
        (['{"id": "a", "prompt": "x"}', '{"id": "b"}'], 'line 2: expected an object with "id" and "prompt"'),
        (['["a", "x"]'], 'line 1: expected an object with "id" and "prompt"'),
        (['{"id": "a", "prompt": ""}'], 'line 1: "id" must be a string or integer and "prompt" a non-empty string'),
        (['{"id": null, "prompt": "x"}'], 'line 1: "id" must be a string or integer'),
        (['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'], "line 2: duplicate id 'a'"),
        ([""], "no prompts in the file"),
    ],
)
def test_jsonl_bad_lines_name_the_line(tmp_path, lines, message):
    cfg = jsonl(tmp_path, lines)
    with pytest.raises(InputError) as info:
        read_prompts(cfg)
    assert message in str(info.value) and str(cfg.path) in str(info.value)


def test_jsonl_missing_file(tmp_path):
    cfg = compose("prompts=jsonl", f"prompts.path={tmp_path}/none.jsonl").prompts
    with pytest.raises(InputError, match="none.jsonl: no such file"):
        read_prompts(cfg)


def test_too_long_prompt_is_an_error_not_truncated(tok):
    cfg = compose("prompts=humaneval", "prompts.n=1", "prompts.max_tokens=10").prompts
    with pytest.raises(InputError, match=r"prompt HumanEval/0: \d+ tokens, over the limit of 10"):
        tokenize_prompts(read_prompts(cfg), cfg, tok)
