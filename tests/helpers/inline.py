"""The driver's cluster without Ray: each Tune trial of a pass runs in this process, one after another, through the
worker's own code (``sweep.orchestrate.worker.tune_trial``), its reports handed to the driver's writer in the order
Ray Tune's callbacks hand them (a trial started, each report, the trial complete). A second implementation of
``sweep.orchestrate.driver.Cluster``, for the fast tier: the driver and the worker run as they do on Ray."""

from __future__ import annotations

from typing import Any, Callable

from sweep.orchestrate.settings import Pass, Plan
from sweep.orchestrate.worker import tune_trial
from sweep.orchestrate.writer import RowWriter


class InlineCluster:
    def __init__(self, device: str = "cpu") -> None:
        self.resources = {"cpu": 1.0, "gpu": 0.0}
        self.device = device
        self.trials: list[dict] = []  # each Tune trial's config, in the order they ran

    def in_worker(self, fn: Callable[..., Any], label: str, *args: Any) -> Any:
        return fn(*args)

    def run(self, plan: Plan, batch: Pass, writer: RowWriter) -> bool:
        if batch.values is None:
            raise NotImplementedError("a search that samples needs Ray Tune's searcher")
        context = {"run_id": plan.run_id, "sweep_name": plan.name, "device": self.device, "done": batch.done}
        for n, value in enumerate(batch.values):
            key, config = f"inline_{len(self.trials)}", {batch.key: value}
            self.trials.append(config)
            writer.started(key)
            tune_trial(config, plan.base, context, lambda report, key=key: writer.result(key, report))
            writer.complete(key)
        return False

    def broken(self) -> str | None:
        return None

    def drain(self) -> None:
        pass
