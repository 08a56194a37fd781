"""Work a sweep worker reuses across its trials: the full-depth reference and its self-check.

Every trial on one model, prompt set, token count, seed and batch size decodes the same
full-depth baseline: a worker process runs the reference runs and the determinism
self-check (two baselines that must agree) once per ``ReferenceKey`` and hands the result
to every later trial of that key; warm-up runs once per key and gate kind. Each trial still
times its own baseline interleaved with its gated run and checks that every timed baseline
reproduces the reference tokens (a worker that drifted after the reference was taken is
caught: the trial is ``nondeterministic``, and the reference is dropped so the next trial
re-runs the self-check).

Only a deterministic reference is kept. The key never matches across models (content hash),
dtypes, devices, prompts (ids and token ids), token counts, seeds or batch sizes. The cost
model has its own per-model cache (``sweep.bench.costs.cost_model``).

``sweep bench`` (one trial per process) does not reuse; ``sweep run`` workers use their session's
(``sweep.bench.session``) unless ``sweep.reuse=false``.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass(frozen=True)
class ReferenceKey:
    """What a full-depth reference depends on; two trials with equal keys decode identical baselines."""

    model_hash: str  # LoadedModel.content_hash
    dtype: str
    device: str
    prompts: tuple[tuple[str, tuple[int, ...]], ...]  # (prompt id, token ids), in order
    gen_tokens: int
    seed: int
    batch_size: int  # how the prompts are grouped into units

    @classmethod
    def of(cls, lm: Any, prompts: Sequence[Any], *, gen_tokens: int, seed: int, batch_size: int) -> ReferenceKey:
        return cls(
            model_hash=str(lm.content_hash),
            dtype=str(lm.dtype).removeprefix("torch."),
            device=str(lm.device),
            prompts=tuple((p.id, tuple(int(t) for t in p.input_ids)) for p in prompts),
            gen_tokens=int(gen_tokens),
            seed=int(seed),
            batch_size=int(batch_size),
        )

    def digest(self) -> str:
        """A short stable hash of the key (the first part of a reference id)."""
        return hashlib.sha256(repr(self).encode()).hexdigest()[:12]


def new_reference_id(key: ReferenceKey) -> str:
    """Id of a reference taken now, in this process: key digest, worker pid, time taken (ms)."""
    return f"{key.digest()}-{os.getpid()}-{int(time.time() * 1000)}"


@dataclass
class Reference:
    """A deterministic full-depth reference: per unit, the first baseline's record (tokens,
    exits; logits and caches dropped) and the self-check's max logit difference."""

    key: ReferenceKey
    id: str
    baseline: list[Any]
    max_logit_diff: float | None


@dataclass
class ReuseCache:
    """One worker process's reusable work, bounded (least recently used dropped first)."""

    capacity: int = 4
    references: OrderedDict = field(default_factory=OrderedDict)  # ReferenceKey -> Reference
    warmed: set = field(default_factory=set)
    # a task's full-depth side (``sweep.tasks.evaluate``), by its reference key: measured once per worker
    tasks: OrderedDict = field(default_factory=OrderedDict)
    counts: dict = field(default_factory=lambda: {"self_checks": 0, "reused": 0, "warmups": 0, "dropped": 0})

    def get(self, key: ReferenceKey) -> Reference | None:
        ref = self.references.get(key)
        if ref is not None:
            self.references.move_to_end(key)
            self.counts["reused"] += 1
        return ref

    def peek(self, key: ReferenceKey) -> Reference | None:
        """The reference of ``key``, if kept, without counting a reuse."""
        return self.references.get(key)

    def put(self, ref: Reference) -> None:
        self.references[ref.key] = ref
        self.references.move_to_end(ref.key)
        while len(self.references) > self.capacity:
            self.references.popitem(last=False)

    def drop(self, key: ReferenceKey) -> None:
        """Forget a reference a trial could not reproduce (the next trial re-checks)."""
        if self.references.pop(key, None) is not None:
            self.counts["dropped"] += 1

    def needs_warmup(self, what: tuple) -> bool:
        """True the first time ``what`` is asked for (then marked warm)."""
        if what in self.warmed:
            return False
        self.warmed.add(what)
        self.counts["warmups"] += 1
        return True

    def clear(self) -> None:
        self.references.clear()
        self.warmed.clear()
        for k in self.counts:
            self.counts[k] = 0
