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

Anyone may write the claims directory, so a claim file is data, never trusted: one that does
not parse as a claim (garbage, a JSON list, a missing field) or names an impossible owner (a
pid no system has) is stale once it is ``GRACE_S`` old (a claim is written right after it is
created, so an instant-old empty file may be a live writer's); it is broken like any stale
claim, named in one warning. A claims directory that cannot be used (a file planted in its
place, a full disk) does not stop a sweep: its trials run unclaimed (a concurrent sweep may
then compute one twice; the row writer still never replaces a finished row), and each such
event is a note (``Outcome.notes``) the driver prints.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from sweep import progress
from sweep.errors import ConfigError
from sweep.config.paths import check_name, inside

log = logging.getLogger("sweep.orchestrate.claims")

DIRNAME = "claims"
HEARTBEAT_S = 5.0  # how often a computing worker touches its claim
STALE_S = 90.0  # a claim untouched this long belongs to a dead worker or driver
GRACE_S = 2.0  # a claim that does not parse yet may be being written: stale only once this old
BREAK_S = 10.0  # a break file this old belongs to a breaker that died (breaking takes milliseconds)
POLL_S = 0.5
PID_MAX = 2**22  # Linux's PID_MAX_LIMIT; no system gives a larger pid (macOS and the BSDs stay under 100000)
_FIELDS = ("run_id", "sweep_name", "host")
_MAX_BYTES = 1 << 16


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
    notes: tuple[str, ...] = ()  # what the driver should print: claims broken, or a trial run unclaimed


def claim_path(root: str | Path, trial_id: str) -> Path:
    check_name("trial_id", trial_id)
    return inside(root, Path(root) / DIRNAME / f"{trial_id}.json")


def _read_owner(path: Path) -> dict | None:
    """The claim in ``path`` when it is a well-formed claim; None when it is missing (released
    meanwhile), unreadable, or not a claim (``_not_a_claim``)."""
    try:
        held = _parse(path)
    except (OSError, ValueError, RecursionError):
        return None  # released meanwhile, being written (an empty file for an instant), or garbage
    return held if _not_a_claim(held) is None else None


def _parse(path: Path) -> Any:
    """The JSON in ``path``, a regular file of at most ``_MAX_BYTES`` (a claim is a few hundred bytes), nested at
    most ``userfiles.MAX_DEPTH`` deep; a FIFO planted as a claim is refused, never opened for reading."""
    from sweep.userfiles import read_json

    return read_json(path, _MAX_BYTES)


def _not_a_claim(held: Any) -> str | None:
    """Why ``held`` (a parsed claim file) is not a claim this module could have written; None when it is."""
    if not isinstance(held, dict):
        return f"a JSON {type(held).__name__}, not an object"
    bad = [k for k in _FIELDS if not isinstance(held.get(k), str)]
    if bad:
        return f"no {', '.join(bad)}"
    pid = held.get("pid")
    if type(pid) is not int or not 0 < pid <= PID_MAX:
        return f"pid {str(pid)[:40]} is not a process id (1..{PID_MAX})"
    return None


def _dead(held: dict) -> bool:
    """The claim's process ran on this host and no longer exists."""
    if held.get("host") != socket.gethostname():
        return False
    try:
        os.kill(held["pid"], 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # alive, another user's (OverflowError: cannot happen below PID_MAX)
        return False
    return False


def _age(path: Path) -> float | None:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return None


class Unusable(OSError):
    """The claims directory cannot hold a claim (not a directory, not writable, a full disk)."""


def _try_create(path: Path, owner: Owner) -> bool:
    """Create the claim exclusively: True if made, False if another claim is there; ``Unusable``
    when the directory cannot hold one (nothing is left behind)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        if not path.parent.is_dir():
            raise Unusable(f"{path.parent} is not a directory") from None
        try:
            planted = not stat.S_ISREG(os.lstat(path).st_mode)
        except OSError:  # released meanwhile: try again
            return False
        if planted:  # a FIFO, a directory, a link: no claim of ours; waiting on it would never end
            raise Unusable(f"{path} is not a regular file (something planted in place of a claim)") from None
        return False
    except OSError as exc:
        raise Unusable(f"{path.parent}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({**owner.__dict__, "claimed_at": time.time()}, f)
    except OSError as exc:  # a full disk: an empty claim would make others wait
        path.unlink(missing_ok=True)
        raise Unusable(f"cannot write {path}: {exc.strerror or exc}") from None
    return True


def _stale(path: Path, stale_s: float) -> str | None:
    """Why the claim in ``path`` is stale (untouched for ``stale_s``, made by a process of this host
    that is gone, or not a claim at all once ``GRACE_S`` old); None while it must be waited for."""
    age = _age(path)
    if age is None:
        return None  # released meanwhile
    try:
        parsed = _parse(path)
        why = _not_a_claim(parsed)
    except OSError:
        return None
    except (ValueError, RecursionError) as exc:
        parsed, why = None, f"not JSON ({type(exc).__name__}: {str(exc)[:60]})"
    if age > stale_s:
        return f"untouched for {age:.0f} s"
    if why is not None:
        return f"not a claim: {why}" if age > GRACE_S else None
    if _dead(parsed):
        return f"its process {parsed['pid']} on this host is gone"
    return None


def _break_stale(path: Path, stale_s: float) -> str | None:
    """Remove ``path`` if it is still stale, holding the exclusive break file meanwhile; the
    warning logged when it was broken here, else None."""
    guard = path.with_name(path.name + ".break")
    try:
        fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        age = _age(guard)
        if age is not None and age > min(stale_s, BREAK_S):  # a breaker died between two syscalls
            guard.unlink(missing_ok=True)
        return None
    except OSError:
        return None
    os.close(fd)
    try:
        why = _stale(path, stale_s)
        if why is None:
            return None
        note = f"took over the stale claim {path} ({why})"
        log.warning("%s", note)
        path.unlink(missing_ok=True)
        return note
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
                os.utime(self.path, follow_symlinks=False)  # a link planted in its place: touch the link only
            except OSError:
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        try:
            os.utime(self.path, follow_symlinks=False)  # the stale clock starts when the worker reported
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
    ``Outcome(row=...)`` when another sweep's finished row (``finished_row()``) exists; with the
    notes the driver prints (stale claims broken; the trial run unclaimed when the claims directory
    cannot be used). Never raises for what is found in the claims directory.
    """
    stale_s = STALE_S if stale_s is None else stale_s
    heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
    notes: list[str] = []
    try:
        path = claim_path(root, trial_id)
    except ConfigError as exc:  # a symbolic link planted as the claims directory: never write through it
        yield _unclaimed(trial_id, str(exc), finished_row())
        return
    announced = False
    while True:
        row = finished_row()
        if row is not None:
            yield Outcome(row=row, waited_for=(_read_owner(path) or {}).get("sweep_name"), notes=tuple(notes))
            return
        try:
            if _try_create(path, owner):
                break
        except Unusable as exc:
            yield _unclaimed(trial_id, str(exc), None, notes)
            return
        held = _read_owner(path)
        if held is not None and held.get("run_id") == owner.run_id:
            # this sweep's own claim: the worker that made it died and Tune retries the trial
            path.unlink(missing_ok=True)
            continue
        if _stale(path, stale_s) is not None:
            note = _break_stale(path, stale_s)
            if note is not None:
                notes.append(note)
            else:  # another waiter is breaking it, or it came back to life
                time.sleep(POLL_S)
            continue
        if not announced and held is not None:  # said on the driver too (a worker's log stays in the worker)
            said = f"trial {trial_id} is being run by sweep {held.get('sweep_name')}; waiting for its row"
            progress.note(said)
            log.info("%s", said)
            announced = True
        time.sleep(POLL_S)
    beat = _Heartbeat(path, heartbeat_s)
    try:
        yield Outcome(notes=tuple(notes))
    finally:
        beat.stop()


def _unclaimed(trial_id: str, why: str, row: dict | None, notes: list[str] = ()) -> Outcome:
    note = f"trial {trial_id} runs unclaimed (a concurrent sweep into this root may compute it too): {why}"
    log.warning("%s", note)
    return Outcome(row=row, notes=(*notes, note))


def check_dir(root: str | Path) -> None:
    """Before any work: refuse (ConfigError) a claims directory that resolves outside ``root`` (a
    planted symbolic link); warn when it cannot be used (the sweep's trials then run unclaimed)."""
    directory = Path(root) / DIRNAME
    inside(root, directory, key="results.root")
    if os.path.lexists(directory) and not directory.is_dir():
        log.warning(
            "%s is not a directory: this sweep's trials run unclaimed (a concurrent sweep into this root may "
            "compute the same trial; no finished row is replaced); remove it to claim trials again",
            directory,
        )


def release(root: str | Path, trial_id: str, run_id: str) -> None:
    """The driver, once the trial's row is written: remove the claim if it is this run's."""
    try:
        path = claim_path(root, trial_id)
    except ConfigError:  # the claims directory was replaced by a link out of the root: nothing of ours there
        return
    held = _read_owner(path)
    if held is not None and held.get("run_id") == run_id:
        path.unlink(missing_ok=True)


def release_run(root: str | Path, run_id: str) -> list[Path]:
    """Remove every claim of run ``run_id`` under ``root`` (the driver, when a sweep stops before its
    trials end: interrupted, or its rows cannot be written); the claims removed."""
    directory = Path(root) / DIRNAME
    try:
        inside(root, directory)
        entries = list(os.scandir(directory))
    except (OSError, ConfigError):
        return []
    removed = []
    for entry in entries:
        if not entry.name.endswith(".json") or not entry.is_file(follow_symlinks=False):
            continue
        held = _read_owner(Path(entry.path))
        if held is not None and held.get("run_id") == run_id:
            Path(entry.path).unlink(missing_ok=True)
            removed.append(Path(entry.path))
    return removed
