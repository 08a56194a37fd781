"""A peer's harness for prefix self-speculation: transformers' own ``generate(assistant_early_exit=K)`` against the
project's ``SelfSpeculative(PrefixDraft(K))``, on the same prompts, with the same K and draft length, run back to back
(the order alternates per repeat), both greedy from the same loaded model.

Like for like: transformers' early-exit candidate generator reads its draft length, schedule and confidence stop from
the assistant's own generation config (the model's: the assistant is the model itself), not from ``generate``'s
arguments, so they are set there for each call (a constant draft length, no confidence stop, no stop at the end of
sequence token, as the project's decoder); and its prompt ends with the token the project's prefill gives (else its
first verification checks that token, a round the project's decoder does not have), so both decode the same n tokens
after the same prefill's work.

Per K it prints: whether the two decoded the same tokens (both must equal full-depth greedy: self-speculation is
lossless), each one's verifications and drafts accepted, whether their rounds are the same (each verification starting
at the same token and accepting as many drafts; at the very end transformers drafts one fewer, leaving room for the
verification's own token, so its last verification accepts at most the drafts it made), the acceptance rates, and
each one's ms per generated token (median over repeats) beside plain full-depth decoding's, so the ratio is measured
side by side in one run.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/peer_early_exit.py [model=qwen2.5-coder-0.5b] \\
        [--ks 12,18,21] [--draft-len 4] [--prompts 4] [--tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock


def hf_early_exit(lm, prompt: list[int], k: int, draft_len: int, n: int) -> tuple[list[int], list[dict], float]:
    """transformers' assistant_early_exit: its tokens, per verification its start (tokens generated before it), the
    drafts it proposed and accepted (its candidate generator is told each verification's matches), and its seconds."""
    import torch
    from transformers.generation.candidate_generator import EarlyExitCandidateGenerator as Generator

    rounds: list[dict] = []
    get, told = Generator.get_candidates, Generator.update_candidate_strategy

    def proposed(self, input_ids, **kwargs):
        ids, logits = get(self, input_ids, **kwargs)
        rounds.append({"start": input_ids.shape[1] - len(prompt), "drafted": ids.shape[1] - input_ids.shape[1]})
        return ids, logits

    def matched(self, input_ids, scores, num_matches):
        rounds[-1]["accepted"] = int(num_matches)
        return told(self, input_ids, scores, num_matches)

    assistant = {  # read from the assistant's own generation config (the model's), not from generate's arguments
        "num_assistant_tokens": draft_len,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
        "eos_token_id": None,
    }
    ids = torch.tensor([prompt])
    # a pad id the prompt does not hold: transformers infers an all-ones mask (an explicit one passed to generate
    # changes its drafts: benchmarks/RESULTS.md), and no prompt token is masked as padding
    held = set(prompt)
    pad = next(i for i in range(len(prompt) + 1) if i not in held)
    # patched for the call and put back as they were (an inherited method is removed from the class again)
    with mock.patch.multiple(Generator, get_candidates=proposed, update_candidate_strategy=matched):
        with mock.patch.multiple(lm.model.generation_config, **assistant), torch.inference_mode():
            t0 = time.perf_counter()
            out = lm.model.generate(ids, pad_token_id=pad, max_new_tokens=n, do_sample=False, assistant_early_exit=k)
            seconds = time.perf_counter() - t0
    return out[0, len(prompt) :].tolist(), rounds, seconds


def same_rounds(ours, theirs: list[dict], draft_len: int, n: int) -> bool:
    """Whether the two ran the same verifications: the same starts, transformers drafting the whole draft length
    short of the end (its rule: n - start - 1, leaving room for the verification's own token; ours: n - start), as
    many drafts accepted in each, and in the last at most the drafts transformers made there."""
    starts = ours.round_starts
    if not theirs or [r["start"] + 1 for r in theirs] != starts:
        return False
    if [r["drafted"] for r in theirs] != [min(draft_len, n - s - 1) for s in starts]:
        return False
    *before, last = theirs
    return [r["accepted"] for r in before] == ours.accepted_lengths[:-1] and last["accepted"] == min(
        ours.accepted_lengths[-1], last["drafted"]
    )


def main() -> None:
    from sweep.config import compose
    from sweep.decode.engine import Engine
    from sweep.decode.speculative import PrefixDraft, SelfSpeculative
    from sweep.models import load_model
    from sweep.tasks import humaneval

    ap = argparse.ArgumentParser()
    ap.add_argument("overrides", nargs="*", default=["model=qwen2.5-coder-0.5b"])
    ap.add_argument("--ks", default="12,18,21")
    ap.add_argument("--draft-len", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cfg = compose(args.overrides or ["model=qwen2.5-coder-0.5b"])
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
    problems = humaneval.problems(args.start + args.prompts)[args.start :]
    prompts = [lm.tokenizer(p["prompt"])["input_ids"] for p in problems]
    n = args.tokens
    full = Engine(lm)
    greedy = [full.generate(p, n).tokens for p in prompts]
    print(
        f"{lm.name}: {len(prompts)} HumanEval prompts ({problems[0]['task_id']}..{problems[-1]['task_id']}) x {n} "
        f"tokens, draft_len {args.draft_len}, {args.repeats} repeats, order alternating"
    )
    print(
        "| K | same tokens (ours, theirs vs greedy) | verifications, ours / theirs | drafts accepted, ours / theirs | "
        "same rounds | acceptance rate, ours / theirs | ms/token ours | theirs | full depth |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for k in (int(x) for x in args.ks.split(",")):
        ours_spec = SelfSpeculative(lm, PrefixDraft(lm, k), args.draft_len)
        same_ours = same_theirs = same = True
        count = {"ours": [0, 0, 0], "theirs": [0, 0, 0]}  # verifications, drafts accepted, drafts made
        ms = {"ours": [], "theirs": [], "full": []}
        for r in range(args.repeats):
            for i, prompt in enumerate(prompts):
                order = ("ours", "theirs", "full") if (r + i) % 2 == 0 else ("full", "theirs", "ours")
                for who in order:
                    if who == "ours":
                        t0 = time.perf_counter()
                        out = ours_spec.generate(prompt, n)
                        ms["ours"].append((time.perf_counter() - t0) * 1000 / n)
                    elif who == "theirs":  # its prompt ends with the token our prefill gives: the same n tokens
                        tokens, rounds, seconds = hf_early_exit(lm, prompt + greedy[i][:1], k, args.draft_len, n - 1)
                        ms["theirs"].append(seconds * 1000 / n)
                    else:
                        t0 = time.perf_counter()
                        full.generate(prompt, n)
                        ms["full"].append((time.perf_counter() - t0) * 1000 / n)
                if r == 0:
                    same_ours &= out.tokens == greedy[i]
                    same_theirs &= greedy[i][:1] + tokens == greedy[i]
                    same &= same_rounds(out, rounds, args.draft_len, n)
                    for who, v in (("ours", (out.rounds, out.accepted, out.drafted)), ("theirs", _counts(rounds))):
                        count[who] = [a + b for a, b in zip(count[who], v)]
        med = {who: statistics.median(v) for who, v in ms.items()}
        (vo, ao, do), (vt, at, dt) = count["ours"], count["theirs"]
        print(
            f"| {k} | {same_ours}, {same_theirs} | {vo} / {vt} | {ao} / {at} | {same} | "
            f"{ao / max(do, 1):.3f} / {at / max(dt, 1):.3f} | "
            f"{med['ours']:.1f} | {med['theirs']:.1f} | {med['full']:.1f} |",
            flush=True,
        )


def _counts(rounds: list[dict]) -> tuple[int, int, int]:
    return len(rounds), sum(r["accepted"] for r in rounds), sum(r["drafted"] for r in rounds)


if __name__ == "__main__":
    main()
