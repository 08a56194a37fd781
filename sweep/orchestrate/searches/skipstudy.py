"""`search=skipset-optuna` and `search=skipset-random`: skip sets searched on the fast screen, the best
few then measured closed-loop.

An Optuna study over one boolean per sublayer the model lets a skip set bypass (``Adapter.skippable``: ``a1``,
``m1``, ``a2``, ...: bypass layer l's attention / MLP; a hybrid's ``s<l>``, a state-space mixer) maximises
the screen's predicted speedup (``sweep.decode.skipscreen``) of a skip-set draft at the search's draft_len and
draft_stop (or, with ``search.draft_stops`` / ``search.draft_lens``, at the draft_stop / draft_len each
candidate draws from that list: categorical parameters beside the booleans), with the skip ratio |S| / (those
sublayers) kept in ``search.skip_ratio`` (TPE's constraint; a random sampler's out-of-range sets are recorded and
never chosen). Both samplers are seeded: on the same recorded decodes and cost model the study is the same twice. Each
candidate's screen figures, and the trial id of its closed-loop setting (the join key with the Parquet
``trials`` table), are user attributes of its study trial; the cost model the screen used is a user
attribute of the study. The best ``search.closed_loop`` distinct candidates (set, draft_stop, draft_len) in
range run closed-loop as grid settings.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Sequence

from sweep.decode.skipscreen import FirstDrafts, predict
from sweep.gates.skipset import Candidate, SkipSet
from sweep.errors import ConfigError
from sweep.orchestrate.searches.study import FrozenTrial, Study, complete_trials, new_study
from sweep.orchestrate.searches.study import sampler as make_sampler

log = logging.getLogger("sweep.orchestrate.searches.skipstudy")
ASKS = 20  # proposals per distinct candidate at most: a space with fewer candidates than n_trials ends the study
REPEATS = 50  # proposals in a row that each repeat a screened candidate: the space looks spent, the study ends


def param_names(num_layers: int) -> list[str]:
    """The study's parameters, in skip-set mask order: a1, m1, a2, m2, ..."""
    return [f"{kind}{layer}" for layer in range(1, num_layers + 1) for kind in ("a", "m")]


def search(
    screen: Callable[[SkipSet], FirstDrafts],
    *,
    num_layers: int,
    n_trials: int,
    sampler: str,
    seed: int,
    ratio: tuple[float, float],
    draft_len: int,
    draft_stop: float | None,
    costs,
    draft_stops: Sequence[float | None] | None = None,
    draft_lens: Sequence[int] | None = None,
    storage: str | None = None,
    study_name: str = "skipset",
    trial_id: Callable[[Candidate], str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    names: Sequence[str] | None = None,
) -> Study:
    """Run the screen study: ``screen(S)`` gives a candidate's first drafts; returns the study. With
    ``draft_stops`` / ``draft_lens``, each candidate also draws its draft_stop / draft_len from that list
    (``draft_stop`` / ``draft_len`` is then unused; ``costs`` must price a verification of max(draft_lens) + 1
    positions). ``names``: the sublayers searched, as skip-set items (``Adapter.skippable``; an attention and an
    MLP per layer, ``param_names``, where not given)."""
    lo, hi = ratio
    study = new_study(study_name, storage, "maximize", load_if_exists=storage is not None)
    # seeded, and a resumed study's sampler never restarts on the stream that drew the trials it holds
    study.sampler = make_sampler(sampler, seed + len(study.trials))
    _check_resumed(study, {"draft_stop": draft_stops, "draft_len": draft_lens})
    study.set_user_attr("costs", {k: v for k, v in dataclasses.asdict(costs).items()})
    study.set_user_attr("skip_ratio", [lo, hi])
    names = list(names) if names is not None else param_names(num_layers)
    # n_trials counts distinct candidates: one drawn again is told its earlier figure and not counted
    seen = screened_sets(study, draft_stop, draft_len)
    space = 2 ** len(names) * len(draft_stops or [None]) * len(draft_lens or [None])  # every candidate there is
    in_row = 0
    for _ in range(ASKS * n_trials):
        if len(seen) >= min(n_trials, space) or in_row >= REPEATS:
            break
        trial = study.ask()
        mask = [trial.suggest_categorical(name, [False, True]) for name in names]
        skip = SkipSet.parse("+".join(name for name, on in zip(names, mask) if on) or "none")
        stop = trial.suggest_categorical("draft_stop", list(draft_stops)) if draft_stops is not None else draft_stop
        n = trial.suggest_categorical("draft_len", list(draft_lens)) if draft_lens is not None else draft_len
        r = skip.ratio(num_layers, len(names))
        violation = max(lo - r, r - hi, 0.0)
        trial.set_constraint("skip_ratio", violation)  # TPE keeps to feasible sets (Optuna 5's constraints)
        trial.set_user_attr("ratio_violation", violation)
        earlier = seen.get(Candidate(skip.text(), stop, n))
        if earlier is not None:  # screened already: the study learns it again, the count does not move
            for key, value in earlier.user_attrs.items():
                trial.set_user_attr(key, value)
            trial.set_user_attr("repeat_of", earlier.number)
            study.tell(trial, earlier.value)
            in_row += 1
            continue
        in_row = 0
        t0 = time.perf_counter()
        pred = predict(screen(skip), n, stop, costs, skip)
        attrs = {
            "skip": skip.text(),
            "draft_stop": stop,
            "draft_len": n,
            "skip_ratio": r,
            "acceptance_rate": pred.acceptance_rate,
            "acceptance_length": pred.acceptance_length,
            "predicted_speedup": pred.speedup,
            "screen_seconds": time.perf_counter() - t0,
        }
        if trial_id is not None:
            attrs["trial_id"] = trial_id(Candidate(skip.text(), stop, n))
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        seen[Candidate(skip.text(), stop, n)] = study.tell(trial, pred.speedup if pred.speedup is not None else 0.0)
        if progress is not None:
            progress(len(seen), n_trials)
    # the study has run its course for n_trials (its distinct sets, or every proposal a space with fewer allows):
    # a sweep continued with the same n_trials reads it, and screens nothing again
    study.set_user_attr("screened_for", max(n_trials, int(study.user_attrs.get("screened_for", 0))))
    # why it holds fewer than n_trials, if it does (said where the sweep reports the screen: ``ended``)
    why = "space" if len(seen) >= space else "repeats" if in_row >= REPEATS else "asks"
    study.set_user_attr("ended", None if len(seen) >= n_trials else why)
    study.set_user_attr("space", space)
    return study


def ended(study: Study, distinct: int, n_trials: int) -> str | None:
    """Why a study holding ``distinct`` candidates, fewer than ``n_trials``, ended there (None where it holds
    them): its space has no more, 50 repeats in a row, or its proposals ran out on repeats."""
    why = study.user_attrs.get("ended")
    if distinct >= n_trials or why is None:
        return None
    reason = {
        "space": f"every one of the {study.user_attrs.get('space')} candidates its space holds",
        "repeats": f"its last {REPEATS} proposals each repeated a candidate it had screened (its space looks spent)",
    }.get(why, f"its {ASKS} proposals per set asked ran out on repeats")
    return f"{distinct} of search.n_trials={n_trials} screened: {reason}"


def _check_resumed(study: Study, drawn: dict[str, Sequence | None]) -> None:
    """A resumed study must draw with the set what this search draws: the same lists, or none."""

    def text(values) -> str:
        return "null" if values is None else "[" + ",".join("null" if v is None else f"{v:g}" for v in values) + "]"

    for t in complete_trials(study):
        for name, listed in drawn.items():
            dist = t.distributions.get(name)
            had = list(dist.choices) if dist is not None else None
            if had != (list(listed) if listed is not None else None):
                did = f"drew {name} from {text(had)}" if had is not None else f"did not draw {name}"
                raise ConfigError(
                    f"search.{name}s={text(listed)}: the study this sweep resumes {did}; resume with the same "
                    f"search.{name}s, or start a new sweep (resume=false)"
                )


def best_trials(
    study: Study, k: int, draft_stop: float | None = None, draft_len: int | None = None
) -> list[FrozenTrial]:
    """The study trials of the ``k`` distinct candidates (skip set, draft_stop, draft_len) in the ratio range
    with the highest predicted speedup (ties: the higher predicted acceptance length, then the earlier trial).
    ``draft_stop`` / ``draft_len``: the search's own, for trials of a study screened before they were recorded."""
    feasible = [t for t in complete_trials(study) if t.user_attrs.get("ratio_violation", 1.0) == 0.0]
    feasible.sort(key=lambda t: (-(t.value or 0.0), -(t.user_attrs.get("acceptance_length") or 0.0), t.number))
    chosen: dict[Candidate, FrozenTrial] = {}
    for t in feasible:
        chosen.setdefault(candidate(t, draft_stop, draft_len), t)
        if len(chosen) == k:
            break
    return list(chosen.values())


def screened_sets(study: Study, draft_stop: float | None, draft_len: int | None) -> dict[Candidate, FrozenTrial]:
    """The study's distinct candidates so far, each with a complete trial of it (``candidate`` for the defaults)."""
    return {candidate(t, draft_stop, draft_len): t for t in complete_trials(study)}


def candidate(trial: FrozenTrial, draft_stop: float | None = None, draft_len: int | None = None) -> Candidate:
    """A study trial's candidate; a trial screened before draft_stop / draft_len were recorded ran at the
    search's own, given here."""
    u = trial.user_attrs
    return Candidate(u["skip"], u.get("draft_stop", draft_stop), u.get("draft_len", draft_len))
