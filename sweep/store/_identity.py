"""Whether a trial row's identity holds together: its ``trial_key`` (the canonical JSON its ``trial_id`` hashes) hashes
to that id and names the model and gate of the directories it was read from (``model=``, ``gate=``). A file edited,
moved to another gate's directory or copied there does not: a resume would skip a setting on its word, and an analysis
would rank its figures under another setting's name."""

from __future__ import annotations

import functools
import json
import logging

import polars as pl

log = logging.getLogger("sweep.store")


def broken_identity(rows: pl.DataFrame, *, ids: bool = True) -> pl.Series:
    """Per row of the trials table: True where its identity does not hold together (``ids=False``: only where its key
    names another model or gate than its directories, so that it would be shown under another setting's name; its
    id is not rehashed). Rows without a ``trial_key`` (files of schema 2 and older), or whose key is no JSON text at
    all, are taken as they are."""
    from sweep.config.identity import key_is_of

    if not rows.height or "trial_key" not in rows.columns:
        return pl.Series("broken", [False] * rows.height, dtype=pl.Boolean)
    out = []
    for key, trial_id, model, gate in zip(rows["trial_key"], rows["trial_id"], rows["model"], rows["gate"]):
        if key is None:
            out.append(False)
            continue
        try:
            named = json.loads(key)
        except ValueError:  # not a trial's key at all (another tool's text): not this check's to judge
            out.append(False)
            continue
        try:
            holds = named["model"]["name"] == model and named["gate"]["name"] == gate
            holds = holds and (not ids or key_is_of(key, trial_id))
        except (TypeError, KeyError, AttributeError):
            holds = False
        out.append(not holds)
    return pl.Series("broken", out, dtype=pl.Boolean)


def trusted_rows(rows: pl.DataFrame, where: str, *, ids: bool = True) -> pl.DataFrame:
    """``rows`` (of the trials table, read under ``where``) without those whose identity does not hold together
    (``broken_identity``, ``ids`` as there), named in one warning (each row once per process and root)."""
    broken = broken_identity(rows, ids=ids)
    if not broken.any():
        return rows
    bad = rows.filter(broken)
    named = _named(str(where))
    new = [r for r in bad.select("trial_id", "model", "gate").iter_rows() if r not in named]
    if new:  # a sweep reads its rows in its plan, its search and its end: each row named once, not once each
        named.update(new)
        shown = ", ".join(f"{tid} (in model={model}/gate={gate})" for tid, model, gate in new[:5])
        more = f" and {len(new) - 5} more" if len(new) > 5 else ""
        count = f"{len(new)}" if len(new) == bad.height else f"{len(new)} more"
        log.warning(
            "%s trial row(s) under %s left out%s: the trial_key it holds does not hash to its trial_id, or names "
            "another model or gate than its directories (an edited, moved or copied file): %s%s",
            count,
            where,
            "" if len(new) == bad.height else f" ({bad.height} in all)",
            shown,
            more,
        )
    return rows.filter(~broken)


@functools.lru_cache(maxsize=64)
def _named(where: str) -> set[tuple[str, str, str]]:
    """The rows ``trusted_rows`` has named under the root ``where`` in this process (trial id, model, gate)."""
    return set()
