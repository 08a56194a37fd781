"""A session: what one process keeps between the trials it runs, in one object.

It owns the loaded models (``sweep.models.ModelCache``: the ``resources.models`` most recently used),
the verified readouts (``sweep.gates.readouts.ReadoutsCache``: one file at a time) and the full-depth
references with their warm-up marks (``sweep.bench.reuse.ReuseCache``: a bounded LRU). Values derived
from a model's weights (its cost model, the pca basis, sublayer shapes) live on that model's adapter
and go when the session drops the model.

A process has one (``process_session()``): a command's, or the trials a sweep worker runs, which share
it, so a worker loads each model once and takes each reference once. Code that wants nothing kept
makes its own (``Session()``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from sweep.bench.reuse import ReuseCache
from sweep.models import LoadedModel, ModelCache
from sweep.models.prompts import Prompt
from sweep.models.workload import load_workload
from sweep.gates.readouts import ReadoutsCache, readouts_for


@dataclass
class Session:
    """The models, readouts and references one process's trials share."""

    models: ModelCache = field(default_factory=ModelCache)
    readouts: ReadoutsCache = field(default_factory=ReadoutsCache)
    references: ReuseCache = field(default_factory=ReuseCache)

    def workload(
        self, cfg, gen: tuple[str, int], *, check: Callable[[LoadedModel], None] | None = None, prompts_cfg=None
    ) -> tuple[LoadedModel, list[Prompt]]:
        """``sweep.models.workload.load_workload`` with this session's models."""
        return load_workload(cfg, gen, check=check, prompts_cfg=prompts_cfg, models=self.models)

    def readouts_for(self, path, lm: LoadedModel, prompts: list[Prompt], key: str):
        """``sweep.gates.readouts.readouts_for`` with this session's readouts."""
        return readouts_for(path, lm, prompts, key, cache=self.readouts)

    def reference_source(self, cfg) -> ReuseCache | None:
        """Where a trial's full-depth references come from: this session's cache under
        ``sweep.reuse=true``; None (taken fresh, each trial its own) otherwise."""
        return self.references if cfg.sweep.reuse else None


_PROCESS: list[Session] = []


def process_session() -> Session:
    """This process's session: made at its first use, kept for the process's life."""
    if not _PROCESS:
        _PROCESS.append(Session())
    return _PROCESS[0]
