"""More behaviours at their edges that no other test pinned down, each found by changing the code and seeing every
test pass."""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace

import pytest
import torch


def test_pass_at_k_is_reported_when_each_problem_has_exactly_k_samples():
    """pass@k with exactly k samples per problem would vanish from the row, as if too few samples had been drawn."""
    from sweep.tasks.humaneval import pass_at

    passed = {"HumanEval/0": [True, False], "HumanEval/1": [False, False]}
    got = pass_at(passed, ks=(1, 2))
    # by enumeration: problem 0 passes one draw of its two (1/2) and any draw of both (1); problem 1 never
    assert got == pytest.approx({1: (0.5 + 0.0) / 2, 2: (1.0 + 0.0) / 2})
    assert 3 not in pass_at(passed, ks=(3,))


def test_a_skip_set_may_name_the_largest_layer_number_it_allows():
    """A skip set naming layer MAX_LAYER, which its own error message allows, would be refused."""
    from sweep.gates.skipset import MAX_LAYER, SkipSet

    assert SkipSet.parse(f"a{MAX_LAYER}").attention == frozenset({MAX_LAYER})
    with pytest.raises(ValueError, match=f"at most {MAX_LAYER}"):
        SkipSet.parse(f"a{MAX_LAYER + 1}")


def test_a_row_stopped_at_exactly_the_sweeps_loss_bar_is_measured_again():
    """A resumed sweep would reuse a row stopped early at a loss bound its own max_accuracy_loss would not stop at."""
    from sweep.orchestrate.done import counts_as_done
    from sweep.tasks.evaluate import loss_stop

    # five problems the full model all passes; the gated side fails the first: a certain loss of 1/5 over all five
    assert loss_stop(0.2, [1.0] * 5)([0.0]) is None  # a sweep with max_accuracy_loss=0.2 does not stop there
    assert loss_stop(0.1, [1.0] * 5)([0.0]) == pytest.approx(1 / 5)  # one with 0.1 does
    row = {"status": "ok", "accuracy_loss_min": 0.2}
    search = SimpleNamespace(min_agreement=None, rung_prompts=None, max_accuracy_loss=0.2)
    assert not counts_as_done(row, search)
    assert counts_as_done(row, SimpleNamespace(min_agreement=None, rung_prompts=None, max_accuracy_loss=0.1))


def test_releasing_a_trial_leaves_another_runs_claim_in_place(tmp_path):
    """A driver writing its row would delete the claim of a concurrent sweep still computing that trial."""
    from sweep.orchestrate import claims

    with claims.hold(tmp_path, "t1", claims.Owner.here("run-a", "sweep-a"), lambda: None) as outcome:
        assert outcome.row is None
    path = claims.claim_path(tmp_path, "t1")
    assert path.is_file()
    claims.release(tmp_path, "t1", "run-b")
    assert path.is_file()
    claims.release(tmp_path, "t1", "run-a")
    assert not path.exists()


def test_the_fixed_sequence_rejects_a_p_value_equal_to_epsilon():
    """A threshold whose p-value equals calibrate's epsilon would be refused, certifying a more conservative one."""
    from sweep.trace.calibrate import fixed_sequence

    assert fixed_sequence([0.01, 0.05, 0.2, 0.01], 0.05) == 1
    assert fixed_sequence([0.05], 0.05) == 0
    assert fixed_sequence([0.06, 0.01], 0.05) == -1


@pytest.mark.parametrize("fraction", [0.9, 1.0, 0.0])
def test_the_calibration_split_leaves_a_prompt_on_each_side(fraction):
    """A calibration split of few prompts could leave no held-out prompt, and its held-out risk would be empty."""
    from sweep.trace.calibrate import split

    prompts = ["p0", "p1", "p2"]
    cal, held = split(prompts, fraction, seed=0)
    assert cal and held and sorted(cal + held) == prompts


def test_a_completion_that_starts_with_a_stop_sequence_is_cut_to_nothing():
    """A completion opening with its stop sequence would be scored whole, the next function's text included."""
    from sweep.tasks.completions import cut

    assert cut("\ndef g():\n    pass", ("\ndef", "\nclass")) == ""
    assert cut("    return 1\ndef g():", ("\ndef", "\nclass")) == "    return 1"
    assert cut("    return 1", ("\ndef",)) == "    return 1"


class _WordTokenizer:
    """A GPT-2-like tokenizer: a space belongs to the word after it; a trailing space is a token of its own."""

    eos_token_id = 0

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def __call__(self, text, add_special_tokens=True):
        pieces = re.findall(r" ?\S+| +", text)
        return {"input_ids": [self.vocab.setdefault(p, len(self.vocab) + 1) for p in pieces]}

    def decode(self, ids, skip_special_tokens=True):
        words = {v: k for k, v in self.vocab.items()}
        return "".join(words[i] for i in ids)


def test_the_harness_moves_a_contexts_trailing_space_to_its_continuation():
    """A multiple-choice context ending in a space ("Answer: ") would score an empty continuation, every choice 0."""
    pytest.importorskip("lm_eval")
    from sweep.tasks.harness import Decoders, model_class

    tok = _WordTokenizer()
    lm = model_class()(decoders=Decoders(SimpleNamespace(tokenizer=tok), None, None), max_tokens=4)
    ctx, cont = lm._split("Answer: ", "yes")
    assert tok.decode(ctx) == "Answer:" and tok.decode(cont) == " yes"


def test_a_prompt_of_exactly_max_tokens_is_accepted():
    """A prompt exactly prompts.max_tokens long would be refused as over the limit."""
    from conftest import compose
    from sweep.models.prompts import tokenize_prompts

    cfg = dataclasses.replace(compose("model=tiny-llama").prompts, max_tokens=3, chat_template=False)
    tok = _WordTokenizer()
    (prompt,) = tokenize_prompts([("p", "one two three", "chat")], cfg, tok)
    assert len(prompt.input_ids) == 3
    with pytest.raises(Exception, match="over the limit of 3"):
        tokenize_prompts([("q", "one two three four", "chat")], cfg, tok)


def test_the_skipset_predictor_keeps_a_draft_as_confident_as_draft_stop():
    """The screen would predict no drafts where the closed loop keeps them (it stops only below draft_stop)."""
    from sweep.decode.skipscreen import FirstDrafts, predict

    first = FirstDrafts([torch.tensor([True, True, True, True])], [torch.full((4,), 0.5)])
    got = predict(first, draft_len=2, draft_stop=0.5)
    # by hand: round 1 drafts tokens 2, 3 (both accepted, then the verifier's own token 4); round 2 drafts token 5
    assert got.drafted == [2, 1] and got.accepted == [2, 1] and got.draft_steps == [2, 1]
    assert got.acceptance_rate == 1.0 and got.decode_steps == 4
    assert math.isclose(got.acceptance_length, 1.0 + 1.5)
    assert predict(first, draft_len=2, draft_stop=0.6).drafted == [0, 0, 0, 0]


def test_a_tune_trial_given_up_at_exactly_max_failures_runs_again(tmp_path):
    """A trial Tune gave up on within sweep.max_failures would get failed rows instead of running again."""
    from conftest import TINY_SWEEP
    from sweep.orchestrate.writer import RowWriter
    from sweep.store import files

    base = [*TINY_SWEEP, f"results.root={tmp_path}"]
    trial = ["gate=saturation", "gate.eps=0.1"]
    writer = RowWriter(str(tmp_path), 1, base, "run-a", "sweep-a", "cpu")
    writer.gave_up({"trial": trial}, "the actor died", failures=2, allowed=2)
    assert writer.retry == [trial] and not files("trials", tmp_path)


def test_a_bracket_over_a_layer_index_never_proposes_the_full_depth_layer():
    """A bracket over a fixed gate's exit layer would spend a trial on layer L, which is the full model, no exit."""
    from conftest import compose
    from sweep.gates import GATES
    from sweep.orchestrate.searches._bracket import candidates

    gate = compose("model=tiny-llama", "gate=fixed").gate
    assert candidates(GATES.get("fixed", key="gate"), gate, SimpleNamespace(num_layers=4)) == [1, 2, 3]


def test_a_prompt_start_at_the_sets_end_is_refused():
    """prompts.start at the set's size would run a sweep over no prompts instead of saying where the set ends."""
    from conftest import compose
    from sweep.errors import ConfigError
    from sweep.models.prompts import CHAT_PROMPTS, read_prompts

    size = len(CHAT_PROMPTS)
    cfg = dataclasses.replace(compose("model=tiny-llama", "prompts=chat").prompts, n=None)
    assert [p[0] for p in read_prompts(dataclasses.replace(cfg, start=size - 1))] == [CHAT_PROMPTS[-1][0]]
    with pytest.raises(ConfigError, match=f"prompts.start={size}"):
        read_prompts(dataclasses.replace(cfg, start=size))


def test_the_certifiable_risk_is_zero_when_a_risk_of_zero_just_meets_epsilon():
    """A calibration whose zero-risk p-value equals epsilon would say no risk is certifiable instead of zero."""
    from sweep.trace.calibrate import certifiable_risk

    def linear(risk, n, delta):  # a p-value growing with the risk: p = 0.05 + 2 risk
        return 0.05 + 2 * risk

    assert certifiable_risk(100, 0.5, 0.05, linear) == 0.0
    assert certifiable_risk(100, 0.5, 0.15, linear) == pytest.approx(0.05, abs=1e-9)  # 0.05 + 2 r = 0.15
    assert certifiable_risk(100, 0.5, 0.04, linear) is None


def test_a_cost_measurement_is_the_median_so_one_stall_does_not_move_it(monkeypatch):
    """One slow call among thirty (a page fault, a GC pause) would inflate a measured layer cost and every speedup."""
    import sweep.decode.timing as timing
    from sweep.bench.costs import _median_ms

    now = [0.0]
    durations = iter([0.0] * 3 + [0.001] * 29 + [1.0])  # warm-up calls, then 29 calls of 1 ms and one of 1 s
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def call():
        now[0] += next(durations)

    assert _median_ms(call, torch.device("cpu")) == pytest.approx(1.0)


class _CharTokenizer:
    """One token per character (its code point); no end-of-sequence token."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def test_a_cut_completion_keeps_exactly_the_tokens_its_text_spans():
    """A completion cut at a stop sequence would keep the stop's first token, counted in its tokens and exits."""
    from sweep.tasks.evaluate import _finish

    tokens = [ord(c) for c in "ab\ndef"]
    text, kept, exits = _finish(_CharTokenizer(), tokens, [1, 2, 3, 4, 5, 6], ("\nd",))
    assert text == "ab" and kept == [ord("a"), ord("b")] and exits == [1, 2]
