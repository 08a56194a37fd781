"""A prepared GPU check: the bench's own protocol on models of real shapes with seeded random weights, without Ray.

    benchmarks/gpu_check.sh [--dry-run] [--out DIR]     (sets the path, then runs this file)

For a machine with one CUDA GPU whose image has torch, transformers, accelerate, pyarrow and pytest
but no ray, optuna, polars, hydra-core or gguf, and no package registry: everything else comes with
the working tree. Trained weights do not fit the 64 MiB that travel with it, and random weights of
the same shape decode exactly as fast, so the models are built from their configs with seeded
random weights: SmolLM2-135M's (Llama, 30 layers, hidden 576, 9 heads, 3 KV heads, intermediate
1536, vocab 49152, tied embeddings) in float32, and Llama-3-8B's (32 layers, hidden 4096, 32 heads,
8 KV heads, intermediate 14336, vocab 128256) in bfloat16, and a hybrid of Falcon-H1-0.5B's shape (36 layers, each
running attention and a Mamba2 mixer side by side: hidden 1024, 8 heads, 2 KV heads, 24 mixer heads of 64, state
128, as transformers' FalconH1 page tabulates; intermediate 2048, mixer width 1536) in bfloat16, built on the GPU.

Per model it runs the bench (``sweep.bench.protocol.run_trials``: warm-up, the cost model, the
determinism self-check, interleaved timed rounds) on one group of settings timed against one
full-depth baseline per round: gate=full (the A/A control), fixed at half depth under both KV
policies, saturation, and self-speculation drafting with half the layers and with a skip set (on the hybrid: full
depth, drafting with half the layers, and the attention-free draft, its state-space path alone, with acceptance per
draft position and the histogram of accepted lengths). It prints ms/token,
each setting's measured speedup beside the cost model's prediction, the A/A floor (the spread of
full depth against full depth in the same rounds), the bench loop against a bare forward loop
(``decode_loop.compare``), the determinism self-check, and a check of SDPA on a left-padded batch
(no NaN or inf at any position; each row decodes what its prompt decodes alone). It records the
CUDA determinism settings. Agreement is printed but means nothing on random weights.

Configs come from conf/ without Hydra (``plain_compose``: a test checks it equals Hydra's
composition for every setting here). ``--dry-run`` runs the same code on the CPU on tiny shapes in
seconds (CI runs it). Exit status 1 when a trial failed or SDPA produced a non-finite value.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import statistics
import sys
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from sweep.bench.protocol import run_trials
from plain_compose import plain_compose
from sweep.config import validate
from sweep.config.provenance import random_init_hash
from sweep.gates import make_gate
from sweep.models import DTYPES, LoadedModel, byte_tokenizer, ready
from sweep.models.prompts import read_prompts, tokenize_prompts
from sweep.textfit import WrappingFormatter

AGREEMENT_NOTE = "agreement means nothing on random weights (their tokens are arbitrary): read speed and mechanics"


@dataclasses.dataclass(frozen=True)
class Shape:
    """A model's shape and the dtype it is checked in: a Llama, or (``family="falcon-h1"``) a Falcon-H1 hybrid whose
    every layer runs attention and a Mamba2 mixer of ``mamba_heads`` heads side by side."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    dtype: str
    rope_theta: float
    family: str = "llama"
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    mamba_state: int = 0
    mamba_width: int = 0

    def describe(self) -> str:
        tied = "tied embeddings" if self.tied else "untied embeddings"
        mixer = (
            f", beside each attention a Mamba2 mixer ({self.mamba_heads} heads of {self.mamba_head_dim}, state "
            f"{self.mamba_state}, width {self.mamba_width})"
            if self.family == "falcon-h1"
            else ""
        )
        return (
            f"{self.family}, {self.layers} layers, hidden {self.hidden}, {self.heads} heads ({self.kv_heads} KV)"
            f"{mixer}, intermediate {self.intermediate}, vocab {self.vocab}, {tied}"
        )

    @property
    def settings(self) -> tuple:
        return HYBRID_SETTINGS if self.family == "falcon-h1" else SETTINGS


SHAPES = (
    Shape("smollm2-135m-shape", 30, 576, 9, 3, 64, 1536, 49152, True, "float32", 100_000.0),
    Shape("llama-3-8b-shape", 32, 4096, 32, 8, 128, 14336, 128256, False, "bfloat16", 500_000.0),
    Shape(
        "falcon-h1-0.5b-shape", 36, 1024, 8, 2, 64, 2048, 32768, False, "bfloat16", 1e11, "falcon-h1", 24, 64, 128, 1536
    ),
)
DRY_SHAPES = (
    Shape("tiny-smollm2-shape", 4, 64, 4, 2, 16, 128, 512, True, "float32", 100_000.0),
    Shape("tiny-llama-3-shape", 4, 64, 4, 2, 16, 128, 1024, False, "bfloat16", 500_000.0),
    Shape("tiny-falcon-h1-shape", 4, 64, 4, 2, 16, 128, 512, False, "float32", 1e11, "falcon-h1", 4, 16, 8, 64),
)
# one group, timed against one shared full-depth baseline per round; fixed exits at min_depth 0.5 (L/2)
SETTINGS = (
    ("full (A/A)", ["gate=full"]),
    ("fixed L/2, kv propagate", ["gate=fixed", "bench.kv_policy=propagate"]),
    ("fixed L/2, kv full", ["gate=fixed", "bench.kv_policy=full"]),
    ("saturation", ["gate=saturation"]),
    ("self-speculation L/2", ["gate=fixed", "bench.mode=self_speculative"]),
    ("self-spec, skip set", ["gate=skip", "gate.skip={skip}", "bench.mode=self_speculative"]),
)
# the hybrid: no exits under kv_policy=propagate (a recurrent state takes no K/V fill); the attention-free draft
HYBRID_SETTINGS = (
    ("full (A/A)", ["gate=full"]),
    ("self-speculation L/2", ["gate=fixed", "bench.mode=self_speculative"]),
    ("self-spec, attention-free", ["gate=skip", "gate.skip=attention-free", "bench.mode=self_speculative"]),
)


def skip_set(layers: int) -> str:
    """The skip-set draft the check times: attention and MLP of every second layer of the back half
    (a quarter of the sublayers; on random weights its acceptance is meaningless, its costs are not)."""
    back = range(layers // 2 + 1, layers + 1, 2)
    return "+".join(f"{kind}{layer}" for layer in back for kind in ("a", "m"))


RUNS = {  # (bench overrides, decode-loop rounds)
    "gpu": (["prompts.n=4", "bench.gen_tokens=32", "bench.repeats=5"], 5),
    "dry": (["prompts.n=2", "bench.gen_tokens=4", "bench.repeats=2", "bench.warmup=0"], 2),
}


def overrides(shape: Shape, device: str, run: list[str]) -> list[list[str]]:
    """Every setting's overrides (the model section only names the model: it is built here)."""
    base = ["model=hf", f"model.path={shape.name}", f"model.name={shape.name}", f"device={device}"]
    skip = skip_set(shape.layers)
    return [
        [*base, f"dtype={shape.dtype}", *run, *(o.format(skip=skip) for o in setting)] for _, setting in shape.settings
    ]


def configs(shape: Shape, device: str, run: list[str]) -> list:
    """The validated config of every setting, composed from conf/ without Hydra."""
    return [validate(plain_compose(o), search=False) for o in overrides(shape, device, run)]


def build_model(shape: Shape, device: str, seed: int = 0) -> LoadedModel:
    """A seeded random model of ``shape``, built on ``device`` in its dtype, with the byte-level
    tokenizer of the tiny models (the prompts are real text; their ids fit any vocabulary)."""
    from transformers import AutoModelForCausalLM, FalconH1Config, LlamaConfig

    tokenizer = byte_tokenizer()
    hybrid = {}
    if shape.family == "falcon-h1":
        hybrid = {
            "mamba_n_heads": shape.mamba_heads,
            "mamba_d_head": shape.mamba_head_dim,
            "mamba_d_state": shape.mamba_state,
            "mamba_d_ssm": shape.mamba_width,
        }
    config = (FalconH1Config if hybrid else LlamaConfig)(
        **hybrid,
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        tie_word_embeddings=shape.tied,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
    )
    dev, dtype = torch.device(device), DTYPES[shape.dtype]
    t0 = time.perf_counter()
    cuda = [torch.cuda.current_device()] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), dev:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return ready(
        model,
        tokenizer,
        name=shape.name,
        source="random",
        where=f"model={shape.name}",
        content_hash=random_init_hash(dataclasses.asdict(shape), seed),
        device=dev,
        t0=t0,
    )


def determinism_settings() -> dict:
    """What decides whether two identical GPU runs give identical numbers, as this process has it."""
    import transformers

    b = torch.backends

    def read(fn):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a setting this torch does not have: say so, go on
            return f"unavailable ({type(exc).__name__})"

    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": read(b.cudnn.version) if cuda else None,
        "gpu": read(lambda: torch.cuda.get_device_name(0)) if cuda else None,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn.deterministic": b.cudnn.deterministic,
        "cudnn.benchmark": b.cudnn.benchmark,
        "cudnn.allow_tf32": b.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": read(lambda: b.cuda.matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda.matmul.allow_bf16_reduced_precision_reduction": read(
            lambda: b.cuda.matmul.allow_bf16_reduced_precision_reduction
        ),
        "cuda.matmul.allow_fp16_reduced_precision_reduction": read(
            lambda: b.cuda.matmul.allow_fp16_reduced_precision_reduction
        ),
        "sdp.flash": read(b.cuda.flash_sdp_enabled),
        "sdp.mem_efficient": read(b.cuda.mem_efficient_sdp_enabled),
        "sdp.math": read(b.cuda.math_sdp_enabled),
        "sdp.cudnn": read(b.cuda.cudnn_sdp_enabled),
        **{k: os.environ.get(k) for k in ("CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "NVIDIA_TF32_OVERRIDE")},
    }


def sdpa_check(lm: LoadedModel, prompts, n: int) -> dict:
    """The prompts as one left-padded batch through the model's own attention: every hidden state and
    logit finite, at real and at padded positions (a NaN at padding reaches real positions through
    0 x NaN in the next layer's attention), and each row decoding what its prompt decodes alone."""
    from sweep.decode.batching import BatchEngine, left_pad
    from sweep.decode.engine import Engine

    ids = [list(p.input_ids) for p in prompts]
    batch = left_pad(ids, lm.device)
    real = batch.mask.bool() if batch.mask is not None else torch.ones_like(batch.ids, dtype=torch.bool)
    with torch.inference_mode(), lm.adapter.capture_hidden() as hidden:
        logits = lm.adapter.forward(
            batch.ids, lm.adapter.new_cache(), logits_to_keep=0, attention_mask=batch.mask, position_ids=batch.positions
        )
        states = [*hidden, logits]

        def nonfinite(where: torch.Tensor) -> int:
            return sum(int((~torch.isfinite(s[where])).sum()) for s in states)

        counts = {"nonfinite_real": nonfinite(real), "nonfinite_padding": nonfinite(~real)}
    together = BatchEngine(lm).generate_batch(ids, n).tokens
    alone = [Engine(lm).generate(i, n).tokens for i in ids]
    return {
        "attn_implementation": lm.model.config._attn_implementation,
        "rows": len(ids),
        "lengths": [len(i) for i in ids],
        "padded_positions": int((~real).sum()),
        **counts,
        "rows_equal_alone": sum(t == a for t, a in zip(together, alone)),
    }


def round_ratios(row: dict) -> list[float]:
    """Per timed round: baseline decode time over gated decode time, summed over prompts."""
    return [sum(b) / sum(g) for b, g in zip(row["round_baseline_ms"], row["round_ms"])]


def check_shape(shape: Shape, device: str, run: list[str], loop_rounds: int) -> dict:
    """Build the model, run the settings' bench group, the loop comparison and the SDPA check."""
    from decode_loop import compare

    cfgs = configs(shape, device, run)
    lm = build_model(shape, device, cfgs[0].seed)
    prompts = tokenize_prompts(read_prompts(cfgs[0].prompts), cfgs[0].prompts, lm.tokenizer)
    gates = [make_gate(c.gate, lm) for c in cfgs]
    t0 = time.perf_counter()
    rows = run_trials(cfgs, lm, gates, prompts)
    bench_s = time.perf_counter() - t0
    n = cfgs[0].bench.gen_tokens
    loop = compare(lm, prompts[:2], n, loop_rounds)
    sdpa = sdpa_check(lm, prompts, n)
    from sweep.bench.costs import cost_model

    costs = cost_model(lm, prompts[0].input_ids, verify_positions=cfgs[0].bench.draft_len + 1)
    out = {
        "verify_ms": costs.verify_ms,  # a verification pass of k = 1, 2, ... positions
        "sublayer_ms": {
            "attention": costs.attn_ms,
            "mlp": costs.mlp_ms,
            "layer": costs.layer_ms,
            "mixer": getattr(costs, "mixer_ms", None),
        },
        "shape": dataclasses.asdict(shape),
        "device": lm.provenance()["device"],
        "build_seconds": lm.load_seconds,
        "bench_seconds": bench_s,
        "prompts": len(prompts),
        "gen_tokens": n,
        "repeats": cfgs[0].bench.repeats,
        "loop_ms_per_token": loop,
        "sdpa": sdpa,
        "mixer_kernels": {name: _installed(name) for name in ("mamba_ssm", "causal_conv1d")},
        "settings": [],
    }
    keep = (
        "gate", "exit_layer", "min_layer", "eps", "kv_policy", "mode", "draft_len", "status", "error",
        "deterministic", "determinism_max_logit_diff", "baseline_ms_per_token", "ms_per_token", "speedup_wall",
        "speedup_model", "speedup_e2e_wall", "speedup_e2e_model", "exit_rate", "mean_exit_layer", "agreement",
        "acceptance_rate", "mean_accepted_length", "tokens_per_verification", "round_baseline_ms", "round_ms",
        "cost_layer_ms", "cost_head_ms", "cost_probe_ms", "cost_kv_ms", "skip", "skip_ratio", "acceptance_length",
        "draft_ms_per_token", "verify_ms_per_token", "acceptance_by_position", "accepted_length_hist",
    )  # fmt: skip
    for (label, _), row in zip(shape.settings, rows):
        out["settings"].append({"label": label, **{k: row.get(k) for k in keep}})
    del lm
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


WIDTH = 120  # every printed line fits a 120-column terminal


def wrap(text: str, indent: str = "   ") -> list[str]:
    """``text`` as lines of at most ``WIDTH`` columns, words whole, continuation lines indented further."""
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


@contextlib.contextmanager
def warnings_in_report(stream=None):
    """The bench's warnings (a cost model measured during a burst of other work, say) in the report, in its order and
    its width: on ``stream`` (stdout), each line within ``WIDTH`` columns; as before once the check ends."""
    logger = logging.getLogger("sweep")
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(WrappingFormatter("warning: %(message)s", indent="   "))
    handler.setLevel(logging.WARNING)
    kept = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = kept


def _x(value) -> str:
    return "-" if value is None else f"{value:.3f}x"


def report(result: dict) -> list[str]:
    """The printed lines for one shape."""
    s, rows = result["shape"], result["settings"]
    shape = Shape(**s)
    lines = [
        *wrap(f"== {shape.name}: {shape.describe()}", indent=""),
        *wrap(
            f"{s['dtype']} on {result['device']}, attention {result['sdpa']['attn_implementation']}; built in "
            f"{result['build_seconds']:.1f} s; {result['prompts']} prompts x {result['gen_tokens']} tokens, "
            f"{result['repeats']} timed rounds, one full-depth baseline per round for all settings "
            f"({result['bench_seconds']:.0f} s)"
        ),
        f"   {'setting':<24}{'ms/token':>9}{'speedup':>10}{'model':>9}{'exit rate':>11}{'exit at':>9}"
        f"{'agreement*':>12}  status",
    ]
    base = statistics.median(r["baseline_ms_per_token"] for r in rows if r["baseline_ms_per_token"] is not None)
    lines.append(f"   {'full-depth baseline':<24}{base:>9.2f}")
    aa = next(r for r in rows if r["gate"] == "full")
    ratios = round_ratios(aa) if aa["round_ms"] else [1.0]
    lo, hi = min(ratios), max(ratios)
    for r in rows:
        if r["status"] == "failed":
            lines += wrap(f"{r['label']:<24}  failed: {r['error']}")
            continue
        inside = r is not aa and lo <= r["speedup_wall"] <= hi
        early_exit = r["mode"] != "self_speculative"
        rate = f"{r['exit_rate']:.2f}" if early_exit else "-"
        layer = f"{r['mean_exit_layer']:.1f}" if early_exit else "-"
        lines.append(
            f"   {r['label']:<24}{r['ms_per_token']:>9.2f}{_x(r['speedup_wall']):>10}{_x(r['speedup_model']):>9}"
            f"{rate:>11}{layer:>9}{r['agreement']:>12.3f}  {r['status']}" + (" (within A/A)" if inside else "")
        )
        if r["mode"] == "self_speculative":
            lines += wrap(
                (f"skip set {r['skip']} (ratio {r['skip_ratio']:.2f}); " if r.get("skip") else "")
                + f"acceptance rate {r['acceptance_rate'] or 0:.2f}, acceptance length "
                f"{r['acceptance_length']:.2f}, {r['tokens_per_verification']:.2f} tokens per verification; "
                f"draft {r['draft_ms_per_token']:.2f} + verify {r['verify_ms_per_token']:.2f} ms per token; "
                "acceptance per position "
                + ", ".join("n/a" if a is None else f"{a:.2f}" for a in r.get("acceptance_by_position") or [])
                + "; verifications accepting 0, 1, ...: "
                + ", ".join(str(h) for h in r.get("accepted_length_hist") or []),
                indent="   " + " " * 24,
            )
    verify = result["verify_ms"]
    subs = result["sublayer_ms"]
    lines += wrap(
        "verification of k positions against one decode step (what self-speculation's saving rests on): "
        + ", ".join(f"k={k} {ms / verify[0]:.2f}x" for k, ms in enumerate(verify, start=1))
        + f"; one layer {subs['layer']:.3f} ms, its attention {subs['attention']:.3f} ms, its MLP {subs['mlp']:.3f} ms"
        + (f", its state-space mixer {subs['mixer']:.3f} ms" if subs.get("mixer") else "")
    )
    lines += wrap(
        f"A/A floor (full against full, same rounds): median {_x(aa['speedup_wall'])}, per round {lo:.3f}x.."
        f"{hi:.3f}x (|1 - ratio| up to {max(abs(1 - lo), abs(hi - 1)) * 100:.1f}%); a speedup within it is not "
        "told from 1.0"
    )
    loop = result["loop_ms_per_token"]
    bench, bare, gen = loop["bench loop"], loop["bare forward loop"], loop["model.generate()"]
    lines += wrap(
        f"decode loop vs bare forward: bench loop {bench:.2f} ms/token, bare forward loop {bare:.2f}, "
        f"model.generate() {gen:.2f}: bench/bare {bench / bare:.3f}, bench/generate {bench / gen:.3f}"
    )
    det = all(r["deterministic"] for r in rows if r["status"] != "failed")
    diff = max((r["determinism_max_logit_diff"] or 0.0) for r in rows if r["status"] != "failed")
    lines += wrap(
        f"determinism self-check and timed repeats: {'ok' if det else 'NOT reproduced'} (max |logit diff| "
        f"between the two full-depth baselines {diff:.3g})"
    )
    if shape.family == "falcon-h1":
        kernels = result["mixer_kernels"]
        lines += wrap(
            "state-space kernels: "
            + ", ".join(f"{name} {'installed' if there else 'absent'}" for name, there in kernels.items())
            + (
                ""
                if all(kernels.values())
                else " (transformers runs its reference PyTorch implementation where one is absent: correct, slower)"
            )
        )
    q = result["sdpa"]
    lines += wrap(
        f"SDPA, left-padded batch of {q['rows']} (lengths {min(q['lengths'])}..{max(q['lengths'])}, "
        f"{q['padded_positions']} padded positions): non-finite values at real positions {q['nonfinite_real']}, "
        f"at padding {q['nonfinite_padding']}; rows decoding what their prompt decodes alone: "
        f"{q['rows_equal_alone']}/{q['rows']}"
    )
    return lines


def main() -> int:
    with warnings_in_report():
        return _check()


def _check() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: the same code in seconds")
    parser.add_argument("--out", type=Path, default=Path("gpu_check_out"), help="where gpu_check.json goes")
    args = parser.parse_args()
    if args.dry_run:
        device, shapes, (run, rounds) = "cpu", DRY_SHAPES, RUNS["dry"]
    elif not torch.cuda.is_available():
        print("error: no CUDA device (torch sees none); run with --dry-run on a CPU", file=sys.stderr)
        return 2
    else:
        device, shapes, (run, rounds) = "cuda", SHAPES, RUNS["gpu"]
    import transformers

    transformers.logging.set_verbosity_error()  # its kernel fall-back notes: one line of the report per hybrid
    settings = determinism_settings()
    major_minor = tuple(int(part) for part in settings["transformers"].split(".")[:2])
    if major_minor < (5, 25):  # the cache API with past recording (pyproject.toml pins >= 5.25)
        print(f"error: transformers {settings['transformers']}: this project needs >= 5.25", file=sys.stderr)
        return 2
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    mode = "--dry-run " if args.dry_run else ""
    head = (
        f"gpu_check {mode}{started}; torch {settings['torch']}, transformers {settings['transformers']}, "
        f"CUDA {settings['cuda_runtime']}, GPU {settings['gpu']}"
    )
    versions = ("torch", "transformers", "cuda_runtime", "gpu")
    knobs = ", ".join(f"{k}={v}" for k, v in settings.items() if k not in versions)
    print("\n".join([*wrap(head, indent=""), *wrap(f"CUDA determinism settings: {knobs}", indent="")]))
    results, broken = [], []
    for shape in shapes:
        try:
            results.append(check_shape(shape, device, run, rounds))
        except Exception as exc:  # noqa: BLE001 - out of memory, a config the library refuses: the next shape runs
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [""]
            first = " ".join(lines[:2] if lines[0].endswith(":") else lines[:1])[:300]  # "...error for X:" says little
            print("\n".join(wrap(f"== {shape.name}: failed ({type(exc).__name__}: {first})", indent="")), flush=True)
            broken.append(shape.name)
            continue
        print("\n".join(report(results[-1])), flush=True)
    print("\n".join(wrap(f"* {AGREEMENT_NOTE}", indent="")))
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"started": started, "dry_run": args.dry_run, "determinism_settings": settings, "shapes": results}
    (args.out / "gpu_check.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    failed = broken + [r["label"] for res in results for r in res["settings"] if r["status"] == "failed"]
    nan = [res["shape"]["name"] for res in results if res["sdpa"]["nonfinite_real"] or res["sdpa"]["nonfinite_padding"]]
    for what, names in (("failed", failed), ("non-finite SDPA output", nan)):
        if names:
            print(f"error: {what}: {', '.join(names)}", file=sys.stderr)
    return 1 if failed or nan else 0


if __name__ == "__main__":
    sys.exit(main())
