"""The progress of a sweep's Ray workers on the driver's display: workers post their
``sweep.progress`` events to a small actor (fire and forget); the driver drains it from the Tune loop
(``sweep.orchestrate.ray.callbacks.Progress``) and while it waits on the screen's trace, and replays them into its own
display and listeners, labelled with their source ("Tune trial <id>", "screen trace").

Progress never stops a sweep: an actor that cannot be reached turns the forwarding off, with one warning. An
actor that Ray cannot start at all because no worker process starts (``broken``) is another matter: no trial could
start either, and a sweep that waited for them would wait forever, so the sweep stops on it
(``sweep.orchestrate.ray.callbacks.StopWhenRowsCannotBeWritten``).
"""

from __future__ import annotations

import contextlib
import logging

import ray

from sweep import progress

log = logging.getLogger("sweep.progress")


class ProgressHub:
    """The actor: the events workers posted, until the driver drains them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def post(self, source: str, event: dict) -> None:
        self.events.append((source, event))

    def drain(self) -> list[tuple[str, dict]]:
        out, self.events = self.events, []
        return out


class Hub:
    """The driver's side of a ``ProgressHub``: workers are given ``actor``; the driver ``drain``s it."""

    def __init__(self) -> None:
        self.actor = ray.remote(num_cpus=0)(ProgressHub).remote()
        self.pending = None  # a drain in flight (``drain(wait=False)``)
        self.broken: str | None = None  # why Ray cannot start a worker process here (then nothing can run)

    def drain(self, wait: bool = True) -> None:
        """The events the workers posted, into this process's display and listeners. Without ``wait``,
        only what the previous call's drain brought back, and the next one is sent: the Tune loop never
        blocks on the actor (which takes seconds to start)."""
        if self.actor is None:
            return
        pending, self.pending = self.pending, None
        if not wait and pending is not None and not ray.wait([pending], timeout=0)[0]:
            self.pending = pending
            return
        refs = [pending] if pending is not None else []
        if wait:
            refs.append(self.actor.drain.remote())
        try:
            drained = [item for ref in refs for item in ray.get(ref)]
        except ray.exceptions.RayError as exc:
            self.actor = None
            if cannot_start_workers(exc):
                self.broken = str(exc).strip().splitlines()[0]
                log.error("Ray cannot start a worker process (%s); stopping the sweep", self.broken)
                return
            log.warning("the workers' progress is lost (its actor failed: %s); the sweep goes on", exc)
            return
        for source, event in drained:
            progress.replay([event], source)
        if not wait:
            self.pending = self.actor.drain.remote()

    def close(self) -> None:
        """Stop the actor: a handle that Tune's state still holds would otherwise keep its process alive
        for as long as Ray runs (an embedded Ray shared by several sweeps, a joined cluster)."""
        actor, self.actor, self.pending = self.actor, None, None
        if actor is not None:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.kill(actor)


def cannot_start_workers(exc: BaseException) -> bool:
    """True where Ray refused a task or actor because its worker processes fail to start (a broken Python
    environment on the node, a worker that cannot register): nothing else can start there either."""
    unschedulable = (ray.exceptions.ActorUnschedulableError, ray.exceptions.TaskUnschedulableError)
    return isinstance(exc, unschedulable) and "worker startup" in str(exc)


@contextlib.contextmanager
def forwarding(actor, source: str):
    """In a worker: this process's progress events posted to ``actor`` (one caller's actor calls run in
    order) under ``source``; nothing without one."""
    if actor is None:
        yield
        return
    alive = True

    def post(event: dict) -> None:
        nonlocal alive
        if alive:
            try:
                actor.post.remote(source, event)  # a ref never waited on: a lost event is only a lost event
            except ray.exceptions.RayError:
                alive = False

    with progress.forward(post):
        yield
