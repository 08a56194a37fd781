"""Progress of the long loops, and where a command's time went.

The rest of the package emits events and knows nothing of how they are shown: ``phase(name,
total, part=...)`` around a loop and ``step()`` per iteration (or ``Phase.advance``); ``timed(part)``
around work that counts in the time breakdown but shows nothing (writing a row). Events go to

- the display on stderr (tqdm, used in this module only): a live bar per open phase on a TTY; in a
  pipe a line per step, at most one a minute (the first and last always); nothing under
  ``--quiet`` or when ``CI`` is set. A step's text (a finished setting, a traced prompt) is an info
  log line in every mode, with its phase's count, elapsed time and ETA;
- every listener (``listen``): ``Breakdown`` sums each part's seconds, tests read the events;
- in a sweep's Ray worker, the driver (``forward``): ``sweep.orchestrate.ray.tuner`` posts them to an actor that the
  driver drains and ``replay``s into its own display and listeners, labelled with their source.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import sys
import threading
import time
from typing import Callable, Iterator

log = logging.getLogger("sweep.progress")

LINE_EVERY_S = 60.0  # in a pipe: at most one line a minute per phase (steps with a text always get theirs)
FORWARD_EVERY_S = 0.5  # a worker forwards a phase's plain steps at most this often (start, end and texts always)
PARTS = ("load", "cost model", "warm-up and self-check", "timed rounds", "writing")  # the breakdown's order


@dataclasses.dataclass(frozen=True)
class Event:
    """One progress event: a phase's start, step or end; ``time`` (seconds of a ``timed`` part);
    ``note`` (a line of text)."""

    kind: str  # start | step | end | time | note
    phase: str
    done: int = 0
    total: int | None = None
    seconds: float = 0.0  # since the phase started (end, time: its duration)
    part: str | None = None  # the breakdown part the phase's seconds count towards
    text: str | None = None
    key: int = 0  # the phase's id within its source
    source: str | None = None  # None: this process; on the driver, the worker's label
    eta: float | None = None  # seconds left as the phase's producer estimates them (None: from the steps' rate)


class Phase:
    """An open phase: ``advance`` per step, ``close`` at the end (``phase`` does both)."""

    def __init__(self, name: str, total: int | None, part: str | None) -> None:
        self.name, self.total, self.part = name, total, part
        self.done = 0
        self.key = next(_KEYS)
        self.t0 = time.perf_counter()
        self.closed = False
        _emit(self._event("start"))

    def _event(self, kind: str, text: str | None = None) -> Event:
        seconds = time.perf_counter() - self.t0
        return Event(kind, self.name, self.done, self.total, seconds, self.part, text, self.key, eta=self.eta)

    eta: float | None = None  # the producer's own estimate of the seconds left (``advance(eta=...)``)

    def advance(self, n: int = 1, text: str | None = None, eta: float | None = None) -> None:
        """``n`` more steps done; ``eta``: the seconds left by the producer's own measure of the work left (a
        sweep's: its settings' decode work, ``sweep.orchestrate.writer.RowWriter``), shown instead of the rate of
        steps, which misleads where steps differ in size."""
        self.done += n
        if eta is not None:
            self.eta = eta
        _emit(self._event("step", text))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self in _STATE.open:
                _STATE.open.remove(self)
            _emit(self._event("end"))


_KEYS = itertools.count(1)


class _State:
    """The process's progress state: the display mode, listeners, a worker's forwarder, open phases."""

    def __init__(self) -> None:
        self.mode: str | None = None  # live | lines | off; None: decided at first use
        self.listeners: list[Callable[[Event], None]] = []
        self.forward: Callable[[dict], None] | None = None
        self.forwarded: dict[int, float] = {}  # phase key -> when its last step was forwarded
        self.open: list[Phase] = []
        self.display = _Display()


def _decide_mode(quiet: bool) -> str:
    if quiet or os.environ.get("CI", "").strip().lower() not in ("", "0", "false"):
        return "off"
    return "live" if sys.stderr.isatty() else "lines"


def _emit(event: Event) -> None:
    for listener in list(_STATE.listeners):
        listener(event)
    if _STATE.forward is not None:
        _forward(event)
    else:
        _STATE.display.handle(event, _mode())


def _mode() -> str:
    if _STATE.mode is None:
        _STATE.mode = _decide_mode(False)
    return _STATE.mode


def _forward(event: Event) -> None:
    if event.kind == "step" and event.text is None and event.done != event.total:
        now = time.perf_counter()
        if now - _STATE.forwarded.get(event.key, 0.0) < FORWARD_EVERY_S:
            return
        _STATE.forwarded[event.key] = now
    _STATE.forward(dataclasses.asdict(event))


# ---------------------------------------------------------------- what the package calls


@contextlib.contextmanager
def phase(name: str, total: int | None = None, *, part: str | None = None) -> Iterator[Phase]:
    """A loop of ``total`` steps (None: not known ahead) shown as ``name``; its seconds count towards
    the breakdown's ``part`` when given. ``step()`` advances the innermost open phase."""
    p = Phase(name, total, part)
    _STATE.open.append(p)
    try:
        yield p
    finally:
        p.close()


def start(name: str, total: int | None = None, *, part: str | None = None) -> Phase:
    """A phase opened here and closed by ``Phase.close`` (``phase`` without the with-block); it advances
    by ``Phase.advance`` only (``step()`` is for ``phase``'s)."""
    return Phase(name, total, part)


def step(n: int = 1, text: str | None = None) -> None:
    """One step of the innermost open phase (nothing when none is open)."""
    if _STATE.open:
        _STATE.open[-1].advance(n, text)


@contextlib.contextmanager
def timed(part: str) -> Iterator[None]:
    """Work whose seconds count towards the breakdown's ``part``; nothing is shown."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _emit(Event("time", part, seconds=time.perf_counter() - t0, part=part, key=next(_KEYS)))


def note(text: str) -> None:
    """A line worth keeping (an info log line in every display mode)."""
    _emit(Event("note", "note", text=text, key=next(_KEYS)))


@contextlib.contextmanager
def listen(listener: Callable[[Event], None]) -> Iterator[Callable[[Event], None]]:
    """Call ``listener`` with every event (this process's and those replayed from workers) while open."""
    _STATE.listeners.append(listener)
    try:
        yield listener
    finally:
        _STATE.listeners.remove(listener)


@contextlib.contextmanager
def forward(post: Callable[[dict], None]) -> Iterator[None]:
    """In a worker: every event goes to ``post`` (as a dict) instead of this process's display."""
    before = _STATE.forward
    _STATE.forward = post
    try:
        yield
    finally:
        _STATE.forward = before


def replay(events: list[dict], source: str) -> None:
    """On the driver: events a worker forwarded, to this display and these listeners, from ``source``."""
    for e in events:
        _emit(Event(**{**e, "source": source}))


def finished(source: str) -> None:
    """On the driver: ``source`` (a worker's Tune trial) is done; close whatever it left open."""
    _STATE.display.drop(source)


@contextlib.contextmanager
def session(quiet: bool = False) -> Iterator[None]:
    """A command's display (``sweep.cli.commands``): off under ``quiet`` or CI; on a TTY, log lines are written
    above the live bars."""
    _STATE.mode = _decide_mode(quiet)
    redirect, stop = contextlib.nullcontext(), threading.Event()
    if _STATE.mode == "live":
        from tqdm.contrib.logging import logging_redirect_tqdm

        redirect = logging_redirect_tqdm()
        # the bars' elapsed time moves during a long step (a model load, a worker between forwarded steps)
        threading.Thread(target=_tick_until, args=(stop,), daemon=True, name="sweep-progress").start()
    try:
        with redirect:
            yield
    finally:
        stop.set()
        _STATE.display.close_all()
        _STATE.mode = None


def _tick_until(stop: threading.Event) -> None:
    while not stop.wait(1.0):
        _STATE.display.refresh()


# ---------------------------------------------------------------- where the time went


class Breakdown:
    """A listener summing the seconds of each breakdown part (``phase(..., part=)``, ``timed``) since it
    was made; ``line()`` is the one-line breakdown a bench or a sweep ends with."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.sources: set[str] = set()

    def __call__(self, event: Event) -> None:
        if event.kind in ("end", "time") and event.part is not None:
            self.seconds[event.part] = self.seconds.get(event.part, 0.0) + event.seconds
            if event.source is not None:
                self.sources.add(event.source)

    def line(self) -> str:
        wall = time.perf_counter() - self.t0
        order = [p for p in PARTS if p in self.seconds] + [p for p in self.seconds if p not in PARTS]
        measured = sum(self.seconds.values())
        items = [(p, self.seconds[p]) for p in order] + [("other", max(wall - measured, 0.0))]
        where = ""
        if self.sources:
            overlap = ", overlapping" if measured > wall else ""
            n = len(self.sources)
            runs = "1 Tune trial or task" if n == 1 else f"{n} Tune trials and tasks"
            where = f" (workers' phases summed over {runs}{overlap})"
        return f"time {_seconds(wall)}{where}: " + ", ".join(f"{p} {_seconds(s)}" for p, s in items)


@contextlib.contextmanager
def breakdown() -> Iterator[Breakdown]:
    """A ``Breakdown`` listening while open."""
    with listen(Breakdown()) as b:
        yield b


def _seconds(s: float) -> str:
    """Seconds to two significant figures (whole seconds from 10 s, minutes from 10 min)."""
    if s >= 600:
        return f"{s / 60:.1f}min"
    return f"{s:.0f}s" if s >= 10 else f"{s:.1f}s" if s >= 1 else f"{s:.2f}s"


# ---------------------------------------------------------------- the display (tqdm)


def counts(done: int, total: int | None, elapsed: float, eta: float | None = None) -> str:
    """``done/total, elapsed, ETA`` as the display writes them."""
    return (f"{done} done" if total is None else f"{done}/{total}") + ", " + _clock(done, total, elapsed, eta)


def _clock(done: int, total: int | None, elapsed: float, eta: float | None = None) -> str:
    """Elapsed and ETA: the producer's ``eta`` where it gave one, else the steps' rate so far."""
    from tqdm import tqdm

    fmt = tqdm.format_interval
    if total is None:
        return f"{fmt(elapsed)} elapsed"
    if done >= total:
        left = "00:00"
    elif eta is not None:
        left = fmt(max(eta, 0.0))
    else:
        left = "?" if done == 0 else fmt(max(total - done, 0) * elapsed / done)
    return f"{fmt(elapsed)} elapsed, ETA {left}"


def _columns() -> int:
    """The terminal's width, at most 120 (120 where it does not say: a pty without a size)."""
    try:
        columns = os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError):
        columns = 0
    return min(columns, 120) if columns > 0 else 120


class _Display:
    """Events on stderr: tqdm bars (live), throttled log lines (lines), nothing (off); texts always as
    info log lines."""

    def __init__(self) -> None:
        self.bars: dict[tuple, object] = {}
        self.printed: dict[tuple, tuple[float, int]] = {}  # lines: when, and at which count, the last line

    def handle(self, e: Event, mode: str) -> None:
        if e.kind == "time":
            return
        label = e.phase if e.source is None else f"[{e.source}] {e.phase}"
        if e.text is not None:
            head = "" if e.source is None else f"[{e.source}] "
            tail = "" if e.kind == "note" else f" ({_clock(e.done, e.total, e.seconds, e.eta)})"
            prefix = "" if e.kind == "note" else f"[{e.done}/{e.total if e.total is not None else '?'}] "
            log.info("%s%s%s%s", head, prefix, e.text, tail)
        key = (e.source, e.key)
        if mode == "live":
            self._live(e, key, label)
        elif mode == "lines" and e.kind != "note":
            self._line(e, key, label)

    def _live(self, e: Event, key: tuple, label: str) -> None:
        from tqdm import tqdm

        if e.kind == "start" or (e.kind == "step" and key not in self.bars):
            self.bars[key] = tqdm(
                total=e.total,
                desc=label,
                initial=e.done,
                leave=False,
                file=sys.stderr,
                unit="step",
                mininterval=0.2,
                ncols=_columns(),
                nrows=24,  # a pty without a size says 0 rows, and tqdm then shows no bar
                bar_format=None if e.total is not None else "{desc} [{elapsed}, {n_fmt} done]",
            )
        bar = self.bars.get(key)
        if bar is None:
            return
        if e.kind == "step" and e.eta is not None and e.total is not None:  # the producer's ETA, not tqdm's rate
            bar.bar_format = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}, ETA {postfix}]"
            bar.set_postfix_str(tqdm.format_interval(max(e.eta, 0.0)), refresh=False)
        if e.kind == "step":
            bar.update(e.done - bar.n)
        elif e.kind == "end":
            bar.close()
            del self.bars[key]

    def _line(self, e: Event, key: tuple, label: str) -> None:
        now = time.perf_counter()
        if e.kind == "start":
            return
        last = self.printed.get(key)
        if e.kind == "end":
            self.printed.pop(key, None)
            if e.done and (last is None or last[1] != e.done):
                log.info("%s: %s", label, counts(e.done, e.total, e.seconds, e.eta))
            return
        if e.text is not None or last is None or e.done == e.total or now - last[0] >= LINE_EVERY_S:
            if e.text is None:
                log.info("%s: %s", label, counts(e.done, e.total, e.seconds, e.eta))
            self.printed[key] = (now, e.done)

    def refresh(self) -> None:
        for bar in list(self.bars.values()):
            if not bar.disable:  # closed meanwhile
                bar.refresh()

    def drop(self, source: str) -> None:
        for key in [k for k in self.bars if k[0] == source]:
            self.bars.pop(key).close()
        for key in [k for k in self.printed if k[0] == source]:
            del self.printed[key]

    def close_all(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()
        self.printed.clear()


_STATE = _State()
