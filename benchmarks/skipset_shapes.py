"""What skip-set self-speculation can give back on a model's shape: its measured costs and the speedup ceiling.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/skipset_shapes.py [--shapes NAME,...] [--repeats N]
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/skipset_shapes.py --dry-run     (tiny shapes, seconds)

No Gemma 3 weights can be installed here (no model hub), and a decode step costs the same on random weights
of the same shape. So acceptance cannot be measured on these shapes, but the costs that bound what any skip
set can give back can. For each shape, the model is built from its config with seeded random weights, fp32,
on the CPU. The run measures:

- the cost model the screen and the bench use (``sweep.bench.costs.cost_model`` with verification passes
  of 1..5 positions): a full-depth decode step, one layer, the final norm and LM head, one layer's attention
  and MLP sublayers, and a verification of k positions;
- for skip ratios 0.1..0.5, the draft step of an evenly spread skip set, timed directly (the adapter's own
  bypass) beside the cost model's price of it;
- at draft_len N = 1..4, the ceiling: the speedup if every draft were accepted, (N + 1) step / (N draft +
  verify(N + 1)). The break-even acceptance length is that denominator over one step; above N + 1, no
  acceptance can pay for the skip set.

Shapes, from the models' published configs: SmolLM2-135M (Llama: 30 layers, hidden 576, 9 heads, 3 KV heads,
intermediate 1536, vocab 49152, tied), Gemma 3 270M (18 layers, hidden 640, 4 heads, 1 KV head, head_dim 256,
intermediate 2048, vocab 262144, tied) and Gemma 3 1B (26 layers, hidden 1152, 4 heads, 1 KV head, head_dim
256, intermediate 6912, vocab 262144, tied). Gemma 3 interleaves five sliding-window layers (window 512) with
one global layer; a prompt of 128 tokens sits inside the window, so the pattern costs nothing extra here.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import statistics
import sys
import time

import torch

from sweep.bench.costs import cost_model
from sweep.config.provenance import random_init_hash
from sweep.gates.skipset import SkipSet
from sweep.models import LoadedModel, byte_tokenizer, ready
from sweep.decode.timing import Timer

PROMPT_TOKENS = 128
DRAFT_LENS = (1, 2, 3, 4)
RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5)


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    family: str  # "llama" or "gemma3"
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


SHAPES = (
    Shape("smollm2-135m-shape", "llama", 30, 576, 9, 3, 64, 1536, 49152),
    Shape("gemma3-270m-shape", "gemma3", 18, 640, 4, 1, 256, 2048, 262144),
    Shape("gemma3-1b-shape", "gemma3", 26, 1152, 4, 1, 256, 6912, 262144),
)
DRY_SHAPES = (
    Shape("tiny-llama-shape", "llama", 4, 64, 4, 2, 16, 128, 512),
    Shape("tiny-gemma3-shape", "gemma3", 6, 64, 4, 1, 16, 128, 1024),
)


def config_of(shape: Shape, bos: int, eos: int):
    import transformers

    common = dict(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=None,
    )
    if shape.family == "llama":
        return transformers.LlamaConfig(**common, rms_norm_eps=1e-5)
    layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(shape.layers)]
    return transformers.Gemma3TextConfig(
        **common, sliding_window=512, layer_types=layer_types, query_pre_attn_scalar=shape.head_dim
    )


def build(shape: Shape, seed: int = 0) -> LoadedModel:
    """A seeded random model of ``shape`` in fp32 on the CPU, through the loader's own ``ready`` (fidelity check)."""
    from transformers import AutoModelForCausalLM

    tokenizer = byte_tokenizer()
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config_of(shape, tokenizer.bos_token_id, tokenizer.eos_token_id), dtype=torch.float32
        )
    return ready(
        model, tokenizer, name=shape.name, source="random", where=f"model={shape.name}",
        content_hash=random_init_hash(dataclasses.asdict(shape), seed), device=torch.device("cpu"), t0=t0,
    )  # fmt: skip


def spread(num_layers: int, ratio: float) -> SkipSet:
    """A skip set of round(ratio * 2L) sublayers, half attention and half MLP, each kind spread evenly over the
    stack (the MLPs offset by half a step from the attentions)."""
    n = round(ratio * 2 * num_layers)
    n_attn = (n + 1) // 2

    def evenly(count: int, offset: float) -> frozenset[int]:
        return frozenset(int((i + offset) * num_layers / count) + 1 for i in range(count)) if count else frozenset()

    return SkipSet(attention=evenly(n_attn, 0.25), mlp=evenly(n - n_attn, 0.75))


@torch.inference_mode()
def draft_steps(lm: LoadedModel, ids: list[int], skips: list[SkipSet], repeats: int) -> list[float]:
    """Median ms of a decode step with each skip set bypassed (index 0: none), interleaved in rounds from copies
    of one prefilled cache, like the cost model's own rounds."""
    adapter = lm.adapter
    prompt = torch.tensor([ids])
    cache = adapter.new_cache()
    token = adapter.forward(prompt, cache)[:, -1].argmax(-1, keepdim=True)
    position = torch.tensor([[len(ids)]])

    def step(skip: SkipSet | None) -> float:
        kv = copy.deepcopy(cache)
        with contextlib.ExitStack() as stack:
            if skip is not None:
                stack.enter_context(adapter.bypassing(skip))
            with Timer(lm.device) as clock:
                adapter.forward(token, kv, position_ids=position)[:, -1].argmax(-1)
        return clock.seconds * 1000

    jobs = [None, *skips]
    times: list[list[float]] = [[] for _ in jobs]
    for r in range(repeats + 1):  # one warm-up round
        order = range(len(jobs)) if r % 2 == 0 else reversed(range(len(jobs)))
        for j in order:
            ms = step(jobs[j])
            if r:
                times[j].append(ms)
    return [statistics.median(t) for t in times]


def check(shape: Shape, repeats: int) -> list[str]:
    t0 = time.perf_counter()
    lm = build(shape)
    built = time.perf_counter() - t0
    ids = torch.randint(0, 256, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(1)).tolist()
    c = cost_model(lm, ids, repeats=repeats, verify_positions=max(DRAFT_LENS) + 1)
    L = lm.num_layers
    skips = [spread(L, r) for r in RATIOS]
    measured = draft_steps(lm, ids, skips, repeats)
    out = [
        f"## {shape.name}: {shape.family}, {L} layers, hidden {shape.hidden}, {shape.heads} heads "
        f"({shape.kv_heads} KV), head_dim {shape.head_dim}, intermediate {shape.intermediate}, vocab {shape.vocab}; "
        f"built in {built:.1f} s",
        f"full step {c.step_ms:.2f} ms (again in the draft rounds: {measured[0]:.2f}); one layer {c.layer_ms:.2f} ms; "
        f"final norm + LM head {c.head_ms:.2f} ms = {c.head_ms / c.step_ms:.0%} of a step; "
        f"per layer: attention {c.attn_ms:.2f} ms, MLP {c.mlp_ms:.2f} ms",
        "verify k positions / one step: "
        + ", ".join(
            f"k={k} {c.verify(k):.2f} ms ({c.verify(k) / c.step_ms:.2f}x)" for k in range(1, max(DRAFT_LENS) + 2)
        ),
        "",
        "| skip ratio | skip set | draft ms measured | draft ms (cost model) | draft / step | "
        + " | ".join(f"N={n}: ceiling, break-even len" for n in DRAFT_LENS)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(DRAFT_LENS),
    ]
    for ratio, skip, ms in zip(RATIOS, skips, measured[1:]):
        cells = []
        for n in DRAFT_LENS:
            cost = n * ms + c.verify(n + 1)
            cells.append(f"{(n + 1) * c.step_ms / cost:.2f}x, {cost / c.step_ms:.2f}")
        out.append(
            f"| {skip.ratio(L):.2f} | {skip.text()} | {ms:.2f} | {c.skip_draft_ms(skip):.2f} | {ms / c.step_ms:.2f} | "
            + " | ".join(cells)
            + " |"
        )
    out.append("")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=None, help="comma-separated shape names (default: all)")
    parser.add_argument("--repeats", type=int, default=16, help="timed rounds per figure (median)")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, 3 rounds (seconds)")
    args = parser.parse_args(argv)
    shapes = DRY_SHAPES if args.dry_run else SHAPES
    repeats = 3 if args.dry_run else args.repeats
    if args.shapes:
        wanted = args.shapes.split(",")
        unknown = sorted(set(wanted) - {s.name for s in shapes})
        if unknown:
            print(f"error: --shapes: unknown {', '.join(unknown)} (allowed: {', '.join(s.name for s in shapes)})")
            return 2
        shapes = tuple(s for s in shapes if s.name in wanted)
    torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "1")))
    print(f"skipset_shapes: torch {torch.__version__}, {torch.get_num_threads()} thread(s), prompt {PROMPT_TOKENS} "
          f"tokens, {repeats} rounds, fp32, CPU")  # fmt: skip
    for shape in shapes:
        print("\n".join(check(shape, repeats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
