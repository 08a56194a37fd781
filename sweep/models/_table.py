"""The supported-families table (`sweep families`, and the README's copy of it), from the code:
each family's tiny model is built, loaded and checked as any model is, and the row says what the
adapter found and what the engine therefore runs or refuses."""

from __future__ import annotations

from sweep.config.families import TINY


def family_rows() -> list[dict]:
    """One row per family of ``sweep.config.families.TINY``: its tiny model loaded (the fidelity check runs)."""
    from sweep.config import compose
    from sweep.models._loader import load_model

    rows = []
    for family, spec in TINY.items():
        cfg = compose([f"model=tiny-{family}"])
        lm = load_model(cfg.model, device="cpu", dtype="float32", seed=cfg.seed)
        a, fid = lm.adapter, lm.fidelity
        top = lm.model.config.model_type
        model_type = a.config.model_type if top == a.config.model_type else f"{top} (text: {a.config.model_type})"
        kind = {"dense": "dense", "moe": "MoE", "ssm": "state-space", "hybrid": "hybrid"}[spec.kind]
        refused = []
        if a.kv_path is None:
            refused.append("kv_policy=propagate")
        if not fid.rollback_ok:
            refused.append("self-speculation")
        elif not _skip_sets(a):
            refused.append("skip-set drafts")
        if not fid.lens_ok:
            refused.append("every exiting gate and the profile")
        if not fid.batch_ok:
            refused.append("bench.batch_size > 1")
        rows.append(
            {
                "family": family,
                "model_type": model_type,
                "kind": kind + (", vision-language wrapper" if spec.multimodal else ""),
                "path": "fast" if a.kv_path == "fast" else ("generic" if a.kv_path == "generic" else "none"),
                "layers": a.layers_path,
                "refused": ", ".join(refused) or "nothing",
                "why": _why(a, fid),
            }
        )
    return rows


def _skip_sets(adapter) -> bool:
    """Whether every decoder layer has sublayers a skip set can name (attention, MLP, state-space mixer)."""
    from sweep.errors import ConfigError

    try:
        for index in range(adapter.num_layers):
            adapter.sublayers(index)
    except ConfigError:
        return False
    return True


def _why(adapter, fid) -> str:
    reasons = []
    if not fid.batch_ok:
        reasons.append("its own left padding is not exact")
    if adapter.kind != "attention":
        reasons.append(
            f"{'state-space' if adapter.kind == 'ssm' else 'its state-space'} layers keep a recurrent "
            "state: no K/V to fill"
        )
    if not fid.rollback_ok:
        reasons.append(f"its cache does not roll back exactly ({fid.rollback_refusal or 'check (e)'})")
    elif not _skip_sets(adapter):
        reasons.append("layers whose sublayers a skip set cannot name")
    return "; ".join(reasons)


def markdown(rows: list[dict]) -> str:
    """The table as the README shows it."""
    lines = [
        "| family (`model=tiny-…`) | HF model_type | kind | K/V fill | decoder layers | refused | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['model_type']} | {r['kind']} | {r['path']} | `{r['layers']}` | {r['refused']} "
            f"| {r['why']} |"
        )
    return "\n".join(lines)
