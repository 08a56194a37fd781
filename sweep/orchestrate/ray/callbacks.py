"""The Tune callbacks of a sweep on the driver: trial events to the row writer and the display, and the
stopper that ends a sweep whose rows cannot be written."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from ray import tune

from sweep import progress
from sweep.orchestrate.ray.hub import Hub
from sweep.orchestrate.settings import tune_settings
from sweep.orchestrate.writer import RowWriter

log = logging.getLogger("sweep.orchestrate.ray.callbacks")


class StopWhenRowsCannotBeWritten(tune.stopper.Stopper):
    """Stops every trial once a row could not be written (``RowWriter.fatal``: a full disk): the
    trials still to run would only compute rows that cannot be kept; and once Ray cannot start a worker process
    (``Hub.broken``): the trials still to run would wait for one forever."""

    def __init__(self, writer: RowWriter, hub: Hub | None = None) -> None:
        self.writer, self.hub = writer, hub

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.writer.fatal is not None or (self.hub is not None and self.hub.broken is not None)


class Progress(tune.Callback):
    """Tune callback on the driver: hands trial events to the row writer, and the workers' progress
    events (posted to ``hub``) to the display; ``announce`` (``interrupt.stop_said``) at the run's start."""

    def __init__(self, writer: RowWriter, hub: Hub, announce: Callable[[], None] = lambda: None) -> None:
        self.writer, self.hub, self.announce = writer, hub, announce
        self.drained = 0.0

    def setup(self, **info):
        self.announce()  # Tune's SIGINT handler is in place by now: the first stop signal says what follows

    def on_step_end(self, iteration, trials, **info):
        if time.perf_counter() - self.drained >= 0.5:
            self.drained = time.perf_counter()
            self.hub.drain(wait=False)

    def on_trial_start(self, iteration, trials, trial, **info):
        self.writer.started(trial.trial_id)
        settings = tune_settings(trial.config) if trial.config else []
        if len(settings) > 1:
            progress.note(
                f"Tune trial {trial.trial_id}: {len(settings)} settings timed against one shared baseline in the "
                "same rounds (sweep.shared_baseline): their rows come together when its timed rounds end"
            )

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.hub.drain()  # the worker's last phases before its row
        self.writer.result(trial.trial_id, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.hub.drain()
        self.writer.complete(trial.trial_id)
        progress.finished(f"Tune trial {trial.trial_id}")

    def on_trial_recover(self, iteration, trials, trial, **info):
        failures = trial.run_metadata.num_failures
        log.warning("Tune trial %s lost its worker; retrying it (failures so far: %s)", trial.trial_id, failures)

    def on_trial_error(self, iteration, trials, trial, **info):
        progress.finished(f"Tune trial {trial.trial_id}")
        self.writer.complete(trial.trial_id)
        self.writer.gave_up(
            trial.config, last_error(trial.error_file), trial.run_metadata.num_failures, trial.max_failures
        )


def last_error(path: str | None) -> str:
    """The last line of a Tune trial's error file (the exception), or a placeholder."""
    try:
        lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
        return lines[-1][:300] if lines else "unknown error"
    except (OSError, TypeError):
        return "the worker died"
