"""Speedup and acceptance per prompt category, as Spec-Bench reports them: for each model's best setting at the
headline agreement target (the verdicts', ranked as the targets table ranks) and its best self-speculative draft,
per category of its prompts (``prompt_categories``: chat, code, or a JSONL file's own), the geometric mean of the
prompts' measured speedups (``prompt_speedup_wall``) and, for a draft, the pooled share of its prompts' drafts
accepted (``prompt_acceptance``, each prompt weighted equally)."""

from __future__ import annotations

import math

import polars as pl

from sweep.analysis import best_at_targets, params_text
from sweep.report.context import ReportContext


def _per_category(row: dict) -> dict[str, tuple[float | None, float | None, int]]:
    cats, speedups = row.get("prompt_categories"), row.get("prompt_speedup_wall")
    accept = row.get("prompt_acceptance") or [None] * len(cats or [])
    if not cats or not speedups or len(cats) != len(speedups):
        return {}
    out = {}
    for cat in sorted(set(cats)):
        idx = [i for i, c in enumerate(cats) if c == cat]
        s = [speedups[i] for i in idx if speedups[i] is not None and speedups[i] > 0]
        a = [accept[i] for i in idx if i < len(accept) and accept[i] is not None]
        geo = math.exp(sum(math.log(x) for x in s) / len(s)) if s else None
        out[cat] = (geo, sum(a) / len(a) if a else None, len(idx))
    return out


def category_lines(ctx: ReportContext) -> list[str]:
    """Markdown lines: per model, its best setting and best draft, each category's speedup and acceptance (nothing
    when every prompt shares one category)."""
    ok = ctx.ok
    if not ok.height or "prompt_categories" not in ok.columns:
        return []
    metric = ok["speedup_metric"][0]
    plain = ok.filter(pl.col("mode") != "self_speculative")
    at = best_at_targets(plain, (ctx.headline,), metric=metric, reference=False) if plain.height else plain
    picks = []
    for model in sorted(ok["model"].unique().to_list()):
        # the verdicts' pick among the settings that are not drafts (as the targets table ranks them), and the draft
        # the tables rank first (a lossless draft keeps agreement 1)
        chosen = at.filter((pl.col("model") == model) & pl.col("trial_id").is_not_null()) if at.height else at
        best = ok.filter(pl.col("trial_id").is_in(chosen["trial_id"].to_list())) if chosen.height else chosen
        rows = ok.filter((pl.col("model") == model) & (pl.col("mode") == "self_speculative"))
        draft = rows.sort(["speedup", metric, "trial_id"], descending=[True, True, False]).head(1)
        for frame, kind in ((best, "best setting"), (draft, "best draft")):
            if frame.height:
                picks.append((model, kind, frame.row(0, named=True)))
    split = [(model, kind, r, _per_category(r)) for model, kind, r in picks]
    if len({cat for *_, cats in split for cat in cats}) < 2:  # one category: the tables above already say it all
        return []
    lines = []
    for model, kind, r, cats in split:
        for cat, (speedup, acceptance, n) in cats.items():
            what = f"{r['gate']} {params_text(r)}".strip()
            lines.append(
                f"| {model} | {kind}: {what} | {cat} | {n} | {'n/a' if speedup is None else f'{speedup:.3f}x'} | "
                f"{'n/a' if acceptance is None else f'{acceptance:.2f}'} |"
            )
    if not lines:
        return []
    head = [
        "## Per prompt category",
        "",
        f"Per category of the prompts (chat, code, or a JSONL file's own), for each model's best setting at agreement "
        f">= {ctx.headline:g} (the verdicts' target; none where no setting reaches it) and its fastest "
        "self-speculative draft: the geometric mean of the prompts' measured speedups (median over rounds each) and, "
        "for a draft, the mean share of drafts accepted.",
        "",
        "| model | setting | category | prompts | speedup | acceptance |",
        "|---|---|---|---|---|---|",
    ]
    return head + lines + [""]
