"""The workload every command that decodes loads the same way: read the prompts (a bad prompts
file fails before the model loads), load the model, check each prompt leaves room in the model's
context for the tokens to generate, tokenize."""

from __future__ import annotations

from typing import Callable

from sweep.errors import InputError
from sweep.models._loader import LoadedModel, ModelCache, load_model
from sweep.models.prompts import Prompt, read_prompts, tokenize_prompts


def load_workload(
    cfg,
    gen: tuple[str, int],
    *,
    check: Callable[[LoadedModel], None] | None = None,
    prompts_cfg=None,
    models: ModelCache | None = None,
) -> tuple[LoadedModel, list[Prompt]]:
    """``cfg``'s model and prompts (``prompts_cfg`` in place of ``cfg.prompts`` when given), tokenized
    with room for ``gen`` (the key and value of the tokens to generate, named in an error); ``check``
    runs on the loaded model before the prompts are tokenized (what the command requires of it). The
    model comes from ``models`` (a session's cache) when it holds it."""
    pc = prompts_cfg if prompts_cfg is not None else cfg.prompts
    items = read_prompts(pc)
    lm = load_model(
        cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed, keep=cfg.resources.models, cache=models
    )
    if check is not None:
        check(lm)
    return lm, tokenize_for(lm, items, pc, gen)


def tokenize_for(lm: LoadedModel, items: list[tuple[str, str]], prompts_cfg, gen: tuple[str, int]) -> list[Prompt]:
    """``items`` tokenized for ``lm``, each leaving room in its context for ``gen`` tokens."""
    room = getattr(lm.adapter.config, "max_position_embeddings", None)
    prompts = tokenize_prompts(items, prompts_cfg, lm.tokenizer, room=None if room is None else room - gen[1], gen=gen)
    rows = getattr(getattr(lm.adapter, "embed", None), "num_embeddings", None)
    for prompt in prompts:  # a tokenizer of another model: an id past the embedding is an IndexError mid-decode
        if rows is not None and max(prompt.input_ids) >= rows:
            raise InputError(
                f"model={lm.name}: its tokenizer gives token id {max(prompt.input_ids)} for "
                f"prompt {prompt.id}, past the model's {rows} embeddings (vocab_size); the tokenizer is another "
                "model's"
            )
    return prompts
