"""The command layer: every verb that computes is the same four steps, run in order by ``Verb.execute``.

- ``prepare(cfg, session)``: load and check everything the verb needs, from the process's session
  (``sweep.bench.session``: models through the shared workload loader, readouts), so that bad input
  fails here, before any work;
- ``run(cfg, prepared)``: the computation; it writes nothing;
- ``write(cfg, prepared, result)``: what the verb keeps, atomically and inside its root (``sweep.store``),
  returning what was written (None for a verb that writes nothing);
- ``render(cfg, prepared, result, written)``: the lines it prints (prose fitted to 120 columns, paths
  whole) and its exit code.

Each step is a function of its own package, named here as ``module:function`` and imported when the
verb runs (``sweep --help`` imports no torch). `sweep run` follows the same order inside the
orchestrator: ``orchestrate.plan`` prepares, Ray Tune runs, the driver's ``RowWriter`` writes each row
as it arrives, ``report.run_report`` renders.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable


def _step(ref: str) -> Callable:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Verb:
    prepare: str
    run: str
    write: str | None
    render: str
    models: bool = True  # False: the verb loads no model and takes no session (`sweep analyze`: no torch)

    def execute(self, cfg, session=None) -> tuple[list[str], int, Any]:
        """The four steps on ``cfg`` (in ``session``, default this process's): the lines to print, the
        exit code, and what was written."""
        if session is None and self.models:
            from sweep.bench.session import process_session

            session = process_session()
        prepared = _step(self.prepare)(cfg, session)
        result = _step(self.run)(cfg, prepared)
        written = _step(self.write)(cfg, prepared, result) if self.write else None
        lines, code = _step(self.render)(cfg, prepared, result, written)
        return lines, code, written


VERBS = {
    "profile": Verb(
        "sweep.trace.profile:prepare",
        "sweep.trace.profile:trace",
        "sweep.trace.profile:write",
        "sweep.trace.profile:render",
    ),
    "bench": Verb(
        "sweep.bench.command:prepare",
        "sweep.bench.command:measure",
        "sweep.bench.command:write_row",
        "sweep.bench.command:render",
    ),
    "fit": Verb("sweep.trace.fit:prepare", "sweep.trace.fit:fit", "sweep.trace.fit:write", "sweep.trace.fit:render"),
    "calibrate": Verb(
        "sweep.trace.calibrate:prepare", "sweep.trace.calibrate:calibrate", None, "sweep.trace.calibrate:render"
    ),
    "analyze": Verb(
        "sweep.report.build:prepare",
        "sweep.report.build:compute",
        "sweep.report.build:write",
        "sweep.report.build:render",
        models=False,
    ),
}
