"""A peer's harness for prefix self-speculation: transformers' own ``generate(assistant_early_exit=K)`` (a constant
draft length, no confidence stop) against the project's ``SelfSpeculative(PrefixDraft(K))``, on the same prompts,
with the same K and draft length, run back to back (the order alternates per repeat), both greedy from the same
loaded model.

Per K it prints: whether the two decoded the same tokens (both must equal full-depth greedy: self-speculation is
lossless), the drafts accepted per verification by each (transformers' first verification checks the prompt's own
first token, a round the project's decoder does not have: it is left out), the acceptance rate by each, and each
one's ms per generated token (median over repeats) beside plain full-depth decoding's, so the ratio is measured side
by side in one run.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/peer_early_exit.py [model=qwen2.5-coder-0.5b] \\
        [--ks 12,18,21] [--draft-len 4] [--prompts 4] [--tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time


def hf_early_exit(lm, prompt: list[int], k: int, draft_len: int, n: int) -> tuple[list[int], list[int], float]:
    """transformers' assistant_early_exit: its tokens, the drafts it accepted per verification (its candidate
    generator is told each verification's matches) and its seconds."""
    import torch
    from transformers.generation.candidate_generator import EarlyExitCandidateGenerator

    matches: list[int] = []
    plain = EarlyExitCandidateGenerator.update_candidate_strategy

    def told(self, input_ids, scores, num_matches):
        matches.append(int(num_matches))
        return plain(self, input_ids, scores, num_matches)

    EarlyExitCandidateGenerator.update_candidate_strategy = told
    try:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = lm.model.generate(
                torch.tensor([prompt]),
                max_new_tokens=n,
                do_sample=False,
                assistant_early_exit=k,
                num_assistant_tokens=draft_len,
                num_assistant_tokens_schedule="constant",
                assistant_confidence_threshold=0.0,
                eos_token_id=None,
                pad_token_id=0,
            )
        seconds = time.perf_counter() - t0
    finally:
        EarlyExitCandidateGenerator.update_candidate_strategy = plain
    return out[0, len(prompt) :].tolist(), matches, seconds


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
    print("| K | same tokens (ours, theirs vs greedy) | accepted per verification, ours | theirs (after its first) | "
          "acceptance rate, ours | ms/token ours | theirs | full depth |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for k in (int(x) for x in args.ks.split(",")):
        ours_spec = SelfSpeculative(lm, PrefixDraft(lm, k), args.draft_len)
        same_ours = same_theirs = True
        acc_ours: list[int] = []
        acc_theirs: list[int] = []
        drafted_ours = 0
        ms = {"ours": [], "theirs": [], "full": []}
        for r in range(args.repeats):
            for i, prompt in enumerate(prompts):
                order = ("ours", "theirs", "full") if (r + i) % 2 == 0 else ("full", "theirs", "ours")
                for who in order:
                    if who == "ours":
                        t0 = time.perf_counter()
                        out = ours_spec.generate(prompt, n)
                        ms["ours"].append((time.perf_counter() - t0) * 1000 / n)
                        if r == 0:
                            same_ours &= out.tokens == greedy[i]
                            acc_ours += out.accepted_lengths
                            drafted_ours += out.drafted
                    elif who == "theirs":
                        tokens, matches, seconds = hf_early_exit(lm, prompt, k, args.draft_len, n)
                        ms["theirs"].append(seconds * 1000 / n)
                        if r == 0:
                            same_theirs &= tokens == greedy[i]
                            acc_theirs += matches[1:]
                    else:
                        t0 = time.perf_counter()
                        full.generate(prompt, n)
                        ms["full"].append((time.perf_counter() - t0) * 1000 / n)
        mean_ours = statistics.mean(acc_ours)
        mean_theirs = statistics.mean(acc_theirs) if acc_theirs else 0.0
        med = {who: statistics.median(v) for who, v in ms.items()}
        print(
            f"| {k} | {same_ours}, {same_theirs} | {sum(acc_ours)} over {len(acc_ours)} (mean {mean_ours:.2f}) | "
            f"{sum(acc_theirs)} over {len(acc_theirs)} (mean {mean_theirs:.2f}) | "
            f"{sum(acc_ours) / max(drafted_ours, 1):.3f} | "
            f"{med['ours']:.1f} | {med['theirs']:.1f} | {med['full']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
