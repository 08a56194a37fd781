"""`kind: skipset` (`search=skipset-optuna`, `search=skipset-random`): skip sets searched on the fast screen in a
worker (``sweep.orchestrate.searches.skipstudy``: an Optuna study over the sublayers, persisted beside the sweep and
resumed from there), then the best few, with what the study drew with them, measured closed-loop as a grid."""

from __future__ import annotations

import dataclasses
import logging
import time

from sweep import progress
from sweep.config import Config, compose
from sweep.config.search import WITH_THE_SET, as_override, setting_override, spaces
from sweep.config.search_kinds import SkipSetSettings
from sweep.errors import ConfigError
from sweep.gates.skipset import Candidate
from sweep.orchestrate.settings import Plan, merge, trial_config
from sweep.orchestrate.searches.base import InWorker, Search, Selection, register

log = logging.getLogger("sweep.orchestrate.searches.skipset")


@register
class SkipSetSearch(Search):
    settings = SkipSetSettings
    summary = "skip sets screened by an Optuna study in a worker; the best search.closed_loop run closed-loop"

    def foresee(self, cfg, base):
        """Its settings come from the screen; their shared part, at every draft_stop and draft_len it draws, must
        compose."""
        for stop in cfg.search.draft_stops or [None]:
            for n in cfg.search.draft_lens or [None]:
                compose(merge(base, skipset_setting(cfg, Candidate("none", stop, n))))
        return None

    def continues(self, root, path) -> bool:
        """A sweep of the same definition continues its earlier one once that one's study is there (finished or
        not: a resume finishes it)."""
        from sweep.orchestrate.searches.study import study_written

        return study_written(path)

    def select(self, plan: Plan, worker: InWorker) -> Selection:
        """The screen study in a worker with the trials' resources (resumed from its SQLite study when one is
        there; read here, with no worker, when it already holds search.n_trials sets), its progress shown on the
        driver, then the chosen candidates (skip set, draft_stop, draft_len) as grid settings, composed here."""
        from sweep.orchestrate.searches.study import optuna_storage_url

        plan.path.mkdir(parents=True, exist_ok=True)
        storage = optuna_storage_url(plan.path)
        device = worker.device
        found = screened(plan, device) if plan.cfg.resume else None
        if found is None:  # the screen's setting as read here: the worker composes it in a directory of its own
            setting, name = screen_setting(plan.cfg), plan.cfg.search.name
            found = worker.run(skipset_screen, "skip-set screen", plan.base, setting, device, storage, name)
        chosen = [Candidate(*c) for c in found["chosen"]]

        def named(c: Candidate) -> str:  # the set, and what the study drew with it
            drawn = drawn_overrides(plan.cfg, c)
            return c.skip + (f" ({', '.join(drawn)})" if drawn else "")

        figures = [f"predicted {v:.3f}x, acceptance length {a or float('nan'):.2f}" for v, a in found["screened"]]
        when = f"in {found['seconds']:.1f} s" if found["seconds"] is not None else "before (its study, read again)"
        if not chosen:  # every set screened lies outside search.skip_ratio: nothing to measure, and not silently
            ratio = plan.cfg.search.skip_ratio
            raise ConfigError(
                f"search.skip_ratio={list(ratio) if ratio is not None else None}: none of the {found['distinct']} "
                f"sets screened on {found['model']} skips a share of its sublayers in that range, so none runs "
                "closed-loop; widen it, or screen more sets (search.n_trials)"
            )
        log.info(
            "skip-set screen: %d sets screened on %s %s; the best %d run closed-loop: %s",
            found.get("distinct", plan.cfg.search.n_trials),
            found["model"],
            when,
            len(chosen),
            "; ".join(f"{named(c)}: {f}" for c, f in zip(chosen, figures, strict=True)),
        )
        if found.get("spent"):  # fewer distinct sets than asked: the study ended on its own, not interrupted
            log.info("skip-set screen: %s", found["spent"])
        best = max((v for v, _ in found["screened"]), default=None)
        if best is not None and best < 1:  # full depth (1x) is always an option: say the screen found nothing faster
            log.info(
                "skip-set screen: no screened candidate is predicted to beat full depth (best %.3fx); the closed loop "
                "measures the best %d all the same",
                best,
                len(chosen),
            )
        settings = [skipset_setting(plan.cfg, c) for c in chosen]
        return Selection([(setting, trial_config(plan.base, setting, device)) for setting in settings])


def screened(plan: Plan, device: str) -> dict | None:
    """A resumed sweep's finished screen, read from its study on the driver (``skipset_screen``'s answer, no
    seconds): its best candidates once the study holds search.n_trials distinct sets; None while it holds fewer."""
    from sweep.orchestrate.searches.skipstudy import screened_sets
    from sweep.orchestrate.searches.study import open_study

    study = open_study(plan.cfg.search, plan.path)
    if study is None:
        return None
    cfg = trial_config(plan.base, screen_setting(plan.cfg), device)
    n = cfg.search.n_trials
    if len(screened_sets(study, cfg.bench.draft_stop, cfg.bench.draft_len)) < n:
        if int(study.user_attrs.get("screened_for", 0)) < n:  # (a space with fewer sets than n_trials ran its course)
            return None
    return _answer(study, cfg, cfg.model.name or "model", None)


def _answer(study, cfg: Config, model: str, seconds: float | None) -> dict:
    """The screen's answer from its study: the best ``search.closed_loop`` candidates (skip set, draft_stop,
    draft_len) and each one's screen figures (predicted speedup, acceptance length)."""
    from sweep.orchestrate.searches.skipstudy import best_trials, candidate, ended, screened_sets

    b = cfg.bench
    best = best_trials(study, cfg.search.closed_loop, b.draft_stop, b.draft_len)
    distinct = len(screened_sets(study, b.draft_stop, b.draft_len))
    return {
        "chosen": [candidate(t, b.draft_stop, b.draft_len) for t in best],
        "screened": [(t.value, t.user_attrs.get("acceptance_length")) for t in best],
        "seconds": seconds,
        "model": model,
        "distinct": distinct,
        "spent": ended(study, distinct, cfg.search.n_trials),
    }


def screen_setting(cfg: Config) -> list[str]:
    """The screen's own setting, its paths as read here (``skipset_setting``): the sub-space's fixed values with no
    skip set, its cost model pricing the longest draft's verification."""
    lens = cfg.search.draft_lens
    return skipset_setting(cfg, Candidate("none", None, max(lens) if lens else None))


def skipset_setting(cfg: Config, candidate: Candidate) -> list[str]:
    """A skipset search's closed-loop setting for a candidate: its sub-space's fixed values, its skip set, and
    the bench values the study drew with the set (``WITH_THE_SET``: where ``search.draft_stops`` or
    ``search.draft_lens`` is given)."""
    params = spaces(cfg.search)[0]
    fixed = [setting_override(p.key, p.values[0]) for p in params]
    return [*fixed, as_override("gate.skip", candidate.skip), *drawn_overrides(cfg, candidate)]


def drawn_overrides(cfg: Config, candidate: Candidate) -> list[str]:
    """The bench overrides a skipset study drew with the candidate's set (none unless the search lists them)."""
    return [
        as_override(key, getattr(candidate, key.removeprefix("bench.")))
        for key, listed in WITH_THE_SET.items()
        if getattr(cfg.search, listed) is not None
    ]


def skipset_screen(base: list[str], setting: list[str], device: str, storage: str, study_name: str) -> dict:
    """`search=skipset-*` in a worker, on ``setting`` (``screen_setting``, read on the driver): the model's
    full-depth decodes recorded once, the cost model with self-speculation's costs, then the screen study
    (``sweep.orchestrate.searches.skipstudy``) in ``storage``; the candidates (skip set, draft_stop, draft_len) to run
    closed-loop, best first."""
    from sweep.bench.command import load
    from sweep.bench.costs import cost_model
    from sweep.bench.session import process_session
    from sweep.config.identity import trial_identity
    from sweep.decode.skipscreen import first_drafts, record
    from sweep.orchestrate.searches.skipstudy import search

    cfg = trial_config(base, setting, device)
    s, b = cfg.search, cfg.bench
    lm, _, prompts = load(cfg, process_session())
    t0 = time.perf_counter()
    with progress.phase("skip-set screen: full-depth decodes", part="screen"):
        recorded = record(lm, [p.input_ids for p in prompts], b.gen_tokens)
    costs = cost_model(lm, prompts[0].input_ids, kv_policies=[], verify_positions=b.draft_len + 1)
    shown = progress.start("skip-set screen", s.n_trials, part="screen")  # one step per screened set

    def trial_id(candidate) -> str:
        gate = dataclasses.replace(cfg.gate, skip=candidate.skip)
        bench = dataclasses.replace(cfg.bench, draft_stop=candidate.draft_stop, draft_len=candidate.draft_len)
        return trial_identity(dataclasses.replace(cfg, gate=gate, bench=bench), device).id

    study = search(
        lambda skip: first_drafts(lm, recorded, skip),
        num_layers=lm.num_layers,
        n_trials=s.n_trials,
        sampler=s.sampler,
        seed=s.seed,
        ratio=tuple(s.skip_ratio) if s.skip_ratio is not None else (0.0, 1.0),
        draft_len=b.draft_len,
        draft_stop=b.draft_stop,
        costs=costs,
        draft_stops=s.draft_stops,
        draft_lens=s.draft_lens,
        storage=storage,
        study_name=study_name,
        trial_id=trial_id,
        progress=lambda done, _total: shown.advance(done - shown.done),  # a resumed study starts where it was
        names=lm.adapter.skippable(),
    )
    shown.close()
    return _answer(study, cfg, lm.name, time.perf_counter() - t0)
