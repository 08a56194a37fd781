"""Behaviours of the decoder and the model adapters at their edges that no other test pinned down, each found by
changing the code and seeing every test pass."""

from __future__ import annotations

import torch

from conftest import load
from sweep.decode.engine import Engine

PROMPT = list(range(3, 30))


def test_a_stop_rule_sees_every_token_from_the_first_and_ends_the_generation_there():
    """``Engine.generate(stop=...)`` asks the rule after each token with all the tokens so far, the first (decided on
    the prefill) included: a rule met by the first token ends the generation at one token, one met at the third at
    three. Were the first token left out of what the rule sees, every stop sequence would end one token late (a
    task's completion would carry a token past its stop, and a rule met by the first token alone would never fire)."""
    lm = load("model=tiny-llama")
    full = Engine(lm).generate(PROMPT, 6).tokens
    seen: list[list[int]] = []

    def after_three(ids: list[int]) -> bool:
        seen.append(list(ids))
        return len(ids) >= 3

    gen = Engine(lm).generate(PROMPT, 6, stop=after_three)
    assert gen.tokens == full[:3] and len(gen.exit_layers) == 3
    assert seen == [full[:1], full[:2], full[:3]]
    first = Engine(lm).generate(PROMPT, 6, stop=lambda ids: ids[-1:] == full[:1])
    assert first.tokens == full[:1]


def test_teacher_forced_states_are_the_models_own_over_the_given_tokens():
    """``decode_states(generated=...)`` feeds the given tokens, not the model's own greedy ones: its states are those
    of one forward over prompt + generated[:-1] (transformers' own hidden states, layers 0..L-1; h_L is the raw
    residual there, so it is compared through the final norm) and ``greedy`` is that forward's argmax at each step.
    Were the greedy token fed back instead, readouts fitted on a teacher-forced completion would learn from states of
    a sequence nobody gave them (equal only where the completion happens to be greedy)."""
    from sweep.decode.states import decode_states

    lm = load("model=tiny-llama")
    greedy = Engine(lm).generate(PROMPT, 5).tokens
    forced = [(t + 7) % 200 + 3 for t in greedy]  # every token other than the greedy one
    assert all(f != g for f, g in zip(forced, greedy))
    out = decode_states(lm, PROMPT, generated=forced)
    ids = torch.tensor([PROMPT + forced[:-1]])
    with torch.inference_mode():
        ref = lm.model(input_ids=ids, output_hidden_states=True)
    P, L = len(PROMPT), lm.num_layers
    assert out.tokens == forced
    for layer in range(L):
        torch.testing.assert_close(out.states[layer], ref.hidden_states[layer], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lm.adapter.norm(out.states[L]), ref.hidden_states[L], rtol=1e-4, atol=1e-5)
    assert out.greedy == ref.logits[0, P - 1 :].argmax(-1).tolist()


def test_a_batch_row_whose_first_token_meets_the_stop_rule_ends_at_that_token():
    """In a batch, the stop rule is asked of each row's first token too (decided on the prefill): a row it stops
    there ends with that one token, as ``Engine.generate`` with the same rule ends, and a batch whose rows all stop
    there runs no decode step. Were the first token not asked, such a row would decode on until a later token met
    the rule: its completion would run past its stop and differ from the same prompt decoded alone."""
    from sweep.decode.batching import BatchEngine

    lm = load("model=tiny-llama")
    prompts = [PROMPT, PROMPT[5:]]
    firsts = [Engine(lm).generate(p, 1).tokens[0] for p in prompts]
    out = BatchEngine(lm).generate_batch(prompts, 6, stop=lambda ids: True)
    assert out.tokens == [[t] for t in firsts] and out.step_rows == []
    stop_first_row = lambda ids: ids[-1:] == firsts[:1]  # noqa: E731
    alone = [Engine(lm).generate(p, 6, stop=stop_first_row).tokens for p in prompts]
    together = BatchEngine(lm).generate_batch(prompts, 6, stop=stop_first_row)
    assert together.tokens == alone and together.tokens[0] == firsts[:1]


def test_a_prefix_draft_of_every_layer_is_refused_and_one_short_of_it_is_not():
    """A prefix draft runs layers 1..K with K in 1..L-1: K = L would draft with the whole model (every draft
    accepted, each costing a full step: a self-speculative trial slower than full depth by construction), so it is a
    one-line refusal naming the range, while K = L - 1, the deepest real draft, is taken."""
    import pytest

    from sweep.decode.speculative import PrefixDraft, SelfSpeculative
    from sweep.errors import ConfigError

    lm = load("model=tiny-llama")
    L = lm.num_layers
    with pytest.raises(ConfigError, match=rf"gate.exit_layer={L}: .* K in 1..{L - 1}"):
        PrefixDraft(lm, L)
    gen = SelfSpeculative(lm, PrefixDraft(lm, L - 1), 2).generate(PROMPT, 5)
    assert gen.tokens == Engine(lm).generate(PROMPT, 5).tokens


def _tokenizing_model(context: int, embeddings: int):
    """What ``tokenize_for`` reads of a loaded model: tiny-llama's tokenizer, a context and an embedding count."""
    from types import SimpleNamespace

    lm = load("model=tiny-llama")
    adapter = SimpleNamespace(
        config=SimpleNamespace(max_position_embeddings=context), embed=SimpleNamespace(num_embeddings=embeddings)
    )
    return SimpleNamespace(name="tiny-llama", tokenizer=lm.tokenizer, adapter=adapter)


def test_a_prompt_is_checked_against_the_context_left_after_the_tokens_to_generate():
    """``tokenize_for`` leaves room in the model's context for the tokens to generate: a prompt that fits the
    context alone but not with ``bench.gen_tokens`` more is refused naming that key (and how many would fit), while
    the same prompt with a generation that fits is taken. Were the whole context the room, the run would decode past
    the model's positions (garbage or an index error mid-trial) instead of failing at once."""
    import pytest

    from conftest import compose
    from sweep.errors import ConfigError
    from sweep.models.workload import tokenize_for

    cfg = compose("prompts=chat").prompts
    items = [("p", "What is the capital of France?", "chat")]
    n = len(tokenize_for(_tokenizing_model(4096, 10**6), items, cfg, ("bench.gen_tokens", 1))[0].input_ids)
    fits = tokenize_for(_tokenizing_model(n + 8, 10**6), items, cfg, ("bench.gen_tokens", 8))
    assert len(fits[0].input_ids) == n
    with pytest.raises(ConfigError, match=r"bench.gen_tokens=9: .* at most 8 here"):
        tokenize_for(_tokenizing_model(n + 8, 10**6), items, cfg, ("bench.gen_tokens", 9))


def test_a_token_id_equal_to_the_embedding_count_is_refused():
    """Ids index the embedding, so the largest valid id is vocab_size - 1: a prompt whose tokenizer gives an id equal
    to the model's embedding count is refused at tokenization (a tokenizer of another model), not left to an index
    error mid-decode; one embedding more and it is taken."""
    import pytest

    from conftest import compose
    from sweep.errors import InputError
    from sweep.models.workload import tokenize_for

    cfg = compose("prompts=chat").prompts
    items = [("p", "What is the capital of France?", "chat")]
    top = max(tokenize_for(_tokenizing_model(4096, 10**6), items, cfg, ("bench.gen_tokens", 1))[0].input_ids)
    with pytest.raises(InputError, match=rf"token id {top} .* past the model's {top} embeddings"):
        tokenize_for(_tokenizing_model(4096, top), items, cfg, ("bench.gen_tokens", 1))
    assert max(tokenize_for(_tokenizing_model(4096, top + 1), items, cfg, ("bench.gen_tokens", 1))[0].input_ids) == top


def test_a_pick_chooses_each_token_by_its_own_index_and_the_logits_follow_the_picked_tokens():
    """``generate(pick=...)`` asks ``pick(logits, index)`` for token ``index`` (0 for the token decided on the
    prefill) and feeds what it picks: a pick that teacher-forces a fixed completion gets exactly that completion,
    and the recorded logits of each token are the model's own over the prompt and the forced tokens before it (one
    forward of transformers over the whole sequence). Were the index off by one, a teacher-forced score (the task
    harness's log-likelihoods) would read each token's logits against its neighbour's token."""
    lm = load("model=tiny-llama")
    greedy = Engine(lm).generate(PROMPT, 5).tokens
    forced = [(t + 11) % 200 + 3 for t in greedy]
    asked: list[int] = []

    def teacher(logits: torch.Tensor, index: int) -> torch.Tensor:
        asked.append(index)
        return torch.tensor([[forced[index]]], device=logits.device)

    gen = Engine(lm).generate(PROMPT, 5, pick=teacher, record=True)
    assert asked == [0, 1, 2, 3, 4] and gen.tokens == forced
    with torch.inference_mode():
        ref = lm.model(input_ids=torch.tensor([PROMPT + forced[:-1]])).logits[0, len(PROMPT) - 1 :]
    torch.testing.assert_close(gen.logits, ref.float(), rtol=1e-4, atol=1e-4)


def test_a_crop_to_the_length_a_recording_sliding_layer_holds_trims_it_back_to_its_window():
    """A recording cache (``new_cache(record=...)``, what self-speculation decodes into) lets a sliding-window layer
    keep every position until the next crop, so a crop can roll it back; a crop to the length it already holds trims
    it to the window's last positions, as the model itself keeps them (self-speculation does so after its prefill).
    Without that trim a sliding layer would hold every position of a prompt for the whole generation: the memory of
    full attention, and a longer key range than the window's to carry through each decode step."""
    lm = load("model=tiny-gemma3")  # a window of 16 positions on its sliding layers
    adapter = lm.adapter
    window = adapter.config.sliding_window
    prompt = list(range(3, 3 + 2 * window + 5))
    cache = adapter.new_cache(record=3)
    with torch.inference_mode():
        adapter.forward(torch.tensor([prompt]), cache)
    sliding = [layer for layer in cache.layers if hasattr(layer, "cumulative_length")]
    assert sliding and all(layer.keys.shape[-2] == len(prompt) for layer in sliding)  # recorded: every position
    adapter.crop_cache(cache, len(prompt))
    assert all(layer.keys.shape[-2] == window - 1 for layer in sliding)
    assert all(int(layer.cumulative_length) == len(prompt) for layer in sliding)
    plain = adapter.new_cache()
    with torch.inference_mode():
        adapter.forward(torch.tensor([prompt]), plain)
    for mine, own in zip(sliding, [layer for layer in plain.layers if hasattr(layer, "cumulative_length")]):
        torch.testing.assert_close(mine.keys, own.keys)


def test_a_chat_prompt_carries_one_bos_where_the_tokenizer_adds_one_of_its_own():
    """The chat template writes the BOS itself, so the rendered prompt is tokenized without the tokenizer's own
    specials: a tokenizer that prepends a BOS to plain text (Llama's, Gemma's) must not give a templated prompt a
    second one, which shifts every position and is a prompt the model never saw in training. A raw-text prompt
    (``prompts.chat_template=false``) still gets the tokenizer's BOS."""
    from tokenizers.processors import TemplateProcessing

    from conftest import compose
    from sweep.models._tiny import byte_tokenizer
    from sweep.models.prompts import tokenize_prompts

    tok = byte_tokenizer()
    bos = tok.bos_token_id
    tok.backend_tokenizer.post_processor = TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", bos)])
    assert tok("hi")["input_ids"][0] == bos  # this tokenizer adds a BOS to plain text
    items = [("p", "What is the capital of France?", "chat")]
    templated = tokenize_prompts(items, compose("prompts=chat").prompts, tok)[0].input_ids
    assert templated[0] == bos and templated.count(bos) == 1
    assert tok.decode(templated[1:]).startswith("<|user|>What is the capital")
    raw = tokenize_prompts(items, compose("prompts=chat", "prompts.chat_template=false").prompts, tok)[0].input_ids
    assert raw[0] == bos and raw.count(bos) == 1 and tok.decode(raw[1:]) == items[0][1]


def test_the_recorded_exit_hidden_state_of_every_token_is_the_exit_layers_output_the_first_included():
    """``generate(record=True)`` keeps, per exited token, h at its exit layer: the first token's (decided on the
    prefill's last position) as every later one's. A fixed exit after layer 2 never skips a layer that layers 1..2
    read, so each kept state is transformers' own hidden state 2 over prompt + tokens (one forward), and each token
    the argmax of its logit lens. Were the first token's state taken from the layer before its exit, what a check or a
    readout fit reads for that token would be another layer's."""
    from sweep.config import GateConfig
    from sweep.gates import make_gate

    lm = load("model=tiny-llama")
    gate = make_gate(GateConfig(name="fixed", min_layer=1, exit_layer=2), lm)
    gen = Engine(lm, gate, "propagate").generate(PROMPT, 5, record=True)
    assert gen.exit_layers == [2] * 5 and len(gen.exit_hidden) == 5
    with torch.inference_mode():
        ref = lm.model(input_ids=torch.tensor([PROMPT + gen.tokens[:-1]]), output_hidden_states=True).hidden_states[2]
        for i, h in enumerate(gen.exit_hidden):
            torch.testing.assert_close(h[0, -1], ref[0, len(PROMPT) - 1 + i], rtol=1e-4, atol=1e-5)
            assert int(lm.adapter.lens(h[0, -1]).argmax()) == gen.tokens[i]


def test_self_speculation_whose_every_draft_is_dropped_accepts_nothing_and_decodes_one_token_a_round():
    """With ``draft_stop`` at 1 no draft is confident enough: each round computes one draft pass, drops it and
    verifies the committed token alone, so the output is still full-depth greedy, one token per verification, with
    nothing drafted and an acceptance rate of 0 (not 1: a trial that accepted nothing must not read as one whose
    every draft was right)."""
    from sweep.decode.speculative import PrefixDraft, SelfSpeculative

    lm = load("model=tiny-llama")
    gen = SelfSpeculative(lm, PrefixDraft(lm, 2), 3, draft_stop=1.0).generate(PROMPT, 6)
    assert gen.tokens == Engine(lm).generate(PROMPT, 6).tokens
    assert gen.rounds == 5 and gen.drafted == 0 and gen.accepted == 0 and gen.draft_steps == [1] * 5
    assert gen.acceptance_rate == 0.0 and gen.tokens_per_verification == 1.0
