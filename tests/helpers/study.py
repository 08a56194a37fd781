"""An Optuna sweep whose study holds one setting told from its written trials row, as `Optuna().retime` reads it."""

from __future__ import annotations

from types import SimpleNamespace

SETTING = ["gate=saturation", "gate.eps=0.1"]


def study_told_one_row(tmp_path, *overrides: str, **fields):
    """An optuna-mo sweep over saturation's eps (``overrides`` added to its base) whose study holds one setting,
    ``SETTING``, told from its written trials row (1.5x, agreement 0.95; ``fields`` set on the row). Returns the
    plan ``Optuna().retime`` reads, the row, and ``write``, which writes a row again in that setting's place."""
    import optuna

    from conftest import compose
    from helpers.factories import full_trial_row
    from sweep.config.identity import trial_identity
    from sweep.orchestrate.searches.study import opened
    from sweep.orchestrate.settings import trial_config
    from sweep.store import write_table

    root, path = tmp_path / "root", tmp_path / "sweep"
    space = "search.spaces=[{gate: saturation, gate.eps: 'interval(0.05, 0.5)'}]"
    base = ["model=tiny-llama", "search=optuna-mo", space, *overrides, f"results.root={root}"]
    cfg = compose(*base)
    ident = trial_identity(trial_config(base, SETTING, "cpu"), "cpu")
    row = full_trial_row(ident.id)
    row.update(trial_key=ident.key, model=cfg.model.name, **fields)

    def write(r: dict) -> None:
        write_table("trials", {k: [v] for k, v in r.items()}, root=root, provenance={}, stem=ident.id)

    write(row)
    study = optuna.load_study(study_name=cfg.search.name, storage=opened(cfg.search, path)[0])
    study.add_trial(
        optuna.trial.create_trial(
            params={"gate.eps": 0.1}, distributions={"gate.eps": optuna.distributions.FloatDistribution(0.05, 0.5)},
            values=[1.5, 0.95], user_attrs={"trial_id": ident.id}, system_attrs={"constraints": [0.0]},
        )
    )  # fmt: skip
    return SimpleNamespace(cfg=cfg, path=path, root=root, base=base), row, write
