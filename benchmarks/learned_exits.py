"""Learned exits on a real model: what tuned-lens translators and a trained exit classifier buy.

Fits readouts (`sweep fit`) on HumanEval prompts 0..fit_n-1 (gen 32 tokens), then for each
evaluation set (HumanEval fit_n.. and the chat set, never the fitting prompts):

1. traces it (`sweep profile profile.readouts=...`): per-layer top-1 agreement with the final layer
   and KL to the final distribution, logit lens vs tuned lens, at decision positions;
2. replays a dense grid of three families on the trace (``sweep.trace.simulate``): logit-lens gates
   (margin, softmax, entropy), the same gates reading the tuned lens, and the exit classifier
   (logit and tuned lens), with the cost model measured on the model (translator and classifier
   charged);
3. runs closed-loop (`sweep run search=grid`, real layer skipping, interleaved baseline) the replay's
   best predicted setting of each family at teacher-forced agreement >= 0.95, 0.98 and 0.99 on the
   first ``--closed-n`` prompts of the set, and prints each family's best measured speedup (decode
   and end-to-end) at closed-loop agreement >= 0.95 and >= 0.98;

and finally checks the cost model on one tuned-lens gate at a fixed threshold (fp32, 4 prompts,
`sweep bench`): predicted against measured decode speedup.

    .venv/bin/python benchmarks/learned_exits.py --root /tmp/learned [--readouts PATH] [--fit-n 100]
        [--closed-n 16] [--repeats 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / ".venv" / "bin" / "sweep"
LAYERS = (10, 15, 20, 25, 29)
GEN = 32
FAMILIES = {  # family: (gate, lens) pairs
    "logit lens": [("margin", "logit"), ("softmax", "logit"), ("entropy", "logit")],
    "tuned lens": [("margin", "tuned"), ("softmax", "tuned"), ("entropy", "tuned")],
    "classifier": [("classifier", "logit"), ("classifier", "tuned")],
}
LADDERS = {
    "margin": [x / 2 for x in range(1, 61)],
    "softmax": [x / 40 for x in range(1, 40)],
    "entropy": [x / 8 for x in range(1, 49)],
    "classifier": [0.5 + x / 100 for x in range(0, 50)] + [0.995, 0.998, 0.999, 0.9995, 0.9999],
}
DEPTHS = (0.25, 0.5, 0.75)


def sweep_cli(*args: str, threads: int) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [str(SWEEP if SWEEP.exists() else "sweep"), *args]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(f"  ({' '.join(args[:1])}: {time.perf_counter() - t0:.0f} s)", flush=True)
    return done.stdout


def fit(root: Path, fit_n: int, threads: int) -> tuple[Path, float]:
    out = sweep_cli(
        "fit",
        "prompts=humaneval",
        f"prompts.n={fit_n}",
        f"fit.gen_tokens={GEN}",
        f"results.root={root}",
        threads=threads,
    )
    print(out)
    path = Path(out.strip().splitlines()[-1].removeprefix("readouts: "))
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        seconds = float(f.metadata()["fit_seconds"])
    return path, seconds


def eval_sets(fit_n: int) -> dict[str, list[str]]:
    return {"humaneval": ["prompts=humaneval", f"prompts.start={fit_n}"], "chat": ["prompts=chat", "prompts.n=null"]}


def trace(root: Path, name: str, prompts: list[str], readouts: Path, threads: int):
    import polars as pl

    from sweep.store import read

    run_id = f"learned-{name}"
    earlier = read("profile", root).filter(pl.col("run_id") == run_id)
    if earlier.height:  # traced by an earlier run of this benchmark into the same root
        return earlier
    sweep_cli(
        "profile",
        *prompts,
        f"profile.gen_tokens={GEN}",
        f"profile.readouts={readouts}",
        f"results.root={root}",
        f"run_id={run_id}",
        threads=threads,
    )
    return read("profile", root).filter(pl.col("run_id") == run_id)


def decision_rows(trace):
    """The trace's rows at decision positions: each prompt's last prefill position and its decode positions."""
    import polars as pl

    last = trace.filter(pl.col("phase") == "prefill").group_by("prompt_id").agg(pl.col("position").max().alias("_l"))
    return trace.join(last, on="prompt_id").filter(pl.col("position") >= pl.col("_l"))


def layer_table(trace) -> str:
    import polars as pl

    rows = decision_rows(trace).filter(pl.col("layer").is_in(LAYERS))
    per = rows.group_by("layer").agg(
        pl.col("top1_match").mean().alias("logit"),
        pl.col("tuned_match").mean().alias("tuned"),
        pl.col("kl_final").mean().alias("kl_logit"),
        pl.col("tuned_kl_final").mean().alias("kl_tuned"),
        pl.len().alias("n"),
    )
    lines = [f"  {'layer':>5}{'top1 logit':>12}{'top1 tuned':>12}{'KL logit':>10}{'KL tuned':>10}{'positions':>11}"]
    for r in per.sort("layer").iter_rows(named=True):
        cells = f"{r['logit']:>12.3f}{r['tuned']:>12.3f}{r['kl_logit']:>10.3f}{r['kl_tuned']:>10.3f}"
        lines.append(f"  {r['layer']:>5}{cells}{r['n']:>11}")
    return "\n".join(lines)


def replay(trace, readouts: Path, threads: int):
    """Every family's dense grid replayed on the trace, with the cost model measured on the model."""
    import polars as pl
    import torch

    torch.set_num_threads(threads)
    from sweep.bench.command import gate_readouts
    from sweep.bench.session import Session
    from sweep.config import GateConfig, compose
    from sweep.bench.costs import cost_model
    from sweep.gates import make_gate
    from sweep.models import load_model
    from sweep.models.prompts import read_prompts, tokenize_prompts
    from sweep.trace.simulate import signals_from_trace, simulate

    cfg = compose(["prompts=humaneval", "prompts.start=100", "prompts.n=1"])
    lm = load_model(cfg.model, device="cpu", dtype="float32", seed=0)
    prompt = tokenize_prompts(read_prompts(cfg.prompts), cfg.prompts, lm.tokenizer)
    gates = []
    for gate, lens in {pair for pairs in FAMILIES.values() for pair in pairs}:
        for depth in DEPTHS:
            for v in LADDERS[gate]:
                gates.append(
                    GateConfig(
                        name=gate,
                        min_depth=depth,
                        theta=v,
                        lens=lens,
                        readouts=str(readouts) if lens == "tuned" or gate == "classifier" else None,
                    )
                )
    probes, session = [], Session()
    for g in {(g.name, g.lens, g.readouts) for g in gates}:
        probe = GateConfig(name=g[0], min_depth=0.25, theta=0.5, lens=g[1], readouts=g[2])
        probes.append(make_gate(probe, lm, gate_readouts(probe, lm, prompt, session)))
    costs = cost_model(lm, prompt[0].input_ids, gates=probes)
    sim = simulate(gates, signals_from_trace(trace), costs)
    family = {pair: fam for fam, pairs in FAMILIES.items() for pair in pairs}
    return sim.with_columns(
        family=pl.struct("gate", "lens").map_elements(
            lambda r: family[(r["gate"], r["lens"] or "logit")], return_dtype=pl.String
        )
    ), costs


PICK_AT = (0.95, 0.98, 0.99)  # teacher-forced agreement; closed loop reads lower (errors cascade)


def picks(sim) -> list[dict]:
    """Per family: the replay's best predicted speedup at teacher-forced agreement >= each of PICK_AT."""
    import polars as pl

    chosen = {}
    for target in PICK_AT:
        ok = sim.filter(pl.col("agreement_tf") >= target).sort("speedup_model", descending=True)
        for r in ok.unique(["family"], keep="first", maintain_order=True).iter_rows(named=True):
            chosen[(r["gate"], r["lens"], r["theta"], r["min_layer"])] = r
    return list(chosen.values())


def closed_loop(root: Path, name: str, prompts: list[str], chosen: list[dict], readouts: Path, args) -> None:
    spaces = []
    for r in chosen:
        entry = {"gate": r["gate"], "gate.theta": r["theta"], "gate.min_layer": r["min_layer"]}
        if r["lens"] == "tuned" or r["gate"] == "classifier":
            entry |= {"gate.lens": r["lens"] or "logit", "gate.readouts": str(readouts)}
        spaces.append("{" + ", ".join(f"{k}: {v}" for k, v in entry.items()) + "}")
    n = [p for p in prompts if not p.startswith("prompts.n=")] + [f"prompts.n={args.closed_n}"]
    sweep_cli(
        "run",
        "search=gates-grid",
        f"search.name=learned-{name}",
        f"search.spaces=[{', '.join(spaces)}]",
        *n,
        f"bench.gen_tokens={GEN}",
        f"bench.repeats={args.repeats}",
        "resources.cpu=2",
        f"results.root={root}",
        threads=args.threads,
    )


def report(root: Path, name: str) -> None:
    import polars as pl

    from sweep.store import read

    rows = read("trials", root).filter(
        pl.col("sweep_name").str.starts_with(f"learned-{name}-") & (pl.col("status") == "ok")
    )
    fam = {"classifier": "classifier"}
    rows = rows.with_columns(
        family=pl.when(pl.col("gate") == "classifier")
        .then(pl.lit(fam["classifier"]))
        .when(pl.col("lens") == "tuned")
        .then(pl.lit("tuned lens"))
        .otherwise(pl.lit("logit lens"))
    )
    print(f"\n{name}: closed loop ({rows['n_prompts'].max()} prompts x {GEN} tokens), every setting run")
    print(f"  {'family':<12}{'setting':<44}{'agree':>7}{'speedup':>9}{'e2e':>7}{'exit':>6}{'model':>7}")
    for r in rows.sort("family", "agreement").iter_rows(named=True):
        setting = f"{r['gate']} lens={r['lens'] or 'logit'} theta={r['theta']:g} min_layer={r['min_layer']}"
        print(
            f"  {r['family']:<12}{setting:<44}{r['agreement']:>7.3f}{r['speedup_wall']:>9.3f}"
            f"{r['speedup_e2e_wall']:>7.3f}{r['exit_rate']:>6.2f}{r['speedup_model']:>7.3f}"
        )
    print(f"  best measured decode speedup (e2e) at closed-loop agreement >= target, per family, on {name}:")
    for family in FAMILIES:
        cells = []
        for target in (0.95, 0.98):
            ok = rows.filter((pl.col("family") == family) & (pl.col("agreement") >= target))
            if ok.height == 0:
                cells.append(f">= {target}: none")
            else:
                b = ok.sort("speedup_wall", descending=True).row(0, named=True)
                cells.append(f">= {target}: {b['speedup_wall']:.3f} ({b['speedup_e2e_wall']:.3f})")
        print(f"    {family:<12}" + "   ".join(cells))


def cost_check(root: Path, readouts: Path, sim, threads: int, runs: int = 3) -> None:
    """One tuned-lens gate at a fixed threshold that exits often: predicted vs measured, in ``runs``
    separate `sweep bench` processes (each measures its own cost model)."""
    import polars as pl

    from sweep.store import read

    tuned = sim.filter((pl.col("gate") == "margin") & (pl.col("lens") == "tuned") & (pl.col("min_layer") == 15))
    # the setting whose replayed exit rate is nearest one half: the cost model has exits and full steps to charge
    row = tuned.sort((pl.col("exit_rate") - 0.5).abs()).row(0, named=True)
    errors = []
    for i in range(runs):
        out = sweep_cli(
            "bench",
            "gate=margin",
            "gate.lens=tuned",
            f"gate.readouts={readouts}",
            f"gate.theta={row['theta']}",
            "gate.min_layer=15",
            "prompts=humaneval",
            "prompts.start=100",
            "prompts.n=4",
            f"bench.gen_tokens={GEN}",
            "bench.repeats=5",
            "dtype=float32",
            f"results.root={root}/cost-check-{i}",
            threads=threads,
        )
        if i == 0:
            print(out)
        r = read("trials", root / f"cost-check-{i}").sort("created_at").row(-1, named=True)
        errors.append(r["speedup_model"] / r["speedup_wall"] - 1)
        print(
            f"cost model check {i} (fp32, 4 prompts, margin lens=tuned theta={row['theta']:g} "
            f"min_layer={r['min_layer']}): predicted {r['speedup_model']:.3f}, measured {r['speedup_wall']:.3f}, "
            f"error {errors[-1]:+.1%} (exit rate {r['exit_rate']:.2f}, probe {r['cost_probe_ms']:.2f} ms)"
        )
    print(f"cost model check: median error {statistics.median(errors):+.1%} over {runs} runs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--readouts", type=Path, default=None, help="readouts already fitted (skips the fit)")
    ap.add_argument("--fit-n", type=int, default=100)
    ap.add_argument("--closed-n", type=int, default=16, help="prompts of each evaluation set run closed-loop")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip", nargs="*", default=[], help="steps to skip: closed, cost")
    ap.add_argument("--sets", nargs="*", default=["humaneval", "chat"], help="evaluation sets to run")
    args = ap.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    if args.readouts is None:
        readouts, seconds = fit(args.root, args.fit_n, args.threads)
        print(f"fit: {seconds:.1f} s ({args.fit_n} HumanEval prompts x {GEN} tokens)")
    else:
        readouts = args.readouts
    summary = {}
    for name, prompts in eval_sets(args.fit_n).items():
        if name not in args.sets:
            continue
        t = trace(args.root, name, prompts, readouts, args.threads)
        print(f"\n{name}: per-layer top-1 agreement with the final layer and KL (decision positions)")
        print(layer_table(t))
        sim, costs = replay(t, readouts, args.threads)
        sim.write_parquet(args.root / f"replay-{name}.parquet")
        chosen = picks(sim)
        summary[name] = [{k: r[k] for k in ("gate", "lens", "theta", "min_layer", "agreement_tf")} for r in chosen]
        print(f"  replayed {sim.height} settings; closed-loop candidates: {len(chosen)}")
        if "closed" not in args.skip:
            closed_loop(args.root, name, prompts, chosen, readouts, args)
            report(args.root, name)
        if name == "humaneval" and "cost" not in args.skip:
            cost_check(args.root, readouts, sim, args.threads)
    (args.root / "learned_exits.json").write_text(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
