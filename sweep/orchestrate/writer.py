"""On the driver: the single writer of a sweep's trial rows, and its progress lines.

Ray-free: ``sweep.orchestrate.ray.callbacks.Progress`` (a Tune callback) hands trial events to ``RowWriter``.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from sweep import progress
from sweep.errors import SweepError
from sweep.gates import gate_text
from sweep.config.identity import trial_identity
from sweep.orchestrate.done import finished_row_of, row_path
from sweep.orchestrate.report import row_of

from sweep.orchestrate.settings import trial_config, tune_settings

log = logging.getLogger("sweep.orchestrate.writer")


@dataclass
class SweepOutcome:
    name: str
    path: str
    root: str
    total: int
    skipped: int  # settings whose finished row already existed (planned around, or reported again)
    written: int = 0  # rows this run wrote
    rows: list[dict] = field(default_factory=list)  # the sweep's settings' rows: this run's and those done before
    overhead_s: list[float] = field(default_factory=list)
    interrupted: bool = False
    unrowed: int = 0  # trials that could not even be composed, so have no row (each logged)
    simulated: Any = None  # search=screen: the simulated settings (a polars DataFrame)


class RowWriter:
    """The single writer of trial rows, and the progress lines.

    Fed by ``sweep.orchestrate.ray.callbacks.Progress``; also writes the rows Tune holds at the end that a
    callback never saw, and failed rows for trials that errored. A finished row (``finished_row_of``: in place or
    kept, done under the sweep's ``search``) is never replaced unless ``rerun``: a trial whose row exists (from an
    earlier run, or computed meanwhile by a concurrent sweep into the same root) is counted
    as skipped, not written. Once a row is written its claim (``sweep.orchestrate.claims``) is released.

    A row that cannot be written (a full disk, a read-only mount: any OSError of the store) is
    never half-written (``sweep.store`` writes atomically); the first such error is kept in
    ``fatal`` (a one-line SweepError naming the file), which stops the sweep (``sweep.orchestrate.driver``), and
    a resume computes that trial again.
    """

    def __init__(
        self,
        root: str,
        total: int | None,
        base: list[str],
        run_id: str,
        sweep_name: str,
        device: str,
        *,
        rerun: bool = False,
        search=None,
    ) -> None:
        self.root, self.total, self.base, self.run_id, self.sweep_name = root, total, base, run_id, sweep_name
        self.device = device  # the trials' device, as the driver resolved it
        self.rerun = rerun
        self.search = search  # the sweep's search: whose stopping rule says whether a stopped row is done
        self.rows: list[dict] = []  # every trial's row this run reported (written or existing)
        self._overheads: dict[str, float] = {}  # per Tune trial: its wall time less its rows' bench_seconds
        self._bench: dict[str, float] = {}
        self.written = 0
        self.existing = 0  # reported trials whose finished row was already there
        self._seen: set[str] = set()
        self._started: dict[str, float] = {}
        self.fatal: SweepError | None = None  # the first row that could not be written
        self.unrowed = 0  # trials reported without a row (their config did not compose)
        self._shown: progress.Phase | None = None  # the settings' count (``sweep.progress``), from the first row
        self.retry: list[list[str]] = []  # settings of Tune trials given up before sweep.max_failures (``gave_up``)
        self.last_pass = False  # the driver's last pass over ``retry``: what it gives up on gets failed rows
        self._work: list[tuple[float, float, bool]] = []  # computed settings: work, bench seconds, run to the end
        self._shared: list[int] = []  # their bundles' sizes
        self._ended: set[str] = set()  # Tune trials that ended

    @property
    def overheads(self) -> list[float]:
        """Per Tune trial (one setting, or a bundle sharing a baseline): the driver's wall time from
        its start to its last row, less the rows' ``bench_seconds`` and ``task_seconds``."""
        return list(self._overheads.values())

    def started(self, key: str) -> None:
        self._settings()  # the settings' count and its clock start with the first Tune trial
        self._started[key] = time.perf_counter()

    def result(self, key: str, result: dict) -> None:
        for note in result.get("notes") or ():  # from the worker: claims taken over, unclaimed runs
            log.warning("%s", note)
        row = row_of(result)
        if row is None:
            if result.get("error"):
                self.unrowed += 1
                log.warning(
                    "[%d/%s] a setting could not be composed, so it has no row: %s",
                    len(self._seen),
                    self.total,
                    result["error"],
                )
            return
        cached = bool(result.get("cached"))
        with progress.timed("writing"):
            written = self.write(row, cached=cached)
        if self.fatal is not None and not written and not cached:
            return  # said once, in write; the sweep stops
        if written and not cached and row.get("bench_seconds") is not None:
            wall = time.perf_counter() - self._started.get(key, time.perf_counter())
            seconds = row["bench_seconds"] + (row.get("task_seconds") or 0.0)  # the task's decoding is the worker's
            self._bench[key] = self._bench.get(key, 0.0) + seconds
            self._overheads[key] = wall - self._bench[key]
            work = row_work(row)
            if work:
                self._work.append((work, seconds, row.get("status") != "stopped"))
                self._shared.append(row.get("baseline_shared") or 1)
        # "[n/total] <the setting's line> (n/total, elapsed, ETA)", the settings' count in the display
        shown = self._settings()
        text = describe(row, cached, result.get("computed_by"))
        shown.advance(len(self._seen) - shown.done, text=text, eta=self.eta(len(self._seen)))

    def eta(self, done: int) -> float | None:
        """Seconds left, from the measured time per unit of decode work (``row_work``) of the settings computed so
        far, not from their count: the settings still to run, each at the median work of those run to the end,
        plus each Tune trial's median time outside its bench (loading, setting up), over the Tune trials running
        at once. A bundle's settings (``sweep.shared_baseline``) count at their share of its baseline, so its rows
        arriving together step the estimate down evenly. None before the first computed setting."""
        import math
        import statistics

        full = [w for w, _, whole in self._work if whole]
        if not full or self.total is None:
            return None
        left = max(self.total - done, 0)
        per_work = sum(b for _, b, _ in self._work) / sum(w for w, _, _ in self._work)
        trials_left = left / statistics.fmean(self._shared)
        running = len(set(self._started) - self._ended)
        at_once = max(1, min(running, math.ceil(trials_left))) if trials_left else 1
        overhead = statistics.median(self._overheads.values()) if self._overheads else 0.0
        return (left * statistics.median(full) * per_work + trials_left * max(overhead, 0.0)) / at_once

    def complete(self, key: str) -> None:
        """A Tune trial ended (its rows came with its results; one whose worker failed: ``gave_up``)."""
        self._ended.add(key)

    def extend(self, n: int) -> None:
        """``n`` more settings to write (a pass after the search's: re-timing): the count shown grows with them."""
        self.total = (self.total or 0) + n
        if self._shown is not None:
            self._shown.total = self.total

    def _settings(self) -> progress.Phase:
        if self._shown is None:
            self._shown = progress.start("settings", self.total)
        return self._shown

    def close(self) -> None:
        """The sweep is over: its settings' count leaves the display."""
        if self._shown is not None:
            self._shown.close()

    def gave_up(self, config: dict, error: str, failures: int, allowed: int) -> None:
        """A Tune trial Tune gave up on after ``failures`` worker deaths where sweep.max_failures allows
        ``allowed`` (-1: any number): failed rows once the allowance is spent (``errored``); before that, its
        settings without a row are kept in ``retry``, which the driver runs again. Ray Tune can count one
        worker's death twice, once while it already requeues the trial, and then stops a trial it was
        retrying (seen in CI: one SIGKILL, two failures of one actor, sweep.max_failures=3)."""
        if self.last_pass or (allowed >= 0 and failures > allowed):
            self.errored(config, error)
            return
        left = [t for t in tune_settings(config) if self._identity(t) not in self._seen]
        self.retry.extend(left)
        log.warning(
            "a Tune trial lost its worker and Tune gave up on it after %d failure(s), within sweep.max_failures=%d; "
            "its %d setting(s) without a row run again after this pass: %s",
            *(failures, allowed, len(left), error),
        )

    def _identity(self, trial: list[str]) -> str | None:
        """The trial id of a setting on this sweep's device; None when it does not compose."""
        try:
            return trial_identity(trial_config(self.base, trial, self.device), self.device).id
        except SweepError:
            return None

    def errored(self, config: dict, error: str) -> None:
        """A Tune trial (one setting, or a bundle of them) Tune gave up on: its worker died more than
        sweep.max_failures times. A failed row for each of its settings that has no row yet."""
        from sweep.bench.rows import complete_row, failed_row

        for trial in tune_settings(config):
            try:
                cfg = trial_config(self.base, trial, self.device)
            except SweepError as exc:
                log.warning("a Tune trial errored and its setting could not be composed (%s): %s", exc, error)
                continue
            failure = RuntimeError(f"the trial's worker failed more than sweep.max_failures times; last error: {error}")
            self.write(
                complete_row(
                    cfg, None, failed_row(cfg, cfg.prompts.n or 0, failure), self.run_id, sweep_name=self.sweep_name
                )
            )
            log.warning("[%d/%s] a Tune trial gave up after retries: %s", len(self._seen), self.total, error)

    def write(self, row: dict, *, cached: bool = False) -> bool:
        """Write a row once per trial id in this sweep; True if written now.

        ``cached``: the worker reported a finished row that is already in the store."""
        from sweep.orchestrate import claims
        from sweep.store import kept_line, unwritten_line, write_or_keep

        tid = row["trial_id"]
        if tid in self._seen:
            return False
        self._seen.add(tid)
        self.rows.append(row)
        path = row_path(self.root, row["model"], row["gate"], tid)
        if cached or (not self.rerun and finished_row_of(self.root, row["model"], row["gate"], tid, self.search)):
            self.existing += 1
            claims.release(self.root, tid, self.run_id)
            return False
        # no-clobber unless rerun or replacing a failed row: a row that appeared meanwhile wins
        exclusive = not self.rerun and not path.exists()
        try:
            written, failure = write_or_keep(
                "trials", {k: [v] for k, v in row.items()}, root=self.root, stem=tid, exclusive=exclusive
            )
        except FileExistsError:
            log.warning("setting %s: a row appeared meanwhile (another sweep); kept it", tid)
            self.existing += 1
            claims.release(self.root, tid, self.run_id)
            return False
        except OSError as exc:  # nothing was written (atomic): the trial stays to do, and the sweep stops
            self._seen.discard(tid)
            self.rows.remove(row)
            claims.release(self.root, tid, self.run_id)
            lost = unwritten_line(row, exc, path)  # each lost row said with its figures, the first stops the sweep
            if self.fatal is None:
                self.fatal = SweepError(lost)
            log.error("%s; stopping the sweep", lost)
            return False
        if failure is not None and self.fatal is None:  # the row is safe, elsewhere: the sweep stops all the same
            self.fatal = SweepError(kept_line(tid, failure, written))
            log.error("%s; stopping the sweep", self.fatal)
        claims.release(self.root, tid, self.run_id)
        self.written += 1
        return True


def row_work(row: dict) -> float | None:
    """A computed setting's decode work, in generated tokens: timed rounds of its prompts with a full-depth
    baseline and an A/A control shared by the settings of its bundle (``baseline_shared``), each setting's gated
    run its own; a stopped setting's gated runs of its first prompts. None where the row does not say."""
    n, g = row.get("n_prompts"), row.get("gen_tokens")
    if not n or not g:
        return None
    if row.get("status") == "stopped":
        return float(n * g)
    repeats, shared = row.get("repeats") or 1, row.get("baseline_shared") or 1
    return float(n * g * repeats * (1.0 + 2.0 / shared))


def describe(row: dict, cached: bool, computed_by: str | None = None) -> str:
    """One progress line for a finished trial."""
    head = f"{row['model']} gate={row['gate']} {gate_text(row)}{bench_text(row)}"
    if row["status"] == "failed":
        return f"{head}: failed ({row.get('error')})"
    if row["status"] == "stopped":
        return (
            f"{head}: stopped after {row['stopped_at_prompts']} prompts (agreement {row['agreement']:.3f}, "
            f"its interval ends at {row['stop_agreement_hi']:.3f}, below search.min_agreement)"
        )
    if cached:
        tail = f" (row computed by the concurrent sweep {computed_by})" if computed_by else " (row from an earlier run)"
    else:
        tail = (
            f" ({row.get('trial_seconds', 0):.1f} s, pid {row.get('worker_pid')}, "
            f"model loads {row.get('worker_model_loads')})"
        )
    return f"{head}: {row['status']} agreement {row['agreement']:.3f} speedup_wall {row['speedup_wall']:.3f}x" + tail


def bench_text(row: dict) -> str:
    """The bench keys a sweep can vary beside the gate's (``sweep.shared_baseline``'s bundles differ only in gate,
    kv_policy and mode; a batching grid in batch_size), where they are not the defaults: '' or ' key=value ...'."""
    said = []
    if row.get("mode") == "self_speculative":
        said.append(f"draft_len={row.get('draft_len')}")
    elif row.get("kv_policy") not in (None, "propagate"):
        said.append(f"kv_policy={row['kv_policy']}")
    if (row.get("batch_size") or 1) > 1:
        said.append(f"batch_size={row['batch_size']}")
    return "".join(f" {s}" for s in said)


def overhead_summary(outcome: SweepOutcome) -> str:
    if not outcome.overhead_s:
        return ""
    return (
        "orchestration overhead per Tune trial (driver-observed wall - bench and task time): "
        f"median {statistics.median(outcome.overhead_s):.2f} s over {len(outcome.overhead_s)} Tune trials"
    )
