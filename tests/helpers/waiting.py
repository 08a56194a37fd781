"""Waits on conditions, never on the clock: a test waits until what it expects has happened (a row written,
a claim present, a process gone), with a generous deadline that only a real hang reaches."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

HANG_S = 120.0  # a deadline no healthy run comes near, even on a loaded two-core machine


def wait_for(condition: Callable[[], Any], what: str, timeout: float = HANG_S, poll: float = 0.05) -> Any:
    """``condition()``'s first truthy value; an AssertionError naming ``what`` when it never comes."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {timeout:.0f} s for {what}")
        time.sleep(poll)


class Background:
    """``fn`` running in a thread: ``result()`` waits for it (an AssertionError naming ``what`` if it hangs)."""

    def __init__(self, fn: Callable[[], Any], what: str) -> None:
        self.what, self._box = what, {}
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test by result()
            self._box["error"] = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = HANG_S) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"still running after {timeout:.0f} s: {self.what}")
        if "error" in self._box:
            raise self._box["error"]
        return self._box.get("value")


def finishes(fn: Callable[[], Any], what: str, timeout: float = HANG_S) -> Any:
    """``fn()``'s value, run with a deadline: a call that should end at once but hangs fails the test."""
    return Background(fn, what).result(timeout)
