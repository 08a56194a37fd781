"""Trial claims: sweeps that share a ``results.root`` compute each trial once.

Before a worker runs a trial it claims it: it creates ``<root>/claims/<trial_id>.json``
with ``O_CREAT | O_EXCL`` (atomic on a local disk and on NFS v3+), naming its sweep, run,
host and pid, and touches the file while it computes (a heartbeat). The claim stays after
the worker reports, until the sweep's driver has written the row and releases it. A
second sweep's worker that finds the claim waits: when the row appears it reports that
row (computed once, by the first sweep); when the claim is released without a finished row
(the trial failed) it claims the trial itself; when the claim goes stale (no heartbeat for
``STALE_S``: its worker or driver died; at once when the claim's process ran on this host
and is gone) it breaks the claim and runs the trial. A claim of
the worker's own run (a retry after its worker died) is taken over at once.

Breaking a stale claim is itself guarded by an exclusive ``.break`` file, so two waiters
never both break it and then remove each other's fresh claim.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from sweep.paths import check_name, inside

log = logging.getLogger("sweep.claims")

DIRNAME = "claims"
HEARTBEAT_S = 5.0  # how often a computing worker touches its claim
STALE_S = 90.0  # a claim untouched this long belongs to a dead worker or driver
POLL_S = 0.5


@dataclass(frozen=True)
class Owner:
    """Who holds a claim."""

    run_id: str
    sweep_name: str
    host: str
    pid: int

    @classmethod
    def here(cls, run_id: str, sweep_name: str) -> "Owner":
        return cls(run_id, sweep_name, socket.gethostname(), os.getpid())


@dataclass(frozen=True)
class Outcome:
    """What holding a trial's claim gave: the right to compute it (``row`` is None) or the
    finished row another sweep computed."""

    row: dict | None = None
    waited_for: str | None = None  # the sweep whose row this is


def claim_path(root: str | Path, trial_id: str) -> Path:
    check_name("trial_id", trial_id)
    return inside(root, Path(root) / DIRNAME / f"{trial_id}.json")


def _read_owner(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # released meanwhile, or being written (an empty file for an instant)


def _dead(held: dict) -> bool:
    """The claim's process ran on this host and no longer exists."""
    if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int):
        return False
    try:
        os.kill(held["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def _age(path: Path) -> float | None:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return None


def _try_create(path: Path, owner: Owner) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump({**owner.__dict__, "claimed_at": time.time()}, f)
    return True


def _stale(path: Path, stale_s: float) -> bool:
    """Untouched for ``stale_s``, or made by a process of this host that is gone."""
    held, age = _read_owner(path), _age(path)
    return age is not None and (age > stale_s or (held is not None and _dead(held)))


def _break_stale(path: Path, stale_s: float) -> None:
    """Remove ``path`` if it is still stale, holding the exclusive break file meanwhile."""
    guard = path.with_name(path.name + ".break")
    try:
        fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        age = _age(guard)
        if age is not None and age > stale_s:  # a breaker died between two syscalls
            guard.unlink(missing_ok=True)
        return
    os.close(fd)
    try:
        if _stale(path, stale_s):
            log.warning("breaking the stale claim %s (%s)", path, _read_owner(path))
            path.unlink(missing_ok=True)
    finally:
        guard.unlink(missing_ok=True)


class _Heartbeat:
    def __init__(self, path: Path, every: float) -> None:
        self.path, self.every = path, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="claim-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                os.utime(self.path)
            except OSError:
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        try:
            os.utime(self.path)  # the stale clock starts when the worker reported
        except OSError:
            pass


@contextmanager
def hold(
    root: str | Path,
    trial_id: str,
    owner: Owner,
    finished_row: Callable[[], dict | None],
    *,
    stale_s: float | None = None,
    heartbeat_s: float | None = None,
) -> Iterator[Outcome]:
    """Claim ``trial_id`` under ``root``, waiting for another sweep's claim to end.

    Yields ``Outcome()`` when this worker should compute the trial (the claim is held and
    heartbeated until the block ends; the driver releases it after writing the row), or
    ``Outcome(row=...)`` when another sweep's finished row (``finished_row()``) exists.
    """
    stale_s = STALE_S if stale_s is None else stale_s
    heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
    path = claim_path(root, trial_id)
    announced = False
    while True:
        row = finished_row()
        if row is not None:
            yield Outcome(row=row, waited_for=(_read_owner(path) or {}).get("sweep_name"))
            return
        if _try_create(path, owner):
            break
        held = _read_owner(path)
        if held is not None and held.get("run_id") == owner.run_id:
            # this sweep's own claim: the worker that made it died and Tune retries the trial
            path.unlink(missing_ok=True)
            continue
        if _stale(path, stale_s):
            _break_stale(path, stale_s)
            continue
        if not announced and held is not None:
            log.info("trial %s is being run by sweep %s; waiting for its row", trial_id, held.get("sweep_name"))
            announced = True
        time.sleep(POLL_S)
    beat = _Heartbeat(path, heartbeat_s)
    try:
        yield Outcome()
    finally:
        beat.stop()


def release(root: str | Path, trial_id: str, run_id: str) -> None:
    """The driver, once the trial's row is written: remove the claim if it is this run's."""
    path = claim_path(root, trial_id)
    held = _read_owner(path)
    if held is not None and held.get("run_id") == run_id:
        path.unlink(missing_ok=True)
